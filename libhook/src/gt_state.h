/*
 * gt_state.h - what the files of the GPU-time module share: the batch and
 * stream-state records, the process-wide state `gt`, and the functions they
 * call across (gputime.h is the module's interface to the launch hooks).
 *
 *   gputime.c     setup, the process-wide state, and the launch path
 *   gt_streams.c  stream states: which record a launch's stream uses
 *   gt_batches.c  batches: opening, closing, and the in-flight bound
 *   gt_gates.c    gated batches and the gate watcher thread
 *   gt_monitor.c  the monitor thread that measures closed batches
 *   gt_tally.c    batches counted by how they were measured (VGPU_BATCH_STATS)
 *
 * Concurrency: each stream's state has a mutex held by a launching thread
 * from the batch decision through the driver call, so a batch's events
 * bracket exactly its launches; the monitor and the gate watcher only ever
 * try-lock it. The cross-process bucket is atomics only (pacer.c). While
 * any stream capture is active, nobody here calls what global capture mode
 * forbids (event synchronisation): the monitor pauses and launchers skip
 * the in-flight wait.
 */
#ifndef VGPU_GT_STATE_H
#define VGPU_GT_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "gputime.h"
#include "pacer.h"
#include "turnless.h"
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
    bool estimated;         /* not gated in its stead: charged at most its stream's gated cost */
    bool shared;            /* opened without the turn beside another paced tenant: the same */
    _Atomic bool gate_shut; /* that gate is not yet opened (the monitor may open it unlocked) */
    _Atomic bool opened_quiet; /* the gate watcher opened it: its span is no measure (gt_gates.c) */
    _Atomic uint32_t gate;  /* the gate's value: the stream's count of gated batches */
    uint32_t launches;
    uint32_t target;        /* launches after which it closes */
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
    _Atomic uint64_t gated_fresh_until_ns; /* it stays fresh until then (gputime.h) */
    _Atomic uint64_t proven_at_ns; /* when a shared batch last proved that cost (0: never) */
    _Atomic uint32_t renewals;     /* freshness renewed on such proofs since the last measure */
    uint32_t gates;         /* gated batches so far: the value of the next gate minus one */
    uint64_t draws;         /* batches that might have gone ungated (gt_gate_skip) */
    struct gt_batch ring[GT_RING];
};

struct gt_dev {
    struct pacer_dev pacer;
    _Atomic uint64_t launch_cost_ns; /* running average GPU time per launch */
    struct turnless turnless;        /* may its paced batches go without the turn */
    struct gt_batch *last_end;       /* settled batch that ended last (gt_monitor.c); monitor only */
};

struct gt_state {
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
};

extern struct gt_state gt;

static inline uint64_t now_ns(void)
{
    return pacer_monotonic.now(NULL);
}

/* A CLOCK_MONOTONIC deadline for pthread_cond_clockwait. */
static inline struct timespec deadline_at(uint64_t ns)
{
    return (struct timespec){.tv_sec = (time_t)(ns / 1000000000ull),
                             .tv_nsec = (long)(ns % 1000000000ull)};
}

/* ---- gt_streams.c ---- */

/* The state of a launch's stream (created on first sight when `create`);
 * NULL when it cannot be had (its launches go unmeasured). */
struct gt_stream *gt_stream_get(CUstream h, bool ptsz, bool create);
pid_t gt_current_tid(void);
/* In a forked child: the calling thread's cached lookups are the parent's. */
void gt_streams_forget_thread(void);

/* ---- gt_batches.c ---- */

uint32_t gt_batch_target(const struct gt_dev *d);
struct gt_batch *gt_open_batch(struct gt_stream *s, struct gt_dev *d, bool graph, bool paced,
                               bool shared, bool *turn);
void gt_close_open(struct gt_stream *s);
void gt_abandon_open(struct gt_stream *s);
/* A batch is done with: its turn count left (gt_batch_measured), its
 * record free for a new batch (gt_free_record); both: gt_release_batch. */
void gt_batch_measured(struct gt_batch *b);
void gt_free_record(struct gt_batch *b);
void gt_release_batch(struct gt_batch *b);

/* ---- gt_gates.c ---- */

bool gt_gate_wanted(const struct gt_stream *s, bool graph, bool paced);
bool gt_gate_skip(struct gt_stream *s, bool turn);
bool gt_gated_cost_fresh(const struct gt_stream *s, uint64_t now);
/* The stream's gated cost was just measured, at `now` (monitor): fresh for
 * a while (gputime.h, GT_SHARED_FRESH_NS). */
void gt_gated_cost_measured(struct gt_stream *s, uint64_t now);
/* A gated shared batch of the stream, measured at `now` (monitor), had a
 * span that proves its gated cost (running_cost_proven). */
void gt_shared_cost_proven(struct gt_stream *s, uint64_t now);
/* The gated cost is stale: may a recent proof renew it (gputime.h)? If so
 * it is fresh again, for a new draw. */
bool gt_gated_cost_renewed(struct gt_stream *s, uint64_t now);
void gt_gate_shut(struct gt_stream *s, struct gt_batch *b);
void gt_gate_open(struct gt_stream *s, struct gt_batch *b);
uint32_t gt_gate_target(const struct gt_stream *s);

/* ---- gt_touch.c ---- */

/* The touch kernel of the stream's context (gputime.h), NULL where it
 * cannot be had. Loads it and runs it once there the first time: call
 * with no gate of `s` shut. */
CUfunction gt_touch_function(struct gt_stream *s);
/* Queue it on the stream. */
void gt_touch(struct gt_stream *s, CUfunction fn);
/* In a forked child: the parent's contexts, and their modules, are not its. */
void gt_touch_reset(void);

/* ---- gt_monitor.c ---- */

/* A detached helper thread that receives no signal of the application's. */
bool gt_start_thread(void *(*main_fn)(void *), const char *what);
void gt_monitor_start(void);
/* Make ctx current on a helper thread (remembered per thread). */
bool gt_use_ctx(CUcontext ctx);
/*
 * Close the open batch of every stream `pick` chooses that the calling
 * thread may record on (a per-thread default stream is its own thread's
 * alone; the helpers launch nothing, so they own none). `enter` makes the
 * stream's context current first (NULL: it already is). `wait`: take each
 * stream's lock even if a launcher holds it; else skip busy streams.
 */
void gt_close_picked(bool (*pick)(const struct gt_stream *s, const void *arg), const void *arg,
                     bool (*enter)(CUcontext ctx), bool wait);

/* ---- gt_tally.c ---- */

/* How a batch was measured: gated (its span, exact), shared (gated beside
 * another paced tenant, at its cost where its span proves it), sampled
 * (ungated in a gate's stead, at most its cost), a graph launch, plain
 * (unpaced, or a stream that cannot be gated: its span), or not at all
 * (its estimate: no batch record, no event). */
enum gt_kind {
    GT_KIND_GATED,
    GT_KIND_SHARED,
    GT_KIND_SAMPLED,
    GT_KIND_GRAPH,
    GT_KIND_PLAIN,
    GT_KIND_UNMEASURED,
    GT_KINDS
};
enum gt_kind gt_kind_of(const struct gt_batch *b);
/* Count one batch of `launches` charged `busy_ns` (`at_cost`: its cost
 * per launch, not its span). Any thread. */
void gt_tally(enum gt_kind kind, uint64_t launches, uint64_t busy_ns, bool at_cost);
/* A batch was touched (gt_touch.c). Any thread. */
void gt_tally_touch(void);
/* At exit: the counts, as one JSON line appended to VGPU_BATCH_STATS. */
void gt_tally_write(void);

#endif
