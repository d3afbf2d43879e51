/*
 * vgpu-burn - a GPU workload that needs no CUDA toolkit: the same binary
 * runs on a real GPU (driver API, hand-written PTX) and on the simulator.
 *
 * It resolves the driver the way the CUDA runtime does (dlopen
 * "libcuda.so.1", then cuGetProcAddress_v2 at CUDA 12.8, falling back to
 * dlsym), optionally allocates device memory through one allocation path,
 * then keeps the GPU busy with vgpu_spin kernels at a chosen duty cycle.
 * Run `vgpu-burn --help` for the options.
 *
 * Two figures of its use of the GPU, in this order of trust:
 *  - work: kernels x kernel time / wall time, the GPU time its kernels took
 *    (a spin kernel lasts --kernel-us per wave of --blocks over the SMs). This
 *    is the figure to compare with a vGPU's share.
 *  - event span: the time between the events around each batch / wall time.
 *    Under a compute limit it also counts the waits for the vGPU's turn (the
 *    hook holds launches back inside the batch), and with other processes on
 *    the GPU their kernels: a paced burn at 30 % spans about 100 %.
 *
 * --trace FILE records the work as it completes, for measuring compute
 * shares in short windows independently of NVML and of the hook: each time
 * a worker thread sees a batch of kernels complete (its cuEventSynchronize
 * returned), it appends "<CLOCK_REALTIME s.us> <pid> <kernels>\n" to FILE
 * (graph launches count every captured kernel). Every process opens FILE
 * itself with O_APPEND and writes each line with one write(), so the lines
 * of all threads and processes never interleave. A failed write is reported
 * once per process and ends tracing, not the run.
 *
 * --device 0,1 spreads the stream threads over several devices (thread i
 * on the i-th device of the list, round robin), each with its primary
 * context: one process using several GPUs. --lockstep IN,OUT makes the
 * process wait for a peer after every batch, as ranks of a collective do:
 * it writes one byte to descriptor OUT, then reads one from IN; once the
 * peer is gone (end of file) it runs on alone.
 *
 * Exit status: 0 success, 1 CUDA error, 2 bad arguments, 3 an --alloc was
 * not fully satisfied (unless --alloc-best-effort).
 */
#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"

#define EXIT_CUDA 1
#define EXIT_USAGE 2
#define EXIT_ALLOC 3

#define RUNTIME_CUDA_VERSION 12080 /* the ABI this tool was written against */
#define SPIN_THREADS 64
#define FILL_THREADS 256
#define MAX_STREAMS 64
#define MAX_PROCS 256
#define MAX_DEVICES 16
#define ARRAY_ROW_BYTES 65536u /* 4096 texels of 4 x u32 */
#define CU_MEM_ALLOC_GRANULARITY_RECOMMENDED 1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 3

/* ------------------------------------------------------------------ */
/* The kernels: PTX 7.0 for sm_52 and up, JIT-compiled by the driver. */

static const char PTX[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    "\n"
    "// vgpu_spin(u64 ns, u64 *out): every thread spins on %globaltimer for ns;\n"
    "// thread 0 of block 0 stores the time it measured to *out if out != 0.\n"
    ".visible .entry vgpu_spin(\n"
    "    .param .u64 vgpu_spin_ns,\n"
    "    .param .u64 vgpu_spin_out\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<3>;\n"
    "    .reg .b32 %r<4>;\n"
    "    .reg .b64 %rd<7>;\n"
    "    ld.param.u64 %rd1, [vgpu_spin_ns];\n"
    "    ld.param.u64 %rd2, [vgpu_spin_out];\n"
    "    mov.u64 %rd3, %globaltimer;\n"
    "SPIN_LOOP:\n"
    "    mov.u64 %rd4, %globaltimer;\n"
    "    sub.s64 %rd5, %rd4, %rd3;\n"
    "    setp.lt.u64 %p1, %rd5, %rd1;\n"
    "    @%p1 bra SPIN_LOOP;\n"
    "    mov.u32 %r1, %tid.x;\n"
    "    mov.u32 %r2, %ctaid.x;\n"
    "    or.b32 %r3, %r1, %r2;\n"
    "    setp.ne.u32 %p2, %r3, 0;\n"
    "    @%p2 bra SPIN_DONE;\n"
    "    setp.eq.u64 %p2, %rd2, 0;\n"
    "    @%p2 bra SPIN_DONE;\n"
    "    cvta.to.global.u64 %rd6, %rd2;\n"
    "    st.global.u64 [%rd6], %rd5;\n"
    "SPIN_DONE:\n"
    "    ret;\n"
    "}\n"
    "\n"
    "// vgpu_fill(u32 *p, u32 value, u64 n): p[i] = value for i < n, grid-stride.\n"
    ".visible .entry vgpu_fill(\n"
    "    .param .u64 vgpu_fill_p,\n"
    "    .param .u32 vgpu_fill_value,\n"
    "    .param .u64 vgpu_fill_n\n"
    ")\n"
    "{\n"
    "    .reg .pred %p<2>;\n"
    "    .reg .b32 %r<6>;\n"
    "    .reg .b64 %rd<8>;\n"
    "    ld.param.u64 %rd1, [vgpu_fill_p];\n"
    "    ld.param.u32 %r1, [vgpu_fill_value];\n"
    "    ld.param.u64 %rd2, [vgpu_fill_n];\n"
    "    cvta.to.global.u64 %rd3, %rd1;\n"
    "    mov.u32 %r2, %ntid.x;\n"
    "    mov.u32 %r3, %ctaid.x;\n"
    "    mov.u32 %r4, %tid.x;\n"
    "    mad.lo.u32 %r5, %r3, %r2, %r4;\n"
    "    cvt.u64.u32 %rd4, %r5;\n"
    "    mov.u32 %r3, %nctaid.x;\n"
    "    mul.wide.u32 %rd5, %r3, %r2;\n"
    "FILL_LOOP:\n"
    "    setp.ge.u64 %p1, %rd4, %rd2;\n"
    "    @%p1 bra FILL_DONE;\n"
    "    shl.b64 %rd6, %rd4, 2;\n"
    "    add.s64 %rd7, %rd3, %rd6;\n"
    "    st.global.u32 [%rd7], %r1;\n"
    "    add.s64 %rd4, %rd4, %rd5;\n"
    "    bra.uni FILL_LOOP;\n"
    "FILL_DONE:\n"
    "    ret;\n"
    "}\n";

/* ------------------------------------------------------------------ */
/* The driver, resolved like the CUDA runtime resolves it.             */

/* field, exported (versioned) name for dlsym, base name for cuGetProcAddress */
#define BURN_DRIVER(X)                                                   \
    X(cuInit, cuInit, cuInit)                                            \
    X(cuGetErrorName, cuGetErrorName, cuGetErrorName)                    \
    X(cuDeviceGet, cuDeviceGet, cuDeviceGet)                             \
    X(cuDeviceGetAttribute, cuDeviceGetAttribute, cuDeviceGetAttribute)  \
    X(cuDeviceTotalMem, cuDeviceTotalMem_v2, cuDeviceTotalMem)           \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain) \
    X(cuCtxSetCurrent, cuCtxSetCurrent, cuCtxSetCurrent)                 \
    X(cuCtxSynchronize, cuCtxSynchronize, cuCtxSynchronize)              \
    X(cuMemGetInfo, cuMemGetInfo_v2, cuMemGetInfo)                       \
    X(cuMemAlloc, cuMemAlloc_v2, cuMemAlloc)                             \
    X(cuMemAllocPitch, cuMemAllocPitch_v2, cuMemAllocPitch)              \
    X(cuMemAllocManaged, cuMemAllocManaged, cuMemAllocManaged)           \
    X(cuMemFree, cuMemFree_v2, cuMemFree)                                \
    X(cuMemAllocAsync, cuMemAllocAsync, cuMemAllocAsync)                 \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync) \
    X(cuMemFreeAsync, cuMemFreeAsync, cuMemFreeAsync)                    \
    X(cuMemPoolCreate, cuMemPoolCreate, cuMemPoolCreate)                 \
    X(cuMemPoolDestroy, cuMemPoolDestroy, cuMemPoolDestroy)              \
    X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, cuMemGetAllocationGranularity) \
    X(cuMemCreate, cuMemCreate, cuMemCreate)                             \
    X(cuMemRelease, cuMemRelease, cuMemRelease)                          \
    X(cuMemAddressReserve, cuMemAddressReserve, cuMemAddressReserve)     \
    X(cuMemAddressFree, cuMemAddressFree, cuMemAddressFree)              \
    X(cuMemMap, cuMemMap, cuMemMap)                                      \
    X(cuMemUnmap, cuMemUnmap, cuMemUnmap)                                \
    X(cuMemSetAccess, cuMemSetAccess, cuMemSetAccess)                    \
    X(cuArray3DCreate, cuArray3DCreate_v2, cuArray3DCreate)              \
    X(cuArrayDestroy, cuArrayDestroy, cuArrayDestroy)                    \
    X(cuMemcpyDtoH, cuMemcpyDtoH_v2, cuMemcpyDtoH)                       \
    X(cuModuleLoadData, cuModuleLoadData, cuModuleLoadData)              \
    X(cuModuleGetFunction, cuModuleGetFunction, cuModuleGetFunction)     \
    X(cuLaunchKernel, cuLaunchKernel, cuLaunchKernel)                    \
    X(cuStreamCreate, cuStreamCreate, cuStreamCreate)                    \
    X(cuStreamDestroy, cuStreamDestroy_v2, cuStreamDestroy)              \
    X(cuStreamSynchronize, cuStreamSynchronize, cuStreamSynchronize)     \
    X(cuEventCreate, cuEventCreate, cuEventCreate)                       \
    X(cuEventDestroy, cuEventDestroy_v2, cuEventDestroy)                 \
    X(cuEventRecord, cuEventRecord, cuEventRecord)                       \
    X(cuEventSynchronize, cuEventSynchronize, cuEventSynchronize)        \
    X(cuEventElapsedTime, cuEventElapsedTime, cuEventElapsedTime)        \
    X(cuStreamBeginCapture, cuStreamBeginCapture_v2, cuStreamBeginCapture) \
    X(cuStreamEndCapture, cuStreamEndCapture, cuStreamEndCapture)        \
    X(cuGraphInstantiate, cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags) \
    X(cuGraphLaunch, cuGraphLaunch, cuGraphLaunch)                       \
    X(cuGraphExecDestroy, cuGraphExecDestroy, cuGraphExecDestroy)        \
    X(cuGraphDestroy, cuGraphDestroy, cuGraphDestroy)

#define DRIVER_FIELD(field, exported, base) __typeof__(exported) *field;
static struct {
    BURN_DRIVER(DRIVER_FIELD)
} cu;
#undef DRIVER_FIELD

enum resolve_mode { RESOLVE_PROCADDR, RESOLVE_DLSYM };

static const char *error_name(CUresult r)
{
    const char *name = NULL;
    if (cu.cuGetErrorName == NULL || cu.cuGetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
        return "CUDA_ERROR_UNRECOGNIZED";
    return name;
}

static int load_driver(enum resolve_mode mode)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == NULL) {
        fprintf(stderr, "vgpu-burn: cannot load libcuda.so.1: %s\n", dlerror());
        return -1;
    }
    __typeof__(cuGetProcAddress_v2) *get_proc = NULL;
    if (mode == RESOLVE_PROCADDR && (get_proc = (__typeof__(get_proc))dlsym(lib, "cuGetProcAddress_v2")) == NULL) {
        fprintf(stderr, "vgpu-burn: libcuda.so.1 has no cuGetProcAddress_v2\n");
        return -1;
    }
#define RESOLVE(field, exported, base)                                                         \
    {                                                                                          \
        void *p = NULL;                                                                        \
        CUdriverProcAddressQueryResult status;                                                 \
        if (get_proc == NULL || get_proc(#base, &p, RUNTIME_CUDA_VERSION, CU_GET_PROC_ADDRESS_DEFAULT, \
                                         &status) != CUDA_SUCCESS)                             \
            p = dlsym(lib, #exported);                                                         \
        if (p == NULL) {                                                                       \
            fprintf(stderr, "vgpu-burn: libcuda.so.1 lacks %s\n", #exported);                  \
            return -1;                                                                         \
        }                                                                                      \
        cu.field = (__typeof__(cu.field))p;                                                    \
    }
    BURN_DRIVER(RESOLVE)
#undef RESOLVE
    return 0;
}

/* ------------------------------------------------------------------ */
/* Options.                                                             */

enum alloc_api { API_ALLOC, API_PITCH, API_MANAGED, API_ASYNC, API_POOL, API_VMM, API_ARRAY };
static const char *const ALLOC_APIS[] = {"alloc", "pitch", "managed", "async", "pool", "vmm", "array"};

struct options {
    int devices[MAX_DEVICES]; /* --device: ordinals, stream threads spread over them */
    unsigned device_count;
    int lockstep_in, lockstep_out; /* -1: no --lockstep */
    double seconds;
    uint64_t kernel_ns;
    uint64_t grow_ns;     /* --grow-kernel-us: 0, or the kernel time from --grow-after on */
    double grow_after;    /* seconds */
    double grow_cycle;    /* --grow-cycle: 0, or grown this long, then not as long, over and over */
    uint64_t gap_ns; /* --gap-us: CPU time between launches */
    uint64_t stall_ns;    /* --stall-us: a sleep after every --stall-every-th launch */
    unsigned stall_every; /* 0: never */
    unsigned blocks; /* 0: the device's SM count */
    double duty;
    unsigned streams, procs, sync, graph;
    uint64_t alloc, chunk; /* chunk 0: one piece */
    enum alloc_api alloc_api;
    bool hold, verify, json, meminfo, alloc_best_effort;
    enum resolve_mode resolve;
    const char *trace; /* NULL: no --trace */
};

static void usage(FILE *out)
{
    fputs("usage: vgpu-burn [options]\n"
          "Keep a GPU busy with spin kernels; optionally allocate device memory first.\n"
          "  --device N[,N...]     CUDA device ordinal(s) (default 0); several: stream threads\n"
          "                        spread over them, memory and --meminfo on the first\n"
          "  --lockstep IN,OUT     after every batch write a byte to fd OUT and wait for one\n"
          "                        on fd IN (a peer's step); alone again once IN is closed\n"
          "  --seconds S           how long to run kernels (default 5; 0: none)\n"
          "  --kernel-us US        duration of one kernel wave in microseconds (default 1000)\n"
          "  --blocks N            blocks per kernel (default: the SM count, one wave)\n"
          "  --duty F              fraction of wall time to keep the GPU busy, 0<F<=1 (default 1)\n"
          "  --gap-us US           keep the CPU busy this long after each launch: launch-bound\n"
          "                        work, like eager inference (default 0)\n"
          "  --stall-us US         sleep this long after every --stall-every-th launch: a\n"
          "                        launcher preempted or paused in the middle of its work\n"
          "  --stall-every N       (default 0: never)\n"
          "  --grow-kernel-us US   from --grow-after on, kernels of US microseconds (a decoder\n"
          "                        that starts a long prefill)\n"
          "  --grow-after S        seconds into the run (default: never)\n"
          "  --grow-cycle S        from --grow-after on, grown for S seconds, then back for S,\n"
          "                        over and over (a tenant whose cost goes stale on purpose)\n"
          "  --streams N           threads, one stream each (default 1)\n"
          "  --procs N             fork N processes, each with its own context (default 1)\n"
          "  --sync N              synchronise every N launches (default 1)\n"
          "  --graph N             capture N kernels into a graph, launch the graph\n"
          "  --alloc SIZE          allocate SIZE bytes (k/m/g/t suffixes) before running\n"
          "  --chunk SIZE          ... in pieces of SIZE (default: one piece)\n"
          "  --alloc-api API       alloc|pitch|managed|async|pool|vmm|array (default alloc)\n"
          "  --alloc-best-effort   an --alloc shortfall is not an error (exit 0, not 3)\n"
          "  --hold                keep the memory until the run ends (default: free before kernels)\n"
          "  --verify              fill the memory with a kernel and read it back\n"
          "  --meminfo             print cuMemGetInfo and cuDeviceTotalMem, then exit\n"
          "  --json                one JSON object per process on stdout, then a summary\n"
          "  --resolve MODE        procaddr (default, like the CUDA runtime) or dlsym\n"
          "  --trace FILE          append '<realtime s.us> <pid> <kernels>' to FILE each time a\n"
          "                        batch of kernels completes (every thread of every process)\n"
          "Reports work: the share of the GPU its kernels took (kernels x kernel time / wall),\n"
          "the figure to compare with a vGPU's share; the event span beside it also counts\n"
          "the waits for the vGPU's turn.\n"
          "Exit status: 0 ok, 1 CUDA error, 2 bad arguments, 3 --alloc not satisfied.\n",
          out);
}

__attribute__((format(printf, 1, 2))) static int bad_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("vgpu-burn: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs(" (see --help)\n", stderr);
    va_end(ap);
    return -1;
}

static int parse_uint(const char *opt, const char *text, unsigned min, unsigned max, unsigned *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long v = strtoul(text, &end, 10);
    if (!isdigit((unsigned char)text[0]) || *end != '\0' || errno != 0 || v < min || v > max)
        return bad_usage("--%s '%s': expected an integer from %u to %u", opt, text, min, max);
    *out = (unsigned)v;
    return 0;
}

/* "N[,N...]": device ordinals, none repeated. */
static int parse_devices(const char *text, struct options *o)
{
    o->device_count = 0;
    for (const char *p = text;; p++) {
        char *end = NULL;
        errno = 0;
        unsigned long v = strtoul(p, &end, 10);
        if (!isdigit((unsigned char)*p) || errno != 0 || v > 1023 || (*end != ',' && *end != '\0') ||
            o->device_count == MAX_DEVICES)
            return bad_usage("--device '%s': expected up to %d ordinals 0-1023, comma separated", text, MAX_DEVICES);
        for (unsigned i = 0; i < o->device_count; i++)
            if (o->devices[i] == (int)v)
                return bad_usage("--device '%s': %lu is named twice", text, v);
        o->devices[o->device_count++] = (int)v;
        if (*end == '\0')
            return 0;
        p = end;
    }
}

/* "IN,OUT": two open descriptors. */
static int parse_lockstep(const char *text, struct options *o)
{
    unsigned in = 0, out = 0;
    char extra;
    if (sscanf(text, "%u,%u%c", &in, &out, &extra) != 2 || fcntl((int)in, F_GETFD) < 0 ||
        fcntl((int)out, F_GETFD) < 0)
        return bad_usage("--lockstep '%s': expected IN,OUT, two open file descriptors", text);
    o->lockstep_in = (int)in;
    o->lockstep_out = (int)out;
    return 0;
}

static int parse_double(const char *opt, const char *text, double min, double max, bool min_open, double *out)
{
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || errno != 0 || !isfinite(v) || v > max || v < min || (min_open && v == min))
        return bad_usage("--%s '%s': expected a number %s %g and <= %g", opt, text, min_open ? ">" : ">=", min, max);
    *out = v;
    return 0;
}

static int parse_size(const char *opt, const char *text, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    unsigned shift = 0;
    if (isdigit((unsigned char)text[0]) && errno == 0) {
        switch (tolower((unsigned char)*end)) {
        case 'k': shift = 10; end++; break;
        case 'm': shift = 20; end++; break;
        case 'g': shift = 30; end++; break;
        case 't': shift = 40; end++; break;
        default: break;
        }
    }
    if (!isdigit((unsigned char)text[0]) || errno != 0 || *end != '\0' || v == 0 || v > (UINT64_MAX >> shift))
        return bad_usage("--%s '%s': expected a size > 0 in bytes, optionally with k/m/g/t", opt, text);
    *out = (uint64_t)v << shift;
    return 0;
}

/* ------------------------------------------------------------------ */
/* --trace: one line per completed batch.                               */

struct trace {
    const char *path;
    int fd;             /* -1: not tracing */
    int pid;
    atomic_bool failed; /* a write failed: reported once, no more lines */
};

static int trace_open_fd(const char *path)
{
    return open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
}

/* Checked before any process starts, so that a bad path is a usage error
 * rather than a failure in every forked process. */
static bool trace_can_open(const char *path)
{
    int fd = trace_open_fd(path);
    if (fd < 0)
        return false;
    close(fd);
    return true;
}

static void trace_fail(struct trace *t, const char *what)
{
    if (!atomic_exchange(&t->failed, true))
        fprintf(stderr, "vgpu-burn: pid %d: --trace '%s': %s; tracing stops, the run goes on\n", t->pid, t->path,
                what);
}

/* Opened by each process itself (after the fork): path NULL: no tracing. */
static void trace_open(struct trace *t, const char *path)
{
    t->path = path;
    t->pid = (int)getpid();
    t->fd = path != NULL ? trace_open_fd(path) : -1;
    atomic_init(&t->failed, false);
    if (path != NULL && t->fd < 0)
        trace_fail(t, strerror(errno));
}

static void trace_close(struct trace *t)
{
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
}

/* One line, one write(): well under PIPE_BUF, so appends from concurrent
 * threads and processes land whole. Realtime, because the readers stamp
 * their own events with time.time(). */
static void trace_batch(struct trace *t, uint64_t kernels)
{
    if (t->fd < 0 || atomic_load_explicit(&t->failed, memory_order_relaxed))
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char line[80];
    int len = snprintf(line, sizeof(line), "%lld.%06ld %d %" PRIu64 "\n", (long long)ts.tv_sec, ts.tv_nsec / 1000,
                       t->pid, kernels);
    ssize_t n = write(t->fd, line, (size_t)len);
    if (n < 0)
        trace_fail(t, strerror(errno));
    else if (n != len)
        trace_fail(t, "short write");
}

/* 0 on success, 1 after --help, -1 on a bad argument. */
static int parse_options(int argc, char **argv, struct options *o)
{
    /* OPT_, not O_: fcntl.h owns O_SYNC and friends. */
    enum { OPT_DEVICE = 256, OPT_SECONDS, OPT_KERNEL_US, OPT_BLOCKS, OPT_DUTY, OPT_GAP_US, OPT_STREAMS, OPT_PROCS, OPT_SYNC,
           OPT_GRAPH, OPT_ALLOC, OPT_CHUNK, OPT_ALLOC_API, OPT_BEST_EFFORT, OPT_HOLD, OPT_VERIFY, OPT_MEMINFO,
           OPT_JSON, OPT_RESOLVE, OPT_TRACE, OPT_LOCKSTEP, OPT_GROW_KERNEL_US, OPT_GROW_AFTER, OPT_GROW_CYCLE, OPT_STALL_US, OPT_STALL_EVERY, OPT_HELP };
    static const struct option LONG[] = {
        {"device", required_argument, NULL, OPT_DEVICE},       {"seconds", required_argument, NULL, OPT_SECONDS},
        {"kernel-us", required_argument, NULL, OPT_KERNEL_US}, {"blocks", required_argument, NULL, OPT_BLOCKS},
        {"duty", required_argument, NULL, OPT_DUTY},           {"streams", required_argument, NULL, OPT_STREAMS},
        {"gap-us", required_argument, NULL, OPT_GAP_US},
        {"stall-us", required_argument, NULL, OPT_STALL_US},
        {"stall-every", required_argument, NULL, OPT_STALL_EVERY},
        {"grow-kernel-us", required_argument, NULL, OPT_GROW_KERNEL_US},
        {"grow-after", required_argument, NULL, OPT_GROW_AFTER},
        {"grow-cycle", required_argument, NULL, OPT_GROW_CYCLE},
        {"procs", required_argument, NULL, OPT_PROCS},         {"sync", required_argument, NULL, OPT_SYNC},
        {"graph", required_argument, NULL, OPT_GRAPH},         {"alloc", required_argument, NULL, OPT_ALLOC},
        {"chunk", required_argument, NULL, OPT_CHUNK},         {"alloc-api", required_argument, NULL, OPT_ALLOC_API},
        {"alloc-best-effort", no_argument, NULL, OPT_BEST_EFFORT},
        {"hold", no_argument, NULL, OPT_HOLD},                 {"verify", no_argument, NULL, OPT_VERIFY},
        {"meminfo", no_argument, NULL, OPT_MEMINFO},           {"json", no_argument, NULL, OPT_JSON},
        {"resolve", required_argument, NULL, OPT_RESOLVE},     {"help", no_argument, NULL, OPT_HELP},
        {"trace", required_argument, NULL, OPT_TRACE},         {"lockstep", required_argument, NULL, OPT_LOCKSTEP},
        {NULL, 0, NULL, 0},
    };
    *o = (struct options){.seconds = 5, .kernel_ns = 1000000, .duty = 1, .streams = 1, .procs = 1, .sync = 1,
                          .device_count = 1, .lockstep_in = -1, .lockstep_out = -1};
    bool streams_given = false;
    double d = 0;
    opterr = 0;
    for (int c; (c = getopt_long(argc, argv, "", LONG, NULL)) != -1;) {
        int r = 0;
        switch (c) {
        case OPT_DEVICE: r = parse_devices(optarg, o); break;
        case OPT_SECONDS: r = parse_double("seconds", optarg, 0, 86400, false, &o->seconds); break;
        case OPT_KERNEL_US:
            r = parse_double("kernel-us", optarg, 0, 60e6, true, &d);
            o->kernel_ns = (uint64_t)(d * 1000);
            break;
        case OPT_BLOCKS: r = parse_uint("blocks", optarg, 1, 1u << 30, &o->blocks); break;
        case OPT_DUTY: r = parse_double("duty", optarg, 0, 1, true, &o->duty); break;
        case OPT_GAP_US:
            r = parse_double("gap-us", optarg, 0, 1e6, false, &d);
            o->gap_ns = (uint64_t)(d * 1000);
            break;
        case OPT_STALL_US:
            r = parse_double("stall-us", optarg, 0, 1e6, false, &d);
            o->stall_ns = (uint64_t)(d * 1000);
            break;
        case OPT_STALL_EVERY: r = parse_uint("stall-every", optarg, 0, 1u << 30, &o->stall_every); break;
        case OPT_GROW_KERNEL_US:
            r = parse_double("grow-kernel-us", optarg, 0, 60e6, true, &d);
            o->grow_ns = (uint64_t)(d * 1000);
            break;
        case OPT_GROW_AFTER: r = parse_double("grow-after", optarg, 0, 86400, false, &o->grow_after); break;
        case OPT_GROW_CYCLE: r = parse_double("grow-cycle", optarg, 0, 86400, false, &o->grow_cycle); break;
        case OPT_STREAMS:
            r = parse_uint("streams", optarg, 1, MAX_STREAMS, &o->streams);
            streams_given = true;
            break;
        case OPT_PROCS: r = parse_uint("procs", optarg, 1, MAX_PROCS, &o->procs); break;
        case OPT_SYNC: r = parse_uint("sync", optarg, 1, 1000000, &o->sync); break;
        case OPT_GRAPH: r = parse_uint("graph", optarg, 1, 100000, &o->graph); break;
        case OPT_ALLOC: r = parse_size("alloc", optarg, &o->alloc); break;
        case OPT_CHUNK: r = parse_size("chunk", optarg, &o->chunk); break;
        case OPT_ALLOC_API:
            r = -1;
            for (unsigned i = 0; i < sizeof(ALLOC_APIS) / sizeof(ALLOC_APIS[0]); i++)
                if (strcmp(optarg, ALLOC_APIS[i]) == 0)
                    o->alloc_api = (enum alloc_api)i, r = 0;
            if (r != 0)
                r = bad_usage("--alloc-api '%s': expected alloc, pitch, managed, async, pool, vmm or array", optarg);
            break;
        case OPT_BEST_EFFORT: o->alloc_best_effort = true; break;
        case OPT_HOLD: o->hold = true; break;
        case OPT_VERIFY: o->verify = true; break;
        case OPT_MEMINFO: o->meminfo = true; break;
        case OPT_JSON: o->json = true; break;
        case OPT_RESOLVE:
            if (strcmp(optarg, "procaddr") == 0)
                o->resolve = RESOLVE_PROCADDR;
            else if (strcmp(optarg, "dlsym") == 0)
                o->resolve = RESOLVE_DLSYM;
            else
                r = bad_usage("--resolve '%s': expected procaddr or dlsym", optarg);
            break;
        case OPT_TRACE: o->trace = optarg; break;
        case OPT_LOCKSTEP: r = parse_lockstep(optarg, o); break;
        case OPT_HELP: usage(stdout); return 1;
        case ':': return bad_usage("option %s needs a value", argv[optind - 1]);
        default: return bad_usage("unknown option '%s'", argv[optind - 1]);
        }
        if (r != 0)
            return -1;
    }
    if (optind < argc)
        return bad_usage("unexpected argument '%s'", argv[optind]);
    if (!streams_given)
        o->streams = o->device_count;
    if (o->streams < o->device_count)
        return bad_usage("--streams %u: fewer threads than devices (%u)", o->streams, o->device_count);
    if (o->lockstep_in >= 0 && (o->streams != 1 || o->procs != 1))
        return bad_usage("--lockstep steps one stream of one process: leave --streams and --procs at 1");
    if (o->chunk != 0 && o->alloc == 0)
        return bad_usage("--chunk needs --alloc");
    if ((o->hold || o->verify || o->alloc_best_effort) && o->alloc == 0)
        return bad_usage("--hold, --verify and --alloc-best-effort need --alloc");
    if (o->verify && o->alloc_api == API_ARRAY)
        return bad_usage("--verify cannot read back --alloc-api array (arrays have no device pointer)");
    if ((o->grow_ns != 0) != (o->grow_after > 0))
        return bad_usage("--grow-kernel-us and --grow-after go together");
    if (o->grow_cycle > 0 && o->grow_ns == 0)
        return bad_usage("--grow-cycle needs --grow-kernel-us");
    if ((o->stall_ns != 0) != (o->stall_every != 0))
        return bad_usage("--stall-us and --stall-every go together");
    if (o->grow_ns != 0 && o->graph != 0)
        return bad_usage("--grow-kernel-us cannot change a captured --graph");
    if (o->graph != 0 && o->sync != 1)
        return bad_usage("--graph launches are synchronised one by one: leave --sync at 1");
    if (o->trace != NULL && o->trace[0] == '\0')
        return bad_usage("--trace needs a file name");
    if (o->trace != NULL && !trace_can_open(o->trace))
        return bad_usage("--trace '%s': cannot open it for appending: %s", o->trace, strerror(errno));
    if (o->chunk == 0 || o->chunk > o->alloc)
        o->chunk = o->alloc;
    return 0;
}

/* ------------------------------------------------------------------ */
/* One process's run.                                                   */

struct result {
    int pid;
    int device;
    uint64_t launches, kernels;
    double gpu_ms, wall_s; /* between the batches' events; wall time */
    double work_s;         /* kernels x the time of one kernel */
    uint64_t alloc_requested, alloc_bytes;
    char alloc_error[48]; /* first allocation error, "" if none */
    char error[96];       /* first other CUDA error, "" if none */
};

static void note_error(struct result *res, const char *call, CUresult r)
{
    if (res->error[0] == '\0')
        snprintf(res->error, sizeof(res->error), "%s: %s", call, error_name(r));
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Busy the CPU for ns, as a framework's Python between two launches does. */
static void spin_for(uint64_t ns)
{
    double until = now_s() + (double)ns / 1e9;
    while (now_s() < until)
        ;
}

static void sleep_until(double t)
{
    double left = t - now_s();
    if (left <= 0)
        return;
    struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

struct device_ctx {
    CUdevice dev;
    CUcontext ctx;
    CUfunction spin, fill;
    unsigned sms;
};

/* One piece of memory, whatever path it came from. */
struct piece {
    CUdeviceptr ptr; /* 0 for arrays */
    size_t bytes;
    CUarray array;
    CUmemGenericAllocationHandle vmm;
    size_t vmm_size;
};

struct allocation {
    enum alloc_api api;
    struct piece *pieces;
    size_t count;
    CUstream stream;    /* async / pool */
    CUmemoryPool pool;  /* pool */
};

static CUresult alloc_piece(const struct device_ctx *dc, struct allocation *a, size_t bytes, struct piece *p)
{
    CUresult r;
    memset(p, 0, sizeof(*p));
    p->bytes = bytes;
    switch (a->api) {
    case API_ALLOC: return cu.cuMemAlloc(&p->ptr, bytes);
    case API_PITCH: {
        size_t pitch = 0, rows = (bytes + ARRAY_ROW_BYTES - 1) / ARRAY_ROW_BYTES;
        return cu.cuMemAllocPitch(&p->ptr, &pitch, ARRAY_ROW_BYTES, rows, 4);
    }
    case API_MANAGED: return cu.cuMemAllocManaged(&p->ptr, bytes, CU_MEM_ATTACH_GLOBAL);
    case API_ASYNC:
        if ((r = cu.cuMemAllocAsync(&p->ptr, bytes, a->stream)) != CUDA_SUCCESS)
            return r;
        return cu.cuStreamSynchronize(a->stream);
    case API_POOL:
        if ((r = cu.cuMemAllocFromPoolAsync(&p->ptr, bytes, a->pool, a->stream)) != CUDA_SUCCESS)
            return r;
        return cu.cuStreamSynchronize(a->stream);
    case API_VMM: {
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dc->dev}};
        size_t gran = 0;
        if ((r = cu.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) != CUDA_SUCCESS)
            return r;
        size_t size = (bytes + gran - 1) / gran * gran;
        CUmemAccessDesc access = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        if ((r = cu.cuMemCreate(&p->vmm, size, &prop, 0)) != CUDA_SUCCESS)
            return r;
        if ((r = cu.cuMemAddressReserve(&p->ptr, size, 0, 0, 0)) != CUDA_SUCCESS) {
            cu.cuMemRelease(p->vmm);
            return r;
        }
        if ((r = cu.cuMemMap(p->ptr, size, 0, p->vmm, 0)) != CUDA_SUCCESS ||
            (r = cu.cuMemSetAccess(p->ptr, size, &access, 1)) != CUDA_SUCCESS) {
            cu.cuMemUnmap(p->ptr, size);
            cu.cuMemAddressFree(p->ptr, size);
            cu.cuMemRelease(p->vmm);
            return r;
        }
        p->vmm_size = size;
        return CUDA_SUCCESS;
    }
    case API_ARRAY: {
        CUDA_ARRAY3D_DESCRIPTOR desc = {.Width = ARRAY_ROW_BYTES / 16,
                                        .Height = (bytes + ARRAY_ROW_BYTES - 1) / ARRAY_ROW_BYTES,
                                        .Format = CU_AD_FORMAT_UNSIGNED_INT32,
                                        .NumChannels = 4};
        return cu.cuArray3DCreate(&p->array, &desc);
    }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static void free_piece(struct allocation *a, struct piece *p)
{
    switch (a->api) {
    case API_ALLOC:
    case API_PITCH:
    case API_MANAGED: cu.cuMemFree(p->ptr); break;
    case API_ASYNC:
    case API_POOL:
        cu.cuMemFreeAsync(p->ptr, a->stream);
        cu.cuStreamSynchronize(a->stream); /* the default pool gives memory back at sync */
        break;
    case API_VMM:
        cu.cuMemUnmap(p->ptr, p->vmm_size);
        cu.cuMemAddressFree(p->ptr, p->vmm_size);
        cu.cuMemRelease(p->vmm);
        break;
    case API_ARRAY: cu.cuArrayDestroy(p->array); break;
    }
}

static void free_all(struct allocation *a)
{
    while (a->count > 0)
        free_piece(a, &a->pieces[--a->count]);
    free(a->pieces);
    a->pieces = NULL;
    if (a->pool != NULL)
        cu.cuMemPoolDestroy(a->pool);
    if (a->stream != NULL)
        cu.cuStreamDestroy(a->stream);
    a->pool = NULL;
    a->stream = NULL;
}

/* Allocate o->alloc bytes in o->chunk pieces, stopping at the first error. */
static int allocate(const struct options *o, const struct device_ctx *dc, struct allocation *a, struct result *res)
{
    CUresult r = CUDA_SUCCESS;
    size_t max_pieces = (size_t)((o->alloc + o->chunk - 1) / o->chunk);
    a->api = o->alloc_api;
    res->alloc_requested = o->alloc;
    if ((a->pieces = calloc(max_pieces, sizeof(*a->pieces))) == NULL) {
        snprintf(res->alloc_error, sizeof(res->alloc_error), "host out of memory");
        return -1;
    }
    if (a->api == API_ASYNC || a->api == API_POOL)
        r = cu.cuStreamCreate(&a->stream, CU_STREAM_NON_BLOCKING);
    if (r == CUDA_SUCCESS && a->api == API_POOL) {
        CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dc->dev}};
        r = cu.cuMemPoolCreate(&a->pool, &props);
    }
    for (uint64_t done = 0; r == CUDA_SUCCESS && done < o->alloc;) {
        size_t bytes = (size_t)(o->alloc - done < o->chunk ? o->alloc - done : o->chunk);
        r = alloc_piece(dc, a, bytes, &a->pieces[a->count]);
        if (r == CUDA_SUCCESS) {
            a->count++;
            done += bytes;
            res->alloc_bytes = done;
        }
    }
    if (r != CUDA_SUCCESS)
        snprintf(res->alloc_error, sizeof(res->alloc_error), "%s", error_name(r));
    return r == CUDA_SUCCESS ? 0 : -1;
}

/* Fill every piece with its own value by kernel, read samples back. */
static int verify(const struct device_ctx *dc, const struct allocation *a, struct result *res)
{
    for (size_t i = 0; i < a->count; i++) {
        const struct piece *p = &a->pieces[i];
        uint32_t value = 0x5eed0000u + (uint32_t)i;
        uint64_t n = p->bytes / 4;
        CUdeviceptr ptr = p->ptr;
        void *args[] = {&ptr, &value, &n};
        CUresult r = cu.cuLaunchKernel(dc->fill, dc->sms * 4, 1, 1, FILL_THREADS, 1, 1, 0, NULL, args, NULL);
        if (r == CUDA_SUCCESS)
            r = cu.cuCtxSynchronize();
        if (r != CUDA_SUCCESS) {
            note_error(res, "vgpu_fill", r);
            return -1;
        }
        uint64_t probes[3] = {0, n / 2, n > 0 ? n - 1 : 0};
        for (int k = 0; k < 3 && n > 0; k++) {
            uint32_t got = 0;
            r = cu.cuMemcpyDtoH(&got, ptr + probes[k] * 4, sizeof(got));
            if (r != CUDA_SUCCESS) {
                note_error(res, "cuMemcpyDtoH", r);
                return -1;
            }
            if (got != value) {
                snprintf(res->error, sizeof(res->error), "verify: piece %zu word %" PRIu64 " is 0x%x, not 0x%x", i,
                         probes[k], got, value);
                return -1;
            }
        }
    }
    return 0;
}

struct worker {
    const struct options *o;
    const struct device_ctx *dc;
    struct trace *trace;
    double start, deadline;
    uint64_t launches, kernels, grown; /* grown: kernels of --grow-kernel-us */
    double gpu_ms;
    CUresult error;
    const char *error_call;
};

static void fail(struct worker *w, const char *call, CUresult r)
{
    if (w->error == CUDA_SUCCESS) {
        w->error = r;
        w->error_call = call;
    }
}

#define TRY(w, name, call)                  \
    do {                                    \
        CUresult r_ = (call);               \
        if (r_ != CUDA_SUCCESS) {           \
            fail((w), (name), r_);          \
            goto out;                       \
        }                                   \
    } while (0)

/* --lockstep: tell the peer this step is done, wait for its step. Once the
 * peer has gone (end of file, or a write it cannot read) we run alone. */
static void lockstep(const struct options *o)
{
    static bool alone;
    char byte = 1;
    if (o->lockstep_in < 0 || alone)
        return;
    ssize_t n;
    while ((n = write(o->lockstep_out, &byte, 1)) < 0 && errno == EINTR)
        ;
    if (n == 1)
        while ((n = read(o->lockstep_in, &byte, 1)) < 0 && errno == EINTR)
            ;
    alone = n != 1;
}

/* One stream: batches of launches between two events, sleeping after a
 * batch as long as needed for GPU time / wall time to stay at --duty. */
static void *work(void *arg)
{
    struct worker *w = arg;
    const struct options *o = w->o;
    CUstream stream = NULL;
    CUevent start = NULL, end = NULL;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    uint64_t ns = o->kernel_ns, out = 0;
    void *args[] = {&ns, &out};
    unsigned blocks = o->blocks != 0 ? o->blocks : w->dc->sms;
    TRY(w, "cuCtxSetCurrent", cu.cuCtxSetCurrent(w->dc->ctx));
    TRY(w, "cuStreamCreate", cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    TRY(w, "cuEventCreate", cu.cuEventCreate(&start, CU_EVENT_DEFAULT));
    TRY(w, "cuEventCreate", cu.cuEventCreate(&end, CU_EVENT_DEFAULT));
    if (o->graph != 0) {
        TRY(w, "cuStreamBeginCapture", cu.cuStreamBeginCapture(stream, 0 /* global */));
        for (unsigned i = 0; i < o->graph; i++)
            TRY(w, "cuLaunchKernel", cu.cuLaunchKernel(w->dc->spin, blocks, 1, 1, SPIN_THREADS, 1, 1, 0, stream, args, NULL));
        TRY(w, "cuStreamEndCapture", cu.cuStreamEndCapture(stream, &graph));
        TRY(w, "cuGraphInstantiate", cu.cuGraphInstantiate(&exec, graph, 0));
    }
    while (now_s() < w->deadline) {
        uint64_t launched = w->kernels;
        double since_growth = now_s() - w->start - o->grow_after;
        bool grown = o->grow_ns != 0 && since_growth >= 0 &&
                     (o->grow_cycle <= 0 || fmod(since_growth, 2 * o->grow_cycle) < o->grow_cycle);
        ns = grown ? o->grow_ns : o->kernel_ns;
        TRY(w, "cuEventRecord", cu.cuEventRecord(start, stream));
        for (unsigned i = 0; i < o->sync; i++) {
            if (exec != NULL)
                TRY(w, "cuGraphLaunch", cu.cuGraphLaunch(exec, stream));
            else
                TRY(w, "cuLaunchKernel", cu.cuLaunchKernel(w->dc->spin, blocks, 1, 1, SPIN_THREADS, 1, 1, 0, stream, args, NULL));
            w->launches++;
            w->kernels += exec != NULL ? o->graph : 1;
            w->grown += grown;
            if (o->gap_ns != 0)
                spin_for(o->gap_ns);
            if (o->stall_every != 0 && w->launches % o->stall_every == 0)
                sleep_until(now_s() + (double)o->stall_ns / 1e9);
        }
        TRY(w, "cuEventRecord", cu.cuEventRecord(end, stream));
        TRY(w, "cuEventSynchronize", cu.cuEventSynchronize(end));
        trace_batch(w->trace, w->kernels - launched);
        float ms = 0;
        TRY(w, "cuEventElapsedTime", cu.cuEventElapsedTime(&ms, start, end));
        w->gpu_ms += ms;
        lockstep(o);
        if (o->duty < 1)
            sleep_until(w->start + w->gpu_ms / 1000 / o->duty);
    }
out:
    if (exec != NULL)
        cu.cuGraphExecDestroy(exec);
    if (graph != NULL)
        cu.cuGraphDestroy(graph);
    if (end != NULL)
        cu.cuEventDestroy(end);
    if (start != NULL)
        cu.cuEventDestroy(start);
    if (stream != NULL)
        cu.cuStreamDestroy(stream);
    return NULL;
}

/* How long one spin kernel of kernel_ns runs: that per wave of blocks. */
static double kernel_s(const struct options *o, const struct device_ctx *dc, uint64_t kernel_ns)
{
    unsigned blocks = o->blocks != 0 ? o->blocks : dc->sms;
    unsigned waves = dc->sms != 0 ? (blocks + dc->sms - 1) / dc->sms : 1;
    return (double)kernel_ns * waves / 1e9;
}

static void run_kernels(const struct options *o, const struct device_ctx *dcs, struct trace *trace,
                        struct result *res)
{
    struct worker workers[MAX_STREAMS];
    pthread_t threads[MAX_STREAMS];
    double start = now_s();
    for (unsigned i = 0; i < o->streams; i++)
        workers[i] = (struct worker){
            .o = o, .dc = &dcs[i % o->device_count], .trace = trace, .start = start, .deadline = start + o->seconds};
    for (unsigned i = 0; i < o->streams; i++)
        if (pthread_create(&threads[i], NULL, work, &workers[i]) != 0)
            workers[i].error_call = "pthread_create", workers[i].error = CUDA_ERROR_OPERATING_SYSTEM;
    for (unsigned i = 0; i < o->streams; i++) {
        if (workers[i].error_call == NULL || strcmp(workers[i].error_call, "pthread_create") != 0)
            pthread_join(threads[i], NULL);
        res->launches += workers[i].launches;
        res->kernels += workers[i].kernels;
        res->work_s += (double)(workers[i].kernels - workers[i].grown) * kernel_s(o, workers[i].dc, o->kernel_ns);
        res->work_s += (double)workers[i].grown * kernel_s(o, workers[i].dc, o->grow_ns);
        res->gpu_ms += workers[i].gpu_ms;
        if (workers[i].error != CUDA_SUCCESS)
            note_error(res, workers[i].error_call, workers[i].error);
    }
    res->wall_s = now_s() - start;
}

static CUresult open_device(int ordinal, struct device_ctx *dc)
{
    CUresult r;
    int sms = 0;
    CUmodule module;
    if ((r = cu.cuInit(0)) != CUDA_SUCCESS || (r = cu.cuDeviceGet(&dc->dev, ordinal)) != CUDA_SUCCESS ||
        (r = cu.cuDevicePrimaryCtxRetain(&dc->ctx, dc->dev)) != CUDA_SUCCESS ||
        (r = cu.cuCtxSetCurrent(dc->ctx)) != CUDA_SUCCESS ||
        (r = cu.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dc->dev)) != CUDA_SUCCESS ||
        (r = cu.cuModuleLoadData(&module, PTX)) != CUDA_SUCCESS ||
        (r = cu.cuModuleGetFunction(&dc->spin, module, "vgpu_spin")) != CUDA_SUCCESS ||
        (r = cu.cuModuleGetFunction(&dc->fill, module, "vgpu_fill")) != CUDA_SUCCESS)
        return r;
    dc->sms = (unsigned)sms;
    return CUDA_SUCCESS;
}

static void run_process(const struct options *o, struct result *res)
{
    struct device_ctx dcs[MAX_DEVICES] = {0};
    struct allocation a = {0};
    memset(res, 0, sizeof(*res));
    res->pid = getpid();
    res->device = o->devices[0];
    for (unsigned i = 0; i < o->device_count; i++) {
        CUresult r = open_device(o->devices[i], &dcs[i]);
        if (r != CUDA_SUCCESS) {
            note_error(res, "device setup", r);
            return;
        }
    }
    /* Memory goes on the first device, whose context is current last. */
    const struct device_ctx *dc = &dcs[0];
    if (o->device_count > 1 && cu.cuCtxSetCurrent(dc->ctx) != CUDA_SUCCESS)
        note_error(res, "cuCtxSetCurrent", CUDA_ERROR_INVALID_CONTEXT);
    if (o->alloc != 0 && allocate(o, dc, &a, res) == 0 && o->verify)
        verify(dc, &a, res);
    if (!o->hold)
        free_all(&a);
    if (res->error[0] == '\0' && o->seconds > 0) {
        struct trace trace;
        trace_open(&trace, o->trace);
        run_kernels(o, dcs, &trace, res);
        trace_close(&trace);
    }
    free_all(&a);
}

/* ------------------------------------------------------------------ */
/* Reports.                                                             */

/* The share of the GPU its kernels took: the figure to read. */
static double work_share(const struct result *r)
{
    return r->wall_s > 0 ? r->work_s / r->wall_s : 0;
}

/* The events' span over wall time, waits for a turn included. */
static double event_span(const struct result *r)
{
    return r->wall_s > 0 ? r->gpu_ms / 1000 / r->wall_s : 0;
}

/* A JSON string, or null when empty. */
static void print_json_string(const char *s)
{
    if (s[0] == '\0') {
        fputs("null", stdout);
        return;
    }
    putchar('"');
    for (; *s != '\0'; s++) {
        if (*s == '"' || *s == '\\')
            putchar('\\');
        if ((unsigned char)*s >= 0x20)
            putchar(*s);
    }
    putchar('"');
}

static void print_result(const struct options *o, const struct result *r)
{
    double rate = r->wall_s > 0 ? (double)r->kernels / r->wall_s : 0;
    if (r->error[0])
        fprintf(stderr, "vgpu-burn: pid %d: %s\n", r->pid, r->error);
    if (o->json) {
        printf("{\"pid\": %d, \"device\": %d, \"launches\": %" PRIu64 ", \"kernels\": %" PRIu64
               ", \"kernels_per_s\": %.1f, \"work\": %.4f, \"event_time_s\": %.6f, \"wall_s\": %.6f"
               ", \"event_span\": %.4f, \"alloc_requested\": %" PRIu64 ", \"alloc_bytes\": %" PRIu64
               ", \"alloc_error\": ",
               r->pid, r->device, r->launches, r->kernels, rate, work_share(r), r->gpu_ms / 1000, r->wall_s,
               event_span(r), r->alloc_requested, r->alloc_bytes);
        print_json_string(r->alloc_error);
        fputs(", \"error\": ", stdout);
        print_json_string(r->error);
        fputs("}\n", stdout);
        return;
    }
    printf("pid %d device %d: %" PRIu64 " launches, %" PRIu64 " kernels, %.1f kernels/s, wall %.3f s: "
           "work %.1f%% of the GPU (kernels x kernel time), event span %.1f%% (with waits for its turn)",
           r->pid, r->device, r->launches, r->kernels, rate, r->wall_s, 100 * work_share(r), 100 * event_span(r));
    if (r->alloc_requested != 0)
        printf(", alloc %" PRIu64 " of %" PRIu64 " bytes%s%s", r->alloc_bytes, r->alloc_requested,
               r->alloc_error[0] ? ", first error " : "", r->alloc_error);
    printf("\n");
}

static int exit_code(const struct options *o, const struct result *results, unsigned n)
{
    int code = 0;
    for (unsigned i = 0; i < n; i++) {
        if (results[i].error[0] != '\0')
            return EXIT_CUDA;
        if (results[i].alloc_bytes < results[i].alloc_requested && !o->alloc_best_effort)
            code = EXIT_ALLOC;
    }
    return code;
}

static void print_summary(const struct options *o, const struct result *results, unsigned n, int code)
{
    struct result total = {0};
    for (unsigned i = 0; i < n; i++) {
        total.launches += results[i].launches;
        total.kernels += results[i].kernels;
        total.gpu_ms += results[i].gpu_ms;
        total.work_s += results[i].work_s;
        total.alloc_bytes += results[i].alloc_bytes;
        total.alloc_requested += results[i].alloc_requested;
        if (results[i].wall_s > total.wall_s)
            total.wall_s = results[i].wall_s;
    }
    if (o->json)
        printf("{\"summary\": true, \"procs\": %u, \"launches\": %" PRIu64 ", \"kernels\": %" PRIu64
               ", \"work\": %.4f, \"event_time_s\": %.6f, \"wall_s\": %.6f, \"event_span\": %.4f"
               ", \"alloc_requested\": %" PRIu64 ", \"alloc_bytes\": %" PRIu64 ", \"exit\": %d}\n",
               n, total.launches, total.kernels, work_share(&total), total.gpu_ms / 1000, total.wall_s,
               event_span(&total), total.alloc_requested, total.alloc_bytes, code);
    else if (n > 1)
        printf("total: %u procs, %" PRIu64 " kernels, wall %.3f s: work %.1f%% of the GPU, event span %.1f%%\n", n,
               total.kernels, total.wall_s, 100 * work_share(&total), 100 * event_span(&total));
}

static int meminfo(const struct options *o)
{
    struct device_ctx dc = {0};
    size_t free_bytes = 0, total = 0, device_total = 0;
    CUresult r = open_device(o->devices[0], &dc);
    if (r == CUDA_SUCCESS)
        r = cu.cuMemGetInfo(&free_bytes, &total);
    if (r == CUDA_SUCCESS)
        r = cu.cuDeviceTotalMem(&device_total, dc.dev);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "vgpu-burn: %s\n", error_name(r));
        return EXIT_CUDA;
    }
    if (o->json)
        printf("{\"device\": %d, \"free\": %zu, \"total\": %zu, \"device_total\": %zu}\n", o->devices[0], free_bytes,
               total, device_total);
    else
        printf("device %d: free %zu total %zu device_total %zu\n", o->devices[0], free_bytes, total, device_total);
    return 0;
}

/* Fork one child per process; each sends its result back through a pipe. */
static int run_procs(const struct options *o, struct result *results)
{
    int fds[2];
    if (pipe(fds) != 0) {
        perror("vgpu-burn: pipe");
        return -1;
    }
    unsigned started = 0;
    for (; started < o->procs; started++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("vgpu-burn: fork");
            break;
        }
        if (pid == 0) {
            struct result res;
            close(fds[0]);
            run_process(o, &res);
            ssize_t n = write(fds[1], &res, sizeof(res)); /* atomic: below PIPE_BUF */
            _exit(n == (ssize_t)sizeof(res) ? 0 : EXIT_CUDA);
        }
    }
    close(fds[1]);
    unsigned got = 0;
    while (got < started && read(fds[0], &results[got], sizeof(results[got])) == (ssize_t)sizeof(results[got]))
        got++;
    close(fds[0]);
    while (wait(NULL) > 0)
        ;
    return got == o->procs ? (int)got : -1;
}

int main(int argc, char **argv)
{
    struct options o;
    int parsed = parse_options(argc, argv, &o);
    if (parsed != 0)
        return parsed > 0 ? 0 : EXIT_USAGE;
    if (load_driver(o.resolve) != 0)
        return EXIT_CUDA;
    if (o.meminfo)
        return meminfo(&o);
    static struct result results[MAX_PROCS];
    unsigned n = 1;
    if (o.procs == 1) {
        run_process(&o, &results[0]);
    } else if (run_procs(&o, results) < 0) {
        fprintf(stderr, "vgpu-burn: a worker process did not report\n");
        return EXIT_CUDA;
    } else {
        n = o.procs;
    }
    int code = exit_code(&o, results, n);
    for (unsigned i = 0; i < n; i++)
        print_result(&o, &results[i]);
    print_summary(&o, results, n, code);
    return code;
}
