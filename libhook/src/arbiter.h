/*
 * arbiter.h - the GPU turn (struct vgpu_arbiter in vgpu_abi.h): a FIFO
 * ticket lock with a lease, shared by every hooked process on one GPU while
 * any of them is paced, so that batches of different processes do not
 * overlap and each process's event pairs measure its own work only.
 * Atomics and a shared futex: no lock that a killed process can hold. The
 * clock is injectable for the unit test (libhook/tests/test_arbiter.c).
 */
#ifndef VGPU_ARBITER_H
#define VGPU_ARBITER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "pacer.h"
#include "vgpu_abi.h"

/* A holder that stops renewing (dead, hung, or one batch longer than this)
 * may be skipped this long after its last renewal. */
#define ARBITER_LEASE_NS 100000000ull
/* A turn just passed on: how long its ticket's owner has to claim it (it
 * is asleep on the futex and wakes in microseconds; a dead waiter's ticket
 * costs the others this once). */
#define ARBITER_HANDOFF_NS 20000000ull
/* Longest single futex sleep: waiters re-check the lease this often. */
#define ARBITER_WAIT_SLICE_NS 5000000ull

/* Take a ticket and sleep until its turn (skipping lapsed turns), reading
 * time and sleeping on `serving` through `clock`; returns the ticket, which
 * now holds the turn. */
uint32_t arbiter_acquire(struct vgpu_arbiter *a, const struct pacer_clock *clock);

/* Is it still `ticket`'s turn? (False once someone skipped it.) */
bool arbiter_holds(const struct vgpu_arbiter *a, uint32_t ticket);

/* Does anyone queue behind `ticket`? */
bool arbiter_contended(const struct vgpu_arbiter *a, uint32_t ticket);

/* The holder is alive and working: push its lease forward. */
void arbiter_renew(struct vgpu_arbiter *a, uint64_t now);

/* Pass the turn on (no-op if it was skipped meanwhile). */
void arbiter_release(struct vgpu_arbiter *a, uint32_t ticket, uint64_t now);

/* A process paces on the GPU and wants turns until `until`: raise
 * paced_until_ns to it, unless it already reaches within `slack` of it (so
 * that the shared line is written once per slack, not at every batch).
 * Never lowers the stamp another process wrote. */
void arbiter_mark_paced(struct vgpu_arbiter *a, uint64_t until, uint64_t slack);

/*
 * Does a process pace on the GPU now (a stamp in the future)? The unpaced
 * launch path asks at every launch, so: one relaxed load, and a clock read
 * only when a stamp is there. A stamp in the past is cleared by CAS (a
 * pacer's newer stamp makes the CAS fail), so that the GPU's unpaced
 * processes go back to reading no clock at all.
 */
static inline bool arbiter_paced(struct vgpu_arbiter *a, const struct pacer_clock *clock)
{
    uint64_t until = atomic_load_explicit(&a->paced_until_ns, memory_order_relaxed);
    if (until == 0)
        return false;
    if (clock->now(clock->ctx) < until)
        return true;
    atomic_compare_exchange_strong_explicit(&a->paced_until_ns, &until, 0, memory_order_relaxed,
                                            memory_order_relaxed);
    return false;
}

#endif
