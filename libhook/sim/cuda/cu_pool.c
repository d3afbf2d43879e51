/*
 * cu_pool.c - stream-ordered allocation and memory pools.
 *
 * A pool keeps what is freed to it (still charged to the device, so the
 * "held by the pool" state shows in device used memory) and reuses it for
 * later allocations. At each synchronisation a pool gives back what it
 * holds above its release threshold (0 by default: everything), and
 * cuMemPoolTrimTo gives back down to a given size. Held blocks stay in the
 * allocation table, flagged in_pool.
 */
#include <stdlib.h>
#include <string.h>

#include "cu_sim.h"

#define CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES 1
#define CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES 3
#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5
#define CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH 6
#define CU_MEMPOOL_ATTR_USED_MEM_CURRENT 7
#define CU_MEMPOOL_ATTR_USED_MEM_HIGH 8

struct CUmemPoolHandle_st {
    uint32_t tag;
    unsigned dev;
    bool is_default;
    bool destroyed; /* kept: outstanding allocations still name it */
    int reuse[4];   /* the REUSE_* flags, stored and reported */
    uint64_t threshold;
    uint64_t held; /* freed to the pool, not yet given back */
    uint64_t used, used_high, reserved_high;
    struct CUmemPoolHandle_st *next;
};

static struct CUmemPoolHandle_st *g_pools; /* guarded by cu_lock */

static CUmemoryPool pool_new(unsigned dev, bool is_default)
{
    CUmemoryPool p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->tag = CU_TAG_POOL;
    p->dev = dev;
    p->is_default = is_default;
    p->reuse[1] = p->reuse[2] = p->reuse[3] = 1;
    p->next = g_pools;
    g_pools = p;
    return p;
}

static bool pool_valid(CUmemoryPool p)
{
    return p != NULL && p->tag == CU_TAG_POOL && !p->destroyed;
}

/* Give back held blocks, largest first, until at most `keep` is held. */
static void trim(CUmemoryPool p, uint64_t keep)
{
    while (p->held > keep) {
        struct cu_alloc *largest = NULL;
        for (size_t i = 0; i < cu_table_len(); i++) {
            struct cu_alloc *a = cu_table_at(i);
            if (a->pool == p && a->in_pool && (largest == NULL || a->size > largest->size))
                largest = a;
        }
        if (largest == NULL)
            break;
        cu_alloc_release(largest);
    }
}

void cu_pools_release_on_sync(void)
{
    pthread_mutex_lock(&cu_lock);
    for (CUmemoryPool p = g_pools; p != NULL; p = p->next)
        if (!p->destroyed && p->held > p->threshold)
            trim(p, p->threshold);
    pthread_mutex_unlock(&cu_lock);
}

void cu_pool_note_release(const struct cu_alloc *a)
{
    if (a->in_pool)
        a->pool->held -= a->size;
    else
        a->pool->used -= a->size;
}

void cu_pool_take_back(struct cu_alloc *a)
{
    a->in_pool = true;
    a->pool->used -= a->size;
    a->pool->held += a->size;
}

static void note_use(CUmemoryPool p, uint64_t bytes)
{
    p->used += bytes;
    if (p->used > p->used_high)
        p->used_high = p->used;
    if (p->used + p->held > p->reserved_high)
        p->reserved_high = p->used + p->held;
}

/* The smallest held block that fits, taken out of the pool. */
static struct cu_alloc *reuse(CUmemoryPool p, size_t bytes)
{
    struct cu_alloc *best = NULL;
    for (size_t i = 0; i < cu_table_len(); i++) {
        struct cu_alloc *a = cu_table_at(i);
        if (a->pool == p && a->in_pool && a->size >= bytes && (best == NULL || a->size < best->size))
            best = a;
    }
    if (best != NULL) {
        best->in_pool = false;
        p->held -= best->size;
        note_use(p, best->size);
    }
    return best;
}

static CUresult default_pool(struct cu_device *d, CUmemoryPool *out)
{
    pthread_mutex_lock(&cu_lock);
    if (d->default_pool == NULL)
        d->default_pool = pool_new(d->dev, true);
    *out = d->default_pool;
    pthread_mutex_unlock(&cu_lock);
    return *out != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult alloc_from(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream h, bool per_thread)
{
    CUstream s;
    CUresult r = cu_stream_resolve(h, per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    if (dptr == NULL || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (pool == NULL) {
        struct cu_device *d = &cu_proc->devices[s->ctx->ordinal];
        pool = d->current_pool;
        if (pool == NULL && (r = default_pool(d, &pool)) != CUDA_SUCCESS)
            return r;
    }
    pthread_mutex_lock(&cu_lock);
    bool valid = pool_valid(pool);
    struct cu_alloc *a = valid ? reuse(pool, bytes) : NULL;
    pthread_mutex_unlock(&cu_lock);
    if (!valid)
        return CUDA_ERROR_INVALID_HANDLE;
    if (a == NULL) {
        r = cu_alloc_new(s->ctx, pool->dev, bytes, CU_ALLOC_DEVICE, &a);
        if (r != CUDA_SUCCESS)
            return r;
        pthread_mutex_lock(&cu_lock);
        a->pool = pool;
        note_use(pool, a->size);
        pthread_mutex_unlock(&cu_lock);
    }
    *dptr = a->base;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_from(dptr, bytesize, NULL, hStream, false);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_from(dptr, bytesize, NULL, hStream, true);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    return pool == NULL ? CUDA_ERROR_INVALID_VALUE : alloc_from(dptr, bytesize, pool, hStream, false);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    return pool == NULL ? CUDA_ERROR_INVALID_VALUE : alloc_from(dptr, bytesize, pool, hStream, true);
}

static CUresult free_async(CUdeviceptr dptr, CUstream h, bool per_thread)
{
    CUstream s;
    CUresult r = cu_stream_resolve(h, per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&cu_lock);
    struct cu_alloc *a = cu_table_base(dptr);
    if (a == NULL || a->kind != CU_ALLOC_DEVICE || a->in_pool)
        r = CUDA_ERROR_INVALID_VALUE;
    else if (a->pool != NULL)
        cu_pool_take_back(a); /* a destroyed pool keeps it too, as a real driver 580 does */
    else
        cu_alloc_release(a);
    pthread_mutex_unlock(&cu_lock);
    return r;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, false);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, true);
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (pool == NULL || poolProps == NULL || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    struct cu_device *d;
    if (cu_device_of(poolProps->location.id, &d) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&cu_lock);
    *pool = pool_new(d->dev, false);
    pthread_mutex_unlock(&cu_lock);
    return *pool != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&cu_lock);
    if (!pool_valid(pool) || pool->is_default) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        trim(pool, 0);
        pool->destroyed = true;
        for (int i = 0; i < cu_proc->count; i++)
            if (cu_proc->devices[i].current_pool == pool)
                cu_proc->devices[i].current_pool = NULL;
    }
    pthread_mutex_unlock(&cu_lock);
    return r;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&cu_lock);
    if (pool_valid(pool))
        trim(pool, minBytesToKeep);
    else
        r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&cu_lock);
    return r;
}

static CUresult pool_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value, bool set)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (value == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&cu_lock);
    if (!pool_valid(pool)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (attr >= CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES &&
               attr <= CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES) {
        if (set)
            pool->reuse[attr] = *(int *)value;
        else
            *(int *)value = pool->reuse[attr];
    } else if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) {
        if (set)
            pool->threshold = *(cuuint64_t *)value;
        else
            *(cuuint64_t *)value = pool->threshold;
    } else if (attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH || attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH) {
        uint64_t *high = attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH ? &pool->used_high : &pool->reserved_high;
        if (set && *(cuuint64_t *)value != 0)
            r = CUDA_ERROR_INVALID_VALUE; /* a high-water mark can only be reset to 0 */
        else if (set)
            *high = 0;
        else
            *(cuuint64_t *)value = *high;
    } else if (!set && attr == CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) {
        *(cuuint64_t *)value = pool->used + pool->held;
    } else if (!set && attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT) {
        *(cuuint64_t *)value = pool->used;
    } else {
        r = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&cu_lock);
    return r;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    return pool_attribute(pool, attr, value, true);
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    return pool_attribute(pool, attr, value, false);
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    struct cu_device *d;
    CUresult r = cu_device_of(dev, &d);
    if (r != CUDA_SUCCESS)
        return r;
    if (pool_out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return default_pool(d, pool_out);
}

CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    struct cu_device *d;
    CUresult r = cu_device_of(dev, &d);
    if (r != CUDA_SUCCESS)
        return r;
    if (pool == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&cu_lock);
    CUmemoryPool current = d->current_pool;
    pthread_mutex_unlock(&cu_lock);
    if (current == NULL)
        return default_pool(d, pool);
    *pool = current;
    return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    struct cu_device *d;
    CUresult r = cu_device_of(dev, &d);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&cu_lock);
    if (!pool_valid(pool))
        r = CUDA_ERROR_INVALID_VALUE;
    else if (pool->dev != d->dev)
        r = CUDA_ERROR_INVALID_DEVICE;
    else
        d->current_pool = pool;
    pthread_mutex_unlock(&cu_lock);
    return r;
}
