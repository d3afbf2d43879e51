/*
 * overhead.c - context and module overhead counts against the limit.
 *
 * A context costs hundreds of MiB on a real GPU, modules more; none of it
 * goes through an allocation call. After each call that changes it we
 * measure, through the REAL NVML:
 *   - per process (exact): NVML's usedGpuMemory for our host pid minus the
 *     device memory we track for this process (allocations + what our pools
 *     hold); the host pid is getpid() in the root PID namespace, else the
 *     daemon's control.slot_host_pid[slot];
 *   - per device (when the host pid is unknown: a PID namespace without a
 *     daemon): the change of the device's used memory across the call.
 *     Another process allocating at the same instant skews this one.
 * The result is kept in slot.dev[d].overhead and charged in slot.dev[d].used
 * and the vGPU total like any allocation; a charge that would pass the limit
 * makes the context creation or module load fail with OUT_OF_MEMORY.
 */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "vgpu.h"

/* The initial PID namespace always has this inode (PROC_PID_INIT_INO). */
#define ROOT_PIDNS_INO 0xEFFFFFFCu
#define NVML_VALUE_NOT_AVAILABLE (~0ULL)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic bool measured[VGPU_MAX_DEVICES];
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static bool nvml_ok;

static void nvml_start(void)
{
    nvmlReturn_t rc = NVML_ERROR_FUNCTION_NOT_FOUND;
    if (resolve_nvml_available() && vgpu_real_nvml.nvmlInit_v2 != NULL)
        rc = vgpu_real_nvml.nvmlInit_v2();
    nvml_ok = rc == NVML_SUCCESS;
    if (!nvml_ok)
        log_warn("NVML unavailable (error %d): context overhead is not counted", rc);
}

static nvmlDevice_t nvml_device(CUdevice dev)
{
    char uuid[VGPU_UUID_LEN];
    nvmlDevice_t handle = NULL;
    pthread_once(&nvml_once, nvml_start);
    if (!nvml_ok || vgpu_real_nvml.nvmlDeviceGetHandleByUUID == NULL ||
        devmap_cuda_uuid(dev, uuid) != 0 ||
        vgpu_real_nvml.nvmlDeviceGetHandleByUUID(uuid, &handle) != NVML_SUCCESS)
        return NULL;
    return handle;
}

static unsigned host_pid(void)
{
    if (vgpu.pidns == ROOT_PIDNS_INO)
        return (unsigned)getpid();
    int slot = vgpu_slot_index();
    if (vgpu.mode == VGPU_MODE_VGPU && slot >= 0) {
        int32_t pid = atomic_load(&vgpu.control->slot_host_pid[slot]);
        if (pid > 0)
            return (unsigned)pid;
    }
    return 0;
}

/* NVML's figure for one process: 0 found, 1 not listed, -1 unknown. */
static int process_used(nvmlDevice_t dev, unsigned pid, uint64_t *used)
{
    __typeof__(vgpu_real_nvml.nvmlDeviceGetComputeRunningProcesses_v3) list =
        vgpu_real_nvml.nvmlDeviceGetComputeRunningProcesses_v3
            ? vgpu_real_nvml.nvmlDeviceGetComputeRunningProcesses_v3
            : vgpu_real_nvml.nvmlDeviceGetComputeRunningProcesses_v2;
    if (list == NULL)
        return -1;
    int found = -1;
    nvmlProcessInfo_t *infos = NULL;
    unsigned count = 0;
    nvmlReturn_t rc = list(dev, &count, NULL);
    for (int attempt = 0; attempt < 4 && rc == NVML_ERROR_INSUFFICIENT_SIZE; attempt++) {
        count += 8; /* room for processes that start meanwhile */
        free(infos);
        infos = calloc(count, sizeof(*infos));
        if (infos == NULL)
            goto out;
        rc = list(dev, &count, infos);
    }
    if (rc != NVML_SUCCESS)
        goto out;
    found = 1;
    for (unsigned i = 0; i < count && infos != NULL; i++) {
        if (infos[i].pid != pid)
            continue;
        if (infos[i].usedGpuMemory == NVML_VALUE_NOT_AVAILABLE) {
            found = -1;
            break;
        }
        *used = infos[i].usedGpuMemory;
        found = 0;
        break;
    }
out:
    free(infos);
    return found;
}

static int device_used(nvmlDevice_t dev, uint64_t *used)
{
    nvmlMemory_t mem;
    if (dev == NULL || vgpu_real_nvml.nvmlDeviceGetMemoryInfo == NULL ||
        vgpu_real_nvml.nvmlDeviceGetMemoryInfo(dev, &mem) != NVML_SUCCESS)
        return -1;
    *used = mem.used;
    return 0;
}

/* Set this process's overhead on a device to `target` bytes. Lock held. */
static int charge(int index, uint64_t target)
{
    struct vgpu_proc_slot *slot = vgpu_slot();
    if (slot == NULL)
        return -1;
    uint64_t current = atomic_load(&slot->dev[index].overhead);
    if (target > current) {
        if (budget_reserve(index, target - current) != 0)
            return -1;
        atomic_fetch_add(&slot->dev[index].overhead, target - current);
    } else if (target < current) {
        budget_release(index, current - target);
        vgpu_sub_clamp(&slot->dev[index].overhead, current - target);
    }
    log_detail("overhead on device %d: %llu bytes", index, (unsigned long long)target);
    return 0;
}

/* Overhead by the exact method; -1 if it cannot be applied. */
static int measure_process(nvmlDevice_t dev, int index, uint64_t *overhead)
{
    unsigned pid = host_pid();
    uint64_t used = 0;
    if (dev == NULL || pid == 0)
        return -1;
    int found = process_used(dev, pid, &used);
    if (found < 0)
        return -1;
    uint64_t tracked = allocmap_tracked(index) + pools_held(index);
    *overhead = used > tracked ? used - tracked : 0;
    return 0;
}

void overhead_begin(struct overhead_probe *probe, CUdevice dev, int index)
{
    *probe = (struct overhead_probe){.index = index};
    if (index < 0)
        return;
    probe->nvml = nvml_device(dev);
    probe->by_device = host_pid() == 0;
    if (probe->by_device && device_used(probe->nvml, &probe->device_before) != 0)
        probe->nvml = NULL;
}

int overhead_end(struct overhead_probe *probe)
{
    uint64_t target;
    int rc = 0;
    if (probe->index < 0 || probe->nvml == NULL)
        return 0;
    pthread_mutex_lock(&lock);
    if (!probe->by_device) {
        if (measure_process(probe->nvml, probe->index, &target) == 0) {
            probe->wanted = target;
            rc = charge(probe->index, target);
        }
    } else {
        uint64_t after, current = 0;
        struct vgpu_proc_slot *slot = vgpu_slot();
        if (slot != NULL && device_used(probe->nvml, &after) == 0) {
            current = atomic_load(&slot->dev[probe->index].overhead);
            target = after >= probe->device_before
                         ? current + (after - probe->device_before)
                         : current - (probe->device_before - after < current
                                          ? probe->device_before - after
                                          : current);
            probe->wanted = target;
            rc = charge(probe->index, target);
        }
    }
    atomic_store(&measured[probe->index], true);
    pthread_mutex_unlock(&lock);
    return rc;
}

/* The exact measurement and its charge, lock held: 0 charged (or nothing
 * to measure by), -1 it does not fit. */
static int true_up_locked(CUdevice dev, int index, bool *measured_now)
{
    uint64_t target;
    *measured_now = measure_process(nvml_device(dev), index, &target) == 0;
    return *measured_now ? charge(index, target) : 0;
}

int overhead_ensure(CUdevice dev, int index)
{
    if (index < 0 || atomic_load_explicit(&measured[index], memory_order_relaxed))
        return 0;
    int rc = 0;
    bool now = false;
    pthread_mutex_lock(&lock);
    /* Only the exact method works after the fact. If the overhead does not
     * fit, the device stays unmeasured and the allocation is refused. */
    if (!atomic_load(&measured[index])) {
        rc = true_up_locked(dev, index, &now);
        if (rc == 0 && now)
            atomic_store(&measured[index], true);
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int overhead_true_up(CUdevice dev, int index)
{
    if (index < 0)
        return 0;
    bool now;
    pthread_mutex_lock(&lock);
    int rc = true_up_locked(dev, index, &now);
    pthread_mutex_unlock(&lock);
    return rc;
}

void overhead_reset(void)
{
    pthread_mutex_init(&lock, NULL);
    for (int i = 0; i < VGPU_MAX_DEVICES; i++)
        atomic_store(&measured[i], false);
}
