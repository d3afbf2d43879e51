/*
 * turnless.c - which paced processes run without the GPU turn (see
 * turnless.h).
 */
#include "turnless.h"

static void restart(struct turnless *t, const struct vgpu_usage_device *bucket, uint64_t now)
{
    atomic_store_explicit(&t->gpu_ns,
                          atomic_load_explicit(&bucket->gpu_time_ns, memory_order_relaxed),
                          memory_order_relaxed);
    atomic_store_explicit(&t->waited_ns,
                          atomic_load_explicit(&bucket->throttled_ns, memory_order_relaxed),
                          memory_order_relaxed);
    atomic_store_explicit(&t->since_ns, now, memory_order_release);
}

static void qualify(struct turnless *t, bool on, bool roomy)
{
    atomic_store_explicit(&t->on, on, memory_order_relaxed);
    atomic_store_explicit(&t->roomy, roomy, memory_order_relaxed);
}

bool turnless_turn_needed(struct turnless *t, const struct vgpu_usage_device *bucket,
                          int64_t balance, uint32_t quota_ppm, bool beside, uint64_t now)
{
    uint64_t since = atomic_load_explicit(&t->since_ns, memory_order_acquire);
    if (balance < 0 || since == 0) {
        /* The share binds (or nothing is known yet): turns from now, and a
         * whole window without a wait before going without them. */
        qualify(t, false, false);
        if (since == 0 || now - since >= TURNLESS_WINDOW_NS / 8)
            restart(t, bucket, now); /* not on every batch: one store a few ms */
        return true;
    }
    if (now - since >= 2 * TURNLESS_WINDOW_NS) {
        /* A window that spans a pause says nothing of the work now (a
         * GPU-bound process back from an idle minute): turns until a fresh
         * one qualifies. */
        qualify(t, false, false);
        restart(t, bucket, now);
        return true;
    }
    /* One thread closes the window: the one whose CAS moves its start. */
    if (now - since >= TURNLESS_WINDOW_NS &&
        atomic_compare_exchange_strong(&t->since_ns, &since, now)) {
        uint64_t gpu = atomic_load_explicit(&bucket->gpu_time_ns, memory_order_relaxed);
        uint64_t waited = atomic_load_explicit(&bucket->throttled_ns, memory_order_relaxed);
        uint64_t used = gpu - atomic_load_explicit(&t->gpu_ns, memory_order_relaxed);
        bool idle_pacer = waited == atomic_load_explicit(&t->waited_ns, memory_order_relaxed);
        /* used / span < ppm / 1e6, in microseconds (the span is under 2
         * windows: no overflow below a quota of 2^32 ppm) */
        uint64_t span_us = (now - since) / 1000u;
        uint64_t bound = beside && atomic_load_explicit(&t->on, memory_order_relaxed)
                             ? TURNLESS_STAY_MAX_USE_PPM
                             : TURNLESS_MAX_USE_PPM;
        bool light = used / 1000u < span_us * bound / 1000000u;
        bool roomy = used / 1000u < span_us * quota_ppm / 1000000u *
                                        TURNLESS_SAMPLED_MAX_USE_PPM / 1000000u;
        atomic_store_explicit(&t->gpu_ns, gpu, memory_order_relaxed);
        atomic_store_explicit(&t->waited_ns, waited, memory_order_relaxed);
        qualify(t, idle_pacer && light, idle_pacer && roomy);
    }
    return !atomic_load_explicit(&t->on, memory_order_relaxed);
}

bool turnless_gates_sampled(const struct turnless *t)
{
    return atomic_load_explicit(&t->roomy, memory_order_relaxed);
}
