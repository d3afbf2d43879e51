/*
 * arbiter.h - the tenant-local part of the GPU turn (struct vgpu_turn in
 * vgpu_abi.h): a FIFO ticket lock with a lease among the processes of one
 * vGPU (in its usage block) or of one standalone user (its own arbiter
 * file), so that their batches do not overlap and each process's event
 * pairs measure its own work only. Between vGPUs the daemon's broker grants
 * the GPU (grant.h). Atomics and a shared futex: no lock that a killed
 * process can hold. The clock is injectable for the unit test
 * (libhook/tests/test_arbiter.c).
 */
#ifndef VGPU_ARBITER_H
#define VGPU_ARBITER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "pacer.h"
#include "vgpu_abi.h"

/* A holder that stops renewing (dead or hung) may be skipped this long
 * after its last renewal; a batch expected to run longer gets a longer
 * lease when it opens (arbiter_extend; turn.c, TURN_BATCH_CAP_NS). */
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
uint32_t arbiter_acquire(struct vgpu_turn *a, const struct pacer_clock *clock);

/* Is it still `ticket`'s turn? (False once someone skipped it.) */
bool arbiter_holds(const struct vgpu_turn *a, uint32_t ticket);

/* Does anyone queue behind `ticket`? */
bool arbiter_contended(const struct vgpu_turn *a, uint32_t ticket);

/* The holder is alive and working: its lease reaches at least
 * ARBITER_LEASE_NS past now (never shortened: a long batch it opened
 * before keeps the lease it was given). */
void arbiter_renew(struct vgpu_turn *a, uint64_t now);

/* The holder's batches may run until `until`: its lease reaches at least
 * that far (never shortened). */
void arbiter_extend(struct vgpu_turn *a, uint64_t until);

/* Pass the turn on (no-op if it was skipped meanwhile: then it leaves the
 * new holder's lease alone too). */
void arbiter_release(struct vgpu_turn *a, uint32_t ticket, uint64_t now);

/* A process paces on the GPU and wants turns until `until`: raise
 * paced_until_ns to it, unless it already reaches within `slack` of it (so
 * that the shared line is written once per slack, not at every batch).
 * Never lowers the stamp another process wrote. Returns the stamp it
 * wrote, 0 if it wrote none. */
uint64_t arbiter_mark_paced(struct vgpu_turn *a, uint64_t until, uint64_t slack);

/* A process stopped taking turns: take back its stamp `mine` (what
 * arbiter_mark_paced last wrote for it), unless another process stamped
 * since. Others that still pace stamp again at their next batch, for the
 * stamp is then below theirs by more than any slack. */
void arbiter_unmark_paced(struct vgpu_turn *a, uint64_t mine);

/*
 * Does a process pace on the GPU now (a stamp in the future)? The unpaced
 * launch path asks at every launch, so: one relaxed load, and a clock read
 * only when a stamp is there. `stamp` is a standalone arbiter's (writable:
 * a stamp in the past is cleared by CAS, which a pacer's newer stamp makes
 * fail, so that the unpaced processes go back to reading no clock at all)
 * or the one the broker publishes in the control block (read-only: the
 * broker clears it; `clear` false).
 */
static inline bool arbiter_paced(_Atomic uint64_t *stamp, bool clear,
                                 const struct pacer_clock *clock)
{
    uint64_t until = atomic_load_explicit(stamp, memory_order_relaxed);
    if (until == 0)
        return false;
    if (clock->now(clock->ctx) < until)
        return true;
    if (clear)
        atomic_compare_exchange_strong_explicit(stamp, &until, 0, memory_order_relaxed,
                                                memory_order_relaxed);
    return false;
}

#endif
