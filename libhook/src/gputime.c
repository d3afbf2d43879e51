/*
 * gputime.c - batches of launches measured with event pairs, the monitor
 * thread that turns them into GPU time, and the pacer's place on the launch
 * path (see gputime.h for the model, docs/compute.md for the reasons).
 *
 * Concurrency: each stream's state has a mutex held by a launching thread
 * from the batch decision through the driver call, so a batch's events
 * bracket exactly its launches; the monitor only ever try-locks it. The
 * cross-process bucket is atomics only (pacer.c). While any stream capture
 * is active, nobody here calls what global capture mode forbids (event
 * synchronisation): the monitor pauses and launchers skip the in-flight wait.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "gputime.h"
#include "pacer.h"
#include "turn.h"
#include "vgpu.h"

#define GT_STREAMS 1024 /* stream states per process */
#define GT_RING 12      /* batches per stream: open + in flight + done, not yet counted */
#define GT_CACHE 4      /* stream lookups cached per thread */
#define GT_FREE_WAIT_NS 50000000ull /* longest wait for the monitor to free a batch */
#define GT_EXIT_FLUSH_NS 500000000ull /* longest wait at exit for the last batches */

enum batch_state { BATCH_FREE = 0, BATCH_OPEN, BATCH_QUEUED };

struct gt_batch {
    _Atomic int state;
    _Atomic bool done;      /* its end event is known to have completed */
    CUevent start, end;
    CUcontext events_ctx;   /* the context the events were created in */
    struct gt_stream *stream;
    int dev;
    bool graph;
    bool paced;             /* charged to the bucket (unpaced batches are only measured) */
    bool turn;              /* counted by turn_enter: turn_leave when measured */
    bool gated;             /* queued behind a gate (gputime.h) */
    _Atomic bool gate_shut; /* that gate is not yet opened (the monitor may open it unlocked) */
    _Atomic uint32_t gate;  /* the gate's value: the stream's count of gated batches */
    uint32_t launches;
    int64_t precharge;      /* debited when opened, settled when measured */
    uint64_t seq;           /* closing order on its stream */
    struct gt_batch *next;  /* monitor queue */
};

/* A stream as the driver names it: explicit streams by handle; the legacy
 * stream by context; the per-thread stream by context and thread. */
struct gt_key {
    CUstream handle;
    CUcontext ctx;
    pid_t tid;
};

struct gt_stream {
    pthread_mutex_t lock;
    _Atomic bool used;
    struct gt_key key;      /* written under table_lock */
    CUstream record_on;     /* the handle our events go on */
    CUcontext ctx;
    int dev;
    struct gt_batch *open;
    uint64_t last_launch_ns;
    uint64_t closed;        /* batches closed so far */
    uint32_t last_size;     /* launches in its previous batch */
    _Atomic int64_t graph_cost_ns; /* its last measured graph launch */
    _Atomic uint64_t gated_cost_ns; /* running GPU time per launch of its gated batches */
    uint32_t gates;         /* gated batches so far: the value of the next gate minus one */
    struct gt_batch ring[GT_RING];
};

struct gt_dev {
    struct pacer_dev pacer;
    _Atomic uint64_t launch_cost_ns; /* running average GPU time per launch */
};

static struct {
    pthread_mutex_t init_lock;
    _Atomic bool ready;
    struct gt_dev devs[VGPU_MAX_DEVICES];
    int checked_devs;                /* devices the unlimited fast path looks at */
    int watched[VGPU_MAX_DEVICES];   /* those of them with turns, for pacing stamps */
    int watched_count;

    pthread_mutex_t table_lock;
    _Atomic unsigned table_high;     /* entries [0, high) were used at least once */
    struct gt_stream streams[GT_STREAMS];

    _Atomic int open_batches;
    _Atomic int shut_gates;          /* open batches behind a shut gate */
    _Atomic int captures;            /* stream captures in progress */

    /* One gate word per stream state, in pinned host memory the device
     * reads (made at the first gated batch; gating is off for good if the
     * driver refuses it). */
    _Atomic int gates_state;         /* 0 not yet made, 1 ready, -1 unavailable */
    _Atomic uint32_t *gate_words;
    CUdeviceptr gate_dptr;

    pthread_mutex_t queue_lock;      /* monitor queue and the condition below */
    pthread_cond_t queue_cond;       /* work queued, capture ended, batch freed */
    struct gt_batch *head, *tail;
    bool monitor_running;

    pthread_mutex_t watch_lock;      /* the gate watcher's sleep */
    pthread_cond_t watch_cond;       /* a gate shut while it was idle */
    _Atomic bool watch_idle;         /* it waits with no deadline (see gate_shut) */
} gt = {
    .init_lock = PTHREAD_MUTEX_INITIALIZER,
    .table_lock = PTHREAD_MUTEX_INITIALIZER,
    .queue_lock = PTHREAD_MUTEX_INITIALIZER,
    .queue_cond = PTHREAD_COND_INITIALIZER,
    .watch_lock = PTHREAD_MUTEX_INITIALIZER,
    .watch_cond = PTHREAD_COND_INITIALIZER,
};

static __thread struct {
    struct gt_stream *s;
    struct gt_key key;
} tcache[GT_CACHE];
static __thread unsigned tcache_next;
static __thread pid_t thread_id;

static uint64_t now_ns(void)
{
    return pacer_monotonic.now(NULL);
}

/* A CLOCK_MONOTONIC deadline for pthread_cond_clockwait. */
static struct timespec deadline_at(uint64_t ns)
{
    return (struct timespec){.tv_sec = (time_t)(ns / 1000000000ull),
                             .tv_nsec = (long)(ns % 1000000000ull)};
}

static pid_t current_tid(void)
{
    if (thread_id == 0)
        thread_id = (pid_t)syscall(SYS_gettid);
    return thread_id;
}

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
    memset(tcache, 0, sizeof(tcache));
    thread_id = 0;
    turn_reset();
}

/* May a quota of this process be below 100 % on some device? (Fresh
 * steering may lower a standalone one: the launch path reads it.) */
static bool may_be_paced(void)
{
    if (vgpu.mode == VGPU_MODE_VGPU) {
        uint64_t now = now_ns(); /* a soft quota depends on the daemon's heartbeat */
        for (int i = 0; i < gt.checked_devs; i++) {
            struct pacer_quota q = pacer_quota_now(&gt.devs[i].pacer, now);
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

/* ---- stream states ------------------------------------------------------- */

static bool key_equal(const struct gt_key *a, const struct gt_key *b)
{
    return a->handle == b->handle && a->ctx == b->ctx && a->tid == b->tid;
}

/* The key of a launch's stream, and the handle to record our events on. */
static bool stream_key(CUstream h, bool ptsz, struct gt_key *key, CUstream *record_on)
{
    if (h == NULL)
        h = ptsz ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    *record_on = h;
    if (h != CU_STREAM_LEGACY && h != CU_STREAM_PER_THREAD) {
        *key = (struct gt_key){.handle = h};
        return true;
    }
    CUcontext ctx = NULL;
    if (vgpu_real_cuda.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL)
        return false;
    *key = (struct gt_key){.ctx = ctx, .tid = h == CU_STREAM_PER_THREAD ? current_tid() : 0};
    return true;
}

static struct gt_stream *table_find(const struct gt_key *key)
{
    unsigned high = atomic_load_explicit(&gt.table_high, memory_order_acquire);
    for (unsigned i = 0; i < high; i++) {
        struct gt_stream *s = &gt.streams[i];
        if (atomic_load_explicit(&s->used, memory_order_acquire) && key_equal(&s->key, key))
            return s;
    }
    return NULL;
}

/* A new state for a stream of the current context; NULL if the stream's
 * device is not paced or the table is full (its launches go unmeasured). */
static struct gt_stream *table_add(const struct gt_key *key, CUstream record_on)
{
    CUcontext ctx = key->ctx;
    CUdevice dev;
    if (ctx == NULL && (vgpu_real_cuda.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL))
        return NULL;
    int index = devmap_current(&dev);
    if (index < 0 || index >= VGPU_MAX_DEVICES)
        return NULL;
    struct gt_stream *s = NULL;
    unsigned high = atomic_load_explicit(&gt.table_high, memory_order_relaxed);
    for (unsigned i = 0; i < high && s == NULL; i++)
        if (!atomic_load_explicit(&gt.streams[i].used, memory_order_relaxed))
            s = &gt.streams[i];
    if (s == NULL) {
        if (high == GT_STREAMS) {
            static bool reported;
            if (!reported)
                log_warn("more than %d streams: launches on new ones go unmeasured", GT_STREAMS);
            reported = true;
            return NULL;
        }
        s = &gt.streams[high];
        pthread_mutex_init(&s->lock, NULL);
        atomic_store_explicit(&gt.table_high, high + 1, memory_order_release);
    }
    s->key = *key;
    s->record_on = record_on;
    s->ctx = ctx;
    s->dev = index;
    s->open = NULL;
    s->last_size = 0;
    atomic_store(&s->graph_cost_ns, 0);
    atomic_store(&s->gated_cost_ns, 0);
    /* s->gates goes on from the slot's last stream: its word holds the last
     * value written, and a gate must be above it to shut. */
    atomic_store_explicit(&s->used, true, memory_order_release);
    return s;
}

/* The state of a launch's stream (created on first sight when `create`). */
static struct gt_stream *stream_get(CUstream h, bool ptsz, bool create)
{
    struct gt_key key;
    CUstream record_on;
    if (!stream_key(h, ptsz, &key, &record_on))
        return NULL;
    for (unsigned i = 0; i < GT_CACHE; i++) {
        struct gt_stream *s = tcache[i].s;
        if (s != NULL && key_equal(&tcache[i].key, &key) &&
            atomic_load_explicit(&s->used, memory_order_acquire) && key_equal(&s->key, &key))
            return s;
    }
    pthread_mutex_lock(&gt.table_lock);
    struct gt_stream *s = table_find(&key);
    if (s == NULL && create)
        s = table_add(&key, record_on);
    pthread_mutex_unlock(&gt.table_lock);
    if (s != NULL) {
        unsigned slot = tcache_next++ % GT_CACHE;
        tcache[slot].s = s;
        tcache[slot].key = key;
    }
    return s;
}

/* ---- gates ----------------------------------------------------------------- */

static void *gate_watch_main(void *arg);

/* A detached helper thread that receives no signal of the application's. */
static bool start_thread(void *(*main_fn)(void *), const char *what)
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
            if (start_thread(gate_watch_main, "gate watcher"))
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
static bool gate_wanted(const struct gt_stream *s, bool graph, bool paced)
{
    return paced && !graph && s->record_on != CU_STREAM_PER_THREAD && gates_ready();
}

/* Queue the stream's next work behind a new gate, for batch b (stream lock
 * held). The gate shuts on value `gates + 1`: the word holds `gates`. */
static void gate_shut(struct gt_stream *s, struct gt_batch *b)
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
static void gate_open(struct gt_stream *s, struct gt_batch *b)
{
    if (!atomic_exchange_explicit(&b->gate_shut, false, memory_order_acq_rel))
        return;
    atomic_store_explicit(&gt.gate_words[s - gt.streams],
                          atomic_load_explicit(&b->gate, memory_order_relaxed),
                          memory_order_release);
    atomic_fetch_sub_explicit(&gt.shut_gates, 1, memory_order_relaxed);
}

/* Launches in a gated batch of the stream: about GT_GATE_BATCH_NS of its
 * kernels, by their running cost. */
static uint32_t gate_target(const struct gt_stream *s)
{
    uint64_t cost = atomic_load_explicit(&s->gated_cost_ns, memory_order_relaxed);
    uint64_t n = cost == 0 ? GT_GATE_MIN_LAUNCHES : GT_GATE_BATCH_NS / cost;
    if (n < GT_GATE_MIN_LAUNCHES)
        return GT_GATE_MIN_LAUNCHES;
    return n > GT_GATE_MAX_LAUNCHES ? GT_GATE_MAX_LAUNCHES : (uint32_t)n;
}

/* ---- batches --------------------------------------------------------------- */

static uint32_t batch_target(const struct gt_dev *d)
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

static void release_batch(struct gt_batch *b)
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
    atomic_store_explicit(&b->state, BATCH_FREE, memory_order_release);
    pthread_mutex_lock(&gt.queue_lock);
    pthread_cond_broadcast(&gt.queue_cond);
    pthread_mutex_unlock(&gt.queue_lock);
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
    release_batch(b);
}

/* Close the stream's open batch: its end event goes right after its last
 * launch, and the monitor takes it from there. Stream lock held. */
static void close_open(struct gt_stream *s)
{
    struct gt_batch *b = s->open;
    if (b == NULL)
        return;
    s->open = NULL;
    atomic_fetch_sub_explicit(&gt.open_batches, 1, memory_order_relaxed);
    struct gt_dev *d = &gt.devs[b->dev];
    if (b->launches == 0) {
        gate_open(s, b);
        if (b->paced)
            pacer_charge(d->pacer.bucket, -b->precharge);
        release_batch(b);
        return;
    }
    CUresult rc = vgpu_real_cuda.cuEventRecord(b->end, s->record_on);
    gate_open(s, b);
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
static void abandon_open(struct gt_stream *s)
{
    struct gt_batch *b = s->open;
    s->open = NULL;
    atomic_fetch_sub_explicit(&gt.open_batches, 1, memory_order_relaxed);
    gate_open(s, b);
    settle_at_estimate(b);
}

/* The oldest batch of the stream still running on the device, if the
 * stream has `limit` of them. */
static struct gt_batch *inflight_limit(struct gt_stream *s, unsigned limit)
{
    struct gt_batch *oldest = NULL;
    unsigned running = 0;
    for (unsigned i = 0; i < GT_RING; i++) {
        struct gt_batch *b = &s->ring[i];
        if (atomic_load_explicit(&b->state, memory_order_acquire) != BATCH_QUEUED ||
            atomic_load_explicit(&b->done, memory_order_relaxed))
            continue;
        running++;
        if (oldest == NULL || b->seq < oldest->seq)
            oldest = b;
    }
    return running >= limit ? oldest : NULL;
}

static struct gt_batch *free_record(struct gt_stream *s)
{
    for (unsigned i = 0; i < GT_RING; i++)
        if (atomic_load_explicit(&s->ring[i].state, memory_order_acquire) == BATCH_FREE)
            return &s->ring[i];
    return NULL;
}

/*
 * Open a batch on the stream (lock held; it is released while waiting).
 * Returns the stream's open batch (maybe opened meanwhile by another
 * thread), or NULL if none can be had: the launch then goes unmeasured.
 * A new batch takes over the caller's GPU turn count (*turn), if any.
 * `paced`: its cost is debited from the bucket (else only measured).
 */
static struct gt_batch *open_batch(struct gt_stream *s, struct gt_dev *d, bool graph, bool paced,
                                   bool *turn)
{
    uint64_t deadline = 0;
    for (;;) {
        if (s->open != NULL)
            return s->open;
        bool capturing = atomic_load_explicit(&gt.captures, memory_order_acquire) > 0;
        /* Gated batches are short: let as much work queue as ungated. */
        unsigned limit = gate_wanted(s, graph, paced) ? GT_GATE_INFLIGHT : GT_INFLIGHT;
        struct gt_batch *oldest = capturing ? NULL : inflight_limit(s, limit);
        if (oldest != NULL) {
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
        atomic_store_explicit(&b->gate_shut, false, memory_order_relaxed);
        if (gate_wanted(s, graph, paced))
            gate_shut(s, b);
        if (vgpu_real_cuda.cuEventRecord(b->start, s->record_on) != CUDA_SUCCESS) {
            gate_open(s, b);
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
        uint32_t target = batch_target(d);
        b->precharge = graph ? atomic_load(&s->graph_cost_ns)
                             : (int64_t)(cost * (expect < target ? expect : target));
        if (paced)
            pacer_charge(d->pacer.bucket, b->precharge);
        atomic_store_explicit(&b->state, BATCH_OPEN, memory_order_release);
        /* Quiet counts from here: the last launch may be long past (the
         * pacer just held this one back), and the monitor must not take
         * the new batch for one the application stopped feeding. */
        s->last_launch_ns = now_ns();
        s->open = b;
        atomic_fetch_add_explicit(&gt.open_batches, 1, memory_order_relaxed);
        return b;
    }
}

/* ---- the monitor ------------------------------------------------------------ */

/* Make ctx current on the monitor's or the gate watcher's thread (event
 * calls of some drivers want their context current); remembered so it
 * costs a call only on a change. */
static bool monitor_use_ctx(CUcontext ctx)
{
    static __thread CUcontext current;
    if (current == ctx)
        return true;
    if (vgpu_real_cuda.cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        return false;
    current = ctx;
    return true;
}

/* Running average over ~8 samples: adapts within a few ms of work. */
static void average_in(_Atomic uint64_t *avg, uint64_t sample)
{
    uint64_t seen = atomic_load_explicit(avg, memory_order_relaxed);
    seen = seen == 0 ? sample : seen - seen / 8 + sample / 8;
    atomic_store_explicit(avg, seen > 0 ? seen : 1, memory_order_relaxed);
}


/* Measure a queued batch and count it (the monitor frees the record once
 * it is out of the queue). */
static void settle(struct gt_batch *b)
{
    struct gt_dev *d = &gt.devs[b->dev];
    int64_t busy = b->precharge;
    if (monitor_use_ctx(b->events_ctx) && vgpu_real_cuda.cuEventSynchronize(b->end) == CUDA_SUCCESS) {
        float ms = 0;
        CUresult rc = vgpu_real_cuda.cuEventElapsedTime_v2 != NULL
                          ? vgpu_real_cuda.cuEventElapsedTime_v2(&ms, b->start, b->end)
                          : vgpu_real_cuda.cuEventElapsedTime(&ms, b->start, b->end);
        if (rc == CUDA_SUCCESS && ms >= 0)
            busy = (int64_t)((double)ms * 1e6);
    }
    /* else the context went away under the batch: the estimate stands. */
    atomic_store_explicit(&b->done, true, memory_order_relaxed);
    if (b->paced)
        pacer_charge(d->pacer.bucket, busy - b->precharge);
    pacer_account(&d->pacer, (uint64_t)busy, b->launches);
    if (b->graph) {
        atomic_store_explicit(&b->stream->graph_cost_ns, busy, memory_order_relaxed);
    } else if (b->launches > 0) {
        average_in(&d->launch_cost_ns, (uint64_t)busy / b->launches);
        if (b->gated)
            average_in(&b->stream->gated_cost_ns, (uint64_t)busy / b->launches);
    }
}

/*
 * Close the open batch of every stream `pick` chooses that the calling
 * thread may record on (a per-thread default stream is its own thread's
 * alone; the monitor launches nothing, so it owns none). `enter` makes the
 * stream's context current first (NULL: it already is). `wait`: take each
 * stream's lock even if a launcher holds it; else skip busy streams.
 */
static void close_picked(bool (*pick)(const struct gt_stream *s, const void *arg),
                         const void *arg, bool (*enter)(CUcontext ctx), bool wait)
{
    unsigned high = atomic_load_explicit(&gt.table_high, memory_order_acquire);
    pid_t me = current_tid();
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
            close_open(s);
        pthread_mutex_unlock(&s->lock);
    }
}

/* The application stopped launching on the stream without a sync point we
 * see. */
static bool quiet(const struct gt_stream *s, const void *now)
{
    return *(const uint64_t *)now - s->last_launch_ns >= GT_QUIET_NS;
}

/*
 * The gate watcher: opens the gates of gated batches the application
 * stopped feeding (GT_GATE_QUIET_NS without a launch). While every shut
 * gate is fed it makes no driver call, so it never contends with the
 * launches; the monitor meanwhile sleeps in its events, which a shut gate
 * may hold back (the legacy stream waits for every blocking stream) only
 * until this thread opens it. For a quiet batch it records the end event
 * first when it can take the stream's lock. When a launcher holds the lock
 * (its launch may itself wait behind the gate: lazy module loading can
 * wait for the whole context), or a capture is on, it only stores the
 * word, and that batch's span includes the stall. Records live as long as
 * the process, so a batch read here unlocked is always a valid record; at
 * worst a newer batch of the stream, opened a little early.
 * Returns the next time a shut gate may go quiet; 0 if none is shut.
 */
static uint64_t watch_gates(uint64_t now)
{
    uint64_t next = 0;
    bool capturing = atomic_load_explicit(&gt.captures, memory_order_acquire) > 0;
    unsigned high = atomic_load_explicit(&gt.table_high, memory_order_acquire);
    for (unsigned i = 0; i < high; i++) {
        struct gt_stream *s = &gt.streams[i];
        struct gt_batch *b = s->open;
        if (b == NULL || !atomic_load_explicit(&b->gate_shut, memory_order_acquire))
            continue;
        uint64_t quiet_at = s->last_launch_ns + GT_GATE_QUIET_NS;
        if (now < quiet_at) {
            if (next == 0 || quiet_at < next)
                next = quiet_at;
            continue;
        }
        bool handled = false;
        if (!capturing && pthread_mutex_trylock(&s->lock) == 0) {
            if (s->open != b) {
                handled = true; /* closed meanwhile */
            } else if (monitor_use_ctx(s->ctx)) {
                close_open(s);
                handled = true;
            }
            pthread_mutex_unlock(&s->lock);
        }
        if (!handled)
            gate_open(s, b);
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

static void *monitor_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&gt.queue_lock);
    for (;;) {
        bool capturing = atomic_load_explicit(&gt.captures, memory_order_acquire) > 0;
        if (gt.head != NULL && !capturing) {
            struct gt_batch *b = gt.head;
            pthread_mutex_unlock(&gt.queue_lock);
            settle(b);
            pthread_mutex_lock(&gt.queue_lock);
            gt.head = b->next;
            if (gt.head == NULL)
                gt.tail = NULL;
            /* Freed only once out of the queue: a launcher may reuse the
             * record at once and queue it again, which must not find it
             * still linked here (that lost the queue, and the stream
             * waited forever for a free record). */
            pthread_mutex_unlock(&gt.queue_lock);
            release_batch(b);
            pthread_mutex_lock(&gt.queue_lock);
            continue;
        }
        uint64_t wake = 0;
        if (!capturing && atomic_load_explicit(&gt.open_batches, memory_order_relaxed) > 0) {
            pthread_mutex_unlock(&gt.queue_lock);
            uint64_t now = now_ns();
            close_picked(quiet, &now, monitor_use_ctx, false);
            pthread_mutex_lock(&gt.queue_lock);
            if (gt.head != NULL)
                continue;
            wake = now_ns() + GT_QUIET_NS / 2;
        }
        /* Under the queue lock, so a turn that starts lingering after this
         * look wakes us (release_batch broadcasts under it). */
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

static void monitor_start(void)
{
    pthread_mutex_lock(&gt.queue_lock);
    if (!gt.monitor_running)
        gt.monitor_running = start_thread(monitor_main, "GPU time monitor");
    pthread_mutex_unlock(&gt.queue_lock);
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
 * then pass on its GPU turns. */
static void flush_at_exit(void)
{
    if (!atomic_load(&gt.ready) || atomic_load(&gt.captures) > 0 || !gt.monitor_running)
        return;
    close_picked(any_stream, NULL, set_current, false);
    struct timespec until = deadline_at(now_ns() + GT_EXIT_FLUSH_NS);
    pthread_mutex_lock(&gt.queue_lock);
    while (gt.head != NULL &&
           pthread_cond_clockwait(&gt.queue_cond, &gt.queue_lock, CLOCK_MONOTONIC, &until) == 0)
        ;
    pthread_mutex_unlock(&gt.queue_lock);
    turn_exit();
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
}

bool gt_before(struct gt_launch *l, CUstream h, bool ptsz, bool graph)
{
    if (!vgpu_limited())
        return false;
    gt_init();
    if (unlimited_everywhere())
        return false;
    struct gt_stream *s = stream_get(h, ptsz, true);
    if (s == NULL)
        return false;
    struct gt_dev *d = &gt.devs[s->dev];
    struct pacer_quota q = pacer_quota_now(&d->pacer, now_ns());
    bool paced = !pacer_quota_full(&q);
    bool capturing = atomic_load_explicit(&gt.captures, memory_order_acquire) > 0 &&
                     devmap_stream_capturing(h, ptsz);
    /* Unpaced, a stream is still measured and takes turns while a paced
     * process on its GPU needs that; it is never held back by the pacer. */
    if (capturing || (!paced && !turn_wanted(s->dev))) {
        if (s->open != NULL) {
            pthread_mutex_lock(&s->lock);
            if (s->open != NULL) {
                if (capturing)
                    abandon_open(s);
                else
                    close_open(s);
            }
            pthread_mutex_unlock(&s->lock);
        }
        return false;
    }
    if (!gt.monitor_running)
        monitor_start();
    /* The pacer sits where a batch opens: an open batch's launches follow
     * the one that was admitted, and the batch is bounded to ~1 ms. Then
     * the GPU turn, so that the batch runs alone and measures only itself.
     * The pacing is announced on the GPU first, for as long as the pacer
     * may hold us back (the balance before its refill: never too short),
     * so that the unpaced processes there keep taking turns meanwhile. */
    bool turn = false;
    if (graph || s->open == NULL) {
        if (paced) {
            int64_t balance =
                atomic_load_explicit(&d->pacer.bucket->pacer_balance_ns, memory_order_relaxed);
            turn_pacing(s->dev, pacer_deficit_ns(balance, q.ppm));
            pacer_admit(&d->pacer, &pacer_monotonic);
        }
        turn = turn_enter(s->dev);
    }
    pthread_mutex_lock(&s->lock);
    if (graph)
        close_open(s); /* a graph launch is a batch of its own */
    struct gt_batch *b = open_batch(s, d, graph, paced, &turn);
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
    uint32_t target = batch_target(&gt.devs[b->dev]);
    if (b->gated && gate_target(s) < target)
        target = gate_target(s);
    if (l->graph || b->launches >= target)
        close_open(s);
    pthread_mutex_unlock(&s->lock);
}

static void close_stream(CUstream h, bool ptsz, bool forget)
{
    if (!vgpu_limited() || !atomic_load_explicit(&gt.ready, memory_order_acquire))
        return;
    if (!forget && atomic_load_explicit(&gt.open_batches, memory_order_relaxed) == 0)
        return;
    struct gt_stream *s = stream_get(h, ptsz, false);
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->lock);
    if (s->open != NULL)
        close_open(s);
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
    close_picked(in_context, ctx, NULL, true);
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
