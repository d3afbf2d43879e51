/*
 * nv_init.c - NVML initialisation, versions, error strings and device
 * handles.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "nv_sim.h"

#define DRIVER_VERSION "580.0-sim"
#define NVML_VERSION "13.580.0-sim"
#define CUDA_DRIVER_VERSION 13000

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refs;
static struct sim_state *g_state;
static struct nvmlDevice_st g_devices[SIM_MAX_DEVICES];

struct sim_state *nv_state(void)
{
    pthread_mutex_lock(&g_lock);
    struct sim_state *st = g_refs > 0 ? g_state : NULL;
    pthread_mutex_unlock(&g_lock);
    return st;
}

nvmlDevice_t nv_handle(unsigned index)
{
    return &g_devices[index];
}

nvmlReturn_t nv_device(nvmlDevice_t device, struct sim_state **st, unsigned *index)
{
    struct sim_state *s = nv_state();
    if (s == NULL)
        return NVML_ERROR_UNINITIALIZED;
    uintptr_t first = (uintptr_t)&g_devices[0], p = (uintptr_t)device;
    if (p < first || p >= (uintptr_t)&g_devices[s->config.devices] || (p - first) % sizeof(g_devices[0]) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (atomic_load(&s->devices[device->index].lost))
        return NVML_ERROR_GPU_IS_LOST;
    *st = s;
    *index = device->index;
    return NVML_SUCCESS;
}

static nvmlReturn_t init(void)
{
    struct sim_state *st = sim_state_get();
    if (st == NULL)
        return NVML_ERROR_DRIVER_NOT_LOADED; /* the reason is on stderr */
    pthread_mutex_lock(&g_lock);
    for (unsigned i = 0; i < SIM_MAX_DEVICES; i++)
        g_devices[i].index = i;
    g_state = st;
    g_refs++;
    pthread_mutex_unlock(&g_lock);
    sim_owners_watch(); /* NVML's callers ask for the process lists often */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void)
{
    return init();
}

nvmlReturn_t nvmlInit_v2(void)
{
    return init();
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags; /* NO_GPUS / NO_ATTACH change nothing for the simulator */
    return init();
}

nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t r = g_refs > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (g_refs > 0)
        g_refs--;
    pthread_mutex_unlock(&g_lock);
    return r;
}

struct error_text {
    nvmlReturn_t code;
    const char *text;
};

static const struct error_text ERRORS[] = {
    {NVML_SUCCESS, "Success"},
    {NVML_ERROR_UNINITIALIZED, "Uninitialized"},
    {NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"},
    {NVML_ERROR_NOT_SUPPORTED, "Not Supported"},
    {NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"},
    {5, "Already Initialized"},
    {NVML_ERROR_NOT_FOUND, "Not Found"},
    {NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient Size"},
    {8, "Insufficient External Power"},
    {NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"},
    {NVML_ERROR_TIMEOUT, "Timeout"},
    {11, "Interrupted by IRQ"},
    {12, "NVML Shared Library Not Found"},
    {NVML_ERROR_FUNCTION_NOT_FOUND, "Function Not Found"},
    {14, "Corrupted infoROM"},
    {NVML_ERROR_GPU_IS_LOST, "GPU is lost"},
    {16, "GPU requires restart"},
    {17, "Driver/library version mismatch"},
    {18, "In use by another client"},
    {19, "Insufficient memory"},
    {20, "No data"},
    {NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "Argument version mismatch"},
    {NVML_ERROR_UNKNOWN, "Unknown Error"},
};

const char *nvmlErrorString(nvmlReturn_t result)
{
    for (size_t i = 0; i < sizeof(ERRORS) / sizeof(ERRORS[0]); i++)
        if (ERRORS[i].code == result)
            return ERRORS[i].text;
    return "Unknown Error";
}

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *value)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) >= length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return nv_state() == NULL ? NVML_ERROR_UNINITIALIZED : copy_string(version, length, DRIVER_VERSION);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return copy_string(version, length, NVML_VERSION); /* valid before nvmlInit, as in NVML */
}

static nvmlReturn_t cuda_version(int *out)
{
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = CUDA_DRIVER_VERSION;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    return cuda_version(cudaDriverVersion);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return cuda_version(cudaDriverVersion);
}

static nvmlReturn_t device_count(unsigned int *count)
{
    struct sim_state *st = nv_state();
    if (st == NULL)
        return NVML_ERROR_UNINITIALIZED;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = st->config.devices; /* NVML ignores CUDA_VISIBLE_DEVICES */
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return device_count(deviceCount);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    return device_count(deviceCount);
}

static nvmlReturn_t by_index(unsigned int index, nvmlDevice_t *device)
{
    struct sim_state *st = nv_state();
    if (st == NULL)
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= st->config.devices)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return by_index(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    return by_index(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    struct sim_state *st = nv_state();
    if (st == NULL)
        return NVML_ERROR_UNINITIALIZED;
    if (uuid == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < st->config.devices; i++) {
        if (strcasecmp(st->config.uuids[i], uuid) == 0) {
            *device = &g_devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    struct sim_state *st = nv_state();
    if (st == NULL)
        return NVML_ERROR_UNINITIALIZED;
    if (pciBusId == NULL || device == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned domain = 0, bus = 0, slot = 0, function = 0;
    if (sscanf(pciBusId, "%x:%x:%x.%x", &domain, &bus, &slot, &function) != 4) {
        domain = 0;
        if (sscanf(pciBusId, "%x:%x.%x", &bus, &slot, &function) != 3)
            return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (domain == 0 && slot == 0 && function == 0 && bus >= 1 && bus <= st->config.devices) {
        *device = &g_devices[bus - 1];
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_FOUND;
}

int vgpuSimInjectXid(unsigned int index, unsigned long long xid)
{
    struct sim_state *st = sim_state_get();
    if (st == NULL)
        return -1;
    if (index >= st->config.devices) {
        fprintf(stderr, "vgpu-sim: no device %u (the machine has %u)\n", index, st->config.devices);
        return -1;
    }
    sim_xid_post(st, index, xid);
    return 0;
}

int vgpuSimSetLost(unsigned int index, int lost)
{
    struct sim_state *st = sim_state_get();
    if (st == NULL)
        return -1;
    if (index >= st->config.devices) {
        fprintf(stderr, "vgpu-sim: no device %u (the machine has %u)\n", index, st->config.devices);
        return -1;
    }
    atomic_store(&st->devices[index].lost, lost != 0);
    return 0;
}
