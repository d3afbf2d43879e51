/*
 * cu_copy.c - copies and sets. Device memory is host memory, so a copy is
 * a memcpy once the device side of it is checked against the allocation
 * table (a bad device pointer gets CUDA_ERROR_INVALID_VALUE, not a crash).
 * Synchronous calls first wait for the context's queued work, as the
 * legacy default stream does; asynchronous ones take effect at once and
 * add no device time.
 */
#include <string.h>

#include "cu_sim.h"

enum side { HOST_SIDE, DEVICE_SIDE };

static CUresult check(uintptr_t p, size_t n, enum side side)
{
    return side == HOST_SIDE || cu_range_known(p, n) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* Context checks and, for synchronous calls, the wait for queued work. */
static CUresult enter(CUstream h, bool async)
{
    if (async) {
        CUstream s;
        return cu_stream_resolve(h, false, &s);
    }
    CUcontext ctx;
    CUresult r = cu_current(&ctx);
    if (r == CUDA_SUCCESS)
        cu_wait_until(atomic_load(&ctx->last_end));
    return r;
}

static CUresult copy(uintptr_t dst, enum side dst_side, uintptr_t src, enum side src_side, size_t n,
                     CUstream stream, bool async)
{
    CUresult r = enter(stream, async);
    if (r != CUDA_SUCCESS || n == 0)
        return r;
    if (dst == 0 || src == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if ((r = check(dst, n, dst_side)) != CUDA_SUCCESS || (r = check(src, n, src_side)) != CUDA_SUCCESS)
        return r;
    memmove((void *)dst, (const void *)src, n);
    return CUDA_SUCCESS;
}

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    /* Unified addressing: either side may be host or device memory. */
    return copy(dst, cu_range_known(dst, ByteCount) ? DEVICE_SIDE : HOST_SIDE, src,
                cu_range_known(src, ByteCount) ? DEVICE_SIDE : HOST_SIDE, ByteCount, NULL, false);
}

/* The per-thread-default-stream variants (_ptds, _ptsz) behave alike here:
 * a copy adds no device time, so which default stream it joins is moot. */
CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    return cuMemcpy(dst, src, ByteCount);
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    return copy(dst, cu_range_known(dst, ByteCount) ? DEVICE_SIDE : HOST_SIDE, src,
                cu_range_known(src, ByteCount) ? DEVICE_SIDE : HOST_SIDE, ByteCount, hStream, true);
}

CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    return cuMemcpyAsync(dst, src, ByteCount, hStream);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    return copy(dstDevice, DEVICE_SIDE, (uintptr_t)srcHost, HOST_SIDE, ByteCount, NULL, false);
}

CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    return cuMemcpyHtoD_v2(dstDevice, srcHost, ByteCount);
}

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    return copy((uintptr_t)dstHost, HOST_SIDE, srcDevice, DEVICE_SIDE, ByteCount, NULL, false);
}

CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    return cuMemcpyDtoH_v2(dstHost, srcDevice, ByteCount);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    return copy(dstDevice, DEVICE_SIDE, srcDevice, DEVICE_SIDE, ByteCount, NULL, false);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
    return copy(dstDevice, DEVICE_SIDE, (uintptr_t)srcHost, HOST_SIDE, ByteCount, hStream, true);
}

CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    return copy((uintptr_t)dstHost, HOST_SIDE, srcDevice, DEVICE_SIDE, ByteCount, hStream, true);
}

CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    return cuMemcpyDtoHAsync_v2(dstHost, srcDevice, ByteCount, hStream);
}

CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    CUresult r = enter(NULL, false);
    if (r != CUDA_SUCCESS || N == 0)
        return r;
    if ((r = check(dstDevice, N, DEVICE_SIDE)) != CUDA_SUCCESS)
        return r;
    memset((void *)(uintptr_t)dstDevice, uc, N);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    CUresult r = enter(NULL, false);
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
