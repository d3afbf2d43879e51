/*
 * sim_state.h - the simulated machine that every process using one state
 * file shares: configuration, per-process device memory, the engine's
 * timelines and executed intervals, NVML's lost flags and Xid events.
 *
 * The state is a MAP_SHARED file (VGPU_SIM_STATE). Processes may die at
 * any instant, SIGKILL included, so nothing in it is guarded by a lock:
 * every field another process reads while it changes is a C11 atomic, and
 * a dead process's memory is recognised by its key (pid + start time) and
 * reclaimed by whoever next needs the number.
 *
 * This is a test double for libcuda.so.1 / libnvidia-ml.so.1; see
 * docs/simulator.md.
 */
#ifndef VGPU_SIM_STATE_H
#define VGPU_SIM_STATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Internal to the simulator libraries: only the driver API is exported. */
#pragma GCC visibility push(hidden)

#define SIM_STATE_MAGIC 0x4554415453554d49ULL /* "IMUSTATE" little-endian */
#define SIM_STATE_VERSION 3u

#define SIM_MAX_DEVICES 16
#define SIM_MAX_PROCS 1024
#define SIM_RING_SIZE 65536u /* executed intervals kept per device (power of two) */
#define SIM_XID_RING 64u     /* Xid events kept per device (power of two) */
#define SIM_NAME_LEN 96
#define SIM_UUID_LEN 96

/* The machine, fixed by the process that creates the state file. */
struct sim_config {
    uint32_t devices;
    uint32_t sms;
    uint64_t memory;       /* bytes per device */
    uint64_t ctx_overhead; /* bytes charged per context */
    uint64_t module_bytes; /* bytes charged per loaded module */
    uint64_t kernel_ns;    /* duration of a kernel the sim does not know */
    /* NVML's utilization also counts this much of the front end's time
     * before each kernel that finds the device idle (a real GPU's counts
     * each launch's 1-2 us: docs/simulator.md); the engine and events do
     * not see it. */
    uint64_t nvml_launch_ns;
    uint32_t mig_mask;     /* bit i: device i reports MIG mode */
    uint32_t lost_mask;    /* bit i: device i starts GPU-lost */
    char name[SIM_NAME_LEN];
    char uuids[SIM_MAX_DEVICES][SIM_UUID_LEN];
};

/*
 * One stretch of device time used by one process. Entry n of the ring is
 * published with seq = 2n + 2 (odd while being written), so a reader can
 * tell a torn or recycled entry. `end` may still grow after publication:
 * a process extends its own entry when its next kernel follows directly.
 */
struct sim_interval {
    _Atomic uint64_t seq;
    _Atomic uint64_t start; /* CLOCK_MONOTONIC ns */
    _Atomic uint64_t end;
    _Atomic uint32_t pid;   /* as seen in its PID namespace */
    _Atomic uint32_t pidns; /* that namespace's inode (they fit in 32 bits) */
};

struct sim_xid {
    _Atomic uint64_t seq; /* 2n + 2 once event n is published */
    _Atomic uint64_t code;
};

struct sim_device {
    /* The engine: the device runs one kernel at a time, FIFO; this is when
     * the last kernel queued so far ends. Advanced by CAS only. */
    _Atomic uint64_t busy_until;
    _Atomic uint64_t ring_head; /* intervals ever recorded */
    _Atomic uint32_t lost;      /* NVML answers GPU_IS_LOST */
    _Atomic uint32_t xid_head;  /* Xid events ever posted */
    struct sim_xid xids[SIM_XID_RING];
    struct sim_interval ring[SIM_RING_SIZE];
};

/* key of a process slot: 0 = free, SIM_KEY_REAPING while a dead owner's
 * usage is being cleared, else sim_proc_key(pid, start time). */
#define SIM_KEY_REAPING UINT64_MAX

struct sim_proc {
    _Atomic uint64_t key;
    _Atomic uint64_t pidns; /* the owner's PID namespace inode; 0 while being claimed */
    _Atomic uint64_t used[SIM_MAX_DEVICES]; /* device bytes charged to the process */
};

struct sim_state {
    _Atomic uint64_t magic; /* stored last by the creator: the state is ready */
    uint32_t version;
    uint32_t reserved;
    uint64_t size;
    struct sim_config config;
    _Atomic uint32_t proc_high;   /* slots [0, proc_high) have been claimed at least once */
    _Atomic uint32_t event_count; /* futex word: bumped on every Xid, on any device */
    struct sim_proc procs[SIM_MAX_PROCS];
    struct sim_device devices[SIM_MAX_DEVICES];
};

/* The process's mapping of the state named by VGPU_SIM_STATE, created on
 * first use; NULL (and one line on stderr) if the config or file is bad. */
struct sim_state *sim_state_get(void);

/* Parse VGPU_SIM_* into cfg; -1 with a one-line message on stderr. */
int sim_config_from_env(struct sim_config *cfg);

/* Parse "123", "4k", "8g", ... (binary multiples); -1 if not a size. */
int sim_parse_size(const char *text, uint64_t *out);

/* Parse a comma list of device indices below `devices` into a bit mask. */
int sim_parse_index_list(const char *text, uint32_t devices, uint32_t *mask);

/* ---- processes and device memory (sim_proc.c) ---- */

uint64_t sim_proc_key(int pid, uint64_t start_time);
/* The key of a running process, 0 if it does not exist. */
uint64_t sim_proc_key_of(int pid);
/* Field 22 of /proc/<pid>/stat; 0 if the process does not exist or is a zombie. */
uint64_t sim_proc_start_time(int pid);
int sim_proc_key_pid(uint64_t key);
/* The inode of the caller's PID namespace. */
uint64_t sim_self_pidns(void);
/* A process known by its pid inside PID namespace `pidns`, as the caller
 * sees it: its pid in the caller's namespace, 0 if no such process is
 * visible to a caller that would see it (it is gone), -1 if the caller
 * cannot tell (a namespace it cannot look into). The host (initial
 * namespace) sees every process, as the kernel driver does: NVML called
 * there answers with host pids for processes in containers. */
int sim_pid_seen(uint64_t pidns, int pid);
/* The calling process's slot, claimed on first use; NULL if all are taken. */
struct sim_proc *sim_proc_self(struct sim_state *st);

/* Charge bytes to slot on dev if the device has room: 0, or -1 (full). */
int sim_mem_charge(struct sim_state *st, struct sim_proc *slot, unsigned dev, uint64_t bytes);
void sim_mem_uncharge(struct sim_proc *slot, unsigned dev, uint64_t bytes);
/* Bytes in use on dev by live processes; reclaims dead processes' slots. */
uint64_t sim_mem_device_used(struct sim_state *st, unsigned dev);

struct sim_proc_usage {
    int pid;
    uint64_t used;
};
/* Live processes holding memory on dev; returns how many there are (may
 * exceed cap: only cap are written). */
size_t sim_mem_processes(struct sim_state *st, unsigned dev, struct sim_proc_usage *out, size_t cap);

/* ---- live slot owners as one caller remembers them (sim_owners.c) ---- */

#define SIM_OWNER_UNKNOWN (-2)
/* From now on, remember the owners found alive (NVML's side, at init). */
void sim_owners_watch(void);
/* Take in which remembered owners ended (at the start of each query). */
void sim_owners_update(void);
/* Slot `index` holding `key` in `pidns`: its owner's pid as the caller sees
 * it, 0 if it ended, SIM_OWNER_UNKNOWN if nothing is remembered. */
int sim_owners_lookup(size_t index, uint64_t key, uint64_t pidns);
/* Remember slot `index`'s owner, just found alive as `pid` with `start_time`. */
void sim_owners_remember(size_t index, uint64_t key, uint64_t pidns, int pid, uint64_t start_time);

/* ---- the engine (sim_engine.c) ---- */

uint64_t sim_now(void); /* CLOCK_MONOTONIC ns */
void sim_sleep_until(uint64_t t);

/* A process's memory of its latest interval on a device, so back-to-back
 * kernels share one ring entry. Owned by one thread at a time. */
struct sim_engine_cursor {
    uint64_t index; /* ring index + 1; 0 = none */
    uint64_t end;
};

/* Queue `duration` ns of work for pid on dev, starting no earlier than
 * `earliest`; returns its end time. */
uint64_t sim_engine_run(struct sim_state *st, unsigned dev, int pid, uint64_t earliest,
                        uint64_t duration, struct sim_engine_cursor *cursor);

struct sim_pid_busy {
    int pid;
    uint64_t busy_ns;
};
/* Device time used in [from, to): per pid into out (up to cap entries;
 * returns the number of pids) and in total into *total. */
size_t sim_engine_usage(struct sim_state *st, unsigned dev, uint64_t from, uint64_t to,
                        struct sim_pid_busy *out, size_t cap, uint64_t *total);

/* ---- Xid events (sim_events.c) ---- */

void sim_xid_post(struct sim_state *st, unsigned dev, uint64_t code);
/* Next Xid on dev after *seen (an event count); false if none. */
bool sim_xid_next(struct sim_state *st, unsigned dev, uint32_t *seen, uint64_t *code);
/* Sleep until an Xid may have been posted after `count` or until deadline. */
void sim_xid_wait(struct sim_state *st, uint32_t count, uint64_t deadline);

#pragma GCC visibility pop

#endif
