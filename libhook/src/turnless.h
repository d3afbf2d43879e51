/*
 * turnless.h - which paced processes run without the GPU turn.
 *
 * The turn keeps a paced process's event spans to its own work (turn.h),
 * but a launch-bound process (eager inference: a few microseconds of
 * kernels between CPU steps) keeps the GPU idle for most of its turn, and
 * passes the turn at every pause: next to a GPU-bound tenant it then waits
 * out that tenant's hold for each step. Measured on an H100 next to a GEMM
 * tenant at 60, a transformers decoder at 30 did 0.36-0.57 of its native
 * work with turns and 0.63-0.65 without, and the GEMM tenant 61-62 % of
 * its native work with turns against 69-70 % without (70 % alone at 60)
 * (docs/compute.md, "Next to a GPU-bound tenant: no turn while the share
 * does not bind").
 *
 * So a paced process goes without the turn on a device while its share
 * does not bind there and its vGPU keeps the device little busy: no
 * launch of its vGPU waited in the pacer over the last window, and the
 * GPU time it was charged is under TURNLESS_MAX_USE_PPM of the window
 * (under TURNLESS_STAY_MAX_USE_PPM once it goes without the turn, while
 * another paced tenant is on the GPU).
 * Its batches then share the GPU's time-slicing with the turn holder's,
 * which may stretch its own spans (it is charged more, never less) and a
 * little of the holder's. As soon as the pacer must hold one of its
 * launches back, or it uses more, it takes turns again from its next
 * batch, and its spans are exact while its share binds.
 *
 * The same window says when a paced process may gate only a sample of its
 * batches (gputime.h, GT_GATE_SAMPLE): no wait in the pacer, and a use
 * under TURNLESS_SAMPLED_MAX_USE_PPM of its quota. Ungated batches are
 * charged at the sampled batches' cost per launch, which is off by up to
 * a fifth either way (on an H100, against NVML: a decode-shaped chain of
 * matvecs +5 to +7 %; 1M-element adds -6 to -18 %, their kernels cost more
 * one by one than back to back); with that much room the error cannot
 * carry the process past its share, and a process nearer its share is
 * charged from gated batches alone.
 */
#ifndef VGPU_TURNLESS_H
#define VGPU_TURNLESS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "vgpu_abi.h"

/* The window over which use and waits are looked at: several decode steps. */
#define TURNLESS_WINDOW_NS 100000000ull
/* The most GPU time a turnless vGPU may use on the device, of the window:
 * what it adds to a turn holder's spans when their work interleaves
 * (overridable at build time to compare; 0: never turnless). */
#ifndef TURNLESS_MAX_USE_PPM
#define TURNLESS_MAX_USE_PPM 300000u
#endif
/* ... and the most a process already without the turn may use and stay
 * so. A launch-bound process at 30 uses 23-27 % with 100 ms windows above
 * and below the entry bound: on an H200 it flapped between turns and none
 * (57-87 % of its batches without), and each side then waited for the
 * other's turns: a GEMM tenant at 60 beside it did 60.5-63.9 % of its
 * native work, against 70.2-71.3 where the process stayed without the
 * turn (docs/benchmarks/inference-coloc-h200.md, "At night"; 2026-11-28:
 * T's work 0.86 against 0.74, the GEMM's 66.9 against 65.3 over three
 * alternated runs each). Only beside another paced tenant: with the stay
 * bound everywhere, a decode chain at 60 alone (52-56 % busy) read 2-3
 * points lower in two alternated runs, its pacer holding it a fifth as
 * often, and missed its calibrated target. A GPU-bound tenant
 * never enters: it uses more than the entry bound. */
#ifndef TURNLESS_STAY_MAX_USE_PPM
#define TURNLESS_STAY_MAX_USE_PPM 400000u
#endif
/* The most GPU time, of its quota, a process whose gates are sampled may
 * use over the window (overridable at build time, CFLAGS=-D..., to
 * compare). */
#ifndef TURNLESS_SAMPLED_MAX_USE_PPM
#define TURNLESS_SAMPLED_MAX_USE_PPM 750000u
#endif

/* Per device, in the process (zero-initialised: turns are taken until a
 * first whole window qualifies). */
struct turnless {
    _Atomic uint64_t since_ns;  /* the window's start; 0 before the first */
    _Atomic uint64_t gpu_ns;    /* the bucket's gpu_time_ns then */
    _Atomic uint64_t waited_ns; /* the bucket's throttled_ns then */
    _Atomic bool on;            /* the last whole window qualified */
    _Atomic bool roomy;         /* ... for sampled gates */
};

/* Must a paced process take the turn for its next batch on the device?
 * `bucket`: its vGPU's counters there; `balance`: the bucket's balance
 * before the pacer admits the batch (below zero, the pacer will hold it
 * back: the share binds now); `quota_ppm`: its quota there now; `beside`:
 * another paced tenant stamps the GPU (turn_wanted), the only case where
 * the stay bound applies. */
bool turnless_turn_needed(struct turnless *t, const struct vgpu_usage_device *bucket,
                          int64_t balance, uint32_t quota_ppm, bool beside, uint64_t now);

/* May its batches on the device gate only a sample (the last whole window
 * left it room: see above)? */
bool turnless_gates_sampled(const struct turnless *t);

#endif
