/*
 * bench_launch.c - empty-kernel launch rate and the time of one launch call,
 * for benchmarks/bench_launch.py (which builds and runs it with and without
 * the hook). Driver API only, no CUDA toolkit: the kernel is PTX text, so
 * the same program runs on a real GPU and on the simulator.
 *
 *   bench_launch LAUNCHES SYNC_EVERY
 *
 * Launches an empty kernel LAUNCHES times on one stream, synchronising every
 * SYNC_EVERY launches (a bounded queue, as real programs have), and prints
 * one JSON object: launches per second over the whole run, and the median
 * and 99th percentile of the time spent inside cuLaunchKernel.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"

static const char ptx[] = ".version 7.0\n"
                          ".target sm_52\n"
                          ".address_size 64\n"
                          ".visible .entry vgpu_empty()\n"
                          "{\n"
                          "\tret;\n"
                          "}\n";

#define FNS(X) \
    X(cuInit) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuModuleLoadData) \
    X(cuModuleGetFunction) X(cuStreamCreate) X(cuStreamSynchronize) X(cuLaunchKernel)

#define FIELD(name) __typeof__(name) *name;
static struct {
    FNS(FIELD)
} cu;
#undef FIELD

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

#define CHECK(call) \
    do { \
        CUresult rc_ = (call); \
        if (rc_ != CUDA_SUCCESS) { \
            fprintf(stderr, "bench_launch: %s failed: %d\n", #call, (int)rc_); \
            return 1; \
        } \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: bench_launch LAUNCHES SYNC_EVERY\n");
        return 2;
    }
    unsigned long launches = strtoul(argv[1], NULL, 10), sync_every = strtoul(argv[2], NULL, 10);
    if (launches == 0 || sync_every == 0) {
        fprintf(stderr, "bench_launch: LAUNCHES and SYNC_EVERY must be positive\n");
        return 2;
    }
    /* Resolved like a program linked to libcuda: the hook, when preloaded,
     * answers dlsym with its wrappers. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "bench_launch: %s\n", dlerror());
        return 1;
    }
#define RESOLVE(name) \
    if ((cu.name = (__typeof__(name) *)dlsym(lib, #name)) == NULL) { \
        fprintf(stderr, "bench_launch: no %s\n", #name); \
        return 1; \
    }
    FNS(RESOLVE)
#undef RESOLVE
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUstream stream;
    CHECK(cu.cuInit(0));
    CHECK(cu.cuDeviceGet(&dev, 0));
    CHECK(cu.cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cu.cuCtxSetCurrent(ctx));
    CHECK(cu.cuModuleLoadData(&mod, ptx));
    CHECK(cu.cuModuleGetFunction(&f, mod, "vgpu_empty"));
    CHECK(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

    /* Warm up: first launches load the module and grow driver queues. */
    for (int i = 0; i < 1000; i++)
        CHECK(cu.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
    CHECK(cu.cuStreamSynchronize(stream));

    uint32_t *call_ns = malloc(launches * sizeof(*call_ns));
    if (call_ns == NULL)
        return 1;
    uint64_t start = now_ns();
    for (unsigned long i = 0; i < launches; i++) {
        uint64_t t0 = now_ns();
        CUresult rc = cu.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL);
        uint64_t t1 = now_ns();
        if (rc != CUDA_SUCCESS) {
            fprintf(stderr, "bench_launch: cuLaunchKernel failed: %d\n", (int)rc);
            return 1;
        }
        call_ns[i] = (uint32_t)(t1 - t0 > UINT32_MAX ? UINT32_MAX : t1 - t0);
        if ((i + 1) % sync_every == 0)
            CHECK(cu.cuStreamSynchronize(stream));
    }
    CHECK(cu.cuStreamSynchronize(stream));
    double seconds = (double)(now_ns() - start) / 1e9;
    qsort(call_ns, launches, sizeof(*call_ns), cmp_u32);
    printf("{\"launches\": %lu, \"seconds\": %.6f, \"rate\": %.1f, \"median_ns\": %u, "
           "\"p99_ns\": %u}\n",
           launches, seconds, (double)launches / seconds, call_ns[launches / 2],
           call_ns[launches * 99 / 100]);
    free(call_ns);
    return 0;
}
