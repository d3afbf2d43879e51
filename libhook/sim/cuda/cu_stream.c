/*
 * cu_stream.c - streams on the device timeline, and synchronisation.
 *
 * A stream is an ordered queue: its tail is when its last work ends. Work
 * queued on it starts no earlier than the tail and no earlier than the
 * device is free (sim_engine_run); synchronising sleeps until the tail.
 * The legacy default stream is one per context; the per-thread default
 * stream is one per thread and device. Because the simulated device runs
 * one kernel at a time in queue order, the legacy stream's implicit
 * ordering against other streams holds without extra work, except behind
 * a held stream (cu_gate.c).
 */
#include <stdlib.h>

#include "cu_sim.h"

static __thread struct CUstream_st t_per_thread[SIM_MAX_DEVICES];

static CUstream per_thread_stream(CUcontext ctx)
{
    struct CUstream_st *s = &t_per_thread[ctx->ordinal];
    if (s->tag != CU_TAG_STREAM || s->ctx != ctx) {
        s->tag = CU_TAG_STREAM;
        s->ctx = ctx;
        s->flags = 0;
        s->capture = NULL;
        atomic_store(&s->tail, 0);
    }
    return s;
}

CUresult cu_stream_resolve(CUstream h, bool per_thread, CUstream *out)
{
    cu_gates_poll();
    if (h == NULL)
        h = per_thread ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    if (h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        CUcontext ctx;
        CUresult r = cu_current(&ctx);
        if (r != CUDA_SUCCESS)
            return r;
        *out = h == CU_STREAM_LEGACY ? &ctx->legacy : per_thread_stream(ctx);
        return CUDA_SUCCESS;
    }
    if (cu_proc == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (h->tag != CU_TAG_STREAM)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!cu_ctx_valid(h->ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = h;
    return CUDA_SUCCESS;
}

void cu_store_max(_Atomic uint64_t *target, uint64_t value)
{
    uint64_t seen = atomic_load(target);
    while (seen < value && !atomic_compare_exchange_weak(target, &seen, value))
        ;
}

uint64_t cu_stream_run(CUstream s, uint64_t duration)
{
    struct cu_device *d = &cu_proc->devices[s->ctx->ordinal];
    pthread_mutex_lock(&d->run_lock);
    uint64_t end = sim_engine_run(cu_proc->st, d->dev, cu_proc->pid, atomic_load(&s->tail), duration, &d->cursor);
    pthread_mutex_unlock(&d->run_lock);
    cu_store_max(&s->tail, end);
    cu_store_max(&s->ctx->last_end, end);
    return end;
}

uint64_t cu_device_busy_until(CUstream s)
{
    struct cu_device *d = &cu_proc->devices[s->ctx->ordinal];
    return atomic_load(&cu_proc->st->devices[d->dev].busy_until);
}

void cu_wait_until(uint64_t t)
{
    if (t > sim_now())
        sim_sleep_until(t);
    cu_pools_release_on_sync();
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    CUcontext ctx;
    CUresult r = cu_current(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (phStream == NULL || (Flags != CU_STREAM_DEFAULT && Flags != CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    CUstream s = calloc(1, sizeof(*s));
    if (s == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->tag = CU_TAG_STREAM;
    s->ctx = ctx;
    s->flags = Flags;
    *phStream = s;
    return CUDA_SUCCESS;
}

static bool is_default(CUstream h)
{
    return h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

static CUresult stream_destroy(CUstream h)
{
    CUstream s;
    if (is_default(h))
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = cu_stream_resolve(h, false, &s);
    if (r != CUDA_SUCCESS)
        return r;
    cu_stream_free(s);
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream hStream)
{
    return stream_destroy(hStream);
}

CUresult cuStreamDestroy_v2(CUstream hStream)
{
    return stream_destroy(hStream);
}

static CUresult stream_ctx(CUstream h, bool per_thread, CUcontext *pctx)
{
    CUstream s;
    CUresult r = cu_stream_resolve(h, per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = s->ctx;
    return CUDA_SUCCESS;
}

CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    return stream_ctx(hStream, false, pctx);
}

CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx)
{
    return stream_ctx(hStream, true, pctx);
}

static CUresult stream_sync(CUstream h, bool per_thread)
{
    CUstream s;
    CUresult r = cu_stream_resolve(h, per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    if (s->capture != NULL)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    cu_stream_wait_released(s); /* as a GPU would: never before the gate opens */
    cu_wait_until(atomic_load(&s->tail));
    return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    return stream_sync(hStream, false);
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    return stream_sync(hStream, true);
}

static CUresult stream_query(CUstream h, bool per_thread)
{
    CUstream s;
    CUresult r = cu_stream_resolve(h, per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    if (s->capture != NULL)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (cu_stream_held(s))
        return CUDA_ERROR_NOT_READY;
    return atomic_load(&s->tail) <= sim_now() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamQuery(CUstream hStream)
{
    return stream_query(hStream, false);
}

CUresult cuStreamQuery_ptsz(CUstream hStream)
{
    return stream_query(hStream, true);
}

/* Work queued on the stream after this waits for the event's latest record
 * (nothing, if it was never recorded). Capture records kernels only: a
 * wait on a capturing stream adds nothing. */
static CUresult wait_event(CUstream h, CUevent e, unsigned flags, bool per_thread)
{
    CUstream s;
    CUresult r = cu_stream_resolve(h, per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    if (e == NULL || e->tag != CU_TAG_EVENT)
        return CUDA_ERROR_INVALID_HANDLE;
    if ((flags & ~CU_EVENT_WAIT_EXTERNAL) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (s->capture != NULL || !atomic_load(&e->recorded))
        return CUDA_SUCCESS;
    return cu_stream_submit(s, &(struct cu_work){.kind = CU_WORK_WAIT_EVENT, .event = {.event = e}});
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    return wait_event(hStream, hEvent, Flags, false);
}

CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    return wait_event(hStream, hEvent, Flags, true);
}
