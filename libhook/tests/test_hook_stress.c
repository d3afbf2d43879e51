/*
 * test_hook_stress.c - the budget holds at any concurrency.
 *
 * 64 processes x 4 threads allocate and free random sizes through the hook
 * (standalone, one shared usage block) far beyond the limit, while this
 * process watches from outside: the vGPU total never passes the limit, the
 * simulator's NVML per-process sum never passes the limit plus the
 * contexts' overhead, and when every worker is gone everything is back to 0.
 *
 * Run by `make test-c` (VGPU_BUILD names the build directory); it starts its
 * workers as `test_hook_stress worker` under LD_PRELOAD.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_api.h"
#include "nvml_api.h"
#include "vgpu_abi.h"
#include "check.h"

#define WORKERS 64
#define THREADS 4
#define ITERATIONS 4000
#define HELD_MAX 4
#define LIMIT (256ull << 20)
#define CTX_OVERHEAD (1ull << 20)
#define CHUNK (256ull << 10)

/* ---- worker: runs under the hook ---------------------------------------- */

static struct {
    __typeof__(cuInit) *init;
    __typeof__(cuDeviceGet) *device_get;
    __typeof__(cuDevicePrimaryCtxRetain) *retain;
    __typeof__(cuCtxSetCurrent) *set_current;
    __typeof__(cuMemAlloc_v2) *alloc;
    __typeof__(cuMemFree_v2) *free;
} cu;
static CUcontext ctx;
static _Atomic int worker_errors;

static void *churn(void *arg)
{
    unsigned seed = (unsigned)getpid() * 31u + (unsigned)(uintptr_t)arg;
    CUdeviceptr held[HELD_MAX];
    int n = 0;
    if (cu.set_current(ctx) != CUDA_SUCCESS) {
        atomic_fetch_add(&worker_errors, 1);
        return NULL;
    }
    for (int i = 0; i < ITERATIONS; i++) {
        if (n < HELD_MAX && (n == 0 || rand_r(&seed) % 2)) {
            size_t bytes = (1 + (size_t)(rand_r(&seed) % 16)) * CHUNK;
            CUresult rc = cu.alloc(&held[n], bytes);
            if (rc == CUDA_SUCCESS)
                n++;
            else if (rc != CUDA_ERROR_OUT_OF_MEMORY)
                atomic_fetch_add(&worker_errors, 1);
        } else {
            int victim = rand_r(&seed) % n;
            if (cu.free(held[victim]) != CUDA_SUCCESS)
                atomic_fetch_add(&worker_errors, 1);
            held[victim] = held[--n];
        }
    }
    while (n > 0)
        if (cu.free(held[--n]) != CUDA_SUCCESS)
            atomic_fetch_add(&worker_errors, 1);
    return NULL;
}

/* Every worker initialises, says so on `ready_fd`, then waits on `go_fd`
 * until the monitor closes that pipe: all 64 x 4 threads run at once. */
static int worker(int ready_fd, int go_fd)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL)
        return 3;
    cu.init = (__typeof__(cu.init))dlsym(lib, "cuInit");
    cu.device_get = (__typeof__(cu.device_get))dlsym(lib, "cuDeviceGet");
    cu.retain = (__typeof__(cu.retain))dlsym(lib, "cuDevicePrimaryCtxRetain");
    cu.set_current = (__typeof__(cu.set_current))dlsym(lib, "cuCtxSetCurrent");
    cu.alloc = (__typeof__(cu.alloc))dlsym(lib, "cuMemAlloc_v2");
    cu.free = (__typeof__(cu.free))dlsym(lib, "cuMemFree_v2");
    CUdevice dev;
    if (cu.init(0) != CUDA_SUCCESS || cu.device_get(&dev, 0) != CUDA_SUCCESS ||
        cu.retain(&ctx, dev) != CUDA_SUCCESS)
        return 4;
    char byte = 1;
    if (write(ready_fd, &byte, 1) != 1)
        return 6;
    close(ready_fd);
    while (read(go_fd, &byte, 1) > 0)
        ;
    pthread_t threads[THREADS];
    for (uintptr_t t = 0; t < THREADS; t++)
        pthread_create(&threads[t], NULL, churn, (void *)t);
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    return atomic_load(&worker_errors) == 0 ? 0 : 5;
}

/* ---- monitor: this process, not hooked ----------------------------------- */

static struct {
    __typeof__(nvmlInit_v2) *init;
    __typeof__(nvmlDeviceGetHandleByIndex_v2) *handle;
    __typeof__(nvmlDeviceGetComputeRunningProcesses_v3) *processes;
} nv;
static nvmlDevice_t nvml_dev;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int open_nvml(const char *build)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof(path), "%s/sim/libnvidia-ml.so.1", build);
    void *lib = dlopen(path, RTLD_NOW);
    if (lib == NULL)
        return -1;
    nv.init = (__typeof__(nv.init))dlsym(lib, "nvmlInit_v2");
    nv.handle = (__typeof__(nv.handle))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    nv.processes = (__typeof__(nv.processes))dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    if (!nv.init || !nv.handle || !nv.processes || nv.init() != NVML_SUCCESS ||
        nv.handle(0, &nvml_dev) != NVML_SUCCESS)
        return -1;
    return 0;
}

/* Sum of NVML's per-process device memory; -1 if NVML failed. */
static long long nvml_sum(void)
{
    nvmlProcessInfo_t infos[WORKERS * 2];
    unsigned count = WORKERS * 2;
    if (nv.processes(nvml_dev, &count, infos) != NVML_SUCCESS)
        return -1;
    long long sum = 0;
    for (unsigned i = 0; i < count; i++)
        sum += (long long)infos[i].usedGpuMemory;
    return sum;
}

/* The usage block, once the first worker has created it. */
static const struct vgpu_usage *map_usage(const char *path)
{
    for (int tries = 0; tries < 10000; tries++) {
        int fd = open(path, O_RDONLY);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size == sizeof(struct vgpu_usage)) {
            const struct vgpu_usage *u =
                mmap(NULL, sizeof(*u), PROT_READ, MAP_SHARED, fd, 0);
            close(fd);
            if (u != MAP_FAILED && __atomic_load_n(&u->hdr.magic, __ATOMIC_ACQUIRE) ==
                                       VGPU_USAGE_MAGIC)
                return u;
        } else if (fd >= 0) {
            close(fd);
        }
        sleep_ms(1);
    }
    return NULL;
}

static void start_worker(const char *self, char **env, int ready[2], int go[2])
{
    if (fork() == 0) {
        char ready_fd[16], go_fd[16];
        snprintf(ready_fd, sizeof(ready_fd), "%d", ready[1]);
        snprintf(go_fd, sizeof(go_fd), "%d", go[0]);
        close(ready[0]);
        close(go[1]);
        char *argv[] = {(char *)self, "worker", ready_fd, go_fd, NULL};
        execve(self, argv, env);
        _exit(127);
    }
}

int main(int argc, char **argv)
{
    if (argc > 3 && strcmp(argv[1], "worker") == 0)
        return worker(atoi(argv[2]), atoi(argv[3]));

    char build[PATH_MAX], self[PATH_MAX], dir[] = "/tmp/vgpu-stress-XXXXXX";
    const char *build_env = getenv("VGPU_BUILD") ? getenv("VGPU_BUILD") : "build";
    if (realpath(build_env, build) == NULL || realpath("/proc/self/exe", self) == NULL ||
        mkdtemp(dir) == NULL) {
        fprintf(stderr, "test_hook_stress: setup: %s\n", strerror(errno));
        return 1;
    }
    char preload[PATH_MAX + 32], libpath[PATH_MAX + 32], state[PATH_MAX + 8], usage[PATH_MAX + 8],
        state_env[PATH_MAX + 32], usage_env[PATH_MAX + 32];
    snprintf(preload, sizeof(preload), "LD_PRELOAD=%s/libvgpu.so", build);
    snprintf(libpath, sizeof(libpath), "LD_LIBRARY_PATH=%s/sim", build);
    snprintf(state, sizeof(state), "%s/sim", dir);
    snprintf(usage, sizeof(usage), "%s/usage", dir);
    snprintf(state_env, sizeof(state_env), "VGPU_SIM_STATE=%s", state);
    snprintf(usage_env, sizeof(usage_env), "VGPU_USAGE=%s", usage);
    char limit_env[64], overhead_env[64];
    snprintf(limit_env, sizeof(limit_env), "CUDA_MEM_LIMIT=%llu", LIMIT);
    snprintf(overhead_env, sizeof(overhead_env), "VGPU_SIM_CTX_OVERHEAD=%llu", CTX_OVERHEAD);
    /* The sanitizers' settings reach the workers too (make test-c-asan). */
    char asan_env[512], ubsan_env[512];
    snprintf(asan_env, sizeof(asan_env), "ASAN_OPTIONS=%s",
             getenv("ASAN_OPTIONS") ? getenv("ASAN_OPTIONS") : "");
    snprintf(ubsan_env, sizeof(ubsan_env), "UBSAN_OPTIONS=%s",
             getenv("UBSAN_OPTIONS") ? getenv("UBSAN_OPTIONS") : "");
    char *env[] = {preload,  libpath,   state_env, usage_env, limit_env, overhead_env,
                   asan_env, ubsan_env, "VGPU_SIM_MEMORY=4g", "LOGGER_LEVEL=1", NULL};
    setenv("VGPU_SIM_STATE", state, 1);
    setenv("VGPU_SIM_MEMORY", "4g", 1);
    setenv("VGPU_SIM_CTX_OVERHEAD", "1048576", 1);

    int ready[2], go[2];
    if (pipe(ready) != 0 || pipe(go) != 0)
        return 1;
    start_worker(self, env, ready, go);
    const struct vgpu_usage *u = map_usage(usage);
    CHECKF(u != NULL, "the workers never created the usage block");
    if (u == NULL)
        return 1;
    CHECKF(open_nvml(build) == 0, "the simulator's NVML does not answer");
    for (int i = 1; i < WORKERS; i++)
        start_worker(self, env, ready, go);
    close(ready[1]);
    close(go[0]);
    char byte;
    int ready_count = 0;
    while (ready_count < WORKERS && read(ready[0], &byte, 1) == 1)
        ready_count++;
    CHECKF(ready_count == WORKERS, "only %d workers started", ready_count);
    close(go[1]); /* go */

    int alive = WORKERS, samples = 0, bad_exits = 0;
    uint64_t max_used = 0;
    long long max_nvml = 0;
    while (alive > 0) {
        uint64_t used = atomic_load(&u->devices[0].used);
        long long sum = nvml_sum();
        CHECKF(used <= LIMIT, "vGPU total %llu passed the limit", (unsigned long long)used);
        CHECKF(sum >= 0 && (unsigned long long)sum <= LIMIT + WORKERS * CTX_OVERHEAD,
              "NVML per-process sum %lld passed the limit plus overhead", sum);
        max_used = used > max_used ? used : max_used;
        max_nvml = sum > max_nvml ? sum : max_nvml;
        samples++;
        int status;
        pid_t pid;
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            alive--;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                bad_exits++;
                fprintf(stderr, "worker %d: status %#x\n", (int)pid, status);
            }
        }
        if (alive > 0)
            sleep_ms(2);
    }
    CHECKF(bad_exits == 0, "%d worker(s) failed", bad_exits);
    CHECKF(samples >= 10, "only %d samples: the monitor saw too little", samples);
    CHECKF(max_used > LIMIT / 2, "the limit was never pressed (max %llu)",
          (unsigned long long)max_used);
    CHECKF(atomic_load(&u->devices[0].oom_count) > 0, "no allocation was ever refused");
    CHECKF(atomic_load(&u->devices[0].peak) <= LIMIT, "peak %llu passed the limit",
          (unsigned long long)atomic_load(&u->devices[0].peak));
    CHECKF(atomic_load(&u->devices[0].used) == 0, "%llu bytes left in the budget",
          (unsigned long long)atomic_load(&u->devices[0].used));
    for (int i = 0; i < VGPU_MAX_PROCS; i++)
        CHECKF(atomic_load(&u->slots[i].state) == VGPU_SLOT_FREE, "slot %d not free", i);
    CHECKF(nvml_sum() == 0, "NVML still shows %lld bytes", nvml_sum());
    printf("test_hook_stress: %d samples, max used %llu of %llu, max NVML %lld, %llu refusals\n",
           samples, (unsigned long long)max_used, LIMIT, max_nvml,
           (unsigned long long)atomic_load(&u->devices[0].oom_count));

    unlink(usage);
    unlink(state);
    rmdir(dir);
    return check_report("test_hook_stress");
}
