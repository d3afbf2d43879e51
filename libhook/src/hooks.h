/*
 * hooks.h - the one table of intercepted entry points.
 *
 * Every function libvgpu.so wraps is named here exactly once, grouped by the
 * module that implements the wrapper. Each module owns one list; adding a
 * module means adding a list and naming it in HOOK_CUDA_LIST, nothing else.
 * The wrapper is the exported function of the same name (it interposes on
 * the driver for programs linked to libcuda); the same row feeds
 *   - the dlsym override (hooked name -> our wrapper),
 *   - cuGetProcAddress (driver pointer -> our wrapper of the same variant),
 *   - the fallback version table for cuGetProcAddress results that match no
 *     exported entry point.
 *
 * X(name, base, since, ptsz)
 *   name   the exported, versioned entry point (must be in CUDA_API_LIST)
 *   base   the name a caller passes to cuGetProcAddress (no suffix)
 *   since  the first cudaVersion for which the driver hands out this variant
 *   ptsz   1 for the per-thread-default-stream variant (_ptsz/_ptds)
 *
 * For a base name, the fallback picks the variant with the highest `since`
 * not above the caller's cudaVersion, among the rows whose ptsz matches the
 * caller's CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM flag (rows with
 * ptsz 0 when the base has no per-thread variant). HOOK_NEWER_LIST names the
 * variants of a hooked base that we deliberately do not wrap: when the
 * fallback lands on one of them, the driver's pointer goes back untouched,
 * so a caller can never receive an older ABI than it asked for.
 */
#ifndef VGPU_HOOKS_H
#define VGPU_HOOKS_H

#include "launch_hooks.h"

/* init.c / proc_address.c: entry and symbol resolution */
#define HOOK_INIT_LIST(X) \
    X(cuInit, cuInit, 2000, 0) \
    X(cuGetProcAddress, cuGetProcAddress, 11030, 0) \
    X(cuGetProcAddress_v2, cuGetProcAddress, 12000, 0)

/* ctx_hooks.c: context creation and module loads (overhead measurement),
 * context destruction (its allocations go with it), context limits */
#define HOOK_CTX_LIST(X) \
    X(cuCtxCreate, cuCtxCreate, 2000, 0) \
    X(cuCtxCreate_v2, cuCtxCreate, 3020, 0) \
    X(cuCtxCreate_v3, cuCtxCreate, 11040, 0) \
    X(cuCtxCreate_v4, cuCtxCreate, 12050, 0) \
    X(cuCtxDestroy, cuCtxDestroy, 2000, 0) \
    X(cuCtxDestroy_v2, cuCtxDestroy, 4000, 0) \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, 0) \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease, 7000, 0) \
    X(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease, 11000, 0) \
    X(cuDevicePrimaryCtxReset, cuDevicePrimaryCtxReset, 7000, 0) \
    X(cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset, 11000, 0) \
    X(cuModuleLoadData, cuModuleLoadData, 2000, 0) \
    X(cuModuleLoadDataEx, cuModuleLoadDataEx, 2010, 0) \
    X(cuModuleUnload, cuModuleUnload, 2000, 0) \
    X(cuCtxSetLimit, cuCtxSetLimit, 3010, 0)

/* mem_hooks.c: every device allocation path, its free, and the memory view */
#define HOOK_MEM_LIST(X) \
    X(cuMemGetInfo, cuMemGetInfo, 2000, 0) \
    X(cuMemGetInfo_v2, cuMemGetInfo, 3020, 0) \
    X(cuDeviceTotalMem, cuDeviceTotalMem, 2000, 0) \
    X(cuDeviceTotalMem_v2, cuDeviceTotalMem, 3020, 0) \
    X(cuMemAlloc, cuMemAlloc, 2000, 0) \
    X(cuMemAlloc_v2, cuMemAlloc, 3020, 0) \
    X(cuMemAllocPitch, cuMemAllocPitch, 2000, 0) \
    X(cuMemAllocPitch_v2, cuMemAllocPitch, 3020, 0) \
    X(cuMemAllocManaged, cuMemAllocManaged, 6000, 0) \
    X(cuMemFree, cuMemFree, 2000, 0) \
    X(cuMemFree_v2, cuMemFree, 3020, 0) \
    X(cuMemAllocAsync, cuMemAllocAsync, 11020, 0) \
    X(cuMemAllocAsync_ptsz, cuMemAllocAsync, 11020, 1) \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 0) \
    X(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, 11020, 1) \
    X(cuMemFreeAsync, cuMemFreeAsync, 11020, 0) \
    X(cuMemFreeAsync_ptsz, cuMemFreeAsync, 11020, 1) \
    X(cuMemPoolCreate, cuMemPoolCreate, 11020, 0) \
    X(cuMemPoolTrimTo, cuMemPoolTrimTo, 11020, 0) \
    X(cuMemPoolDestroy, cuMemPoolDestroy, 11020, 0) \
    X(cuMemCreate, cuMemCreate, 10020, 0) \
    X(cuMemRelease, cuMemRelease, 10020, 0) \
    X(cuMemMap, cuMemMap, 10020, 0) \
    X(cuMemUnmap, cuMemUnmap, 10020, 0) \
    X(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000, 0) \
    X(cuMemMapArrayAsync, cuMemMapArrayAsync, 11010, 0) \
    X(cuMemMapArrayAsync_ptsz, cuMemMapArrayAsync, 11010, 1) \
    X(cuMemAddressFree, cuMemAddressFree, 10020, 0) \
    X(cuMulticastCreate, cuMulticastCreate, 12010, 0) \
    X(cuArrayCreate, cuArrayCreate, 2000, 0) \
    X(cuArrayCreate_v2, cuArrayCreate, 3020, 0) \
    X(cuArray3DCreate, cuArray3DCreate, 2000, 0) \
    X(cuArray3DCreate_v2, cuArray3DCreate, 3020, 0) \
    X(cuArrayDestroy, cuArrayDestroy, 2000, 0) \
    X(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, 0) \
    X(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, 0) \
    X(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, 11040, 0) \
    X(cuGraphAddMemFreeNode, cuGraphAddMemFreeNode, 11040, 0) \
    X(cuGraphAddNode, cuGraphAddNode, 12020, 0) \
    X(cuGraphAddNode_v2, cuGraphAddNode, 12030, 0) \
    X(cuGraphInstantiate, cuGraphInstantiate, 10000, 0) \
    X(cuGraphInstantiate_v2, cuGraphInstantiate, 11000, 0) \
    X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, 11040, 0) \
    X(cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 12000, 0) \
    X(cuGraphInstantiateWithParams_ptsz, cuGraphInstantiateWithParams, 12000, 1) \
    X(cuGraphDestroy, cuGraphDestroy, 10000, 0) \
    X(cuDeviceGraphMemTrim, cuDeviceGraphMemTrim, 11040, 0)

/* share_hooks.c: memory handed to other processes (its charge is pinned) */
#define HOOK_SHARE_LIST(X) \
    X(cuIpcGetMemHandle, cuIpcGetMemHandle, 4010, 0) \
    X(cuMemExportToShareableHandle, cuMemExportToShareableHandle, 10020, 0)

/*
 * Launch interception is the compute module's (launch_hooks.c): it defines
 * HOOK_LAUNCH_LIST in its own header and adds it to HOOK_CUDA_LIST below.
 */
#define HOOK_CUDA_LIST(X) \
    HOOK_INIT_LIST(X) \
    HOOK_CTX_LIST(X) \
    HOOK_MEM_LIST(X) \
    HOOK_SHARE_LIST(X) \
    HOOK_LAUNCH_LIST(X)

/* Variants of hooked bases that we forward untouched (see above). */
#define HOOK_NEWER_LIST(X) \
    HOOK_LAUNCH_NEWER_LIST(X)

/* nvml_hooks.c: what a process sees through NVML. NVML has no
 * cuGetProcAddress, so a row is just the exported name. */
#define HOOK_NVML_LIST(X) \
    X(nvmlDeviceGetMemoryInfo) \
    X(nvmlDeviceGetMemoryInfo_v2) \
    X(nvmlDeviceGetComputeRunningProcesses) \
    X(nvmlDeviceGetComputeRunningProcesses_v2) \
    X(nvmlDeviceGetComputeRunningProcesses_v3) \
    X(nvmlDeviceGetGraphicsRunningProcesses) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v2) \
    X(nvmlDeviceGetGraphicsRunningProcesses_v3) \
    X(nvmlDeviceGetMPSComputeRunningProcesses) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v2) \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v3)

/* One row of the table, built in hooks.c from the lists above. */
struct hook_entry {
    const char *name;
    const char *base;
    int since;
    int ptsz;
    void *wrapper;     /* NULL: a HOOK_NEWER_LIST row, forwarded untouched */
    void *const *real; /* the driver's pointer, filled by resolve.c */
};

/* Exact exported name -> row (CUDA and NVML rows), or NULL. */
const struct hook_entry *hooks_by_name(const char *name);
/* A driver pointer resolved at init -> the row of the same variant, or NULL. */
const struct hook_entry *hooks_by_real(const void *fn);
/* The fallback version table: the variant of `base` the driver would hand
 * out for (cudaVersion, per-thread flag), or NULL if `base` is not hooked. */
const struct hook_entry *hooks_by_version(const char *base, int cuda_version, int ptsz);
/* Is `name` one the dlsym override must look at? (cheap prefix test) */
int hooks_maybe_hooked(const char *name);

#endif
