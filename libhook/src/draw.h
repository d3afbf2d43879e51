/*
 * draw.h - cheap pseudo-random draws for the hook's sampling decisions:
 * splitmix64's finaliser over a counter or a clock, a draw that no
 * workload's period lines up with and that a tenant cannot predict
 * without knowing the seed's exact value.
 */
#ifndef VGPU_DRAW_H
#define VGPU_DRAW_H

#include <stdint.h>

static inline uint64_t draw_mix(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

#endif
