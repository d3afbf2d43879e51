#include <stdio.h>
#include <time.h>
#include <stdint.h>
static uint64_t ns(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return (uint64_t)t.tv_sec*1000000000ull+t.tv_nsec;}
int main(void){
  for (int r=0;r<3;r++){uint64_t a=ns();volatile uint64_t s=0;for(int i=0;i<1000000;i++)s+=ns();uint64_t b=ns();printf("clock_gettime(MONOTONIC): %.1f ns/call\n",(b-a)/1e6);}
  return 0;}
