/*
 * nvml_hooks.c - what a process sees through NVML: its slice.
 *
 * Memory info: total = the limit, used = the vGPU's use (allocations and
 * overhead of all its processes), free = the rest. Process lists: only the
 * vGPU's own processes, by host pid (control.slot_host_pid, filled in by the
 * daemon; without it, the pids of slots in the root PID namespace, which are
 * host pids). Devices without a limit are shown as they are.
 */
#include <stdlib.h>
#include <string.h>

#include "vgpu.h"

#define ROOT_PIDNS_INO 0xEFFFFFFCu

/* The configuration was refused: show nothing rather than the whole GPU. */
#define VGPU_NVML_ENTER(name) \
    do { \
        if (!vgpu_nvml_enter() && vgpu.mode == VGPU_MODE_FAILED) \
            return NVML_ERROR_NO_PERMISSION; \
        if (vgpu_real_nvml.name == NULL) \
            return NVML_ERROR_FUNCTION_NOT_FOUND; \
    } while (0)

/* total/used/free of a limited device; false: show the device as it is. */
static bool slice_memory(nvmlDevice_t device, uint64_t *total, uint64_t *used, uint64_t *free_b)
{
    if (!vgpu_limited())
        return false;
    int index = devmap_nvml(device);
    if (index == VGPU_DEV_UNTRACKED)
        return false;
    uint64_t limit = budget_limit(index);
    if (limit == UINT64_MAX)
        return false;
    *total = limit;
    *used = budget_used(index);
    *free_b = limit > *used ? limit - *used : 0;
    return true;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    VGPU_NVML_ENTER(nvmlDeviceGetMemoryInfo);
    nvmlReturn_t rc = vgpu_real_nvml.nvmlDeviceGetMemoryInfo(device, memory);
    uint64_t total, used, free_b;
    if (rc == NVML_SUCCESS && slice_memory(device, &total, &used, &free_b)) {
        memory->total = total;
        memory->used = used;
        memory->free = free_b;
    }
    return rc;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    VGPU_NVML_ENTER(nvmlDeviceGetMemoryInfo_v2);
    nvmlReturn_t rc = vgpu_real_nvml.nvmlDeviceGetMemoryInfo_v2(device, memory);
    uint64_t total, used, free_b;
    if (rc == NVML_SUCCESS && slice_memory(device, &total, &used, &free_b)) {
        /* The driver's reserve is outside the slice: all of it is ours. */
        memory->total = total;
        memory->reserved = 0;
        memory->used = used;
        memory->free = free_b;
    }
    return rc;
}

/* Host pid of an active slot, 0 if unknown. */
static unsigned slot_host_pid(int i)
{
    const struct vgpu_proc_slot *slot = &vgpu.usage->slots[i];
    if (atomic_load(&slot->state) != VGPU_SLOT_ACTIVE)
        return 0;
    if (vgpu.mode == VGPU_MODE_VGPU) {
        int32_t pid = atomic_load(&vgpu.control->slot_host_pid[i]);
        if (pid > 0)
            return (unsigned)pid;
    }
    return atomic_load(&slot->pidns) == ROOT_PIDNS_INO ? (unsigned)atomic_load(&slot->pid) : 0;
}

static bool vgpu_owns_pid(unsigned pid)
{
    for (int i = 0; i < VGPU_MAX_PROCS; i++)
        if (pid != 0 && slot_host_pid(i) == pid)
            return true;
    return false;
}

typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned int *, void *);

/* The driver's whole list, in a buffer we own (*out, *count entries). */
static nvmlReturn_t fetch_all(list_fn list, size_t elem, nvmlDevice_t device, void **out,
                              unsigned *count)
{
    void *buf = NULL;
    unsigned n = 0;
    nvmlReturn_t rc = list(device, &n, NULL);
    for (int attempt = 0; attempt < 4 && rc == NVML_ERROR_INSUFFICIENT_SIZE; attempt++) {
        n += 8; /* room for processes that start meanwhile */
        free(buf);
        buf = calloc(n, elem);
        if (buf == NULL)
            return NVML_ERROR_UNKNOWN;
        rc = list(device, &n, buf);
    }
    if (rc != NVML_SUCCESS) {
        free(buf);
        return rc;
    }
    *out = buf;
    *count = buf != NULL ? n : 0;
    return NVML_SUCCESS;
}

/*
 * Filter to the vGPU's processes, then answer with NVML's protocol on the
 * filtered list: a NULL or short buffer gets NVML_ERROR_INSUFFICIENT_SIZE
 * and the count it needs. The pid is the first field of every version of
 * the process info struct.
 */
static nvmlReturn_t filtered(list_fn list, size_t elem, nvmlDevice_t device,
                             unsigned int *infoCount, void *infos)
{
    if (!vgpu_limited() || infoCount == NULL)
        return list(device, infoCount, infos);
    int index = devmap_nvml(device);
    if (index == VGPU_DEV_UNTRACKED)
        return list(device, infoCount, infos);
    void *all = NULL;
    unsigned n = 0, kept = 0;
    nvmlReturn_t rc = fetch_all(list, elem, device, &all, &n);
    if (rc != NVML_SUCCESS)
        return rc;
    for (unsigned i = 0; i < n && index != VGPU_DEV_FOREIGN; i++) {
        const char *entry = (const char *)all + i * elem;
        unsigned pid;
        memcpy(&pid, entry, sizeof(pid));
        if (vgpu_owns_pid(pid))
            memmove((char *)all + kept++ * elem, entry, elem);
    }
    if (kept > *infoCount || (infos == NULL && kept > 0)) {
        rc = NVML_ERROR_INSUFFICIENT_SIZE;
    } else if (kept > 0) {
        memcpy(infos, all, kept * elem);
    }
    *infoCount = kept;
    free(all);
    return rc;
}

#define PROCESS_LIST(name, type) \
    VGPU_EXPORT nvmlReturn_t name(nvmlDevice_t device, unsigned int *infoCount, type *infos) \
    { \
        VGPU_NVML_ENTER(name); \
        return filtered((list_fn)vgpu_real_nvml.name, sizeof(type), device, infoCount, infos); \
    }

PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t)
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t)
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_t)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t)
PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t)
PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_t)
PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t)
