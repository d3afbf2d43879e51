/*
 * launch_hooks.h - the entry points the compute module wraps (rows of the
 * hooks.h table; see there for the columns): every launch path, and the
 * stream calls that tell the pacer where batches end and when capture runs,
 * and the copies a host may wait for (they end batches too: a gated batch
 * left open would hold the copy, and the host with it).
 */
#ifndef VGPU_LAUNCH_HOOKS_H
#define VGPU_LAUNCH_HOOKS_H

#define HOOK_LAUNCH_LIST(X) \
    X(cuLaunchKernel, cuLaunchKernel, 4000, 0) \
    X(cuLaunchKernel_ptsz, cuLaunchKernel, 7000, 1) \
    X(cuLaunchKernelEx, cuLaunchKernelEx, 11060, 0) \
    X(cuLaunchKernelEx_ptsz, cuLaunchKernelEx, 11060, 1) \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, 9000, 0) \
    X(cuLaunchCooperativeKernel_ptsz, cuLaunchCooperativeKernel, 9000, 1) \
    X(cuLaunchCooperativeKernelMultiDevice, cuLaunchCooperativeKernelMultiDevice, 9000, 0) \
    X(cuLaunch, cuLaunch, 2000, 0) \
    X(cuLaunchGrid, cuLaunchGrid, 2000, 0) \
    X(cuLaunchGridAsync, cuLaunchGridAsync, 2000, 0) \
    X(cuGraphLaunch, cuGraphLaunch, 10000, 0) \
    X(cuGraphLaunch_ptsz, cuGraphLaunch, 10000, 1) \
    X(cuStreamBeginCapture, cuStreamBeginCapture, 10000, 0) \
    X(cuStreamBeginCapture_ptsz, cuStreamBeginCapture, 10000, 1) \
    X(cuStreamBeginCapture_v2, cuStreamBeginCapture, 10010, 0) \
    X(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture, 10010, 1) \
    X(cuStreamEndCapture, cuStreamEndCapture, 10000, 0) \
    X(cuStreamEndCapture_ptsz, cuStreamEndCapture, 10000, 1) \
    X(cuStreamSynchronize, cuStreamSynchronize, 2000, 0) \
    X(cuStreamSynchronize_ptsz, cuStreamSynchronize, 7000, 1) \
    X(cuStreamQuery, cuStreamQuery, 2000, 0) \
    X(cuStreamQuery_ptsz, cuStreamQuery, 7000, 1) \
    X(cuEventRecord, cuEventRecord, 2000, 0) \
    X(cuEventRecord_ptsz, cuEventRecord, 7000, 1) \
    X(cuStreamDestroy, cuStreamDestroy, 2000, 0) \
    X(cuStreamDestroy_v2, cuStreamDestroy, 4000, 0) \
    X(cuCtxSynchronize, cuCtxSynchronize, 2000, 0) \
    X(cuMemcpy, cuMemcpy, 4000, 0) \
    X(cuMemcpy_ptds, cuMemcpy, 7000, 1) \
    X(cuMemcpyAsync, cuMemcpyAsync, 4000, 0) \
    X(cuMemcpyAsync_ptsz, cuMemcpyAsync, 7000, 1) \
    X(cuMemcpyHtoD_v2, cuMemcpyHtoD, 3020, 0) \
    X(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD, 7000, 1) \
    X(cuMemcpyDtoH_v2, cuMemcpyDtoH, 3020, 0) \
    X(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH, 7000, 1) \
    X(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync, 3020, 0) \
    X(cuMemcpyDtoHAsync_v2_ptsz, cuMemcpyDtoHAsync, 7000, 1)

/*
 * Variants of those bases we do not wrap (rows of HOOK_NEWER_LIST): should a
 * driver hand out a cuCtxSynchronize we do not know (a later ABI taking a
 * context), the caller gets it untouched rather than our older ABI.
 */
#define HOOK_LAUNCH_NEWER_LIST(X) \
    X(cuCtxSynchronize_v2, cuCtxSynchronize, 12000, 0)

#endif
