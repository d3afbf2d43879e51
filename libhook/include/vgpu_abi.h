/*
 * vgpu_abi.h - the shared-memory contract between libvgpu.so and vgpud.
 *
 * Two files per vGPU live in /run/vgpud/<id>/:
 *   control  written only by the daemon, mapped read-only by the hook.
 *            Limits, compute shares and the throttle table.
 *   usage    written by the hook (atomics only), read and repaired by the
 *            daemon. Per-device budget counters and per-process slots.
 *
 * No file is shared by two vGPUs. The GPU turn (docs/compute.md, "Taking
 * turns") is split so that the daemon is the only writer another vGPU reads:
 * a vGPU's processes queue among themselves on `struct vgpu_turn` in their
 * own usage block and ask for the GPU there (`request`); the daemon's broker
 * reads every vGPU's request on the GPU and grants the turn to one vGPU at a
 * time through that vGPU's control block (`turn_grant`, `turn_until_ns`),
 * with the GPU's pacing stamp (`paced_until_ns`) and its own heartbeat
 * (`turn_beat_ns`). A tenant that scribbles on its usage block confuses only
 * its own processes; the broker reads a request as one word and bounds it.
 *
 * Standalone mode (no control block mounted) uses only a usage block; its
 * limits come from the environment and its steering area is written by the
 * daemon when it adopts the process. Its processes take turns on a file of
 * their own user (struct vgpu_arbiter: 0600, refused unless the caller owns
 * it), with no broker: standalone processes of other users do not take
 * turns with them.
 *
 * Rules that keep this safe across processes that may die at any instant:
 *  - every field another process reads while it changes is a C11 atomic, or
 *    is covered by a seqlock (writer bumps seq to odd, writes, bumps to even);
 *  - there are no locks: a SIGKILLed process can leave nothing held;
 *  - both sides check magic, version and size before trusting a block.
 *
 * vgpud/vgpus/abi.py mirrors this layout; tests/unit/test_abi_layout.py has gcc
 * compile a program that prints every offset and size from this header and
 * checks that abi.py agrees.
 */
#ifndef VGPU_ABI_H
#define VGPU_ABI_H

#include <stdatomic.h>
#include <stdint.h>

#define VGPU_CONTROL_MAGIC 0x544e4f4355504756ULL /* "VGPUCONT" little-endian */
#define VGPU_USAGE_MAGIC   0x4741535555504756ULL /* "VGPUUSAG" little-endian */
#define VGPU_ARBITER_MAGIC 0x4942524155504756ULL /* "VGPUARBI" little-endian */
#define VGPU_ABI_VERSION   2u /* 2: the GPU turn moved into the blocks */

#define VGPU_MAX_DEVICES 16
#define VGPU_MAX_PROCS   256
#define VGPU_UUID_LEN    96  /* "GPU-xxxxxxxx-xxxx-..." NUL-terminated */
#define VGPU_ID_LEN      64  /* vGPU id, NUL-terminated */

/* One part per million: shares and quotas are fractions of GPU time. */
#define VGPU_PPM_FULL 1000000u

/* vgpu_control.flags */
#define VGPU_FLAG_OVERSUBSCRIBE 0x1u /* serve what the device cannot hold from host memory */

/* vgpu_control_device.flags */
#define VGPU_DEV_SOFT 0x1u /* soft share: may use idle time, yields on demand */
/* The daemon calibrates this device's quota by NVML's device figure (the
 * vGPU is alone on the GPU, its launches small: docs/compute.md), so the
 * hook may charge estimates where it would otherwise gate every batch. */
#define VGPU_DEV_CALIBRATED 0x2u

struct vgpu_block_header {
    uint64_t magic;
    uint32_t version;
    uint32_t size; /* sizeof the whole block */
};

/*
 * The throttle entry: what the pacer obeys. Written by the daemon's
 * controller about every 100 ms under the seqlock `seq`.
 *   quota_ppm   share of the device's time this vGPU may use now
 *               (VGPU_PPM_FULL = no pacing at all).
 *   window_ns   the accounting window the quota applies to; 0 = hook default.
 *   epoch       bumped on every change the daemon makes, so the hook can
 *               tell a live change from a repeated write.
 * Fail static: if the heartbeat stops, the hook keeps the last quota.
 */
struct vgpu_throttle {
    _Atomic uint32_t seq;
    uint32_t quota_ppm;
    uint64_t window_ns;
    uint64_t epoch;
};

struct vgpu_control_device {
    char uuid[VGPU_UUID_LEN];         /* physical GPU this entry slices */
    _Atomic uint64_t mem_limit;       /* bytes; live-updatable */
    _Atomic uint32_t share_ppm;       /* configured compute share */
    _Atomic uint32_t flags;           /* VGPU_DEV_* */
    _Atomic uint32_t weight;          /* soft shares divide spare time by weight */
    uint32_t reserved0;
    struct vgpu_throttle throttle;
    /*
     * The GPU's turn, granted by the daemon's broker (vgpu_broker.c) to one
     * vGPU of the GPU at a time. turn_grant is a futex word: 0 = not this
     * vGPU's turn; otherwise the grant's id (>= 2, unique on the GPU for
     * the broker's life), which the holder echoes in vgpu_turn.request
     * while it works. turn_until_ns: 0 = nobody else waits, keep it while
     * busy; else open no batch after it (a holder still busy well after
     * it loses the turn). paced_until_ns: until then another vGPU on this
     * GPU paces (its quota is below 100 %), so every hooked process takes
     * turns, paced or not.
     */
    _Atomic uint32_t turn_grant;
    uint32_t reserved1;
    _Atomic uint64_t turn_until_ns;
    _Atomic uint64_t paced_until_ns;
};

struct vgpu_control {
    struct vgpu_block_header hdr;
    char vgpu_id[VGPU_ID_LEN];
    uint32_t device_count;            /* entries used in devices[] */
    _Atomic uint32_t flags;           /* VGPU_FLAG_* */
    _Atomic uint64_t heartbeat_ns;    /* daemon's CLOCK_MONOTONIC at last tick */
    _Atomic uint64_t turn_beat_ns;    /* the broker's CLOCK_MONOTONIC at its last look */
    uint64_t reserved[5];
    struct vgpu_control_device devices[VGPU_MAX_DEVICES];
    /*
     * Host PID of the process in usage slot i, 0 if unknown. The daemon maps
     * slots to host processes; the hook uses this to show NVML process lists
     * (which carry host PIDs) filtered to its own vGPU, from inside a PID
     * namespace where host PIDs cannot otherwise be known.
     */
    _Atomic int32_t slot_host_pid[VGPU_MAX_PROCS];
};

/* vgpu_proc_slot.state */
enum vgpu_slot_state {
    VGPU_SLOT_FREE = 0,
    VGPU_SLOT_CLAIMING = 1,   /* a process is filling the slot in */
    VGPU_SLOT_ACTIVE = 2,
    VGPU_SLOT_RECLAIMING = 3, /* someone is returning a dead process's bytes */
};

/*
 * Per-process, per-device counters. `used` is the bytes this process holds
 * against the budget (allocations plus context/module overhead, which is
 * also broken out in `overhead`).
 */
struct vgpu_proc_device {
    _Atomic uint64_t used;
    _Atomic uint64_t overhead;
    _Atomic uint64_t gpu_time_ns;   /* GPU time the hook measured for this process */
    _Atomic uint64_t launches;
    _Atomic uint64_t throttled_ns;  /* time launches waited in the pacer */
};

/*
 * A process's slot. Identity is (pidns, pid, start_time): the inode of the
 * process's PID namespace (stat of /proc/self/ns/pid), its pid as it sees
 * itself in that namespace, and start_time from /proc/self/stat field 22
 * (clock ticks since boot, the same in every namespace). PID reuse can
 * neither steal nor free another process's bytes, and a process only judges
 * the liveness of slots from its own PID namespace; the daemon, which sees
 * every namespace, maps the rest through /proc/<pid>/ns/pid and NSpid.
 */
struct vgpu_proc_slot {
    _Atomic uint32_t state;         /* enum vgpu_slot_state */
    _Atomic int32_t pid;
    _Atomic uint64_t pidns;
    _Atomic uint64_t start_time;
    _Atomic uint64_t heartbeat_ns;  /* CLOCK_MONOTONIC of the process's last activity */
    struct vgpu_proc_device dev[VGPU_MAX_DEVICES];
};

/*
 * Steering for standalone processes the daemon adopted: the daemon writes a
 * quota here under `seq`; the hook obeys min(its env limit, this quota) while
 * heartbeat_ns is fresh. The block is writable by the container, so this can
 * only ever lower what the environment already allows.
 */
struct vgpu_steer {
    struct vgpu_throttle throttle[VGPU_MAX_DEVICES];
    _Atomic uint64_t heartbeat_ns;
    uint64_t reserved[3];
};

/*
 * The processes of one vGPU (or of one standalone user) on one GPU taking
 * turns among themselves: a FIFO ticket lock with a lease, no lock a dead
 * process can hold (libhook/src/arbiter.c):
 *   take     t = next++; the turn is t's when serving == t;
 *   hold     the holder pushes lease_ns forward as it opens batches (to
 *            the batch's expected end, when that is further: never back);
 *   pass     lease_ns = a hand-off grace, then serving = t + 1 (each by
 *            CAS from what the passer saw);
 *            waiters sleep on `serving` (futex, shared mapping, timed);
 *   skip     anyone may CAS serving s -> s + 1 once lease_ns has passed.
 * paced_until_ns: a process here paces until then (it pushes it forward).
 * request (vGPU mode, read by the broker): 0 = no process here wants the
 * GPU; the grant id from turn_grant = the holder works under that grant;
 * any other value = wants the GPU. Written by the tenant: the broker takes
 * it for nothing but this vGPU's wish.
 * overrun_ms (vGPU mode, read by the broker): how long past its time
 * (turn_until_ns) the batches the holder opened under its grant may still
 * run; 0 when it takes a grant up and when it lets it go. The broker holds
 * back its force-revoke that long, capped (TURN_BATCH_CAP_NS) and only for
 * a holder with turn credit left (libhook/atomics/vgpu_broker.c).
 */
struct vgpu_turn {
    _Atomic uint32_t next;
    _Atomic uint32_t serving;
    _Atomic uint64_t lease_ns;
    _Atomic uint64_t paced_until_ns;
    _Atomic uint32_t request;
    _Atomic uint32_t overrun_ms;
};

/* vgpu_turn.request: wants the GPU, holds no grant (grants are >= 2). */
#define VGPU_TURN_WANT 1u

/* The vGPU-wide budget of one device. */
struct vgpu_usage_device {
    _Atomic uint64_t used;          /* bytes reserved by all processes: never > limit */
    _Atomic uint64_t peak;
    _Atomic uint64_t oom_count;     /* allocations refused for the limit */
    _Atomic uint64_t gpu_time_ns;   /* sum over processes, survives their exit */
    _Atomic uint64_t launches;
    _Atomic uint64_t throttled_ns;
    _Atomic uint64_t mem_limit;     /* standalone only: the limit the env set */
    _Atomic uint32_t share_ppm;     /* standalone only: the compute limit the env set */
    uint32_t reserved0;
    /*
     * The vGPU's shared pacer bucket on this device (all its processes draw
     * from it): balance of GPU time in ns, refilled at the quota rate by
     * whoever advances pacer_stamp_ns (CAS), debited by measured GPU time.
     */
    _Atomic int64_t pacer_balance_ns;
    _Atomic uint64_t pacer_stamp_ns;
    struct vgpu_turn turn;          /* this vGPU's processes on this GPU */
};

struct vgpu_usage {
    struct vgpu_block_header hdr;
    _Atomic uint32_t device_count;  /* standalone: devices the env limited */
    _Atomic uint32_t flags;         /* standalone: VGPU_FLAG_* from the env */
    char uuids[VGPU_MAX_DEVICES][VGPU_UUID_LEN]; /* standalone: devices by index */
    struct vgpu_steer steer;
    struct vgpu_usage_device devices[VGPU_MAX_DEVICES];
    struct vgpu_proc_slot slots[VGPU_MAX_PROCS];
};

/*
 * Standalone processes' turn on one GPU: /tmp/vgpud-<uid>.arbiter-<uuid>
 * (or VGPU_ARBITER_DIR/<uuid>), created 0600 by the first hook and refused
 * unless owned by the caller, so only one user's processes ever share it.
 */
struct vgpu_arbiter {
    struct vgpu_block_header hdr;
    struct vgpu_turn turn;
    uint64_t reserved[2];
};

#define VGPU_ABI_ASSERT(cond) _Static_assert(cond, #cond)
VGPU_ABI_ASSERT(sizeof(struct vgpu_block_header) == 16);
VGPU_ABI_ASSERT(sizeof(struct vgpu_throttle) == 24);
VGPU_ABI_ASSERT(sizeof(struct vgpu_control_device) == 168);
VGPU_ABI_ASSERT(sizeof(struct vgpu_turn) == 32);
VGPU_ABI_ASSERT(sizeof(struct vgpu_proc_device) == 40);
VGPU_ABI_ASSERT(sizeof(struct vgpu_proc_slot) == 32 + 40 * VGPU_MAX_DEVICES);
VGPU_ABI_ASSERT(sizeof(struct vgpu_usage_device) == 112);
VGPU_ABI_ASSERT(sizeof(struct vgpu_control) < 4096);
VGPU_ABI_ASSERT(sizeof(struct vgpu_arbiter) == 64);
VGPU_ABI_ASSERT(sizeof(_Atomic uint64_t) == 8);

#endif
