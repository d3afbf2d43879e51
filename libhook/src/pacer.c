/*
 * pacer.c - the quota in force and the shared token bucket (see pacer.h).
 * No driver calls, no locks: atomics on the shared blocks only, so a process
 * killed at any instant leaves nothing held.
 */
#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "pacer.h"

static uint64_t monotonic_now(void *ctx)
{
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct timespec timespec_of(uint64_t ns)
{
    return (struct timespec){.tv_sec = (time_t)(ns / 1000000000ull),
                             .tv_nsec = (long)(ns % 1000000000ull)};
}

static void monotonic_wait(void *ctx, const _Atomic uint32_t *word, uint32_t seen, uint64_t ns)
{
    (void)ctx;
    struct timespec ts = timespec_of(ns);
    if (word == NULL) {
        while (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, &ts) == EINTR)
            ;
        return;
    }
    /* Not FUTEX_PRIVATE_FLAG: the word is in a shared file mapping (a
     * read-only one in a container is fine for FUTEX_WAIT). A moved word
     * (EAGAIN) or the timeout return: the caller looks at the quota again.
     * So may a wake, unless the word stands still: anyone who can map the
     * word (a control block is readable by all) may FUTEX_WAKE it without
     * writing it, and a waiter that answered every such wake would spend
     * its CPU on another's loop. Past PACER_IDLE_WAKES of those, the rest of
     * the sleep looks at the word every PACER_WATCH_NS instead. */
    uint64_t end = monotonic_now(NULL) + ns;
    for (int idle = 0;; idle++) {
        if (idle < PACER_IDLE_WAKES) {
            syscall(SYS_futex, (const uint32_t *)word, FUTEX_WAIT, seen, &ts, NULL, 0);
        } else {
            struct timespec step = ns < PACER_WATCH_NS ? ts : timespec_of(PACER_WATCH_NS);
            clock_nanosleep(CLOCK_MONOTONIC, 0, &step, NULL);
        }
        uint64_t now = monotonic_now(NULL);
        if (now >= end || atomic_load_explicit(word, memory_order_acquire) != seen)
            return;
        ns = end - now;
        ts = timespec_of(ns);
    }
}

const struct pacer_clock pacer_monotonic = {monotonic_now, monotonic_wait, NULL};

void pacer_dev_init(struct pacer_dev *pd, int index, const struct vgpu_control *control,
                    struct vgpu_usage *usage, struct vgpu_proc_device *slot)
{
    *pd = (struct pacer_dev){
        .control = control != NULL ? &control->devices[index] : NULL,
        .heartbeat = control != NULL ? &control->heartbeat_ns : NULL,
        .steer = control == NULL ? &usage->steer : NULL,
        .index = index,
        .bucket = &usage->devices[index],
        .slot = slot,
        .last_ppm = VGPU_PPM_FULL,
        .last_window_ns = PACER_DEFAULT_WINDOW_NS,
    };
    /* Until a first good read, the configured share: never unlimited by
     * accident when the table is being written at our first look. */
    if (control != NULL) {
        uint32_t share = atomic_load_explicit(&pd->control->share_ppm, memory_order_relaxed);
        if (share != 0 && share < VGPU_PPM_FULL)
            atomic_store_explicit(&pd->last_ppm, share, memory_order_relaxed);
    }
}

int pacer_read_throttle(const struct vgpu_throttle *t, struct pacer_quota *out)
{
    /* The writer is the daemon's tick: a handful of tries always suffices
     * unless it died mid-write, and then the caller keeps its last quota. */
    for (int tries = 0; tries < 64; tries++) {
        uint32_t seq = atomic_load_explicit(&t->seq, memory_order_acquire);
        if (seq & 1u)
            continue;
        uint32_t ppm = ((const volatile struct vgpu_throttle *)t)->quota_ppm;
        uint64_t window = ((const volatile struct vgpu_throttle *)t)->window_ns;
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&t->seq, memory_order_relaxed) != seq)
            continue;
        out->ppm = ppm;
        out->window_ns = window;
        return 0;
    }
    return -1;
}

/* A table value made usable: 0 means "not set", windows are bounded. */
static struct pacer_quota normalise(struct pacer_quota q, uint32_t fallback_ppm)
{
    if (q.ppm == 0)
        q.ppm = fallback_ppm == 0 ? VGPU_PPM_FULL : fallback_ppm;
    if (q.ppm > VGPU_PPM_FULL)
        q.ppm = VGPU_PPM_FULL;
    if (q.window_ns == 0)
        q.window_ns = PACER_DEFAULT_WINDOW_NS;
    if (q.window_ns > PACER_MAX_WINDOW_NS)
        q.window_ns = PACER_MAX_WINDOW_NS;
    return q;
}

/* `now`, or the clock's if the caller left it to us (0: pacer_quota_now). */
static uint64_t known(uint64_t now)
{
    return now != 0 ? now : pacer_monotonic.now(NULL);
}

/* Has the daemon stopped beating? (0: it never has, on this block.) */
static bool heartbeat_stale(const struct pacer_dev *pd, uint64_t now)
{
    uint64_t beat = atomic_load_explicit(pd->heartbeat, memory_order_acquire);
    if (beat == 0)
        return true;
    now = known(now);
    return now < beat || now - beat > PACER_HEARTBEAT_FRESH_NS;
}

static struct pacer_quota vgpu_quota(struct pacer_dev *pd, uint64_t now)
{
    uint32_t share = atomic_load_explicit(&pd->control->share_ppm, memory_order_relaxed);
    struct pacer_quota q;
    if (pacer_read_throttle(&pd->control->throttle, &q) != 0)
        q = (struct pacer_quota){
            atomic_load_explicit(&pd->last_ppm, memory_order_relaxed),
            atomic_load_explicit(&pd->last_window_ns, memory_order_relaxed),
        };
    else
        q = normalise(q, share); /* before the daemon's first tick (0): the share */
    uint32_t flags = atomic_load_explicit(&pd->control->flags, memory_order_relaxed);
    if ((flags & VGPU_DEV_SOFT) && share != 0 && heartbeat_stale(pd, now))
        q.ppm = share < VGPU_PPM_FULL ? share : VGPU_PPM_FULL;
    return q;
}

static struct pacer_quota standalone_quota(struct pacer_dev *pd, uint64_t now)
{
    uint32_t env = atomic_load_explicit(&pd->bucket->share_ppm, memory_order_relaxed);
    struct pacer_quota q = normalise((struct pacer_quota){env, 0}, env);
    if (pd->steer == NULL)
        return q;
    /* The daemon may only ever lower what the environment allows (the block
     * is the container's to write), and only while it is alive. */
    uint64_t beat = atomic_load_explicit(&pd->steer->heartbeat_ns, memory_order_acquire);
    if (beat == 0)
        return q;
    now = known(now);
    if (now < beat || now - beat > PACER_STEER_FRESH_NS)
        return q;
    struct pacer_quota steer;
    if (pacer_read_throttle(&pd->steer->throttle[pd->index], &steer) != 0 || steer.ppm == 0)
        return q;
    steer = normalise(steer, q.ppm);
    if (steer.ppm < q.ppm)
        q = steer;
    return q;
}

struct pacer_quota pacer_quota_now(struct pacer_dev *pd, uint64_t now)
{
    struct pacer_quota q = pd->control != NULL ? vgpu_quota(pd, now) : standalone_quota(pd, now);
    atomic_store_explicit(&pd->last_ppm, q.ppm, memory_order_relaxed);
    atomic_store_explicit(&pd->last_window_ns, q.window_ns, memory_order_relaxed);
    return q;
}

bool pacer_calibrated(const struct pacer_dev *pd, uint64_t now)
{
    return pd->control != NULL &&
           (atomic_load_explicit(&pd->control->flags, memory_order_relaxed) &
            VGPU_DEV_CALIBRATED) != 0 &&
           !heartbeat_stale(pd, now);
}

int64_t pacer_refill(struct vgpu_usage_device *b, const struct pacer_quota *q, uint64_t now)
{
    uint64_t stamp = atomic_load_explicit(&b->pacer_stamp_ns, memory_order_acquire);
    /* Refilling in grains keeps the rounding of each gain negligible and
     * the stamp's cache line quiet when many threads launch at once. */
    while (now >= stamp + PACER_REFILL_GRAIN_NS || stamp == 0) {
        if (!atomic_compare_exchange_weak_explicit(&b->pacer_stamp_ns, &stamp, now,
                                                   memory_order_acq_rel, memory_order_acquire))
            continue; /* someone else moved it: their refill covers their span */
        if (stamp == 0)
            break; /* first use of the bucket: it starts empty, now */
        /* Not bounded by the window: a bucket in debt needs longer than the
         * window to refill (a debt of d at quota r takes d / r, then the
         * window to fill), and every ns of it counts; the cap below bounds
         * the result. Bounded only so that elapsed x ppm cannot overflow. */
        uint64_t elapsed = now - stamp;
        if (elapsed > PACER_MAX_ELAPSED_NS)
            elapsed = PACER_MAX_ELAPSED_NS;
        int64_t gain = (int64_t)(elapsed * q->ppm / VGPU_PPM_FULL);
        int64_t cap = (int64_t)(q->window_ns * q->ppm / VGPU_PPM_FULL);
        int64_t bal = atomic_load_explicit(&b->pacer_balance_ns, memory_order_relaxed);
        int64_t next;
        do {
            if (bal >= cap)
                next = cap; /* a lowered quota also lowers what was saved */
            else
                next = bal + gain > cap ? cap : bal + gain;
        } while (!atomic_compare_exchange_weak_explicit(&b->pacer_balance_ns, &bal, next,
                                                        memory_order_relaxed, memory_order_relaxed));
        return next;
    }
    return atomic_load_explicit(&b->pacer_balance_ns, memory_order_relaxed);
}

void pacer_charge(struct vgpu_usage_device *b, int64_t ns)
{
    atomic_fetch_sub_explicit(&b->pacer_balance_ns, ns, memory_order_relaxed);
}

uint64_t pacer_deficit_ns(int64_t balance, uint32_t quota_ppm)
{
    if (balance >= 0 || quota_ppm == 0)
        return 0;
    /* (-balance) / (ppm / 1e6), rounded up so one sleep is enough. */
    uint64_t debt = (uint64_t)(-balance);
    return (debt * VGPU_PPM_FULL + quota_ppm - 1) / quota_ppm;
}

/* The seq word of the throttle entry a new quota would be written to: the
 * vGPU's table, or the steering area of a standalone process. */
static const _Atomic uint32_t *quota_word(const struct pacer_dev *pd)
{
    if (pd->control != NULL)
        return &pd->control->throttle.seq;
    return pd->steer != NULL ? &pd->steer->throttle[pd->index].seq : NULL;
}

uint64_t pacer_admit(struct pacer_dev *pd, const struct pacer_clock *clock)
{
    uint64_t start = clock->now(clock->ctx);
    uint64_t now = start;
    const _Atomic uint32_t *word = quota_word(pd);
    for (;;) {
        /* Read before the quota: a write after this read moves the word,
         * and the wait below then returns at once. */
        uint32_t seen = word != NULL ? atomic_load_explicit(word, memory_order_acquire) : 0;
        struct pacer_quota q = pacer_quota_now(pd, now);
        if (pacer_quota_full(&q))
            break;
        int64_t balance = pacer_refill(pd->bucket, &q, now);
        uint64_t wait = pacer_deficit_ns(balance, q.ppm);
        if (wait == 0)
            break;
        clock->wait(clock->ctx, word, seen, wait < PACER_MAX_SLEEP_NS ? wait : PACER_MAX_SLEEP_NS);
        now = clock->now(clock->ctx);
    }
    uint64_t waited = now - start;
    if (waited > 0) {
        atomic_fetch_add_explicit(&pd->bucket->throttled_ns, waited, memory_order_relaxed);
        if (pd->slot != NULL)
            atomic_fetch_add_explicit(&pd->slot->throttled_ns, waited, memory_order_relaxed);
    }
    return waited;
}

void pacer_account(struct pacer_dev *pd, uint64_t gpu_ns, uint64_t launches)
{
    atomic_fetch_add_explicit(&pd->bucket->gpu_time_ns, gpu_ns, memory_order_relaxed);
    atomic_fetch_add_explicit(&pd->bucket->launches, launches, memory_order_relaxed);
    if (pd->slot != NULL) {
        atomic_fetch_add_explicit(&pd->slot->gpu_time_ns, gpu_ns, memory_order_relaxed);
        atomic_fetch_add_explicit(&pd->slot->launches, launches, memory_order_relaxed);
    }
}
