/*
 * grant.h - a vGPU's side of the GPU turn between vGPUs. The daemon's
 * broker (libhook/atomics/vgpu_broker.c) grants the GPU to one vGPU at a
 * time through each vGPU's control block (read-only here); the vGPU's
 * process that holds its local turn (arbiter.h) asks for it, and says when
 * it works under the grant, in vgpu_turn.request of its own usage block.
 *
 * Fail safe: the broker beats in the control block (turn_beat_ns); a
 * process that waits for a grant while the beat is stale stops waiting and
 * runs unarbitrated between vGPUs: its event pairs then also span other
 * vGPUs' work, which over-counts and throttles it more, never less.
 * Pure logic over the blocks and an injectable clock
 * (libhook/tests/test_grant.c).
 */
#ifndef VGPU_GRANT_H
#define VGPU_GRANT_H

#include <stdbool.h>
#include <stdint.h>

#include "pacer.h"
#include "vgpu_abi.h"

/* The broker beats every 50 ms, or every 250 ms while nothing goes on at
 * its GPUs (vgpu_broker.c); a beat older than this means no broker
 * (daemon stopped, or the vGPU's control block is no daemon's). */
#define GRANT_BROKER_STALE_NS 1000000000ull
/* Longest single sleep for a grant: the beat is looked at this often. */
#define GRANT_WAIT_SLICE_NS 5000000ull

struct grant_dev {
    const struct vgpu_control_device *control; /* turn_grant, turn_until_ns */
    const _Atomic uint64_t *beat;              /* the control block's turn_beat_ns */
    struct vgpu_turn *turn;                    /* the vGPU's own: request, and the local lease */
};

/* Is a broker at work (a fresh beat)? */
bool grant_broker_live(const struct grant_dev *g, uint64_t now);

/*
 * The caller holds the vGPU's local turn: ask for the GPU and sleep until
 * it is granted (renewing the local lease meanwhile, so that the vGPU's
 * other processes do not skip a holder that only waits). Returns the grant
 * id, or 0 when no broker is at work: go on unarbitrated.
 */
uint32_t grant_acquire(const struct grant_dev *g, const struct pacer_clock *clock);

/* Is grant `id` still this vGPU's? (False once the broker took it back.) */
bool grant_holds(const struct grant_dev *g, uint32_t id);

/* Other vGPUs wait and this one's time is up: open no more batches. */
bool grant_expired(const struct grant_dev *g, uint64_t now);

/* Do other vGPUs wait for the GPU (the broker set a time to the grant)? */
bool grant_others_wait(const struct grant_dev *g);

/* The vGPU stops working under its grant; `want`: another of its processes
 * queues for the GPU next. */
void grant_release(const struct grant_dev *g, bool want);

/* The holder's batches may run until `end` (its clock; `now` is): tell the
 * broker how far past its time that is (vgpu_turn.overrun_ms, which only
 * grows under one grant), so that it does not take the grant back by force
 * while a batch opened within that time still runs. */
void grant_overrun(const struct grant_dev *g, uint64_t end, uint64_t now);

#endif
