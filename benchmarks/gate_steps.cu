// What does gating cost a launch-bound program that synchronises every
// step (an eager decoder: a few dozen kernels, then a host wait)? Steps of
// L kernels of K us each, launched with G us of CPU work between launches,
// then cuStreamSynchronize; three ways:
//   plain      the launches as they are;
//   gated B    as the hook gates them: groups of B launches queued behind a
//              stream wait on a host word and bracketed by two events, the
//              word written once the group is queued (the last group at the
//              step's sync);
//   ramp B     the same, but each step's groups grow 1, 2, 4, ... up to B
//              (a negative B on the command line);
// and, run under the hook (LD_PRELOAD, CUDA_CORE_LIMIT), "plain" is what
// the hook makes of it. Prints wall per step and the GPU's busy share.
// On the GPU node:
//   nvcc -O2 -arch=sm_90 -o gate_steps benchmarks/gate_steps.cu -lcuda
//   ./gate_steps K_US L G_US STEPS [B...]
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "gpu_probe.h"

__global__ void spin(uint64_t ns)
{
    uint64_t t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}


int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: gate_steps K_US L G_US STEPS [B...]\n");
        return 2;
    }
    double k_us = atof(argv[1]), gap = atof(argv[3]);
    int L = atoi(argv[2]), steps = atoi(argv[4]);
    cudaFree(0);
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    struct gate_word g = gate_word_new();
    volatile uint32_t *flag = g.host;
    CUdeviceptr dflag = g.dev;
    uint32_t gate = 0;
    CUevent ev[2];
    CK(cuEventCreate(&ev[0], CU_EVENT_DEFAULT));
    CK(cuEventCreate(&ev[1], CU_EVENT_DEFAULT));
    uint64_t k_ns = (uint64_t)(k_us * 1000);
    // warm up
    for (int i = 0; i < 100; i++)
        spin<<<1, 32, 0, (cudaStream_t)s>>>(k_ns);
    CK(cuStreamSynchronize(s));
    for (int m = 4; m < argc; m++) {
        int B = m == 4 ? 0 : atoi(argv[m]); // 0: plain; < 0: ramp up to -B
        int top = B < 0 ? -B : B;
        double t0 = now_us();
        for (int st = 0; st < steps; st++) {
            int in_group = 0, group = B < 0 ? 1 : B;
            for (int i = 0; i < L; i++) {
                if (B != 0 && in_group == 0) {
                    CK(cuStreamWaitValue32(s, dflag, ++gate, CU_STREAM_WAIT_VALUE_GEQ));
                    CK(cuEventRecord(ev[0], s));
                }
                spin<<<1, 32, 0, (cudaStream_t)s>>>(k_ns);
                if (B != 0 && ++in_group == group) {
                    CK(cuEventRecord(ev[1], s));
                    *flag = gate;
                    in_group = 0;
                    group = group * 2 > top ? top : group * 2;
                }
                cpu_gap(gap);
            }
            if (B != 0 && in_group > 0) {
                CK(cuEventRecord(ev[1], s));
                *flag = gate;
            }
            CK(cuStreamSynchronize(s));
        }
        double wall = now_us() - t0;
        char label[24] = "plain";
        if (B != 0)
            snprintf(label, sizeof(label), "%s %d", B < 0 ? "ramp" : "gated", top);
        printf("K %.0f us L %d G %.1f us: %-9s %8.1f us/step, GPU busy %5.1f %%\n", k_us, L, gap,
               label, wall / steps, 100.0 * steps * L * k_us / wall);
    }
    return 0;
}
