/*
 * cu_procaddr.c - cuGetProcAddress(_v2): resolve a base symbol name to the
 * variant whose ABI the caller's CUDA version expects, the way the driver
 * does for the CUDA runtime. The exported table comes from CUDA_API_LIST,
 * so it always matches what this library implements. The version at which
 * each versioned variant became the default is in VARIANT_VERSIONS (and
 * docs/simulator.md); base names resolve at any version.
 */
#include <stdio.h>
#include <string.h>

#include "cu_sim.h"

struct export {
    const char *name;
    void *fn;
};

#define EXPORT_ENTRY(ret, name, params, args) {#name, (void *)name},
static const struct export EXPORTS[] = {CUDA_API_LIST(EXPORT_ENTRY)};
#undef EXPORT_ENTRY

struct variant_version {
    const char *name;
    int version; /* cudaVersion from which this variant is returned */
};

static const struct variant_version VARIANT_VERSIONS[] = {
    {"cuCtxCreate_v2", 3020},
    {"cuCtxCreate_v3", 11040},
    {"cuCtxCreate_v4", 12050},
    {"cuCtxDestroy_v2", 4000},
    {"cuCtxPushCurrent_v2", 4000},
    {"cuCtxPopCurrent_v2", 4000},
    {"cuDeviceTotalMem_v2", 3020},
    {"cuDeviceGetUuid_v2", 11040},
    {"cuDevicePrimaryCtxRelease_v2", 11000},
    {"cuDevicePrimaryCtxReset_v2", 11000},
    {"cuDevicePrimaryCtxSetFlags_v2", 11000},
    {"cuMemGetInfo_v2", 3020},
    {"cuMemAlloc_v2", 3020},
    {"cuMemAllocPitch_v2", 3020},
    {"cuMemFree_v2", 3020},
    {"cuMemGetAddressRange_v2", 3020},
    {"cuMemAllocHost_v2", 3020},
    {"cuMemHostGetDevicePointer_v2", 3020},
    {"cuMemHostRegister_v2", 6050},
    {"cuMemcpyHtoD_v2", 3020},
    {"cuMemcpyDtoH_v2", 3020},
    {"cuMemcpyDtoD_v2", 3020},
    {"cuMemcpyHtoDAsync_v2", 3020},
    {"cuMemcpyDtoHAsync_v2", 3020},
    {"cuMemsetD8_v2", 3020},
    {"cuMemsetD32_v2", 3020},
    {"cuArrayCreate_v2", 3020},
    {"cuArray3DCreate_v2", 3020},
    {"cuIpcOpenMemHandle_v2", 11000},
    {"cuStreamDestroy_v2", 4000},
    {"cuEventDestroy_v2", 4000},
    {"cuStreamBeginCapture_v2", 10010},
    {"cuEventElapsedTime_v2", 12080},
    {"cuGetProcAddress_v2", 12000},
    {"cuGraphAddNode_v2", 12030},
    {"cuGraphInstantiate_v2", 11000},
    {"cuStreamWaitValue32_v2", 11070},
    {"cuStreamWriteValue32_v2", 11070},
    {"cuStreamWaitValue64_v2", 11070},
    {"cuStreamWriteValue64_v2", 11070},
};

/* Base names whose CUDA header maps them onto another entry point from a
 * version on: the driver then answers with that entry point's newest
 * variant (CUDA 12's cuda.h: #define cuGraphInstantiate
 * cuGraphInstantiateWithFlags). */
static const struct {
    const char *base;
    int version;
    const char *target;
} RENAMED[] = {
    {"cuGraphInstantiate", 12000, "cuGraphInstantiateWithFlags"},
};

static bool ends_with(const char *s, size_t len, const char *suffix)
{
    size_t n = strlen(suffix);
    return len >= n && memcmp(s + len - n, suffix, n) == 0;
}

static bool is_per_thread(const char *name)
{
    return ends_with(name, strlen(name), "_ptsz") || ends_with(name, strlen(name), "_ptds");
}

/* Length of a variant's base name: without _vN (after _ptsz is gone). */
static size_t base_length(const char *name)
{
    size_t len = strlen(name), i = len;
    while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9')
        i--;
    if (i < len && i >= 2 && name[i - 1] == 'v' && name[i - 2] == '_')
        return i - 2;
    return len;
}

static int variant_version(const char *name)
{
    for (size_t i = 0; i < sizeof(VARIANT_VERSIONS) / sizeof(VARIANT_VERSIONS[0]); i++)
        if (strcmp(VARIANT_VERSIONS[i].name, name) == 0)
            return VARIANT_VERSIONS[i].version;
    return 0;
}

static const struct export *find_export(const char *name)
{
    for (size_t i = 0; i < sizeof(EXPORTS) / sizeof(EXPORTS[0]); i++)
        if (strcmp(EXPORTS[i].name, name) == 0)
            return &EXPORTS[i];
    return NULL;
}

static CUdriverProcAddressQueryResult resolve(const char *symbol, int version, cuuint64_t flags, void **pfn)
{
    for (size_t i = 0; i < sizeof(RENAMED) / sizeof(RENAMED[0]); i++)
        if (strcmp(symbol, RENAMED[i].base) == 0 && version >= RENAMED[i].version)
            symbol = RENAMED[i].target;
    size_t len = strlen(symbol);
    const struct export *best = NULL;
    int best_version = -1;
    bool known = false;
    for (size_t i = 0; i < sizeof(EXPORTS) / sizeof(EXPORTS[0]); i++) {
        const char *name = EXPORTS[i].name;
        if (is_per_thread(name) || base_length(name) != len || memcmp(name, symbol, len) != 0)
            continue;
        known = true;
        int v = variant_version(name);
        if (v <= version && v > best_version) {
            best = &EXPORTS[i];
            best_version = v;
        }
    }
    if (best == NULL)
        return known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        /* _ptsz for stream-ordered calls, _ptds for synchronous copies. */
        static const char *const suffixes[] = {"_ptsz", "_ptds"};
        for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++) {
            char per_thread[128];
            snprintf(per_thread, sizeof(per_thread), "%s%s", best->name, suffixes[i]);
            const struct export *p = find_export(per_thread);
            if (p != NULL) {
                best = p;
                break;
            }
        }
    }
    *pfn = best->fn;
    return CU_GET_PROC_ADDRESS_SUCCESS;
}

static CUresult get_proc_address(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *symbolStatus)
{
    if (symbol == NULL || pfn == NULL || flags > CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    CUdriverProcAddressQueryResult status = resolve(symbol, cudaVersion, flags, pfn);
    if (symbolStatus != NULL)
        *symbolStatus = status;
    return status == CU_GET_PROC_ADDRESS_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return get_proc_address(symbol, pfn, cudaVersion, flags, NULL);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    return get_proc_address(symbol, pfn, cudaVersion, flags, symbolStatus);
}
