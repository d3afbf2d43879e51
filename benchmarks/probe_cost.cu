// What does an event pair say a kernel costs, against the time the kernel
// really ran (docs/compute.md, "Sampled gates")? For launch-bound work the
// hook charges ungated batches at a per-launch cost measured on gated
// batches; this probe compares, for one kernel shape, the truth (each
// kernel stamps %globaltimer when its first block starts and its last
// block ends) with what event pairs measure:
//   one-by-one   kernels launched with CPU gaps, no events (the truth the
//                hook should charge), and NVML's utilization meanwhile;
//   probe        the same, each kernel alone in a gated event pair;
//   batch N      gated batches of N kernels queued with CPU gaps, then run
//                back to back;
//   empty        a gated event pair around nothing.
// On the GPU node:
//   nvcc -O2 -arch=sm_90 -o probe_cost benchmarks/probe_cost.cu -lcuda -lnvidia-ml
//   ./probe_cost add 1048576 6     # kernel, elements, CPU gap in us
#include <cuda.h>
#include <cuda_runtime.h>
#include <nvml.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_probe.h"

__device__ uint64_t gtimer()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// x[i] += 1 over n floats; stamps[2*slot] = first block's start, [2*slot+1]
// = last block's end.
__global__ void add(float *x, int n, unsigned long long *stamps, int slot)
{
    if (threadIdx.x == 0)
        atomicMin(&stamps[2 * slot], (unsigned long long)gtimer());
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += 1.0f;
    __syncthreads();
    if (threadIdx.x == 0)
        atomicMax(&stamps[2 * slot + 1], (unsigned long long)gtimer());
}


static nvmlDevice_t nvdev;
static unsigned long long nvml_seen;

// Mean of NVML's GPU utilization samples since the last call.
static double nvml_busy()
{
    nvmlValueType_t type;
    unsigned int count = 0;
    if (nvmlDeviceGetSamples(nvdev, NVML_GPU_UTILIZATION_SAMPLES, nvml_seen, &type, &count, NULL) !=
            NVML_SUCCESS ||
        count == 0)
        return -1;
    nvmlSample_t *s = (nvmlSample_t *)calloc(count, sizeof(*s));
    nvmlDeviceGetSamples(nvdev, NVML_GPU_UTILIZATION_SAMPLES, nvml_seen, &type, &count, s);
    double sum = 0;
    for (unsigned i = 0; i < count; i++) {
        sum += s[i].sampleValue.uiVal;
        if (s[i].timeStamp > nvml_seen)
            nvml_seen = s[i].timeStamp;
    }
    free(s);
    return sum / count;
}

int main(int argc, char **argv)
{
    int n = argc > 2 ? atoi(argv[2]) : 1 << 20;
    double gap = argc > 3 ? atof(argv[3]) : 6;
    const int N = 100000;
    cudaFree(0);
    nvmlInit();
    nvmlDeviceGetHandleByIndex(0, &nvdev);
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    struct gate_word g = gate_word_new();
    volatile uint32_t *flag = g.host;
    CUdeviceptr dflag = g.dev;
    uint32_t gate = 0;
    float *x;
    cudaMalloc(&x, sizeof(float) * (size_t)n);
    unsigned long long *stamps;
    cudaMalloc(&stamps, 16 * (size_t)N);
    unsigned long long *host = (unsigned long long *)malloc(16 * (size_t)N);
    CUevent *ev = (CUevent *)malloc(sizeof(CUevent) * 2 * N);
    for (int i = 0; i < 2 * N; i++)
        CK(cuEventCreate(&ev[i], CU_EVENT_DEFAULT));
    int threads = 256, blocks = (n + threads - 1) / threads;
    printf("kernel add n=%d blocks=%d cpu gap %.1f us, %d launches a mode\n", n, blocks, gap, N);
    const char *modes[] = {"one-by-one", "probe", "batch 8", "batch 64", "empty"};
    for (int m = 0; m < 5; m++) {
        for (int i = 0; i < N; i++) {
            host[2 * i] = ~0ull;
            host[2 * i + 1] = 0;
        }
        cudaMemcpy(stamps, host, 16 * (size_t)N, cudaMemcpyHostToDevice);
        cudaDeviceSynchronize();
        nvml_busy();
        int group = m == 2 ? 8 : m == 3 ? 64 : 1;
        int pairs = 0;
        double wall0 = now_us();
        for (int i = 0; i < N; i += group) {
            if (m > 0) {
                CK(cuStreamWaitValue32(s, dflag, ++gate, CU_STREAM_WAIT_VALUE_GEQ));
                CK(cuEventRecord(ev[2 * pairs], s));
            }
            for (int k = 0; k < group && m != 4; k++) {
                add<<<blocks, threads, 0, (cudaStream_t)s>>>(x, n, stamps, i + k);
                cpu_gap(gap);
            }
            if (m == 4)
                cpu_gap(gap);
            if (m > 0) {
                CK(cuEventRecord(ev[2 * pairs + 1], s));
                *flag = gate;
                pairs++;
            }
        }
        CK(cuStreamSynchronize(s));
        double wall = now_us() - wall0;
        double busy_nvml = nvml_busy();
        cudaMemcpy(host, stamps, 16 * (size_t)N, cudaMemcpyDeviceToHost);
        double ran = 0;
        int kernels = m == 4 ? 0 : N;
        for (int i = 0; i < kernels; i++)
            ran += (double)(host[2 * i + 1] - host[2 * i]) / 1000.0;
        double span = 0;
        for (int b = 0; b < pairs; b++) {
            float ms;
            CK(cuEventElapsedTime(&ms, ev[2 * b], ev[2 * b + 1]));
            span += ms * 1000;
        }
        printf("%-10s: ran %.3f us/kernel, event span %.3f us/kernel (%.3f us/pair), "
               "span/ran %.3f; wall %.0f ms, ran %.1f %% of wall, NVML %.1f %%\n",
               modes[m], kernels ? ran / kernels : 0.0, kernels ? span / kernels : 0.0,
               pairs ? span / pairs : 0.0, ran > 0 ? span / ran : 0.0, wall / 1000,
               100 * ran / wall, busy_nvml);
    }
    return 0;
}
