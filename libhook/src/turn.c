/*
 * turn.c - this process's side of the GPU turn (see turn.h, arbiter.h).
 *
 * Per device: an in-process mutex and condition (threads of one process
 * share its turn: one of them queues for it, the others wait for that one),
 * the ticket held, and the number of batches counted on the device. The
 * monitor thread calls turn_leave as it measures each batch, so the turn is
 * passed on as soon as the process's last batch on the GPU has completed.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "arbiter.h"
#include "turn.h"
#include "vgpu.h"

struct turn_dev {
    pthread_mutex_t lock;
    pthread_cond_t cond;           /* the turn came or went, a batch was measured */
    _Atomic bool looked;           /* the arbiter was looked for (set once, under lock) */
    struct vgpu_arbiter *arbiter;  /* NULL: no turns on this device */
    bool holding;
    bool queueing;                 /* one of our threads sleeps in arbiter_acquire */
    uint32_t ticket;
    uint64_t held_since;
    _Atomic uint64_t linger_until; /* holding with no batch: pass on at this time */
    unsigned batches;              /* counted by turn_enter, not yet left */
};

static struct turn_dev turns[VGPU_MAX_DEVICES];
static pthread_once_t turns_once = PTHREAD_ONCE_INIT;

static void turns_init(void)
{
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        pthread_mutex_init(&turns[i].lock, NULL);
        pthread_condattr_t attr;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        pthread_cond_init(&turns[i].cond, &attr);
        pthread_condattr_destroy(&attr);
    }
}

/* VGPU_ARBITER_DIR/<uuid>; standalone without it, /tmp/vgpud-<uid>.arbiter-<uuid>
 * (next to the default usage block); vGPU mode without it: none. */
static struct vgpu_arbiter *find_arbiter(int index)
{
    const char *uuid = devmap_uuid(index);
    if (uuid[0] == '(' || strchr(uuid, '/') != NULL)
        return NULL; /* not a name we know the GPU by */
    char path[512];
    if (vgpu.env.arbiter_dir != NULL)
        snprintf(path, sizeof(path), "%s/%s", vgpu.env.arbiter_dir, uuid);
    else if (vgpu.mode == VGPU_MODE_STANDALONE)
        snprintf(path, sizeof(path), "/tmp/vgpud-%u.arbiter-%s", (unsigned)getuid(), uuid);
    else
        return NULL;
    struct vgpu_arbiter *a = NULL;
    if (blocks_map_arbiter(path, &a) != 0) {
        log_warn("%s; batches on GPU %s are not arbitrated", vgpu_error(), uuid);
        return NULL;
    }
    return a;
}

static uint64_t now_ns(void)
{
    return pacer_monotonic.now(NULL);
}

/* Holding, and free to open another batch: not held past TURN_HOLD_NS while
 * others queue (unless draining took too long). Lock held. */
static bool may_keep(const struct turn_dev *t, uint64_t now, uint64_t drain_deadline)
{
    return now - t->held_since < TURN_HOLD_NS || !arbiter_contended(t->arbiter, t->ticket) ||
           (drain_deadline != 0 && now >= drain_deadline);
}

static void pass_on(struct turn_dev *t, uint64_t now)
{
    arbiter_release(t->arbiter, t->ticket, now);
    t->holding = false;
    t->linger_until = 0;
}

struct vgpu_arbiter *turn_arbiter(int index)
{
    struct turn_dev *t = &turns[index];
    /* Lock-free once looked: the unpaced launch path asks at every launch. */
    if (atomic_load_explicit(&t->looked, memory_order_acquire))
        return t->arbiter;
    pthread_once(&turns_once, turns_init);
    pthread_mutex_lock(&t->lock);
    if (!atomic_load_explicit(&t->looked, memory_order_relaxed)) {
        t->arbiter = find_arbiter(index);
        atomic_store_explicit(&t->looked, true, memory_order_release);
    }
    pthread_mutex_unlock(&t->lock);
    return t->arbiter;
}

void turn_pacing(int index, uint64_t wait_ns)
{
    struct vgpu_arbiter *a = turn_arbiter(index);
    if (a != NULL)
        arbiter_mark_paced(a, now_ns() + wait_ns + TURN_PACED_FRESH_NS, TURN_PACED_FRESH_NS / 2);
}

bool turn_wanted(int index)
{
    struct vgpu_arbiter *a = turn_arbiter(index);
    return a != NULL && arbiter_paced(a, &pacer_monotonic);
}

bool turn_enter(int index)
{
    struct turn_dev *t = &turns[index];
    if (turn_arbiter(index) == NULL)
        return false;
    pthread_mutex_lock(&t->lock);
    uint64_t drain_deadline = 0;
    for (;;) {
        if (t->holding && !arbiter_holds(t->arbiter, t->ticket))
            t->holding = false; /* skipped: our lease lapsed */
        if (t->holding) {
            uint64_t now = now_ns();
            if (may_keep(t, now, drain_deadline)) {
                t->batches++;
                t->linger_until = 0;
                arbiter_renew(t->arbiter, now);
                break;
            }
            if (t->batches == 0) {
                pass_on(t, now); /* nothing of ours on the GPU: yield at once */
                continue;
            }
            /* Others queue and we had our turn: let our batches drain (the
             * monitor passes the turn on), then queue behind them. */
            if (drain_deadline == 0)
                drain_deadline = now + TURN_DRAIN_NS;
            struct timespec until = {.tv_sec = (time_t)(drain_deadline / 1000000000ull),
                                     .tv_nsec = (long)(drain_deadline % 1000000000ull)};
            pthread_cond_timedwait(&t->cond, &t->lock, &until);
            continue;
        }
        if (t->queueing) {
            pthread_cond_wait(&t->cond, &t->lock);
            continue;
        }
        t->queueing = true;
        pthread_mutex_unlock(&t->lock);
        uint32_t ticket = arbiter_acquire(t->arbiter, &pacer_monotonic);
        pthread_mutex_lock(&t->lock);
        t->queueing = false;
        t->holding = true;
        t->ticket = ticket;
        t->held_since = now_ns();
        drain_deadline = 0;
        pthread_cond_broadcast(&t->cond);
    }
    pthread_mutex_unlock(&t->lock);
    return true;
}

void turn_leave(int index, bool linger)
{
    struct turn_dev *t = &turns[index];
    pthread_mutex_lock(&t->lock);
    if (t->batches > 0)
        t->batches--;
    if (t->batches == 0 && t->holding) {
        uint64_t now = now_ns();
        /* A turn that had its time while others queue is passed on now:
         * lingering would only make them wait longer. */
        if (linger && may_keep(t, now, 0))
            t->linger_until = now + TURN_LINGER_NS;
        else
            pass_on(t, now);
    }
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
}

uint64_t turn_expire(uint64_t now)
{
    uint64_t earliest = 0;
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        struct turn_dev *t = &turns[i];
        /* Unlocked peek: most devices never linger. */
        if (atomic_load_explicit(&t->linger_until, memory_order_relaxed) == 0)
            continue;
        pthread_mutex_lock(&t->lock);
        if (t->holding && t->batches == 0 && t->linger_until != 0) {
            if (now >= t->linger_until)
                pass_on(t, now);
            else if (earliest == 0 || t->linger_until < earliest)
                earliest = t->linger_until;
        }
        pthread_mutex_unlock(&t->lock);
    }
    return earliest;
}

void turn_exit(void)
{
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        struct turn_dev *t = &turns[i];
        if (!atomic_load_explicit(&t->looked, memory_order_acquire))
            continue;
        pthread_mutex_lock(&t->lock);
        if (t->holding)
            pass_on(t, now_ns());
        pthread_mutex_unlock(&t->lock);
    }
}

void turn_reset(void)
{
    /* Only the forking thread survives: locks are made anew, and what the
     * parent held is the parent's. The arbiter mappings are inherited. */
    pthread_once(&turns_once, turns_init);
    turns_init();
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        turns[i].holding = turns[i].queueing = false;
        turns[i].batches = 0;
        turns[i].linger_until = 0;
    }
}
