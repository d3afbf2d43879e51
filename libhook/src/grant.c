/*
 * grant.c - a vGPU's side of the broker's GPU turn (see grant.h).
 *
 * The hand-shake with the broker, which may take an idle holder's grant
 * back while one of its processes starts working under it: the process
 * stores the grant id in `request` and then reads turn_grant again; the
 * broker stores 0 in turn_grant and then reads `request` (and gives the
 * grant back if it finds its id there). Both sequentially consistent, so at
 * least one of them sees the other's store: never two vGPUs working at once.
 */
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "arbiter.h"
#include "grant.h"

/* Change the request word, waking the broker if it sleeps on it. */
static void set_request(const struct grant_dev *g, uint32_t value)
{
    if (atomic_exchange(&g->turn->request, value) != value)
        syscall(SYS_futex, (uint32_t *)&g->turn->request, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

bool grant_broker_live(const struct grant_dev *g, uint64_t now)
{
    uint64_t beat = atomic_load_explicit(g->beat, memory_order_relaxed);
    return beat != 0 && (now < beat || now - beat < GRANT_BROKER_STALE_NS);
}

uint32_t grant_acquire(const struct grant_dev *g, const struct pacer_clock *clock)
{
    set_request(g, VGPU_TURN_WANT);
    for (;;) {
        uint32_t id = atomic_load(&g->control->turn_grant);
        uint64_t now = clock->now(clock->ctx);
        if (!grant_broker_live(g, now)) {
            set_request(g, 0); /* a grant left by a broker gone is no grant */
            return 0;
        }
        /* A grant whose time is up is on its way back to the broker (or,
         * if we took it up again, would only be passed on at once): wait
         * for the next one rather than spin. */
        if (id > VGPU_TURN_WANT && !grant_expired(g, now)) {
            /* No claim of the last grant's outlives it: cleared before the
             * echo, which is what makes the broker read it. */
            atomic_store(&g->turn->overrun_ms, 0);
            set_request(g, id);
            if (atomic_load(&g->control->turn_grant) == id)
                return id;
            set_request(g, VGPU_TURN_WANT); /* taken back as we came: ask again */
            continue;
        }
        arbiter_renew(g->turn, now);
        clock->wait(clock->ctx, &g->control->turn_grant, id, GRANT_WAIT_SLICE_NS);
    }
}

bool grant_holds(const struct grant_dev *g, uint32_t id)
{
    return atomic_load_explicit(&g->control->turn_grant, memory_order_acquire) == id;
}

bool grant_expired(const struct grant_dev *g, uint64_t now)
{
    uint64_t until = atomic_load_explicit(&g->control->turn_until_ns, memory_order_relaxed);
    return until != 0 && now >= until;
}

bool grant_others_wait(const struct grant_dev *g)
{
    return atomic_load_explicit(&g->control->turn_until_ns, memory_order_relaxed) != 0;
}

void grant_release(const struct grant_dev *g, bool want)
{
    atomic_store(&g->turn->overrun_ms, 0);
    set_request(g, want ? VGPU_TURN_WANT : 0);
}

void grant_overrun(const struct grant_dev *g, uint64_t end, uint64_t now)
{
    /* Past its time if the broker set one; else past now, for any time the
     * broker sets later is no earlier than now (vgpu_broker.c). */
    uint64_t until = atomic_load_explicit(&g->control->turn_until_ns, memory_order_relaxed);
    uint64_t base = until != 0 ? until : now;
    if (end <= base)
        return;
    uint64_t ms = (end - base + 999999) / 1000000;
    if (ms > UINT32_MAX)
        ms = UINT32_MAX;
    if (ms > atomic_load(&g->turn->overrun_ms))
        atomic_store(&g->turn->overrun_ms, (uint32_t)ms);
}
