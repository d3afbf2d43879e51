/*
 * launch_hooks.c - the wrappers of HOOK_LAUNCH_LIST: every launch path goes
 * through the pacer and the GPU-time batches (gputime.c); the stream calls
 * around them mark where batches end and when capture is active.
 */
#include <stdlib.h>

#include "gputime.h"
#include "launch_hooks.h"
#include "vgpu.h"

/* Forward a launch on `stream` through a batch (or unmeasured). */
#define PACED_LAUNCH(name, stream, ptsz, graph, args) \
    do { \
        VGPU_CUDA_ENTER(name); \
        struct gt_launch launch_; \
        if (!gt_before(&launch_, (stream), (ptsz), (graph))) \
            return vgpu_real_cuda.name args; \
        CUresult rc_ = vgpu_real_cuda.name args; \
        gt_after(&launch_, rc_); \
        return rc_; \
    } while (0)

#define KERNEL_ARGS \
    (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, \
     kernelParams, extra)
#define COOP_ARGS \
    (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream, \
     kernelParams)

VGPU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                    unsigned int gridDimZ, unsigned int blockDimX,
                                    unsigned int blockDimY, unsigned int blockDimZ,
                                    unsigned int sharedMemBytes, CUstream hStream,
                                    void **kernelParams, void **extra)
{
    PACED_LAUNCH(cuLaunchKernel, hStream, false, false, KERNEL_ARGS);
}

VGPU_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                         unsigned int gridDimY, unsigned int gridDimZ,
                                         unsigned int blockDimX, unsigned int blockDimY,
                                         unsigned int blockDimZ, unsigned int sharedMemBytes,
                                         CUstream hStream, void **kernelParams, void **extra)
{
    PACED_LAUNCH(cuLaunchKernel_ptsz, hStream, true, false, KERNEL_ARGS);
}

VGPU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                      void **kernelParams, void **extra)
{
    PACED_LAUNCH(cuLaunchKernelEx, config != NULL ? config->hStream : NULL, false, false,
                 (config, f, kernelParams, extra));
}

VGPU_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                           void **kernelParams, void **extra)
{
    PACED_LAUNCH(cuLaunchKernelEx_ptsz, config != NULL ? config->hStream : NULL, true, false,
                 (config, f, kernelParams, extra));
}

VGPU_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                               unsigned int gridDimY, unsigned int gridDimZ,
                                               unsigned int blockDimX, unsigned int blockDimY,
                                               unsigned int blockDimZ,
                                               unsigned int sharedMemBytes, CUstream hStream,
                                               void **kernelParams)
{
    PACED_LAUNCH(cuLaunchCooperativeKernel, hStream, false, false, COOP_ARGS);
}

VGPU_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                                    unsigned int gridDimY, unsigned int gridDimZ,
                                                    unsigned int blockDimX,
                                                    unsigned int blockDimY,
                                                    unsigned int blockDimZ,
                                                    unsigned int sharedMemBytes,
                                                    CUstream hStream, void **kernelParams)
{
    PACED_LAUNCH(cuLaunchCooperativeKernel_ptsz, hStream, true, false, COOP_ARGS);
}

/* The legacy launches run on the NULL (legacy) stream. */
VGPU_EXPORT CUresult cuLaunch(CUfunction f)
{
    PACED_LAUNCH(cuLaunch, NULL, false, false, (f));
}

VGPU_EXPORT CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height)
{
    PACED_LAUNCH(cuLaunchGrid, NULL, false, false, (f, grid_width, grid_height));
}

VGPU_EXPORT CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height,
                                       CUstream hStream)
{
    PACED_LAUNCH(cuLaunchGridAsync, hStream, false, false, (f, grid_width, grid_height, hStream));
}

VGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    PACED_LAUNCH(cuGraphLaunch, hStream, false, true, (hGraphExec, hStream));
}

VGPU_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    PACED_LAUNCH(cuGraphLaunch_ptsz, hStream, true, true, (hGraphExec, hStream));
}

/* One launch on several devices: a batch of its own on each device's
 * stream. Streams are taken in address order so that two such launches on
 * the same streams cannot each hold one the other waits for. */
static int by_stream(const void *a, const void *b)
{
    const CUDA_LAUNCH_PARAMS *x = *(const CUDA_LAUNCH_PARAMS *const *)a;
    const CUDA_LAUNCH_PARAMS *y = *(const CUDA_LAUNCH_PARAMS *const *)b;
    return (x->hStream > y->hStream) - (x->hStream < y->hStream);
}

VGPU_EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *launchParamsList,
                                                          unsigned int numDevices,
                                                          unsigned int flags)
{
    VGPU_CUDA_ENTER(cuLaunchCooperativeKernelMultiDevice);
    if (launchParamsList == NULL || numDevices == 0 || numDevices > VGPU_MAX_DEVICES)
        return vgpu_real_cuda.cuLaunchCooperativeKernelMultiDevice(launchParamsList, numDevices,
                                                                   flags);
    const CUDA_LAUNCH_PARAMS *order[VGPU_MAX_DEVICES];
    struct gt_launch launch[VGPU_MAX_DEVICES];
    bool measured[VGPU_MAX_DEVICES];
    for (unsigned i = 0; i < numDevices; i++)
        order[i] = &launchParamsList[i];
    qsort(order, numDevices, sizeof(order[0]), by_stream);
    for (unsigned i = 0; i < numDevices; i++)
        measured[i] = gt_before(&launch[i], order[i]->hStream, false, true);
    CUresult rc =
        vgpu_real_cuda.cuLaunchCooperativeKernelMultiDevice(launchParamsList, numDevices, flags);
    for (unsigned i = numDevices; i-- > 0;)
        if (measured[i])
            gt_after(&launch[i], rc);
    return rc;
}

/* ---- where batches end ------------------------------------------------------ */

VGPU_EXPORT CUresult cuStreamSynchronize(CUstream hStream)
{
    VGPU_CUDA_ENTER(cuStreamSynchronize);
    gt_sync_point(hStream, false);
    return vgpu_real_cuda.cuStreamSynchronize(hStream);
}

VGPU_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    VGPU_CUDA_ENTER(cuStreamSynchronize_ptsz);
    gt_sync_point(hStream, true);
    return vgpu_real_cuda.cuStreamSynchronize_ptsz(hStream);
}

VGPU_EXPORT CUresult cuStreamQuery(CUstream hStream)
{
    VGPU_CUDA_ENTER(cuStreamQuery);
    gt_sync_point(hStream, false);
    return vgpu_real_cuda.cuStreamQuery(hStream);
}

VGPU_EXPORT CUresult cuStreamQuery_ptsz(CUstream hStream)
{
    VGPU_CUDA_ENTER(cuStreamQuery_ptsz);
    gt_sync_point(hStream, true);
    return vgpu_real_cuda.cuStreamQuery_ptsz(hStream);
}

VGPU_EXPORT CUresult cuCtxSynchronize(void)
{
    VGPU_CUDA_ENTER(cuCtxSynchronize);
    gt_ctx_sync_point();
    return vgpu_real_cuda.cuCtxSynchronize();
}

/* An application's event marks a point it will wait for or time. */
VGPU_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    VGPU_CUDA_ENTER(cuEventRecord);
    gt_sync_point(hStream, false);
    return vgpu_real_cuda.cuEventRecord(hEvent, hStream);
}

VGPU_EXPORT CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    VGPU_CUDA_ENTER(cuEventRecord_ptsz);
    gt_sync_point(hStream, true);
    return vgpu_real_cuda.cuEventRecord_ptsz(hEvent, hStream);
}

VGPU_EXPORT CUresult cuStreamDestroy(CUstream hStream)
{
    VGPU_CUDA_ENTER(cuStreamDestroy);
    gt_stream_destroy(hStream);
    return vgpu_real_cuda.cuStreamDestroy(hStream);
}

VGPU_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream)
{
    VGPU_CUDA_ENTER(cuStreamDestroy_v2);
    gt_stream_destroy(hStream);
    return vgpu_real_cuda.cuStreamDestroy_v2(hStream);
}

/* ---- copies: the host may wait for one behind any stream of the context --- */

#define COPY(name, args) \
    do { \
        VGPU_CUDA_ENTER(name); \
        gt_ctx_sync_point(); \
        return vgpu_real_cuda.name args; \
    } while (0)

VGPU_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    COPY(cuMemcpy, (dst, src, ByteCount));
}

VGPU_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    COPY(cuMemcpy_ptds, (dst, src, ByteCount));
}

VGPU_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                                   CUstream hStream)
{
    COPY(cuMemcpyAsync, (dst, src, ByteCount, hStream));
}

VGPU_EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                                        CUstream hStream)
{
    COPY(cuMemcpyAsync_ptsz, (dst, src, ByteCount, hStream));
}

VGPU_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    COPY(cuMemcpyHtoD_v2, (dstDevice, srcHost, ByteCount));
}

VGPU_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost,
                                          size_t ByteCount)
{
    COPY(cuMemcpyHtoD_v2_ptds, (dstDevice, srcHost, ByteCount));
}

VGPU_EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    COPY(cuMemcpyDtoH_v2, (dstHost, srcDevice, ByteCount));
}

VGPU_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    COPY(cuMemcpyDtoH_v2_ptds, (dstHost, srcDevice, ByteCount));
}

VGPU_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                          CUstream hStream)
{
    COPY(cuMemcpyDtoHAsync_v2, (dstHost, srcDevice, ByteCount, hStream));
}

VGPU_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice,
                                               size_t ByteCount, CUstream hStream)
{
    COPY(cuMemcpyDtoHAsync_v2_ptsz, (dstHost, srcDevice, ByteCount, hStream));
}

/* ---- capture: what is captured is charged when the graph is launched ----- */

#define BEGIN_CAPTURE(name, ptsz, args) \
    do { \
        VGPU_CUDA_ENTER(name); \
        gt_capture_begin(hStream, (ptsz)); \
        CUresult rc_ = vgpu_real_cuda.name args; \
        gt_capture_started(rc_); \
        return rc_; \
    } while (0)

VGPU_EXPORT CUresult cuStreamBeginCapture(CUstream hStream)
{
    BEGIN_CAPTURE(cuStreamBeginCapture, false, (hStream));
}

VGPU_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    BEGIN_CAPTURE(cuStreamBeginCapture_ptsz, true, (hStream));
}

VGPU_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    BEGIN_CAPTURE(cuStreamBeginCapture_v2, false, (hStream, mode));
}

VGPU_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    BEGIN_CAPTURE(cuStreamBeginCapture_v2_ptsz, true, (hStream, mode));
}

/* Whether the stream is capturing (or its capture was invalidated) before
 * EndCapture: then EndCapture ends a capture, whatever it returns. */
static bool capturing(CUstream hStream, bool ptsz)
{
    __typeof__(cuStreamIsCapturing) *is_capturing =
        ptsz ? vgpu_real_cuda.cuStreamIsCapturing_ptsz : vgpu_real_cuda.cuStreamIsCapturing;
    if (!vgpu_limited() || is_capturing == NULL)
        return false;
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult rc = is_capturing(hStream, &status);
    return rc == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
}

VGPU_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    VGPU_CUDA_ENTER(cuStreamEndCapture);
    bool was = capturing(hStream, false);
    CUresult rc = vgpu_real_cuda.cuStreamEndCapture(hStream, phGraph);
    gt_capture_ended(was);
    return rc;
}

VGPU_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    VGPU_CUDA_ENTER(cuStreamEndCapture_ptsz);
    bool was = capturing(hStream, true);
    CUresult rc = vgpu_real_cuda.cuStreamEndCapture_ptsz(hStream, phGraph);
    gt_capture_ended(was);
    return rc;
}
