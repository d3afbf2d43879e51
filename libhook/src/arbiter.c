/*
 * arbiter.c - the tenant-local GPU turn: a ticket lock with a lease over a
 * shared block (see arbiter.h and vgpu_abi.h). Waiters sleep on the `serving` word in the
 * clock's wait (pacer.c: FUTEX_WAIT without FUTEX_PRIVATE_FLAG, which works
 * across processes on a MAP_SHARED file mapping); every sleep is bounded so
 * a lapsed lease is noticed without a wake-up from anyone.
 */
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "arbiter.h"

static void futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Move the turn from `from` to the next ticket, if `from` still holds it
 * with the lease `lease`. The hand-off grace goes in first, so that nobody
 * sees the new turn with the old, lapsed lease; and both by CAS from what
 * the caller saw, so that a pass that lost a race (a second waiter skipping
 * the same lapsed turn, or a holder skipped meanwhile releasing late) moves
 * nothing and cannot cut the next holder's lease short. True when the lease
 * was taken (the turn moved on, by this pass or by one it raced with). */
static bool pass(struct vgpu_turn *a, uint32_t from, uint64_t lease, uint64_t now)
{
    if (!atomic_compare_exchange_strong_explicit(&a->lease_ns, &lease, now + ARBITER_HANDOFF_NS,
                                                 memory_order_acq_rel, memory_order_acquire))
        return false;
    if (atomic_compare_exchange_strong_explicit(&a->serving, &from, from + 1,
                                                memory_order_acq_rel, memory_order_acquire))
        futex_wake_all(&a->serving);
    return true;
}

uint32_t arbiter_acquire(struct vgpu_turn *a, const struct pacer_clock *clock)
{
    uint32_t ticket = atomic_fetch_add_explicit(&a->next, 1, memory_order_acq_rel);
    for (;;) {
        /* The lease first: a pass between the two reads leaves us with the
         * new turn and the old lease, which pass() below refuses (its CAS
         * on the lease fails); the other order could give a new turn that
         * lapsed a second hand-off grace. */
        uint64_t lease = atomic_load_explicit(&a->lease_ns, memory_order_acquire);
        uint32_t serving = atomic_load_explicit(&a->serving, memory_order_acquire);
        uint64_t now = clock->now(clock->ctx);
        if (serving == ticket) {
            arbiter_renew(a, now);
            return ticket;
        }
        if ((int32_t)(serving - ticket) > 0) {
            /* We were too slow to claim our turn and were skipped: queue again. */
            ticket = atomic_fetch_add_explicit(&a->next, 1, memory_order_acq_rel);
            continue;
        }
        if (now >= lease) {
            pass(a, serving, lease, now);
            continue;
        }
        uint64_t wait = lease - now;
        /* A wake, a moved word, a signal or the slice's end: look again. */
        clock->wait(clock->ctx, &a->serving, serving,
                    wait < ARBITER_WAIT_SLICE_NS ? wait : ARBITER_WAIT_SLICE_NS);
    }
}

bool arbiter_holds(const struct vgpu_turn *a, uint32_t ticket)
{
    return atomic_load_explicit(&a->serving, memory_order_acquire) == ticket;
}

bool arbiter_contended(const struct vgpu_turn *a, uint32_t ticket)
{
    return atomic_load_explicit(&a->next, memory_order_acquire) != ticket + 1;
}

void arbiter_renew(struct vgpu_turn *a, uint64_t now)
{
    arbiter_extend(a, now + ARBITER_LEASE_NS);
}

void arbiter_extend(struct vgpu_turn *a, uint64_t until)
{
    uint64_t seen = atomic_load_explicit(&a->lease_ns, memory_order_acquire);
    while (seen < until && !atomic_compare_exchange_weak_explicit(&a->lease_ns, &seen, until,
                                                                  memory_order_acq_rel,
                                                                  memory_order_acquire))
        ;
}

void arbiter_release(struct vgpu_turn *a, uint32_t ticket, uint64_t now)
{
    /* Retried while the turn is still ours: a failed CAS on the lease is
     * then a renewal racing with us (a process of ours that was skipped
     * and has not noticed yet), not a pass; giving up would leave the turn
     * with nobody until the lease lapses. */
    for (;;) {
        uint64_t lease = atomic_load_explicit(&a->lease_ns, memory_order_acquire);
        if (!arbiter_holds(a, ticket) || pass(a, ticket, lease, now))
            return;
    }
}

uint64_t arbiter_mark_paced(struct vgpu_turn *a, uint64_t until, uint64_t slack)
{
    uint64_t seen = atomic_load_explicit(&a->paced_until_ns, memory_order_relaxed);
    /* A hint, not a lock: relaxed, and a CAS only so that two pacers never
     * move it back (one of them waits longer than the other). */
    while (seen + slack < until)
        if (atomic_compare_exchange_weak_explicit(&a->paced_until_ns, &seen, until,
                                                  memory_order_relaxed, memory_order_relaxed))
            return until;
    return 0;
}

void arbiter_unmark_paced(struct vgpu_turn *a, uint64_t mine)
{
    if (mine != 0)
        atomic_compare_exchange_strong_explicit(&a->paced_until_ns, &mine, 0,
                                                memory_order_relaxed, memory_order_relaxed);
}
