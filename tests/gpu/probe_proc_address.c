#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
typedef int (*gpa2_t)(const char*, void**, int, unsigned long long, int*);
typedef int (*init_t)(unsigned);
static const char *names[][2] = {
 {"cuMemAlloc","cuMemAlloc"},{"cuMemAlloc","cuMemAlloc_v2"},{"cuMemFree","cuMemFree_v2"},
 {"cuMemGetInfo","cuMemGetInfo_v2"},{"cuDeviceTotalMem","cuDeviceTotalMem_v2"},
 {"cuCtxCreate","cuCtxCreate_v2"},{"cuCtxCreate","cuCtxCreate_v3"},{"cuCtxCreate","cuCtxCreate_v4"},
 {"cuLaunchKernel","cuLaunchKernel"},{"cuLaunchKernel","cuLaunchKernel_ptsz"},
 {"cuLaunchKernelEx","cuLaunchKernelEx"},{"cuLaunchKernelEx","cuLaunchKernelEx_ptsz"},
 {"cuGraphLaunch","cuGraphLaunch"},{"cuGraphLaunch","cuGraphLaunch_ptsz"},
 {"cuMemAllocAsync","cuMemAllocAsync"},{"cuMemAllocAsync","cuMemAllocAsync_ptsz"},
 {"cuStreamBeginCapture","cuStreamBeginCapture_v2"},{"cuStreamBeginCapture","cuStreamBeginCapture_v2_ptsz"},
 {"cuEventElapsedTime","cuEventElapsedTime"},{"cuEventElapsedTime","cuEventElapsedTime_v2"},
 {"cuMemCreate","cuMemCreate"},{"cuGetProcAddress","cuGetProcAddress"},{"cuGetProcAddress","cuGetProcAddress_v2"},
 {"cuDevicePrimaryCtxRelease","cuDevicePrimaryCtxRelease_v2"},{"cuMemHostGetDevicePointer","cuMemHostGetDevicePointer_v2"},
 {"cuIpcOpenMemHandle","cuIpcOpenMemHandle_v2"},{"cuStreamDestroy","cuStreamDestroy_v2"},{"cuEventRecord","cuEventRecord_ptsz"},
 {"cuLaunchCooperativeKernel","cuLaunchCooperativeKernel_ptsz"},{"cuMemcpyHtoD","cuMemcpyHtoD_v2"},
 {"cuDeviceGetUuid","cuDeviceGetUuid_v2"},{"cuCtxDestroy","cuCtxDestroy_v2"},{"cuMemAllocManaged","cuMemAllocManaged"},
 {"cuStreamSynchronize","cuStreamSynchronize"},{"cuStreamSynchronize","cuStreamSynchronize_ptsz"},
};
int main(void){
  void *h = dlopen("libcuda.so.1", RTLD_NOW|RTLD_LOCAL); if(!h){printf("dlopen: %s\n", dlerror()); return 1;}
  ((init_t)dlsym(h,"cuInit"))(0);
  gpa2_t g2 = (gpa2_t)dlsym(h,"cuGetProcAddress_v2");
  int vers[] = {3000, 11040, 12000, 12080, 13000};
  printf("legend: version/flags: '=' same pointer as dlsym of that name, x different, ERR failed\n");
  for (unsigned i=0;i<sizeof names/sizeof names[0];i++){
    void *d = dlsym(h, names[i][1]);
    printf("%-30s %s |", names[i][1], d ? "exp" : "---");
    for (unsigned v=0; v<5; v++) for (int fl=0; fl<3; fl+=2){
      void *p=NULL; int st=-1; int r = g2(names[i][0], &p, vers[v], fl, &st);
      printf(" %d/%d:%s", vers[v], fl, r ? "ERR" : (p==d ? "=" : "x"));
    }
    printf("\n");
  }
  return 0;
}
