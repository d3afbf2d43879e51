/*
 * turn.c - this process's side of the GPU turn (see turn.h, arbiter.h,
 * grant.h).
 *
 * Per device: an in-process mutex and condition (threads of one process
 * share its turn: one of them queues for it, the others wait for that one),
 * the local ticket held (among the vGPU's, or the standalone user's,
 * processes), the broker's grant held (vGPU mode: between vGPUs), and the
 * number of batches counted on the device. The monitor thread calls
 * turn_leave as it measures each batch, so the turn is passed on as soon as
 * the process's last batch on the GPU has completed.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "arbiter.h"
#include "grant.h"
#include "turn.h"
#include "vgpu.h"

struct turn_dev {
    pthread_mutex_t lock;
    pthread_cond_t cond;           /* the turn came or went, a batch was measured */
    _Atomic bool looked;           /* the turn was looked for (set once, under lock) */
    struct vgpu_turn *local;       /* NULL: no turns on this device */
    struct grant_dev grant;        /* vGPU mode; grant.control NULL standalone */
    _Atomic uint64_t *stamp;       /* where turn_wanted looks */
    _Atomic uint64_t own_stamp;    /* what turn_pacing last wrote in local's stamp */
    bool stamp_ours;               /* a standalone arbiter's stamp: we clear it when stale */
    bool holding;
    bool queueing;                 /* one of our threads sleeps in arbiter/grant_acquire */
    uint32_t ticket;
    uint32_t grant_id;             /* 0: no grant held (standalone, or no broker at work) */
    uint64_t held_since;
    uint64_t busy_until;           /* a long batch of ours may run until then (turn_cover) */
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

/* Standalone: VGPU_ARBITER_DIR/<uuid>, else /tmp/vgpud-<uid>.arbiter-<uuid>
 * (next to the default usage block), owned by this user alone. */
static struct vgpu_turn *standalone_turn(int index)
{
    const char *uuid = devmap_uuid(index);
    if (uuid[0] == '(' || strchr(uuid, '/') != NULL)
        return NULL; /* not a name we know the GPU by */
    char path[512];
    if (vgpu.env.arbiter_dir != NULL)
        snprintf(path, sizeof(path), "%s/%s", vgpu.env.arbiter_dir, uuid);
    else
        snprintf(path, sizeof(path), "/tmp/vgpud-%u.arbiter-%s", (unsigned)getuid(), uuid);
    struct vgpu_arbiter *a = NULL;
    if (blocks_map_arbiter(path, &a) != 0) {
        log_warn("%s; batches on GPU %s are not arbitrated", vgpu_error(), uuid);
        return NULL;
    }
    return &a->turn;
}

/* vGPU mode: the vGPU's own turn in its usage block, the broker's grant
 * and the GPU's pacing stamp in its control block. Standalone: its file. */
static void find_turn(struct turn_dev *t, int index)
{
    if (vgpu.mode == VGPU_MODE_VGPU) {
        if (index >= (int)vgpu.control->device_count)
            return;
        const struct vgpu_control_device *cd = &vgpu.control->devices[index];
        t->local = &vgpu.usage->devices[index].turn;
        t->grant = (struct grant_dev){cd, &vgpu.control->turn_beat_ns, t->local};
        /* Read-only mapping: never written through (stamp_ours false). */
        t->stamp = (_Atomic uint64_t *)&cd->paced_until_ns;
        t->stamp_ours = false;
    } else if (vgpu.mode == VGPU_MODE_STANDALONE) {
        t->local = standalone_turn(index);
        if (t->local != NULL) {
            t->stamp = &t->local->paced_until_ns;
            t->stamp_ours = true;
        }
    }
}

static uint64_t now_ns(void)
{
    return pacer_monotonic.now(NULL);
}

/* Holding, and free to open another batch: not held past TURN_HOLD_NS while
 * the vGPU's other processes queue, nor past the broker's time while other
 * vGPUs wait (unless draining took too long). Lock held. */
static bool may_keep(const struct turn_dev *t, uint64_t now, uint64_t drain_deadline)
{
    if (drain_deadline != 0 && now >= drain_deadline)
        return true;
    if (t->grant_id != 0 && grant_expired(&t->grant, now))
        return false;
    return now - t->held_since < TURN_HOLD_NS || !arbiter_contended(t->local, t->ticket);
}

/* Is the grant this process works under still good? Standalone there is
 * none to lose; with no broker (id 0) the answer is no once one beats
 * again, so that the process queues for a real grant. */
static bool grant_good(const struct turn_dev *t, uint64_t now)
{
    if (t->grant.control == NULL)
        return true;
    if (t->grant_id == 0)
        return !grant_broker_live(&t->grant, now);
    return grant_holds(&t->grant, t->grant_id);
}

static void pass_on(struct turn_dev *t, uint64_t now)
{
    /* The vGPU's request is the local holder's to change: a process whose
     * local turn was skipped meanwhile leaves it to the new holder. */
    if (t->grant.control != NULL && arbiter_holds(t->local, t->ticket))
        grant_release(&t->grant, arbiter_contended(t->local, t->ticket));
    arbiter_release(t->local, t->ticket, now);
    t->holding = false;
    t->busy_until = 0;
    t->linger_until = 0;
}

bool turn_available(int index)
{
    struct turn_dev *t = &turns[index];
    /* Lock-free once looked: the unpaced launch path asks at every launch. */
    if (atomic_load_explicit(&t->looked, memory_order_acquire))
        return t->local != NULL;
    pthread_once(&turns_once, turns_init);
    pthread_mutex_lock(&t->lock);
    if (!atomic_load_explicit(&t->looked, memory_order_relaxed)) {
        find_turn(t, index);
        atomic_store_explicit(&t->looked, true, memory_order_release);
    }
    pthread_mutex_unlock(&t->lock);
    return t->local != NULL;
}

void turn_pacing(int index, uint64_t wait_ns)
{
    struct turn_dev *t = &turns[index];
    if (!turn_available(index))
        return;
    uint64_t wrote = arbiter_mark_paced(t->local, now_ns() + wait_ns + TURN_PACED_FRESH_NS,
                                        TURN_PACED_FRESH_NS / 2);
    if (wrote != 0)
        atomic_store_explicit(&t->own_stamp, wrote, memory_order_relaxed);
}

void turn_not_pacing(int index)
{
    struct turn_dev *t = &turns[index];
    if (!turn_available(index))
        return;
    uint64_t mine = atomic_load_explicit(&t->own_stamp, memory_order_relaxed);
    /* A load first: this runs at every turnless batch, and a CAS that
     * fails still takes the shared line from the GPU's other processes. */
    if (mine != 0 && atomic_load_explicit(&t->local->paced_until_ns, memory_order_relaxed) == mine)
        arbiter_unmark_paced(t->local, mine);
}

bool turn_wanted(int index)
{
    struct turn_dev *t = &turns[index];
    return turn_available(index) && arbiter_paced(t->stamp, t->stamp_ours, &pacer_monotonic);
}

bool turn_enter(int index)
{
    struct turn_dev *t = &turns[index];
    if (!turn_available(index))
        return false;
    pthread_mutex_lock(&t->lock);
    uint64_t drain_deadline = 0;
    for (;;) {
        if (t->holding) {
            uint64_t now = now_ns();
            if (!arbiter_holds(t->local, t->ticket) || !grant_good(t, now)) {
                /* Skipped (our lease lapsed), or the broker took the GPU
                 * back: queue again, behind the others. */
                pass_on(t, now);
                continue;
            }
            if (may_keep(t, now, drain_deadline)) {
                t->batches++;
                t->linger_until = 0;
                arbiter_renew(t->local, now);
                break;
            }
            if (t->batches == 0) {
                pass_on(t, now); /* nothing of ours on the GPU: yield at once */
                continue;
            }
            /* Others queue and we had our turn: let our batches drain (the
             * monitor passes the turn on), then queue behind them. A long
             * batch of ours is waited for, not run beside (turn_cover). */
            if (drain_deadline == 0)
                drain_deadline = t->busy_until > now + TURN_DRAIN_NS ? t->busy_until
                                                                     : now + TURN_DRAIN_NS;
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
        uint32_t ticket = arbiter_acquire(t->local, &pacer_monotonic);
        uint32_t id = 0;
        if (t->grant.control != NULL)
            id = grant_acquire(&t->grant, &pacer_monotonic);
        pthread_mutex_lock(&t->lock);
        t->queueing = false;
        t->holding = true;
        t->ticket = ticket;
        t->grant_id = id;
        t->held_since = now_ns();
        drain_deadline = 0;
        pthread_cond_broadcast(&t->cond);
    }
    pthread_mutex_unlock(&t->lock);
    return true;
}

/* How long a batch expected to run `cost_ns` may keep the turn: twice its
 * cost, at most the cap (TURN_COST_UNKNOWN: the cap). */
static uint64_t cover_ns(uint64_t cost_ns)
{
    if (cost_ns >= TURN_BATCH_CAP_NS / 2)
        return TURN_BATCH_CAP_NS;
    return 2 * cost_ns;
}

void turn_cover(int index, uint64_t cost_ns)
{
    struct turn_dev *t = &turns[index];
    uint64_t cover = cover_ns(cost_ns);
    /* Most batches: turn_enter's renewal covers them, and the broker's
     * grace their drain. Nothing to write. */
    if (cover <= TURN_DRAIN_NS)
        return;
    pthread_mutex_lock(&t->lock);
    /* Skipped meanwhile (a lease that lapsed): the turn_enter of our next
     * batch queues again; nothing here is ours to push. */
    if (t->holding && arbiter_holds(t->local, t->ticket)) {
        uint64_t now = now_ns(), end = now + cover;
        arbiter_extend(t->local, end);
        if (end > t->busy_until)
            t->busy_until = end;
        if (t->grant_id != 0)
            grant_overrun(&t->grant, end, now);
    }
    pthread_mutex_unlock(&t->lock);
}

bool turn_contended(int index)
{
    struct turn_dev *t = &turns[index];
    if (!turn_available(index))
        return false;
    pthread_mutex_lock(&t->lock);
    bool others = t->holding && (arbiter_contended(t->local, t->ticket) ||
                                 (t->grant.control != NULL && grant_others_wait(&t->grant)));
    pthread_mutex_unlock(&t->lock);
    return others;
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
        turn_not_pacing(i); /* nor make them take turns for us any longer */
    }
}

void turn_reset(void)
{
    /* Only the forking thread survives: locks are made anew, and what the
     * parent held is the parent's. The block mappings are inherited. */
    pthread_once(&turns_once, turns_init);
    turns_init();
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        turns[i].holding = turns[i].queueing = false;
        turns[i].batches = 0;
        turns[i].busy_until = 0;
        turns[i].linger_until = 0;
        turns[i].own_stamp = 0; /* the parent's */
    }
}
