/*
 * nv_memory.c - device memory and the process lists, drawn from the
 * process slots of the shared state (dead processes are reclaimed on the
 * way, as a driver frees the memory of a process that exits).
 */
#include <stdlib.h>
#include <string.h>

#include "nv_sim.h"

static nvmlReturn_t usage(nvmlDevice_t device, uint64_t *total, uint64_t *used)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    if (r != NVML_SUCCESS)
        return r;
    *total = st->config.memory;
    *used = sim_mem_device_used(st, i);
    if (*used > *total)
        *used = *total;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    uint64_t total, used;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = usage(device, &total, &used);
    if (r == NVML_SUCCESS)
        *memory = (nvmlMemory_t){.total = total, .free = total - used, .used = used};
    return r;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    uint64_t total, used;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t r = usage(device, &total, &used);
    if (r == NVML_SUCCESS)
        *memory = (nvmlMemory_v2_t){
            .version = nvmlMemory_v2, .total = total, .reserved = 0, .free = total - used, .used = used};
    return r;
}

/*
 * The INSUFFICIENT_SIZE protocol: with NULL or too small a buffer, say how
 * many entries there are; an empty list is a success with count 0.
 */
static nvmlReturn_t compute_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos, bool v1)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    if (r != NVML_SUCCESS)
        return r;
    if (infoCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_proc_usage *procs = malloc(SIM_MAX_PROCS * sizeof(*procs));
    if (procs == NULL)
        return NVML_ERROR_UNKNOWN;
    size_t n = sim_mem_processes(st, i, procs, SIM_MAX_PROCS);
    if (n > 0 && (infos == NULL || *infoCount < n)) {
        r = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        for (size_t k = 0; k < n; k++) {
            if (v1)
                ((nvmlProcessInfo_v1_t *)infos)[k] =
                    (nvmlProcessInfo_v1_t){.pid = (unsigned)procs[k].pid, .usedGpuMemory = procs[k].used};
            else
                ((nvmlProcessInfo_t *)infos)[k] = (nvmlProcessInfo_t){.pid = (unsigned)procs[k].pid,
                                                                       .usedGpuMemory = procs[k].used,
                                                                       .gpuInstanceId = NV_NOT_AVAILABLE_ID,
                                                                       .computeInstanceId = NV_NOT_AVAILABLE_ID};
        }
    }
    *infoCount = (unsigned)n;
    free(procs);
    return r;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos)
{
    return compute_processes(device, infoCount, infos, true);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return compute_processes(device, infoCount, infos, false);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return compute_processes(device, infoCount, infos, false);
}

/* The simulator runs no graphics and no MPS server: those lists are empty. */
static nvmlReturn_t no_processes(nvmlDevice_t device, unsigned int *infoCount)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    if (r != NVML_SUCCESS)
        return r;
    if (infoCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *infoCount = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                   nvmlProcessInfo_v1_t *infos)
{
    (void)infos;
    return no_processes(device, infoCount);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    (void)infos;
    return no_processes(device, infoCount);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    (void)infos;
    return no_processes(device, infoCount);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v1_t *infos)
{
    (void)infos;
    return no_processes(device, infoCount);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos)
{
    (void)infos;
    return no_processes(device, infoCount);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos)
{
    (void)infos;
    return no_processes(device, infoCount);
}
