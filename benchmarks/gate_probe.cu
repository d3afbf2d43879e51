// Feasibility of gated batches for launch-bound work (docs/compute.md,
// "Launch-bound work"): does a start event recorded behind a stream wait on
// a host flag measure only the work queued before the flag opens, and what
// do the calls cost the CPU? 10 us kernels with 8 us of CPU between
// launches, in groups of 1..32, ungated and gated. On the GPU node:
//   nvcc -O2 -arch=sm_90 -o gate_probe benchmarks/gate_probe.cu -lcuda && ./gate_probe
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdint.h>
#include <time.h>

#include "gpu_probe.h"

__global__ void spin(uint64_t ns) {
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}

int main() {
    cudaFree(0);
    CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    struct gate_word g = gate_word_new();
    volatile uint32_t *flag = g.host; CUdeviceptr dflag = g.dev;
    int attr = -1; CUdevice dev; cuCtxGetDevice(&dev);
    cuDeviceGetAttribute(&attr, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, dev);
    printf("host ptr %p dev ptr %llx wait_nor attr %d\n", flag, (unsigned long long)dflag, attr);
    const int N = 4096; const uint64_t K_NS = 10000; const double GAP_US = 8;
    CUevent ev[2 * N]; for (int i = 0; i < 2 * N; i++) CK(cuEventCreate(&ev[i], CU_EVENT_DEFAULT));
    // cost of one event record and one wait-value
    double t = now_us(); for (int i = 0; i < 1000; i++) cuEventRecord(ev[i], s); double rec_us = (now_us() - t) / 1000;
    cuStreamSynchronize(s);
    t = now_us(); for (int i = 0; i < 1000; i++) cuStreamWaitValue32(s, dflag, 0, CU_STREAM_WAIT_VALUE_GEQ); double wait_us = (now_us() - t) / 1000;
    cuStreamSynchronize(s);
    t = now_us(); for (int i = 0; i < 1000; i++) spin<<<1, 32, 0, (cudaStream_t)s>>>(0); double launch_us = (now_us() - t) / 1000;
    cuStreamSynchronize(s);
    printf("cpu per call: event record %.2f us, wait value %.2f us, launch %.2f us\n", rec_us, wait_us, launch_us);
    for (int group = 1; group <= 32; group *= 2) {
      for (int gated = 0; gated < 2; gated++) {
        int batches = 0; double wall0 = now_us();
        for (int i = 0; i < N; i += group) {
            if (gated) CK(cuStreamWaitValue32(s, dflag, (uint32_t)(i + 1), CU_STREAM_WAIT_VALUE_GEQ));
            CK(cuEventRecord(ev[2 * batches], s));
            for (int k = 0; k < group; k++) { spin<<<1, 32, 0, (cudaStream_t)s>>>(K_NS); cpu_gap(GAP_US); }
            CK(cuEventRecord(ev[2 * batches + 1], s));
            if (gated) *flag = (uint32_t)(i + 1);
            batches++;
        }
        CK(cuStreamSynchronize(s)); double wall = now_us() - wall0;
        double span = 0; for (int b = 0; b < batches; b++) { float ms; CK(cuEventElapsedTime(&ms, ev[2 * b], ev[2 * b + 1])); span += ms * 1000; }
        double busy = N * K_NS / 1000.0;
        printf("group %2d %s: spans %.0f us, kernels %.0f us, spans/kernels %.3f, wall %.0f us (busy %.1f%%)\n", group, gated ? "gated  " : "ungated", span, busy, span / busy, wall, 100 * busy / wall);
      }
    }
    return 0;
}
