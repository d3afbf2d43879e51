/*
 * cu_host.c - page-locked host memory. It is host memory, not device
 * memory: nothing is charged to the device, and its device pointer is its
 * host address (unified addressing).
 */
#include <sys/mman.h>

#include "cu_sim.h"

#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713

static CUresult host_alloc(void **pp, size_t bytes, unsigned int flags)
{
    CUcontext ctx;
    CUresult r = cu_current(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    unsigned known = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
    if (pp == NULL || bytes == 0 || (flags & ~known) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct cu_alloc entry = {.size = bytes, .kind = CU_ALLOC_HOST, .ctx = ctx, .dev = ctx->dev, .fd = -1};
    void *p = cu_map_anon(bytes, &entry.map_len);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    entry.base = (uintptr_t)p;
    pthread_mutex_lock(&cu_lock);
    struct cu_alloc *a = cu_table_insert(&entry);
    pthread_mutex_unlock(&cu_lock);
    if (a == NULL) {
        munmap(p, entry.map_len);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost(void **pp, unsigned int bytesize)
{
    return host_alloc(pp, bytesize, 0);
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    return host_alloc(pp, bytesize, 0);
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    return host_alloc(pp, bytesize, Flags);
}

CUresult cuMemFreeHost(void *p)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    return cu_alloc_free((uintptr_t)p, CU_KIND(CU_ALLOC_HOST));
}

static CUresult host_register(void *p, size_t bytesize, unsigned int flags)
{
    CUcontext ctx;
    CUresult r = cu_current(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    unsigned known = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | 0x4 /* IOMEMORY */ |
                     0x8 /* READ_ONLY */;
    if (p == NULL || bytesize == 0 || (flags & ~known) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct cu_alloc entry = {
        .base = (uintptr_t)p, .size = bytesize, .kind = CU_ALLOC_REGISTERED, .ctx = ctx, .dev = ctx->dev, .fd = -1};
    pthread_mutex_lock(&cu_lock);
    if (cu_table_overlaps(entry.base, bytesize))
        r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    else if (cu_table_insert(&entry) == NULL)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&cu_lock);
    return r;
}

CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    return host_register(p, bytesize, Flags);
}

CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    return host_register(p, bytesize, Flags);
}

CUresult cuMemHostUnregister(void *p)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    r = cu_alloc_free((uintptr_t)p, CU_KIND(CU_ALLOC_REGISTERED));
    return r == CUDA_SUCCESS ? r : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

static CUresult host_device_pointer(CUdeviceptr *pdptr, void *p, unsigned int flags)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (pdptr == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&cu_lock);
    struct cu_alloc *a = cu_table_find((uintptr_t)p);
    if (a != NULL && (a->kind == CU_ALLOC_HOST || a->kind == CU_ALLOC_REGISTERED))
        *pdptr = (CUdeviceptr)(uintptr_t)p;
    else
        r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&cu_lock);
    return r;
}

CUresult cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    return host_device_pointer(pdptr, p, Flags);
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    return host_device_pointer(pdptr, p, Flags);
}
