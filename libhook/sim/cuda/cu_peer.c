/*
 * cu_peer.c - peer access between the simulated devices, and NVLink
 * multicast (not simulated).
 *
 * Every device's memory is host memory, so any context can reach any
 * other device's allocations; what the simulator keeps is the driver's
 * bookkeeping: a context enables access to a peer context's device once
 * (CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED the second time), disables it
 * only if enabled, never to its own device. Peer copies check each side
 * against the allocation table and its device. Nothing here is charged:
 * the memory on either side was charged to whoever allocated it.
 */
#include <string.h>

#include "cu_sim.h"

CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    struct cu_device *d, *p;
    CUresult r = cu_device_of(dev, &d);
    if (r == CUDA_SUCCESS)
        r = cu_device_of(peerDev, &p);
    if (r != CUDA_SUCCESS)
        return r;
    if (canAccessPeer == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *canAccessPeer = d->dev != p->dev;
    return CUDA_SUCCESS;
}

/* The current context and the bit of the peer's device, checked. */
static CUresult peer_of(CUcontext peer, CUcontext *self, uint32_t *bit)
{
    CUresult r = cu_current(self);
    if (r != CUDA_SUCCESS)
        return r;
    if (!cu_ctx_valid(peer))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (peer->dev == (*self)->dev)
        return CUDA_ERROR_INVALID_DEVICE; /* the driver's answer for one's own device */
    *bit = 1u << peer->dev;
    return CUDA_SUCCESS;
}

CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    CUcontext self;
    uint32_t bit;
    CUresult r = peer_of(peerContext, &self, &bit);
    if (r != CUDA_SUCCESS)
        return r;
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return atomic_fetch_or(&self->peers, bit) & bit ? CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED : CUDA_SUCCESS;
}

CUresult cuCtxDisablePeerAccess(CUcontext peerContext)
{
    CUcontext self;
    uint32_t bit;
    CUresult r = peer_of(peerContext, &self, &bit);
    if (r != CUDA_SUCCESS)
        return r;
    return atomic_fetch_and(&self->peers, ~bit) & bit ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
}

/* [p, p + n) lies in one allocation, of ctx's device. */
static bool on_device(uintptr_t p, size_t n, CUcontext ctx)
{
    if (!cu_range_known(p, n))
        return false;
    pthread_mutex_lock(&cu_lock);
    struct cu_alloc *a = cu_table_find(p);
    bool ok = a != NULL && a->dev == ctx->dev;
    pthread_mutex_unlock(&cu_lock);
    return ok;
}

static CUresult copy_peer(CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                          CUstream stream, bool async)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!cu_ctx_valid(dst_ctx) || !cu_ctx_valid(src_ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    CUstream s = NULL;
    if (async) {
        if ((r = cu_stream_resolve(stream, false, &s)) != CUDA_SUCCESS)
            return r;
    } else {
        /* Like the synchronous copies: queued work of both sides first. */
        cu_ctx_wait_released(src_ctx, true);
        cu_ctx_wait_released(dst_ctx, true);
        cu_wait_until(atomic_load(&src_ctx->last_end));
        cu_wait_until(atomic_load(&dst_ctx->last_end));
    }
    if (n == 0)
        return CUDA_SUCCESS;
    if (!on_device(dst, n, dst_ctx) || !on_device(src, n, src_ctx))
        return CUDA_ERROR_INVALID_VALUE;
    if (s != NULL && s->capture == NULL)
        return cu_stream_submit(s, &(struct cu_work){
                                       .kind = CU_WORK_COPY,
                                       .copy = {.dst = dst, .src = src, .n = n, .dst_known = true, .src_known = true}});
    memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
                      size_t ByteCount)
{
    return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount, NULL, false);
}

CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                           CUcontext srcContext, size_t ByteCount, CUstream hStream)
{
    return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount, hStream, true);
}

/* The simulated devices have no NVLink: no multicast objects. */
CUresult cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle, const CUmulticastObjectProp *prop)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    return mcHandle == NULL || prop == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED;
}
