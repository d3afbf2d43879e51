/*
 * vgpu_broker.c - the daemon's broker of the GPU turn between vGPUs (see
 * vgpu_abi.h and docs/compute.md, "Taking turns").
 *
 * Per GPU it grants the turn to one vGPU at a time, round robin among the
 * vGPUs whose usage block asks for it (vgpu_turn.request), by writing that
 * vGPU's control block (turn_grant, a futex word its hooks sleep on, and
 * turn_until_ns). It publishes to every vGPU there the pacing stamp of the
 * GPU's other vGPUs, and beats in every control block so that hooks know a
 * broker is at work.
 *
 * The daemon is the only writer another vGPU reads: a tenant reaches the
 * broker through one 32-bit request word, one 32-bit overrun claim and one
 * 64-bit stamp in its own usage block, each read with a single load and
 * taken for nothing but that tenant's wish. Whatever it writes there, it
 * gets at most its turn of the round: a holder that is idle when others
 * wait loses the turn at once; one that stays busy past its time loses it
 * by force TURN_REVOKE_GRACE_NS later, or, in a round where it claims a
 * longer batch (overrun_ms) with turn credit left, as much later as it
 * claims and at most BROKER_OVERRUN_CAP_NS past its time; and while others
 * ask, a vGPU holds the turn for at most its quota (the daemon's, in its
 * control block) plus BROKER_SLACK_PPM of the time, or it sits out until
 * its credit is back (a vGPU that claims turns, or batches, it does not use
 * cannot take more than that); a stamp counts only while the daemon's own
 * quota for that vGPU is below 100 % and reaches at most
 * BROKER_STAMP_CAP_NS ahead; a vGPU's words wake the broker at most
 * BROKER_WAKES_PER_PERIOD times a period, whether they change or are only
 * woken (FUTEX_WAKE on a word one maps needs no change of it), and past
 * BROKER_LOOKS_PER_PERIOD looks in a period the broker looks at most every
 * BROKER_LOOK_GAP_NS, however many vGPUs wake it.
 *
 * One thread for every GPU, asleep in futex_waitv on the words whose change
 * it must answer (a holder's request while others wait, the requests of the
 * vGPUs that do not ask yet, its own wake word), with a timeout at the next
 * deadline. Usage blocks may shrink under the mapping: the daemon guards
 * them (vgpu_guard.c), so a load there reads zeros at worst. The tables are
 * under one mutex, which the thread drops while it sleeps; the daemon adds
 * and removes entries under it, and never unmaps a block still entered.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../src/arbiter.h"
#include "../src/turn.h"
#include "vgpu_abi.h"

#define VGPU_BROKER_API __attribute__((visibility("default")))

VGPU_BROKER_API int vgpu_broker_add(const char *gpu, struct vgpu_control *control, int dev,
                                    struct vgpu_usage *usage, int usage_dev);
VGPU_BROKER_API int vgpu_broker_rebind(int id, struct vgpu_usage *usage);
VGPU_BROKER_API void vgpu_broker_remove(int id);
VGPU_BROKER_API void vgpu_broker_stop(void);

#define BROKER_MEMBERS 4096 /* (vGPU, GPU) pairs on the node */
#define BROKER_GPUS 64
#define BROKER_PER_GPU 512
/* futex_waitv takes at most 128 words; beyond that, the others are looked
 * at every BROKER_POLL_NS instead. */
#define BROKER_WATCH_MAX 128
#define BROKER_POLL_NS 2000000ull
/* The beat and the stamps are refreshed at least this often... */
#define BROKER_PERIOD_NS 50000000ull
/* ... and, while no vGPU on any GPU asks, holds the turn or paces (its
 * stamp, or one published), this often: then the beat is all a look does,
 * and a node of idle vGPUs paid 0.30-0.37 % of a core for twenty looks a
 * second (docs/benchmarks/daemon.md). A quarter of the hooks' stale bound
 * (GRANT_BROKER_STALE_NS); a request still wakes the broker at once (it
 * sleeps on the request words), and a stamp written meanwhile is
 * published at the next look. */
#define BROKER_IDLE_PERIOD_NS 250000000ull
/* A holder busy this long past turn_until_ns loses the turn by force: the
 * hook stops opening batches at turn_until_ns and drains them
 * (TURN_DRAIN_NS, a batch that only its thread can close; a 20 ms kernel
 * still running), so an honest one has passed it on before. A holder whose
 * batches opened in its time run longer (a graph launch of 300 ms) says so
 * in overrun_ms; that claim, capped at BROKER_OVERRUN_CAP_NS, replaces the
 * grace in a round where the holder has turn credit left when the grace
 * runs out (revoke_at). */
#define TURN_REVOKE_GRACE_NS (TURN_DRAIN_NS + 30000000ull)
#define BROKER_OVERRUN_CAP_NS TURN_BATCH_CAP_NS
/* Turn time a vGPU may hold while others ask, beyond its quota: an honest
 * holder also holds the turn through its own gaps between launches, the
 * hand-offs and the linger. Overridable at build time (CFLAGS=-D...) to
 * compare. */
#ifndef BROKER_SLACK_PPM
#define BROKER_SLACK_PPM 100000u
#endif
/* Turn credit saved while not contended is capped: a vGPU idle for long
 * cannot then hold the GPU for long. */
#define BROKER_CREDIT_CAP_NS 100000000ll
/* An overrun (revoke_at) is granted to a holder whose credit, when its
 * grace runs out, is above minus the cap: one that just spent its credit
 * on its own honest work (a first batch of unknown cost) keeps its batch
 * whole; one that keeps holding past its share has none. */
#define BROKER_OVERRUN_CREDIT_NS (-BROKER_CREDIT_CAP_NS)
#define BROKER_CREDIT_FLOOR_NS (-2000000000ll)
/* The floor forgives nothing a round can cost: an overrun starts at no
 * less than BROKER_OVERRUN_CREDIT_NS and lasts at most the cap less the
 * grace. */
_Static_assert(BROKER_OVERRUN_CAP_NS - TURN_REVOKE_GRACE_NS - BROKER_OVERRUN_CREDIT_NS <
                   (uint64_t)-BROKER_CREDIT_FLOOR_NS,
               "an overrun could take a holder's credit below the floor");
/* A pacing stamp is published at most this far ahead (hooks stamp 0.5 s
 * ahead plus their expected wait; republished every period anyway). */
#define BROKER_STAMP_CAP_NS 1000000000ull
/* A published stamp is moved forward once the vGPUs' reaches this much
 * further: one write of the control blocks' line per GPU per 100 ms. */
#define BROKER_STAMP_SLACK_NS 100000000ull
/* A vGPU whose words woke the broker (changed, or woken without a change)
 * this often in a period is not slept on until the period ends (it is
 * still read at every look): an honest one changes its request a few times
 * per turn. */
#define BROKER_WAKES_PER_PERIOD 100
/* Looks a period answered at once, whatever woke them; past that, the rest
 * of the period's looks come at most this often. An honest node looks a
 * few times per hand-off; many hostile vGPUs, each within its own wakes,
 * could otherwise still keep the thread looking (each look costs a pass
 * over the GPUs' vGPUs: ~5 us with a hundred). */
#define BROKER_LOOKS_PER_PERIOD 100
#define BROKER_LOOK_GAP_NS 1000000ull
/* A vGPU granted the turn that never took it up (its asking process died,
 * or it asks for nothing) is not heard asking with the same word again for
 * this long, doubled at each repeat up to the cap: a dead asker costs the
 * others a hand-off grace now and then, not one per round. */
#define BROKER_STALE_FIRST_NS 40000000ull
#define BROKER_STALE_CAP_NS 1000000000ull

struct member {
    bool used;
    int gpu;
    struct vgpu_control_device *ctl; /* the daemon's: the broker writes it */
    _Atomic uint64_t *beat;
    struct vgpu_turn *turn;          /* the tenant's: read only, one word at a time */
    int usage_dev;                   /* which device entry of the usage block */
    uint32_t seen;                   /* request at the last look */
    unsigned wakes;                  /* times its words woke the broker this period */
    int64_t credit_ns;               /* turn time it may still hold while others ask */
    uint64_t credit_stamp;
    uint32_t stale;                  /* a request that was granted and never taken up */
    uint64_t stale_until;            /* ... is not heard until then */
    uint64_t stale_ns;               /* how long the last such silence was */
};

struct gpu {
    char uuid[VGPU_UUID_LEN];
    int count;
    int members[BROKER_PER_GPU];
    int holder;           /* member index, -1: none */
    int last;             /* position in members[] of the last holder (round robin) */
    uint32_t grant;       /* the holder's grant id */
    uint32_t next_id;
    uint64_t granted_at;
    uint64_t until;       /* 0: nobody else waited */
    uint64_t revoke_at;   /* when a busy holder loses the grant by force; 0: not decided */
    bool contended;       /* others asked at the last look */
    bool taken_up;        /* the holder worked under this grant (echoed it) */
};

static struct {
    pthread_mutex_t lock;
    pthread_t thread;
    bool running;
    bool stop;
    _Atomic uint32_t wake;  /* bumped by add/remove/stop: look again */
    uint64_t period_start;
    unsigned looks;         /* this period's */
    struct member members[BROKER_MEMBERS];
    struct gpu gpus[BROKER_GPUS];
    int gpu_count;
} broker = {.lock = PTHREAD_MUTEX_INITIALIZER};

struct watch {
    struct futex_waitv w[BROKER_WATCH_MAX];
    int who[BROKER_WATCH_MAX]; /* the member whose word it is; -1: the broker's own */
    unsigned n;
    bool overflow;
    uint64_t deadline;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void watch_word(struct watch *w, int who, _Atomic uint32_t *word, uint32_t expect)
{
    if (w->n == BROKER_WATCH_MAX) {
        w->overflow = true;
        return;
    }
    w->who[w->n] = who;
    /* Not FUTEX2_PRIVATE: the words are in file mappings shared with hooks. */
    w->w[w->n++] = (struct futex_waitv){
        .val = expect, .uaddr = (uintptr_t)word, .flags = FUTEX_32, .__reserved = 0};
}

/* A member's request word, slept on while its wakes this period allow. */
static void watch_request(struct watch *w, int id, uint32_t expect)
{
    struct member *m = &broker.members[id];
    if (m->wakes < BROKER_WAKES_PER_PERIOD)
        watch_word(w, id, &m->turn->request, expect);
}

static void watch_until(struct watch *w, uint64_t when)
{
    if (when < w->deadline)
        w->deadline = when;
}

static uint32_t request_of(struct member *m)
{
    uint32_t r = atomic_load(&m->turn->request);
    if (r != m->seen) {
        m->seen = r;
        m->wakes++;
    }
    return r;
}

/* ---- the pacing stamp ------------------------------------------------------ */

/* Each vGPU is shown the latest stamp of the GPU's other vGPUs, not its
 * own: a paced process samples its gates only while no other tenant paces
 * there (gputime.h), and its own vGPU's stamp says nothing of that. */
static bool publish_stamp(struct gpu *g, uint64_t now)
{
    bool shown = false; /* a stamp is live, or still published */
    uint64_t best = 0, second = 0;
    int best_at = -1;
    for (int i = 0; i < g->count; i++) {
        struct member *m = &broker.members[g->members[i]];
        uint64_t s = atomic_load_explicit(&m->turn->paced_until_ns, memory_order_relaxed);
        if (s <= now)
            continue;
        /* A vGPU at 100 % paces nothing, whatever it writes. */
        if (atomic_load_explicit((_Atomic uint32_t *)&m->ctl->throttle.quota_ppm,
                                 memory_order_relaxed) >= VGPU_PPM_FULL)
            continue;
        if (s - now > BROKER_STAMP_CAP_NS)
            s = now + BROKER_STAMP_CAP_NS;
        if (s > best) {
            second = best;
            best = s;
            best_at = i;
        } else if (s > second) {
            second = s;
        }
    }
    for (int i = 0; i < g->count; i++) {
        struct member *m = &broker.members[g->members[i]];
        uint64_t others = i == best_at ? second : best;
        uint64_t cur = atomic_load_explicit(&m->ctl->paced_until_ns, memory_order_relaxed);
        uint64_t next = cur;
        if (others == 0)
            next = 0;
        else if (others > cur + BROKER_STAMP_SLACK_NS || cur <= now)
            next = others;
        if (next != cur)
            atomic_store_explicit(&m->ctl->paced_until_ns, next, memory_order_relaxed);
        shown = shown || next != 0;
    }
    return shown || best != 0;
}

/* ---- the turn --------------------------------------------------------------- */

/* The holder's time is over or unbounded again: the next one is decided
 * afresh. */
static void clear_time(struct gpu *g)
{
    g->until = 0;
    g->revoke_at = 0;
}

static void take_back(struct gpu *g, struct member *h)
{
    atomic_store(&h->ctl->turn_until_ns, 0);
    atomic_store(&h->ctl->turn_grant, 0);
    wake_all(&h->ctl->turn_grant);
    g->holder = -1;
    clear_time(g);
}

/*
 * When a busy holder loses the grant by force: TURN_REVOKE_GRACE_NS past
 * its time; or, if its batches opened in that time run longer (its claim,
 * overrun_ms, read once per grant when the grace runs out) and its turn
 * credit then is above BROKER_OVERRUN_CREDIT_NS, as long as it claims, at
 * most BROKER_OVERRUN_CAP_NS past its time. The claim is the tenant's word:
 * the cap bounds the round; the credit, spent in the overrun as in any
 * held time, bounds how often such a round comes and how much of the GPU
 * all its rounds take together (its quota plus BROKER_SLACK_PPM while
 * others ask, as without claims).
 */
static uint64_t revoke_at(struct gpu *g, const struct member *h, uint64_t now)
{
    uint64_t grace = g->until + TURN_REVOKE_GRACE_NS;
    if (now < grace)
        return grace;
    if (g->revoke_at == 0) {
        uint64_t claim = (uint64_t)atomic_load_explicit(&h->turn->overrun_ms,
                                                        memory_order_relaxed) * 1000000ull;
        if (claim > BROKER_OVERRUN_CAP_NS)
            claim = BROKER_OVERRUN_CAP_NS;
        bool overrun = h->credit_ns > BROKER_OVERRUN_CREDIT_NS && claim > TURN_REVOKE_GRACE_NS;
        g->revoke_at = overrun ? g->until + claim : grace;
    }
    return g->revoke_at;
}

/* An idle holder's turn goes to those who wait; the hand-shake of grant.c:
 * if its process started working under the grant as we took it, it keeps
 * the grant (nobody else had it meanwhile). True when taken. */
static bool take_back_idle(struct gpu *g, struct member *h, uint64_t now)
{
    atomic_store(&h->ctl->turn_grant, 0);
    if (atomic_load(&h->turn->request) == g->grant) {
        atomic_store(&h->ctl->turn_grant, g->grant);
        wake_all(&h->ctl->turn_grant);
        return false;
    }
    if (!g->taken_up && h->seen != 0 && now >= g->granted_at + ARBITER_HANDOFF_NS) {
        /* Granted, still asking, never took it up. (A holder that worked
         * and asks again for its next batch is no dead asker.) */
        h->stale_ns = h->seen == h->stale && h->stale_ns != 0 ? h->stale_ns * 2
                                                                : BROKER_STALE_FIRST_NS;
        if (h->stale_ns > BROKER_STALE_CAP_NS)
            h->stale_ns = BROKER_STALE_CAP_NS;
        h->stale = h->seen;
        h->stale_until = now + h->stale_ns;
    }
    take_back(g, h);
    return true;
}

/* Does the member ask for the turn (its request read as `r`)? */
static bool asks_now(struct member *m, uint32_t r, uint64_t now)
{
    if (r == 0)
        return false;
    if (r != m->stale) {
        m->stale = 0;
        m->stale_ns = 0;
        return true;
    }
    return now >= m->stale_until;
}

static void give(struct gpu *g, int pos, bool others_wait, uint64_t now)
{
    struct member *m = &broker.members[g->members[pos]];
    if (++g->next_id <= VGPU_TURN_WANT)
        g->next_id = VGPU_TURN_WANT + 1;
    g->grant = g->next_id;
    g->holder = g->members[pos];
    g->last = pos;
    g->granted_at = now;
    g->taken_up = false;
    clear_time(g);
    g->until = others_wait ? now + TURN_HOLD_NS : 0;
    atomic_store(&m->ctl->turn_until_ns, g->until);
    atomic_store(&m->ctl->turn_grant, g->grant);
    wake_all(&m->ctl->turn_grant);
}

/* Turn credit: refilled at the vGPU's quota plus the slack, spent while it
 * holds the turn and others ask. */
static void account(struct gpu *g, struct member *m, bool holder, uint64_t now)
{
    uint64_t elapsed = now - m->credit_stamp;
    m->credit_stamp = now;
    uint32_t quota = atomic_load_explicit((_Atomic uint32_t *)&m->ctl->throttle.quota_ppm,
                                          memory_order_relaxed);
    uint64_t rate = (uint64_t)quota + BROKER_SLACK_PPM;
    if (rate > VGPU_PPM_FULL)
        rate = VGPU_PPM_FULL;
    if (elapsed > BROKER_IDLE_PERIOD_NS * 4)
        elapsed = BROKER_IDLE_PERIOD_NS * 4; /* the refill below cannot overflow */
    int64_t credit = m->credit_ns + (int64_t)(elapsed * rate / VGPU_PPM_FULL);
    if (holder && g->contended)
        credit -= (int64_t)elapsed;
    if (credit > BROKER_CREDIT_CAP_NS)
        credit = BROKER_CREDIT_CAP_NS;
    if (credit < BROKER_CREDIT_FLOOR_NS)
        credit = BROKER_CREDIT_FLOOR_NS;
    m->credit_ns = credit;
}

/* The next asking vGPU after the last holder, round robin, among those with
 * credit; when none has any, the next asking one (the GPU is not left
 * idle for want of credit). */
static int pick(struct gpu *g, const bool *asks)
{
    int fallback = -1;
    for (int k = 1; k <= g->count; k++) {
        int pos = (g->last + k) % g->count;
        if (!asks[pos])
            continue;
        if (broker.members[g->members[pos]].credit_ns >= 0)
            return pos;
        if (fallback < 0)
            fallback = pos;
    }
    return fallback;
}

/* One look at a GPU; whether anything is going on there: a vGPU asks, or
 * works under its grant, or a stamp is live or published. */
static bool step(struct gpu *g, uint64_t now, bool new_period, struct watch *w)
{
    if (g->count == 0)
        return false;
    bool going_on = publish_stamp(g, now);
    bool asks[BROKER_PER_GPU];
    int asking = 0, holder_pos = -1;
    for (int i = 0; i < g->count; i++) {
        struct member *m = &broker.members[g->members[i]];
        if (new_period)
            m->wakes = 0;
        account(g, m, g->members[i] == g->holder, now);
        uint32_t r = request_of(m);
        going_on = going_on || r != 0;
        asks[i] = g->members[i] != g->holder && asks_now(m, r, now);
        asking += asks[i];
        if (g->members[i] == g->holder)
            holder_pos = i;
    }
    if (holder_pos >= 0) {
        struct member *h = &broker.members[g->holder];
        bool busy = h->seen == g->grant;
        if (busy) {
            g->taken_up = true;
            h->stale = 0; /* it takes its turns up: nothing of its is stale */
        }
        if (asking == 0) {
            if (g->until != 0) { /* the others gave up: no time limit */
                clear_time(g);
                atomic_store(&h->ctl->turn_until_ns, 0);
            }
        } else if (!busy) {
            /* Just granted: its process has a hand-off's time to start. */
            if (h->seen != 0 && now < g->granted_at + ARBITER_HANDOFF_NS) {
                watch_request(w, g->holder, h->seen);
                watch_until(w, g->granted_at + ARBITER_HANDOFF_NS);
            } else if (take_back_idle(g, h, now)) {
                holder_pos = -1;
            }
        } else {
            /* Others ask: the holder's time runs from its grant, but not
             * from before now (one that held the GPU alone for long has its
             * grace to drain what runs, as any other), and ends now if it
             * has held more than its credit. */
            uint64_t until = g->until;
            if (until == 0)
                until = g->granted_at + TURN_HOLD_NS > now ? g->granted_at + TURN_HOLD_NS : now;
            if (h->credit_ns < 0 && until > now)
                until = now;
            if (until != g->until) {
                g->until = until;
                atomic_store(&h->ctl->turn_until_ns, until);
            }
            uint64_t revoke = revoke_at(g, h, now);
            if (now >= revoke) {
                take_back(g, h);
                holder_pos = -1;
            } else {
                watch_request(w, g->holder, g->grant);
                watch_until(w, revoke);
            }
        }
    }
    g->contended = asking > 0;
    if (holder_pos < 0 && asking > 0) {
        int pos = pick(g, asks);
        asks[pos] = false;
        give(g, pos, asking > 1, now);
        holder_pos = pos;
        struct member *h = &broker.members[g->holder];
        watch_request(w, g->holder, h->seen);
        watch_until(w, now + ARBITER_HANDOFF_NS);
    }
    /* Those that do not ask yet: the broker must hear when they do. */
    for (int i = 0; i < g->count; i++) {
        struct member *m = &broker.members[g->members[i]];
        if (i != holder_pos && m->seen == 0)
            watch_request(w, g->members[i], 0);
    }
    return going_on; /* a holder at work echoes its grant: r != 0 */
}

static void beat_all(uint64_t now)
{
    for (int i = 0; i < BROKER_MEMBERS; i++)
        if (broker.members[i].used)
            atomic_store_explicit(broker.members[i].beat, now, memory_order_relaxed);
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull)};
    nanosleep(&ts, NULL);
}

/* The member whose word woke the broker without changing (a FUTEX_WAKE
 * needs no change of the word): counted as a change is (request_of). */
static void woken_by(const struct watch *w, long index)
{
    if (index < 0 || (unsigned long)index >= w->n || w->who[index] < 0)
        return;
    struct member *m = &broker.members[w->who[index]];
    if (m->used && atomic_load(&m->turn->request) == w->w[index].val)
        m->wakes++;
}

static void *broker_main(void *arg)
{
    (void)arg;
    uint64_t last_look = 0;
    pthread_mutex_lock(&broker.lock);
    while (!broker.stop) {
        uint64_t now = now_ns();
        if (broker.looks >= BROKER_LOOKS_PER_PERIOD && now - broker.period_start < BROKER_PERIOD_NS &&
            now < last_look + BROKER_LOOK_GAP_NS) {
            pthread_mutex_unlock(&broker.lock);
            sleep_ns(last_look + BROKER_LOOK_GAP_NS - now);
            pthread_mutex_lock(&broker.lock);
            now = now_ns();
        }
        bool new_period = now - broker.period_start >= BROKER_PERIOD_NS;
        if (new_period) {
            broker.period_start = now;
            broker.looks = 0;
            beat_all(now);
        }
        broker.looks++;
        last_look = now;
        struct watch w = {
            .n = 0, .overflow = false, .deadline = broker.period_start + BROKER_IDLE_PERIOD_NS};
        watch_word(&w, -1, &broker.wake, atomic_load(&broker.wake));
        bool busy = false;
        for (int i = 0; i < broker.gpu_count; i++)
            busy = step(&broker.gpus[i], now, new_period, &w) || busy;
        if (busy)
            watch_until(&w, broker.period_start + BROKER_PERIOD_NS);
        if (w.overflow)
            watch_until(&w, now + BROKER_POLL_NS);
        pthread_mutex_unlock(&broker.lock);
        struct timespec until = {.tv_sec = (time_t)(w.deadline / 1000000000ull),
                                 .tv_nsec = (long)(w.deadline % 1000000000ull)};
        /* A wake, a word already moved, a signal or the deadline: look again. */
        long woke = syscall(SYS_futex_waitv, w.w, w.n, 0, &until, CLOCK_MONOTONIC);
        if (woke < 0 && errno == ENOSYS)
            sleep_ns(BROKER_POLL_NS); /* a kernel before 5.16: short timed looks instead */
        pthread_mutex_lock(&broker.lock);
        woken_by(&w, woke);
    }
    pthread_mutex_unlock(&broker.lock);
    return NULL;
}

static void kick(void)
{
    atomic_fetch_add(&broker.wake, 1);
    wake_all(&broker.wake);
}

/* Start the thread (lock held). Only faults stay unblocked in it: the
 * daemon's signals are for its main thread; a SIGBUS from a shrunk usage
 * block must reach the guard's handler. */
static int start(void)
{
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGSEGV);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    broker.stop = false;
    broker.period_start = 0;
    int rc = pthread_create(&broker.thread, NULL, broker_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return -1;
    broker.running = true;
    return 0;
}

static int gpu_index(const char *uuid)
{
    for (int i = 0; i < broker.gpu_count; i++)
        if (strncmp(broker.gpus[i].uuid, uuid, VGPU_UUID_LEN) == 0)
            return i;
    if (broker.gpu_count == BROKER_GPUS)
        return -1;
    struct gpu *g = &broker.gpus[broker.gpu_count];
    memset(g, 0, sizeof(*g));
    strncpy(g->uuid, uuid, VGPU_UUID_LEN - 1);
    g->holder = -1;
    /* Ids from the clock: a restarted broker does not hand out an id that
     * its predecessor's holders still echo. */
    g->next_id = (uint32_t)(now_ns() >> 20);
    return broker.gpu_count++;
}

/* Enter device `dev` of a vGPU's control block and device `usage_dev` of its
 * usage block under GPU `gpu`; returns an id for vgpu_broker_remove, or -1.
 * Any grant the block held (a previous daemon's) is taken back. */
int vgpu_broker_add(const char *gpu, struct vgpu_control *control, int dev,
                    struct vgpu_usage *usage, int usage_dev)
{
    if (gpu == NULL || control == NULL || usage == NULL || dev < 0 || dev >= VGPU_MAX_DEVICES ||
        usage_dev < 0 || usage_dev >= VGPU_MAX_DEVICES)
        return -1;
    int id = -1;
    pthread_mutex_lock(&broker.lock);
    int gi = gpu_index(gpu);
    if (gi < 0 || broker.gpus[gi].count == BROKER_PER_GPU)
        goto out;
    for (int i = 0; i < BROKER_MEMBERS && id < 0; i++)
        if (!broker.members[i].used)
            id = i;
    if (id < 0)
        goto out;
    if (!broker.running && start() != 0) {
        id = -1;
        goto out;
    }
    struct member *m = &broker.members[id];
    *m = (struct member){.used = true,
                         .gpu = gi,
                         .ctl = &control->devices[dev],
                         .beat = &control->turn_beat_ns,
                         .turn = &usage->devices[usage_dev].turn,
                         .usage_dev = usage_dev,
                         /* What any vGPU idle for a moment has: enough for
                          * its first long batch to overrun (revoke_at). */
                         .credit_ns = BROKER_CREDIT_CAP_NS,
                         .credit_stamp = now_ns()};
    atomic_store(&m->ctl->turn_until_ns, 0);
    atomic_store(&m->ctl->paced_until_ns, 0);
    atomic_store(&m->ctl->turn_grant, 0);
    wake_all(&m->ctl->turn_grant);
    atomic_store(m->beat, now_ns());
    struct gpu *g = &broker.gpus[gi];
    g->members[g->count++] = id;
    kick();
out:
    pthread_mutex_unlock(&broker.lock);
    return id;
}

/* Point entry `id` at a new usage block, the same device entry of it (the
 * daemon remakes a block its tenant cut short), before the old one is
 * unmapped. What the broker holds against the vGPU stays: its turn credit,
 * its silence as a stale asker, its place in the round robin. Entered
 * afresh instead, a vGPU would start with a full credit, so a tenant that
 * truncated its own block at every scan would hold the turn past its
 * quota plus the slack. A grant it held ends (its processes died with the
 * old block). 0, or -1 where `id` is not entered. */
int vgpu_broker_rebind(int id, struct vgpu_usage *usage)
{
    if (id < 0 || id >= BROKER_MEMBERS || usage == NULL)
        return -1;
    pthread_mutex_lock(&broker.lock);
    struct member *m = &broker.members[id];
    int rc = -1;
    if (m->used) {
        struct gpu *g = &broker.gpus[m->gpu];
        if (g->holder == id)
            take_back(g, m);
        m->turn = &usage->devices[m->usage_dev].turn;
        m->seen = 0;
        kick();
        rc = 0;
    }
    pthread_mutex_unlock(&broker.lock);
    return rc;
}

/* Forget an entry (before its blocks are unmapped); a grant it held ends. */
void vgpu_broker_remove(int id)
{
    if (id < 0 || id >= BROKER_MEMBERS)
        return;
    pthread_mutex_lock(&broker.lock);
    struct member *m = &broker.members[id];
    if (m->used) {
        struct gpu *g = &broker.gpus[m->gpu];
        if (g->holder == id)
            take_back(g, m);
        int pos = 0;
        while (pos < g->count && g->members[pos] != id)
            pos++;
        if (pos < g->count) {
            /* Keep the holder's position and the round robin's place. */
            memmove(&g->members[pos], &g->members[pos + 1],
                    sizeof(g->members[0]) * (size_t)(g->count - pos - 1));
            g->count--;
            if (g->last >= pos && g->last > 0)
                g->last--;
        }
        m->used = false;
        kick();
    }
    pthread_mutex_unlock(&broker.lock);
}

/* Stop the thread (the daemon exits). Hooks see the beat go stale and run
 * unarbitrated between vGPUs until a broker beats again. */
void vgpu_broker_stop(void)
{
    pthread_mutex_lock(&broker.lock);
    bool running = broker.running;
    broker.stop = true;
    broker.running = false;
    kick();
    pthread_mutex_unlock(&broker.lock);
    if (running)
        pthread_join(broker.thread, NULL);
}
