/*
 * mem_hooks.c - every road to device memory, its way back, and what the
 * process is told about memory.
 *
 * Each allocation wrapper: reserve the bytes against the vGPU's budget
 * (refuse with CUDA_ERROR_OUT_OF_MEMORY if they do not fit), call the
 * driver, then record the allocation (success) or give the bytes back
 * (failure). Each free: look the allocation up, call the driver, then give
 * the bytes back (or, for pool memory, leave them held by the pool).
 * Memory we did not allocate (IPC-opened, imported, host) is not ours to
 * count: it belongs to its owner, or is not device memory. Memory we
 * exported stays ours to count after its free (share_hooks.c).
 */
#include <limits.h>
#include <stdlib.h>

#include "vgpu.h"

/* A reservation made before a driver call; index VGPU_DEV_UNTRACKED means
 * nothing was reserved and the call is simply forwarded. */
struct reservation {
    int index;
    CUdevice dev;
    uint64_t bytes;
    CUcontext ctx; /* the context the allocation dies with; NULL: none */
};

static CUresult reserve_on(struct reservation *r, CUdevice dev, int index, uint64_t bytes,
                           const char *what)
{
    r->index = index;
    r->dev = dev;
    r->bytes = bytes;
    r->ctx = NULL;
    if (index == VGPU_DEV_UNTRACKED)
        return CUDA_SUCCESS;
    if (index >= 0 && overhead_ensure(dev, index) != 0)
        return budget_oom(index, what, bytes);
    if (budget_reserve(index, bytes) != 0)
        return budget_oom(index, what, bytes);
    return CUDA_SUCCESS;
}

/* Memory of the current context: the driver frees it when that context is
 * destroyed, so the context is recorded with it (mem_ctx_destroyed). */
static CUresult reserve_current(struct reservation *r, uint64_t bytes, const char *what)
{
    CUdevice dev = 0;
    CUcontext ctx = NULL;
    int index = vgpu_limited() ? devmap_current(&dev) : VGPU_DEV_UNTRACKED;
    if (index != VGPU_DEV_UNTRACKED && vgpu_real_cuda.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
        ctx = NULL;
    CUresult rc = reserve_on(r, dev, index, bytes, what);
    r->ctx = ctx;
    return rc;
}

static CUresult reserve_device(struct reservation *r, CUdevice dev, uint64_t bytes,
                               const char *what)
{
    int index = vgpu_limited() ? devmap_index(dev) : VGPU_DEV_UNTRACKED;
    return reserve_on(r, dev, index, bytes, what);
}

/* After the driver call: record what it created, or give the bytes back. */
static CUresult settle(const struct reservation *r, CUresult rc, enum alloc_space space,
                       uint64_t key, const struct alloc_info *extra)
{
    if (r->index == VGPU_DEV_UNTRACKED)
        return rc;
    if (rc != CUDA_SUCCESS) {
        budget_release(r->index, r->bytes);
        return rc;
    }
    struct alloc_info info = *extra;
    info.index = r->index;
    info.ctx = r->ctx;
    if (allocmap_put(space, key, &info) != 0)
        log_error("%s: the allocation stays charged until the process exits", vgpu_error());
    return rc;
}

/* Bytes freed by the driver go back to the budget; pool memory stays held,
 * and exported memory stays charged (another process may still map it). */
static void give_back(const struct alloc_info *info)
{
    if (info->exported)
        share_pin(info);
    else if (info->kind == ALLOC_GRAPH)
        pools_hold(NULL, info->index, info->size);
    else if (info->kind == ALLOC_ASYNC && info->pool != NULL)
        pools_hold(info->pool, info->index, info->size);
    else
        budget_release(info->index, info->size);
}

static bool of_ctx(uint64_t key, const struct alloc_info *info, const void *ctx)
{
    (void)key;
    return info->ctx != NULL && info->ctx == ctx;
}

/* Memory of a context (linear, managed, host-backed, arrays, its limits)
 * dies with it. Pool, graph and VMM memory belong to the device, not to a
 * context, and carry no context. */
void mem_ctx_destroyed(CUcontext ctx)
{
    static const enum alloc_space spaces[] = {SPACE_PTR, SPACE_ARRAY, SPACE_LIMIT};
    if (!vgpu_limited() || ctx == NULL)
        return;
    for (size_t s = 0; s < sizeof(spaces) / sizeof(spaces[0]); s++) {
        struct alloc_entry *gone;
        size_t n = allocmap_take_all(spaces[s], of_ctx, ctx, &gone);
        for (size_t i = 0; i < n; i++)
            give_back(&gone[i].info);
        free(gone);
    }
}

/* Did we allocate `key`? Then it is taken out of the map while the driver
 * frees it (finish_free puts it back if the driver refuses). */
static bool take_own(enum alloc_space space, uint64_t key, struct alloc_info *info)
{
    return vgpu_limited() && key != 0 && allocmap_take(space, key, info) == 0;
}

static CUresult finish_free(bool ours, enum alloc_space space, uint64_t key,
                            const struct alloc_info *info, CUresult rc)
{
    if (!ours)
        return rc;
    if (rc == CUDA_SUCCESS)
        give_back(info);
    else
        allocmap_put(space, key, info);
    return rc;
}

/* ---- linear device memory ----------------------------------------------- */

typedef CUresult (*alloc_call)(CUdeviceptr *dptr, uint64_t bytes);

static CUresult call_alloc_v1(CUdeviceptr *dptr, uint64_t bytes)
{
    return vgpu_real_cuda.cuMemAlloc(dptr, (unsigned int)bytes);
}

static CUresult call_alloc_v2(CUdeviceptr *dptr, uint64_t bytes)
{
    return vgpu_real_cuda.cuMemAlloc_v2(dptr, (size_t)bytes);
}

static CUresult alloc_linear(CUdeviceptr *dptr, uint64_t bytes, alloc_call call)
{
    struct reservation r;
    CUresult rc = reserve_current(&r, bytes, "cuMemAlloc");
    if (rc != CUDA_SUCCESS)
        return rc;
    struct alloc_info info = {.size = bytes, .kind = ALLOC_DEVICE};
    rc = call(dptr, bytes);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && r.index >= 0 && vgpu_oversubscribe()) {
        info.kind = ALLOC_HOST_BACKED;
        rc = oversub_alloc(dptr, bytes, &info.host);
    }
    return settle(&r, rc, SPACE_PTR, rc == CUDA_SUCCESS ? *dptr : 0, &info);
}

VGPU_EXPORT CUresult cuMemAlloc(CUdeviceptr *dptr, unsigned int bytesize)
{
    VGPU_CUDA_ENTER(cuMemAlloc);
    return alloc_linear(dptr, bytesize, call_alloc_v1);
}

VGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    VGPU_CUDA_ENTER(cuMemAlloc_v2);
    return alloc_linear(dptr, bytesize, call_alloc_v2);
}

/* Host-backed pitched memory: rows aligned like the driver's. */
#define HOST_PITCH_ALIGN 512u

typedef CUresult (*pitch_call)(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                               unsigned int elem);

static CUresult call_pitch_v1(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                              unsigned int elem)
{
    unsigned int pitch32 = 0;
    CUresult rc = vgpu_real_cuda.cuMemAllocPitch(dptr, &pitch32, (unsigned int)width,
                                                 (unsigned int)height, elem);
    *pitch = pitch32;
    return rc;
}

static CUresult call_pitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                              unsigned int elem)
{
    return vgpu_real_cuda.cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
}

/* Grow a reservation to `bytes` (the driver's padding, or host rows).
 * On failure the whole reservation is given back. */
static CUresult grow_reservation(struct reservation *r, uint64_t bytes, const char *what)
{
    if (bytes > r->bytes && budget_reserve(r->index, bytes - r->bytes) != 0) {
        budget_release(r->index, r->bytes);
        return budget_oom(r->index, what, bytes);
    }
    if (bytes > r->bytes)
        r->bytes = bytes;
    return CUDA_SUCCESS;
}

/* The pitch is only known after the call: reserve width x height first,
 * then the padding the driver added (undoing the allocation if it does not
 * fit). */
static CUresult alloc_pitch(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                            unsigned int elem, pitch_call call)
{
    struct reservation r;
    CUresult rc = reserve_current(&r, vgpu_mul_sat(width, height), "cuMemAllocPitch");
    if (rc != CUDA_SUCCESS)
        return rc;
    struct alloc_info info = {.kind = ALLOC_DEVICE};
    size_t got_pitch = 0;
    rc = call(dptr, &got_pitch, width, height, elem);
    if (r.index < 0)
        goto out;
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && vgpu_oversubscribe()) {
        got_pitch = (width + HOST_PITCH_ALIGN - 1) / HOST_PITCH_ALIGN * HOST_PITCH_ALIGN;
        rc = grow_reservation(&r, vgpu_mul_sat(got_pitch, height), "cuMemAllocPitch");
        if (rc != CUDA_SUCCESS)
            return rc;
        info.kind = ALLOC_HOST_BACKED;
        rc = oversub_alloc(dptr, r.bytes, &info.host);
    } else if (rc == CUDA_SUCCESS) {
        CUresult grown = grow_reservation(&r, vgpu_mul_sat(got_pitch, height), "cuMemAllocPitch");
        if (grown != CUDA_SUCCESS) {
            vgpu_real_cuda.cuMemFree_v2(*dptr);
            return grown;
        }
    }
out:
    if (rc == CUDA_SUCCESS)
        *pitch = got_pitch;
    info.size = r.bytes;
    return settle(&r, rc, SPACE_PTR, rc == CUDA_SUCCESS ? *dptr : 0, &info);
}

VGPU_EXPORT CUresult cuMemAllocPitch(CUdeviceptr *dptr, unsigned int *pPitch,
                                     unsigned int WidthInBytes, unsigned int Height,
                                     unsigned int ElementSizeBytes)
{
    VGPU_CUDA_ENTER(cuMemAllocPitch);
    size_t pitch = 0;
    CUresult rc = alloc_pitch(dptr, &pitch, WidthInBytes, Height, ElementSizeBytes, call_pitch_v1);
    if (rc == CUDA_SUCCESS && pPitch != NULL)
        *pPitch = (unsigned int)pitch;
    return rc;
}

VGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                        size_t Height, unsigned int ElementSizeBytes)
{
    VGPU_CUDA_ENTER(cuMemAllocPitch_v2);
    size_t pitch = 0;
    CUresult rc = alloc_pitch(dptr, &pitch, WidthInBytes, Height, ElementSizeBytes, call_pitch_v2);
    if (rc == CUDA_SUCCESS && pPitch != NULL)
        *pPitch = pitch;
    return rc;
}

/* Managed memory may live on the device: it counts against the limit, and
 * is never allowed beyond what the device has physically free. */
VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    VGPU_CUDA_ENTER(cuMemAllocManaged);
    struct reservation r;
    CUresult rc = reserve_current(&r, bytesize, "cuMemAllocManaged");
    if (rc != CUDA_SUCCESS)
        return rc;
    size_t free_bytes = 0, total_bytes = 0;
    if (r.index >= 0 && vgpu_real_cuda.cuMemGetInfo_v2 != NULL &&
        vgpu_real_cuda.cuMemGetInfo_v2(&free_bytes, &total_bytes) == CUDA_SUCCESS &&
        bytesize > free_bytes) {
        budget_release(r.index, bytesize);
        vgpu_error_set("the device has only %zu bytes physically free", free_bytes);
        return budget_oom(r.index, "cuMemAllocManaged", bytesize);
    }
    rc = vgpu_real_cuda.cuMemAllocManaged(dptr, bytesize, flags);
    struct alloc_info info = {.size = bytesize, .kind = ALLOC_MANAGED};
    return settle(&r, rc, SPACE_PTR, rc == CUDA_SUCCESS ? *dptr : 0, &info);
}

typedef CUresult (*free_call)(CUdeviceptr dptr, CUstream stream);

static CUresult call_free_v1(CUdeviceptr dptr, CUstream stream)
{
    (void)stream;
    return vgpu_real_cuda.cuMemFree(dptr);
}

static CUresult call_free_v2(CUdeviceptr dptr, CUstream stream)
{
    (void)stream;
    return vgpu_real_cuda.cuMemFree_v2(dptr);
}

static CUresult call_free_async(CUdeviceptr dptr, CUstream stream)
{
    return vgpu_real_cuda.cuMemFreeAsync(dptr, stream);
}

static CUresult call_free_async_ptsz(CUdeviceptr dptr, CUstream stream)
{
    return vgpu_real_cuda.cuMemFreeAsync_ptsz(dptr, stream);
}

static CUresult free_ptr(CUdeviceptr dptr, CUstream stream, free_call call)
{
    struct alloc_info info;
    bool ours = take_own(SPACE_PTR, dptr, &info);
    CUresult rc = ours && info.kind == ALLOC_HOST_BACKED ? oversub_free(info.host)
                                                         : call(dptr, stream);
    return finish_free(ours, SPACE_PTR, dptr, &info, rc);
}

VGPU_EXPORT CUresult cuMemFree(CUdeviceptr dptr)
{
    VGPU_CUDA_ENTER(cuMemFree);
    return free_ptr(dptr, NULL, call_free_v1);
}

VGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    VGPU_CUDA_ENTER(cuMemFree_v2);
    return free_ptr(dptr, NULL, call_free_v2);
}

/* ---- stream-ordered allocation and pools --------------------------------- */

typedef CUresult (*async_call)(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                               CUstream stream);

static CUresult call_async(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream)
{
    (void)pool;
    return vgpu_real_cuda.cuMemAllocAsync(dptr, bytes, stream);
}

static CUresult call_async_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                CUstream stream)
{
    (void)pool;
    return vgpu_real_cuda.cuMemAllocAsync_ptsz(dptr, bytes, stream);
}

static CUresult call_pool_async(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                CUstream stream)
{
    return vgpu_real_cuda.cuMemAllocFromPoolAsync(dptr, bytes, pool, stream);
}

static CUresult call_pool_async_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                     CUstream stream)
{
    return vgpu_real_cuda.cuMemAllocFromPoolAsync_ptsz(dptr, bytes, pool, stream);
}

/*
 * Where a stream-ordered allocation lands (CUDA driver API reference):
 * cuMemAllocFromPoolAsync allocates from `pool`, whose location was fixed
 * when it was created; cuMemAllocAsync from the current pool of the device
 * of the STREAM's context. Neither depends on the calling thread's current
 * context, so neither may be charged to it.
 */

/* Remember where a pool's memory lives: a budget index (VGPU_DEV_UNTRACKED
 * for a pool of host memory). */
static void pool_note(CUmemoryPool pool, CUdevice dev, int index)
{
    struct alloc_info home = {.index = index, .kind = ALLOC_POOL, .aux = (uint64_t)dev};
    if (allocmap_put(SPACE_POOL, (uintptr_t)pool, &home) != 0)
        log_error("%s: allocations from this pool go to their stream's device", vgpu_error());
}

/* The home of a pool we saw created, or of a device's default pool (found
 * once by asking each device). false: unknown (imported) pool. */
static bool pool_home(CUmemoryPool pool, CUdevice *dev, int *index)
{
    struct alloc_info home;
    if (allocmap_get(SPACE_POOL, (uintptr_t)pool, &home) == 0) {
        *dev = (CUdevice)home.aux;
        *index = home.index;
        return true;
    }
    int count = 0;
    if (vgpu_real_cuda.cuDeviceGetCount == NULL || vgpu_real_cuda.cuDeviceGetDefaultMemPool == NULL ||
        vgpu_real_cuda.cuDeviceGetCount(&count) != CUDA_SUCCESS)
        return false;
    for (CUdevice d = 0; d < count; d++) {
        CUmemoryPool def = NULL;
        if (vgpu_real_cuda.cuDeviceGetDefaultMemPool(&def, d) == CUDA_SUCCESS && def == pool) {
            *dev = d;
            *index = devmap_index(d);
            pool_note(pool, d, *index);
            return true;
        }
    }
    return false;
}

/* The budget index of the device of a stream's context. */
static int stream_index(CUstream stream, bool ptsz, CUdevice *dev)
{
    __typeof__(vgpu_real_cuda.cuStreamGetCtx) get =
        ptsz && vgpu_real_cuda.cuStreamGetCtx_ptsz != NULL ? vgpu_real_cuda.cuStreamGetCtx_ptsz
                                                           : vgpu_real_cuda.cuStreamGetCtx;
    CUcontext ctx = NULL, current = NULL;
    if (get != NULL && get(stream, &ctx) == CUDA_SUCCESS && ctx != NULL &&
        vgpu_real_cuda.cuCtxGetCurrent(&current) == CUDA_SUCCESS && ctx != current &&
        devmap_ctx_device(ctx, dev) == 0)
        return devmap_index(*dev);
    return devmap_current(dev);
}

static CUresult unaccounted_refused(_Atomic bool *told, const char *why);

/* Where pinned memory at `loc` lands as the limit sees it: on a device
 * (charged there), in host memory (not device memory), or where the hook
 * cannot account for it: a location type it does not know (newer drivers
 * add some, a device's locality domain among them), or memory that is not
 * pinned (a pool of managed memory, which may move onto the device beyond
 * what it has free). A limited process is refused the last kind: counted
 * nowhere, it would lift the limit. */
enum landing { ON_DEVICE, ON_HOST, UNACCOUNTED };

static enum landing landing_of(int alloc_type, const CUmemLocation *loc)
{
    if (alloc_type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return UNACCOUNTED;
    switch (loc->type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        return ON_DEVICE;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        return ON_HOST;
    default:
        return UNACCOUNTED;
    }
}

static _Atomic bool landing_told;
#define LANDING_REFUSED "memory of a kind or location the limit cannot account for refused " \
                        "(only pinned device or host memory is)"

VGPU_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    VGPU_CUDA_ENTER(cuMemPoolCreate);
    enum landing to = poolProps != NULL ? landing_of(poolProps->allocType, &poolProps->location)
                                        : ON_HOST; /* the driver's error to give */
    if (vgpu_limited() && to == UNACCOUNTED)
        return unaccounted_refused(&landing_told, "cuMemPoolCreate: " LANDING_REFUSED);
    CUresult rc = vgpu_real_cuda.cuMemPoolCreate(pool, poolProps);
    if (rc != CUDA_SUCCESS || !vgpu_limited() || poolProps == NULL)
        return rc;
    if (to == ON_DEVICE)
        pool_note(*pool, poolProps->location.id, devmap_index(poolProps->location.id));
    else /* host or host NUMA memory: not device memory */
        pool_note(*pool, 0, VGPU_DEV_UNTRACKED);
    return rc;
}

/*
 * Charged to the pool's device, from `pool` (NULL: the current pool of the
 * stream's device). Bytes the pool holds from earlier frees are reused
 * before new ones are reserved. On a stream being captured, the call adds a
 * memory allocation node to the capture's graph instead: its memory comes
 * from the device's graph pool, and is charged like any memory node (what
 * it frees stays held by the graph pool until cuDeviceGraphMemTrim; asking
 * the stream's pool how much it reserves would say nothing of it).
 */
static CUresult alloc_async(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream,
                            bool ptsz, async_call call, const char *what)
{
    CUdevice dev = 0;
    int index = VGPU_DEV_UNTRACKED;
    if (vgpu_limited() && (pool == NULL || !pool_home(pool, &dev, &index)))
        index = stream_index(stream, ptsz, &dev);
    if (index == VGPU_DEV_UNTRACKED)
        return call(dptr, bytes, pool, stream);
    bool captured = devmap_stream_capturing(stream, ptsz);
    CUmemoryPool charged_pool = captured ? NULL : pool; /* NULL when captured: the graph pool */
    if (!captured && charged_pool == NULL && vgpu_real_cuda.cuDeviceGetMemPool != NULL &&
        vgpu_real_cuda.cuDeviceGetMemPool(&charged_pool, dev) != CUDA_SUCCESS)
        charged_pool = NULL;
    bool pooled = captured || charged_pool != NULL;
    uint64_t reused = pooled ? pools_take(charged_pool, index, bytes) : 0;
    struct reservation r;
    CUresult rc = reserve_on(&r, dev, index, bytes - reused, what);
    if (rc == CUDA_SUCCESS) {
        rc = call(dptr, bytes, pool, stream);
        if (rc != CUDA_SUCCESS)
            budget_release(index, r.bytes);
    }
    if (rc != CUDA_SUCCESS) {
        if (pooled)
            pools_untake(charged_pool, index, bytes, reused);
        return rc;
    }
    struct alloc_info info = {.size = bytes, .index = index,
                              .kind = captured ? ALLOC_GRAPH : ALLOC_ASYNC, .pool = charged_pool};
    if (allocmap_put(SPACE_PTR, *dptr, &info) != 0)
        log_error("%s: the allocation stays charged until the process exits", vgpu_error());
    return rc;
}

VGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    VGPU_CUDA_ENTER(cuMemAllocAsync);
    return alloc_async(dptr, bytesize, NULL, hStream, false, call_async, "cuMemAllocAsync");
}

VGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    VGPU_CUDA_ENTER(cuMemAllocAsync_ptsz);
    return alloc_async(dptr, bytesize, NULL, hStream, true, call_async_ptsz,
                       "cuMemAllocAsync_ptsz");
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                             CUstream hStream)
{
    VGPU_CUDA_ENTER(cuMemAllocFromPoolAsync);
    return alloc_async(dptr, bytesize, pool, hStream, false, call_pool_async,
                       "cuMemAllocFromPoolAsync");
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                  CUmemoryPool pool, CUstream hStream)
{
    VGPU_CUDA_ENTER(cuMemAllocFromPoolAsync_ptsz);
    return alloc_async(dptr, bytesize, pool, hStream, true, call_pool_async_ptsz,
                       "cuMemAllocFromPoolAsync_ptsz");
}

VGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    VGPU_CUDA_ENTER(cuMemFreeAsync);
    return free_ptr(dptr, hStream, call_free_async);
}

VGPU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    VGPU_CUDA_ENTER(cuMemFreeAsync_ptsz);
    return free_ptr(dptr, hStream, call_free_async_ptsz);
}

VGPU_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    VGPU_CUDA_ENTER(cuMemPoolTrimTo);
    CUresult rc = vgpu_real_cuda.cuMemPoolTrimTo(pool, minBytesToKeep);
    if (rc == CUDA_SUCCESS && vgpu_limited())
        pools_trimmed(pool, VGPU_DEV_UNTRACKED, minBytesToKeep);
    return rc;
}

VGPU_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    VGPU_CUDA_ENTER(cuMemPoolDestroy);
    CUresult rc = vgpu_real_cuda.cuMemPoolDestroy(pool);
    struct alloc_info home;
    if (rc == CUDA_SUCCESS && vgpu_limited()) {
        pools_destroyed(pool);
        allocmap_take(SPACE_POOL, (uintptr_t)pool, &home);
    }
    return rc;
}

/* ---- graph memory nodes ---------------------------------------------------
 * The allocation is charged when the node is added (its address is fixed
 * then), held by the device's graph pool once a free node or a free call
 * releases it, and given back when the graph pool is trimmed. Every road
 * that adds a node - cuGraphAddMemAllocNode/FreeNode and the generic
 * cuGraphAddNode(_v2) with a memory node type - goes through the same two
 * functions. The parameters of a memory node cannot be changed afterwards
 * (cuGraphNodeSetParams and cuGraphExecNodeSetParams refuse memory nodes),
 * so no other road changes what a node allocates.
 *
 * A graph's memory exists only once it runs. A graph destroyed before any
 * instantiation therefore gives back what its nodes were charged - its
 * allocations, and what its free nodes moved to the graph pool. A graph
 * that may have run (any instantiation road, marked BEFORE the driver call
 * so that a destroy racing an instantiation keeps the charge) keeps its
 * unfreed allocations charged past its destruction, as the driver keeps
 * them until cuMemFree(Async); what it freed stays held by the graph pool
 * until cuDeviceGraphMemTrim. */

/* Remember something about a graph (SPACE_GRAPH_RUN: it may have run;
 * SPACE_GRAPH_MEM: it has memory nodes, so its destroy must look at them). */
static void graph_mark(enum alloc_space space, CUgraph graph)
{
    struct alloc_info mark = {.index = VGPU_DEV_UNTRACKED, .kind = ALLOC_GRAPH_MARK};
    if (vgpu_limited() && allocmap_put(space, (uintptr_t)graph, &mark) != 0)
        log_error("%s: graph memory stays charged until the process exits", vgpu_error());
}

/* One call that adds a node, whatever its road. */
struct node_add {
    CUgraphNode *node;
    CUgraph graph;
    const CUgraphNode *deps;
    const CUgraphEdgeData *edges; /* cuGraphAddNode_v2 only */
    size_t ndeps;
    CUgraphNodeParams *generic;   /* the generic roads' parameters, else NULL */
    CUresult (*call)(const struct node_add *add, CUDA_MEM_ALLOC_NODE_PARAMS *alloc,
                     CUdeviceptr dptr);
};

static CUresult add_graph_alloc(const struct node_add *add, CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    if (!vgpu_limited() || params == NULL)
        return add->call(add, params, 0);
    enum landing to = landing_of(params->poolProps.allocType, &params->poolProps.location);
    if (to == UNACCOUNTED)
        return unaccounted_refused(&landing_told, "a graph memory node: " LANDING_REFUSED);
    if (to == ON_HOST)
        return add->call(add, params, 0);
    CUdevice dev = params->poolProps.location.id;
    int index = devmap_index(dev);
    uint64_t bytes = params->bytesize;
    uint64_t reused = index >= 0 ? pools_take(NULL, index, bytes) : 0;
    struct reservation r;
    CUresult rc = reserve_on(&r, dev, index, bytes - reused, "graph memory node");
    if (rc == CUDA_SUCCESS) {
        rc = add->call(add, params, 0);
        if (rc != CUDA_SUCCESS)
            budget_release(index, r.bytes);
    }
    if (index < 0)
        return rc;
    if (rc != CUDA_SUCCESS) {
        pools_untake(NULL, index, bytes, reused);
        return rc;
    }
    struct alloc_info info = {.size = bytes, .index = index, .kind = ALLOC_GRAPH,
                              .aux = (uintptr_t)add->graph};
    if (allocmap_put(SPACE_PTR, params->dptr, &info) != 0)
        log_error("%s: the allocation stays charged until the process exits", vgpu_error());
    graph_mark(SPACE_GRAPH_MEM, add->graph);
    return rc;
}

static CUresult add_graph_free(const struct node_add *add, CUdeviceptr dptr)
{
    struct alloc_info info;
    bool ours = take_own(SPACE_PTR, dptr, &info);
    CUresult rc = add->call(add, NULL, dptr);
    if (ours && info.kind != ALLOC_GRAPH) { /* not a graph allocation: untouched */
        allocmap_put(SPACE_PTR, dptr, &info);
        return rc;
    }
    if (ours && rc == CUDA_SUCCESS && info.aux == (uintptr_t)add->graph) {
        struct alloc_info memo = {.size = info.size, .index = info.index,
                                  .kind = ALLOC_GRAPH_FREED, .aux = info.aux};
        if (allocmap_put(SPACE_GRAPH_FREED, dptr, &memo) != 0)
            log_error("%s: the graph's freed memory stays held until a trim", vgpu_error());
    }
    return finish_free(ours, SPACE_PTR, dptr, &info, rc);
}

/* ---- graphs: may they have run? -------------------------------------------- */

static void graph_may_run(CUgraph graph)
{
    graph_mark(SPACE_GRAPH_RUN, graph);
}

VGPU_EXPORT CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                                        CUgraphNode *phErrorNode, char *logBuffer,
                                        size_t bufferSize)
{
    VGPU_CUDA_ENTER(cuGraphInstantiate);
    graph_may_run(hGraph);
    return vgpu_real_cuda.cuGraphInstantiate(phGraphExec, hGraph, phErrorNode, logBuffer,
                                             bufferSize);
}

VGPU_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUgraphNode *phErrorNode, char *logBuffer,
                                           size_t bufferSize)
{
    VGPU_CUDA_ENTER(cuGraphInstantiate_v2);
    graph_may_run(hGraph);
    return vgpu_real_cuda.cuGraphInstantiate_v2(phGraphExec, hGraph, phErrorNode, logBuffer,
                                                bufferSize);
}

VGPU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                 unsigned long long flags)
{
    VGPU_CUDA_ENTER(cuGraphInstantiateWithFlags);
    graph_may_run(hGraph);
    return vgpu_real_cuda.cuGraphInstantiateWithFlags(phGraphExec, hGraph, flags);
}

VGPU_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    VGPU_CUDA_ENTER(cuGraphInstantiateWithParams);
    graph_may_run(hGraph);
    return vgpu_real_cuda.cuGraphInstantiateWithParams(phGraphExec, hGraph, instantiateParams);
}

VGPU_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(
    CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    VGPU_CUDA_ENTER(cuGraphInstantiateWithParams_ptsz);
    graph_may_run(hGraph);
    return vgpu_real_cuda.cuGraphInstantiateWithParams_ptsz(phGraphExec, hGraph,
                                                            instantiateParams);
}

static bool of_graph(uint64_t key, const struct alloc_info *info, const void *graph)
{
    (void)key;
    return (info->kind == ALLOC_GRAPH || info->kind == ALLOC_GRAPH_FREED) &&
           info->aux == (uintptr_t)graph;
}

/* A graph that never ran held no memory: give back what its nodes were
 * charged. Its unfreed allocations leave the pool's "live" count too. */
static void graph_never_ran(CUgraph graph)
{
    struct alloc_entry *gone;
    size_t n = allocmap_take_all(SPACE_PTR, of_graph, graph, &gone);
    for (size_t i = 0; i < n; i++) {
        pools_untake(NULL, gone[i].info.index, gone[i].info.size, 0);
        budget_release(gone[i].info.index, gone[i].info.size);
    }
    free(gone);
    n = allocmap_take_all(SPACE_GRAPH_FREED, of_graph, graph, &gone);
    for (size_t i = 0; i < n; i++)
        pools_unhold(NULL, gone[i].info.index, gone[i].info.size);
    free(gone);
}

VGPU_EXPORT CUresult cuGraphDestroy(CUgraph hGraph)
{
    VGPU_CUDA_ENTER(cuGraphDestroy);
    CUresult rc = vgpu_real_cuda.cuGraphDestroy(hGraph);
    struct alloc_info mark;
    if (rc != CUDA_SUCCESS || !vgpu_limited())
        return rc;
    bool ran = allocmap_take(SPACE_GRAPH_RUN, (uintptr_t)hGraph, &mark) == 0;
    /* Most graphs have no memory node: nothing to look for (the look is a
     * scan of every allocation of the process). */
    if (allocmap_take(SPACE_GRAPH_MEM, (uintptr_t)hGraph, &mark) != 0)
        return rc;
    if (!ran) {
        graph_never_ran(hGraph);
    } else {
        /* It may have run: what it freed stays held by the graph pool, what
         * it did not free stays live. Only the memos go. */
        struct alloc_entry *memos;
        allocmap_take_all(SPACE_GRAPH_FREED, of_graph, hGraph, &memos);
        free(memos);
    }
    return rc;
}

static CUresult call_add_alloc(const struct node_add *add, CUDA_MEM_ALLOC_NODE_PARAMS *alloc,
                               CUdeviceptr dptr)
{
    (void)dptr;
    return vgpu_real_cuda.cuGraphAddMemAllocNode(add->node, add->graph, add->deps, add->ndeps,
                                                 alloc);
}

static CUresult call_add_free(const struct node_add *add, CUDA_MEM_ALLOC_NODE_PARAMS *alloc,
                              CUdeviceptr dptr)
{
    (void)alloc;
    return vgpu_real_cuda.cuGraphAddMemFreeNode(add->node, add->graph, add->deps, add->ndeps, dptr);
}

static CUresult call_add_node(const struct node_add *add, CUDA_MEM_ALLOC_NODE_PARAMS *alloc,
                              CUdeviceptr dptr)
{
    (void)alloc;
    (void)dptr;
    return vgpu_real_cuda.cuGraphAddNode(add->node, add->graph, add->deps, add->ndeps,
                                         add->generic);
}

static CUresult call_add_node_v2(const struct node_add *add, CUDA_MEM_ALLOC_NODE_PARAMS *alloc,
                                 CUdeviceptr dptr)
{
    (void)alloc;
    (void)dptr;
    return vgpu_real_cuda.cuGraphAddNode_v2(add->node, add->graph, add->deps, add->edges,
                                            add->ndeps, add->generic);
}

/* The generic roads: memory nodes are accounted, every other type passes. */
static CUresult add_generic(const struct node_add *add)
{
    CUgraphNodeParams *p = add->generic;
    if (p != NULL && p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC)
        return add_graph_alloc(add, &p->u.alloc);
    if (p != NULL && p->type == CU_GRAPH_NODE_TYPE_MEM_FREE)
        return add_graph_free(add, p->u.free.dptr);
    return add->call(add, NULL, 0);
}

VGPU_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                            const CUgraphNode *dependencies,
                                            size_t numDependencies,
                                            CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    VGPU_CUDA_ENTER(cuGraphAddMemAllocNode);
    struct node_add add = {phGraphNode, hGraph, dependencies, NULL, numDependencies, NULL,
                           call_add_alloc};
    return add_graph_alloc(&add, nodeParams);
}

VGPU_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                           const CUgraphNode *dependencies, size_t numDependencies,
                                           CUdeviceptr dptr)
{
    VGPU_CUDA_ENTER(cuGraphAddMemFreeNode);
    struct node_add add = {phGraphNode, hGraph, dependencies, NULL, numDependencies, NULL,
                           call_add_free};
    return add_graph_free(&add, dptr);
}

VGPU_EXPORT CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                    const CUgraphNode *dependencies, size_t numDependencies,
                                    CUgraphNodeParams *nodeParams)
{
    VGPU_CUDA_ENTER(cuGraphAddNode);
    struct node_add add = {phGraphNode, hGraph, dependencies, NULL, numDependencies, nodeParams,
                           call_add_node};
    return add_generic(&add);
}

VGPU_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                       const CUgraphNode *dependencies,
                                       const CUgraphEdgeData *dependencyData,
                                       size_t numDependencies, CUgraphNodeParams *nodeParams)
{
    VGPU_CUDA_ENTER(cuGraphAddNode_v2);
    struct node_add add = {phGraphNode, hGraph, dependencies, dependencyData, numDependencies,
                           nodeParams, call_add_node_v2};
    return add_generic(&add);
}

VGPU_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device)
{
    VGPU_CUDA_ENTER(cuDeviceGraphMemTrim);
    CUresult rc = vgpu_real_cuda.cuDeviceGraphMemTrim(device);
    int index = devmap_index(device);
    if (rc == CUDA_SUCCESS && index >= 0)
        pools_trimmed(NULL, index, 0);
    return rc;
}

/* ---- virtual memory management (PyTorch expandable segments) -------------
 * Physical memory is created by cuMemCreate and lives until every reference
 * to its handle is released (cuMemCreate's, and one per
 * cuMemRetainAllocationHandle) AND its last mapping is unmapped: the charge
 * follows it. Each of our handles counts both (a mapping is counted before
 * cuMemMap, so a concurrent cuMemRelease can never see "unmapped" while a
 * mapping is being made); a released handle with mappings stays charged
 * until the last one goes (cuMemUnmap, or cuMemAddressFree of its range). Reserving address space
 * costs nothing. Handles imported from another process are the exporter's
 * bytes. */

VGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags)
{
    VGPU_CUDA_ENTER(cuMemCreate);
    struct reservation r = {.index = VGPU_DEV_UNTRACKED};
    CUresult rc = CUDA_SUCCESS;
    enum landing to = prop != NULL ? landing_of(prop->type, &prop->location) : ON_HOST;
    if (vgpu_limited() && to == UNACCOUNTED)
        return unaccounted_refused(&landing_told, "cuMemCreate: " LANDING_REFUSED);
    if (to == ON_DEVICE)
        rc = reserve_device(&r, prop->location.id, size, "cuMemCreate");
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = vgpu_real_cuda.cuMemCreate(handle, size, prop, flags);
    struct alloc_info info = {.size = size, .kind = ALLOC_VMM, .refs = 1};
    return settle(&r, rc, SPACE_HANDLE, rc == CUDA_SUCCESS ? *handle : 0, &info);
}

/* allocmap_update changes, under the map's lock (see above). */
static bool vmm_map_add(struct alloc_info *info, const void *arg)
{
    (void)arg;
    info->maps++;
    return false;
}

/* One mapping fewer: removed (to be given back) once released and unmapped. */
static bool vmm_map_drop(struct alloc_info *info, const void *arg)
{
    (void)arg;
    if (info->maps > 0)
        info->maps--;
    return info->refs == 0 && info->maps == 0;
}

static bool vmm_retain(struct alloc_info *info, const void *arg)
{
    (void)arg;
    info->refs++;
    return false;
}

static bool vmm_release(struct alloc_info *info, const void *arg)
{
    (void)arg;
    if (info->refs > 0)
        info->refs--;
    return info->refs == 0 && info->maps == 0;
}

static void vmm_unmapped(CUmemGenericAllocationHandle handle)
{
    struct alloc_info info;
    if (allocmap_update(SPACE_HANDLE, handle, vmm_map_drop, NULL, &info) == 1)
        give_back(&info);
}

VGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    VGPU_CUDA_ENTER(cuMemRelease);
    CUresult rc = vgpu_real_cuda.cuMemRelease(handle);
    struct alloc_info info;
    if (rc == CUDA_SUCCESS && vgpu_limited() &&
        allocmap_update(SPACE_HANDLE, handle, vmm_release, NULL, &info) == 1)
        give_back(&info);
    return rc;
}

/* Another reference to one of our handles, found by an address it maps. */
VGPU_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    VGPU_CUDA_ENTER(cuMemRetainAllocationHandle);
    CUresult rc = vgpu_real_cuda.cuMemRetainAllocationHandle(handle, addr);
    if (rc == CUDA_SUCCESS && vgpu_limited())
        allocmap_update(SPACE_HANDLE, *handle, vmm_retain, NULL, NULL);
    return rc;
}

VGPU_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                              CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    VGPU_CUDA_ENTER(cuMemMap);
    bool ours = vgpu_limited() && allocmap_update(SPACE_HANDLE, handle, vmm_map_add, NULL, NULL) == 0;
    CUresult rc = vgpu_real_cuda.cuMemMap(ptr, size, offset, handle, flags);
    if (!ours)
        return rc;
    if (rc != CUDA_SUCCESS) {
        vmm_unmapped(handle);
        return rc;
    }
    struct alloc_info mapping = {.size = size, .index = VGPU_DEV_UNTRACKED, .kind = ALLOC_MAPPING,
                                 .aux = handle};
    if (allocmap_put(SPACE_MAP, ptr, &mapping) != 0)
        log_error("%s: the handle stays charged until the process exits", vgpu_error());
    return rc;
}

struct range {
    uint64_t lo, hi;
};

static bool mapping_in(uint64_t key, const struct alloc_info *info, const void *arg)
{
    const struct range *r = arg;
    (void)info;
    return key >= r->lo && key < r->hi;
}

/* [ptr, ptr + size) is no longer mapped: drop the mappings that start in it. */
static void unmapped_range(CUdeviceptr ptr, size_t size)
{
    struct range r = {ptr, ptr + size < ptr ? UINT64_MAX : ptr + size};
    struct alloc_entry *gone;
    size_t n = allocmap_take_all(SPACE_MAP, mapping_in, &r, &gone);
    for (size_t i = 0; i < n; i++)
        vmm_unmapped(gone[i].info.aux);
    free(gone);
}

VGPU_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    VGPU_CUDA_ENTER(cuMemUnmap);
    CUresult rc = vgpu_real_cuda.cuMemUnmap(ptr, size);
    if (rc == CUDA_SUCCESS && vgpu_limited())
        unmapped_range(ptr, size);
    return rc;
}

/* A road whose memory the hook cannot count, closed in a limited process
 * rather than left open (one warning per road and process). */
static CUresult unaccounted_refused(_Atomic bool *told, const char *why)
{
    if (!atomic_exchange(told, true))
        log_warn("%s", why);
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* Mapping memory into a sparse array is a mapping the hook cannot count (a
 * handle released while so mapped would keep its memory uncharged). Sparse
 * arrays (tiled textures) are rare in compute work. */
static _Atomic bool sparse_told;
#define SPARSE_REFUSED "cuMemMapArrayAsync refused: mappings into sparse arrays are not accounted"

VGPU_EXPORT CUresult cuMemMapArrayAsync(CUarrayMapInfo *mapInfoList, unsigned int count,
                                        CUstream hStream)
{
    VGPU_CUDA_ENTER(cuMemMapArrayAsync);
    return vgpu_limited() ? unaccounted_refused(&sparse_told, SPARSE_REFUSED)
                          : vgpu_real_cuda.cuMemMapArrayAsync(mapInfoList, count, hStream);
}

VGPU_EXPORT CUresult cuMemMapArrayAsync_ptsz(CUarrayMapInfo *mapInfoList, unsigned int count,
                                             CUstream hStream)
{
    VGPU_CUDA_ENTER(cuMemMapArrayAsync_ptsz);
    return vgpu_limited() ? unaccounted_refused(&sparse_told, SPARSE_REFUSED)
                          : vgpu_real_cuda.cuMemMapArrayAsync_ptsz(mapInfoList, count, hStream);
}

/* NVLink multicast objects (NCCL's NVLS) hold device memory on every GPU
 * they span, bound through cuMulticastBindMem/Addr, which the hook does not
 * count; a limited process never gets one. NCCL falls back to its other
 * algorithms (and vGPU recipes set NCCL_NVLS_ENABLE=0 so it never asks). */
VGPU_EXPORT CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle,
                                       const CUmulticastObjectProp *prop)
{
    static _Atomic bool told;
    VGPU_CUDA_ENTER(cuMulticastCreate);
    return vgpu_limited() ? unaccounted_refused(
                                &told, "cuMulticastCreate refused: NVLink multicast memory is not accounted")
                          : vgpu_real_cuda.cuMulticastCreate(mcHandle, prop);
}

/* Freeing a reservation drops whatever is still mapped in it. */
VGPU_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    VGPU_CUDA_ENTER(cuMemAddressFree);
    CUresult rc = vgpu_real_cuda.cuMemAddressFree(ptr, size);
    if (rc == CUDA_SUCCESS && vgpu_limited())
        unmapped_range(ptr, size);
    return rc;
}

/* ---- arrays ---------------------------------------------------------------
 * Sized as width x height x depth x channels x element size; the driver's
 * own padding and tiling are not visible through the API. */

static uint64_t element_bytes(CUarray_format format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    default: /* 32-bit formats, and a safe guess for formats we do not know */
        return 4;
    }
}

static uint64_t array_bytes(size_t width, size_t height, size_t depth, unsigned channels,
                            CUarray_format format)
{
    uint64_t bytes = vgpu_mul_sat(width, height ? height : 1);
    bytes = vgpu_mul_sat(bytes, depth ? depth : 1);
    return vgpu_mul_sat(bytes, vgpu_mul_sat(channels, element_bytes(format)));
}

/* Every level the driver makes: it clamps the count to the full chain of
 * the extent (1 + floor(log2(largest extent)), at most 64 for a 64-bit
 * extent, so the loop is bounded by what can exist), and a layered or
 * cubemap array keeps its layers (or faces) at every level. */
static uint64_t mipmap_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels)
{
    bool layered = (d->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
    size_t w = d->Width, h = d->Height, z = d->Depth;
    size_t extent = w > h ? w : h;
    if (!layered && z > extent)
        extent = z;
    unsigned chain = 1;
    while (extent >>= 1)
        chain++;
    uint64_t total = 0;
    for (unsigned l = 0; l < levels && l < chain; l++) {
        uint64_t level = array_bytes(w, h, z, d->NumChannels, d->Format);
        total = total + level < total ? UINT64_MAX : total + level;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        z = z > 1 && !layered ? z / 2 : z;
    }
    return total;
}

static CUresult destroy_array(void *handle)
{
    return vgpu_real_cuda.cuArrayDestroy((CUarray)handle);
}

static CUresult destroy_mipmap(void *handle)
{
    return vgpu_real_cuda.cuMipmappedArrayDestroy((CUmipmappedArray)handle);
}

/* After the driver call: charge the estimate, then true the charge up with
 * what NVML says the process holds, since the driver pads arrays as it
 * likes (a layered mipmap took about 3 % more than its texels on an H100,
 * driver 580). An array whose padding does not fit is undone. The padding
 * stays charged as overhead after the array is destroyed, until the next
 * measurement: too much, never too little. */
static CUresult settle_array(const struct reservation *r, CUresult rc, void *handle,
                             CUresult (*destroy)(void *), const char *what)
{
    struct alloc_info info = {.size = r->bytes, .kind = ALLOC_ARRAY};
    uint64_t key = rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)handle : 0;
    rc = settle(r, rc, SPACE_ARRAY, key, &info);
    if (rc != CUDA_SUCCESS || r->index < 0 || overhead_true_up(r->dev, r->index) == 0)
        return rc;
    struct alloc_info taken;
    bool ours = take_own(SPACE_ARRAY, key, &taken);
    finish_free(ours, SPACE_ARRAY, key, &taken, destroy(handle));
    return budget_oom(r->index, what, r->bytes);
}

#define ARRAY_CREATE(name, desc_type, bytes_expr) \
    VGPU_EXPORT CUresult name(CUarray *pHandle, const desc_type *pAllocateArray) \
    { \
        VGPU_CUDA_ENTER(name); \
        const desc_type *d = pAllocateArray; \
        struct reservation r; \
        CUresult rc = reserve_current(&r, d != NULL ? (bytes_expr) : 0, #name); \
        if (rc != CUDA_SUCCESS) \
            return rc; \
        rc = vgpu_real_cuda.name(pHandle, pAllocateArray); \
        return settle_array(&r, rc, rc == CUDA_SUCCESS ? *pHandle : NULL, destroy_array, #name); \
    }

ARRAY_CREATE(cuArrayCreate, CUDA_ARRAY_DESCRIPTOR,
             array_bytes(d->Width, d->Height, 1, d->NumChannels, d->Format))
ARRAY_CREATE(cuArrayCreate_v2, CUDA_ARRAY_DESCRIPTOR,
             array_bytes(d->Width, d->Height, 1, d->NumChannels, d->Format))
ARRAY_CREATE(cuArray3DCreate, CUDA_ARRAY3D_DESCRIPTOR,
             array_bytes(d->Width, d->Height, d->Depth, d->NumChannels, d->Format))
ARRAY_CREATE(cuArray3DCreate_v2, CUDA_ARRAY3D_DESCRIPTOR,
             array_bytes(d->Width, d->Height, d->Depth, d->NumChannels, d->Format))

VGPU_EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    VGPU_CUDA_ENTER(cuArrayDestroy);
    uint64_t key = (uint64_t)(uintptr_t)hArray;
    struct alloc_info info;
    bool ours = take_own(SPACE_ARRAY, key, &info);
    return finish_free(ours, SPACE_ARRAY, key, &info, vgpu_real_cuda.cuArrayDestroy(hArray));
}

VGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                            const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                            unsigned int numMipmapLevels)
{
    VGPU_CUDA_ENTER(cuMipmappedArrayCreate);
    struct reservation r;
    uint64_t bytes =
        pMipmappedArrayDesc != NULL ? mipmap_bytes(pMipmappedArrayDesc, numMipmapLevels) : 0;
    CUresult rc = reserve_current(&r, bytes, "cuMipmappedArrayCreate");
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = vgpu_real_cuda.cuMipmappedArrayCreate(pHandle, pMipmappedArrayDesc, numMipmapLevels);
    return settle_array(&r, rc, rc == CUDA_SUCCESS ? *pHandle : NULL, destroy_mipmap,
                        "cuMipmappedArrayCreate");
}

VGPU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    VGPU_CUDA_ENTER(cuMipmappedArrayDestroy);
    uint64_t key = (uint64_t)(uintptr_t)hMipmappedArray;
    struct alloc_info info;
    bool ours = take_own(SPACE_ARRAY, key, &info);
    return finish_free(ours, SPACE_ARRAY, key, &info,
                       vgpu_real_cuda.cuMipmappedArrayDestroy(hMipmappedArray));
}

/* ---- what the process sees ------------------------------------------------
 * total = the limit; free = min(limit - the vGPU's use, physically free).
 * A device without a limit is shown as it is. */

static void limit_view(int index, uint64_t *free_bytes, uint64_t *total_bytes)
{
    uint64_t limit = index == VGPU_DEV_UNTRACKED ? UINT64_MAX : budget_limit(index);
    if (limit == UINT64_MAX)
        return;
    uint64_t used = budget_used(index);
    uint64_t room = limit > used ? limit - used : 0;
    *total_bytes = limit;
    if (room < *free_bytes)
        *free_bytes = room;
}

static int view_index_current(void)
{
    return vgpu_limited() ? devmap_current(NULL) : VGPU_DEV_UNTRACKED;
}

VGPU_EXPORT CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    VGPU_CUDA_ENTER(cuMemGetInfo);
    CUresult rc = vgpu_real_cuda.cuMemGetInfo(free, total);
    if (rc != CUDA_SUCCESS || free == NULL || total == NULL)
        return rc;
    uint64_t f = *free, t = *total;
    limit_view(view_index_current(), &f, &t);
    *free = f > UINT_MAX ? UINT_MAX : (unsigned int)f;
    *total = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
    return rc;
}

VGPU_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    VGPU_CUDA_ENTER(cuMemGetInfo_v2);
    CUresult rc = vgpu_real_cuda.cuMemGetInfo_v2(free, total);
    if (rc != CUDA_SUCCESS || free == NULL || total == NULL)
        return rc;
    uint64_t f = *free, t = *total;
    limit_view(view_index_current(), &f, &t);
    *free = (size_t)f;
    *total = (size_t)t;
    return rc;
}

static uint64_t total_view(CUdevice dev, uint64_t physical)
{
    uint64_t free_bytes = physical, total = physical;
    limit_view(vgpu_limited() ? devmap_index(dev) : VGPU_DEV_UNTRACKED, &free_bytes, &total);
    return total;
}

VGPU_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    VGPU_CUDA_ENTER(cuDeviceTotalMem);
    CUresult rc = vgpu_real_cuda.cuDeviceTotalMem(bytes, dev);
    if (rc == CUDA_SUCCESS && bytes != NULL) {
        uint64_t total = total_view(dev, *bytes);
        *bytes = total > UINT_MAX ? UINT_MAX : (unsigned int)total;
    }
    return rc;
}

VGPU_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    VGPU_CUDA_ENTER(cuDeviceTotalMem_v2);
    CUresult rc = vgpu_real_cuda.cuDeviceTotalMem_v2(bytes, dev);
    if (rc == CUDA_SUCCESS && bytes != NULL)
        *bytes = (size_t)total_view(dev, *bytes);
    return rc;
}
