/*
 * ctx_hooks.c - contexts and modules: forwarded, bracketed by an overhead
 * measurement (overhead.c). Creating a context or loading a module whose
 * overhead does not fit in the budget is undone and answered with
 * CUDA_ERROR_OUT_OF_MEMORY. A context that goes away takes its allocations
 * with it (the driver frees them): their bytes go back. Context limits that
 * reserve device memory (cuCtxSetLimit) are charged before the driver call.
 */
#include <pthread.h>

#include "gputime.h"
#include "vgpu.h"

/* The primary context handle of each device, as cuDevicePrimaryCtxRetain
 * returned it: allocations made in it die when it is released or reset. */
static _Atomic(CUcontext) primary_ctx[VGPU_MAX_DEVICES];
/* Serialises cuCtxSetLimit's read-charge-call-record (a rare call). */
static pthread_mutex_t limit_lock = PTHREAD_MUTEX_INITIALIZER;

void ctx_hooks_reset(void)
{
    pthread_mutex_init(&limit_lock, NULL);
    for (int i = 0; i < VGPU_MAX_DEVICES; i++)
        atomic_store(&primary_ctx[i], NULL);
}

static int probe_device(CUdevice dev, struct overhead_probe *probe)
{
    int index = vgpu_limited() ? devmap_index(dev) : VGPU_DEV_UNTRACKED;
    overhead_begin(probe, dev, index);
    return index;
}

static int probe_current(struct overhead_probe *probe)
{
    CUdevice dev = 0;
    int index = vgpu_limited() ? devmap_current(&dev) : VGPU_DEV_UNTRACKED;
    overhead_begin(probe, dev, index);
    return index;
}

/* After a successful creation: charge it, or undo it. */
static CUresult created(struct overhead_probe *probe, CUresult rc, const char *what,
                        CUcontext *pctx, CUresult (*destroy)(CUcontext))
{
    if (rc != CUDA_SUCCESS || probe->index == VGPU_DEV_UNTRACKED)
        return rc;
    if (probe->index == VGPU_DEV_FOREIGN || overhead_end(probe) != 0) {
        destroy(*pctx);
        *pctx = NULL;
        return budget_oom(probe->index, what, probe->wanted);
    }
    return rc;
}

VGPU_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    VGPU_CUDA_ENTER(cuCtxCreate);
    struct overhead_probe probe;
    probe_device(dev, &probe);
    CUresult rc = vgpu_real_cuda.cuCtxCreate(pctx, flags, dev);
    return created(&probe, rc, "context creation", pctx, vgpu_real_cuda.cuCtxDestroy_v2);
}

VGPU_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    VGPU_CUDA_ENTER(cuCtxCreate_v2);
    struct overhead_probe probe;
    probe_device(dev, &probe);
    CUresult rc = vgpu_real_cuda.cuCtxCreate_v2(pctx, flags, dev);
    return created(&probe, rc, "context creation", pctx, vgpu_real_cuda.cuCtxDestroy_v2);
}

/* What a CUDA 11.4-12.x runtime creates contexts with (execution affinity);
 * the parameters are the driver's to read. */
VGPU_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray,
                                    int numParams, unsigned int flags, CUdevice dev)
{
    VGPU_CUDA_ENTER(cuCtxCreate_v3);
    struct overhead_probe probe;
    probe_device(dev, &probe);
    CUresult rc = vgpu_real_cuda.cuCtxCreate_v3(pctx, paramsArray, numParams, flags, dev);
    return created(&probe, rc, "context creation", pctx, vgpu_real_cuda.cuCtxDestroy_v2);
}

/* What a CUDA 12.5+ runtime creates contexts with (affinity or CIG). */
VGPU_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                    unsigned int flags, CUdevice dev)
{
    VGPU_CUDA_ENTER(cuCtxCreate_v4);
    struct overhead_probe probe;
    probe_device(dev, &probe);
    CUresult rc = vgpu_real_cuda.cuCtxCreate_v4(pctx, ctxCreateParams, flags, dev);
    return created(&probe, rc, "context creation", pctx, vgpu_real_cuda.cuCtxDestroy_v2);
}

static CUresult destroy_ctx(CUcontext ctx, CUresult (*destroy)(CUcontext))
{
    struct overhead_probe probe = {.index = VGPU_DEV_UNTRACKED};
    CUdevice dev;
    if (vgpu_limited() && devmap_ctx_device(ctx, &dev) == 0)
        probe_device(dev, &probe);
    CUresult rc = destroy(ctx);
    if (rc == CUDA_SUCCESS) {
        mem_ctx_destroyed(ctx); /* before measuring: what is tracked is gone */
        gt_touch_forget(ctx);
        overhead_end(&probe);
    }
    return rc;
}

VGPU_EXPORT CUresult cuCtxDestroy(CUcontext ctx)
{
    VGPU_CUDA_ENTER(cuCtxDestroy);
    return destroy_ctx(ctx, vgpu_real_cuda.cuCtxDestroy);
}

VGPU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    VGPU_CUDA_ENTER(cuCtxDestroy_v2);
    return destroy_ctx(ctx, vgpu_real_cuda.cuCtxDestroy_v2);
}

static CUresult primary_release(CUdevice dev)
{
    return vgpu_real_cuda.cuDevicePrimaryCtxRelease_v2 != NULL
               ? vgpu_real_cuda.cuDevicePrimaryCtxRelease_v2(dev)
               : vgpu_real_cuda.cuDevicePrimaryCtxRelease(dev);
}

static void note_primary(CUdevice dev, CUresult rc, const CUcontext *pctx)
{
    int index = devmap_index(dev);
    if (rc == CUDA_SUCCESS && index >= 0)
        atomic_store(&primary_ctx[index], *pctx);
}

/* Only the retain that brings the primary context to life costs memory;
 * every retain tells which handle the primary context has. */
VGPU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    VGPU_CUDA_ENTER(cuDevicePrimaryCtxRetain);
    unsigned int flags = 0;
    int active = 1;
    if (!vgpu_limited())
        return vgpu_real_cuda.cuDevicePrimaryCtxRetain(pctx, dev);
    if (vgpu_real_cuda.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS ||
        active) {
        CUresult rc = vgpu_real_cuda.cuDevicePrimaryCtxRetain(pctx, dev);
        note_primary(dev, rc, pctx);
        return rc;
    }
    struct overhead_probe probe;
    int index = probe_device(dev, &probe);
    CUresult rc = vgpu_real_cuda.cuDevicePrimaryCtxRetain(pctx, dev);
    note_primary(dev, rc, pctx);
    if (rc != CUDA_SUCCESS || index == VGPU_DEV_UNTRACKED)
        return rc;
    if (index == VGPU_DEV_FOREIGN || overhead_end(&probe) != 0) {
        primary_release(dev);
        *pctx = NULL;
        return budget_oom(index, "primary context creation", probe.wanted);
    }
    return rc;
}

/* Release and reset may destroy the primary context (the last release
 * does; a reset always does): its allocations go with it. Re-measure. */
static CUresult primary_drop(CUdevice dev, CUresult (*call)(CUdevice))
{
    struct overhead_probe probe;
    int index = probe_device(dev, &probe);
    CUresult rc = call(dev);
    if (rc != CUDA_SUCCESS)
        return rc;
    unsigned int flags = 0;
    int active = 1;
    if (index >= 0 &&
        vgpu_real_cuda.cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS &&
        !active) {
        mem_ctx_destroyed(atomic_load(&primary_ctx[index]));
        gt_touch_forget(atomic_load(&primary_ctx[index]));
    }
    overhead_end(&probe);
    return rc;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    VGPU_CUDA_ENTER(cuDevicePrimaryCtxRelease);
    return primary_drop(dev, vgpu_real_cuda.cuDevicePrimaryCtxRelease);
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    VGPU_CUDA_ENTER(cuDevicePrimaryCtxRelease_v2);
    return primary_drop(dev, vgpu_real_cuda.cuDevicePrimaryCtxRelease_v2);
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    VGPU_CUDA_ENTER(cuDevicePrimaryCtxReset);
    return primary_drop(dev, vgpu_real_cuda.cuDevicePrimaryCtxReset);
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    VGPU_CUDA_ENTER(cuDevicePrimaryCtxReset_v2);
    return primary_drop(dev, vgpu_real_cuda.cuDevicePrimaryCtxReset_v2);
}

/* ---- modules: their code and data live in device memory ------------------ */

/* `own`: the hook's own module, whose refusal is no OOM of the application's. */
static CUresult loaded(struct overhead_probe *probe, CUresult rc, CUmodule *module, bool own)
{
    if (rc != CUDA_SUCCESS || probe->index < 0)
        return rc;
    if (overhead_end(probe) != 0) {
        vgpu_real_cuda.cuModuleUnload(*module);
        *module = NULL;
        return own ? CUDA_ERROR_OUT_OF_MEMORY
                   : budget_oom(probe->index, "module load", probe->wanted);
    }
    return rc;
}

VGPU_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    VGPU_CUDA_ENTER(cuModuleLoadData);
    struct overhead_probe probe;
    probe_current(&probe);
    return loaded(&probe, vgpu_real_cuda.cuModuleLoadData(module, image), module, false);
}

CUresult ctx_own_module_load(CUmodule *module, const void *image)
{
    struct overhead_probe probe;
    probe_current(&probe);
    return loaded(&probe, vgpu_real_cuda.cuModuleLoadData(module, image), module, true);
}

VGPU_EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image,
                                        unsigned int numOptions, CUjit_option *options,
                                        void **optionValues)
{
    VGPU_CUDA_ENTER(cuModuleLoadDataEx);
    struct overhead_probe probe;
    probe_current(&probe);
    CUresult rc =
        vgpu_real_cuda.cuModuleLoadDataEx(module, image, numOptions, options, optionValues);
    return loaded(&probe, rc, module, false);
}

VGPU_EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
    VGPU_CUDA_ENTER(cuModuleUnload);
    struct overhead_probe probe;
    probe_current(&probe);
    CUresult rc = vgpu_real_cuda.cuModuleUnload(hmod);
    if (rc == CUDA_SUCCESS)
        overhead_end(&probe);
    return rc;
}

/* ---- context limits ------------------------------------------------------
 * The driver reserves device memory for the stack, the printf FIFO and the
 * device malloc heap of a context, and grows the reservation when a limit
 * is raised (cuCtxSetLimit; the runtime's cudaDeviceSetLimit ends here) -
 * with no allocation call. We charge an estimate BEFORE the driver call:
 *   stack        bytes per thread x SM count x max resident threads per SM
 *                (every thread the device can hold at once has its stack)
 *   printf FIFO  its size
 *   malloc heap  its size
 * counted beyond the limit's value when the hook first saw the context (that
 * memory is in the context's measured overhead). One entry per context and
 * limit (SPACE_LIMIT) holds the charge: lowering a limit gives back the
 * difference, destroying the context all of it. An estimate off from what
 * the driver really reserves shows up in the context overhead at the next
 * measurement and in the daemon's NVML reconciliation. Other limits
 * (launch queue depths) are forwarded untouched. */

static uint64_t limit_bytes(CUlimit limit, size_t value, CUdevice dev)
{
    if (limit != CU_LIMIT_STACK_SIZE)
        return value;
    int sms = 0, per_sm = 0;
    if (vgpu_real_cuda.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                            dev) != CUDA_SUCCESS || sms < 1)
        sms = 1;
    if (vgpu_real_cuda.cuDeviceGetAttribute(&per_sm,
                                            CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
                                            dev) != CUDA_SUCCESS || per_sm < 1)
        per_sm = 1;
    return vgpu_mul_sat(value, (uint64_t)sms * (uint64_t)per_sm);
}

VGPU_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value)
{
    VGPU_CUDA_ENTER(cuCtxSetLimit);
    CUdevice dev = 0;
    CUcontext ctx = NULL;
    bool memory = limit == CU_LIMIT_STACK_SIZE || limit == CU_LIMIT_PRINTF_FIFO_SIZE ||
                  limit == CU_LIMIT_MALLOC_HEAP_SIZE;
    int index = vgpu_limited() && memory ? devmap_current(&dev) : VGPU_DEV_UNTRACKED;
    if (index == VGPU_DEV_UNTRACKED || vgpu_real_cuda.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS ||
        ctx == NULL)
        return vgpu_real_cuda.cuCtxSetLimit(limit, value);
    uint64_t key = ((uint64_t)(uintptr_t)ctx << 2) | (uint64_t)limit;
    pthread_mutex_lock(&limit_lock);
    struct alloc_info cur = {.index = index, .kind = ALLOC_LIMIT, .ctx = ctx};
    if (allocmap_take(SPACE_LIMIT, key, &cur) != 0) {
        size_t first = 0;
        if (vgpu_real_cuda.cuCtxGetLimit == NULL ||
            vgpu_real_cuda.cuCtxGetLimit(&first, limit) != CUDA_SUCCESS)
            first = 0; /* unknown: the whole new value is charged */
        cur.aux = first;
    }
    uint64_t want = limit_bytes(limit, value, dev), had = limit_bytes(limit, cur.aux, dev);
    uint64_t target = want > had ? want - had : 0;
    CUresult rc = CUDA_SUCCESS;
    if (target > cur.size && budget_reserve(index, target - cur.size) != 0)
        rc = budget_oom(index, "cuCtxSetLimit", target - cur.size);
    if (rc == CUDA_SUCCESS) {
        rc = vgpu_real_cuda.cuCtxSetLimit(limit, value);
        if (rc != CUDA_SUCCESS && target > cur.size)
            budget_release(index, target - cur.size);
        else if (rc == CUDA_SUCCESS && target < cur.size)
            budget_release(index, cur.size - target);
        if (rc == CUDA_SUCCESS)
            cur.size = target;
    }
    if (allocmap_put(SPACE_LIMIT, key, &cur) != 0)
        log_error("%s: the limit stays charged until the process exits", vgpu_error());
    pthread_mutex_unlock(&limit_lock);
    return rc;
}
