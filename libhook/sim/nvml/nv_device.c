/*
 * nv_device.c - static device properties: name, UUID, PCI, attributes,
 * compute capability, MIG mode, topology, and fixed temperature and power
 * readings.
 *
 * Topology: devices 2k and 2k+1 form a linked pair (NVML_TOPOLOGY_SINGLE,
 * one PCIe switch); any other two devices meet at NVML_TOPOLOGY_NODE.
 */
#include <stdio.h>
#include <string.h>

#include "nv_sim.h"

#define SIM_PCI_DEVICE_ID 0x233010deu    /* device 0x2330, vendor NVIDIA */
#define SIM_PCI_SUBSYSTEM_ID 0x16c110deu
#define SIM_TEMPERATURE_C 40u
#define SIM_POWER_MW 100000u
#define NVML_TEMPERATURE_GPU 0
/* The simulated CUDA driver's model (sim/cuda/cu_device.c): one GPU, one
 * compute capability, whichever library is asked. */
#define SIM_CC_MAJOR 9
#define SIM_CC_MINOR 0

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *value)
{
    if (out == NULL || length == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) >= length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t device_index(nvmlDevice_t device, unsigned int *index)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    if (r == NVML_SUCCESS && index == NULL)
        r = NVML_ERROR_INVALID_ARGUMENT;
    if (r == NVML_SUCCESS)
        *index = i;
    return r;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    return device_index(device, index);
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    return device_index(device, minorNumber); /* /dev/nvidia<index> */
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    return r != NVML_SUCCESS ? r : copy_string(name, length, st->config.name);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    return r != NVML_SUCCESS ? r : copy_string(uuid, length, st->config.uuids[i]);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    if (r != NVML_SUCCESS)
        return r;
    if (pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof(*pci));
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02x:00.0", i + 1);
    snprintf(pci->busId, sizeof(pci->busId), "00000000:%02x:00.0", i + 1);
    pci->bus = i + 1;
    pci->pciDeviceId = SIM_PCI_DEVICE_ID;
    pci->pciSubSystemId = SIM_PCI_SUBSYSTEM_ID;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    if (r != NVML_SUCCESS)
        return r;
    if (attributes == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *attributes = (nvmlDeviceAttributes_t){
        .multiprocessorCount = st->config.sms,
        .sharedCopyEngineCount = 7,
        .sharedDecoderCount = 7,
        .sharedJpegCount = 7,
        .sharedOfaCount = 1,
        .gpuInstanceSliceCount = 7,
        .computeInstanceSliceCount = 7,
        .memorySizeMB = st->config.memory >> 20,
    };
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    if (r != NVML_SUCCESS)
        return r;
    if (major == NULL || minor == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = SIM_CC_MAJOR;
    *minor = SIM_CC_MINOR;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    if (r != NVML_SUCCESS)
        return r;
    if (currentMode == NULL || pendingMode == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *currentMode = *pendingMode = (st->config.mig_mask >> i) & 1u;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                 nvmlGpuTopologyLevel_t *pathInfo)
{
    struct sim_state *st;
    unsigned a, b;
    nvmlReturn_t r = nv_device(device1, &st, &a);
    if (r == NVML_SUCCESS)
        r = nv_device(device2, &st, &b);
    if (r != NVML_SUCCESS)
        return r;
    if (pathInfo == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (a == b)
        *pathInfo = NVML_TOPOLOGY_INTERNAL;
    else
        *pathInfo = a / 2 == b / 2 ? NVML_TOPOLOGY_SINGLE : NVML_TOPOLOGY_NODE;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    if (r != NVML_SUCCESS)
        return r;
    if (temp == NULL || sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = SIM_TEMPERATURE_C;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    if (r != NVML_SUCCESS)
        return r;
    if (power == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *power = SIM_POWER_MW;
    return NVML_SUCCESS;
}
