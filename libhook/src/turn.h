/*
 * turn.h - this process's side of the GPU turn (arbiter.h): per device, the
 * ticket it holds, and the batches it has on the device. A process takes the
 * turn before it opens a batch, keeps it while it keeps the device busy (up
 * to TURN_HOLD_NS when others queue), and passes it on when its last batch
 * there has been measured. Without an arbiter block every call is a no-op.
 */
#ifndef VGPU_TURN_H
#define VGPU_TURN_H

#include <stdbool.h>
#include <stdint.h>

/* How long a process keeps the turn while others queue: a hand-off idles
 * the GPU for two wake-ups, measured at ~0.75 ms on an H200 VM (4 ms holds
 * lost 11-19 % of the GPU with 2 ms kernels there, 16 ms holds 5-6 %); the
 * price is that a waiter may wait this long plus a batch. Overridable at
 * build time (CPPFLAGS=-DTURN_HOLD_NS=...) for benchmarks/coloc_pacer.sh. */
#ifndef TURN_HOLD_NS
#define TURN_HOLD_NS 16000000ull
#endif
/* How long a holder that must yield waits for its batches to drain before
 * it opens one anyway (a batch only its own thread can close). */
#define TURN_DRAIN_NS 20000000ull

/* A holder whose batches have all been measured keeps the turn this long,
 * for its next launch (a program that synchronises between steps), before
 * the monitor passes it on: a hand-off costs the GPU a wake-up or two. */
#define TURN_LINGER_NS 500000ull

/* Before opening a batch on device `index`: wait for the turn, and count the
 * batch. False when the device has no arbiter (then no turn_leave). */
bool turn_enter(int index);

/* A batch counted by turn_enter has been measured (or dropped). `linger`:
 * the process may launch again at once (its bucket is not in debt), so the
 * turn may wait TURN_LINGER_NS for it; else it is passed on now. */
void turn_leave(int index, bool linger);

/* Pass on the turns that lingered past their time; returns the earliest
 * deadline of those still lingering, 0 if none. The monitor thread calls it
 * whenever it wakes and sleeps no longer than that deadline. */
uint64_t turn_expire(uint64_t now);

/* The process exits: pass on the turns it holds (its batches have been
 * flushed), so that the others do not wait out its lease. */
void turn_exit(void);

/* In a forked child: the parent's turns are not ours. */
void turn_reset(void);

#endif
