/*
 * gt_gates.c - gated batches (gputime.h): the gate words, shutting and
 * opening a batch's gate, and the gate watcher thread that opens the gates
 * of batches the application stopped feeding.
 */
#include <string.h>

#include "draw.h"
#include "gt_state.h"
#include "running_cost.h"
#include "turn.h"

static void *gate_watch_main(void *arg);

static void gates_off(const char *why)
{
    atomic_store_explicit(&gt.gates_state, -1, memory_order_release);
    log_info("launch-bound work is measured without gates: %s", why);
}

/* The gate words, made once with a launching thread's context current:
 * portable pinned memory, so that every context of the process can wait on
 * it. False when the driver cannot gate (then never again). */
static bool gates_ready(void)
{
    int state = atomic_load_explicit(&gt.gates_state, memory_order_acquire);
    if (state != 0)
        return state > 0;
    pthread_mutex_lock(&gt.init_lock);
    if (atomic_load_explicit(&gt.gates_state, memory_order_relaxed) == 0) {
        void *words = NULL;
        CUdeviceptr dptr = 0;
        size_t size = GT_STREAMS * sizeof(uint32_t);
        if (vgpu_real_cuda.cuStreamWaitValue32_v2 == NULL ||
            vgpu_real_cuda.cuMemHostAlloc == NULL ||
            vgpu_real_cuda.cuMemHostGetDevicePointer_v2 == NULL) {
            gates_off("the driver has no stream wait");
        } else if (vgpu_real_cuda.cuMemHostAlloc(&words, size,
                                                 CU_MEMHOSTALLOC_PORTABLE |
                                                     CU_MEMHOSTALLOC_DEVICEMAP) != CUDA_SUCCESS) {
            gates_off("no pinned memory for the gate words");
        } else if (vgpu_real_cuda.cuMemHostGetDevicePointer_v2(&dptr, words, 0) != CUDA_SUCCESS) {
            vgpu_real_cuda.cuMemFreeHost(words);
            gates_off("the gate words have no device address");
        } else {
            memset(words, 0, size);
            gt.gate_words = words;
            gt.gate_dptr = dptr;
            if (gt_start_thread(gate_watch_main, "gate watcher"))
                atomic_store_explicit(&gt.gates_state, 1, memory_order_release);
            else
                gates_off("no gate watcher");
        }
    }
    pthread_mutex_unlock(&gt.init_lock);
    return atomic_load_explicit(&gt.gates_state, memory_order_acquire) > 0;
}

/* Should the stream's next batch be gated? Every paced batch of kernel
 * launches: a GPU-bound stream's gates open before the GPU reaches them,
 * so they cost it only the CPU's call, and its spans are right either way;
 * a launch-bound stream's spans are right only gated. (A graph's launch is
 * one batch whose span is its own.) Never the per-thread default stream:
 * only its own thread may close its batches, so the monitor could not
 * close one there that the application stopped feeding. */
bool gt_gate_wanted(const struct gt_stream *s, bool graph, bool paced)
{
    return paced && !graph && s->record_on != CU_STREAM_PER_THREAD && gates_ready();
}

/* May a batch that wants a gate go without (gputime.h, GT_GATE_SAMPLE)?
 * Only once the stream's gated cost is known, while its share leaves room
 * for that cost's error (turnless.h) or the daemon corrects that error
 * (pacer_calibrated: NVML's device figure is this vGPU's alone, and the
 * daemon moves the quota until it lands on the share, whatever the
 * estimate's bias), and while the GPU has no other paced
 * tenant: nobody waits for the turn the batch holds (`turn`), for an
 * ungated launch-bound batch keeps the GPU idle between its launches and
 * a holder's idle time is lost to those who wait; and, with no turn held,
 * nobody stamps the GPU as paced, for ungated launches trickle in among
 * the other tenant's work, and the GPU's switches between the two cost
 * both (on an H100 a decoder beside a GEMM tenant fell from 0.61 to 0.46
 * of its native pace, the GEMM from 70 to 64 % of its work). Stream lock
 * held. */
bool gt_gate_skip(struct gt_stream *s, bool turn)
{
    const struct gt_dev *d = &gt.devs[s->dev];
    if (atomic_load_explicit(&s->gated_cost_ns, memory_order_relaxed) == 0 ||
        !(turnless_gates_sampled(&d->turnless) || pacer_calibrated(&d->pacer, 0)) ||
        (turn ? turn_contended(s->dev) : turn_wanted(s->dev)))
        return false;
    uint64_t draw = draw_mix(++s->draws + (uint64_t)(uintptr_t)s);
    return draw % GT_GATE_SAMPLE != 0;
}

/* Has the stream's gated cost been measured apart from the GPU's other
 * tenants lately (gputime.h, GT_SHARED_FRESH_NS)? */
bool gt_gated_cost_fresh(const struct gt_stream *s, uint64_t now)
{
    return now < atomic_load_explicit(&s->gated_fresh_until_ns, memory_order_relaxed);
}

/* Fresh from `now` for a new draw; its seed is the caller's clock. */
static void freshen(struct gt_stream *s, uint64_t now)
{
    uint64_t draw = draw_mix(now ^ (uint64_t)(uintptr_t)s);
    atomic_store_explicit(&s->gated_fresh_until_ns,
                          now + running_cost_fresh_ns(GT_SHARED_FRESH_NS, draw),
                          memory_order_relaxed);
}

/* See gt_state.h. */
void gt_gated_cost_measured(struct gt_stream *s, uint64_t now)
{
    atomic_store_explicit(&s->renewals, 0, memory_order_relaxed);
    freshen(s, now);
}

/* See gt_state.h. A span that proves nothing (the neighbour's slices in
 * it, or kernels that grew) takes back no earlier proof: that one ages out
 * within GT_SHARED_PROOF_AGE_NS. */
void gt_shared_cost_proven(struct gt_stream *s, uint64_t now)
{
    atomic_store_explicit(&s->proven_at_ns, now, memory_order_relaxed);
}

/* See gt_state.h. Launchers of the stream may race here and renew once
 * or twice more than the cap: harmless, freshness is only ever set ahead
 * of now. */
bool gt_gated_cost_renewed(struct gt_stream *s, uint64_t now)
{
    if (!running_cost_renewable(atomic_load_explicit(&s->proven_at_ns, memory_order_relaxed), now,
                                atomic_load_explicit(&s->renewals, memory_order_relaxed),
                                GT_SHARED_PROOF_AGE_NS, GT_SHARED_RENEWALS))
        return false;
    atomic_fetch_add_explicit(&s->renewals, 1, memory_order_relaxed);
    freshen(s, now);
    return true;
}

/* Queue the stream's next work behind a new gate, for batch b (stream lock
 * held). The gate shuts on value `gates + 1`: the word holds `gates`. */
void gt_gate_shut(struct gt_stream *s, struct gt_batch *b)
{
    uint32_t value = s->gates + 1;
    CUdeviceptr word = gt.gate_dptr + (CUdeviceptr)(s - gt.streams) * sizeof(uint32_t);
    if (vgpu_real_cuda.cuStreamWaitValue32_v2(s->record_on, word, value,
                                              CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS) {
        gates_off("the driver refused a stream wait");
        return;
    }
    s->gates = value;
    b->gated = true;
    atomic_store_explicit(&b->gate, value, memory_order_relaxed);
    atomic_store_explicit(&b->gate_shut, true, memory_order_release);
    /* Sequentially consistent against the watcher's store of watch_idle
     * and load of shut_gates: either it sees this gate or we see it idle. */
    atomic_fetch_add(&gt.shut_gates, 1);
    if (atomic_load(&gt.watch_idle)) {
        pthread_mutex_lock(&gt.watch_lock);
        pthread_cond_broadcast(&gt.watch_cond);
        pthread_mutex_unlock(&gt.watch_lock);
    }
}

/* Let batch b's work run. Every road that ends an open batch passes here,
 * after its end event so that the pair brackets only the batch's kernels;
 * and the monitor, without the stream's lock, for a batch whose launcher
 * is stuck in a driver call that waits behind the gate (lazy loading of a
 * kernel's module can wait for the whole context). Whoever opens it first
 * writes the word; a second open finds it open. */
void gt_gate_open(struct gt_stream *s, struct gt_batch *b)
{
    if (!atomic_exchange_explicit(&b->gate_shut, false, memory_order_acq_rel))
        return;
    /* The word only moves forward (cyclically, as the wait compares): the
     * watcher opens a gate without the stream's lock, and may store after
     * the stream's next batch has shut and opened its own gate; storing
     * this older value then would shut that one again, for good. */
    _Atomic uint32_t *word = &gt.gate_words[s - gt.streams];
    uint32_t value = atomic_load_explicit(&b->gate, memory_order_relaxed);
    uint32_t seen = atomic_load_explicit(word, memory_order_relaxed);
    while ((int32_t)(value - seen) > 0 &&
           !atomic_compare_exchange_weak_explicit(word, &seen, value, memory_order_release,
                                                  memory_order_relaxed))
        ;
    atomic_fetch_sub_explicit(&gt.shut_gates, 1, memory_order_relaxed);
}

/* Launches in a gated batch of the stream: about GT_GATE_BATCH_NS of its
 * kernels, by their running cost. */
uint32_t gt_gate_target(const struct gt_stream *s)
{
    uint64_t cost = atomic_load_explicit(&s->gated_cost_ns, memory_order_relaxed);
    uint64_t n = cost == 0 ? GT_GATE_MIN_LAUNCHES : GT_GATE_BATCH_NS / cost;
    if (n < GT_GATE_MIN_LAUNCHES)
        return GT_GATE_MIN_LAUNCHES;
    return n > GT_GATE_MAX_LAUNCHES ? GT_GATE_MAX_LAUNCHES : (uint32_t)n;
}

/*
 * The gate watcher: opens the gates of gated batches the application
 * stopped feeding (GT_GATE_QUIET_NS without a launch), and wakes the
 * monitor, which closes those batches (their end events). It makes no
 * driver call at all: a thread of the application may sit in a driver call
 * we do not wrap (creating a stream, loading a module) that holds a driver
 * lock and waits for the GPU, which waits behind the gate. A driver call
 * here would wait for that lock, and the gate would never open: on an H100
 * that hung a PyTorch process in torch.cuda.Stream() about once in five
 * starts, when the watcher still recorded the end event before opening.
 * The monitor's calls may wait on the lock too, but only once the gate is
 * open. Opening before the end event is recorded lets the batch's span run
 * on to the monitor's record (its wake-up: tens of microseconds) when the
 * stream idles. Records live as long as the process, so a batch read here
 * unlocked is always a valid record; at worst a newer batch of the stream,
 * opened a little early. Returns the next time a shut gate may go quiet; 0
 * if none is shut.
 */
static uint64_t watch_gates(uint64_t now)
{
    uint64_t next = 0;
    bool opened = false;
    unsigned high = atomic_load_explicit(&gt.table_high, memory_order_acquire);
    for (unsigned i = 0; i < high; i++) {
        struct gt_stream *s = &gt.streams[i];
        /* Every record of the stream, not only its open batch: one being
         * closed is no longer open, and its closer may wait in its end
         * event's record for the very lock that keeps its gate shut. */
        for (unsigned r = 0; r < GT_RING; r++) {
            struct gt_batch *b = &s->ring[r];
            if (!atomic_load_explicit(&b->gate_shut, memory_order_acquire))
                continue;
            /* Read after the gate is seen shut: its opener wrote the time
             * before shutting it. */
            uint64_t quiet_at = s->last_launch_ns + GT_GATE_QUIET_NS;
            if (now < quiet_at) {
                if (next == 0 || quiet_at < next)
                    next = quiet_at;
                break; /* the stream's other gates go quiet at the same time */
            }
            atomic_store_explicit(&b->opened_quiet, true, memory_order_relaxed);
            gt_gate_open(s, b);
            opened = true;
        }
    }
    if (opened) {
        pthread_mutex_lock(&gt.queue_lock);
        pthread_cond_broadcast(&gt.queue_cond);
        pthread_mutex_unlock(&gt.queue_lock);
    }
    return next;
}

static void *gate_watch_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&gt.watch_lock);
    for (;;) {
        atomic_store(&gt.watch_idle, true);
        if (atomic_load(&gt.shut_gates) == 0) {
            pthread_cond_wait(&gt.watch_cond, &gt.watch_lock);
            continue;
        }
        atomic_store(&gt.watch_idle, false);
        pthread_mutex_unlock(&gt.watch_lock);
        uint64_t now = now_ns();
        uint64_t next = watch_gates(now);
        pthread_mutex_lock(&gt.watch_lock);
        struct timespec until = deadline_at(next != 0 ? next : now + GT_GATE_QUIET_NS);
        pthread_cond_clockwait(&gt.watch_cond, &gt.watch_lock, CLOCK_MONOTONIC, &until);
    }
    return NULL;
}

