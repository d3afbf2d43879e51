/*
 * test_pacer_launch.c - every launch path through the real hook on the
 * simulated GPU: each is paced to the standalone CUDA_CORE_LIMIT, a share
 * of 100 is not paced at all, and launches captured into a graph are not
 * charged (the graph's launches are). A paced process stamps the GPU's
 * arbiter; an unpaced one is measured (and takes turns) while the stamp is
 * fresh, and keeps its unmeasured fast path once it is stale.
 *
 * The test re-executes itself as workers with LD_PRELOAD=libvgpu.so and
 * LD_LIBRARY_PATH=<build>/sim (VGPU_BUILD names the build directory):
 *   test_pacer_launch worker PATH KERNEL_US SECONDS SYNC_EVERY
 * runs spin kernels through launch path PATH and prints
 *   launches=N wall_ns=N capture_ns=N
 * The work done (launches x kernel time / wall) is the utilization the
 * simulated device gave it; the hook's own figure is in the usage block.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../src/turn.h"
#include "cuda_api.h"
#include "vgpu_abi.h"
#include "check.h"

static const char ptx[] = ".version 7.0\n.target sm_52\n.address_size 64\n"
                          ".visible .entry vgpu_spin(.param .u64 ns, .param .u64 out)\n{\n ret;\n}\n";

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- worker ---------------------------------------------------------------- */

#define WORKER_FNS(X) \
    X(cuInit) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuCtxSetCurrent) X(cuModuleLoadData) \
    X(cuModuleGetFunction) X(cuStreamCreate) X(cuStreamSynchronize) X(cuStreamSynchronize_ptsz) \
    X(cuLaunchKernel) X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx) X(cuLaunchKernelEx_ptsz) \
    X(cuLaunchCooperativeKernel) X(cuLaunchCooperativeKernel_ptsz) \
    X(cuLaunchCooperativeKernelMultiDevice) X(cuLaunchGridAsync) X(cuGraphLaunch) \
    X(cuGraphLaunch_ptsz) X(cuStreamBeginCapture_v2) X(cuStreamEndCapture) \
    X(cuGraphInstantiateWithFlags) X(cuCtxSynchronize) X(cuGraphExecDestroy) X(cuGraphDestroy) \
    X(cuStreamDestroy_v2) X(cuModuleUnload) X(cuDevicePrimaryCtxRelease_v2) X(cuMemAlloc_v2) \
    X(cuMemsetD8_v2) X(cuMemFree_v2) X(cuMemcpyDtoHAsync_v2)

#define FIELD(name) __typeof__(name) *name;
static struct {
    WORKER_FNS(FIELD)
} cu;
#undef FIELD

#define DIE(what, rc) \
    do { \
        fprintf(stderr, "worker: %s failed: %d\n", what, (int)(rc)); \
        exit(1); \
    } while (0)
#define CALL(expr) \
    do { \
        CUresult rc_ = (expr); \
        if (rc_ != CUDA_SUCCESS) \
            DIE(#expr, rc_); \
    } while (0)

struct work {
    CUfunction f;
    CUstream stream;
    void *params[2];
};

static CUresult launch(const char *path, struct work *w)
{
    if (strcmp(path, "kernel_ptsz") == 0) /* NULL: the per-thread default stream */
        return cu.cuLaunchKernel_ptsz(w->f, 1, 1, 1, 32, 1, 1, 0, NULL, w->params, NULL);
    if (strcmp(path, "kernel") == 0 || strcmp(path, "readback") == 0)
        return cu.cuLaunchKernel(w->f, 1, 1, 1, 32, 1, 1, 0, w->stream, w->params, NULL);
    if (strcmp(path, "legacy") == 0 || strcmp(path, "legacy_memset") == 0)
        return cu.cuLaunchKernel(w->f, 1, 1, 1, 32, 1, 1, 0, NULL, w->params, NULL);
    if (strcmp(path, "ex") == 0 || strcmp(path, "ex_ptsz") == 0) {
        CUlaunchConfig cfg = {1, 1, 1, 32, 1, 1, 0, w->stream, NULL, 0};
        return path[2] == '\0' ? cu.cuLaunchKernelEx(&cfg, w->f, w->params, NULL)
                               : cu.cuLaunchKernelEx_ptsz(&cfg, w->f, w->params, NULL);
    }
    if (strcmp(path, "coop") == 0)
        return cu.cuLaunchCooperativeKernel(w->f, 1, 1, 1, 32, 1, 1, 0, w->stream, w->params);
    if (strcmp(path, "coop_ptsz") == 0)
        return cu.cuLaunchCooperativeKernel_ptsz(w->f, 1, 1, 1, 32, 1, 1, 0, w->stream, w->params);
    if (strcmp(path, "multidevice") == 0) {
        CUDA_LAUNCH_PARAMS p = {w->f, 1, 1, 1, 32, 1, 1, 0, w->stream, w->params};
        return cu.cuLaunchCooperativeKernelMultiDevice(&p, 1, 0);
    }
    fprintf(stderr, "worker: unknown launch path %s\n", path);
    exit(2);
}

static int worker(const char *path, uint64_t kernel_us, double seconds, unsigned sync_every)
{
    /* A worker that hangs in the hook fails its test instead of the run. */
    alarm((unsigned)seconds + 30);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL)
        DIE("dlopen", 0);
#define RESOLVE(name) cu.name = (__typeof__(name) *)dlsym(lib, #name);
    WORKER_FNS(RESOLVE)
#undef RESOLVE
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    struct work w;
    uint64_t ns = kernel_us * 1000, out = 0;
    CALL(cu.cuInit(0));
    CALL(cu.cuDeviceGet(&dev, 0));
    CALL(cu.cuDevicePrimaryCtxRetain(&ctx, dev));
    CALL(cu.cuCtxSetCurrent(ctx));
    CALL(cu.cuModuleLoadData(&mod, ptx));
    CALL(cu.cuModuleGetFunction(&w.f, mod, "vgpu_spin"));
    CALL(cu.cuStreamCreate(&w.stream, CU_STREAM_NON_BLOCKING));
    w.params[0] = &ns;
    w.params[1] = &out;

    bool graph = strcmp(path, "graph") == 0;
    CUgraph g = NULL;
    CUgraphExec exec = NULL;
    uint64_t capture_ns = 0;
    if (graph) {
        /* Capture sync_every launches into one graph: this must neither
         * wait for the pacer nor count as GPU time. */
        uint64_t t0 = now_ns();
        CALL(cu.cuStreamBeginCapture_v2(w.stream, 0));
        for (unsigned i = 0; i < sync_every; i++)
            CALL(launch("kernel", &w));
        CALL(cu.cuStreamEndCapture(w.stream, &g));
        capture_ns = now_ns() - t0;
        CALL(cu.cuGraphInstantiateWithFlags(&exec, g, 0));
    }
    /* legacy_memset: the application waits for the device in a call the
     * hook does not see (a synchronous memset), with a gated batch open.
     * readback: it reads a word back on the stream at each sync, as a
     * decoder reads its token. */
    bool unseen_wait = strcmp(path, "legacy_memset") == 0;
    bool readback = strcmp(path, "readback") == 0;
    CUdeviceptr scratch = 0;
    uint32_t word = 0;
    if (unseen_wait || readback)
        CALL(cu.cuMemAlloc_v2(&scratch, 4096));
    uint64_t launches = 0, start = now_ns(), end = start + (uint64_t)(seconds * 1e9);
    do { /* at least one pass, even for a run of 0 s */
        if (graph) {
            CALL(cu.cuGraphLaunch(exec, w.stream));
            launches += sync_every;
            CALL(cu.cuStreamSynchronize(w.stream));
            continue;
        }
        CALL(launch(path, &w));
        if (++launches % sync_every == 0) {
            if (unseen_wait) {
                CALL(cu.cuMemsetD8_v2(scratch, 0, 4096));
            } else if (readback) {
                CALL(cu.cuMemcpyDtoHAsync_v2(&word, scratch, sizeof(word), w.stream));
                CALL(cu.cuStreamSynchronize(w.stream));
            } else {
                CALL(cu.cuCtxSynchronize());
            }
        }
    } while (now_ns() < end);
    CALL(cu.cuCtxSynchronize());
    printf("launches=%" PRIu64 " wall_ns=%" PRIu64 " capture_ns=%" PRIu64 "\n", launches,
           now_ns() - start, capture_ns);
    /* Everything given back, as a well-behaved program does: under the
     * sanitizers, what the worker left would be reported as leaks. */
    if (graph) {
        CALL(cu.cuGraphExecDestroy(exec));
        CALL(cu.cuGraphDestroy(g));
    }
    if (scratch != 0)
        CALL(cu.cuMemFree_v2(scratch));
    CALL(cu.cuStreamDestroy_v2(w.stream));
    CALL(cu.cuModuleUnload(mod));
    CALL(cu.cuDevicePrimaryCtxRelease_v2(dev));
    return 0;
}

/* ---- the test ------------------------------------------------------------------ */

static char self[4096], build[4096], state_path[256], usage_path[256], arbiter_dir[256];

struct result {
    uint64_t launches, wall_ns, capture_ns;
};

/* Run `procs` workers at once sharing one standalone usage block. */
static int run(const char *limit, unsigned procs, const char *path, unsigned kernel_us,
               double seconds, unsigned sync_every, struct result *out)
{
    char preload[4200], libpath[4200], us[32], secs[32], sync[32];
    snprintf(preload, sizeof(preload), "%s/libvgpu.so", build);
    snprintf(libpath, sizeof(libpath), "%s/sim", build);
    snprintf(us, sizeof(us), "%u", kernel_us);
    snprintf(secs, sizeof(secs), "%.2f", seconds);
    snprintf(sync, sizeof(sync), "%u", sync_every);
    int fds[8][2];
    pid_t pids[8];
    for (unsigned p = 0; p < procs; p++) {
        if (pipe(fds[p]) != 0)
            return -1;
        pids[p] = fork();
        if (pids[p] == 0) {
            dup2(fds[p][1], 1);
            setenv("LD_PRELOAD", preload, 1);
            setenv("LD_LIBRARY_PATH", libpath, 1);
            setenv("VGPU_SIM_STATE", state_path, 1);
            setenv("VGPU_USAGE", usage_path, 1);
            setenv("VGPU_ARBITER_DIR", arbiter_dir, 1);
            setenv("CUDA_CORE_LIMIT", limit, 1);
            setenv("VGPU_SIM_KERNEL_NS", "1000", 1);
            execl(self, self, "worker", path, us, secs, sync, (char *)NULL);
            _exit(127);
        }
        close(fds[p][1]);
    }
    memset(out, 0, sizeof(*out));
    int rc = 0;
    for (unsigned p = 0; p < procs; p++) {
        char line[256] = {0};
        ssize_t n = read(fds[p][0], line, sizeof(line) - 1);
        close(fds[p][0]);
        int status;
        waitpid(pids[p], &status, 0);
        struct result r = {0};
        if (n <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
            sscanf(line, "launches=%" SCNu64 " wall_ns=%" SCNu64 " capture_ns=%" SCNu64,
                   &r.launches, &r.wall_ns, &r.capture_ns) != 3) {
            fprintf(stderr, "%s x%u: worker failed (%s)\n", path, procs, line);
            rc = -1;
            continue;
        }
        out->launches += r.launches;
        out->wall_ns = r.wall_ns > out->wall_ns ? r.wall_ns : out->wall_ns;
        out->capture_ns += r.capture_ns;
    }
    return rc;
}

static struct vgpu_usage *map_usage(void)
{
    int fd = open(usage_path, O_RDONLY);
    if (fd < 0)
        return NULL;
    void *p = mmap(NULL, sizeof(struct vgpu_usage), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

/* The arbiter block of the simulated GPU: the one file in arbiter_dir,
 * made by the first hook that looked for it. */
static struct vgpu_arbiter *map_arbiter(void)
{
    DIR *d = opendir(arbiter_dir);
    if (d == NULL)
        return NULL;
    void *p = MAP_FAILED;
    for (struct dirent *e; p == MAP_FAILED && (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        int fd = openat(dirfd(d), e->d_name, O_RDWR);
        if (fd < 0)
            continue;
        p = mmap(NULL, sizeof(struct vgpu_arbiter), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
    }
    closedir(d);
    return p == MAP_FAILED ? NULL : p;
}

/* The simulated GPU's arbiter blocks are this machine's alone: the default
 * (/tmp, by UUID) would make concurrent runs take turns with each other. */
static void remove_arbiters(void)
{
    DIR *d = opendir(arbiter_dir);
    if (d == NULL)
        return;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.')
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    rmdir(arbiter_dir);
}

static void fresh_machine(const char *name)
{
    snprintf(state_path, sizeof(state_path), "/tmp/vgpu-pacer-%d-%s.sim", getpid(), name);
    snprintf(usage_path, sizeof(usage_path), "/tmp/vgpu-pacer-%d-%s.usage", getpid(), name);
    snprintf(arbiter_dir, sizeof(arbiter_dir), "/tmp/vgpu-pacer-%d-%s.arbiters", getpid(), name);
    unlink(state_path);
    unlink(usage_path);
    remove_arbiters();
    mkdir(arbiter_dir, 0700);
}

static void cleanup(void)
{
    unlink(state_path);
    unlink(usage_path);
    remove_arbiters();
}

/* The device time a run got, from the work it completed. */
static double utilization(const struct result *r, unsigned kernel_us)
{
    return (double)r->launches * kernel_us * 1000.0 / (double)r->wall_ns;
}

static void expect_share(const char *path, unsigned procs, unsigned percent, unsigned kernel_us,
                         unsigned sync_every)
{
    char limit[16], name[64];
    snprintf(limit, sizeof(limit), "%u", percent);
    snprintf(name, sizeof(name), "%s-%u-%u", path, percent, kernel_us);
    fresh_machine(name);
    struct result r;
    bool started = run(limit, procs, path, kernel_us, 1.0, sync_every, &r) == 0;
    CHECKF(started, "the workers did not run");
    if (!started) {
        cleanup();
        return;
    }
    double util = 100.0 * utilization(&r, kernel_us);
    struct vgpu_usage *u = map_usage();
    double hook = u != NULL ? 100.0 * (double)atomic_load(&u->devices[0].gpu_time_ns) /
                                  (double)r.wall_ns
                            : -1;
    bool ok = util > percent - 5.0 && util < percent + 5.0 && hook > percent - 5.0 &&
              hook < percent + 5.0;
    printf("%-12s x%u limit %3u%% kernel %5uus: work %5.1f%%, hook measured %5.1f%% %s\n", path,
           procs, percent, kernel_us, util, hook, ok ? "ok" : "FAILED");
    CHECK(ok);
    if (u != NULL)
        munmap(u, sizeof(*u));
    cleanup();
}

static void test_every_launch_path_is_paced(void)
{
    const char *paths[] = {"kernel", "kernel_ptsz", "legacy", "ex", "ex_ptsz",
                           "coop", "coop_ptsz", "multidevice"};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
        expect_share(paths[i], 1, 40, 2000, 1);
    expect_share("graph", 1, 40, 2000, 10);
}

/* Empty kernels as fast as the CPU can launch them: batch records come
 * back from the monitor and are reused at once. A record freed while still
 * in the monitor's queue once lost the queue and hung the launcher; that
 * race needed an unlucky preemption (bench_launch hung 1 run in 10 on a
 * loaded box), so this run exercises the path rather than proving it. */
static void test_empty_kernels_do_not_hang(void)
{
    fresh_machine("empty");
    struct result r;
    bool ok = run("99", 1, "kernel", 0, 1.0, 1000, &r) == 0;
    printf("empty kernels at 99%%: %" PRIu64 " launches in %.1f s: %s\n", r.launches,
           (double)r.wall_ns / 1e9, ok ? "ok" : "FAILED");
    CHECK(ok);
    cleanup();
}

/* A paced batch is gated: its kernels wait for the hook to close it. An
 * application that then waits for them in a call the hook does not see
 * (here a synchronous memset behind the legacy stream) must be let through
 * by the gate watcher after GT_GATE_QUIET_NS: not hang (the worker's alarm
 * turns a hang into a failure), nor wait for the monitor's GT_QUIET_NS. The
 * simulated memset holds the driver's API lock while it waits, as real
 * synchronous calls do, so a watcher that recorded the batch's end event
 * before opening its gate hangs here (it did on an H100, in PyTorch's
 * stream creation). */
static void test_a_wait_the_hook_does_not_see_stalls_but_never_hangs(void)
{
    fresh_machine("unseen");
    struct result r;
    bool ran = run("40", 1, "legacy_memset", 10, 1.0, 4, &r) == 0;
    /* Each memset waits for the watcher: ~GT_GATE_QUIET_NS, well under the
     * millisecond that would mean the monitor's GT_QUIET_NS opened it. */
    bool ok = ran && r.launches >= 4 * (r.wall_ns / 1000000);
    printf("legacy_memset x1 limit 40%%, a synchronous memset every 4 launches: %" PRIu64
           " launches in %.2f s: %s\n",
           r.launches, (double)r.wall_ns / 1e9, ok ? "ok" : "FAILED");
    CHECK(ok);
    cleanup();
}

/* Tiny kernels are batched (events amortised) and still paced by time;
 * processes of one usage block share one budget. */
static void test_tiny_kernels_and_shared_budget(void)
{
    expect_share("kernel", 1, 30, 10, 100);
    expect_share("kernel", 3, 30, 2000, 1);
}

static void test_share_100_is_not_measured(void)
{
    fresh_machine("full");
    struct result r;
    bool started = run("100", 1, "kernel", 5000, 1.0, 1, &r) == 0;
    CHECKF(started, "the workers did not run");
    if (!started) {
        cleanup();
        return;
    }
    struct vgpu_usage *u = map_usage();
    double util = 100.0 * utilization(&r, 5000);
    bool ok = util > 90 && u != NULL && atomic_load(&u->devices[0].gpu_time_ns) == 0;
    printf("limit 100: work %.1f%%, no GPU time measured: %s\n", util, ok ? "ok" : "FAILED");
    CHECK(ok);
    if (u != NULL)
        munmap(u, sizeof(*u));
    cleanup();
}

/* The highest value a word held while a run went on. */
struct stamp_watch {
    pthread_t th;
    _Atomic uint64_t *word;
    _Atomic bool stop;
    uint64_t highest;
};

static void *watch_stamp(void *arg)
{
    struct stamp_watch *w = arg;
    while (!atomic_load(&w->stop)) {
        uint64_t v = atomic_load(w->word);
        if (v > w->highest)
            w->highest = v;
        struct timespec tick = {0, 1000000};
        nanosleep(&tick, NULL);
    }
    return NULL;
}

/* A paced process says so on its GPU's arbiter (standalone: its user's own
 * file) and takes its stamp back as it exits; a process at 100 % there is
 * measured while the stamp is fresh (it takes turns so that its work stays
 * out of the paced one's event pairs) but never held back, and goes back to
 * its unmeasured fast path once the stamp is stale. */
static void test_unpaced_processes_are_measured_while_a_pacer_stamps(void)
{
    fresh_machine("stamp");
    struct result r;
    bool started = run("40", 1, "kernel", 2000, 0.3, 1, &r) == 0; /* makes the arbiter */
    CHECKF(started, "the workers did not run");
    if (!started) {
        cleanup();
        return;
    }
    struct vgpu_arbiter *a = map_arbiter();
    struct vgpu_usage *u = map_usage();
    CHECKF(a != NULL && u != NULL, "pacing stamp: no arbiter or usage block");
    if (a == NULL || u == NULL)
        goto out;
    /* Written as it paces (at least half the freshness past its start),
     * gone once it exited. */
    struct stamp_watch w = {.word = &a->turn.paced_until_ns};
    uint64_t start = now_ns();
    pthread_create(&w.th, NULL, watch_stamp, &w);
    started = run("40", 1, "kernel", 2000, 0.3, 1, &r) == 0;
    atomic_store(&w.stop, true);
    pthread_join(w.th, NULL);
    bool stamped = started && w.highest >= start + TURN_PACED_FRESH_NS / 2 &&
                   atomic_load(&a->turn.paced_until_ns) == 0;

    /* As if a pacer were still at work: the unlimited process measures. */
    atomic_store(&a->turn.paced_until_ns, now_ns() + 60000000000ull);
    uint64_t before = atomic_load(&u->devices[0].gpu_time_ns);
    bool ran = run("100", 1, "kernel", 5000, 1.0, 1, &r) == 0;
    double fresh_work = 100.0 * utilization(&r, 5000);
    double fresh_hook =
        100.0 * (double)(atomic_load(&u->devices[0].gpu_time_ns) - before) / (double)r.wall_ns;

    /* The pacer is gone: the stamp is past, nothing is measured, and the
     * stamp is cleared so that launches read no clock for it. */
    atomic_store(&a->turn.paced_until_ns, now_ns() - 1);
    before = atomic_load(&u->devices[0].gpu_time_ns);
    ran = run("100", 1, "kernel", 5000, 0.5, 1, &r) == 0 && ran;
    double stale_work = 100.0 * utilization(&r, 5000);
    uint64_t stale_measured = atomic_load(&u->devices[0].gpu_time_ns) - before;

    bool ok = ran && stamped && fresh_work > 90 && fresh_hook > fresh_work - 5 &&
              fresh_hook < fresh_work + 5 && stale_work > 90 && stale_measured == 0 &&
              atomic_load(&a->turn.paced_until_ns) == 0;
    printf("pacing stamp %s; limit 100 next to a fresh stamp: work %.1f%%, hook measured %.1f%%; "
           "next to a stale one: work %.1f%%, measured %" PRIu64 " ns: %s\n",
           stamped ? "written, taken back at exit" : "MISSING or LEFT", fresh_work, fresh_hook, stale_work, stale_measured,
           ok ? "ok" : "FAILED");
    CHECK(ok);
out:
    if (a != NULL)
        munmap(a, sizeof(*a));
    if (u != NULL)
        munmap(u, sizeof(*u));
    cleanup();
}

/* A process with no hook keeping the device busy: the test's own worker
 * without LD_PRELOAD, 2 ms kernels, a sync every 8. */
static pid_t start_unhooked_neighbour(double seconds)
{
    char libpath[4200], secs[32];
    snprintf(libpath, sizeof(libpath), "%s/sim", build);
    snprintf(secs, sizeof(secs), "%.2f", seconds);
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        unsetenv("LD_PRELOAD");
        setenv("LD_LIBRARY_PATH", libpath, 1);
        setenv("VGPU_SIM_STATE", state_path, 1);
        execl(self, self, "worker", "kernel", "2000", secs, "8", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* A paced process that reads each result back (a copy, then its next
 * launch on a drained stream) beside another context's queued work: each
 * batch's start event follows the hook's touch kernel, so it is charged
 * its kernels, not the other context's work before them (gputime.h,
 * "Touched"; the simulated device stamps a start event after a copy as an
 * H200 does). Untouched, it was charged its whole limit, 50 %, for 1.0 % of
 * work. */
static void test_a_batch_after_a_read_back_is_charged_its_own_kernels(void)
{
    fresh_machine("readback");
    pid_t neighbour = start_unhooked_neighbour(2.5);
    struct timespec settle = {0, 200000000};
    nanosleep(&settle, NULL);
    struct result r;
    bool started = run("50", 1, "readback", 200, 1.5, 1, &r) == 0;
    int status;
    waitpid(neighbour, &status, 0);
    CHECKF(started, "the workers did not run");
    struct vgpu_usage *u = map_usage();
    if (!started || u == NULL) {
        cleanup();
        return;
    }
    double util = 100.0 * utilization(&r, 200);
    double hook = 100.0 * (double)atomic_load(&u->devices[0].gpu_time_ns) / (double)r.wall_ns;
    bool ok = util > 0.2 && hook < 2.0 * util + 0.5;
    printf("read back beside queued work: work %.2f%%, hook measured %.2f%%: %s\n", util, hook,
           ok ? "ok" : "FAILED");
    CHECK(ok);
    munmap(u, sizeof(*u));
    cleanup();
}

/* The readback worker in a slice of `limit` with modules of 8 MiB (the
 * simulator's VGPU_SIM_MODULE_BYTES): its usage block's out-of-memory
 * count and peak, or false if it did not run. */
static bool touch_module_run(const char *name, const char *limit, uint64_t *ooms, uint64_t *peak)
{
    fresh_machine(name);
    setenv("VGPU_SIM_MODULE_BYTES", "8m", 1);
    setenv("CUDA_MEM_LIMIT", limit, 1);
    struct result r;
    bool started = run("50", 1, "readback", 200, 0.3, 1, &r) == 0;
    unsetenv("VGPU_SIM_MODULE_BYTES");
    unsetenv("CUDA_MEM_LIMIT");
    struct vgpu_usage *u = started ? map_usage() : NULL;
    if (u != NULL) {
        *ooms = atomic_load(&u->devices[0].oom_count);
        *peak = atomic_load(&u->devices[0].peak);
        munmap(u, sizeof(*u));
    }
    cleanup();
    return u != NULL;
}

/* The touch kernel's module is the hook's own: charged in the slice as any
 * module is (the context's 48 MiB, the worker's module and the touch's:
 * a peak of 64 MiB), but where it does not fit (a slice of 60 MiB) the
 * application sees no out-of-memory, none counted in its usage block, and
 * its batches go untouched. */
static void test_the_touch_module_is_charged_and_never_an_oom_of_the_process(void)
{
    uint64_t ooms = 0, peak = 0, tight_ooms = 0, tight_peak = 0;
    bool ran = touch_module_run("touch-fits", "100m", &ooms, &peak) &&
               touch_module_run("touch-oom", "60m", &tight_ooms, &tight_peak);
    bool ok = ran && ooms == 0 && peak >= 64ull << 20 && tight_ooms == 0 &&
              tight_peak <= 60ull << 20;
    printf("touch module: in 100 MiB peak %" PRIu64 " MiB; in 60 MiB peak %" PRIu64
           " MiB, %" PRIu64 " out-of-memory counted: %s\n",
           peak >> 20, tight_peak >> 20, tight_ooms, ok ? "ok" : "FAILED");
    CHECK(ok);
}

/* 100 launches of 1 ms captured at a 10 % limit: capture takes no pacer
 * time (charged, they would need ~1 s) and counts no GPU time until the
 * graph runs. */
static void test_captured_launches_are_not_charged(void)
{
    fresh_machine("capture");
    struct result r;
    bool started = run("10", 1, "graph", 1000, 0.0, 100, &r) == 0;
    CHECKF(started, "the workers did not run");
    if (!started) {
        cleanup();
        return;
    }
    struct vgpu_usage *u = map_usage();
    uint64_t measured = u != NULL ? atomic_load(&u->devices[0].gpu_time_ns) : 0;
    /* The run launched the graph once (0 s loop: one pass): 100 ms of work. */
    bool ok = r.capture_ns < 50000000ull && measured >= 95000000ull && measured <= 110000000ull;
    printf("capture of 100 x 1 ms at 10%%: %.1f ms to capture, %.1f ms measured after one "
           "graph launch: %s\n",
           (double)r.capture_ns / 1e6, (double)measured / 1e6, ok ? "ok" : "FAILED");
    CHECK(ok);
    if (u != NULL)
        munmap(u, sizeof(*u));
    cleanup();
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "worker") == 0)
        return worker(argv[2], strtoull(argv[3], NULL, 10), atof(argv[4]),
                      (unsigned)strtoul(argv[5], NULL, 10));
    const char *dir = getenv("VGPU_BUILD");
    if (realpath(dir != NULL ? dir : "build", build) == NULL ||
        readlink("/proc/self/exe", self, sizeof(self) - 1) < 0) {
        fprintf(stderr, "test_pacer_launch: cannot find the build directory\n");
        return 1;
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    test_share_100_is_not_measured();
    test_unpaced_processes_are_measured_while_a_pacer_stamps();
    test_captured_launches_are_not_charged();
    test_a_batch_after_a_read_back_is_charged_its_own_kernels();
    test_the_touch_module_is_charged_and_never_an_oom_of_the_process();
    test_empty_kernels_do_not_hang();
    test_a_wait_the_hook_does_not_see_stalls_but_never_hangs();
    test_every_launch_path_is_paced();
    test_tiny_kernels_and_shared_budget();
    return check_report("test_pacer_launch");
}
