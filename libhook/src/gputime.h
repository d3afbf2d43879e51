/*
 * gputime.h - measuring a process's GPU time with events around batches of
 * launches, and pacing each batch through the shared bucket (pacer.h).
 *
 * Per stream, consecutive launches form a batch: a start event before the
 * first, an end event after the last. A batch closes when it holds about
 * GT_BATCH_NS of work (from the running cost per launch), at a point where
 * the application synchronises with the stream, when the stream goes quiet
 * for GT_QUIET_NS, or before a graph launch (a batch of its own). A monitor
 * thread waits for closed batches in order, debits the measured time and
 * adds it to the usage counters. Opening a batch passes the pacer, which
 * sleeps while the bucket is in debt; at most GT_INFLIGHT batches per stream
 * are queued on the device. Launches captured into a graph are neither
 * measured nor charged: the graph's launches are.
 */
#ifndef VGPU_GPUTIME_H
#define VGPU_GPUTIME_H

#include <stdbool.h>

#include "cuda_api.h"

/* Target GPU time of one batch: events are amortised over ~1 ms of work. */
#define GT_BATCH_NS 1000000ull
#define GT_BATCH_MAX_LAUNCHES 256u
/* Batches queued on a stream's device before the launcher waits. */
#ifndef GT_INFLIGHT /* overridable at build time to compare */
#define GT_INFLIGHT 2u
#endif
/* An open batch with no launch for this long is closed by the monitor. */
#define GT_QUIET_NS 2000000ull

/*
 * Gated batches (docs/compute.md, "Launch-bound work"). When a paced
 * stream's launches come slower than its kernels run, the GPU idles between
 * them and an event pair around the batch would charge those gaps. So a
 * paced stream's batch is queued behind a stream wait on a host word that
 * the hook writes when the batch closes: its kernels then run back to back and the
 * pair spans only them. A gate holds the GPU back while the CPU queues, so
 * gated batches are short: about GT_GATE_BATCH_NS of kernels, within
 * [GT_GATE_MIN_LAUNCHES, GT_GATE_MAX_LAUNCHES] launches (the wait and two
 * events cost the CPU ~2.4 us a batch on an H100). A gated batch the
 * application stops feeding without a sync point we see (a host wait we do
 * not wrap) is opened by the gate watcher after GT_GATE_QUIET_NS, with no
 * driver call (gt_gates.c): a stall that long, never a deadlock.
 */
#ifndef GT_GATE_BATCH_NS /* overridable at build time (CFLAGS=-D...) to compare */
#define GT_GATE_BATCH_NS 100000ull
#endif
#define GT_GATE_MIN_LAUNCHES 8u
#ifndef GT_GATE_MAX_LAUNCHES
#define GT_GATE_MAX_LAUNCHES 64u
#endif
#define GT_GATE_QUIET_NS 200000ull
/* Gated batches queued on a stream's device before the launcher waits:
 * about as much work ahead of the GPU as GT_INFLIGHT ungated batches. */
#define GT_GATE_INFLIGHT 8u
/*
 * A gate costs a launch-bound stream in the driver, at every launch queued
 * behind it: on an H100 an empty-kernel loop paced at 99 % ran at 85-91 %
 * of its native rate gated and 95-98 % ungated
 * (docs/benchmarks/launch-gated-h100.md). Gates keep a turn holder's idle
 * gaps off the GPU's other tenants; with no other paced tenant there they
 * only serve the measure, and while the process's share leaves it room
 * (turnless.h) the measure need not be exact. So then only one batch in
 * GT_GATE_SAMPLE, drawn at random, is gated (gt_gate_skip): it measures
 * the stream's GPU time per launch, and each ungated batch is charged its
 * launches at that cost, or its span if less (a span is all GPU time at
 * most; launch-bound, it also spans the gaps). A stream whose kernels grow
 * is under-charged until its next gated batch (running_cost.h); then its use
 * leaves no room and every batch is gated again.
 */
/*
 * Touched. Another context may hold the GPU when a gated batch opens on a
 * stream with nothing left on it (beside a paced tenant without the
 * turn; beside a process in no vGPU, which takes no turns, even with it),
 * and on an H200 the batch's start event is then stamped when the gate
 * opens, before the other context's time slice ends, wherever the
 * stream's last work was a copy (a decoder reading its token back):
 * beside a GEMM, such a pair around a ~15 us kernel read 432 us at the
 * median and ~2 ms at p90, and a decode chain's shared batches were
 * charged 31-35 us a launch for 7.3. Behind a kernel the start event
 * waits for the context to run: with an empty kernel between the gate
 * and the start event, 15 us, none over 19 (docs/benchmarks/
 * inference-coloc-h200.md, "A start event after a copy"). So such a
 * batch runs the hook's own empty kernel there first (gt_touch.c): the
 * chain at 30 beside a GEMM tenant at 60 was charged ~20 for what it ran
 * (30 before), the GEMM kept its share and the GPU was 93-94 % busy
 * (80-82 before).
 */
#ifndef GT_GATE_SAMPLE
#define GT_GATE_SAMPLE 8u
#endif
/*
 * A paced process that goes without the turn beside another paced tenant
 * (turnless.h) shares the GPU's time-slicing with it, and its event spans
 * take in the other tenant's slices: on an H200 a decode chain at 30
 * beside a GEMM tenant at 60 charged its whole quota for 17-22 points of
 * work, so its pacer held it, it took turns, and the GEMM tenant waited
 * for them (64.9-66.8 % of its native work, 70-72 beside a tenant that
 * stays without the turn). So such a
 * "shared" batch is charged its launches at the stream's gated cost per
 * launch, or its span if less, as an estimated one is: a cost measured
 * apart from the other tenant, by gated batches that held the turn or had
 * the GPU to themselves, fresh for GT_SHARED_FRESH_NS on average (drawn
 * over (0, 2x]: running_cost.h; gt_gated_cost_fresh). Without such a cost,
 * the batch takes the turn and measures one: one wait for the other's hold.
 * Measured on the H200, alternated with the build before, two runs each:
 * the chain charged 21.4 and 20.9 for 20.4 and 20.7 points of work, and
 * the GEMM tenant beside it did 71.2 and 71.3 (docs/compute.md).
 *
 * The cost stands for a shared batch only where the batch's own span
 * proves it (within a quarter, running_cost_proven): a gated span is at
 * least the batch's own GPU time, so a batch that runs longer than its
 * cost says is charged its span, the other tenant's slices in it
 * included. Charged at the cost whatever its span, a simulated tenant at
 * 30 that grew and shrank its kernels in turn, so that each measure found
 * them small, ran 40-44 % of the device and left a paced neighbour at 60
 * with 42-47 (docs/security.md, "Kernels grown on purpose"); with the
 * proof, 20-21 and 58-60. The price: where the other tenant's slices
 * stretch most spans, the process is charged them (on the simulator 27
 * for 9 points of work beside a GPU-bound tenant, against 18-20 for
 * 16-18; on an H200 a decode chain at 30 beside a GEMM tenant did the
 * same work either way but was charged 30 against 19, and the GPU stood
 * idle: 79 % busy against 93, docs/compute.md).
 *
 * The freshness bounds how long kernels that grow run at the old price,
 * and sets how often the process waits out the holder's turn. Fresh for
 * 2 s, a decode chain that switched to 1024-token prefills beside the GEMM
 * tenant left it 42-43 of its 60 points for each 3 s prefill (H200), and
 * a simulated one whose kernels grew twentyfold left its neighbour 0-16 %
 * of the device for seconds. Fresh for 100 ms, the H200's GEMM tenant kept
 * 66.0-67.4 beside the prefills (worst second 60.3-64.5) and lost 1.4-2.6
 * beside the chain and the adds; but on the simulator a neighbour that
 * stamps the GPU for ever and keeps each turn as long as the broker lets
 * it (the holder's time + 50 ms) made each measure wait ~20 ms, and took
 * a launch-bound victim from 19.8 to 12.6-13.3 % of the device. At 400 ms
 * the victim kept 16.0-17.5 and the simulated growth was priced right
 * within a second (its neighbour's worst second after that 59.4-59.9 of
 * 60); on the H200 the GEMM tenant kept 67.0 beside the prefills (worst
 * second 59.2) and did 71.7-71.8 beside the chain and the adds, against
 * 69.0-70.6 at 100 ms. (Letting long waits buy a longer freshness was
 * tried: an honest GPU-bound holder's turns also run to 38-60 ms now and
 * then, and the growth then went unpriced for seconds in one simulated
 * run of ten.)
 */
#ifndef GT_SHARED_FRESH_NS /* -D for a trial build (benchmarks/ab_inference.py --cflags-b) */
#define GT_SHARED_FRESH_NS 400000000ull
#endif
/*
 * Renewed on spans. Each measure with the turn waits out the holder's
 * time, which a hostile holder stretches as far as the broker lets it
 * (its time and the revoke grace: ~100 ms on the simulator). But a shared
 * batch's span, gated, is at least its own GPU time, whatever runs beside
 * it: if one of the stream's, measured within GT_SHARED_PROOF_AGE_NS,
 * kept within a quarter over its launches at the known cost
 * (running_cost_proven), its kernels have not grown past that, and a
 * stale cost is renewed for a new draw without the turn. A neighbour can
 * only widen spans (by running beside them), which sends the stream back
 * to measuring with the turn, as before; kernels that grow stop the
 * proofs, and the last one ages out. At most GT_SHARED_RENEWALS in a
 * row: a cost that creeps up by less than the margin is still measured
 * again every few seconds. The stamping neighbour's victim, simulated,
 * lost 1.0-1.6 of its 19.8 % (3.1-4.1 without the renewal).
 *
 * The proof's age: at 50 ms, on the H200, a cost that went stale just
 * after a decode phase was renewed on the last decode batch's proof, and
 * the prefill that followed ran a draw at the decode price (the GEMM
 * tenant's worst second beside it 50-53 % of its work, 57-63 before);
 * at 10 ms, 59. A launch-bound stream settles a batch every millisecond
 * or so. */
#define GT_SHARED_PROOF_AGE_NS 10000000ull
#define GT_SHARED_RENEWALS 8u

struct gt_stream;

/* A launch in progress: gt_before fills it, gt_after completes it. */
struct gt_launch {
    struct gt_stream *stream;
    bool graph;
};

/*
 * Before a launch on `stream` (`ptsz`: the per-thread-default-stream ABI,
 * where NULL names the per-thread stream; `graph`: a cuGraphLaunch). Passes
 * the pacer. Returns false when the launch goes unmeasured (pass-through,
 * 100 % quota, captured): forward it and do not call gt_after. Returns true
 * with the stream's batch held: forward the launch, then call gt_after.
 */
bool gt_before(struct gt_launch *l, CUstream stream, bool ptsz, bool graph);
void gt_after(struct gt_launch *l, CUresult rc);

/* The application waits for, queries or marks the stream: close its batch
 * first so the end event sits right after the last launch. */
void gt_sync_point(CUstream stream, bool ptsz);

/* The same for every stream of the current context (cuCtxSynchronize, and
 * copies, which the host may wait for behind any of them). */
void gt_ctx_sync_point(void);

/* Stream capture begins on / ends on `stream`; around the real calls. */
void gt_capture_begin(CUstream stream, bool ptsz);
void gt_capture_started(CUresult rc);
/* `was_capturing`: the stream was capturing before the real EndCapture. */
void gt_capture_ended(bool was_capturing);

/* The context is destroyed: its touch kernel with it (gt_touch.c). */
void gt_touch_forget(CUcontext ctx);

/* The stream is about to be destroyed. */
void gt_stream_destroy(CUstream stream);

#endif
