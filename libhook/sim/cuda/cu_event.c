/*
 * cu_event.c - events: markers on the device timeline.
 *
 * Recording places a zero-length marker in the device's queue: it
 * completes once the stream's earlier work and everything queued on the
 * device before it has run. Elapsed time is the difference of two markers'
 * timeline times, so a pair around a batch measures when the device was
 * busy with it (including other contexts' kernels interleaved in between,
 * as on a time-sliced GPU). A record on a held stream is stamped when the
 * stream is released and reaches it (cu_gate.c); until then the event is
 * not ready.
 */
#include <stdlib.h>

#include "cu_sim.h"

static bool event_valid(CUevent e)
{
    return e != NULL && e->tag == CU_TAG_EVENT;
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    CUcontext ctx;
    CUresult r = cu_current(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | 0x4 /* INTERPROCESS */;
    if (phEvent == NULL || (Flags & ~known) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUevent e = calloc(1, sizeof(*e));
    if (e == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->tag = CU_TAG_EVENT;
    e->flags = Flags;
    e->refs = 1;
    *phEvent = e;
    return CUDA_SUCCESS;
}

static CUresult event_destroy(CUevent e)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!event_valid(e))
        return CUDA_ERROR_INVALID_HANDLE;
    cu_event_free(e); /* a record still held completes first, as on a GPU */
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent hEvent)
{
    return event_destroy(hEvent);
}

CUresult cuEventDestroy_v2(CUevent hEvent)
{
    return event_destroy(hEvent);
}

static CUresult event_record(CUevent e, CUstream h, bool per_thread)
{
    CUstream s;
    CUresult r = cu_stream_resolve(h, per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    if (!event_valid(e))
        return CUDA_ERROR_INVALID_HANDLE;
    if (s->capture != NULL)
        return CUDA_SUCCESS; /* an event node: nothing to time in a graph here */
    pthread_mutex_lock(&cu_api_lock);
    r = cu_stream_submit(s, &(struct cu_work){.kind = CU_WORK_RECORD, .event = {.event = e}});
    pthread_mutex_unlock(&cu_api_lock);
    return r;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    return event_record(hEvent, hStream, false);
}

CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    return event_record(hEvent, hStream, true);
}

CUresult cuEventQuery(CUevent hEvent)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!event_valid(hEvent))
        return CUDA_ERROR_INVALID_HANDLE;
    cu_gates_poll();
    if (!atomic_load(&hEvent->recorded))
        return CUDA_SUCCESS;
    if (atomic_load(&hEvent->pending))
        return CUDA_ERROR_NOT_READY;
    return atomic_load(&hEvent->time) <= sim_now() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!event_valid(hEvent))
        return CUDA_ERROR_INVALID_HANDLE;
    if (atomic_load(&hEvent->recorded)) {
        cu_event_wait_stamped(hEvent);
        cu_wait_until(atomic_load(&hEvent->time));
    }
    return CUDA_SUCCESS;
}

static CUresult elapsed(float *ms, CUevent start, CUevent end)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (ms == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!event_valid(start) || !event_valid(end))
        return CUDA_ERROR_INVALID_HANDLE;
    if (((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) != 0)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!atomic_load(&start->recorded) || !atomic_load(&end->recorded))
        return CUDA_ERROR_INVALID_HANDLE;
    cu_gates_poll();
    if (atomic_load(&start->pending) || atomic_load(&end->pending))
        return CUDA_ERROR_NOT_READY;
    uint64_t t0 = atomic_load(&start->time), t1 = atomic_load(&end->time), now = sim_now();
    if (t0 > now || t1 > now)
        return CUDA_ERROR_NOT_READY;
    *ms = (float)((double)((int64_t)(t1 - t0)) / 1e6);
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return elapsed(pMilliseconds, hStart, hEnd);
}

CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return elapsed(pMilliseconds, hStart, hEnd);
}
