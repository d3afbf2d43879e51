/*
 * cu_array.c - CUDA arrays and mipmapped arrays: opaque device memory of
 * width * height * depth * channels * element size bytes (each level of a
 * mipmap halving every extent, padded as below), charged to the device like
 * any allocation.
 */
#include <stdlib.h>

#include "cu_sim.h"

/* A real driver lays each mipmap level out in tiles of its own: on an H100
 * (driver 580) a layered mipmap took about 3 % more than its texels. The
 * simulator rounds each level of each layer up to 4 KiB, so that a hook
 * that counts texels alone is caught short. */
#define MIPMAP_LEVEL_ALIGN ((size_t)4096)

struct CUarray_st {
    uint32_t tag;
    uintptr_t backing; /* table entry of kind CU_ALLOC_ARRAY */
};

struct CUmipmappedArray_st {
    uint32_t tag;
    uintptr_t backing;
};

static size_t element_size(CUarray_format format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

static size_t at_least_one(size_t n)
{
    return n > 0 ? n : 1;
}

/* Bytes of one level, 0 if the descriptor is invalid or overflows. */
static size_t level_bytes(size_t width, size_t height, size_t depth, CUarray_format format, unsigned channels)
{
    size_t elem = element_size(format);
    if (elem == 0 || width == 0 || (channels != 1 && channels != 2 && channels != 4))
        return 0;
    size_t bytes = elem * channels;
    size_t dims[3] = {width, at_least_one(height), at_least_one(depth)};
    for (int i = 0; i < 3; i++) {
        if (dims[i] > SIZE_MAX / bytes)
            return 0;
        bytes *= dims[i];
    }
    return bytes;
}

/* Charge and back `bytes` in the current context; returns the backing. */
static CUresult back(size_t bytes, uintptr_t *out)
{
    CUcontext ctx;
    CUresult r = cu_current(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct cu_alloc *a;
    r = cu_alloc_new(ctx, ctx->dev, bytes, CU_ALLOC_ARRAY, &a);
    if (r == CUDA_SUCCESS)
        *out = a->base;
    return r;
}

static CUresult array_create(CUarray *pHandle, size_t bytes)
{
    if (pHandle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUarray a = malloc(sizeof(*a));
    if (a == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = back(bytes, &a->backing);
    if (r != CUDA_SUCCESS) {
        free(a);
        return r;
    }
    a->tag = CU_TAG_ARRAY;
    *pHandle = a;
    return CUDA_SUCCESS;
}

static CUresult array_2d(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    if (d == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return array_create(pHandle, level_bytes(d->Width, d->Height, 0, d->Format, d->NumChannels));
}

static CUresult array_3d(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    if (d == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return array_create(pHandle, level_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels));
}

CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    return array_2d(pHandle, pAllocateArray);
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    return array_2d(pHandle, pAllocateArray);
}

CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    return array_3d(pHandle, pAllocateArray);
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    return array_3d(pHandle, pAllocateArray);
}

CUresult cuArrayDestroy(CUarray hArray)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (hArray == NULL || hArray->tag != CU_TAG_ARRAY)
        return CUDA_ERROR_INVALID_HANDLE;
    cu_alloc_free(hArray->backing, CU_KIND(CU_ALLOC_ARRAY)); /* gone already if its context was */
    hArray->tag = CU_TAG_DEAD;
    free(hArray);
    return CUDA_SUCCESS;
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                unsigned int numMipmapLevels)
{
    if (pHandle == NULL || d == NULL || numMipmapLevels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* As the driver: the levels are clamped to the full chain of the
     * extent, and layers (and a cubemap's faces) are not halved. */
    bool layers = (d->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
    size_t w = d->Width, h = d->Height, depth = d->Depth;
    size_t extent = w > h ? w : h;
    if (!layers && depth > extent)
        extent = depth;
    unsigned chain = 1;
    while (extent >>= 1)
        chain++;
    if (numMipmapLevels > chain)
        numMipmapLevels = chain;
    size_t total = 0, slices = layers ? at_least_one(depth) : 1;
    for (unsigned level = 0; level < numMipmapLevels; level++) {
        size_t slice = level_bytes(w, h, layers ? 1 : depth, d->Format, d->NumChannels);
        if (slice == 0 || slice > SIZE_MAX - MIPMAP_LEVEL_ALIGN)
            return CUDA_ERROR_INVALID_VALUE;
        slice = (slice + MIPMAP_LEVEL_ALIGN - 1) / MIPMAP_LEVEL_ALIGN * MIPMAP_LEVEL_ALIGN;
        if (slice > SIZE_MAX / slices || slice * slices > SIZE_MAX - total)
            return CUDA_ERROR_INVALID_VALUE;
        total += slice * slices;
        w = at_least_one(w / 2);
        h = h > 1 ? h / 2 : h;
        depth = depth > 1 && !layers ? depth / 2 : depth;
    }
    CUmipmappedArray m = malloc(sizeof(*m));
    if (m == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = back(total, &m->backing);
    if (r != CUDA_SUCCESS) {
        free(m);
        return r;
    }
    m->tag = CU_TAG_ARRAY;
    *pHandle = m;
    return CUDA_SUCCESS;
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (hMipmappedArray == NULL || hMipmappedArray->tag != CU_TAG_ARRAY)
        return CUDA_ERROR_INVALID_HANDLE;
    cu_alloc_free(hMipmappedArray->backing, CU_KIND(CU_ALLOC_ARRAY));
    hMipmappedArray->tag = CU_TAG_DEAD;
    free(hMipmappedArray);
    return CUDA_SUCCESS;
}
