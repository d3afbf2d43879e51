/*
 * gputime.c - the GPU-time module's setup, its process-wide state, and the
 * pacer's place on the launch path (see gputime.h for the model, gt_state.h
 * for the module's files, docs/compute.md for the reasons).
 */
#include <stdlib.h>
#include <string.h>

#include "gt_state.h"
#include "turn.h"

struct gt_state gt = {
    .init_lock = PTHREAD_MUTEX_INITIALIZER,
    .table_lock = PTHREAD_MUTEX_INITIALIZER,
    .queue_lock = PTHREAD_MUTEX_INITIALIZER,
    .queue_cond = PTHREAD_COND_INITIALIZER,
    .watch_lock = PTHREAD_MUTEX_INITIALIZER,
    .watch_cond = PTHREAD_COND_INITIALIZER,
};

/* ---- setup --------------------------------------------------------------- */

static void atfork_child(void);
static void flush_at_exit(void);

/* The turns of the devices the fast path checks: while a paced process
 * stamps one, this process takes turns there even unpaced. Looked up here,
 * once, so that no launch opens a file. A standalone device is named by its
 * UUID only once discovered, which devmap_index does for all of them. */
static void watch_turns(void)
{
    if (vgpu.mode == VGPU_MODE_STANDALONE)
        devmap_index(0);
    gt.watched_count = 0;
    for (int i = 0; i < gt.checked_devs; i++)
        if (turn_available(i))
            gt.watched[gt.watched_count++] = i;
}

static void gt_init(void)
{
    if (atomic_load_explicit(&gt.ready, memory_order_acquire))
        return;
    pthread_mutex_lock(&gt.init_lock);
    if (!atomic_load_explicit(&gt.ready, memory_order_relaxed)) {
        const struct vgpu_control *control = vgpu.mode == VGPU_MODE_VGPU ? vgpu.control : NULL;
        struct vgpu_proc_slot *slot = vgpu_slot();
        for (int i = 0; i < VGPU_MAX_DEVICES; i++)
            pacer_dev_init(&gt.devs[i].pacer, i, control, vgpu.usage,
                           slot != NULL ? &slot->dev[i] : NULL);
        gt.checked_devs = control != NULL ? (int)control->device_count : VGPU_MAX_DEVICES;
        if (gt.checked_devs > VGPU_MAX_DEVICES)
            gt.checked_devs = VGPU_MAX_DEVICES;
        watch_turns();
        static bool registered;
        if (!registered) {
            pthread_atfork(NULL, NULL, atfork_child);
            /* Registered after the driver started, so it runs before the
             * driver's own exit handlers tear it down. */
            atexit(flush_at_exit);
            registered = true;
        }
        atomic_store_explicit(&gt.ready, true, memory_order_release);
    }
    pthread_mutex_unlock(&gt.init_lock);
}

/* A forked child has no CUDA context, no monitor and none of our events:
 * start from nothing (only the forking thread survives, so no lock is held
 * that matters; the locks are re-made). */
static void atfork_child(void)
{
    memset(gt.streams, 0, sizeof(gt.streams));
    for (int i = 0; i < VGPU_MAX_DEVICES; i++)
        gt.devs[i].last_end = NULL;
    atomic_store(&gt.table_high, 0);
    atomic_store(&gt.open_batches, 0);
    atomic_store(&gt.shut_gates, 0);
    atomic_store(&gt.captures, 0);
    /* Pinned memory is the parent context's: the child makes its own. */
    atomic_store(&gt.gates_state, 0);
    gt.gate_words = NULL;
    gt.gate_dptr = 0;
    atomic_store(&gt.ready, false);
    pthread_mutex_init(&gt.init_lock, NULL);
    pthread_mutex_init(&gt.table_lock, NULL);
    pthread_mutex_init(&gt.queue_lock, NULL);
    pthread_cond_init(&gt.queue_cond, NULL);
    pthread_mutex_init(&gt.watch_lock, NULL);
    pthread_cond_init(&gt.watch_cond, NULL);
    atomic_store(&gt.watch_idle, false);
    gt.head = gt.tail = NULL;
    gt.monitor_running = false;
    gt_streams_forget_thread();
    gt_touch_reset();
    turn_reset();
}

/* May a quota of this process be below 100 % on some device? (Fresh
 * steering may lower a standalone one: the launch path reads it.) */
static bool may_be_paced(void)
{
    if (vgpu.mode == VGPU_MODE_VGPU) {
        /* No clock read unless a soft quota needs one (its heartbeat): on an
         * H100 VM a hard vGPU at 100 % launched at 103.3 % of native without
         * it, 96.1 % with it (docs/benchmarks/launch-gated-h100.md). */
        for (int i = 0; i < gt.checked_devs; i++) {
            struct pacer_quota q = pacer_quota_now(&gt.devs[i].pacer, 0);
            if (!pacer_quota_full(&q))
                return true;
        }
        return false;
    }
    /* Standalone: one env limit for every device, lowered only by fresh
     * steering (see pacer.c). */
    struct vgpu_usage *u = vgpu.usage;
    uint32_t env = atomic_load_explicit(&u->devices[0].share_ppm, memory_order_relaxed);
    if (env != 0 && env < VGPU_PPM_FULL)
        return true;
    uint64_t beat = atomic_load_explicit(&u->steer.heartbeat_ns, memory_order_relaxed);
    if (beat == 0)
        return false;
    uint64_t now = now_ns();
    return now >= beat && now - beat <= PACER_STEER_FRESH_NS;
}

/* Is there nothing to measure anywhere right now: no quota below 100 %, and
 * no paced process on our GPUs that needs our work kept out of its batches?
 * The check every launch makes first, so a vGPU at 100 % pays a few loads
 * (one per GPU for its pacing stamp) and nothing else. */
static bool unlimited_everywhere(void)
{
    if (atomic_load_explicit(&gt.open_batches, memory_order_relaxed) != 0 || may_be_paced())
        return false;
    for (int i = 0; i < gt.watched_count; i++)
        if (turn_wanted(gt.watched[i]))
            return false;
    return true;
}

static bool any_stream(const struct gt_stream *s, const void *arg)
{
    (void)s;
    (void)arg;
    return true;
}

static bool set_current(CUcontext ctx)
{
    return vgpu_real_cuda.cuCtxSetCurrent(ctx) == CUDA_SUCCESS;
}

/* GPU time of the last batches of a process that exits would be lost with
 * its monitor: close what is open and let the monitor count it (bounded),
 * then pass on its GPU turns; last, the batches' tally where it is asked
 * for (VGPU_BATCH_STATS). */
static void flush_at_exit(void)
{
    if (atomic_load(&gt.ready) && atomic_load(&gt.captures) == 0 && gt.monitor_running) {
        gt_close_picked(any_stream, NULL, set_current, false);
        struct timespec until = deadline_at(now_ns() + GT_EXIT_FLUSH_NS);
        pthread_mutex_lock(&gt.queue_lock);
        while (gt.head != NULL &&
               pthread_cond_clockwait(&gt.queue_cond, &gt.queue_lock, CLOCK_MONOTONIC, &until) == 0)
            ;
        pthread_mutex_unlock(&gt.queue_lock);
        turn_exit();
    }
    gt_tally_write();
}

/* ---- the launch path ---------------------------------------------------------- */

/* A launch we could not put in a batch still counts its estimate (and costs
 * it, when paced). */
static void charge_unmeasured(struct gt_dev *d, bool paced)
{
    int64_t cost = (int64_t)atomic_load_explicit(&d->launch_cost_ns, memory_order_relaxed);
    if (paced)
        pacer_charge(d->pacer.bucket, cost);
    pacer_account(&d->pacer, (uint64_t)cost, 1);
    gt_tally(GT_KIND_UNMEASURED, 1, (uint64_t)cost, false);
}

/* A batch whose gate the watcher opened (its launcher stalled) takes no
 * more launches: they would run ungated, and its span, which is charged
 * whole, would hold the gaps between them. Its launcher's next launch
 * closes it and opens a batch of its own, through the pacer. On the
 * simulator under two busy loops, where the launcher often resumed before
 * the monitor closed the batch, a stalling launcher at 60 was charged
 * 1.02-1.42x what its kernels ran (its watcher-opened batches 2.7-5.2x
 * theirs); CI failed on it once. */
static bool opened_quiet(const struct gt_batch *b)
{
    return b != NULL && atomic_load_explicit(&b->opened_quiet, memory_order_relaxed);
}

bool gt_before(struct gt_launch *l, CUstream h, bool ptsz, bool graph)
{
    if (!vgpu_limited())
        return false;
    gt_init();
    if (unlimited_everywhere())
        return false;
    struct gt_stream *s = gt_stream_get(h, ptsz, true);
    if (s == NULL)
        return false;
    struct gt_dev *d = &gt.devs[s->dev];
    /* A launch that joins the stream's open batch follows what the batch's
     * opening decided (paced or not, the turn): no clock and no quota read
     * per launch (a clock read costs 50-100 ns on a GPU VM, a launch ~4 us).
     * A quota change takes effect at the next batch, within ~1 ms. */
again:;
    const struct gt_batch *open = graph || opened_quiet(s->open) ? NULL : s->open;
    uint64_t now = 0;
    struct pacer_quota q = {0};
    bool paced;
    if (open != NULL) {
        paced = open->paced;
    } else {
        now = now_ns();
        q = pacer_quota_now(&d->pacer, now);
        paced = !pacer_quota_full(&q);
    }
    bool capturing = atomic_load_explicit(&gt.captures, memory_order_acquire) > 0 &&
                     devmap_stream_capturing(h, ptsz);
    /* Unpaced, a stream is still measured and takes turns while a paced
     * process on its GPU needs that; it is never held back by the pacer. */
    if (capturing || (!paced && open == NULL && !turn_wanted(s->dev))) {
        if (s->open != NULL) {
            pthread_mutex_lock(&s->lock);
            if (s->open != NULL) {
                if (capturing)
                    gt_abandon_open(s);
                else
                    gt_close_open(s);
            }
            pthread_mutex_unlock(&s->lock);
        }
        return false;
    }
    if (!gt.monitor_running)
        gt_monitor_start();
    /* The pacer sits where a batch opens: an open batch's launches follow
     * the one that was admitted, and the batch is bounded to ~1 ms. Then
     * the GPU turn, so that the batch runs alone and measures only itself.
     * The pacing is announced on the GPU first, for as long as the pacer
     * may hold us back (the balance before its refill: never too short),
     * so that the unpaced processes there keep taking turns meanwhile. A
     * paced process whose share does not bind and that keeps the GPU
     * little busy goes without the turn, and so announces nothing
     * (turnless.h). */
    bool turn = false;
    bool shared = false;
    if (open == NULL) {
        bool needed = true;
        if (paced) {
            int64_t balance =
                atomic_load_explicit(&d->pacer.bucket->pacer_balance_ns, memory_order_relaxed);
            bool beside = turn_wanted(s->dev);
            needed = turnless_turn_needed(&d->turnless, d->pacer.bucket, balance, q.ppm, beside,
                                          now);
            if (!needed && beside && gt_gate_wanted(s, graph, paced)) {
                /* Beside another paced tenant: charged at a cost of its
                 * own, measured with the turn (gputime.h). */
                shared = gt_gated_cost_fresh(s, now) || gt_gated_cost_renewed(s, now);
                needed = !shared;
            }
            if (needed)
                turn_pacing(s->dev, pacer_deficit_ns(balance, q.ppm));
            else
                turn_not_pacing(s->dev);
            pacer_admit(&d->pacer, &pacer_monotonic);
        }
        turn = needed && turn_enter(s->dev);
    }
    pthread_mutex_lock(&s->lock);
    if (open != NULL && opened_quiet(s->open)) {
        /* The watcher opened the batch since we looked (our thread lost
         * its CPU in between): the launch opens a batch of its own, so it
         * goes by the pacer. Joined instead, a launcher starved of CPU was
         * charged up to 1.52x its kernels' time (2 runs of 21 over 1.1). */
        pthread_mutex_unlock(&s->lock);
        goto again;
    }
    if (graph || opened_quiet(s->open))
        gt_close_open(s); /* a graph launch is a batch of its own; see opened_quiet */
    struct gt_batch *b = gt_open_batch(s, d, graph, paced, shared, &turn);
    if (turn)
        turn_leave(s->dev, false); /* another thread opened the batch: ours was not needed */
    if (b == NULL) {
        pthread_mutex_unlock(&s->lock);
        charge_unmeasured(d, paced);
        return false;
    }
    l->stream = s;
    l->graph = graph;
    return true;
}

void gt_after(struct gt_launch *l, CUresult rc)
{
    struct gt_stream *s = l->stream;
    struct gt_batch *b = s->open;
    if (rc == CUDA_SUCCESS)
        b->launches++;
    s->last_launch_ns = now_ns();
    if (l->graph || b->launches >= b->target)
        gt_close_open(s);
    pthread_mutex_unlock(&s->lock);
}

static void close_stream(CUstream h, bool ptsz, bool forget)
{
    if (!vgpu_limited() || !atomic_load_explicit(&gt.ready, memory_order_acquire))
        return;
    if (!forget && atomic_load_explicit(&gt.open_batches, memory_order_relaxed) == 0)
        return;
    struct gt_stream *s = gt_stream_get(h, ptsz, false);
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->lock);
    if (s->open != NULL)
        gt_close_open(s);
    if (forget) {
        pthread_mutex_lock(&gt.table_lock);
        atomic_store_explicit(&s->used, false, memory_order_release);
        pthread_mutex_unlock(&gt.table_lock);
    }
    pthread_mutex_unlock(&s->lock);
}

void gt_sync_point(CUstream h, bool ptsz)
{
    close_stream(h, ptsz, false);
}

static bool in_context(const struct gt_stream *s, const void *ctx)
{
    return s->ctx == (CUcontext)ctx;
}

void gt_ctx_sync_point(void)
{
    CUcontext ctx = NULL;
    if (!vgpu_limited() || !atomic_load_explicit(&gt.ready, memory_order_acquire) ||
        atomic_load_explicit(&gt.open_batches, memory_order_relaxed) == 0 ||
        vgpu_real_cuda.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL)
        return;
    gt_close_picked(in_context, ctx, NULL, true);
}

void gt_stream_destroy(CUstream h)
{
    if (h != NULL && h != CU_STREAM_LEGACY && h != CU_STREAM_PER_THREAD)
        close_stream(h, false, true);
}

void gt_capture_begin(CUstream h, bool ptsz)
{
    close_stream(h, ptsz, false);
}

void gt_capture_started(CUresult rc)
{
    if (rc == CUDA_SUCCESS && vgpu_limited())
        atomic_fetch_add_explicit(&gt.captures, 1, memory_order_acq_rel);
}

void gt_capture_ended(bool was_capturing)
{
    if (!was_capturing)
        return;
    int seen = atomic_load_explicit(&gt.captures, memory_order_acquire);
    /* Never below zero: a capture begun by a path we do not wrap ends here too. */
    while (seen > 0 && !atomic_compare_exchange_weak_explicit(&gt.captures, &seen, seen - 1,
                                                              memory_order_acq_rel,
                                                              memory_order_acquire))
        ;
    pthread_mutex_lock(&gt.queue_lock);
    pthread_cond_broadcast(&gt.queue_cond);
    pthread_mutex_unlock(&gt.queue_lock);
}

