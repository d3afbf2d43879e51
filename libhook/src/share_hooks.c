/*
 * share_hooks.c - memory handed to other processes.
 *
 * Each byte is charged once, to the vGPU whose process allocated it. An
 * importer (cuIpcOpenMemHandle, cuMemImportFromShareableHandle and the
 * cuMemMap of what it imported) is charged nothing and can give nothing
 * back: none of its calls finds the memory in its own allocation map.
 *
 * The exporter keeps the charge. The driver keeps shared memory while any
 * process maps it (for VMM handles, documented: every handle and mapping
 * of every process must go; for legacy IPC, a free before the importer's
 * close is undefined), so a free here may free nothing on the device. The
 * hook cannot see other processes' references: an exported allocation,
 * once freed, stays charged to this process until it exits. Without that
 * a tenant could export, let a second process map, free, and allocate
 * again - device memory the budget no longer counts. Over-charging the
 * exporter harms only the exporter (docs/security.md, "Allocation roads").
 */
#include <stdatomic.h>

#include "vgpu.h"

static bool mark_exported(struct alloc_info *info, const void *arg)
{
    (void)arg;
    info->exported = true;
    return false;
}

void share_pin(const struct alloc_info *info)
{
    static _Atomic uint64_t serial;
    struct alloc_info pinned = *info;
    pinned.ctx = NULL; /* no context's destruction gives it back either */
    if (allocmap_put(SPACE_PINNED, atomic_fetch_add(&serial, 1) + 1, &pinned) != 0)
        log_error("%s: an exported allocation stays charged, untracked", vgpu_error());
    log_detail("exported allocation of %llu bytes freed: charged until the process exits",
               (unsigned long long)info->size);
}

/* The IPC handle names the whole allocation that holds dptr. */
VGPU_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    VGPU_CUDA_ENTER(cuIpcGetMemHandle);
    CUresult rc = vgpu_real_cuda.cuIpcGetMemHandle(pHandle, dptr);
    if (rc != CUDA_SUCCESS || !vgpu_limited())
        return rc;
    CUdeviceptr base = dptr;
    size_t size;
    if (allocmap_update(SPACE_PTR, base, mark_exported, NULL, NULL) < 0 &&
        vgpu_real_cuda.cuMemGetAddressRange_v2 != NULL &&
        vgpu_real_cuda.cuMemGetAddressRange_v2(&base, &size, dptr) == CUDA_SUCCESS && base != dptr)
        allocmap_update(SPACE_PTR, base, mark_exported, NULL, NULL);
    return rc;
}

VGPU_EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                                  CUmemGenericAllocationHandle handle,
                                                  int handleType, unsigned long long flags)
{
    VGPU_CUDA_ENTER(cuMemExportToShareableHandle);
    CUresult rc = vgpu_real_cuda.cuMemExportToShareableHandle(shareableHandle, handle, handleType, flags);
    if (rc == CUDA_SUCCESS && vgpu_limited())
        allocmap_update(SPACE_HANDLE, handle, mark_exported, NULL, NULL);
    return rc;
}
