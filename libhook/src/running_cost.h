/*
 * running_cost.h - GPU time per launch as the monitor learns it from
 * measured batches: a running average over ~8 samples, which adapts
 * within a few ms of work, and for a stream's gated cost a jump to a
 * sample far over it (gputime.h, GT_COST_JUMP).
 */
#ifndef VGPU_RUNNING_COST_H
#define VGPU_RUNNING_COST_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/*
 * A sample over GT_COST_JUMP times the average is taken whole: the kernels
 * grew (a decoder that starts a long prefill), and the batches priced at
 * the old cost, measured only every GT_SHARED_FRESH_NS, use that much more
 * than they are charged until it catches up. Simulated kernels that grew
 * twentyfold beside a tenant at 60 (measured every 100 ms) left it 17-23 %
 * of the device in the next 200 ms and its share after; averaged in,
 * 25-32 % and then 36-49 %.
 */
#define GT_COST_JUMP 2u

/* Average `sample` in (the first sample is taken as it is; never 0). */
static inline void running_cost_in(_Atomic uint64_t *avg, uint64_t sample)
{
    uint64_t seen = atomic_load_explicit(avg, memory_order_relaxed);
    seen = seen == 0 ? sample : seen - seen / 8 + sample / 8;
    atomic_store_explicit(avg, seen > 0 ? seen : 1, memory_order_relaxed);
}

/* ... or take it whole if it is over GT_COST_JUMP times the average. */
static inline void running_cost_in_or_jump(_Atomic uint64_t *avg, uint64_t sample)
{
    if (sample / GT_COST_JUMP > atomic_load_explicit(avg, memory_order_relaxed))
        atomic_store_explicit(avg, sample, memory_order_relaxed);
    else
        running_cost_in(avg, sample);
}

/*
 * A batch that ran without the turn beside another tenant spans its own
 * kernels and maybe the other's slices: at least its GPU time. Within
 * 1/GT_COST_PROOF_DIV over its launches at the known cost, it proves that
 * cost has not grown past that margin (gputime.h, "renewed on spans").
 */
#define GT_COST_PROOF_DIV 4u

static inline bool running_cost_proven(uint64_t cost, uint64_t span, uint32_t launches)
{
    if (cost == 0 || launches == 0)
        return false;
    uint64_t at_cost = cost * launches;
    return span <= at_cost + at_cost / GT_COST_PROOF_DIV;
}

/*
 * May a stale cost be renewed at `now` on the last proof (made at
 * `proven_at`, 0 if none), after `renewals` renewals in a row? Only on a
 * proof at most `max_age_ns` old (one made on another thread's later clock
 * reading is young), and fewer than `max_renewals` times in a row.
 */
static inline bool running_cost_renewable(uint64_t proven_at, uint64_t now, uint32_t renewals,
                                          uint64_t max_age_ns, uint32_t max_renewals)
{
    return proven_at != 0 && now <= proven_at + max_age_ns && renewals < max_renewals;
}

/*
 * How long a measure of a stream's gated cost stays fresh, for a mean of
 * `mean_ns` (gputime.h, GT_SHARED_FRESH_NS): `draw` spread evenly over
 * (0, 2 x mean_ns]. At a fixed age, a workload whose large and small
 * kernels alternate with a period near it would be measured in the same
 * phase every time, and priced at the small ones for good; drawn, the
 * next measure may come at any moment, and no period lines up with it.
 */
static inline uint64_t running_cost_fresh_ns(uint64_t mean_ns, uint64_t draw)
{
    return 1 + draw % (2 * mean_ns);
}

#endif
