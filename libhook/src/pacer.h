/*
 * pacer.h - compute pacing: the quota in force and the vGPU's shared token
 * bucket of GPU time. Pure logic over the shared blocks (vgpu_abi.h) and an
 * injectable clock, so it is unit-tested with a fake clock and no driver
 * (libhook/tests/test_pacer.c). What measures GPU time and calls in here is
 * gputime.c; the launch wrappers are launch_hooks.c. docs/compute.md has the
 * design and the reasons behind each constant.
 *
 * The bucket (vgpu_usage_device.pacer_balance_ns / pacer_stamp_ns) is shared
 * by every process of the vGPU on that device:
 *   refill  balance += quota x elapsed, capped at quota x window; whoever
 *           moves pacer_stamp_ns forward (CAS) adds the time it covered;
 *   debit   measured GPU time (and, ahead of it, an estimate of work just
 *           queued, corrected once measured);
 *   admit   new work is queued while balance >= 0; otherwise the thread
 *           sleeps for about -balance / quota (never spins or polls).
 */
#ifndef VGPU_PACER_H
#define VGPU_PACER_H

#include <stdbool.h>
#include <stdint.h>

#include "vgpu_abi.h"

/* Window a quota applies to when the daemon leaves it 0: bounds the burst a
 * vGPU can save up while idle to quota x 100 ms. */
#define PACER_DEFAULT_WINDOW_NS 100000000ull
#define PACER_MAX_WINDOW_NS 10000000000ull
/* A pacer sleep waits on the seq word of the throttle entry the quota came
 * from, and the daemon wakes it whenever it writes a new quota there
 * (vgpu_futex_wake_all), so a live change takes effect at once. Sleeps are
 * still cut into pieces of at most this, for what no write announces: a
 * steering heartbeat going stale hands a standalone process back its own
 * limit without a write. */
#define PACER_MAX_SLEEP_NS 200000000ull
/* Wakes that leave the word as it was (a signal, or anyone who maps it)
 * answered in one sleep; after them the word is looked at every
 * PACER_WATCH_NS, so a wake spammer costs a waiter at most that pace. */
#define PACER_IDLE_WAKES 4
#define PACER_WATCH_NS 1000000ull
/* The longest gap a refill credits (~5 h): elapsed x VGPU_PPM_FULL must fit
 * in 64 bits; a bucket idle longer is full anyway. */
#define PACER_MAX_ELAPSED_NS (UINT64_MAX / VGPU_PPM_FULL)
/* The bucket is refilled in steps of at least this much time. */
#define PACER_REFILL_GRAIN_NS 20000ull
/* The steering area of an adopted standalone process counts while the
 * daemon's heartbeat there is younger than this. */
#define PACER_STEER_FRESH_NS 2000000000ull
/* A vGPU's control block says the daemon lives while its heartbeat is
 * younger than this (the daemon beats every control_interval, 0.1 s by
 * default: 2 s is 20 missed ticks, so a busy daemon is not taken for a
 * dead one). Only soft quotas depend on it (see pacer_quota_now). */
#define PACER_HEARTBEAT_FRESH_NS 2000000000ull

struct pacer_quota {
    uint32_t ppm;       /* VGPU_PPM_FULL: no pacing */
    uint64_t window_ns; /* never 0 */
};

/*
 * Where one device's quota comes from, and this process's memory of it.
 * vGPU mode sets `control`; standalone sets `steer` (may be NULL) and reads
 * the env limit from the bucket's share_ppm.
 */
struct pacer_dev {
    const struct vgpu_control_device *control;
    const _Atomic uint64_t *heartbeat; /* vGPU mode: the daemon's, in the control block */
    struct vgpu_steer *steer;
    const _Atomic uint64_t *steer_heartbeat;
    int index;                       /* device index in the blocks */
    struct vgpu_usage_device *bucket;
    struct vgpu_proc_device *slot;   /* this process's counters; may be NULL */
    /* Fail static: what the last good read said (threads share it). */
    _Atomic uint32_t last_ppm;
    _Atomic uint64_t last_window_ns;
};

struct pacer_clock {
    uint64_t (*now)(void *ctx); /* CLOCK_MONOTONIC ns */
    /* Sleep up to ns, or until *word (if not NULL) moves from `seen` and
     * whoever moved it wakes the sleepers; may return early. */
    void (*wait)(void *ctx, const _Atomic uint32_t *word, uint32_t seen, uint64_t ns);
    void *ctx;
};
extern const struct pacer_clock pacer_monotonic;

/* Set a device up: vGPU mode (control != NULL) or standalone. */
void pacer_dev_init(struct pacer_dev *pd, int index, const struct vgpu_control *control,
                    struct vgpu_usage *usage, struct vgpu_proc_device *slot);

/*
 * One consistent read of a throttle entry (seqlock). 0 on success; -1 when
 * the writer kept it busy for every try (the caller keeps what it had).
 */
int pacer_read_throttle(const struct vgpu_throttle *t, struct pacer_quota *out);

/* The quota in force now (`now`: CLOCK_MONOTONIC ns, or 0 to have the
 * clock read only where the quota depends on it: a soft vGPU's heartbeat,
 * fresh steering); remembered in pd->last_*. Fail static: a stopped daemon leaves the table as it was and
 * we keep obeying it, for hard shares. A soft vGPU's quota may be above its
 * share (idle time the controller lent it) and nobody takes that back while
 * the daemon is gone: with a stale heartbeat a soft vGPU runs at its share,
 * the part of the GPU that is guaranteed to it. */
struct pacer_quota pacer_quota_now(struct pacer_dev *pd, uint64_t now);

/* Does the daemon calibrate this device's quota by NVML (VGPU_DEV_CALIBRATED,
 * vGPU mode only) and still beat? A flag left by a daemon that stopped
 * corrects nothing any more. `now` as for pacer_quota_now. */
bool pacer_calibrated(const struct pacer_dev *pd, uint64_t now);

static inline bool pacer_quota_full(const struct pacer_quota *q)
{
    return q->ppm >= VGPU_PPM_FULL;
}

/* Add the time since the last refill at the quota rate; returns the balance. */
int64_t pacer_refill(struct vgpu_usage_device *b, const struct pacer_quota *q, uint64_t now);

/* Debit (ns > 0) or give back (ns < 0) GPU time. */
void pacer_charge(struct vgpu_usage_device *b, int64_t ns);

/* How long a deficit takes to refill at the quota rate. */
uint64_t pacer_deficit_ns(int64_t balance, uint32_t quota_ppm);

/*
 * Wait, sleeping, until the bucket has a non-negative balance (or the quota
 * is 100 %). Returns the ns waited, already added to the throttled counters.
 */
uint64_t pacer_admit(struct pacer_dev *pd, const struct pacer_clock *clock);

/* Add measured GPU time of `launches` launches to the usage counters. */
void pacer_account(struct pacer_dev *pd, uint64_t gpu_ns, uint64_t launches);

#endif
