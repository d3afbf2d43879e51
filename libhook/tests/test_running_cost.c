/*
 * test_running_cost.c - the GPU time per launch the monitor learns: an
 * average that follows noise slowly, and a stream's gated cost that jumps
 * at once to kernels that grew, so that batches priced at it between two
 * measures are not under-charged for eight of them; what a batch's span
 * beside another tenant proves of that cost, and for how long.
 */
#include "../src/draw.h"
#include "../src/running_cost.h"

#include "check.h"

#define US 1000ull
#define MS 1000000ull

static void test_the_first_sample_is_taken_and_noise_moves_it_an_eighth(void)
{
    _Atomic uint64_t cost = 0;
    running_cost_in(&cost, 8 * US);
    CHECK(atomic_load(&cost) == 8 * US);
    running_cost_in(&cost, 16 * US); /* twice: still averaged */
    CHECK(atomic_load(&cost) == 9 * US);
    running_cost_in(&cost, 0);
    CHECKF(atomic_load(&cost) > 0, "a cost of 0 would read as none measured");
}

static void test_a_gated_cost_jumps_to_kernels_that_grew(void)
{
    _Atomic uint64_t cost = 0;
    running_cost_in_or_jump(&cost, 7 * US); /* decode-sized */
    running_cost_in_or_jump(&cost, 100 * US); /* a prefill's kernels */
    CHECKF(atomic_load(&cost) == 100 * US, "got %llu ns", (unsigned long long)atomic_load(&cost));
}

static void test_a_gated_cost_is_averaged_within_the_jump_and_falls_slowly(void)
{
    _Atomic uint64_t cost = 0;
    running_cost_in_or_jump(&cost, 8 * US);
    running_cost_in_or_jump(&cost, 16 * US); /* twice the cost: noise, not growth */
    CHECK(atomic_load(&cost) == 9 * US);
    running_cost_in_or_jump(&cost, 1 * US); /* kernels that shrank: an eighth a sample */
    CHECKF(atomic_load(&cost) > 7 * US, "got %llu ns", (unsigned long long)atomic_load(&cost));
}

static void test_the_next_measure_may_come_at_any_moment(void)
{
    /* Seeds as the monitor draws them: a clock, ~1 ms apart. */
    uint64_t n = 20000, soon = 0, sum = 0, most = 0, least = UINT64_MAX;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t fresh = running_cost_fresh_ns(400 * MS, draw_mix(1000 * MS + i * 1000003ull));
        soon += fresh < 10 * MS;
        sum += fresh;
        most = fresh > most ? fresh : most;
        least = fresh < least ? fresh : least;
    }
    CHECKF(least > 0 && most <= 800 * MS, "drawn from %llu to %llu ns", (unsigned long long)least,
           (unsigned long long)most);
    /* No safe window after a measure: about one in eighty within 10 ms. */
    CHECKF(soon > n / 120 && soon < n / 50, "%llu of %llu within 10 ms", (unsigned long long)soon,
           (unsigned long long)n);
    CHECKF(sum / n > 380 * MS && sum / n < 420 * MS, "mean %llu ns", (unsigned long long)(sum / n));
}

static void test_a_span_proves_a_cost_only_within_its_margin(void)
{
    /* 40 launches at 10 us: a span of 400 us is its own kernels alone. */
    CHECK(running_cost_proven(10 * US, 400 * US, 40));
    CHECK(running_cost_proven(10 * US, 500 * US, 40)); /* a quarter over: noise, or a neighbour */
    CHECKF(!running_cost_proven(10 * US, 501 * US, 40),
           "kernels that grew by more than a quarter must be measured with the turn");
    CHECKF(!running_cost_proven(10 * US, 6 * MS, 40), "a prefill's kernels proved a decode's cost");
    CHECK(!running_cost_proven(0, 400 * US, 40)); /* no cost known yet: nothing to prove */
    CHECK(!running_cost_proven(10 * US, 0, 0)); /* a batch with no launch proves nothing */
}

static void test_a_stale_cost_is_renewed_only_on_a_young_proof_and_not_for_ever(void)
{
    uint64_t at = 5000 * MS; /* the monitor's clock when a span proved the cost */
    CHECK(running_cost_renewable(at, at + 10 * MS, 0, 10 * MS, 8));
    CHECKF(!running_cost_renewable(at, at + 11 * MS, 0, 10 * MS, 8),
           "a proof older than its age says nothing of kernels that grew since");
    CHECK(!running_cost_renewable(0, at, 0, 10 * MS, 8)); /* no proof yet */
    CHECKF(running_cost_renewable(at, at - 1 * US, 0, 10 * MS, 8),
           "a proof stamped a little after the launcher's clock read is young, not ancient");
    CHECK(running_cost_renewable(at, at, 7, 10 * MS, 8));
    CHECKF(!running_cost_renewable(at, at, 8, 10 * MS, 8),
           "after eight renewals in a row the cost is measured with the turn again");
}

int main(void)
{
    test_the_first_sample_is_taken_and_noise_moves_it_an_eighth();
    test_a_gated_cost_jumps_to_kernels_that_grew();
    test_a_gated_cost_is_averaged_within_the_jump_and_falls_slowly();
    test_the_next_measure_may_come_at_any_moment();
    test_a_span_proves_a_cost_only_within_its_margin();
    test_a_stale_cost_is_renewed_only_on_a_young_proof_and_not_for_ever();
    return check_report("test_running_cost");
}
