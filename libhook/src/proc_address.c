/*
 * proc_address.c - cuGetProcAddress and cuGetProcAddress_v2: the road of
 * the CUDA runtime (11.3+), which fetches every entry point it uses this way
 * for the CUDA version it was built against.
 *
 * We call the driver with the caller's exact arguments, then replace the
 * pointer it returns by our wrapper of the SAME variant, so a caller that
 * asked for version N keeps version N's ABI:
 *   1. pointer identity with the driver's exported entry points we hook
 *      (resolved with the real dlsym at init) - what real drivers do;
 *   2. a pointer that is some other exported entry point (a variant we do
 *      not wrap, or a function we do not hook) goes back untouched;
 *   3. a pointer the driver does not export: the version table of hooks.h
 *      decides which variant the caller asked for.
 * A failing call is returned untouched, and so is anything we do not hook.
 */
#include <dlfcn.h>

#include "hooks.h"
#include "vgpu.h"

static void *substitute(const char *symbol, void *fn, int cuda_version, cuuint64_t flags)
{
    const struct hook_entry *row = hooks_by_real(fn);
    if (row != NULL)
        return row->wrapper;
    Dl_info info;
    if (dladdr(fn, &info) != 0 && info.dli_saddr == fn && info.dli_sname != NULL)
        return fn; /* an exported entry point we do not wrap */
    int ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    row = hooks_by_version(symbol, cuda_version, ptsz);
    if (row == NULL || row->wrapper == NULL || *row->real == NULL)
        return fn;
    log_detail("cuGetProcAddress(%s, %d): unexported driver pointer, using %s", symbol,
               cuda_version, row->name);
    return row->wrapper;
}

/* Resolution must work even when the configuration is bad, so that the
 * runtime reaches cuInit and reports the configured error from there. */
static CUresult proc_address_enter(void)
{
    return resolve_init() == 0 ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

VGPU_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                      cuuint64_t flags)
{
    CUresult rc = proc_address_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (vgpu_real_cuda.cuGetProcAddress == NULL)
        return CUDA_ERROR_NOT_FOUND;
    rc = vgpu_real_cuda.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && pfn != NULL && *pfn != NULL)
        *pfn = substitute(symbol, *pfn, cudaVersion, flags);
    return rc;
}

VGPU_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *symbolStatus)
{
    CUresult rc = proc_address_enter();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (vgpu_real_cuda.cuGetProcAddress_v2 == NULL)
        return CUDA_ERROR_NOT_FOUND;
    rc = vgpu_real_cuda.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS && pfn != NULL && *pfn != NULL)
        *pfn = substitute(symbol, *pfn, cudaVersion, flags);
    return rc;
}
