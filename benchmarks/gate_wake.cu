// How long after the host opens a gate does the GPU pass it, as a function
// of how long the stream sat blocked behind it? A stream waits on a word
// (cuStreamWaitValue32), then runs an empty kernel; after T us the host
// opens the gate and polls the stream until it is idle. The wake latency is
// that time less the same kernel's time with the gate already open. Two
// kinds of gate: a word in pinned host memory that the CPU writes (what
// the hook uses), and a word in device memory written by
// cuStreamWriteValue32 on a second stream.
// On the GPU node:
//   nvcc -O2 -arch=sm_90 -o gate_wake benchmarks/gate_wake.cu -lcuda && ./gate_wake
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__global__ void empty() {}

static double now_us()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

#define CK(x)                                                                                      \
    do {                                                                                           \
        CUresult r_ = (x);                                                                         \
        if (r_) {                                                                                  \
            printf("%s failed %d\n", #x, r_);                                                      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main()
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    cudaFree(0);
    CUstream s, opener;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&opener, CU_STREAM_NON_BLOCKING));
    volatile uint32_t *hflag;
    CK(cuMemHostAlloc((void **)&hflag, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CUdeviceptr hword, dword;
    CK(cuMemHostGetDevicePointer(&hword, (void *)hflag, 0));
    CK(cuMemAlloc(&dword, 4096));
    CK(cuMemsetD32(dword, 0, 1));
    *hflag = 0;
    uint32_t gate = 0;
    const int N = 200;
    double lat[N];
    const double blocked[] = {0, 5, 20, 50, 100, 200, 500, 1000, 3000};
    for (int kind = 0; kind < 2; kind++) {
        CUdeviceptr word = kind == 0 ? hword : dword;
        for (unsigned b = 0; b < sizeof(blocked) / sizeof(blocked[0]); b++) {
            for (int i = 0; i < N; i++) {
                ++gate;
                CK(cuStreamWaitValue32(s, word, gate, CU_STREAM_WAIT_VALUE_GEQ));
                empty<<<1, 1, 0, (cudaStream_t)s>>>();
                double t0 = now_us();
                while (now_us() - t0 < blocked[b]) {
                }
                double open = now_us();
                if (kind == 0)
                    *hflag = gate;
                else
                    CK(cuStreamWriteValue32(opener, dword, gate, 0));
                while (cuStreamQuery(s) == CUDA_ERROR_NOT_READY) {
                }
                lat[i] = now_us() - open;
            }
            qsort(lat, N, sizeof(double), cmp);
            printf("%s gate, blocked %6.0f us: open to done median %6.1f us, p90 %6.1f us\n",
                   kind == 0 ? "host  " : "device", blocked[b], lat[N / 2], lat[N * 9 / 10]);
        }
    }
    return 0;
}
