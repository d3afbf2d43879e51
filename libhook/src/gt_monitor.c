/*
 * gt_monitor.c - the monitor thread: waits for closed batches in order,
 * measures their event pairs, settles the bucket and the usage counters,
 * closes batches left quiet, and passes on lingering turns.
 */
#include <signal.h>
#include <string.h>

#include "gt_state.h"
#include "running_cost.h"
#include "turn.h"

bool gt_start_thread(void *(*main_fn)(void *), const char *what)
{
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&th, &attr, main_fn, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0)
        log_error("cannot start the %s: %s", what, strerror(rc));
    return rc == 0;
}

/* Make ctx current on the monitor's or the gate watcher's thread (event
 * calls of some drivers want their context current); remembered so it
 * costs a call only on a change. */
bool gt_use_ctx(CUcontext ctx)
{
    static __thread CUcontext current;
    if (current == ctx)
        return true;
    if (vgpu_real_cuda.cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return false;
    current = ctx;
    return true;
}

/* GPU time from event a to event b, if b did not come before a (false:
 * it did, or they are not comparable: another context's, a context gone). */
static bool elapsed_ns(CUevent a, CUevent b, int64_t *ns)
{
    float ms = 0;
    CUresult rc = vgpu_real_cuda.cuEventElapsedTime_v2 != NULL
                      ? vgpu_real_cuda.cuEventElapsedTime_v2(&ms, a, b)
                      : vgpu_real_cuda.cuEventElapsedTime(&ms, a, b);
    if (rc != CUDA_SUCCESS || !(ms >= 0))
        return false;
    *ns = (int64_t)((double)ms * 1e6);
    return true;
}

/* ... and b came strictly later. */
static bool later_by(CUevent a, CUevent b, int64_t *ns)
{
    return elapsed_ns(a, b, ns) && *ns > 0;
}

/*
 * Streams of one process run side by side on a device, and each batch's
 * event pair spans the other streams' kernels as well: summed, four
 * streams of a process at 30 % were charged for about 40 % and got 21.6 %
 * (simulator). So a batch of another stream than the device's last-ending
 * settled batch p is charged its span less the time it shares with p's.
 * (With more streams at once it may still share time with others: it is
 * charged more, never less.) p's record stays out of use, its events
 * intact, until a batch ending later takes its place. Returns the time b
 * shares with p; makes b the last-ending one if it is. Monitor only.
 */
static int64_t shared_with_last(struct gt_dev *d, struct gt_batch *b, int64_t span,
                                struct gt_batch **freed)
{
    struct gt_batch *p = d->last_end;
    *freed = NULL;
    if (p == NULL || p->stream == b->stream || p->events_ctx != b->events_ctx) {
        /* Same stream: b ran after p. Another context: not comparable. */
        *freed = p;
        d->last_end = b;
        return 0;
    }
    int64_t p_span = 0, offset = 0, x = 0; /* p's span; b's start from p's */
    elapsed_ns(p->start, p->end, &p_span);
    if (later_by(p->start, b->start, &x))
        offset = x;
    else if (later_by(b->start, p->start, &x))
        offset = -x;
    int64_t from = offset > 0 ? offset : 0;
    int64_t to = offset + span < p_span ? offset + span : p_span;
    if (offset + span > p_span) {
        *freed = p;
        d->last_end = b;
    } else {
        *freed = b;
    }
    return to > from ? to - from : 0;
}

/* Measure a queued batch and count it. Returns the record the monitor may
 * free once b is out of the queue (b, the record b took the place of, or
 * none). */
static struct gt_batch *settle(struct gt_batch *b)
{
    struct gt_dev *d = &gt.devs[b->dev];
    int64_t busy = b->precharge;
    int64_t span = -1; /* none measured */
    struct gt_batch *freed = b;
    if (gt_use_ctx(b->events_ctx) && vgpu_real_cuda.cuEventSynchronize(b->end) == CUDA_SUCCESS) {
        if (elapsed_ns(b->start, b->end, &span)) {
            busy = span - shared_with_last(d, b, span, &freed);
        }
    }
    /* else the context went away under the batch: the estimate stands. */
    atomic_store_explicit(&b->done, true, memory_order_relaxed);
    uint64_t cost = atomic_load_explicit(&b->stream->gated_cost_ns, memory_order_relaxed);
    /* The whole span, not less the process's other streams: it bounds the
     * batch's own GPU time only whole. */
    bool proven = b->shared && span >= 0 && running_cost_proven(cost, (uint64_t)span, b->launches);
    if (proven && b->gated)
        gt_shared_cost_proven(b->stream, now_ns());
    bool at_cost = b->estimated || proven;
    bool charged_cost = at_cost && cost > 0 && (uint64_t)busy > cost * b->launches;
    if (charged_cost) {
        /* Its span may hold the gaps between its launches (estimated), or
         * the other tenant's slices (shared). A shared batch is gated: its
         * span bounds its own GPU time from above, so the cost stands for
         * it only where the span proves it, else the span is charged:
         * kernels grown since the cost was measured are charged what they
         * ran, before the next measure (gputime.h). */
        busy = (int64_t)(cost * b->launches);
    }
    if (b->paced)
        pacer_charge(d->pacer.bucket, busy - b->precharge);
    pacer_account(&d->pacer, (uint64_t)busy, b->launches);
    gt_tally(span >= 0 ? gt_kind_of(b) : GT_KIND_UNMEASURED, b->launches, (uint64_t)busy,
             charged_cost);
    if (b->graph) {
        atomic_store_explicit(&b->stream->graph_cost_ns, busy, memory_order_relaxed);
    } else if (b->launches > 0) {
        running_cost_in(&d->launch_cost_ns, (uint64_t)busy / b->launches);
        /* Not a batch whose gate the watcher opened: its span ran on to our
         * record of its end (the launcher stalled mid-batch), and a few
         * launches' span over twice the cost is taken whole. On an H200
         * such spans read 3-15x the cost of the adds' launches; taken, the
         * cost jumped and the pacer held the stream to half its share for
         * ~300 ms (docs/compute.md, "A stalled launcher"). */
        if (b->gated && !b->shared && !atomic_load_explicit(&b->opened_quiet, memory_order_relaxed)) {
            running_cost_in_or_jump(&b->stream->gated_cost_ns, (uint64_t)busy / b->launches);
            gt_gated_cost_measured(b->stream, now_ns());
        }
    }
    return freed;
}

/* See gt_state.h. */
void gt_close_picked(bool (*pick)(const struct gt_stream *s, const void *arg),
                     const void *arg, bool (*enter)(CUcontext ctx), bool wait)
{
    unsigned high = atomic_load_explicit(&gt.table_high, memory_order_acquire);
    pid_t me = gt_current_tid();
    for (unsigned i = 0; i < high; i++) {
        struct gt_stream *s = &gt.streams[i];
        if (s->open == NULL || (s->record_on == CU_STREAM_PER_THREAD && s->key.tid != me) ||
            !pick(s, arg))
            continue;
        if (!wait && pthread_mutex_trylock(&s->lock) != 0)
            continue;
        if (wait)
            pthread_mutex_lock(&s->lock);
        if (s->open != NULL && pick(s, arg) && (enter == NULL || enter(s->ctx)))
            gt_close_open(s);
        pthread_mutex_unlock(&s->lock);
    }
}

/* The application stopped launching on the stream without a sync point we
 * see: for GT_QUIET_NS, or for GT_GATE_QUIET_NS once the gate watcher has
 * opened the batch's gate (its kernels run: its end event should follow). */
static bool quiet(const struct gt_stream *s, const void *now)
{
    const struct gt_batch *b = s->open;
    uint64_t after = b != NULL && b->gated && !atomic_load_explicit(&b->gate_shut,
                                                                   memory_order_acquire)
                         ? GT_GATE_QUIET_NS
                         : GT_QUIET_NS;
    return *(const uint64_t *)now - s->last_launch_ns >= after;
}

static void *monitor_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&gt.queue_lock);
    for (;;) {
        bool capturing = atomic_load_explicit(&gt.captures, memory_order_acquire) > 0;
        if (gt.head != NULL && !capturing) {
            struct gt_batch *b = gt.head;
            pthread_mutex_unlock(&gt.queue_lock);
            struct gt_batch *freed = settle(b);
            pthread_mutex_lock(&gt.queue_lock);
            gt.head = b->next;
            if (gt.head == NULL)
                gt.tail = NULL;
            /* Freed only once out of the queue: a launcher may reuse the
             * record at once and queue it again, which must not find it
             * still linked here (that lost the queue, and the stream
             * waited forever for a free record). */
            pthread_mutex_unlock(&gt.queue_lock);
            gt_batch_measured(b);
            if (freed != NULL)
                gt_free_record(freed);
            pthread_mutex_lock(&gt.queue_lock);
            continue;
        }
        uint64_t wake = 0;
        if (!capturing && atomic_load_explicit(&gt.open_batches, memory_order_relaxed) > 0) {
            pthread_mutex_unlock(&gt.queue_lock);
            uint64_t now = now_ns();
            gt_close_picked(quiet, &now, gt_use_ctx, false);
            pthread_mutex_lock(&gt.queue_lock);
            if (gt.head != NULL)
                continue;
            wake = now_ns() + GT_QUIET_NS / 2;
        }
        /* Under the queue lock, so a turn that starts lingering after this
         * look wakes us (gt_release_batch broadcasts under it). */
        uint64_t linger = turn_expire(now_ns());
        if (linger != 0 && (wake == 0 || linger < wake))
            wake = linger;
        if (wake != 0) {
            struct timespec until = deadline_at(wake);
            pthread_cond_clockwait(&gt.queue_cond, &gt.queue_lock, CLOCK_MONOTONIC, &until);
        } else {
            pthread_cond_wait(&gt.queue_cond, &gt.queue_lock);
        }
    }
    return NULL;
}

void gt_monitor_start(void)
{
    pthread_mutex_lock(&gt.queue_lock);
    if (!gt.monitor_running)
        gt.monitor_running = gt_start_thread(monitor_main, "GPU time monitor");
    pthread_mutex_unlock(&gt.queue_lock);
}

