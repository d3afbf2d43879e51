/*
 * devmap.c - which budget entry a device draws from.
 *
 * vGPU mode: the control block lists the vGPU's GPUs by UUID, so a CUDA
 * device is matched through cuDeviceGetUuid (whatever CUDA_VISIBLE_DEVICES
 * did to ordinals); a device that is not listed gets limit 0. Standalone:
 * the seed's interface numbers devices by CUDA ordinal. NVML devices are
 * matched by UUID in both modes.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "vgpu.h"

/* CUdevice values are ordinals; 0 in the cache means "not looked up yet",
 * anything else is the index + 3. */
#define CACHE_SIZE 64
#define CACHE_BIAS 3
static _Atomic int cache[CACHE_SIZE];
static pthread_mutex_t discover_lock = PTHREAD_MUTEX_INITIALIZER;
static bool discovered;

int devmap_cuda_uuid(CUdevice dev, char out[VGPU_UUID_LEN])
{
    CUuuid uuid;
    CUresult rc = CUDA_ERROR_NOT_FOUND;
    if (vgpu_real_cuda.cuDeviceGetUuid_v2 != NULL)
        rc = vgpu_real_cuda.cuDeviceGetUuid_v2(&uuid, dev);
    else if (vgpu_real_cuda.cuDeviceGetUuid != NULL)
        rc = vgpu_real_cuda.cuDeviceGetUuid(&uuid, dev);
    if (rc != CUDA_SUCCESS) {
        vgpu_error_set("cuDeviceGetUuid(%d): error %d", dev, rc);
        return -1;
    }
    const unsigned char *b = (const unsigned char *)uuid.bytes;
    snprintf(out, VGPU_UUID_LEN,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
             b[15]);
    return 0;
}

static int control_index(const char *uuid)
{
    uint32_t count = vgpu.control->device_count;
    for (uint32_t i = 0; i < count; i++)
        if (strncasecmp(vgpu.control->devices[i].uuid, uuid, VGPU_UUID_LEN) == 0)
            return (int)i;
    return VGPU_DEV_FOREIGN;
}

/* Standalone: record the UUID of each ordinal the environment did not name,
 * so the daemon and the NVML view can tell the devices apart. */
static void discover_standalone(void)
{
    int count = 0;
    pthread_mutex_lock(&discover_lock);
    if (discovered || vgpu_real_cuda.cuDeviceGetCount == NULL ||
        vgpu_real_cuda.cuDeviceGetCount(&count) != CUDA_SUCCESS)
        goto out;
    if (count > VGPU_MAX_DEVICES)
        count = VGPU_MAX_DEVICES;
    for (int i = (int)vgpu.env.uuid_count; i < count; i++) {
        CUdevice dev;
        char uuid[VGPU_UUID_LEN];
        if (vgpu_real_cuda.cuDeviceGet(&dev, i) == CUDA_SUCCESS && devmap_cuda_uuid(dev, uuid) == 0)
            memcpy(vgpu.usage->uuids[i], uuid, VGPU_UUID_LEN);
    }
    uint32_t known = vgpu.env.uuid_count > (unsigned)count ? vgpu.env.uuid_count : (uint32_t)count;
    atomic_store(&vgpu.usage->device_count, known);
    discovered = true;
out:
    pthread_mutex_unlock(&discover_lock);
}

static int lookup(CUdevice dev)
{
    if (vgpu.mode == VGPU_MODE_STANDALONE) {
        discover_standalone();
        return dev >= 0 && dev < VGPU_MAX_DEVICES ? dev : VGPU_DEV_UNTRACKED;
    }
    char uuid[VGPU_UUID_LEN];
    if (devmap_cuda_uuid(dev, uuid) != 0) {
        log_warn("device %d: %s; treated as outside the vGPU", dev, vgpu_error());
        return VGPU_DEV_FOREIGN;
    }
    int index = control_index(uuid);
    if (index == VGPU_DEV_FOREIGN)
        log_warn("device %d (%s) is not part of vGPU %.*s: no memory on it", dev, uuid,
                 VGPU_ID_LEN, vgpu.control->vgpu_id);
    return index;
}

int devmap_index(CUdevice dev)
{
    if (!vgpu_limited())
        return VGPU_DEV_UNTRACKED;
    if (dev < 0 || dev >= CACHE_SIZE)
        return lookup(dev);
    int cached = atomic_load_explicit(&cache[dev], memory_order_relaxed);
    if (cached != 0)
        return cached - CACHE_BIAS;
    int index = lookup(dev);
    atomic_store_explicit(&cache[dev], index + CACHE_BIAS, memory_order_relaxed);
    return index;
}

int devmap_current(CUdevice *dev_out)
{
    CUdevice dev;
    if (vgpu_real_cuda.cuCtxGetDevice == NULL ||
        vgpu_real_cuda.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
        return VGPU_DEV_UNTRACKED;
    if (dev_out != NULL)
        *dev_out = dev;
    return devmap_index(dev);
}

bool devmap_stream_capturing(CUstream h, bool ptsz)
{
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult rc = ptsz && vgpu_real_cuda.cuStreamIsCapturing_ptsz != NULL
                      ? vgpu_real_cuda.cuStreamIsCapturing_ptsz(h, &status)
                      : vgpu_real_cuda.cuStreamIsCapturing(h, &status);
    return rc == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
}

int devmap_ctx_device(CUcontext ctx, CUdevice *dev)
{
    CUcontext current = NULL;
    if (vgpu_real_cuda.cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == ctx)
        return vgpu_real_cuda.cuCtxGetDevice(dev) == CUDA_SUCCESS ? 0 : -1;
    if (vgpu_real_cuda.cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS)
        return -1;
    CUresult rc = vgpu_real_cuda.cuCtxGetDevice(dev);
    vgpu_real_cuda.cuCtxPopCurrent_v2(&current);
    return rc == CUDA_SUCCESS ? 0 : -1;
}

int devmap_nvml(nvmlDevice_t dev)
{
    char uuid[VGPU_UUID_LEN];
    if (vgpu_real_nvml.nvmlDeviceGetUUID == NULL ||
        vgpu_real_nvml.nvmlDeviceGetUUID(dev, uuid, sizeof(uuid)) != NVML_SUCCESS)
        return VGPU_DEV_UNTRACKED;
    if (vgpu.mode == VGPU_MODE_VGPU)
        return control_index(uuid);
    uint32_t count = atomic_load(&vgpu.usage->device_count);
    for (uint32_t i = 0; i < count && i < VGPU_MAX_DEVICES; i++)
        if (strncasecmp(vgpu.usage->uuids[i], uuid, VGPU_UUID_LEN) == 0)
            return (int)i;
    return VGPU_DEV_UNTRACKED;
}

const char *devmap_uuid(int index)
{
    if (index < 0 || index >= VGPU_MAX_DEVICES)
        return "(not in the vGPU)";
    const char *uuid = vgpu.mode == VGPU_MODE_VGPU ? vgpu.control->devices[index].uuid
                                                    : vgpu.usage->uuids[index];
    return uuid[0] != '\0' ? uuid : "(unknown uuid)";
}

void devmap_reset(void)
{
    pthread_mutex_init(&discover_lock, NULL);
}
