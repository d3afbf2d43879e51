// Can one launch's own event pair, gated, be what launch-bound work is
// charged beside another context? (docs/compute.md, "Co-location when the
// launch-bound share binds" and "An unhooked neighbour".) A batch's pair
// spans the other context's time slices; a pair around one kernel whose
// gate opens only once the kernel is queued spans the kernel and nothing
// before it, and takes in a slice only where one falls inside the kernel.
//
// Roles, each its own process (its own context):
//   pair_probe tenant SECONDS LABEL  the measured process: "tokens" of 32
//       kernels of fixed work (~25 us alone; PAIR_PROBE_ITERS) launched one by one with 10 us
//       of CPU between launches (PAIR_PROBE_GAP_US), on one block or more
//       (PAIR_PROBE_BLOCKS), each token synchronised (as a decoder
//       reads its token back). In even tokens one launch (a different one
//       each token) is gated and timed alone; in odd tokens one is timed
//       ungated (its pair may take in the launch gap before it); every
//       token is timed whole. Prints one JSON line (LABEL names the phase).
//   pair_probe chain SECONDS         the tenant's loop, nothing timed: a
//       launch-bound neighbour.
//   pair_probe gemm SECONDS          2 ms kernels of fixed work back to back,
//       a sync every 8: a GPU-bound neighbour.
// Neighbours print their own rate. On the GPU node:
//   nvcc -O2 -arch=sm_90 -o pair_probe benchmarks/pair_probe.cu -lcuda
//   ./pair_probe tenant 6 alone; (./pair_probe gemm 8 &) ; sleep 1; ./pair_probe tenant 6 gemm
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_probe.h"

#define KERNELS 32
#define MAX_TOKENS 200000

// Fixed work on one block: its time is its own, however the GPU slices it.
__global__ void work(float *out, int iters)
{
    float x = threadIdx.x, a = 1.0001f, b = 0.0001f;
    for (int i = 0; i < iters; i++)
        x = x * a + b;
    if (x == -1.0f)
        out[threadIdx.x] = x; // never: keeps the loop
}

// Nothing: run first, it makes the context run on the GPU before a pair's
// start event (PAIR_PROBE_TOUCH).
__global__ void touch(void) {}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(double *v, int n, double q)
{
    return n ? v[(int)(q * (n - 1))] : 0;
}

static double mean(const double *v, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += v[i];
    return n ? s / n : 0;
}

// Mean of the values under `limit`, and their share.
static double mean_under(const double *v, int n, double limit, double *share)
{
    double s = 0;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (v[i] < limit) {
            s += v[i];
            k++;
        }
    *share = n ? (double)k / n : 0;
    return k ? s / k : 0;
}

static void print_pairs(const char *name, double *v, int n)
{
    qsort(v, n, sizeof *v, cmp);
    double med = quantile(v, n, 0.5), under = 0;
    double m15 = mean_under(v, n, 1.5 * med, &under);
    printf("\"%s\": {\"n\": %d, \"median_us\": %.2f, \"mean_us\": %.2f, \"p90_us\": %.2f, "
           "\"p99_us\": %.2f, \"max_us\": %.2f, \"mean_under_1.5x_median_us\": %.2f, "
           "\"share_under_1.5x_median\": %.4f}",
           name, n, med, mean(v, n), quantile(v, n, 0.9), quantile(v, n, 0.99), v[n ? n - 1 : 0],
           m15, under);
}

static double env_or(const char *name, double otherwise)
{
    const char *e = getenv(name);
    return e ? atof(e) : otherwise;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s tenant|chain|gemm SECONDS [LABEL]\n", argv[0]);
        return 2;
    }
    const char *role = argv[1];
    double seconds = atof(argv[2]);
    const char *label = argc > 3 ? argv[3] : role;
    CK(cuInit(0));
    cudaFree(0);
    // The tenant's stream: its own, or the legacy default stream, as an
    // eager PyTorch program's (PAIR_PROBE_LEGACY); its events default or
    // blocking-sync, as the hook's (PAIR_PROBE_BLOCKING).
    CUstream s = CU_STREAM_LEGACY;
    if (env_or("PAIR_PROBE_LEGACY", 0) == 0)
        CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    unsigned flags = env_or("PAIR_PROBE_BLOCKING", 0) != 0 ? CU_EVENT_BLOCKING_SYNC : CU_EVENT_DEFAULT;
    cudaStream_t rs = (cudaStream_t)s;
    float *out;
    cudaMalloc(&out, 4096);
    int iters = (int)env_or("PAIR_PROBE_ITERS", 10000);
    double gap_us = env_or("PAIR_PROBE_GAP_US", 10.0);
    int blocks = (int)env_or("PAIR_PROBE_BLOCKS", 1); // the tenant's kernels: 1, or the whole GPU
    // Time the first kernel of each token (the stream idle before it), after
    // PAIR_PROBE_IDLE_US of CPU between tokens; with an empty kernel between
    // the gate and the start event (PAIR_PROBE_TOUCH).
    bool first = env_or("PAIR_PROBE_FIRST", 0) != 0;
    double idle_us = env_or("PAIR_PROBE_IDLE_US", 0);
    bool touch_first = env_or("PAIR_PROBE_TOUCH", 0) != 0;
    // Without the token's own events (a pair then opens the stream's new
    // work, as a hooked batch does: PAIR_PROBE_NO_TOKEN), and with each
    // token read back by a copy to pageable memory, as .item() does
    // (PAIR_PROBE_COPY).
    bool token_events = env_or("PAIR_PROBE_NO_TOKEN", 0) == 0;
    bool copy = env_or("PAIR_PROBE_COPY", 0) != 0;
    static float readback[4];
    // The kernel's first launch loads its module, which waits for the
    // context's work: behind a shut gate, for ever. Load it first.
    work<<<1, 32, 0, rs>>>(out, 1);
    touch<<<1, 1, 0, rs>>>();
    CK(cuStreamSynchronize(s));
    double end = now_us() + seconds * 1e6;

    if (strcmp(role, "gemm") == 0) {
        long kernels = 0;
        double t0 = now_us();
        while (now_us() < end) {
            for (int k = 0; k < 8; k++)
                work<<<1, 32, 0, rs>>>(out, iters * 100);
            CK(cuStreamSynchronize(s));
            kernels += 8;
        }
        printf("{\"role\": \"gemm\", \"kernels_per_s\": %.1f}\n", kernels / ((now_us() - t0) / 1e6));
        return 0;
    }

    bool timed = strcmp(role, "tenant") == 0;
    struct gate_word g = gate_word_new();
    uint32_t opened = 0;
    static double gated[MAX_TOKENS], ungated[MAX_TOKENS], token[MAX_TOKENS];
    int ng = 0, nu = 0, nt = 0;
    CUevent t0e, t1e, k0, k1;
    CK(cuEventCreate(&t0e, flags));
    CK(cuEventCreate(&t1e, flags));
    CK(cuEventCreate(&k0, flags));
    CK(cuEventCreate(&k1, flags));
    long tokens = 0;
    double start = now_us();
    while (now_us() < end && nt < MAX_TOKENS) {
        int sampled = first ? 0 : (int)((tokens / 2) % KERNELS);
        if (idle_us > 0)
            cpu_gap(idle_us);
        bool gate = tokens % 2 == 0;
        if (timed && token_events)
            CK(cuEventRecord(t0e, s));
        for (int i = 0; i < KERNELS; i++) {
            bool pair = timed && i == sampled;
            if (pair && gate)
                CK(cuStreamWaitValue32(s, g.dev, opened + 1, CU_STREAM_WAIT_VALUE_GEQ));
            if (pair && touch_first)
                touch<<<1, 1, 0, rs>>>();
            if (pair)
                CK(cuEventRecord(k0, s));
            work<<<blocks, 32, 0, rs>>>(out, iters);
            if (pair)
                CK(cuEventRecord(k1, s));
            if (pair && gate)
                *g.host = ++opened; // open once the kernel and its end are queued
            cpu_gap(gap_us);
        }
        if (timed && token_events)
            CK(cuEventRecord(t1e, s));
        if (copy)
            CK(cuMemcpyDtoHAsync(readback, (CUdeviceptr)out, sizeof readback, s));
        CK(cuStreamSynchronize(s));
        tokens++;
        if (tokens == 1 || tokens % 20000 == 0)
            fprintf(stderr, "%s: %ld tokens\n", role, tokens);
        if (!timed)
            continue;
        float ms;
        CK(cuEventElapsedTime(&ms, k0, k1));
        if (gate)
            gated[ng++] = ms * 1000;
        else
            ungated[nu++] = ms * 1000;
        if (token_events) {
            CK(cuEventElapsedTime(&ms, t0e, t1e));
            token[nt++] = ms * 1000;
        }
    }
    double wall_s = (now_us() - start) / 1e6;
    if (!timed) {
        printf("{\"role\": \"chain\", \"tokens_per_s\": %.1f}\n", tokens / wall_s);
        return 0;
    }
    printf("{\"role\": \"tenant\", \"phase\": \"%s\", \"iters\": %d, \"gap_us\": %.1f, "
           "\"blocks\": %d, \"first\": %d, \"idle_us\": %.1f, \"touch\": %d, "
           "\"tokens_per_s\": %.1f, ",
           label, iters, gap_us, blocks, first, idle_us, touch_first, tokens / wall_s);
    print_pairs("gated_pair", gated, ng);
    printf(", ");
    print_pairs("ungated_pair", ungated, nu);
    printf(", ");
    print_pairs("token_span", token, nt);
    printf("}\n");
    return 0;
}
