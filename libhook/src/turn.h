/*
 * turn.h - this process's side of the GPU turn: per device, the local ticket
 * it holds among its vGPU's processes (arbiter.h; a standalone user's
 * processes: their arbiter file), the broker's grant its vGPU holds between
 * vGPUs (grant.h), and the batches it has on the device. A process takes the
 * turn before it opens a batch, keeps it while it keeps the device busy (up
 * to TURN_HOLD_NS when others queue), and passes it on when its last batch
 * there has been measured. Without a turn every call is a no-op.
 *
 * Who takes turns: paced processes (but those whose share does not bind and
 * that use little of the GPU: turnless.h), and they stamp their own turn
 * (turn_pacing; the broker publishes the GPU's stamp to every vGPU on it);
 * unpaced hooked processes only while the stamp they see is fresh
 * (turn_wanted), so that their work does not run inside a paced process's
 * event pairs, and otherwise keep their fast path.
 */
#ifndef VGPU_TURN_H
#define VGPU_TURN_H

#include <stdbool.h>
#include <stdint.h>

/* How long a process keeps the turn while others queue (the broker gives a
 * vGPU the same between vGPUs): a hand-off idles
 * the GPU for two wake-ups (~0.7 ms on an H200 VM), and the share that
 * waits most absorbs that loss. Measured there with the pacer alone
 * (benchmarks/coloc_pacer.sh, docs/compute.md), 20/30/50 with 20 ms kernels
 * got 46.9 / 47.9 / 48.8 for the 50 at 16 / 32 / 48 ms holds, and 30/70 with
 * 2 ms kernels synchronised every kernel 64.0 / 66.1 / 67.1 for the 70. The
 * price is latency: a waiter may wait this long plus a batch per process
 * ahead of it. Overridable at build time (CFLAGS=-DTURN_HOLD_NS=...) to
 * compare. */
#ifndef TURN_HOLD_NS
#define TURN_HOLD_NS 48000000ull
#endif
/* How long a holder that must yield waits for its batches to drain before
 * it opens one anyway (a batch only its own thread can close); longer
 * while a batch it opened is expected to run longer (turn_cover). */
#define TURN_DRAIN_NS 20000000ull

/* A batch longer than the lease (one huge kernel, a graph launch: a
 * training step replayed as a graph) keeps its process's turn, and its
 * vGPU's grant, until it is expected to end: twice its expected cost (a
 * batch of the same stream may be queued ahead of it), and at most this
 * long from its opening. So a process that dies in the middle of such a
 * batch costs the others of its vGPU (or user) at most this long, and the
 * broker lets a holder's batches run at most this long past its time
 * (docs/security.md, "The GPU turn"). Longer batches are still skipped
 * (lease) or taken back (broker) before their end, and overlap the next
 * holder's as before. */
#define TURN_BATCH_CAP_NS 1000000000ull
/* turn_cover: the batch's cost was never measured (its stream's first
 * graph, the process's first kernel on the device): covered to the cap. */
#define TURN_COST_UNKNOWN UINT64_MAX

/* A holder whose batches have all been measured keeps the turn this long,
 * for its next launch (a program that synchronises between steps), before
 * the monitor passes it on: a hand-off costs the GPU a wake-up or two. */
#ifndef TURN_LINGER_NS
#define TURN_LINGER_NS 500000ull
#endif

/* How long a paced process's stamp keeps the unpaced processes on its GPU
 * taking turns. It must outlast the paced process's gaps between batches
 * (its wait for the turn, up to TURN_HOLD_NS + TURN_DRAIN_NS and a batch
 * per process ahead of it: ~0.35 s with five ahead, and short pauses of
 * its own): each lapse sends the unpaced ones back to
 * unmeasured launches whose queue then runs inside the paced one's next
 * batch. And it should not outlast the pacing by much: until it lapses the
 * unpaced processes pay for events and turns although nobody needs them.
 * A stamp is rewritten once half of it is used up: one more write of the
 * arbiter's line per GPU every ~250 ms, not one per batch. */
#define TURN_PACED_FRESH_NS 500000000ull

/* Does device `index` have a turn (vGPU mode: its blocks; standalone: the
 * user's arbiter file, opened or created at the first call)? Looked up once
 * and remembered. */
bool turn_available(int index);

/* This process paces on device `index` and will want the turn within
 * `wait_ns` (what the pacer may hold it back first): stamp its turn so
 * that the device's unpaced processes take turns until TURN_PACED_FRESH_NS
 * past that. */
void turn_pacing(int index, uint64_t wait_ns);

/* This paced process goes without the turn on device `index` (turnless.h):
 * take back its stamp, unless another process stamped since, so that
 * neither the GPU's unpaced processes nor this one (which samples its
 * gates only while nobody else paces: gputime.h) go on acting for a pacer
 * that is not there. Looks at one word when there is nothing to take
 * back. */
void turn_not_pacing(int index);

/* Must an unpaced process take turns on device `index` (a paced process
 * there stamped recently: the broker's stamp in vGPU mode, which is that
 * of the GPU's other vGPUs)? */
bool turn_wanted(int index);

/* Before opening a batch on device `index`: wait for the turn, and count the
 * batch. False when the device has no turn (then no turn_leave). */
bool turn_enter(int index);

/* A batch that holds this process's turn on device `index` (turn_enter
 * counted it) was opened, expected to run `cost_ns`: if that may outlast
 * the lease, push the lease (and, under a grant, the broker's overrun
 * claim) forward to cover it, up to TURN_BATCH_CAP_NS. */
void turn_cover(int index, uint64_t cost_ns);

/* Does anyone wait for the turn this process holds on device `index`:
 * another process of its vGPU (or of its user, standalone), or another
 * vGPU? False when it holds none. */
bool turn_contended(int index);

/* A batch counted by turn_enter has been measured (or dropped). `linger`:
 * the process may launch again at once (its bucket is not in debt), so the
 * turn may wait TURN_LINGER_NS for it; else it is passed on now. */
void turn_leave(int index, bool linger);

/* Pass on the turns that lingered past their time; returns the earliest
 * deadline of those still lingering, 0 if none. The monitor thread calls it
 * whenever it wakes and sleeps no longer than that deadline. */
uint64_t turn_expire(uint64_t now);

/* The process exits: pass on the turns it holds (its batches have been
 * flushed), so that the others do not wait out its lease, and take back
 * its pacing stamps (turn_not_pacing). */
void turn_exit(void);

/* In a forked child: the parent's turns are not ours. */
void turn_reset(void);

#endif
