/*
 * test_sim_cuda - the simulated libcuda.so.1 behaves like a driver where
 * vgpud's tests rely on it: devices and config, capacity and accounting,
 * copies, pointer queries, modules, launch timing, capture and graphs,
 * host-gated stream waits,
 * cuGetProcAddress variants, pools, VMM, arrays, IPC across processes,
 * CUDA_VISIBLE_DEVICES, and memory of a SIGKILLed process coming back.
 *
 * It dlopens $VGPU_BUILD/sim/libcuda.so.1 by path on a private state file,
 * so it needs no LD_LIBRARY_PATH. Child processes are forked: the
 * simulator forgets the parent's driver state in a child, which then calls
 * cuInit like a fresh process.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"
#include "nvml_api.h"
#include "check.h"

#define FIELD(ret, name, params, args) ret(*name) params;
static struct {
    CUDA_API_LIST(FIELD)
} cu;
#undef FIELD

static void *g_lib;

#define CHECK_CU(call, expected)                                                            \
    do {                                                                                    \
        CUresult r_ = (call);                                                               \
        CHECKF(r_ == (expected), "%s returned %d, expected %d", #call, r_, (int)(expected)); \
    } while (0)

#define OK(call) CHECK_CU(call, CUDA_SUCCESS)

#define CUDA_ERROR_ILLEGAL_STATE 401
#define MIB (1024ULL * 1024ULL)
#define CAPACITY (1024 * MIB)
#define CTX_OVERHEAD (16 * MIB)
#define SMS 4

static const char PTX[] = ".version 7.0\n.target sm_52\n.address_size 64\n"
                          ".visible .entry vgpu_spin(.param .u64 ns, .param .u64 out)\n{\n ret;\n}\n"
                          ".visible .entry other_kernel()\n{\n ret;\n}\n"
                          ".visible .entry vgpu_touch()\n{\n ret;\n}\n";

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static size_t used_now(void)
{
    size_t free_bytes = 0, total = 0;
    OK(cu.cuMemGetInfo_v2(&free_bytes, &total));
    return total - free_bytes;
}

static CUcontext primary(int ordinal)
{
    CUcontext ctx = NULL;
    OK(cu.cuDevicePrimaryCtxRetain(&ctx, ordinal));
    OK(cu.cuCtxSetCurrent(ctx));
    return ctx;
}

/* vgpu_spin of a module loaded into *m (the caller unloads it). */
static CUfunction spin_function(CUmodule *m)
{
    CUfunction f = NULL;
    OK(cu.cuModuleLoadData(m, PTX));
    OK(cu.cuModuleGetFunction(&f, *m, "vgpu_spin"));
    return f;
}

static CUresult launch_spin(CUfunction f, uint64_t ns, unsigned blocks, CUstream s)
{
    uint64_t out = 0;
    void *args[] = {&ns, &out};
    return cu.cuLaunchKernel(f, blocks, 1, 1, 32, 1, 1, 0, s, args, NULL);
}

/* ---- tests ---- */

static void test_every_entry_point_is_exported(void)
{
    int missing = 0;
#define LOOKUP(ret, name, params, args)                                   \
    if ((*(void **)&cu.name = dlsym(g_lib, #name)) == NULL) {             \
        fprintf(stderr, "libcuda.so.1 (sim) does not export %s\n", #name); \
        missing++;                                                        \
    }
    CUDA_API_LIST(LOOKUP)
#undef LOOKUP
    CHECK(missing == 0);
}

static void test_devices_follow_config(void)
{
    int count = 0, value = 0, major = 0, minor = 0, driver = 0;
    char name[128], bus[32];
    size_t total = 0;
    CUuuid uuid;
    CUdevice dev;
    CHECK_CU(cu.cuDeviceGetCount(&count), CUDA_ERROR_NOT_INITIALIZED);
    OK(cu.cuDriverGetVersion(&driver));
    CHECK(driver == 13000);
    OK(cu.cuInit(0));
    OK(cu.cuDeviceGetCount(&count));
    CHECK(count == 2);
    OK(cu.cuDeviceGetName(name, sizeof(name), 0));
    CHECK(strcmp(name, "vgpud simulated GPU") == 0);
    OK(cu.cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 1));
    CHECK(value == SMS);
    OK(cu.cuDeviceTotalMem_v2(&total, 1));
    CHECK(total == CAPACITY);
    OK(cu.cuDeviceComputeCapability(&major, &minor, 0));
    CHECK(major == 9 && minor == 0);
    OK(cu.cuDeviceGetUuid_v2(&uuid, 1));
    CHECK(uuid.bytes[0] == 0x51 && uuid.bytes[1] == 0x17 && uuid.bytes[15] == 0x01);
    OK(cu.cuDeviceGetPCIBusId(bus, sizeof(bus), 1));
    CHECK(strcmp(bus, "0000:02:00.0") == 0);
    OK(cu.cuDeviceGetByPCIBusId(&dev, bus));
    CHECK(dev == 1);
    CHECK_CU(cu.cuDeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
    CHECK_CU(cu.cuMemAlloc_v2(&(CUdeviceptr){0}, 1), CUDA_ERROR_INVALID_CONTEXT);
}

static void test_capacity_is_enforced_and_accounted(void)
{
    CUcontext ctx = primary(0);
    CUdeviceptr a = 0, b = 0;
    size_t before = used_now();
    CHECK(before == CTX_OVERHEAD);
    OK(cu.cuMemAlloc_v2(&a, 600 * MIB));
    CHECK(used_now() == before + 600 * MIB);
    CHECK_CU(cu.cuMemAlloc_v2(&b, 500 * MIB), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(used_now() == before + 600 * MIB);
    OK(cu.cuMemFree_v2(a));
    CHECK(used_now() == before);
    OK(cu.cuMemAlloc_v2(&b, 500 * MIB));
    OK(cu.cuMemFree_v2(b));
    CHECK_CU(cu.cuMemFree_v2(b), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cu.cuMemAlloc_v2(&a, 0), CUDA_ERROR_INVALID_VALUE);

    /* A created context charges its overhead and takes its memory with it. */
    CUcontext extra;
    OK(cu.cuCtxCreate_v2(&extra, 0, 0));
    OK(cu.cuMemAlloc_v2(&a, 100 * MIB));
    CHECK(used_now() == before + CTX_OVERHEAD + 100 * MIB);
    OK(cu.cuCtxDestroy_v2(extra));
    OK(cu.cuCtxSetCurrent(ctx));
    CHECK(used_now() == before);
}

/* The affinity and CIG variants make regular contexts when asked for
 * nothing special, and refuse what a GPU without MPS or a graphics client
 * cannot give. */
static void test_context_variants(void)
{
    CUcontext ctx = primary(0), extra;
    size_t before = used_now();
    CUexecAffinityParam sms = {0, {{2}}};
    CUctxCigParam cig = {1, NULL};
    CUctxCreateParams plain = {NULL, 0, NULL}, affinity = {&sms, 1, NULL};
    CUctxCreateParams both = {&sms, 1, &cig}, shared = {NULL, 0, &cig}, dangling = {NULL, 1, NULL};

    OK(cu.cuCtxCreate_v3(&extra, NULL, 0, 0, 0));
    CHECK(used_now() == before + CTX_OVERHEAD);
    OK(cu.cuCtxDestroy_v2(extra));
    CHECK_CU(cu.cuCtxCreate_v3(&extra, &sms, 1, 0, 0), CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY);
    CHECK_CU(cu.cuCtxCreate_v3(&extra, NULL, 1, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cu.cuCtxCreate_v3(&extra, NULL, -1, 0, 0), CUDA_ERROR_INVALID_VALUE);

    OK(cu.cuCtxCreate_v4(&extra, NULL, 0, 0));
    CHECK(used_now() == before + CTX_OVERHEAD);
    OK(cu.cuCtxDestroy_v2(extra));
    OK(cu.cuCtxCreate_v4(&extra, &plain, 0, 0));
    OK(cu.cuCtxDestroy_v2(extra));
    CHECK_CU(cu.cuCtxCreate_v4(&extra, &affinity, 0, 0), CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY);
    CHECK_CU(cu.cuCtxCreate_v4(&extra, &both, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cu.cuCtxCreate_v4(&extra, &shared, 0, 0), CUDA_ERROR_NOT_SUPPORTED);
    CHECK_CU(cu.cuCtxCreate_v4(&extra, &dangling, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cu.cuCtxCreate_v4(&extra, NULL, 0, 7), CUDA_ERROR_INVALID_DEVICE);
    OK(cu.cuCtxSetCurrent(ctx));
    CHECK(used_now() == before);
}

static void test_copies_preserve_content(void)
{
    primary(0);
    CUdeviceptr a, b;
    uint32_t in[1024], out[1024];
    for (unsigned i = 0; i < 1024; i++)
        in[i] = i * 2654435761u;
    OK(cu.cuMemAlloc_v2(&a, sizeof(in)));
    OK(cu.cuMemAlloc_v2(&b, sizeof(in)));
    OK(cu.cuMemcpyHtoD_v2(a, in, sizeof(in)));
    OK(cu.cuMemcpyDtoD_v2(b, a, sizeof(in)));
    OK(cu.cuMemcpyDtoH_v2(out, b, sizeof(out)));
    CHECK(memcmp(in, out, sizeof(in)) == 0);
    OK(cu.cuMemsetD32_v2(b + 8, 0xdeadbeef, 4));
    OK(cu.cuMemcpyDtoH_v2(out, b, 32));
    CHECK(out[1] == in[1] && out[2] == 0xdeadbeef && out[5] == 0xdeadbeef && out[6] == in[6]);
    CHECK_CU(cu.cuMemcpyDtoH_v2(out, b + sizeof(in) - 4, 8), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cu.cuMemcpyHtoD_v2((CUdeviceptr)(uintptr_t)in, in, 4), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cu.cuMemsetD32_v2(b + 2, 0, 1), CUDA_ERROR_INVALID_VALUE);
    OK(cu.cuMemFree_v2(a));
    OK(cu.cuMemFree_v2(b));
}

static void test_pointer_queries(void)
{
    CUcontext ctx = primary(1), owner = NULL;
    CUdeviceptr d, base = 0, dp = 0;
    size_t size = 0;
    unsigned type = 0;
    int ordinal = -1;
    void *host = NULL;
    OK(cu.cuMemAlloc_v2(&d, 4096));
    OK(cu.cuPointerGetAttribute(&owner, 1 /* CONTEXT */, d + 100));
    CHECK(owner == ctx);
    OK(cu.cuPointerGetAttribute(&type, 2 /* MEMORY_TYPE */, d));
    CHECK(type == 2);
    OK(cu.cuPointerGetAttribute(&ordinal, 9 /* DEVICE_ORDINAL */, d));
    CHECK(ordinal == 1);
    OK(cu.cuMemGetAddressRange_v2(&base, &size, d + 4000));
    CHECK(base == d && size == 4096);
    CHECK_CU(cu.cuPointerGetAttribute(&type, 2, d + 4096), CUDA_ERROR_INVALID_VALUE);

    size_t used = used_now();
    OK(cu.cuMemHostAlloc(&host, 1 << 20, CU_MEMHOSTALLOC_DEVICEMAP));
    CHECK(used_now() == used); /* host memory is not device memory */
    OK(cu.cuPointerGetAttribute(&type, 2, (CUdeviceptr)(uintptr_t)host));
    CHECK(type == 1);
    OK(cu.cuMemHostGetDevicePointer_v2(&dp, host, 0));
    CHECK(dp == (CUdeviceptr)(uintptr_t)host);
    OK(cu.cuMemFreeHost(host));
    OK(cu.cuMemFree_v2(d));
}

static void test_modules_resolve_ptx_entries(void)
{
    primary(0);
    CUmodule m, bin;
    CUfunction f;
    OK(cu.cuModuleLoadData(&m, PTX));
    OK(cu.cuModuleGetFunction(&f, m, "other_kernel"));
    CHECK_CU(cu.cuModuleGetFunction(&f, m, "missing_kernel"), CUDA_ERROR_NOT_FOUND);
    CHECK_CU(cu.cuModuleLoadData(&bin, "not a module"), CUDA_ERROR_INVALID_IMAGE);
    static const char elf[16] = "\x7f" "ELF";
    OK(cu.cuModuleLoadData(&bin, elf));
    OK(cu.cuModuleGetFunction(&f, bin, "anything"));
    OK(cu.cuModuleUnload(bin));
    OK(cu.cuModuleUnload(m));
}

static void test_launches_take_their_time(void)
{
    primary(0);
    CUmodule m;
    CUfunction spin = spin_function(&m);
    CUstream s;
    CUevent e0, e1;
    float ms = 0;
    OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cu.cuEventCreate(&e0, 0));
    OK(cu.cuEventCreate(&e1, 0));
    double t0 = now_ms();
    OK(cu.cuEventRecord(e0, s));
    OK(launch_spin(spin, 30 * 1000000ULL, 2 * SMS + 1, s)); /* three waves */
    OK(cu.cuEventRecord(e1, s));
    CHECK_CU(cu.cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    CHECK_CU(cu.cuEventElapsedTime(&ms, e0, e1), CUDA_ERROR_NOT_READY);
    OK(cu.cuStreamSynchronize(s));
    CHECK(now_ms() - t0 >= 90);
    OK(cu.cuStreamQuery(s));
    OK(cu.cuEventElapsedTime_v2(&ms, e0, e1));
    CHECK(ms >= 90 && ms < 2000);
    OK(cu.cuEventDestroy_v2(e0));
    OK(cu.cuEventDestroy_v2(e1));
    OK(cu.cuStreamDestroy_v2(s));
    OK(cu.cuModuleUnload(m));
}

static void test_capture_records_instead_of_running(void)
{
    primary(0);
    CUmodule m;
    CUfunction spin = spin_function(&m);
    CUstream s;
    CUgraph g;
    CUgraphExec exec;
    CUevent e0, e1;
    CUstreamCaptureStatus status;
    float ms = 0;
    OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cu.cuEventCreate(&e0, 0));
    OK(cu.cuEventCreate(&e1, 0));
    CHECK_CU(cu.cuStreamBeginCapture_v2(NULL, 0), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    OK(cu.cuStreamBeginCapture_v2(s, 0));
    OK(cu.cuStreamIsCapturing(s, &status));
    CHECK(status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    OK(launch_spin(spin, 20 * 1000000ULL, 1, s));
    OK(launch_spin(spin, 20 * 1000000ULL, 1, s));
    CHECK_CU(cu.cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    OK(cu.cuStreamEndCapture(s, &g));
    OK(cu.cuStreamIsCapturing(s, &status));
    CHECK(status == CU_STREAM_CAPTURE_STATUS_NONE);
    /* Nothing ran: a marker recorded now is complete at once. */
    OK(cu.cuEventRecord(e0, s));
    OK(cu.cuEventQuery(e0));
    OK(cu.cuGraphInstantiateWithFlags(&exec, g, 0));
    OK(cu.cuEventRecord(e0, s));
    OK(cu.cuGraphLaunch(exec, s));
    OK(cu.cuEventRecord(e1, s));
    CHECK_CU(cu.cuEventQuery(e1), CUDA_ERROR_NOT_READY);
    OK(cu.cuEventSynchronize(e1));
    OK(cu.cuEventElapsedTime(&ms, e0, e1));
    CHECK(ms >= 40 && ms < 2000);
    CHECK_CU(cu.cuStreamEndCapture(s, &g), CUDA_ERROR_ILLEGAL_STATE);
    OK(cu.cuGraphExecDestroy(exec));
    OK(cu.cuGraphDestroy(g));
    OK(cu.cuEventDestroy_v2(e0));
    OK(cu.cuEventDestroy_v2(e1));
    OK(cu.cuStreamDestroy_v2(s));
    OK(cu.cuModuleUnload(m));
}

/* ---- host-gated stream waits ---- */

/* A gate word as the hook makes one: pinned, device-mapped host memory. */
struct gate {
    uint32_t *word;
    CUdeviceptr dptr;
};

static struct gate gate_new(void)
{
    struct gate g = {NULL, 0};
    OK(cu.cuMemHostAlloc((void **)&g.word, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    OK(cu.cuMemHostGetDevicePointer_v2(&g.dptr, g.word, 0));
    return g;
}

static void gate_open(struct gate g, uint32_t value)
{
    __atomic_store_n(g.word, value, __ATOMIC_RELEASE); /* no CUDA call, as the hook does */
}

/* Device 1 current, a gate word, a non-blocking stream to gate, vgpu_spin. */
struct gated {
    struct gate g;
    CUstream s;
    CUmodule m;
    CUfunction spin;
};

static struct gated gated_new(void)
{
    primary(1);
    struct gated f = {gate_new(), NULL, NULL, NULL};
    OK(cu.cuStreamCreate(&f.s, CU_STREAM_NON_BLOCKING));
    f.spin = spin_function(&f.m);
    return f;
}

static void gated_free(struct gated f)
{
    OK(cu.cuStreamDestroy_v2(f.s));
    OK(cu.cuMemFreeHost(f.g.word));
    OK(cu.cuModuleUnload(f.m));
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Device 1's busy share of the last 200 ms, as NVML reports it. */
static unsigned device1_busy(void)
{
    char path[4096];
    const char *build = getenv("VGPU_BUILD");
    snprintf(path, sizeof(path), "%s/sim/libnvidia-ml.so.1", build != NULL ? build : "build");
    void *nvml = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CHECKF(nvml != NULL, "cannot load %s", path);
    if (nvml == NULL)
        return 100;
    nvmlReturn_t (*init)(void) = (nvmlReturn_t(*)(void))dlsym(nvml, "nvmlInit_v2");
    nvmlReturn_t (*handle)(unsigned, nvmlDevice_t *) =
        (nvmlReturn_t(*)(unsigned, nvmlDevice_t *))dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*rates)(nvmlDevice_t, nvmlUtilization_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlUtilization_t *))dlsym(nvml, "nvmlDeviceGetUtilizationRates");
    nvmlDevice_t dev;
    nvmlUtilization_t u = {100, 0};
    CHECK(init() == NVML_SUCCESS && handle(1, &dev) == NVML_SUCCESS && rates(dev, &u) == NVML_SUCCESS);
    return u.gpu;
}

static void test_gate_holds_work_until_the_word_is_written(void)
{
    struct gated f = gated_new();
    struct gate g = f.g;
    CUstream s = f.s;
    CUfunction spin = f.spin;
    CUevent e0, e1;
    float ms = 0;
    int value = 0;
    OK(cu.cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 1));
    CHECK(value == 1);
    OK(cu.cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, 1));
    CHECK(value == 1);
    OK(cu.cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 1));
    CHECK(value == 1);
    OK(cu.cuEventCreate(&e0, 0));
    OK(cu.cuEventCreate(&e1, 0));
    OK(cu.cuStreamWaitValue32_v2(s, g.dptr, 1, CU_STREAM_WAIT_VALUE_GEQ));
    OK(cu.cuEventRecord(e0, s));
    OK(launch_spin(spin, 30 * 1000000ULL, 1, s));
    OK(cu.cuEventRecord(e1, s));
    sleep_ms(120);
    /* Held: nothing ran, nothing is complete, the device stayed idle. */
    CHECK_CU(cu.cuEventQuery(e0), CUDA_ERROR_NOT_READY);
    CHECK_CU(cu.cuEventQuery(e1), CUDA_ERROR_NOT_READY);
    CHECK_CU(cu.cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    CHECK_CU(cu.cuEventElapsedTime_v2(&ms, e0, e1), CUDA_ERROR_NOT_READY);
    CHECK(device1_busy() == 0);
    gate_open(g, 1);
    double opened = now_ms();
    OK(cu.cuEventSynchronize(e1));
    CHECK(now_ms() - opened >= 30);
    OK(cu.cuEventElapsedTime_v2(&ms, e0, e1));
    CHECKF(ms >= 30 && ms < 100, "the held kernel took %.1f ms of events", (double)ms);
    OK(cu.cuStreamQuery(s));
    OK(cu.cuEventDestroy_v2(e0));
    OK(cu.cuEventDestroy_v2(e1));
    gated_free(f);
}

/* Kernels launched one by one with a CPU gap between them: behind a gate
 * that opens once all are queued, the event pair spans the kernels only;
 * without it, the gap too. */
static float span_of_gapped_kernels(CUfunction spin, CUstream s, const struct gate *g)
{
    CUevent e0, e1;
    float ms = -1;
    OK(cu.cuEventCreate(&e0, 0));
    OK(cu.cuEventCreate(&e1, 0));
    if (g != NULL)
        OK(cu.cuStreamWaitValue32(s, g->dptr, 2, CU_STREAM_WAIT_VALUE_GEQ));
    OK(cu.cuEventRecord(e0, s));
    OK(launch_spin(spin, 10 * 1000000ULL, 1, s));
    sleep_ms(100);
    OK(launch_spin(spin, 10 * 1000000ULL, 1, s));
    OK(cu.cuEventRecord(e1, s));
    if (g != NULL)
        gate_open(*g, 2);
    OK(cu.cuStreamSynchronize(s));
    OK(cu.cuEventElapsedTime(&ms, e0, e1));
    OK(cu.cuEventDestroy_v2(e0));
    OK(cu.cuEventDestroy_v2(e1));
    return ms;
}

static void test_gated_events_time_the_kernels_not_the_gaps(void)
{
    struct gated f = gated_new();
    struct gate g = f.g;
    CUstream s = f.s;
    CUfunction spin = f.spin;
    float gated = span_of_gapped_kernels(spin, s, &g), open = span_of_gapped_kernels(spin, s, NULL);
    CHECKF(gated >= 20 && gated < 80, "gated span %.1f ms", (double)gated);
    CHECKF(open >= 110, "ungated span %.1f ms", (double)open);
    gated_free(f);
}

/* A pair around a 10 ms kernel on `s` while another stream's 60 ms kernel
 * holds the device: the pair's milliseconds. */
/* What the stream did last before the pair: a kernel, a copy (a token read
 * back), or a copy and then, behind the gate, the hook's empty kernel. */
enum lead { LEAD_KERNEL, LEAD_COPY, LEAD_COPY_TOUCH };

static float span_beside_queued_work(struct gated *f, CUstream other, bool gated, enum lead lead)
{
    CUevent e0, e1;
    float ms = -1;
    uint32_t out = 0;
    CUdeviceptr d;
    CUfunction touch = NULL;
    OK(cu.cuModuleGetFunction(&touch, f->m, "vgpu_touch"));
    OK(cu.cuMemAlloc_v2(&d, 4));
    OK(cu.cuEventCreate(&e0, 0));
    OK(cu.cuEventCreate(&e1, 0));
    OK(launch_spin(f->spin, 1000ULL, 1, f->s));
    if (lead != LEAD_KERNEL)
        OK(cu.cuMemcpyDtoHAsync_v2(&out, d, 4, f->s));
    OK(cu.cuStreamSynchronize(f->s));
    OK(launch_spin(f->spin, 60 * 1000000ULL, 1, other));
    uint32_t value = f->g.word[0] + 1;
    if (gated)
        OK(cu.cuStreamWaitValue32(f->s, f->g.dptr, value, CU_STREAM_WAIT_VALUE_GEQ));
    if (lead == LEAD_COPY_TOUCH)
        OK(cu.cuLaunchKernel(touch, 1, 1, 1, 1, 1, 1, 0, f->s, NULL, NULL));
    OK(cu.cuEventRecord(e0, f->s));
    OK(launch_spin(f->spin, 10 * 1000000ULL, 1, f->s));
    OK(cu.cuEventRecord(e1, f->s));
    if (gated)
        gate_open(f->g, value);
    OK(cu.cuStreamSynchronize(f->s));
    OK(cu.cuEventElapsedTime(&ms, e0, e1));
    OK(cu.cuStreamSynchronize(other));
    OK(cu.cuEventDestroy_v2(e0));
    OK(cu.cuEventDestroy_v2(e1));
    OK(cu.cuMemFree_v2(d));
    return ms;
}

/* A start event that waited behind a gate is stamped when the device could
 * next run the stream's work, as an H200 stamps it when its context runs
 * (docs/simulator.md): a gated pair around one kernel times that kernel,
 * not the other work queued on the device before it. A record the stream
 * reaches at once is stamped then, and its pair counts that wait. So is
 * a gated one where the stream's last work was a copy, as on the H200,
 * unless a kernel runs between the gate and the record (the hook's touch,
 * libhook/src/gt_touch.c). */
static void test_a_gated_pair_does_not_count_the_work_queued_before_it(void)
{
    struct gated f = gated_new();
    CUstream other;
    OK(cu.cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
    float gated = span_beside_queued_work(&f, other, true, LEAD_KERNEL);
    float open = span_beside_queued_work(&f, other, false, LEAD_KERNEL);
    float after_copy = span_beside_queued_work(&f, other, true, LEAD_COPY);
    float touched = span_beside_queued_work(&f, other, true, LEAD_COPY_TOUCH);
    CHECKF(gated >= 10 && gated < 40, "gated pair %.1f ms", (double)gated);
    CHECKF(open >= 65, "ungated pair %.1f ms", (double)open);
    CHECKF(after_copy >= 65, "gated pair after a copy %.1f ms", (double)after_copy);
    CHECKF(touched >= 10 && touched < 40, "touched pair after a copy %.1f ms", (double)touched);
    OK(cu.cuStreamDestroy_v2(other));
    gated_free(f);
}

/* Queue a wait with `flags` on a word holding `before`: held; the word
 * becomes `after`: released. A wait satisfied when queued holds nothing. */
static void check_condition(CUstream s, struct gate g, unsigned flags, uint32_t value, uint32_t before, uint32_t after)
{
    CUevent e;
    OK(cu.cuEventCreate(&e, 0));
    gate_open(g, before);
    OK(cu.cuStreamWaitValue32_v2_ptsz(s, g.dptr, value, flags));
    OK(cu.cuEventRecord(e, s));
    CHECKF(cu.cuEventQuery(e) == CUDA_ERROR_NOT_READY, "flags %#x value %#x word %#x: not held", flags, value,
           before);
    gate_open(g, after);
    CHECKF(cu.cuEventQuery(e) == CUDA_SUCCESS, "flags %#x value %#x word %#x: not released", flags, value,
           after);
    OK(cu.cuStreamWaitValue32(s, g.dptr, value, flags)); /* satisfied now */
    OK(cu.cuEventRecord(e, s));
    OK(cu.cuEventQuery(e));
    OK(cu.cuEventDestroy_v2(e));
}

static void test_wait_conditions(void)
{
    struct gated f = gated_new();
    struct gate g = f.g;
    CUstream s = f.s;
    check_condition(s, g, CU_STREAM_WAIT_VALUE_GEQ, 5, 4, 5);
    check_condition(s, g, CU_STREAM_WAIT_VALUE_GEQ, 0x10, 0xfffffff0u, 0x20); /* cyclic: wraps */
    check_condition(s, g, CU_STREAM_WAIT_VALUE_GEQ | CU_STREAM_WAIT_VALUE_FLUSH, 7, 6, 9);
    check_condition(s, g, CU_STREAM_WAIT_VALUE_EQ, 7, 8, 7);
    check_condition(s, g, CU_STREAM_WAIT_VALUE_AND, 0x6, 0x9, 0x4);
    check_condition(s, g, CU_STREAM_WAIT_VALUE_NOR, 0xfffffff0u, 0x0f, 0x07);
    /* 64-bit: the whole word counts. */
    uint64_t *wide = (uint64_t *)(void *)(g.word + 2);
    CUevent e;
    OK(cu.cuEventCreate(&e, 0));
    __atomic_store_n(wide, 1, __ATOMIC_RELEASE);
    OK(cu.cuStreamWaitValue64_v2(s, g.dptr + 8, 1ULL << 40, CU_STREAM_WAIT_VALUE_GEQ));
    OK(cu.cuEventRecord(e, s));
    CHECK_CU(cu.cuEventQuery(e), CUDA_ERROR_NOT_READY);
    __atomic_store_n(wide, 1ULL << 40, __ATOMIC_RELEASE);
    OK(cu.cuEventQuery(e));
    OK(cu.cuEventDestroy_v2(e));
    gated_free(f);
}

struct opener {
    struct gate g;
    _Atomic bool opened;
};

static void *open_later(void *arg)
{
    struct opener *o = arg;
    sleep_ms(50);
    atomic_store(&o->opened, true);
    gate_open(o->g, 1);
    return NULL;
}

/* Each blocking call returns only once another thread has opened the gate. */
static void test_blocking_calls_wait_for_the_gate(void)
{
    primary(1);
    CUmodule m;
    CUfunction spin = spin_function(&m);
    CUstream s;
    CUevent e;
    OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cu.cuEventCreate(&e, 0));
    for (int call = 0; call < 4; call++) {
        struct opener o = {.g = gate_new(), .opened = false};
        uint32_t out = 0;
        CUdeviceptr d;
        OK(cu.cuMemAlloc_v2(&d, 4));
        OK(cu.cuStreamWaitValue32_v2(s, o.g.dptr, 1, CU_STREAM_WAIT_VALUE_GEQ));
        OK(launch_spin(spin, 1000000ULL, 1, s));
        OK(cu.cuEventRecord(e, s));
        pthread_t t;
        CHECK(pthread_create(&t, NULL, open_later, &o) == 0);
        if (call == 0)
            OK(cu.cuStreamSynchronize(s));
        else if (call == 1)
            OK(cu.cuEventSynchronize(e));
        else if (call == 2)
            OK(cu.cuCtxSynchronize());
        else
            OK(cu.cuMemcpyDtoHAsync_v2(&out, d, 4, s)); /* to pageable memory: returns once done */
        CHECKF(atomic_load(&o.opened), "blocking call %d returned before the gate opened", call);
        pthread_join(t, NULL);
        OK(cu.cuStreamSynchronize(s));
        OK(cu.cuMemFree_v2(d));
        OK(cu.cuMemFreeHost(o.g.word));
    }
    OK(cu.cuEventDestroy_v2(e));
    OK(cu.cuStreamDestroy_v2(s));
    OK(cu.cuModuleUnload(m));
}

static void test_waits_chain_across_streams(void)
{
    primary(1);
    struct gate g = gate_new();
    CUstream a, b, c;
    CUevent ea, eb, ec;
    OK(cu.cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    OK(cu.cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
    OK(cu.cuStreamCreate(&c, CU_STREAM_DEFAULT));
    OK(cu.cuEventCreate(&ea, 0));
    OK(cu.cuEventCreate(&eb, 0));
    OK(cu.cuEventCreate(&ec, 0));
    OK(cu.cuStreamWaitValue32_v2(a, g.dptr, 1, CU_STREAM_WAIT_VALUE_GEQ));
    OK(cu.cuEventRecord(ea, a));
    OK(cu.cuStreamWaitEvent(b, ea, 0));
    OK(cu.cuEventRecord(eb, b));
    CHECK_CU(cu.cuEventQuery(eb), CUDA_ERROR_NOT_READY);
    CHECK_CU(cu.cuStreamQuery(b), CUDA_ERROR_NOT_READY);
    /* The legacy stream waits for a held blocking stream, not for others. */
    OK(cu.cuStreamWaitValue32_v2(c, g.dptr, 1, CU_STREAM_WAIT_VALUE_GEQ));
    OK(cu.cuEventRecord(ec, NULL));
    CHECK_CU(cu.cuEventQuery(ec), CUDA_ERROR_NOT_READY);
    gate_open(g, 1);
    OK(cu.cuStreamSynchronize(b));
    OK(cu.cuEventQuery(ea));
    OK(cu.cuEventQuery(eb));
    OK(cu.cuEventQuery(ec));
    /* A stream destroyed while held returns at once; its work still runs. */
    OK(cu.cuStreamWaitValue32_v2(a, g.dptr, 2, CU_STREAM_WAIT_VALUE_GEQ));
    OK(cu.cuEventRecord(ea, a));
    OK(cu.cuStreamDestroy_v2(a));
    CHECK_CU(cu.cuEventQuery(ea), CUDA_ERROR_NOT_READY);
    gate_open(g, 2);
    OK(cu.cuEventSynchronize(ea));
    OK(cu.cuEventDestroy_v2(ea));
    OK(cu.cuEventDestroy_v2(eb));
    OK(cu.cuEventDestroy_v2(ec));
    OK(cu.cuStreamDestroy_v2(b));
    OK(cu.cuStreamDestroy_v2(c));
    OK(cu.cuMemFreeHost(g.word));
}

static void test_writes_and_bad_memory_operations(void)
{
    struct gated f = gated_new();
    struct gate g = f.g;
    CUstream s = f.s;
    CUdeviceptr d;
    uint64_t out = 0;
    uint32_t pageable = 0;
    OK(cu.cuMemAlloc_v2(&d, 64));
    OK(cu.cuStreamWriteValue32_v2(s, g.dptr + 4, 7, CU_STREAM_WRITE_VALUE_DEFAULT));
    OK(cu.cuStreamSynchronize(s));
    CHECK(g.word[1] == 7);
    /* Behind a gate, a write waits its turn; into device memory too. */
    OK(cu.cuStreamWaitValue32(s, g.dptr, 1, CU_STREAM_WAIT_VALUE_GEQ));
    OK(cu.cuStreamWriteValue32(s, g.dptr + 4, 8, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER));
    OK(cu.cuStreamWriteValue64_v2(s, d + 8, 1ULL << 33, 0));
    CHECK(__atomic_load_n(&g.word[1], __ATOMIC_ACQUIRE) == 7);
    gate_open(g, 1);
    OK(cu.cuStreamSynchronize(s));
    CHECK(g.word[1] == 8);
    OK(cu.cuMemcpyDtoH_v2(&out, d + 8, 8));
    CHECK(out == 1ULL << 33);
    /* Memory the device cannot address, a misaligned word, unknown flags. */
    CUdeviceptr host = (CUdeviceptr)(uintptr_t)&pageable;
    CHECK_CU(cu.cuStreamWaitValue32_v2(s, host, 1, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cu.cuStreamWriteValue32_v2(s, host, 1, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cu.cuStreamWaitValue32_v2(s, g.dptr + 2, 1, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cu.cuStreamWaitValue64_v2(s, g.dptr + 4, 1, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cu.cuStreamWaitValue32_v2(s, g.dptr, 1, 0x10), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cu.cuStreamWriteValue32_v2(s, g.dptr, 1, 0x2), CUDA_ERROR_INVALID_VALUE);
    CHECK_CU(cu.cuStreamWaitValue32_v2(s, 0, 1, 0), CUDA_ERROR_INVALID_VALUE);
    /* A capturing stream is never gated. */
    CUgraph graph;
    OK(cu.cuStreamBeginCapture_v2(s, 0));
    CHECK_CU(cu.cuStreamWaitValue32_v2(s, g.dptr, 1, 0), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    OK(cu.cuStreamEndCapture(s, &graph));
    OK(cu.cuGraphDestroy(graph));
    OK(cu.cuMemFree_v2(d));
    gated_free(f);
}

/* An asynchronous copy behind a gate runs when the gate opens; a pageable
 * source is taken when the call returns, as the driver stages it. */
static void test_copies_wait_their_turn(void)
{
    struct gated f = gated_new();
    struct gate g = f.g;
    CUstream s = f.s;
    CUdeviceptr d;
    uint32_t pageable = 1, out = 0;
    OK(cu.cuMemAlloc_v2(&d, 16));
    OK(cu.cuMemsetD32_v2(d, 0, 4));
    OK(cu.cuStreamWaitValue32_v2(s, g.dptr, 1, CU_STREAM_WAIT_VALUE_GEQ));
    OK(cu.cuMemcpyHtoDAsync_v2(d, &pageable, 4, s));
    pageable = 2;
    OK(cu.cuMemcpyAsync(d + 4, d, 4, s));
    OK(cu.cuMemcpyDtoH_v2(&out, d + 4, 4)); /* a non-blocking stream does not hold the legacy one */
    CHECK(out == 0);
    gate_open(g, 1);
    OK(cu.cuStreamSynchronize(s));
    OK(cu.cuMemcpyDtoH_v2_ptds(&out, d + 4, 4));
    CHECK(out == 1);
    OK(cu.cuMemFree_v2(d));
    gated_free(f);
}

static void *sym(const char *name)
{
    return dlsym(g_lib, name);
}

static void check_resolves(const char *symbol, int version, cuuint64_t flags, const char *expected)
{
    void *pfn = NULL;
    CUdriverProcAddressQueryResult status = -1;
    CUresult r = cu.cuGetProcAddress_v2(symbol, &pfn, version, flags, &status);
    CHECKF(r == CUDA_SUCCESS && status == CU_GET_PROC_ADDRESS_SUCCESS && pfn == sym(expected),
           "cuGetProcAddress_v2(%s, %d, %llu) did not give %s (r=%d status=%d)", symbol, version,
           (unsigned long long)flags, expected, r, status);
}

/* name is X_vN: resolving X at 13000 must give X_vM with the highest M. */
static void check_newest(const char *name)
{
    const char *v = strstr(name, "_v");
    if (v == NULL || strstr(name, "_ptsz") != NULL)
        return;
    char base[128], best[160];
    snprintf(base, sizeof(base), "%.*s", (int)(v - name), name);
    snprintf(best, sizeof(best), "%s", name);
    for (int n = 2; n < 10; n++) {
        char candidate[160];
        snprintf(candidate, sizeof(candidate), "%s_v%d", base, n);
        if (sym(candidate) != NULL)
            snprintf(best, sizeof(best), "%s", candidate);
    }
    /* CUDA 12 maps cuGraphInstantiate onto cuGraphInstantiateWithFlags:
     * its own variants are the answer only before 12.0. */
    check_resolves(base, strcmp(base, "cuGraphInstantiate") == 0 ? 11999 : 13000, 0, best);
}

static void test_proc_address_picks_the_abi_of_the_version(void)
{
    const cuuint64_t PTSZ = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    check_resolves("cuMemAlloc", 3010, 0, "cuMemAlloc");
    check_resolves("cuMemAlloc", 12080, 0, "cuMemAlloc_v2");
    check_resolves("cuCtxCreate", 11030, 0, "cuCtxCreate_v2");
    check_resolves("cuCtxCreate", 11040, 0, "cuCtxCreate_v3");
    check_resolves("cuCtxCreate", 12040, 0, "cuCtxCreate_v3");
    check_resolves("cuCtxCreate", 12050, 0, "cuCtxCreate_v4");
    check_resolves("cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2");
    check_resolves("cuDeviceTotalMem", 3000, 0, "cuDeviceTotalMem");
    check_resolves("cuStreamBeginCapture", 10000, 0, "cuStreamBeginCapture");
    check_resolves("cuStreamBeginCapture", 10010, 0, "cuStreamBeginCapture_v2");
    check_resolves("cuStreamBeginCapture", 12080, PTSZ, "cuStreamBeginCapture_v2_ptsz");
    check_resolves("cuEventElapsedTime", 12070, 0, "cuEventElapsedTime");
    check_resolves("cuEventElapsedTime", 12080, 0, "cuEventElapsedTime_v2");
    check_resolves("cuLaunchKernel", 12080, PTSZ, "cuLaunchKernel_ptsz");
    check_resolves("cuLaunchKernel", 12080, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuLaunchKernel");
    check_resolves("cuMemAlloc", 12080, PTSZ, "cuMemAlloc_v2"); /* no _ptsz variant */
    check_resolves("cuGetProcAddress", 11030, 0, "cuGetProcAddress");
    check_resolves("cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2");
    check_resolves("cuGraphInstantiate", 10000, 0, "cuGraphInstantiate");
    check_resolves("cuGraphInstantiate", 11040, 0, "cuGraphInstantiate_v2");
    check_resolves("cuGraphInstantiate", 12000, 0, "cuGraphInstantiateWithFlags");
    check_resolves("cuStreamWaitValue32", 11060, 0, "cuStreamWaitValue32");
    check_resolves("cuStreamWaitValue32", 11070, 0, "cuStreamWaitValue32_v2");
    check_resolves("cuStreamWriteValue64", 13000, PTSZ, "cuStreamWriteValue64_v2_ptsz");
    check_resolves("cuStreamWaitEvent", 13000, PTSZ, "cuStreamWaitEvent_ptsz");
    check_resolves("cuMemcpyHtoD", 13000, PTSZ, "cuMemcpyHtoD_v2_ptds");
    check_resolves("cuMemcpyDtoHAsync", 13000, PTSZ, "cuMemcpyDtoHAsync_v2_ptsz");

    /* Every versioned export is reachable: at the newest version each base
     * name gives its highest variant (a missing version threshold fails). */
#define NEWEST(ret, name, params, args) check_newest(#name);
    CUDA_API_LIST(NEWEST)
#undef NEWEST

    void *pfn = (void *)1;
    CUdriverProcAddressQueryResult status = -1;
    CHECK_CU(cu.cuGetProcAddress_v2("cuNoSuchThing", &pfn, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);
    CHECK(status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND && pfn == NULL);
    CHECK_CU(cu.cuGetProcAddress_v2("cuMemAlloc_v2", &pfn, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);
    CHECK_CU(cu.cuGetProcAddress_v2("cuMemcpyHtoD", &pfn, 3000, 0, &status), CUDA_ERROR_NOT_FOUND);
    CHECK(status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    CHECK_CU(cu.cuGetProcAddress("cuMemAlloc", &pfn, 12000, 7), CUDA_ERROR_INVALID_VALUE);
    const void *table = NULL;
    CHECK_CU(cu.cuGetExportTable(&table, &(CUuuid){{0}}), CUDA_ERROR_NOT_SUPPORTED);
}

static void test_pools_hold_until_sync_or_trim(void)
{
    primary(0);
    CUstream s;
    CUmemoryPool pool;
    CUdeviceptr p, q;
    OK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cu.cuDeviceGetDefaultMemPool(&pool, 0));
    size_t base = used_now();
    OK(cu.cuMemAllocAsync(&p, 64 * MIB, s));
    CHECK(used_now() == base + 64 * MIB);
    OK(cu.cuMemFreeAsync(p, s));
    CHECK(used_now() == base + 64 * MIB); /* held by the pool */
    OK(cu.cuStreamSynchronize(s));
    CHECK(used_now() == base); /* threshold 0: given back at sync */

    cuuint64_t keep = 512 * MIB, reserved = 0;
    OK(cu.cuMemPoolSetAttribute(pool, 4 /* RELEASE_THRESHOLD */, &keep));
    OK(cu.cuMemAllocAsync(&p, 64 * MIB, s));
    OK(cu.cuMemFreeAsync(p, s));
    OK(cu.cuStreamSynchronize(s));
    CHECK(used_now() == base + 64 * MIB);
    OK(cu.cuMemAllocAsync(&q, 32 * MIB, s)); /* reuses the held block */
    CHECK(q == p && used_now() == base + 64 * MIB);
    OK(cu.cuMemFreeAsync(q, s));
    OK(cu.cuMemPoolGetAttribute(pool, 5 /* RESERVED_MEM_CURRENT */, &reserved));
    CHECK(reserved == 64 * MIB);
    OK(cu.cuMemPoolTrimTo(pool, 0));
    CHECK(used_now() == base);
    keep = 0;
    OK(cu.cuMemPoolSetAttribute(pool, 4, &keep));
    OK(cu.cuStreamDestroy_v2(s));
}

static void test_vmm_maps_charged_memory(void)
{
    primary(0);
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemAccessDesc access = {.location = prop.location, .flags = 3 /* READWRITE */};
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    size_t gran = 0;
    uint32_t word = 0;
    OK(cu.cuMemGetAllocationGranularity(&gran, &prop, 0));
    CHECK(gran == 2 * MIB);
    size_t base = used_now();
    CHECK_CU(cu.cuMemCreate(&h, gran + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    OK(cu.cuMemCreate(&h, 2 * gran, &prop, 0));
    CHECK(used_now() == base + 2 * gran);
    OK(cu.cuMemAddressReserve(&va, 4 * gran, 0, 0, 0));
    CHECK(va % gran == 0);
    OK(cu.cuMemMap(va + gran, 2 * gran, 0, h, 0));
    CHECK_CU(cu.cuMemMap(va + gran, 2 * gran, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
    OK(cu.cuMemSetAccess(va + gran, 2 * gran, &access, 1));
    OK(cu.cuMemsetD32_v2(va + gran + 4, 77, 1));
    OK(cu.cuMemcpyDtoH_v2(&word, va + gran + 4, 4));
    CHECK(word == 77);
    CHECK_CU(cu.cuMemsetD32_v2(va, 1, 1), CUDA_ERROR_INVALID_VALUE); /* reserved, not mapped */
    OK(cu.cuMemUnmap(va + gran, 2 * gran));
    OK(cu.cuMemRelease(h));
    CHECK(used_now() == base);
    OK(cu.cuMemAddressFree(va, 4 * gran));
}

static void test_arrays_are_charged(void)
{
    primary(0);
    CUarray a;
    CUmipmappedArray m;
    CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 1024, .Height = 1024, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    size_t base = used_now();
    OK(cu.cuArray3DCreate_v2(&a, &d));
    CHECK(used_now() == base + 16 * MIB);
    OK(cu.cuArrayDestroy(a));
    CHECK(used_now() == base);
    d.NumChannels = 1; /* levels of 4 MiB, 1 MiB, 256 KiB */
    OK(cu.cuMipmappedArrayCreate(&m, &d, 3));
    CHECK(used_now() == base + 4 * MIB + 1 * MIB + 256 * 1024);
    OK(cu.cuMipmappedArrayDestroy(m));
    d.NumChannels = 3;
    CHECK_CU(cu.cuArray3DCreate_v2(&a, &d), CUDA_ERROR_INVALID_VALUE);
}

/* Run fn in a child that starts CUDA afresh; returns its exit status. */
static pid_t spawn(int (*fn)(int fd), int fd)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0)
        _exit(fn(fd));
    return pid;
}

static int wait_status(pid_t pid)
{
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int ipc_child(int fd)
{
    CUipcMemHandle handle;
    CUdeviceptr p = 0;
    uint32_t word = 0;
    if (read(fd, &handle, sizeof(handle)) != (ssize_t)sizeof(handle) || cu.cuInit(0) != CUDA_SUCCESS)
        return 10;
    primary(0);
    size_t used = used_now();
    if (cu.cuIpcOpenMemHandle_v2(&p, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != CUDA_SUCCESS)
        return 11;
    if (used_now() != used)
        return 12; /* counted once, to the owner */
    if (cu.cuMemcpyDtoH_v2(&word, p + 4, 4) != CUDA_SUCCESS || word != 0xabcd)
        return 13;
    word = 0x1234;
    if (cu.cuMemcpyHtoD_v2(p + 8, &word, 4) != CUDA_SUCCESS || cu.cuIpcCloseMemHandle(p) != CUDA_SUCCESS)
        return 14;
    return failures == 0 ? 0 : 15;
}

static void test_ipc_shares_memory_between_processes(void)
{
    primary(0);
    CUdeviceptr p;
    CUipcMemHandle handle;
    uint32_t words[4] = {0, 0xabcd, 0, 0};
    int fds[2];
    OK(cu.cuMemAlloc_v2(&p, 4 * MIB));
    OK(cu.cuMemcpyHtoD_v2(p, words, sizeof(words)));
    OK(cu.cuIpcGetMemHandle(&handle, p));
    uint32_t after = 0;
    OK(cu.cuMemcpyDtoH_v2(&after, p + 4, 4)); /* exporting kept the content */
    CHECK(after == 0xabcd);
    CHECK(pipe(fds) == 0);
    pid_t child = spawn(ipc_child, fds[0]);
    CHECK(write(fds[1], &handle, sizeof(handle)) == (ssize_t)sizeof(handle));
    int status = wait_status(child);
    CHECK(status == 0);
    if (status != 0)
        fprintf(stderr, "ipc child exit %d\n", status);
    OK(cu.cuMemcpyDtoH_v2(&after, p + 8, 4));
    CHECK(after == 0x1234);
    CHECK_CU(cu.cuIpcOpenMemHandle_v2(&(CUdeviceptr){0}, handle, 0), CUDA_ERROR_INVALID_CONTEXT);
    close(fds[0]);
    close(fds[1]);
    OK(cu.cuMemFree_v2(p));
}

static int hog_child(int fd)
{
    CUdeviceptr p;
    if (cu.cuInit(0) != CUDA_SUCCESS)
        return 10;
    primary(0);
    if (cu.cuMemAlloc_v2(&p, 256 * MIB) != CUDA_SUCCESS)
        return 11;
    if (write(fd, "r", 1) != 1)
        return 12;
    for (;;)
        pause();
}

static void test_killed_process_memory_comes_back(void)
{
    primary(0);
    size_t base = used_now();
    int fds[2];
    char ready;
    CHECK(pipe(fds) == 0);
    pid_t child = spawn(hog_child, fds[1]);
    CHECK(read(fds[0], &ready, 1) == 1);
    CHECK(used_now() == base + CTX_OVERHEAD + 256 * MIB);
    kill(child, SIGKILL);
    /* Like a driver, memory goes with the process: poll until it shows. */
    double deadline = now_ms() + 10000;
    while (used_now() != base && now_ms() < deadline)
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    CHECK(used_now() == base);
    wait_status(child);
    close(fds[0]);
    close(fds[1]);
}

static int visible_child(int expect_count)
{
    int count = -1;
    CUresult r = cu.cuInit(0);
    if (expect_count == 0)
        return r == CUDA_ERROR_NO_DEVICE ? 0 : 20;
    if (r != CUDA_SUCCESS || cu.cuDeviceGetCount(&count) != CUDA_SUCCESS || count != expect_count)
        return 21;
    char bus[32];
    if (cu.cuDeviceGetPCIBusId(bus, sizeof(bus), 0) != CUDA_SUCCESS)
        return 22;
    return strcmp(bus, "0000:02:00.0") == 0 ? 0 : 23; /* ordinal 0 is device 1 */
}

static void check_visible(const char *value, int expect_count)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("CUDA_VISIBLE_DEVICES", value, 1);
        _exit(visible_child(expect_count));
    }
    int status = wait_status(pid);
    CHECKF(status == 0, "CUDA_VISIBLE_DEVICES='%s': child exit %d", value, status);
}

static void test_visible_devices(void)
{
    check_visible("1", 1);
    check_visible("1,7,0", 1); /* the list stops at the first bad entry */
    check_visible("GPU-5117a000-0000-4000-8000-000000000001", 1);
    check_visible("GPU-5117a000-0000-4000-8000-000000000001,0", 2);
    check_visible("", 0);
    check_visible("-1", 0);
}

int main(void)
{
    const char *build = getenv("VGPU_BUILD");
    char path[4096], dir[] = "/tmp/vgpu-sim-test-XXXXXX", state[4200];
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(state, sizeof(state), "%s/state", dir);
    setenv("VGPU_SIM_STATE", state, 1);
    setenv("VGPU_SIM_MEMORY", "1g", 1);
    setenv("VGPU_SIM_SMS", "4", 1);
    setenv("VGPU_SIM_CTX_OVERHEAD", "16m", 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    snprintf(path, sizeof(path), "%s/sim/libcuda.so.1", build != NULL ? build : "build");
    g_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (g_lib == NULL) {
        fprintf(stderr, "cannot load %s: %s\n", path, dlerror());
        return 1;
    }
    test_every_entry_point_is_exported();
    if (failures == 0) {
        test_devices_follow_config();
        test_capacity_is_enforced_and_accounted();
        test_context_variants();
        test_copies_preserve_content();
        test_pointer_queries();
        test_modules_resolve_ptx_entries();
        test_launches_take_their_time();
        test_capture_records_instead_of_running();
        test_gate_holds_work_until_the_word_is_written();
        test_gated_events_time_the_kernels_not_the_gaps();
        test_a_gated_pair_does_not_count_the_work_queued_before_it();
        test_wait_conditions();
        test_blocking_calls_wait_for_the_gate();
        test_waits_chain_across_streams();
        test_writes_and_bad_memory_operations();
        test_copies_wait_their_turn();
        test_proc_address_picks_the_abi_of_the_version();
        test_pools_hold_until_sync_or_trim();
        test_vmm_maps_charged_memory();
        test_arrays_are_charged();
        test_ipc_shares_memory_between_processes();
        test_killed_process_memory_comes_back();
        test_visible_devices();
    }
    unlink(state);
    rmdir(dir);
    return check_report("test_sim_cuda");
}
