/*
 * cu_ctx.c - contexts: primary contexts (retained per device) and created
 * ones, and the per-thread current-context stack. A context charges
 * VGPU_SIM_CTX_OVERHEAD to its device for as long as it lives, and takes
 * its allocations with it when destroyed.
 */
#include <stdlib.h>
#include <string.h>

#include "cu_sim.h"

static __thread CUcontext t_stack[CU_SIM_MAX_CTX_STACK];
static __thread int t_depth;

void cu_ctx_forget_thread(void)
{
    t_depth = 0;
}

bool cu_ctx_valid(CUcontext ctx)
{
    return ctx != NULL && ctx->tag == CU_TAG_CTX;
}

CUresult cu_current(CUcontext *out)
{
    if (cu_proc == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUcontext ctx = t_depth > 0 ? t_stack[t_depth - 1] : NULL;
    if (!cu_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = ctx;
    return CUDA_SUCCESS;
}

/* The driver's defaults: 1 KiB of stack per thread, a 1 MiB printf FIFO,
 * an 8 MiB device malloc heap. Their memory is part of the context. */
static const size_t DEFAULT_LIMITS[3] = {1024, 1 << 20, 8 << 20};
#define SIM_THREADS_PER_SM 2048u

/* Device memory a limit's value reserves, as the real driver does: the
 * stack for every thread the device can hold at once, the FIFO and the heap
 * as they are. */
static uint64_t limit_bytes(CUlimit limit, size_t value)
{
    if (limit == CU_LIMIT_STACK_SIZE)
        return (uint64_t)value * cu_proc->st->config.sms * SIM_THREADS_PER_SM;
    return value;
}

/* What the context's limits cost beyond the defaults. */
static uint64_t limits_extra(const size_t limits[3])
{
    uint64_t extra = 0;
    for (CUlimit l = 0; l < 3; l++) {
        uint64_t now = limit_bytes(l, limits[l]), base = limit_bytes(l, DEFAULT_LIMITS[l]);
        extra += now > base ? now - base : 0;
    }
    return extra;
}

static CUresult ctx_start(CUcontext ctx, struct cu_device *d, int ordinal, bool primary, unsigned flags)
{
    CUresult r = cu_charge(d->dev, cu_proc->st->config.ctx_overhead);
    if (r != CUDA_SUCCESS)
        return r;
    memset(ctx, 0, sizeof(*ctx));
    ctx->dev = d->dev;
    ctx->ordinal = ordinal;
    ctx->primary = primary;
    ctx->flags = flags;
    ctx->legacy.tag = CU_TAG_STREAM;
    ctx->legacy.ctx = ctx;
    memcpy(ctx->limits, DEFAULT_LIMITS, sizeof(ctx->limits));
    ctx->tag = CU_TAG_CTX;
    return CUDA_SUCCESS;
}

/* Work in flight finishes, allocations go, the overhead is given back. */
static void ctx_stop(CUcontext ctx)
{
    cu_ctx_drop_held(ctx);
    cu_wait_until(atomic_load(&ctx->last_end));
    pthread_mutex_lock(&cu_lock);
    cu_table_release_ctx(ctx);
    pthread_mutex_unlock(&cu_lock);
    cu_uncharge(ctx->dev, cu_proc->st->config.ctx_overhead + ctx->limit_charged);
    ctx->limit_charged = 0;
    ctx->tag = CU_TAG_DEAD;
    for (int i = 0; i < t_depth; i++)
        if (t_stack[i] == ctx)
            t_stack[i] = NULL;
}

/* ---- primary contexts ---- */

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    struct cu_device *d;
    CUresult r = cu_device_of(dev, &d);
    if (r != CUDA_SUCCESS)
        return r;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&d->lock);
    if (d->primary_refs == 0)
        r = ctx_start(&d->primary, d, dev, true, d->primary.flags);
    if (r == CUDA_SUCCESS) {
        d->primary_refs++;
        *pctx = &d->primary;
    }
    pthread_mutex_unlock(&d->lock);
    return r;
}

static CUresult primary_release(CUdevice dev)
{
    struct cu_device *d;
    CUresult r = cu_device_of(dev, &d);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&d->lock);
    if (d->primary_refs == 0)
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (--d->primary_refs == 0)
        ctx_stop(&d->primary);
    pthread_mutex_unlock(&d->lock);
    return r;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return primary_release(dev);
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    return primary_release(dev);
}

static CUresult primary_reset(CUdevice dev)
{
    struct cu_device *d;
    CUresult r = cu_device_of(dev, &d);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&d->lock);
    if (d->primary_refs > 0)
        ctx_stop(&d->primary);
    d->primary_refs = 0;
    d->primary.flags = 0;
    pthread_mutex_unlock(&d->lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return primary_reset(dev);
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    return primary_reset(dev);
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    struct cu_device *d;
    CUresult r = cu_device_of(dev, &d);
    if (r != CUDA_SUCCESS)
        return r;
    if (flags == NULL || active == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&d->lock);
    *flags = d->primary.flags;
    *active = d->primary_refs > 0;
    pthread_mutex_unlock(&d->lock);
    return CUDA_SUCCESS;
}

static CUresult primary_set_flags(CUdevice dev, unsigned int flags)
{
    struct cu_device *d;
    CUresult r = cu_device_of(dev, &d);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&d->lock);
    d->primary.flags = flags;
    pthread_mutex_unlock(&d->lock);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    return primary_set_flags(dev, flags);
}

CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    return primary_set_flags(dev, flags);
}

/* ---- created contexts ---- */

static CUresult push(CUcontext ctx)
{
    if (t_depth == CU_SIM_MAX_CTX_STACK)
        return CUDA_ERROR_INVALID_VALUE;
    t_stack[t_depth++] = ctx;
    return CUDA_SUCCESS;
}

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    struct cu_device *d;
    CUresult r = cu_device_of(dev, &d);
    if (r != CUDA_SUCCESS)
        return r;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (t_depth == CU_SIM_MAX_CTX_STACK)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = malloc(sizeof(*ctx));
    if (ctx == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = ctx_start(ctx, d, dev, false, flags);
    if (r != CUDA_SUCCESS) {
        free(ctx);
        return r;
    }
    push(ctx);
    *pctx = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return ctx_create(pctx, flags, dev);
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    return ctx_create(pctx, flags, dev);
}

/*
 * Execution affinity (an SM count) limits a context's resources only under
 * MPS, which the simulator does not model: like a GPU without MPS, any
 * affinity is refused and none at all makes a regular context.
 */
static CUresult check_affinity(const CUexecAffinityParam *params, int count)
{
    if (count < 0 || (count > 0 && params == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    return count == 0 ? CUDA_SUCCESS : CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                        unsigned int flags, CUdevice dev)
{
    CUresult r = check_affinity(paramsArray, numParams);
    return r != CUDA_SUCCESS ? r : ctx_create(pctx, flags, dev);
}

/* NULL parameters, or both pointers NULL: a regular context. CIG (sharing
 * with a D3D12/Vulkan client) has no graphics client to share with here. */
CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                        CUdevice dev)
{
    const CUctxCreateParams none = {NULL, 0, NULL};
    const CUctxCreateParams *p = ctxCreateParams != NULL ? ctxCreateParams : &none;
    if (p->execAffinityParams != NULL && p->cigParams != NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (p->cigParams != NULL)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult r = check_affinity(p->execAffinityParams, p->numExecAffinityParams);
    return r != CUDA_SUCCESS ? r : ctx_create(pctx, flags, dev);
}

static CUresult ctx_destroy(CUcontext ctx)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!cu_ctx_valid(ctx) || ctx->primary)
        return CUDA_ERROR_INVALID_CONTEXT;
    bool current = t_depth > 0 && t_stack[t_depth - 1] == ctx;
    ctx_stop(ctx);
    if (current)
        t_depth--;
    free(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxDestroy(CUcontext ctx)
{
    return ctx_destroy(ctx);
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    return ctx_destroy(ctx);
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = t_depth > 0 ? t_stack[t_depth - 1] : NULL;
    *pctx = cu_ctx_valid(ctx) ? ctx : NULL;
    return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (ctx == NULL) {
        if (t_depth > 0)
            t_depth--;
        return CUDA_SUCCESS;
    }
    if (!cu_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (t_depth == 0)
        return push(ctx);
    t_stack[t_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

static CUresult ctx_push(CUcontext ctx)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!cu_ctx_valid(ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    return push(ctx);
}

CUresult cuCtxPushCurrent(CUcontext ctx)
{
    return ctx_push(ctx);
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    return ctx_push(ctx);
}

static CUresult ctx_pop(CUcontext *pctx)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext ctx = t_stack[--t_depth];
    if (pctx != NULL)
        *pctx = cu_ctx_valid(ctx) ? ctx : NULL;
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *pctx)
{
    return ctx_pop(pctx);
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    return ctx_pop(pctx);
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    CUcontext ctx;
    CUresult r = cu_current(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *device = ctx->ordinal;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void)
{
    CUcontext ctx;
    CUresult r = cu_current(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    cu_ctx_wait_released(ctx, false); /* as a GPU would: never before held work has run */
    cu_wait_until(atomic_load(&ctx->last_end));
    return CUDA_SUCCESS;
}

/* Stack, printf FIFO and malloc heap: growing one reserves device memory
 * for the context (OUT_OF_MEMORY if the device has none), shrinking it
 * gives the memory back. The other limits are accepted and not modelled. */
CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    CUcontext ctx;
    CUresult r = cu_current(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (limit < 0 || limit > CU_LIMIT_MALLOC_HEAP_SIZE)
        return limit <= 6 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    size_t next[3];
    memcpy(next, ctx->limits, sizeof(next));
    next[limit] = value;
    uint64_t extra = limits_extra(next);
    if (extra > ctx->limit_charged && (r = cu_charge(ctx->dev, extra - ctx->limit_charged)) != CUDA_SUCCESS)
        return r;
    if (extra < ctx->limit_charged)
        cu_uncharge(ctx->dev, ctx->limit_charged - extra);
    ctx->limit_charged = extra;
    ctx->limits[limit] = value;
    return CUDA_SUCCESS;
}

CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit)
{
    CUcontext ctx;
    CUresult r = cu_current(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (pvalue == NULL || limit < 0 || limit > CU_LIMIT_MALLOC_HEAP_SIZE)
        return CUDA_ERROR_INVALID_VALUE;
    *pvalue = ctx->limits[limit];
    return CUDA_SUCCESS;
}
