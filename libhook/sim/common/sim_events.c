/*
 * sim_events.c - Xid events: a per-device ring in the state plus a futex
 * on a global count, so an NVML event wait sleeps until something happens.
 */
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "sim_state.h"

#define XID_MASK (SIM_XID_RING - 1u)

void sim_xid_post(struct sim_state *st, unsigned dev, uint64_t code)
{
    struct sim_device *d = &st->devices[dev];
    uint32_t n = atomic_fetch_add(&d->xid_head, 1);
    struct sim_xid *e = &d->xids[n & XID_MASK];
    atomic_store(&e->seq, 2ULL * n + 1);
    atomic_store(&e->code, code);
    atomic_store(&e->seq, 2ULL * n + 2);
    atomic_fetch_add(&st->event_count, 1);
    syscall(SYS_futex, (uint32_t *)&st->event_count, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

bool sim_xid_next(struct sim_state *st, unsigned dev, uint32_t *seen, uint64_t *code)
{
    struct sim_device *d = &st->devices[dev];
    uint32_t head = atomic_load(&d->xid_head);
    if (head == *seen)
        return false;
    if (head - *seen > SIM_XID_RING) /* overrun: the oldest are gone */
        *seen = head - SIM_XID_RING;
    struct sim_xid *e = &d->xids[*seen & XID_MASK];
    if (atomic_load(&e->seq) != 2ULL * *seen + 2)
        return false; /* still being written */
    *code = atomic_load(&e->code);
    (*seen)++;
    return true;
}

void sim_xid_wait(struct sim_state *st, uint32_t count, uint64_t deadline)
{
    uint64_t now = sim_now();
    if (now >= deadline)
        return;
    uint64_t left = deadline - now;
    struct timespec ts = {.tv_sec = (time_t)(left / 1000000000ULL), .tv_nsec = (long)(left % 1000000000ULL)};
    syscall(SYS_futex, (uint32_t *)&st->event_count, FUTEX_WAIT, count, &ts, NULL, 0);
}
