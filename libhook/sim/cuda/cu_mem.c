/*
 * cu_mem.c - device memory entry points: allocation, free, information
 * and pointer queries.
 */
#include <limits.h>
#include <string.h>

#include "cu_sim.h"

#define PITCH_ALIGNMENT 512u /* the texture pitch alignment of current GPUs */

#define CU_POINTER_ATTRIBUTE_CONTEXT 1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_DEVICE_POINTER 3
#define CU_POINTER_ATTRIBUTE_HOST_POINTER 4
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_POINTER_ATTRIBUTE_RANGE_START_ADDR 11
#define CU_POINTER_ATTRIBUTE_RANGE_SIZE 12
#define CU_MEMORYTYPE_HOST 1u
#define CU_MEMORYTYPE_DEVICE 2u

static CUresult alloc_in_current(CUdeviceptr *dptr, size_t bytes, enum cu_alloc_kind kind)
{
    CUcontext ctx;
    CUresult r = cu_current(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (dptr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct cu_alloc *a;
    r = cu_alloc_new(ctx, ctx->dev, bytes, kind, &a);
    if (r == CUDA_SUCCESS)
        *dptr = a->base;
    return r;
}

CUresult cuMemAlloc(CUdeviceptr *dptr, unsigned int bytesize)
{
    return alloc_in_current(dptr, bytesize, CU_ALLOC_DEVICE);
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return alloc_in_current(dptr, bytesize, CU_ALLOC_DEVICE);
}

static CUresult alloc_pitch(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned elem)
{
    if (pitch == NULL || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
        return CUDA_ERROR_INVALID_VALUE;
    if (width > SIZE_MAX - PITCH_ALIGNMENT)
        return CUDA_ERROR_INVALID_VALUE;
    size_t row = (width + PITCH_ALIGNMENT - 1) / PITCH_ALIGNMENT * PITCH_ALIGNMENT;
    if (height > SIZE_MAX / row)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = alloc_in_current(dptr, row * height, CU_ALLOC_DEVICE);
    if (r == CUDA_SUCCESS)
        *pitch = row;
    return r;
}

CUresult cuMemAllocPitch(CUdeviceptr *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                         unsigned int Height, unsigned int ElementSizeBytes)
{
    size_t pitch = 0;
    if (pPitch == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = alloc_pitch(dptr, &pitch, WidthInBytes, Height, ElementSizeBytes);
    if (r == CUDA_SUCCESS)
        *pPitch = (unsigned int)pitch;
    return r;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    return alloc_pitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_in_current(dptr, bytesize, CU_ALLOC_MANAGED);
}

static CUresult mem_free(CUdeviceptr dptr)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS || dptr == 0)
        return r;
    return cu_alloc_free(dptr, CU_KIND(CU_ALLOC_DEVICE) | CU_KIND(CU_ALLOC_MANAGED));
}

CUresult cuMemFree(CUdeviceptr dptr)
{
    return mem_free(dptr);
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    return mem_free(dptr);
}

static CUresult mem_info(size_t *free_bytes, size_t *total)
{
    CUcontext ctx;
    CUresult r = cu_current(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (free_bytes == NULL || total == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t capacity = cu_proc->st->config.memory;
    uint64_t used = sim_mem_device_used(cu_proc->st, ctx->dev);
    *total = capacity;
    *free_bytes = used < capacity ? capacity - used : 0;
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    size_t f = 0, t = 0;
    if (free == NULL || total == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = mem_info(&f, &t);
    if (r == CUDA_SUCCESS) {
        *free = f > UINT_MAX ? UINT_MAX : (unsigned int)f;
        *total = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
    }
    return r;
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    return mem_info(free, total);
}

/* A copy of the entry holding ptr, if it is addressable memory. */
static CUresult lookup(CUdeviceptr ptr, struct cu_alloc *out)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&cu_lock);
    struct cu_alloc *a = cu_table_find(ptr);
    if (a != NULL && a->kind != CU_ALLOC_ARRAY)
        *out = *a;
    else
        r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&cu_lock);
    return r;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    struct cu_alloc a;
    CUresult r = lookup(dptr, &a);
    if (r != CUDA_SUCCESS)
        return CUDA_ERROR_NOT_FOUND;
    if (pbase != NULL)
        *pbase = a.base;
    if (psize != NULL)
        *psize = a.size;
    return CUDA_SUCCESS;
}

static bool is_host_memory(const struct cu_alloc *a)
{
    return a->kind == CU_ALLOC_HOST || a->kind == CU_ALLOC_REGISTERED;
}

CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    struct cu_alloc a;
    if (data == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = lookup(ptr, &a);
    if (r != CUDA_SUCCESS)
        return r;
    switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = a.ctx;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = is_host_memory(&a) ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = ptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!is_host_memory(&a) && a.kind != CU_ALLOC_MANAGED)
            return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)ptr;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = cu_ordinal_of(a.dev);
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = a.base;
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = a.size;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}
