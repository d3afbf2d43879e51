// Helpers shared by the CUDA probes in benchmarks/ (gate_probe.cu,
// gate_steps.cu, probe_cost.cu, pair_probe.cu): a monotonic clock in microseconds, a CPU
// busy-wait standing in for a framework's work between launches, and a
// driver call that ends the probe when it fails.
#ifndef VGPU_BENCH_GPU_PROBE_H
#define VGPU_BENCH_GPU_PROBE_H

#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_us()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void cpu_gap(double us)
{
    double t = now_us();
    while (now_us() - t < us) {
    }
}

#define CK(x)                                                                                      \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_) {                                                                                  \
            printf("%s failed %d\n", #x, r_);                                                      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A gate: a word of pinned host memory the GPU can wait on
 * (cuStreamWaitValue32 on `dev`) and the CPU writes (`host`), 0 at first. */
struct gate_word {
    volatile uint32_t *host;
    CUdeviceptr dev;
};

static struct gate_word gate_word_new()
{
    struct gate_word g;
    CK(cuMemHostAlloc((void **)&g.host, 4096,
                      CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CK(cuMemHostGetDevicePointer(&g.dev, (void *)g.host, 0));
    *g.host = 0;
    return g;
}

#endif
