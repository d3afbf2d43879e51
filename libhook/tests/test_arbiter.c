/*
 * test_arbiter.c - the tenant-local GPU turn: FIFO order, hand-off, and
 * recovery from a holder or a waiter that died (a lease that lapses), on a
 * turn in plain memory shared by threads (the futex works alike within one
 * process); and the pacing stamp that tells unpaced processes to take turns
 * too.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "../src/arbiter.c"
#include "../src/pacer.c"

#include "check.h"

/* The real clock, shifted: a test jumps past a lease without waiting it out
 * (atomic: a waiting thread reads it while the test moves it). */
static _Atomic uint64_t skew_ns;
static uint64_t skewed_now(void *ctx)
{
    (void)ctx;
    return pacer_monotonic.now(NULL) + skew_ns;
}
/* Waits are the real futex wait (pacer_monotonic's). */
static void real_wait(void *ctx, const _Atomic uint32_t *word, uint32_t seen, uint64_t ns)
{
    pacer_monotonic.wait(ctx, word, seen, ns);
}
static const struct pacer_clock clock_ = {skewed_now, real_wait, NULL};

/* A clock that counts its reads: the unpaced fast path must read none
 * while no stamp is there. */
static unsigned clock_reads;
static uint64_t counted_now(void *ctx)
{
    clock_reads++;
    return skewed_now(ctx);
}
static const struct pacer_clock counted = {counted_now, real_wait, NULL};

static struct vgpu_turn arb;

static void reset(void)
{
    memset(&arb, 0, sizeof(arb));
    skew_ns = 0;
}

/* Bounded wait for another thread to reach a state (no bare sleeps). */
static bool await_next(uint32_t n)
{
    for (int i = 0; i < 5000; i++) {
        if (atomic_load(&arb.next) == n)
            return true;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return false;
}

struct waiter {
    pthread_t th;
    _Atomic bool got;
    uint32_t ticket;
};

static void *wait_turn(void *arg)
{
    struct waiter *w = arg;
    w->ticket = arbiter_acquire(&arb, &clock_);
    atomic_store(&w->got, true);
    return NULL;
}

static void test_uncontended_turns_come_at_once(void)
{
    reset();
    uint32_t t = arbiter_acquire(&arb, &clock_);
    CHECK(t == 0 && arbiter_holds(&arb, t) && !arbiter_contended(&arb, t));
    arbiter_release(&arb, t, clock_.now(NULL));
    CHECK(!arbiter_holds(&arb, t));
    uint32_t again = arbiter_acquire(&arb, &clock_);
    CHECK(again == 1 && arbiter_holds(&arb, again));
}

static void test_waiters_are_served_in_order(void)
{
    reset();
    uint32_t first = arbiter_acquire(&arb, &clock_);
    struct waiter b = {0}, c = {0};
    pthread_create(&b.th, NULL, wait_turn, &b);
    CHECK(await_next(2));
    pthread_create(&c.th, NULL, wait_turn, &c);
    CHECK(await_next(3));
    CHECK(arbiter_contended(&arb, first));
    CHECK(!atomic_load(&b.got) && !atomic_load(&c.got));
    arbiter_release(&arb, first, clock_.now(NULL));
    pthread_join(b.th, NULL);
    CHECK(b.ticket == 1 && arbiter_holds(&arb, 1));
    CHECK(!atomic_load(&c.got)); /* still b's turn */
    arbiter_release(&arb, b.ticket, clock_.now(NULL));
    pthread_join(c.th, NULL);
    CHECK(c.ticket == 2);
}

static void test_a_dead_holder_is_skipped_after_its_lease(void)
{
    reset();
    uint32_t dead = arbiter_acquire(&arb, &clock_); /* never released */
    skew_ns = ARBITER_LEASE_NS + 1;
    uint32_t t = arbiter_acquire(&arb, &clock_);
    CHECK(t == dead + 1 && arbiter_holds(&arb, t));
    CHECK(!arbiter_holds(&arb, dead)); /* the holder sees it lost the turn */
    /* Its late release cannot take the turn from the new holder. */
    arbiter_release(&arb, dead, clock_.now(NULL));
    CHECK(arbiter_holds(&arb, t));
}

static void test_a_dead_waiter_costs_one_handoff(void)
{
    reset();
    uint32_t holder = arbiter_acquire(&arb, &clock_);
    atomic_fetch_add(&arb.next, 1); /* a waiter took ticket 1, then died */
    struct waiter w = {0};
    pthread_create(&w.th, NULL, wait_turn, &w);
    CHECK(await_next(3));
    arbiter_release(&arb, holder, clock_.now(NULL)); /* serving 1: nobody claims it */
    pthread_join(w.th, NULL);                      /* within ARBITER_HANDOFF_NS */
    CHECK(w.ticket == 2 && arbiter_holds(&arb, 2));
}

/* A holder whose batch runs longer than the lease (a 300 ms graph) pushed
 * its lease to the batch's expected end when it opened it: a waiter does not
 * skip it once ARBITER_LEASE_NS has passed (both batches would then run at
 * once, each measuring the other's), only once that end has; and renewing
 * for a short batch of the same holder does not cut the lease back. */
static void test_a_long_batch_keeps_its_lease(void)
{
    reset();
    uint32_t holder = arbiter_acquire(&arb, &clock_);
    uint64_t now = clock_.now(NULL), end = now + 3 * ARBITER_LEASE_NS;
    arbiter_extend(&arb, end);
    arbiter_renew(&arb, now);
    CHECK(atomic_load(&arb.lease_ns) == end);
    skew_ns = ARBITER_LEASE_NS + 1; /* past what a renewal alone covers */
    struct waiter w = {0};
    pthread_create(&w.th, NULL, wait_turn, &w);
    CHECK(await_next(holder + 2));
    struct timespec slices = {0, 4 * ARBITER_WAIT_SLICE_NS}; /* it looked again meanwhile */
    nanosleep(&slices, NULL);
    CHECK(!atomic_load(&w.got) && arbiter_holds(&arb, holder));
    skew_ns = 3 * ARBITER_LEASE_NS + 1; /* past the batch's end: the holder died in it */
    pthread_join(w.th, NULL);
    CHECK(w.ticket == holder + 1 && arbiter_holds(&arb, w.ticket));
}

/* A holder that was skipped (stopped for a while, or its batch outran the
 * lease) releases late: that moves nothing, neither the turn nor the new
 * holder's lease, which covers the new holder's own long batch. (Before,
 * the late release reset the lease to a hand-off grace, and the new
 * holder was skipped in turn 20 ms later, mid-batch.) */
static void test_a_late_release_leaves_the_new_holder_alone(void)
{
    reset();
    uint32_t old = arbiter_acquire(&arb, &clock_);
    skew_ns = ARBITER_LEASE_NS + 1;
    uint32_t t = arbiter_acquire(&arb, &clock_);
    CHECK(t == old + 1);
    uint64_t now = clock_.now(NULL), end = now + 5 * ARBITER_LEASE_NS;
    arbiter_extend(&arb, end);
    arbiter_release(&arb, old, now);
    CHECK(arbiter_holds(&arb, t));
    CHECK(atomic_load(&arb.lease_ns) == end);
    arbiter_release(&arb, t, now); /* its own release does pass it on */
    CHECK(!arbiter_holds(&arb, t) && atomic_load(&arb.lease_ns) == now + ARBITER_HANDOFF_NS);
}

static void test_the_pacing_stamp_only_moves_forward_and_rarely(void)
{
    reset();
    const uint64_t slack = 100;
    arbiter_mark_paced(&arb, 10000, slack);
    CHECK(atomic_load(&arb.paced_until_ns) == 10000);
    /* Within the slack: not rewritten (the shared line stays quiet). */
    arbiter_mark_paced(&arb, 10000 + slack, slack);
    CHECK(atomic_load(&arb.paced_until_ns) == 10000);
    arbiter_mark_paced(&arb, 10000 + slack + 1, slack);
    CHECK(atomic_load(&arb.paced_until_ns) == 10000 + slack + 1);
    /* A pacer that wants turns for less time never shortens another's. */
    CHECK(arbiter_mark_paced(&arb, 500, slack) == 0);
    CHECK(atomic_load(&arb.paced_until_ns) == 10000 + slack + 1);
}

/* A process that stops pacing takes its own stamp back, never one another
 * process wrote since; that one's next batch stamps again. */
static void test_a_pacer_takes_back_only_its_own_stamp(void)
{
    reset();
    const uint64_t slack = 100;
    uint64_t mine = arbiter_mark_paced(&arb, 10000, slack);
    CHECK(mine == 10000);
    uint64_t theirs = arbiter_mark_paced(&arb, 20000, slack);
    arbiter_unmark_paced(&arb, mine);
    CHECK(atomic_load(&arb.paced_until_ns) == 20000);
    arbiter_unmark_paced(&arb, theirs);
    CHECK(atomic_load(&arb.paced_until_ns) == 0);
    CHECK(arbiter_mark_paced(&arb, 19000, slack) == 19000);
    arbiter_unmark_paced(&arb, 0); /* nothing of ours: nothing taken */
    CHECK(atomic_load(&arb.paced_until_ns) == 19000);
}

static void test_unpaced_processes_take_turns_only_while_the_stamp_is_fresh(void)
{
    reset();
    clock_reads = 0;
    CHECK(!arbiter_paced(&arb.paced_until_ns, true, &counted));
    CHECK(clock_reads == 0); /* never stamped: one load, no clock */

    uint64_t now = counted.now(NULL);
    arbiter_mark_paced(&arb, now + 1000000000ull, 0);
    CHECK(arbiter_paced(&arb.paced_until_ns, true, &counted));

    /* The pacer stopped: once the stamp is past, unpaced processes are back
     * on their fast path, and the first to see it clears it so that the
     * others read no clock either. */
    skew_ns = 1000000000ull;
    CHECK(!arbiter_paced(&arb.paced_until_ns, true, &counted));
    CHECK(atomic_load(&arb.paced_until_ns) == 0);
    clock_reads = 0;
    CHECK(!arbiter_paced(&arb.paced_until_ns, true, &counted));
    CHECK(clock_reads == 0);
}

/* The broker's stamp (read-only in the control block) is only read: the
 * broker clears it, a hook never writes there. */
static void test_a_stamp_that_is_not_ours_is_never_written(void)
{
    reset();
    _Atomic uint64_t stamp = counted.now(NULL) - 1;
    CHECK(!arbiter_paced(&stamp, false, &counted));
    CHECK(atomic_load(&stamp) != 0);
}

int main(void)
{
    test_uncontended_turns_come_at_once();
    test_waiters_are_served_in_order();
    test_a_dead_holder_is_skipped_after_its_lease();
    test_a_dead_waiter_costs_one_handoff();
    test_a_long_batch_keeps_its_lease();
    test_a_late_release_leaves_the_new_holder_alone();
    test_the_pacing_stamp_only_moves_forward_and_rarely();
    test_a_pacer_takes_back_only_its_own_stamp();
    test_unpaced_processes_take_turns_only_while_the_stamp_is_fresh();
    test_a_stamp_that_is_not_ours_is_never_written();
    return check_report("test_arbiter");
}
