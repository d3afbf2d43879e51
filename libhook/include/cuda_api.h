/*
 * cuda_api.h - the CUDA driver API types and functions vgpud touches,
 * declared from the public driver API reference. No CUDA toolkit or CUDA
 * header is used at build time.
 *
 * CUDA_API_LIST(X) names every driver entry point the hook intercepts or
 * needs, with its return type and parameter list. The hook builds its table
 * of real functions from it and the simulator implements each one, so the
 * two can never disagree about a signature.
 *
 * Only the ABI matters here: enums are plain ints, structs keep the
 * driver's field order and sizes.
 */
#ifndef VGPU_CUDA_API_H
#define VGPU_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef unsigned int cuuint32_t;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef int CUdevice_attribute;
typedef int CUarray_format;
typedef int CUjit_option;
typedef int CUstreamCaptureStatus;
typedef int CUstreamCaptureMode;
typedef int CUmemPool_attribute;
typedef int CUdriverProcAddressQueryResult;
typedef int CUpointer_attribute;
typedef int CUmemAllocationGranularity_flags;
typedef int CUfunction_attribute;
typedef int CUlimit;

typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUlib_st *CUlibrary;
typedef struct CUkern_st *CUkernel;
typedef struct CUarrayMapInfo_st CUarrayMapInfo; /* read by the driver only */

typedef struct {
    char bytes[16];
} CUuuid;

typedef struct {
    char reserved[64];
} CUipcMemHandle;

typedef struct {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    size_t Width;
    size_t Height;
    size_t Depth;
    CUarray_format Format;
    unsigned int NumChannels;
    unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR;

typedef struct {
    int type; /* CU_MEM_LOCATION_TYPE_* */
    int id;
} CUmemLocation;

typedef struct {
    int type;                 /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct {
    CUmemLocation location;
    int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;

typedef struct {
    int allocType;
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;

typedef struct {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr; /* out */
} CUDA_MEM_ALLOC_NODE_PARAMS;

typedef struct {
    int id; /* CUlaunchAttributeID */
    char pad[4];
    union {
        char pad[64];
    } value;
} CUlaunchAttribute;

typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

typedef struct {
    CUfunction function;
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    void **kernelParams;
} CUDA_LAUNCH_PARAMS;

/*
 * Context creation parameters of cuCtxCreate_v3 (an array of execution
 * affinities) and cuCtxCreate_v4 (CUctxCreateParams). The hook forwards the
 * pointers unread; only the simulator looks inside.
 */
typedef int CUexecAffinityType; /* CU_EXEC_AFFINITY_TYPE_SM_COUNT = 0 */

typedef struct {
    CUexecAffinityType type;
    union {
        struct {
            unsigned int val; /* the number of SMs the context may use */
        } smCount;
    } param;
} CUexecAffinityParam;

typedef struct {
    int sharedDataType; /* CUcigDataType */
    void *sharedData;
} CUctxCigParam;

/* Both NULL: a regular context; execAffinityParams and cigParams exclude
 * each other; numExecAffinityParams is 0 when execAffinityParams is NULL. */
typedef struct {
    CUexecAffinityParam *execAffinityParams;
    int numExecAffinityParams;
    CUctxCigParam *cigParams;
} CUctxCreateParams;

/* Graph edges (cuGraphAddNode_v2): the hook passes them through unread. */
typedef struct {
    unsigned char from_port;
    unsigned char to_port;
    unsigned char type;
    unsigned char reserved[5];
} CUgraphEdgeData;

typedef int CUgraphNodeType;
#define CU_GRAPH_NODE_TYPE_MEM_ALLOC 10
#define CU_GRAPH_NODE_TYPE_MEM_FREE 11

/* cuGraphAddNode's parameters: a type and a union of every node kind's
 * parameters; only the memory nodes' members are declared here. */
typedef struct {
    CUgraphNodeType type;
    int reserved0[3];
    union {
        long long reserved1[29];
        CUDA_MEM_ALLOC_NODE_PARAMS alloc; /* CUDA_MEM_ALLOC_NODE_PARAMS_v2: same layout */
        struct {
            CUdeviceptr dptr;
        } free;
    } u;
    long long reserved2;
} CUgraphNodeParams;

/* cuGraphInstantiateWithParams: flags in, result out. */
typedef struct {
    cuuint64_t flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

_Static_assert(sizeof(CUlaunchAttribute) == 72, "CUlaunchAttribute ABI");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp ABI");

/* An NVLink multicast object (cuMulticastCreate). */
typedef struct CUmulticastObjectProp_st {
    unsigned int numDevices;
    size_t size;
    unsigned long long handleTypes;
    unsigned long long flags;
} CUmulticastObjectProp;
_Static_assert(sizeof(CUmulticastObjectProp) == 32, "CUmulticastObjectProp ABI");
_Static_assert(sizeof(CUmemPoolProps) == 88, "CUmemPoolProps ABI");
_Static_assert(sizeof(CUDA_ARRAY3D_DESCRIPTOR) == 40, "CUDA_ARRAY3D_DESCRIPTOR ABI");
_Static_assert(sizeof(CUexecAffinityParam) == 8, "CUexecAffinityParam ABI");
_Static_assert(sizeof(CUctxCreateParams) == 24, "CUctxCreateParams ABI");
_Static_assert(sizeof(CUDA_MEM_ALLOC_NODE_PARAMS) == 120, "CUDA_MEM_ALLOC_NODE_PARAMS ABI");
_Static_assert(sizeof(CUgraphNodeParams) == 256, "CUgraphNodeParams ABI");
_Static_assert(sizeof(CUgraphEdgeData) == 8, "CUgraphEdgeData ABI");

/* CUresult values used by vgpud */
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_DEINITIALIZED 4
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_IMAGE 200
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_PTX 218
#define CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY 224
#define CUDA_ERROR_OPERATING_SYSTEM 304
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_LAUNCH_FAILED 719
#define CUDA_ERROR_NOT_PERMITTED 800
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CUDA_ERROR_UNKNOWN 999

/* cuGetProcAddress flags and results */
#define CU_GET_PROC_ADDRESS_DEFAULT 0
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#define CU_GET_PROC_ADDRESS_SUCCESS 0
#define CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND 1
#define CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT 2

/* device attributes */
#define CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK 1
#define CU_DEVICE_ATTRIBUTE_CLOCK_RATE 13
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_DEVICE_ATTRIBUTE_INTEGRATED 18
#define CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY 19
#define CU_DEVICE_ATTRIBUTE_PCI_BUS_ID 33
#define CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR 39
#define CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID 34
#define CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING 41
#define CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID 50
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY 83
#define CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS 89
#define CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH 95
#define CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
#define CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED 115
#define CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 92
#define CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1 93
#define CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1 94
#define CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS 122
#define CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR 123

/* memory */
#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_MEM_ATTACH_HOST 0x2
#define CU_MEMHOSTALLOC_PORTABLE 0x1
#define CU_MEMHOSTALLOC_DEVICEMAP 0x2
#define CU_MEMHOSTALLOC_WRITECOMBINED 0x4
#define CU_MEMHOSTREGISTER_PORTABLE 0x1
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x2
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_LOCATION_TYPE_HOST 2
#define CU_MEM_LOCATION_TYPE_HOST_NUMA 3
#define CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT 4
#define CU_MEM_ALLOCATION_TYPE_PINNED 1
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1
#define CU_AD_FORMAT_UNSIGNED_INT8 0x01
#define CU_AD_FORMAT_UNSIGNED_INT16 0x02
#define CU_AD_FORMAT_UNSIGNED_INT32 0x03
#define CU_AD_FORMAT_SIGNED_INT8 0x08
#define CU_AD_FORMAT_SIGNED_INT16 0x09
#define CU_AD_FORMAT_SIGNED_INT32 0x0a
#define CU_AD_FORMAT_HALF 0x10
#define CU_AD_FORMAT_FLOAT 0x20

/* context limits (cuCtxSetLimit) */
#define CU_LIMIT_STACK_SIZE 0x00
#define CU_LIMIT_PRINTF_FIFO_SIZE 0x01
#define CU_LIMIT_MALLOC_HEAP_SIZE 0x02

/* CUDA_ARRAY3D_DESCRIPTOR flags */
#define CUDA_ARRAY3D_LAYERED 0x01
#define CUDA_ARRAY3D_CUBEMAP 0x04

/* streams and capture */
#define CU_STREAM_DEFAULT 0x0
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_STREAM_WAIT_VALUE_GEQ 0x0
#define CU_STREAM_WAIT_VALUE_EQ 0x1
#define CU_STREAM_WAIT_VALUE_AND 0x2
#define CU_STREAM_WAIT_VALUE_NOR 0x3
#define CU_STREAM_WAIT_VALUE_FLUSH (1u << 30)
#define CU_STREAM_WRITE_VALUE_DEFAULT 0x0
#define CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER 0x1
#define CU_STREAM_CAPTURE_STATUS_NONE 0
#define CU_STREAM_CAPTURE_STATUS_ACTIVE 1
#define CU_STREAM_CAPTURE_STATUS_INVALIDATED 2
#define CU_EVENT_DEFAULT 0x0
#define CU_EVENT_BLOCKING_SYNC 0x1
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_EVENT_WAIT_EXTERNAL 0x1
#define CU_STREAM_LEGACY ((CUstream)0x1)
#define CU_STREAM_PER_THREAD ((CUstream)0x2)

/*
 * X(ret, name, params, args): every entry point. `args` repeats the
 * parameter names so generic wrappers can forward a call.
 * Versioned names (_v2, _v3, _ptsz, _ptds) are distinct ABIs and listed as
 * such; the plain name is the oldest ABI.
 */
#define CUDA_API_LIST(X) \
    /* initialisation and version */ \
    X(CUresult, cuInit, (unsigned int Flags), (Flags)) \
    X(CUresult, cuDriverGetVersion, (int *driverVersion), (driverVersion)) \
    X(CUresult, cuGetErrorString, (CUresult error, const char **pStr), (error, pStr)) \
    X(CUresult, cuGetErrorName, (CUresult error, const char **pStr), (error, pStr)) \
    X(CUresult, cuGetProcAddress, (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags), (symbol, pfn, cudaVersion, flags)) \
    X(CUresult, cuGetProcAddress_v2, (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus), (symbol, pfn, cudaVersion, flags, symbolStatus)) \
    X(CUresult, cuGetExportTable, (const void **ppExportTable, const CUuuid *pExportTableId), (ppExportTable, pExportTableId)) \
    /* devices */ \
    X(CUresult, cuDeviceGet, (CUdevice *device, int ordinal), (device, ordinal)) \
    X(CUresult, cuDeviceGetCount, (int *count), (count)) \
    X(CUresult, cuDeviceGetName, (char *name, int len, CUdevice dev), (name, len, dev)) \
    X(CUresult, cuDeviceGetUuid, (CUuuid *uuid, CUdevice dev), (uuid, dev)) \
    X(CUresult, cuDeviceGetUuid_v2, (CUuuid *uuid, CUdevice dev), (uuid, dev)) \
    X(CUresult, cuDeviceTotalMem, (unsigned int *bytes, CUdevice dev), (bytes, dev)) \
    X(CUresult, cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev), (bytes, dev)) \
    X(CUresult, cuDeviceGetAttribute, (int *pi, CUdevice_attribute attrib, CUdevice dev), (pi, attrib, dev)) \
    X(CUresult, cuDeviceGetPCIBusId, (char *pciBusId, int len, CUdevice dev), (pciBusId, len, dev)) \
    X(CUresult, cuDeviceGetByPCIBusId, (CUdevice *dev, const char *pciBusId), (dev, pciBusId)) \
    X(CUresult, cuDeviceComputeCapability, (int *major, int *minor, CUdevice dev), (major, minor, dev)) \
    X(CUresult, cuDeviceGetDefaultMemPool, (CUmemoryPool *pool_out, CUdevice dev), (pool_out, dev)) \
    X(CUresult, cuDeviceGetMemPool, (CUmemoryPool *pool, CUdevice dev), (pool, dev)) \
    X(CUresult, cuDeviceSetMemPool, (CUdevice dev, CUmemoryPool pool), (dev, pool)) \
    X(CUresult, cuDeviceGraphMemTrim, (CUdevice device), (device)) \
    /* contexts */ \
    X(CUresult, cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev), (pctx, dev)) \
    X(CUresult, cuDevicePrimaryCtxRelease, (CUdevice dev), (dev)) \
    X(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice dev), (dev)) \
    X(CUresult, cuDevicePrimaryCtxReset, (CUdevice dev), (dev)) \
    X(CUresult, cuDevicePrimaryCtxReset_v2, (CUdevice dev), (dev)) \
    X(CUresult, cuDevicePrimaryCtxGetState, (CUdevice dev, unsigned int *flags, int *active), (dev, flags, active)) \
    X(CUresult, cuDevicePrimaryCtxSetFlags, (CUdevice dev, unsigned int flags), (dev, flags)) \
    X(CUresult, cuDevicePrimaryCtxSetFlags_v2, (CUdevice dev, unsigned int flags), (dev, flags)) \
    X(CUresult, cuCtxCreate, (CUcontext *pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev)) \
    X(CUresult, cuCtxCreate_v2, (CUcontext *pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev)) \
    X(CUresult, cuCtxCreate_v3, (CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags, CUdevice dev), (pctx, paramsArray, numParams, flags, dev)) \
    X(CUresult, cuCtxCreate_v4, (CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev), (pctx, ctxCreateParams, flags, dev)) \
    X(CUresult, cuCtxDestroy, (CUcontext ctx), (ctx)) \
    X(CUresult, cuCtxDestroy_v2, (CUcontext ctx), (ctx)) \
    X(CUresult, cuCtxGetCurrent, (CUcontext *pctx), (pctx)) \
    X(CUresult, cuCtxSetCurrent, (CUcontext ctx), (ctx)) \
    X(CUresult, cuCtxPushCurrent, (CUcontext ctx), (ctx)) \
    X(CUresult, cuCtxPushCurrent_v2, (CUcontext ctx), (ctx)) \
    X(CUresult, cuCtxPopCurrent, (CUcontext *pctx), (pctx)) \
    X(CUresult, cuCtxPopCurrent_v2, (CUcontext *pctx), (pctx)) \
    X(CUresult, cuCtxGetDevice, (CUdevice *device), (device)) \
    X(CUresult, cuCtxSynchronize, (void), ()) \
    X(CUresult, cuCtxSetLimit, (CUlimit limit, size_t value), (limit, value)) \
    X(CUresult, cuCtxGetLimit, (size_t *pvalue, CUlimit limit), (pvalue, limit)) \
    /* device memory */ \
    X(CUresult, cuMemGetInfo, (unsigned int *free, unsigned int *total), (free, total)) \
    X(CUresult, cuMemGetInfo_v2, (size_t *free, size_t *total), (free, total)) \
    X(CUresult, cuMemAlloc, (CUdeviceptr *dptr, unsigned int bytesize), (dptr, bytesize)) \
    X(CUresult, cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytesize), (dptr, bytesize)) \
    X(CUresult, cuMemAllocPitch, (CUdeviceptr *dptr, unsigned int *pPitch, unsigned int WidthInBytes, unsigned int Height, unsigned int ElementSizeBytes), (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes)) \
    X(CUresult, cuMemAllocPitch_v2, (CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes), (dptr, pPitch, WidthInBytes, Height, ElementSizeBytes)) \
    X(CUresult, cuMemAllocManaged, (CUdeviceptr *dptr, size_t bytesize, unsigned int flags), (dptr, bytesize, flags)) \
    X(CUresult, cuMemFree, (CUdeviceptr dptr), (dptr)) \
    X(CUresult, cuMemFree_v2, (CUdeviceptr dptr), (dptr)) \
    X(CUresult, cuMemGetAddressRange_v2, (CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr), (pbase, psize, dptr)) \
    X(CUresult, cuPointerGetAttribute, (void *data, CUpointer_attribute attribute, CUdeviceptr ptr), (data, attribute, ptr)) \
    /* host memory (not device memory; needed for oversubscription) */ \
    X(CUresult, cuMemAllocHost, (void **pp, unsigned int bytesize), (pp, bytesize)) \
    X(CUresult, cuMemAllocHost_v2, (void **pp, size_t bytesize), (pp, bytesize)) \
    X(CUresult, cuMemHostAlloc, (void **pp, size_t bytesize, unsigned int Flags), (pp, bytesize, Flags)) \
    X(CUresult, cuMemFreeHost, (void *p), (p)) \
    X(CUresult, cuMemHostGetDevicePointer, (CUdeviceptr *pdptr, void *p, unsigned int Flags), (pdptr, p, Flags)) \
    X(CUresult, cuMemHostGetDevicePointer_v2, (CUdeviceptr *pdptr, void *p, unsigned int Flags), (pdptr, p, Flags)) \
    X(CUresult, cuMemHostRegister, (void *p, size_t bytesize, unsigned int Flags), (p, bytesize, Flags)) \
    X(CUresult, cuMemHostRegister_v2, (void *p, size_t bytesize, unsigned int Flags), (p, bytesize, Flags)) \
    X(CUresult, cuMemHostUnregister, (void *p), (p)) \
    /* copies and sets */ \
    X(CUresult, cuMemcpy, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount), (dst, src, ByteCount)) \
    X(CUresult, cuMemcpy_ptds, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount), (dst, src, ByteCount)) \
    X(CUresult, cuMemcpyAsync, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream), (dst, src, ByteCount, hStream)) \
    X(CUresult, cuMemcpyAsync_ptsz, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream), (dst, src, ByteCount, hStream)) \
    X(CUresult, cuMemcpyHtoD_v2_ptds, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount), (dstDevice, srcHost, ByteCount)) \
    X(CUresult, cuMemcpyDtoH_v2_ptds, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount), (dstHost, srcDevice, ByteCount)) \
    X(CUresult, cuMemcpyDtoHAsync_v2_ptsz, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream), (dstHost, srcDevice, ByteCount, hStream)) \
    X(CUresult, cuMemcpyHtoD_v2, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount), (dstDevice, srcHost, ByteCount)) \
    X(CUresult, cuMemcpyDtoH_v2, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount), (dstHost, srcDevice, ByteCount)) \
    X(CUresult, cuMemcpyDtoD_v2, (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount), (dstDevice, srcDevice, ByteCount)) \
    X(CUresult, cuMemcpyHtoDAsync_v2, (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream), (dstDevice, srcHost, ByteCount, hStream)) \
    X(CUresult, cuMemcpyDtoHAsync_v2, (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream), (dstHost, srcDevice, ByteCount, hStream)) \
    X(CUresult, cuMemsetD8_v2, (CUdeviceptr dstDevice, unsigned char uc, size_t N), (dstDevice, uc, N)) \
    X(CUresult, cuMemsetD32_v2, (CUdeviceptr dstDevice, unsigned int ui, size_t N), (dstDevice, ui, N)) \
    /* stream-ordered allocation and pools */ \
    X(CUresult, cuMemAllocAsync, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream), (dptr, bytesize, hStream)) \
    X(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUstream hStream), (dptr, bytesize, hStream)) \
    X(CUresult, cuMemAllocFromPoolAsync, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream), (dptr, bytesize, pool, hStream)) \
    X(CUresult, cuMemAllocFromPoolAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream), (dptr, bytesize, pool, hStream)) \
    X(CUresult, cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream), (dptr, hStream)) \
    X(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream hStream), (dptr, hStream)) \
    X(CUresult, cuMemPoolCreate, (CUmemoryPool *pool, const CUmemPoolProps *poolProps), (pool, poolProps)) \
    X(CUresult, cuMemPoolDestroy, (CUmemoryPool pool), (pool)) \
    X(CUresult, cuMemPoolTrimTo, (CUmemoryPool pool, size_t minBytesToKeep), (pool, minBytesToKeep)) \
    X(CUresult, cuMemPoolSetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value), (pool, attr, value)) \
    X(CUresult, cuMemPoolGetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value), (pool, attr, value)) \
    /* virtual memory management */ \
    X(CUresult, cuMemCreate, (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags), (handle, size, prop, flags)) \
    X(CUresult, cuMemRelease, (CUmemGenericAllocationHandle handle), (handle)) \
    X(CUresult, cuMemAddressReserve, (CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags), (ptr, size, alignment, addr, flags)) \
    X(CUresult, cuMemAddressFree, (CUdeviceptr ptr, size_t size), (ptr, size)) \
    X(CUresult, cuMemMap, (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags), (ptr, size, offset, handle, flags)) \
    X(CUresult, cuMemUnmap, (CUdeviceptr ptr, size_t size), (ptr, size)) \
    X(CUresult, cuMemMapArrayAsync, (CUarrayMapInfo *mapInfoList, unsigned int count, CUstream hStream), (mapInfoList, count, hStream)) \
    X(CUresult, cuMemMapArrayAsync_ptsz, (CUarrayMapInfo *mapInfoList, unsigned int count, CUstream hStream), (mapInfoList, count, hStream)) \
    X(CUresult, cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle *handle, void *addr), (handle, addr)) \
    X(CUresult, cuMemSetAccess, (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count), (ptr, size, desc, count)) \
    X(CUresult, cuMemGetAllocationGranularity, (size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option), (granularity, prop, option)) \
    X(CUresult, cuMemExportToShareableHandle, (void *shareableHandle, CUmemGenericAllocationHandle handle, int handleType, unsigned long long flags), (shareableHandle, handle, handleType, flags)) \
    X(CUresult, cuMemImportFromShareableHandle, (CUmemGenericAllocationHandle *handle, void *osHandle, int shHandleType), (handle, osHandle, shHandleType)) \
    /* arrays */ \
    X(CUresult, cuArrayCreate, (CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray), (pHandle, pAllocateArray)) \
    X(CUresult, cuArrayCreate_v2, (CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray), (pHandle, pAllocateArray)) \
    X(CUresult, cuArray3DCreate, (CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray), (pHandle, pAllocateArray)) \
    X(CUresult, cuArray3DCreate_v2, (CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray), (pHandle, pAllocateArray)) \
    X(CUresult, cuArrayDestroy, (CUarray hArray), (hArray)) \
    X(CUresult, cuMipmappedArrayCreate, (CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc, unsigned int numMipmapLevels), (pHandle, pMipmappedArrayDesc, numMipmapLevels)) \
    X(CUresult, cuMipmappedArrayDestroy, (CUmipmappedArray hMipmappedArray), (hMipmappedArray)) \
    /* peers and NVLink multicast */ \
    X(CUresult, cuDeviceCanAccessPeer, (int *canAccessPeer, CUdevice dev, CUdevice peerDev), (canAccessPeer, dev, peerDev)) \
    X(CUresult, cuCtxEnablePeerAccess, (CUcontext peerContext, unsigned int Flags), (peerContext, Flags)) \
    X(CUresult, cuCtxDisablePeerAccess, (CUcontext peerContext), (peerContext)) \
    X(CUresult, cuMemcpyPeer, (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount), (dstDevice, dstContext, srcDevice, srcContext, ByteCount)) \
    X(CUresult, cuMemcpyPeerAsync, (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount, CUstream hStream), (dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream)) \
    X(CUresult, cuMulticastCreate, (CUmemGenericAllocationHandle *mcHandle, const CUmulticastObjectProp *prop), (mcHandle, prop)) \
    /* IPC */ \
    X(CUresult, cuIpcGetMemHandle, (CUipcMemHandle *pHandle, CUdeviceptr dptr), (pHandle, dptr)) \
    X(CUresult, cuIpcOpenMemHandle, (CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags), (pdptr, handle, Flags)) \
    X(CUresult, cuIpcOpenMemHandle_v2, (CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags), (pdptr, handle, Flags)) \
    X(CUresult, cuIpcCloseMemHandle, (CUdeviceptr dptr), (dptr)) \
    /* modules */ \
    X(CUresult, cuModuleLoadData, (CUmodule *module, const void *image), (module, image)) \
    X(CUresult, cuModuleLoadDataEx, (CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options, void **optionValues), (module, image, numOptions, options, optionValues)) \
    X(CUresult, cuModuleGetFunction, (CUfunction *hfunc, CUmodule hmod, const char *name), (hfunc, hmod, name)) \
    X(CUresult, cuModuleUnload, (CUmodule hmod), (hmod)) \
    X(CUresult, cuFuncGetAttribute, (int *pi, CUfunction_attribute attrib, CUfunction hfunc), (pi, attrib, hfunc)) \
    /* streams and events */ \
    X(CUresult, cuStreamCreate, (CUstream *phStream, unsigned int Flags), (phStream, Flags)) \
    X(CUresult, cuStreamDestroy, (CUstream hStream), (hStream)) \
    X(CUresult, cuStreamDestroy_v2, (CUstream hStream), (hStream)) \
    X(CUresult, cuStreamGetCtx, (CUstream hStream, CUcontext *pctx), (hStream, pctx)) \
    X(CUresult, cuStreamGetCtx_ptsz, (CUstream hStream, CUcontext *pctx), (hStream, pctx)) \
    X(CUresult, cuStreamSynchronize, (CUstream hStream), (hStream)) \
    X(CUresult, cuStreamSynchronize_ptsz, (CUstream hStream), (hStream)) \
    X(CUresult, cuStreamQuery, (CUstream hStream), (hStream)) \
    X(CUresult, cuStreamQuery_ptsz, (CUstream hStream), (hStream)) \
    X(CUresult, cuStreamBeginCapture, (CUstream hStream), (hStream)) \
    X(CUresult, cuStreamBeginCapture_v2, (CUstream hStream, CUstreamCaptureMode mode), (hStream, mode)) \
    X(CUresult, cuStreamBeginCapture_ptsz, (CUstream hStream), (hStream)) \
    X(CUresult, cuStreamBeginCapture_v2_ptsz, (CUstream hStream, CUstreamCaptureMode mode), (hStream, mode)) \
    X(CUresult, cuStreamEndCapture, (CUstream hStream, CUgraph *phGraph), (hStream, phGraph)) \
    X(CUresult, cuStreamEndCapture_ptsz, (CUstream hStream, CUgraph *phGraph), (hStream, phGraph)) \
    X(CUresult, cuStreamIsCapturing, (CUstream hStream, CUstreamCaptureStatus *captureStatus), (hStream, captureStatus)) \
    X(CUresult, cuStreamIsCapturing_ptsz, (CUstream hStream, CUstreamCaptureStatus *captureStatus), (hStream, captureStatus)) \
    X(CUresult, cuStreamWaitEvent, (CUstream hStream, CUevent hEvent, unsigned int Flags), (hStream, hEvent, Flags)) \
    X(CUresult, cuStreamWaitEvent_ptsz, (CUstream hStream, CUevent hEvent, unsigned int Flags), (hStream, hEvent, Flags)) \
    /* stream memory operations */ \
    X(CUresult, cuStreamWaitValue32, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuStreamWaitValue32_ptsz, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuStreamWaitValue32_v2, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuStreamWaitValue32_v2_ptsz, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuStreamWriteValue32, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuStreamWriteValue32_ptsz, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuStreamWriteValue32_v2, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuStreamWriteValue32_v2_ptsz, (CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuStreamWaitValue64, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuStreamWaitValue64_ptsz, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuStreamWaitValue64_v2, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuStreamWaitValue64_v2_ptsz, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuStreamWriteValue64, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuStreamWriteValue64_ptsz, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuStreamWriteValue64_v2, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuStreamWriteValue64_v2_ptsz, (CUstream stream, CUdeviceptr addr, cuuint64_t value, unsigned int flags), (stream, addr, value, flags)) \
    X(CUresult, cuEventCreate, (CUevent *phEvent, unsigned int Flags), (phEvent, Flags)) \
    X(CUresult, cuEventDestroy, (CUevent hEvent), (hEvent)) \
    X(CUresult, cuEventDestroy_v2, (CUevent hEvent), (hEvent)) \
    X(CUresult, cuEventRecord, (CUevent hEvent, CUstream hStream), (hEvent, hStream)) \
    X(CUresult, cuEventRecord_ptsz, (CUevent hEvent, CUstream hStream), (hEvent, hStream)) \
    X(CUresult, cuEventQuery, (CUevent hEvent), (hEvent)) \
    X(CUresult, cuEventSynchronize, (CUevent hEvent), (hEvent)) \
    X(CUresult, cuEventElapsedTime, (float *pMilliseconds, CUevent hStart, CUevent hEnd), (pMilliseconds, hStart, hEnd)) \
    X(CUresult, cuEventElapsedTime_v2, (float *pMilliseconds, CUevent hStart, CUevent hEnd), (pMilliseconds, hStart, hEnd)) \
    /* launches */ \
    X(CUresult, cuLaunchKernel, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra), (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra)) \
    X(CUresult, cuLaunchKernel_ptsz, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra), (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams, extra)) \
    X(CUresult, cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra), (config, f, kernelParams, extra)) \
    X(CUresult, cuLaunchKernelEx_ptsz, (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra), (config, f, kernelParams, extra)) \
    X(CUresult, cuLaunchCooperativeKernel, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams), (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams)) \
    X(CUresult, cuLaunchCooperativeKernel_ptsz, (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams), (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, kernelParams)) \
    X(CUresult, cuLaunchCooperativeKernelMultiDevice, (CUDA_LAUNCH_PARAMS *launchParamsList, unsigned int numDevices, unsigned int flags), (launchParamsList, numDevices, flags)) \
    X(CUresult, cuLaunch, (CUfunction f), (f)) \
    X(CUresult, cuLaunchGrid, (CUfunction f, int grid_width, int grid_height), (f, grid_width, grid_height)) \
    X(CUresult, cuLaunchGridAsync, (CUfunction f, int grid_width, int grid_height, CUstream hStream), (f, grid_width, grid_height, hStream)) \
    /* graphs */ \
    X(CUresult, cuGraphCreate, (CUgraph *phGraph, unsigned int flags), (phGraph, flags)) \
    X(CUresult, cuGraphDestroy, (CUgraph hGraph), (hGraph)) \
    X(CUresult, cuGraphAddKernelNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, const void *nodeParams), (phGraphNode, hGraph, dependencies, numDependencies, nodeParams)) \
    X(CUresult, cuGraphAddMemAllocNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams), (phGraphNode, hGraph, dependencies, numDependencies, nodeParams)) \
    X(CUresult, cuGraphAddMemFreeNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, CUdeviceptr dptr), (phGraphNode, hGraph, dependencies, numDependencies, dptr)) \
    X(CUresult, cuGraphAddNode, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, size_t numDependencies, CUgraphNodeParams *nodeParams), (phGraphNode, hGraph, dependencies, numDependencies, nodeParams)) \
    X(CUresult, cuGraphAddNode_v2, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData, size_t numDependencies, CUgraphNodeParams *nodeParams), (phGraphNode, hGraph, dependencies, dependencyData, numDependencies, nodeParams)) \
    X(CUresult, cuGraphInstantiate, (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize), (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize)) \
    X(CUresult, cuGraphInstantiate_v2, (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize), (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize)) \
    X(CUresult, cuGraphInstantiateWithParams, (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams), (phGraphExec, hGraph, instantiateParams)) \
    X(CUresult, cuGraphInstantiateWithParams_ptsz, (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams), (phGraphExec, hGraph, instantiateParams)) \
    X(CUresult, cuGraphInstantiateWithFlags, (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags), (phGraphExec, hGraph, flags)) \
    X(CUresult, cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream)) \
    X(CUresult, cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream)) \
    X(CUresult, cuGraphExecDestroy, (CUgraphExec hGraphExec), (hGraphExec))

#define CUDA_API_DECLARE(ret, name, params, args) ret name params;
CUDA_API_LIST(CUDA_API_DECLARE)
#undef CUDA_API_DECLARE

#endif
