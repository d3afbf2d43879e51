/*
 * ctx_hooks.c - contexts and modules: forwarded, bracketed by an overhead
 * measurement (overhead.c). Creating a context or loading a module whose
 * overhead does not fit in the budget is undone and answered with
 * CUDA_ERROR_OUT_OF_MEMORY.
 */
#include "vgpu.h"

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

/* The device of a context that may not be current. */
static int ctx_device(CUcontext ctx, CUdevice *dev)
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
    if (vgpu_limited() && ctx_device(ctx, &dev) == 0)
        probe_device(dev, &probe);
    CUresult rc = destroy(ctx);
    if (rc == CUDA_SUCCESS)
        overhead_end(&probe);
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

/* Only the retain that brings the primary context to life costs memory. */
VGPU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    VGPU_CUDA_ENTER(cuDevicePrimaryCtxRetain);
    unsigned int flags = 0;
    int active = 1;
    if (!vgpu_limited() ||
        vgpu_real_cuda.cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS ||
        active)
        return vgpu_real_cuda.cuDevicePrimaryCtxRetain(pctx, dev);
    struct overhead_probe probe;
    int index = probe_device(dev, &probe);
    CUresult rc = vgpu_real_cuda.cuDevicePrimaryCtxRetain(pctx, dev);
    if (rc != CUDA_SUCCESS || index == VGPU_DEV_UNTRACKED)
        return rc;
    if (index == VGPU_DEV_FOREIGN || overhead_end(&probe) != 0) {
        primary_release(dev);
        *pctx = NULL;
        return budget_oom(index, "primary context creation", probe.wanted);
    }
    return rc;
}

/* Release and reset may destroy the primary context: re-measure. */
static CUresult primary_drop(CUdevice dev, CUresult (*call)(CUdevice))
{
    struct overhead_probe probe;
    probe_device(dev, &probe);
    CUresult rc = call(dev);
    if (rc == CUDA_SUCCESS)
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

static CUresult loaded(struct overhead_probe *probe, CUresult rc, CUmodule *module)
{
    if (rc != CUDA_SUCCESS || probe->index < 0)
        return rc;
    if (overhead_end(probe) != 0) {
        vgpu_real_cuda.cuModuleUnload(*module);
        *module = NULL;
        return budget_oom(probe->index, "module load", probe->wanted);
    }
    return rc;
}

VGPU_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    VGPU_CUDA_ENTER(cuModuleLoadData);
    struct overhead_probe probe;
    probe_current(&probe);
    return loaded(&probe, vgpu_real_cuda.cuModuleLoadData(module, image), module);
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
    return loaded(&probe, rc, module);
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
