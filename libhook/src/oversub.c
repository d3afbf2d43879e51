/*
 * oversub.c - oversubscription: what the device cannot hold, within the
 * vGPU's budget, is served from pinned host memory mapped into the device's
 * address space (never from managed memory: managed memory requested beyond
 * what the device has free can hang a GPU). The caller has reserved the
 * bytes; they count against the limit like any allocation.
 */
#include "vgpu.h"

CUresult oversub_alloc(CUdeviceptr *dptr, uint64_t bytes, void **host)
{
    void *p = NULL;
    CUresult rc = CUDA_ERROR_NOT_FOUND;
    __typeof__(vgpu_real_cuda.cuMemHostGetDevicePointer_v2) get_dptr =
        vgpu_real_cuda.cuMemHostGetDevicePointer_v2 ? vgpu_real_cuda.cuMemHostGetDevicePointer_v2
                                                    : vgpu_real_cuda.cuMemHostGetDevicePointer;
    if (vgpu_real_cuda.cuMemHostAlloc == NULL || get_dptr == NULL)
        goto fail;
    rc = vgpu_real_cuda.cuMemHostAlloc(&p, bytes,
                                       CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
    if (rc != CUDA_SUCCESS)
        goto fail;
    rc = get_dptr(dptr, p, 0);
    if (rc != CUDA_SUCCESS)
        goto fail;
    *host = p;
    return CUDA_SUCCESS;
fail:
    if (p != NULL)
        vgpu_real_cuda.cuMemFreeHost(p);
    log_verbose("host-backed allocation of %llu bytes failed (error %d)",
                (unsigned long long)bytes, rc);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult oversub_free(void *host)
{
    return vgpu_real_cuda.cuMemFreeHost != NULL ? vgpu_real_cuda.cuMemFreeHost(host)
                                                : CUDA_ERROR_NOT_FOUND;
}
