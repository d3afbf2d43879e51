/*
 * cu_device.c - device queries: the simulated devices look like one GPU
 * model (compute capability 9.0) with the configured SM count, memory,
 * name and UUIDs, on fake PCI bus ids 0000:<index+1>:00.0.
 */
#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "cu_sim.h"

#define SIM_CC_MAJOR 9
#define SIM_CC_MINOR 0

static const struct sim_config *config(void)
{
    return &cu_proc->st->config;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    struct cu_device *d;
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_device_of(ordinal, &d);
    if (r == CUDA_SUCCESS)
        *device = ordinal;
    return r;
}

CUresult cuDeviceGetCount(int *count)
{
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_ready();
    if (r == CUDA_SUCCESS)
        *count = cu_proc->count;
    return r;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    struct cu_device *d;
    CUresult r = cu_device_of(dev, &d);
    if (r != CUDA_SUCCESS)
        return r;
    if (name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", config()->name);
    return CUDA_SUCCESS;
}

/* The 16 bytes behind "GPU-xxxxxxxx-xxxx-...": hex digits in order. */
static void uuid_bytes(const char *text, CUuuid *out)
{
    memset(out, 0, sizeof(*out));
    unsigned nibble = 0;
    for (const char *p = text + 4; *p != '\0' && nibble < 32; p++) {
        if (!isxdigit((unsigned char)*p))
            continue;
        int v = isdigit((unsigned char)*p) ? *p - '0' : tolower((unsigned char)*p) - 'a' + 10;
        out->bytes[nibble / 2] = (char)(out->bytes[nibble / 2] | (v << (nibble % 2 ? 0 : 4)));
        nibble++;
    }
}

static CUresult get_uuid(CUuuid *uuid, CUdevice dev)
{
    struct cu_device *d;
    CUresult r = cu_device_of(dev, &d);
    if (r != CUDA_SUCCESS)
        return r;
    if (uuid == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uuid_bytes(config()->uuids[d->dev], uuid);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return get_uuid(uuid, dev);
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return get_uuid(uuid, dev);
}

static CUresult total_mem(size_t *bytes, CUdevice dev)
{
    struct cu_device *d;
    CUresult r = cu_device_of(dev, &d);
    if (r != CUDA_SUCCESS)
        return r;
    if (bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = config()->memory;
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t total = 0;
    if (bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = total_mem(&total, dev);
    if (r == CUDA_SUCCESS)
        *bytes = total > UINT_MAX ? UINT_MAX : (unsigned int)total;
    return r;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    return total_mem(bytes, dev);
}

struct attribute_value {
    CUdevice_attribute attribute;
    int value;
};

/* Plausible values for a current data-centre GPU; SMs come from config. */
static const struct attribute_value ATTRIBUTES[] = {
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024},
    {2, 1024},       /* MAX_BLOCK_DIM_X */
    {3, 1024},       /* MAX_BLOCK_DIM_Y */
    {4, 64},         /* MAX_BLOCK_DIM_Z */
    {5, INT_MAX},    /* MAX_GRID_DIM_X */
    {6, 65535},      /* MAX_GRID_DIM_Y */
    {7, 65535},      /* MAX_GRID_DIM_Z */
    {8, 49152},      /* MAX_SHARED_MEMORY_PER_BLOCK */
    {9, 65536},      /* TOTAL_CONSTANT_MEMORY */
    {10, 32},        /* WARP_SIZE */
    {12, 65536},     /* MAX_REGISTERS_PER_BLOCK */
    {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000},
    {15, 1},         /* GPU_OVERLAP */
    {CU_DEVICE_ATTRIBUTE_INTEGRATED, 0},
    {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1},
    {20, 0},         /* COMPUTE_MODE: default */
    {31, 1},         /* CONCURRENT_KERNELS */
    {32, 1},         /* ECC_ENABLED */
    {CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0},
    {36, 2619000},   /* MEMORY_CLOCK_RATE */
    {37, 5120},      /* GLOBAL_MEMORY_BUS_WIDTH */
    {38, 52428800},  /* L2_CACHE_SIZE */
    {39, 2048},      /* MAX_THREADS_PER_MULTIPROCESSOR */
    {40, 3},         /* ASYNC_ENGINE_COUNT */
    {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},
    {CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, SIM_CC_MAJOR},
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, SIM_CC_MINOR},
    {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1},
    {CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1, 1},
    {CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, 1},
    {CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, 1},
};

/* The driver's attribute enum ends below this; anything above is invalid. */
#define ATTRIBUTE_LIMIT 200

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    struct cu_device *d;
    CUresult r = cu_device_of(dev, &d);
    if (r != CUDA_SUCCESS)
        return r;
    if (pi == NULL || attrib <= 0 || attrib >= ATTRIBUTE_LIMIT)
        return CUDA_ERROR_INVALID_VALUE;
    if (attrib == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) {
        *pi = (int)config()->sms;
        return CUDA_SUCCESS;
    }
    if (attrib == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) {
        *pi = (int)d->dev + 1;
        return CUDA_SUCCESS;
    }
    *pi = 0; /* an attribute the simulator does not model */
    for (size_t i = 0; i < sizeof(ATTRIBUTES) / sizeof(ATTRIBUTES[0]); i++)
        if (ATTRIBUTES[i].attribute == attrib)
            *pi = ATTRIBUTES[i].value;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    struct cu_device *d;
    CUresult r = cu_device_of(dev, &d);
    if (r != CUDA_SUCCESS)
        return r;
    if (pciBusId == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", d->dev + 1);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (dev == NULL || pciBusId == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned domain = 0, bus = 0, slot = 0, function = 0;
    if (sscanf(pciBusId, "%x:%x:%x.%x", &domain, &bus, &slot, &function) != 4) {
        domain = 0;
        if (sscanf(pciBusId, "%x:%x.%x", &bus, &slot, &function) != 3)
            return CUDA_ERROR_INVALID_VALUE;
    }
    for (int i = 0; i < cu_proc->count; i++) {
        if (domain == 0 && slot == 0 && function == 0 && bus == cu_proc->devices[i].dev + 1) {
            *dev = i;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
    struct cu_device *d;
    CUresult r = cu_device_of(dev, &d);
    if (r != CUDA_SUCCESS)
        return r;
    if (major == NULL || minor == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *major = SIM_CC_MAJOR;
    *minor = SIM_CC_MINOR;
    return CUDA_SUCCESS;
}
