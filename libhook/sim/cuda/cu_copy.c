/*
 * cu_copy.c - copies and sets. Device memory is host memory, so a copy is
 * a memcpy once the device side of it is checked against the allocation
 * table (a bad device pointer gets CUDA_ERROR_INVALID_VALUE, not a crash).
 * Synchronous calls first wait for the context's queued work, as the
 * legacy default stream does; asynchronous ones take effect when their
 * stream reaches them (at once unless it is held) and add no device time.
 */
#include <string.h>

#include "cu_sim.h"

enum side { HOST_SIDE, DEVICE_SIDE };
/* Synchronous, or queued on a stream (NULL meaning the legacy or the
 * per-thread default stream). */
enum mode { SYNC, ASYNC, ASYNC_PER_THREAD };

static CUresult check(uintptr_t p, size_t n, enum side side)
{
    return side == HOST_SIDE || cu_range_known(p, n) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Context checks and, for synchronous calls, the wait for queued work
 * (held work of the streams the legacy stream synchronises with included). */
static CUresult enter(CUstream h, enum mode mode, CUstream *s)
{
    if (mode != SYNC)
        return cu_stream_resolve(h, mode == ASYNC_PER_THREAD, s);
    CUcontext ctx;
    CUresult r = cu_current(&ctx);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&cu_api_lock);
        cu_ctx_wait_released(ctx, true);
        pthread_mutex_unlock(&cu_api_lock);
        cu_wait_until(atomic_load(&ctx->last_end));
    }
    return r;
}

/* An asynchronous copy is stream work: at once, or when a held stream is
 * released. Like the driver, a pageable source is staged before the call
 * returns and a copy to pageable memory returns once it is done. */
static CUresult queue_copy(CUstream s, uintptr_t dst, enum side dst_side, uintptr_t src, enum side src_side,
                           size_t n)
{
    bool dst_known = dst_side == DEVICE_SIDE || cu_range_known(dst, n);
    bool src_known = src_side == DEVICE_SIDE || cu_range_known(src, n);
    if (s->capture != NULL) { /* capture records kernels only: the copy happens now */
        memmove((void *)dst, (const void *)src, n);
        return CUDA_SUCCESS;
    }
    CUresult r = cu_stream_submit(s, &(struct cu_work){.kind = CU_WORK_COPY,
                                                       .copy = {.dst = dst,
                                                                .src = src,
                                                                .n = n,
                                                                .dst_known = dst_known,
                                                                .src_known = src_known,
                                                                .stage = !src_known}});
    if (r == CUDA_SUCCESS && !dst_known)
        cu_stream_wait_released(s);
    return r;
}

static CUresult copy(uintptr_t dst, enum side dst_side, uintptr_t src, enum side src_side, size_t n,
                     CUstream stream, enum mode mode)
{
    CUstream s = NULL;
    CUresult r = enter(stream, mode, &s);
    if (r != CUDA_SUCCESS || n == 0)
        return r;
    if (dst == 0 || src == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = check(dst, n, dst_side)) != CUDA_SUCCESS || (r = check(src, n, src_side)) != CUDA_SUCCESS)
        return r;
    if (mode != SYNC)
        return queue_copy(s, dst, dst_side, src, src_side, n);
    memmove((void *)dst, (const void *)src, n);
    return CUDA_SUCCESS;
}

/* Unified addressing: either side may be host or device memory. */
static enum side side_of(uintptr_t p, size_t n)
{
    return cu_range_known(p, n) ? DEVICE_SIDE : HOST_SIDE;
}

static CUresult copy_unified(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream, enum mode mode)
{
    return copy(dst, side_of(dst, n), src, side_of(src, n), n, stream, mode);
}

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    return copy_unified(dst, src, ByteCount, NULL, SYNC);
}

CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    return copy_unified(dst, src, ByteCount, NULL, SYNC);
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    return copy_unified(dst, src, ByteCount, hStream, ASYNC);
}

CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    return copy_unified(dst, src, ByteCount, hStream, ASYNC_PER_THREAD);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    return copy(dstDevice, DEVICE_SIDE, (uintptr_t)srcHost, HOST_SIDE, ByteCount, NULL, SYNC);
}

CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    return copy(dstDevice, DEVICE_SIDE, (uintptr_t)srcHost, HOST_SIDE, ByteCount, NULL, SYNC);
}

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    return copy((uintptr_t)dstHost, HOST_SIDE, srcDevice, DEVICE_SIDE, ByteCount, NULL, SYNC);
}

CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    return copy((uintptr_t)dstHost, HOST_SIDE, srcDevice, DEVICE_SIDE, ByteCount, NULL, SYNC);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    return copy(dstDevice, DEVICE_SIDE, srcDevice, DEVICE_SIDE, ByteCount, NULL, SYNC);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
    return copy(dstDevice, DEVICE_SIDE, (uintptr_t)srcHost, HOST_SIDE, ByteCount, hStream, ASYNC);
}

CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    return copy((uintptr_t)dstHost, HOST_SIDE, srcDevice, DEVICE_SIDE, ByteCount, hStream, ASYNC);
}

CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    return copy((uintptr_t)dstHost, HOST_SIDE, srcDevice, DEVICE_SIDE, ByteCount, hStream, ASYNC_PER_THREAD);
}

CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    CUresult r = enter(NULL, SYNC, NULL);
    if (r != CUDA_SUCCESS || N == 0)
        return r;
    if ((r = check(dstDevice, N, DEVICE_SIDE)) != CUDA_SUCCESS)
        return r;
    memset((void *)(uintptr_t)dstDevice, uc, N);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    CUresult r = enter(NULL, SYNC, NULL);
    if (r != CUDA_SUCCESS || N == 0)
        return r;
    if (dstDevice % 4 != 0 || N > SIZE_MAX / 4)
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = check(dstDevice, N * 4, DEVICE_SIDE)) != CUDA_SUCCESS)
        return r;
    uint32_t *p = (uint32_t *)(uintptr_t)dstDevice;
    for (size_t i = 0; i < N; i++)
        p[i] = ui;
    return CUDA_SUCCESS;
}
