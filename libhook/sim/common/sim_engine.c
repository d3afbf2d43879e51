/*
 * sim_engine.c - the simulated engine: one FIFO timeline per device.
 *
 * A launch claims [start, start + duration) where start is the latest of
 * now, the caller's earliest (its stream's tail) and the device's
 * busy_until, by CAS on busy_until: lock-free, so a killed process holds
 * nothing. Kernels of different processes therefore interleave at kernel
 * granularity, like a time-sliced GPU with no preemption. Each claimed
 * interval is recorded in the device's ring, with the pid and PID
 * namespace of its process, which NVML reads to answer utilization queries
 * in the pids its caller sees.
 */
#include <errno.h>
#include <time.h>

#include "sim_state.h"

#define RING_MASK (SIM_RING_SIZE - 1u)
/* Entries are recorded in nearly, not strictly, time order (two launchers
 * may record in the opposite order of their CAS): a backward scan stops
 * only after this many consecutive entries that end before the window. */
#define SCAN_SLACK 64

uint64_t sim_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void sim_sleep_until(uint64_t t)
{
    struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ULL), .tv_nsec = (long)(t % 1000000000ULL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static uint64_t published(uint64_t n)
{
    return 2 * n + 2;
}

static void record(struct sim_device *d, int pid, uint64_t start, uint64_t end,
                   struct sim_engine_cursor *cursor)
{
    if (cursor->index != 0 && cursor->end == start) {
        uint64_t n = cursor->index - 1;
        struct sim_interval *e = &d->ring[n & RING_MASK];
        if (atomic_load(&e->seq) == published(n)) {
            atomic_store(&e->end, end);
            cursor->end = end;
            return;
        }
    }
    uint64_t n = atomic_fetch_add(&d->ring_head, 1);
    struct sim_interval *e = &d->ring[n & RING_MASK];
    atomic_store(&e->seq, published(n) - 1);
    atomic_store(&e->start, start);
    atomic_store(&e->end, end);
    static uint64_t pidns;
    if (pidns == 0)
        pidns = sim_self_pidns();
    atomic_store(&e->pid, (uint32_t)pid);
    atomic_store(&e->pidns, (uint32_t)pidns);
    atomic_store(&e->seq, published(n));
    cursor->index = n + 1;
    cursor->end = end;
}

uint64_t sim_engine_run(struct sim_state *st, unsigned dev, int pid, uint64_t earliest,
                        uint64_t duration, struct sim_engine_cursor *cursor)
{
    struct sim_device *d = &st->devices[dev];
    uint64_t now = sim_now();
    if (earliest < now)
        earliest = now;
    uint64_t busy = atomic_load(&d->busy_until);
    uint64_t start, end;
    do {
        start = busy > earliest ? busy : earliest;
        end = start + duration;
    } while (!atomic_compare_exchange_weak(&d->busy_until, &busy, end));
    if (duration > 0) {
        /* A kernel that finds the device idle: NVML sees the front end at
         * work for a while before it (never before the last kernel's end,
         * so no two intervals overlap). */
        uint64_t front = st->config.nvml_launch_ns;
        if (start > busy)
            front = front < start - busy ? front : start - busy;
        else
            front = 0;
        record(d, pid, start - front, end, cursor);
    }
    return end;
}

static void add_busy(struct sim_pid_busy *out, size_t cap, size_t *count, int pid, uint64_t ns)
{
    for (size_t i = 0; i < *count && i < cap; i++) {
        if (out[i].pid == pid) {
            out[i].busy_ns += ns;
            return;
        }
    }
    if (*count < cap)
        out[*count] = (struct sim_pid_busy){.pid = pid, .busy_ns = ns};
    (*count)++;
}

/* The pid the caller sees for (pidns, pid): one lookup per process per query. */
struct seen_memo {
    uint32_t pidns, pid;
    int seen;
};

static int seen_pid(struct seen_memo *memo, size_t *used, size_t cap, uint32_t pidns, uint32_t pid)
{
    for (size_t i = 0; i < *used; i++)
        if (memo[i].pidns == pidns && memo[i].pid == pid)
            return memo[i].seen;
    int seen = sim_pid_seen(pidns, (int)pid);
    if (*used < cap)
        memo[(*used)++] = (struct seen_memo){pidns, pid, seen};
    return seen;
}

size_t sim_engine_usage(struct sim_state *st, unsigned dev, uint64_t from, uint64_t to,
                        struct sim_pid_busy *out, size_t cap, uint64_t *total)
{
    struct seen_memo memo[64];
    size_t memo_used = 0;
    struct sim_device *d = &st->devices[dev];
    uint64_t head = atomic_load(&d->ring_head);
    uint64_t oldest = head > SIM_RING_SIZE ? head - SIM_RING_SIZE : 0;
    size_t count = 0;
    unsigned before = 0;
    *total = 0;
    for (uint64_t n = head; n-- > oldest;) {
        struct sim_interval *e = &d->ring[n & RING_MASK];
        uint64_t seq = atomic_load(&e->seq);
        if (seq != published(n)) {
            if (seq > published(n))
                break; /* recycled: everything older is gone too */
            continue;  /* still being written */
        }
        uint64_t start = atomic_load(&e->start), end = atomic_load(&e->end);
        uint32_t pid = atomic_load(&e->pid), pidns = atomic_load(&e->pidns);
        if (atomic_load(&e->seq) != seq)
            break;
        if (end <= from) {
            if (++before >= SCAN_SLACK)
                break;
            continue;
        }
        before = 0;
        uint64_t lo = start > from ? start : from, hi = end < to ? end : to;
        if (hi <= lo)
            continue;
        *total += hi - lo;
        int seen = seen_pid(memo, &memo_used, sizeof(memo) / sizeof(memo[0]), pidns, pid);
        if (seen > 0) /* a process the caller cannot see counts in the total only */
            add_busy(out, cap, &count, seen, hi - lo);
    }
    return count;
}
