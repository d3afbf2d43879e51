/*
 * gt_batches.c - batches of launches between two events: opening one (with
 * its precharge and, paced, its gate), closing it (its end event, then its
 * gate), and the bound on batches in flight per stream.
 */
#include <string.h>

#include "gt_state.h"
#include "turn.h"

uint32_t gt_batch_target(const struct gt_dev *d)
{
    uint64_t cost = atomic_load_explicit(&d->launch_cost_ns, memory_order_relaxed);
    if (cost == 0)
        return 1; /* first measure one launch alone */
    uint64_t n = GT_BATCH_NS / cost;
    if (n < 1)
        n = 1;
    return n > GT_BATCH_MAX_LAUNCHES ? GT_BATCH_MAX_LAUNCHES : (uint32_t)n;
}

static void enqueue(struct gt_batch *b)
{
    pthread_mutex_lock(&gt.queue_lock);
    b->next = NULL;
    if (gt.tail != NULL)
        gt.tail->next = b;
    else
        gt.head = b;
    gt.tail = b;
    pthread_cond_broadcast(&gt.queue_cond);
    pthread_mutex_unlock(&gt.queue_lock);
}

void gt_batch_measured(struct gt_batch *b)
{
    if (b->turn) {
        /* Its work is off the GPU: the turn waits a moment for our next
         * launch unless the pacer will hold that launch back anyway (never
         * for an unpaced batch: nothing holds its process back). */
        b->turn = false;
        const struct vgpu_usage_device *bucket = gt.devs[b->dev].pacer.bucket;
        turn_leave(b->dev, !b->paced || atomic_load_explicit(&bucket->pacer_balance_ns,
                                                             memory_order_relaxed) >= 0);
    }
}

void gt_free_record(struct gt_batch *b)
{
    atomic_store_explicit(&b->state, BATCH_FREE, memory_order_release);
    pthread_mutex_lock(&gt.queue_lock);
    pthread_cond_broadcast(&gt.queue_cond);
    pthread_mutex_unlock(&gt.queue_lock);
}

void gt_release_batch(struct gt_batch *b)
{
    gt_batch_measured(b);
    gt_free_record(b);
}

/* Events of the stream's context for a batch record (created once, made
 * again when the record moves to another context). */
static int batch_events(struct gt_batch *b, CUcontext ctx)
{
    if (b->start != NULL && b->events_ctx == ctx)
        return 0;
    if (b->start != NULL && b->events_ctx != NULL) {
        vgpu_real_cuda.cuEventDestroy_v2(b->start);
        vgpu_real_cuda.cuEventDestroy_v2(b->end);
    }
    b->start = b->end = NULL;
    /* Blocking sync: the monitor and a launcher at its in-flight bound
     * sleep in cuEventSynchronize instead of spinning. */
    if (vgpu_real_cuda.cuEventCreate(&b->start, CU_EVENT_BLOCKING_SYNC) != CUDA_SUCCESS ||
        vgpu_real_cuda.cuEventCreate(&b->end, CU_EVENT_BLOCKING_SYNC) != CUDA_SUCCESS) {
        if (b->start != NULL)
            vgpu_real_cuda.cuEventDestroy_v2(b->start);
        b->start = b->end = NULL;
        return -1;
    }
    b->events_ctx = ctx;
    return 0;
}

/* A batch that cannot be measured counts its estimate (already debited). */
static void settle_at_estimate(struct gt_batch *b)
{
    pacer_account(&gt.devs[b->dev].pacer, (uint64_t)b->precharge, b->launches);
    gt_tally(GT_KIND_UNMEASURED, b->launches, (uint64_t)b->precharge, false);
    gt_release_batch(b);
}

/* Close the stream's open batch: its end event goes right after its last
 * launch, and the monitor takes it from there. Stream lock held. */
void gt_close_open(struct gt_stream *s)
{
    struct gt_batch *b = s->open;
    if (b == NULL)
        return;
    s->open = NULL;
    atomic_fetch_sub_explicit(&gt.open_batches, 1, memory_order_relaxed);
    struct gt_dev *d = &gt.devs[b->dev];
    if (b->launches == 0) {
        gt_gate_open(s, b);
        if (b->paced)
            pacer_charge(d->pacer.bucket, -b->precharge);
        gt_release_batch(b);
        return;
    }
    CUresult rc = vgpu_real_cuda.cuEventRecord(b->end, s->record_on);
    gt_gate_open(s, b);
    if (rc != CUDA_SUCCESS) {
        settle_at_estimate(b);
        return;
    }
    s->last_size = b->launches;
    b->seq = ++s->closed;
    atomic_store_explicit(&b->done, false, memory_order_relaxed);
    atomic_store_explicit(&b->state, BATCH_QUEUED, memory_order_release);
    enqueue(b);
}

/* The stream was captured under an open batch (it joined another stream's
 * capture): no end event can be recorded now. Count the estimate. */
void gt_abandon_open(struct gt_stream *s)
{
    struct gt_batch *b = s->open;
    s->open = NULL;
    atomic_fetch_sub_explicit(&gt.open_batches, 1, memory_order_relaxed);
    gt_gate_open(s, b);
    settle_at_estimate(b);
}

/* How many of the stream's batches may still be running on the device,
 * and the oldest and the newest of them (NULL when none). */
static unsigned running(struct gt_stream *s, struct gt_batch **oldest, struct gt_batch **newest)
{
    unsigned n = 0;
    *oldest = *newest = NULL;
    for (unsigned i = 0; i < GT_RING; i++) {
        struct gt_batch *b = &s->ring[i];
        if (atomic_load_explicit(&b->state, memory_order_acquire) != BATCH_QUEUED ||
            atomic_load_explicit(&b->done, memory_order_relaxed))
            continue;
        n++;
        if (*oldest == NULL || b->seq < (*oldest)->seq)
            *oldest = b;
        if (*newest == NULL || b->seq > (*newest)->seq)
            *newest = b;
    }
    return n;
}

static struct gt_batch *free_record(struct gt_stream *s)
{
    for (unsigned i = 0; i < GT_RING; i++)
        if (atomic_load_explicit(&s->ring[i].state, memory_order_acquire) == BATCH_FREE)
            return &s->ring[i];
    return NULL;
}

/* What a batch that opens may cost at most, as far as we know: the stream's
 * last graph run, or its target number of launches at their running cost;
 * TURN_COST_UNKNOWN before the first measurement. */
static uint64_t batch_cost(const struct gt_stream *s, const struct gt_dev *d, bool graph,
                           uint32_t target)
{
    int64_t cost = graph ? atomic_load_explicit(&s->graph_cost_ns, memory_order_relaxed)
                         : (int64_t)atomic_load_explicit(&d->launch_cost_ns,
                                                         memory_order_relaxed) * target;
    return cost > 0 ? (uint64_t)cost : TURN_COST_UNKNOWN;
}

/*
 * Open a batch on the stream (lock held; it is released while waiting).
 * Returns the stream's open batch (maybe opened meanwhile by another
 * thread), or NULL if none can be had: the launch then goes unmeasured.
 * A new batch takes over the caller's GPU turn count (*turn), if any.
 * `paced`: its cost is debited from the bucket (else only measured);
 * `shared`: it runs without the turn beside another paced tenant (gputime.h).
 */
struct gt_batch *gt_open_batch(struct gt_stream *s, struct gt_dev *d, bool graph, bool paced,
                               bool shared, bool *turn)
{
    uint64_t deadline = 0;
    bool gate = gt_gate_wanted(s, graph, paced);
    bool estimated = gate && gt_gate_skip(s, *turn);
    gate = gate && !estimated;
    /* Gated batches are short: let as much work queue as ungated. */
    unsigned limit = gate ? GT_GATE_INFLIGHT : GT_INFLIGHT;
    for (;;) {
        if (s->open != NULL)
            return s->open;
        bool capturing = atomic_load_explicit(&gt.captures, memory_order_acquire) > 0;
        struct gt_batch *oldest = NULL, *newest = NULL;
        if (!capturing && running(s, &oldest, &newest) >= limit) {
            /* Bound the queue: a deep queue would let the stream run far
             * past its quota before the measurements catch up. */
            CUevent end = oldest->end;
            pthread_mutex_unlock(&s->lock);
            vgpu_real_cuda.cuEventSynchronize(end);
            pthread_mutex_lock(&s->lock);
            atomic_store_explicit(&oldest->done, true, memory_order_relaxed);
            continue;
        }
        struct gt_batch *b = free_record(s);
        if (b == NULL) {
            /* Every record waits for the monitor: give it a moment. */
            uint64_t now = now_ns();
            if (deadline == 0)
                deadline = now + GT_FREE_WAIT_NS;
            if (now >= deadline || capturing)
                return NULL;
            pthread_mutex_unlock(&s->lock);
            pthread_mutex_lock(&gt.queue_lock);
            struct timespec until = deadline_at(deadline);
            pthread_cond_clockwait(&gt.queue_cond, &gt.queue_lock, CLOCK_MONOTONIC, &until);
            pthread_mutex_unlock(&gt.queue_lock);
            pthread_mutex_lock(&s->lock);
            continue;
        }
        if (batch_events(b, s->ctx) != 0)
            return NULL;
        b->gated = false;
        b->estimated = estimated;
        b->shared = shared;
        atomic_store_explicit(&b->gate_shut, false, memory_order_relaxed);
        atomic_store_explicit(&b->opened_quiet, false, memory_order_relaxed);
        /* Quiet counts from here: the last launch may be long past (the
         * pacer just held this one back), and neither the gate watcher nor
         * the monitor may take the new batch for one the application
         * stopped feeding. Before the gate shuts: the watcher looks at
         * every shut gate. */
        s->last_launch_ns = now_ns();
        /* Touched where the stream is drained (gputime.h): none of its
         * batches still running, or the newest one's end reached. Decided
         * before the gate shuts. With the turn too: a process in no vGPU
         * takes none. Not while a stream captures: a module load may be
         * among the calls a global capture refuses. */
        bool drained = gate && !capturing &&
                       (newest == NULL || vgpu_real_cuda.cuEventQuery(newest->end) == CUDA_SUCCESS);
        CUfunction touch = drained ? gt_touch_function(s) : NULL;
        if (gate)
            gt_gate_shut(s, b);
        if (touch != NULL && b->gated)
            gt_touch(s, touch);
        if (vgpu_real_cuda.cuEventRecord(b->start, s->record_on) != CUDA_SUCCESS) {
            gt_gate_open(s, b);
            return NULL;
        }
        b->stream = s;
        b->dev = s->dev;
        b->graph = graph;
        b->paced = paced;
        b->turn = *turn;
        *turn = false;
        b->launches = 0;
        uint64_t cost = atomic_load_explicit(&d->launch_cost_ns, memory_order_relaxed);
        uint32_t expect = s->last_size == 0 ? 1 : s->last_size;
        uint32_t target = gt_batch_target(d);
        if (b->gated && gt_gate_target(s) < target)
            target = gt_gate_target(s);
        b->target = target;
        b->precharge = graph ? atomic_load(&s->graph_cost_ns)
                             : (int64_t)(cost * (expect < target ? expect : target));
        if (paced)
            pacer_charge(d->pacer.bucket, b->precharge);
        if (b->turn)
            turn_cover(b->dev, batch_cost(s, d, graph, target));
        atomic_store_explicit(&b->state, BATCH_OPEN, memory_order_release);
        s->open = b;
        atomic_fetch_add_explicit(&gt.open_batches, 1, memory_order_relaxed);
        return b;
    }
}

