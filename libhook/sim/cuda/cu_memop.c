/*
 * cu_memop.c - stream memory operations: cuStreamWaitValue32/64 and
 * cuStreamWriteValue32/64, in every variant the driver exports (the _v2
 * ABI is the same; CUDA 11.7 made it the default).
 *
 * The word is any memory the device can address: device memory, or pinned
 * host memory (cuMemHostAlloc, cuMemHostRegister) whose device pointer is
 * its host address here. A wait that is not satisfied when its stream
 * reaches it holds the stream (cu_gate.c) until the word changes; a write
 * takes effect when its stream reaches it, like the simulator's other
 * memory effects.
 */
#include "cu_sim.h"

#define WAIT_FLAGS (CU_STREAM_WAIT_VALUE_NOR | CU_STREAM_WAIT_VALUE_FLUSH)
#define WRITE_FLAGS CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER

static CUresult mem_op(enum cu_work_kind kind, CUstream h, bool per_thread, CUdeviceptr addr, uint64_t value,
                       unsigned flags, bool wide)
{
    CUstream s;
    CUresult r = cu_stream_resolve(h, per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    size_t size = wide ? 8 : 4;
    if ((flags & ~(kind == CU_WORK_WAIT_VALUE ? WAIT_FLAGS : WRITE_FLAGS)) != 0 || addr % size != 0 ||
        !cu_range_known((uintptr_t)addr, size))
        return CUDA_ERROR_INVALID_VALUE;
    if (s->capture != NULL)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return cu_stream_submit(
        s, &(struct cu_work){.kind = kind, .mem = {.addr = (uintptr_t)addr, .value = value, .flags = flags, .wide = wide}});
}

#define MEM_OP(name, kind, type, per_thread, wide)                                    \
    CUresult name(CUstream stream, CUdeviceptr addr, type value, unsigned int flags) \
    {                                                                                 \
        return mem_op(kind, stream, per_thread, addr, value, flags, wide);            \
    }

MEM_OP(cuStreamWaitValue32, CU_WORK_WAIT_VALUE, cuuint32_t, false, false)
MEM_OP(cuStreamWaitValue32_ptsz, CU_WORK_WAIT_VALUE, cuuint32_t, true, false)
MEM_OP(cuStreamWaitValue32_v2, CU_WORK_WAIT_VALUE, cuuint32_t, false, false)
MEM_OP(cuStreamWaitValue32_v2_ptsz, CU_WORK_WAIT_VALUE, cuuint32_t, true, false)
MEM_OP(cuStreamWriteValue32, CU_WORK_WRITE_VALUE, cuuint32_t, false, false)
MEM_OP(cuStreamWriteValue32_ptsz, CU_WORK_WRITE_VALUE, cuuint32_t, true, false)
MEM_OP(cuStreamWriteValue32_v2, CU_WORK_WRITE_VALUE, cuuint32_t, false, false)
MEM_OP(cuStreamWriteValue32_v2_ptsz, CU_WORK_WRITE_VALUE, cuuint32_t, true, false)
MEM_OP(cuStreamWaitValue64, CU_WORK_WAIT_VALUE, cuuint64_t, false, true)
MEM_OP(cuStreamWaitValue64_ptsz, CU_WORK_WAIT_VALUE, cuuint64_t, true, true)
MEM_OP(cuStreamWaitValue64_v2, CU_WORK_WAIT_VALUE, cuuint64_t, false, true)
MEM_OP(cuStreamWaitValue64_v2_ptsz, CU_WORK_WAIT_VALUE, cuuint64_t, true, true)
MEM_OP(cuStreamWriteValue64, CU_WORK_WRITE_VALUE, cuuint64_t, false, true)
MEM_OP(cuStreamWriteValue64_ptsz, CU_WORK_WRITE_VALUE, cuuint64_t, true, true)
MEM_OP(cuStreamWriteValue64_v2, CU_WORK_WRITE_VALUE, cuuint64_t, false, true)
MEM_OP(cuStreamWriteValue64_v2_ptsz, CU_WORK_WRITE_VALUE, cuuint64_t, true, true)
