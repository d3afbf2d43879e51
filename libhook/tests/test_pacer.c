/*
 * test_pacer.c - the pacer's quota reading and token bucket, with a fake
 * clock and blocks in plain memory: no driver, no daemon.
 */
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/pacer.c"

#include "check.h"
#define CHECK_NEAR(a, b, tol) \
    do { \
        double a_ = (double)(a), b_ = (double)(b); \
        if (a_ < b_ - (tol) || a_ > b_ + (tol)) { \
            fprintf(stderr, "%s:%d: %s = %.0f, expected %.0f +- %.0f\n", __FILE__, __LINE__, #a, \
                    a_, b_, (double)(tol)); \
            failures++; \
        } \
    } while (0)

#define MS 1000000ull
#define PPM(percent) ((uint32_t)((percent) * 10000))

/* ---- a fake clock: waiting advances time; a callback may act meanwhile --
 * on_sleep runs as the wait begins (a writer during the sleep): if it moved
 * the word waited on, the waiter is woken at once, as the futex would. */
struct fake_clock {
    uint64_t now;
    uint64_t slept;
    unsigned sleeps;
    unsigned woken;
    void (*on_sleep)(struct fake_clock *);
    void *arg;
};

static uint64_t fake_now(void *ctx) { return ((struct fake_clock *)ctx)->now; }

static void fake_wait(void *ctx, const _Atomic uint32_t *word, uint32_t seen, uint64_t ns)
{
    struct fake_clock *fc = ctx;
    fc->sleeps++;
    if (fc->on_sleep != NULL)
        fc->on_sleep(fc);
    if (word != NULL && atomic_load(word) != seen) {
        fc->woken++;
        return;
    }
    fc->now += ns;
    fc->slept += ns;
}

static struct pacer_clock clock_of(struct fake_clock *fc)
{
    return (struct pacer_clock){fake_now, fake_wait, fc};
}

/* ---- blocks in plain memory ----------------------------------------- */
static struct vgpu_control *new_control(uint32_t share, uint32_t quota)
{
    struct vgpu_control *c = calloc(1, sizeof *c);
    c->device_count = 1;
    atomic_store(&c->devices[0].share_ppm, share);
    c->devices[0].throttle.quota_ppm = quota;
    return c;
}

static struct vgpu_usage *new_usage(uint32_t env_share)
{
    struct vgpu_usage *u = calloc(1, sizeof *u);
    atomic_store(&u->devices[0].share_ppm, env_share);
    return u;
}

static void write_throttle(struct vgpu_throttle *t, uint32_t ppm, uint64_t window)
{
    atomic_fetch_add(&t->seq, 1);
    t->quota_ppm = ppm;
    t->window_ns = window;
    t->epoch++;
    atomic_fetch_add(&t->seq, 1);
}

/* ---- tests ------------------------------------------------------------- */

static void test_refill_rate_cap_and_first_use(void)
{
    struct vgpu_usage *u = new_usage(0);
    struct pacer_quota q = {PPM(30), 100 * MS};
    struct vgpu_usage_device *b = &u->devices[0];

    CHECK(pacer_refill(b, &q, 1000 * MS) == 0); /* first use: starts empty */
    CHECK_NEAR(pacer_refill(b, &q, 1050 * MS), 15 * MS, 1);
    /* A long idle saves at most quota x window. */
    CHECK_NEAR(pacer_refill(b, &q, 9000 * MS), 30 * MS, 1);
    /* The same instant again adds nothing. */
    CHECK_NEAR(pacer_refill(b, &q, 9000 * MS), 30 * MS, 1);
    /* A lower quota lowers what was saved to its own cap. */
    struct pacer_quota low = {PPM(10), 100 * MS};
    CHECK_NEAR(pacer_refill(b, &low, 9001 * MS), 10 * MS, 1);
    /* A debt longer than the window to pay off is paid by all the time
     * that passed: 50 ms of debt at 10 % is paid after 500 ms. */
    pacer_charge(b, (int64_t)(60 * MS)); /* balance -50 ms */
    CHECK_NEAR(pacer_refill(b, &low, 9501 * MS), 0, 1);
    free(u);
}

static void test_deficit(void)
{
    CHECK(pacer_deficit_ns(0, PPM(30)) == 0);
    CHECK(pacer_deficit_ns(5, PPM(30)) == 0);
    CHECK_NEAR(pacer_deficit_ns(-(int64_t)(3 * MS), PPM(30)), 10 * MS, 1);
    CHECK_NEAR(pacer_deficit_ns(-(int64_t)(1 * MS), PPM(100) / 2), 2 * MS, 1);
}

static void test_admit_sleeps_off_the_debt_and_counts_it(void)
{
    struct vgpu_usage *u = new_usage(PPM(30));
    struct pacer_dev pd;
    pacer_dev_init(&pd, 0, NULL, u, &u->slots[0].dev[0]);
    struct fake_clock fc = {.now = 5000 * MS};
    struct pacer_clock clk = clock_of(&fc);

    CHECK(pacer_admit(&pd, &clk) == 0); /* fresh bucket: no wait */
    pacer_charge(pd.bucket, (int64_t)(6 * MS));
    uint64_t waited = pacer_admit(&pd, &clk);
    CHECK_NEAR(waited, 20 * MS, 2);
    CHECK(fc.sleeps >= 1);
    CHECK(atomic_load(&u->devices[0].throttled_ns) == waited);
    CHECK(atomic_load(&u->slots[0].dev[0].throttled_ns) == waited);
    free(u);
}

static void test_full_quota_never_waits(void)
{
    struct vgpu_usage *u = new_usage(VGPU_PPM_FULL);
    struct pacer_dev pd;
    pacer_dev_init(&pd, 0, NULL, u, NULL);
    struct fake_clock fc = {.now = 1000 * MS};
    struct pacer_clock clk = clock_of(&fc);
    pacer_charge(pd.bucket, (int64_t)(500 * MS));
    CHECK(pacer_admit(&pd, &clk) == 0);
    CHECK(fc.sleeps == 0);
    free(u);
}

static void test_vgpu_quota_from_the_table(void)
{
    struct vgpu_control *c = new_control(PPM(40), 0);
    struct vgpu_usage *u = new_usage(0);
    struct pacer_dev pd;
    pacer_dev_init(&pd, 0, c, u, NULL);

    /* Before the daemon's first tick (quota 0): the configured share. */
    struct pacer_quota q = pacer_quota_now(&pd, 0);
    CHECK(q.ppm == PPM(40));
    CHECK(q.window_ns == PACER_DEFAULT_WINDOW_NS);

    write_throttle(&c->devices[0].throttle, PPM(25), 50 * MS);
    q = pacer_quota_now(&pd, 0);
    CHECK(q.ppm == PPM(25));
    CHECK(q.window_ns == 50 * MS);

    /* Fail static: a writer that died mid-write (odd seq) and a heartbeat
     * that stopped long ago change nothing: the last quota stands. */
    atomic_fetch_add(&c->devices[0].throttle.seq, 1);
    c->devices[0].throttle.quota_ppm = VGPU_PPM_FULL;
    atomic_store(&c->heartbeat_ns, 1);
    q = pacer_quota_now(&pd, 3600000 * MS);
    CHECK(q.ppm == PPM(25));
    free(c);
    free(u);
}

/* Fail static is exact for hard shares only: a soft vGPU boosted above its
 * share (idle time lent) drops to its share once the daemon's heartbeat is
 * stale, so that a hard vGPU that starts meanwhile gets all of its own. */
static void test_soft_quota_falls_back_to_its_share_when_the_daemon_is_gone(void)
{
    struct vgpu_control *c = new_control(PPM(30), 0);
    atomic_store(&c->devices[0].flags, VGPU_DEV_SOFT);
    struct vgpu_usage *u = new_usage(0);
    struct pacer_dev pd;
    pacer_dev_init(&pd, 0, c, u, NULL);
    uint64_t now = 100000 * MS;

    write_throttle(&c->devices[0].throttle, VGPU_PPM_FULL, 50 * MS);
    atomic_store(&c->heartbeat_ns, now - 100 * MS);
    CHECK(pacer_quota_now(&pd, now).ppm == VGPU_PPM_FULL); /* boosted, daemon alive */
    CHECK(pacer_quota_now(&pd, now - 100 * MS + PACER_HEARTBEAT_FRESH_NS).ppm == VGPU_PPM_FULL);
    struct pacer_quota q = pacer_quota_now(&pd, now - 99 * MS + PACER_HEARTBEAT_FRESH_NS);
    CHECK(q.ppm == PPM(30)); /* stale: the guaranteed share, the table's window */
    CHECK(q.window_ns == 50 * MS);
    /* Also from the remembered quota (a writer that died mid-write). */
    atomic_fetch_add(&c->devices[0].throttle.seq, 1);
    CHECK(pacer_quota_now(&pd, now + 3600000 * MS).ppm == PPM(30));
    atomic_fetch_add(&c->devices[0].throttle.seq, 1);
    /* A clock behind the beat, or no beat ever: not proof of a live daemon. */
    CHECK(pacer_quota_now(&pd, now - 200 * MS).ppm == PPM(30));
    atomic_store(&c->heartbeat_ns, 0);
    CHECK(pacer_quota_now(&pd, now).ppm == PPM(30));
    /* The daemon is back: the table again. */
    atomic_store(&c->heartbeat_ns, now);
    CHECK(pacer_quota_now(&pd, now).ppm == VGPU_PPM_FULL);

    /* A hard vGPU keeps its last quota however stale the heartbeat (fail static). */
    atomic_store(&c->devices[0].flags, 0);
    write_throttle(&c->devices[0].throttle, PPM(25), 0);
    CHECK(pacer_quota_now(&pd, now + 3600000 * MS).ppm == PPM(25));
    free(c);
    free(u);
}

/* A calibrated quota (the daemon corrects it by NVML) counts while the
 * daemon beats; a flag a stopped daemon left corrects nothing any more,
 * and a standalone process is never calibrated. */
static void test_calibrated_only_while_the_daemon_beats(void)
{
    struct vgpu_control *c = new_control(PPM(30), 0);
    struct vgpu_usage *u = new_usage(PPM(30));
    struct pacer_dev pd, alone;
    pacer_dev_init(&pd, 0, c, u, NULL);
    pacer_dev_init(&alone, 0, NULL, u, NULL);
    uint64_t now = 100000 * MS;
    atomic_store(&c->heartbeat_ns, now);
    CHECK(!pacer_calibrated(&pd, now));
    atomic_store(&c->devices[0].flags, VGPU_DEV_SOFT | VGPU_DEV_CALIBRATED);
    CHECK(pacer_calibrated(&pd, now));
    CHECK(pacer_calibrated(&pd, now + PACER_HEARTBEAT_FRESH_NS));
    CHECK(!pacer_calibrated(&pd, now + PACER_HEARTBEAT_FRESH_NS + 1));
    CHECK(!pacer_calibrated(&pd, now - 1)); /* a beat ahead of our clock */
    atomic_store(&c->devices[0].flags, VGPU_DEV_SOFT);
    CHECK(!pacer_calibrated(&pd, now));
    CHECK(!pacer_calibrated(&alone, now));
    free(c);
    free(u);
}

static void test_vgpu_no_share_no_quota_is_unlimited(void)
{
    struct vgpu_control *c = new_control(0, 0);
    struct vgpu_usage *u = new_usage(0);
    struct pacer_dev pd;
    pacer_dev_init(&pd, 0, c, u, NULL);
    CHECK(pacer_quota_full(&(struct pacer_quota){pacer_quota_now(&pd, 0).ppm, 0}));
    free(c);
    free(u);
}

static void test_standalone_steer_can_only_lower(void)
{
    struct vgpu_usage *u = new_usage(PPM(50));
    struct pacer_dev pd;
    pacer_dev_init(&pd, 0, NULL, u, NULL);
    uint64_t now = 100000 * MS;

    CHECK(pacer_quota_now(&pd, now).ppm == PPM(50));
    write_throttle(&u->steer.throttle[0], PPM(20), 0);
    CHECK(pacer_quota_now(&pd, now).ppm == PPM(50)); /* no heartbeat yet */
    atomic_store(&u->steer.heartbeat_ns, now - 100 * MS);
    CHECK(pacer_quota_now(&pd, now).ppm == PPM(20));
    /* The daemon stopped: back to the environment's limit, never above. */
    CHECK(pacer_quota_now(&pd, now + PACER_STEER_FRESH_NS).ppm == PPM(50));
    /* A raise written into the (container-writable) block is ignored. */
    write_throttle(&u->steer.throttle[0], PPM(90), 0);
    CHECK(pacer_quota_now(&pd, now).ppm == PPM(50));
    /* No env limit (share 0): unlimited, and still only lowered by steering. */
    atomic_store(&u->devices[0].share_ppm, 0);
    CHECK(pacer_quota_now(&pd, now).ppm == PPM(90));
    free(u);
}

/* A live change wakes a sleeping thread at once (the word it waits on moves). */
static void raise_to_full(struct fake_clock *fc)
{
    struct vgpu_control *c = fc->arg;
    write_throttle(&c->devices[0].throttle, VGPU_PPM_FULL, 0);
}

static void test_live_change_wakes_a_sleeping_thread(void)
{
    struct vgpu_control *c = new_control(PPM(10), PPM(10));
    struct vgpu_usage *u = new_usage(0);
    struct pacer_dev pd;
    pacer_dev_init(&pd, 0, c, u, NULL);
    struct fake_clock fc = {.now = 1000 * MS, .on_sleep = raise_to_full, .arg = c};
    struct pacer_clock clk = clock_of(&fc);
    pacer_admit(&pd, &clk);
    pacer_charge(pd.bucket, (int64_t)(1000 * MS)); /* 10 s of debt at 10 % */
    uint64_t waited = pacer_admit(&pd, &clk);
    CHECK(waited == 0 && fc.woken == 1);
    free(c);
    free(u);
}

/*
 * Closed loop on the fake clock: processes sharing one bucket each queue
 * batches of GPU work whenever admitted; the work is charged as it is
 * queued. Over 10 s, the device time they get is the quota.
 */
static void run_shared_bucket(unsigned procs, uint32_t ppm, uint64_t batch_ns, double tolerance)
{
    struct vgpu_usage *u = new_usage(ppm);
    struct pacer_dev pd[4];
    for (unsigned p = 0; p < procs; p++)
        pacer_dev_init(&pd[p], 0, NULL, u, &u->slots[p].dev[0]);
    struct fake_clock fc = {.now = 1000 * MS};
    struct pacer_clock clk = clock_of(&fc);
    uint64_t start = fc.now, busy = 0;
    /* The GPU runs one batch at a time; a process queues its next batch
     * when admitted, at the earliest when the GPU is free. */
    while (fc.now - start < 10000 * MS) {
        for (unsigned p = 0; p < procs; p++) {
            pacer_admit(&pd[p], &clk);
            pacer_charge(pd[p].bucket, (int64_t)batch_ns);
            pacer_account(&pd[p], batch_ns, 1);
            fc.now += batch_ns;
            busy += batch_ns;
        }
    }
    double share = (double)busy / (double)(fc.now - start);
    double want = (double)ppm / VGPU_PPM_FULL;
    if (share < want - tolerance || share > want + tolerance) {
        fprintf(stderr, "shared bucket: %u procs at %u ppm with %llu ns batches got %.4f\n",
                procs, ppm, (unsigned long long)batch_ns, share);
        failures++;
    }
    CHECK(atomic_load(&u->devices[0].gpu_time_ns) == busy);
    free(u);
}

static void test_shared_bucket_holds_the_quota(void)
{
    /* Big batches overshoot by at most one batch per window's worth. */
    run_shared_bucket(1, PPM(30), 2 * MS, 0.005);
    run_shared_bucket(1, PPM(10), 20 * MS, 0.005);
    run_shared_bucket(3, PPM(30), 1 * MS, 0.005);
    run_shared_bucket(3, PPM(90), 20 * MS, 0.005);
    run_shared_bucket(2, PPM(50), 10000, 0.005);
}

/* Real threads refilling one bucket at once: every instant is credited
 * exactly once (the CAS on the stamp), so the balance equals quota x time
 * (less at most 1 ns of rounding per refill grain). */
struct refill_arg {
    struct vgpu_usage_device *b;
    uint64_t until;
};

static void *refill_thread(void *p)
{
    struct refill_arg *a = p;
    struct pacer_quota q = {PPM(50), PACER_MAX_WINDOW_NS};
    while (pacer_monotonic.now(NULL) < a->until)
        pacer_refill(a->b, &q, pacer_monotonic.now(NULL));
    return NULL;
}

static void test_concurrent_refill_credits_time_once(void)
{
    struct vgpu_usage *u = new_usage(0);
    struct pacer_quota q = {PPM(50), PACER_MAX_WINDOW_NS};
    uint64_t t0 = pacer_monotonic.now(NULL);
    pacer_refill(&u->devices[0], &q, t0);
    struct refill_arg arg = {&u->devices[0], t0 + 200 * MS};
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, refill_thread, &arg);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    uint64_t stamp = atomic_load(&u->devices[0].pacer_stamp_ns);
    int64_t balance = atomic_load(&u->devices[0].pacer_balance_ns);
    CHECK_NEAR(balance, (stamp - t0) / 2, (stamp - t0) / PACER_REFILL_GRAIN_NS + 1);
    free(u);
}

/* The real wait sleeps on the word until someone moves it and wakes it, as
 * the daemon does after writing a quota (vgpu_futex_wake_all): a 10 s wait
 * ends long before its timeout. */
struct waiter {
    _Atomic uint32_t word;
    uint64_t waited;
};

static void *wait_on_word(void *arg)
{
    struct waiter *w = arg;
    uint64_t t0 = pacer_monotonic.now(NULL);
    pacer_monotonic.wait(NULL, &w->word, 2, 10000 * MS);
    w->waited = pacer_monotonic.now(NULL) - t0;
    return NULL;
}

static void test_real_wait_is_woken_by_a_write(void)
{
    struct waiter w = {.word = 2};
    pthread_t th;
    pthread_create(&th, NULL, wait_on_word, &w);
    struct timespec pause = {0, 50 * 1000000L};
    nanosleep(&pause, NULL); /* let it go to sleep (if not, it sees the moved word) */
    atomic_store(&w.word, 4);
    syscall(SYS_futex, (uint32_t *)&w.word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    pthread_join(th, NULL);
    CHECK(w.waited < 5000 * MS);
}

/* Anyone who can map a control block (it is readable by all) may
 * FUTEX_WAKE its words without writing them. A paced thread asleep on its
 * quota's word goes on sleeping its debt off, at little CPU, while a
 * neighbour spams wakes there; and a real write still wakes it at once. */
struct spammer {
    const _Atomic uint32_t *word;
    _Atomic bool stop;
    _Atomic unsigned long wakes;
};

static void *spam_wakes(void *arg)
{
    struct spammer *s = arg;
    while (!atomic_load(&s->stop)) {
        syscall(SYS_futex, (const uint32_t *)s->word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
        atomic_fetch_add(&s->wakes, 1);
    }
    return NULL;
}

struct spammed_admit {
    struct pacer_dev pd;
    uint64_t waited, cpu;
};

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *admit_in_debt(void *arg)
{
    struct spammed_admit *a = arg;
    uint64_t cpu = thread_cpu_ns();
    a->waited = pacer_admit(&a->pd, &pacer_monotonic);
    a->cpu = thread_cpu_ns() - cpu;
    return NULL;
}

static void admit_beside_a_spammer(struct vgpu_control *c, bool write_midway,
                                   struct spammed_admit *a, unsigned long *wakes)
{
    struct vgpu_usage *u = new_usage(0);
    pacer_dev_init(&a->pd, 0, c, u, NULL);
    pacer_admit(&a->pd, &pacer_monotonic);
    pacer_charge(a->pd.bucket, (int64_t)(3 * MS)); /* 300 ms of debt at 1 % */
    struct spammer s = {.word = &c->devices[0].throttle.seq};
    pthread_t spam, admit;
    pthread_create(&spam, NULL, spam_wakes, &s);
    pthread_create(&admit, NULL, admit_in_debt, a);
    if (write_midway) {
        struct timespec pause = {0, 100 * 1000000L};
        nanosleep(&pause, NULL);
        write_throttle(&c->devices[0].throttle, VGPU_PPM_FULL, 0);
        syscall(SYS_futex, (uint32_t *)&c->devices[0].throttle.seq, FUTEX_WAKE, INT_MAX, NULL,
                NULL, 0);
    }
    pthread_join(admit, NULL);
    atomic_store(&s.stop, true);
    pthread_join(spam, NULL);
    *wakes = atomic_load(&s.wakes);
    free(u);
}

static void test_wakes_without_a_write_cost_a_paced_sleeper_little(void)
{
    struct vgpu_control *c = new_control(PPM(1), PPM(1));
    struct spammed_admit a;
    unsigned long wakes;
    admit_beside_a_spammer(c, false, &a, &wakes);
    CHECKF(a.waited >= 290 * MS && a.waited < 600 * MS, "waited %lu ms",
           (unsigned long)(a.waited / MS));
    /* Answering every wake took 31 % of a core here (613,000 wakes in 0.3 s). */
    CHECKF(a.cpu < a.waited / 20, "the sleeper's CPU %lu us of %lu ms beside %lu wakes",
           (unsigned long)(a.cpu / 1000), (unsigned long)(a.waited / MS), wakes);

    admit_beside_a_spammer(c, true, &a, &wakes);
    CHECKF(a.waited >= 90 * MS && a.waited < 100 * MS + PACER_WATCH_NS + 20 * MS,
           "a write 100 ms in ended the wait after %lu ms", (unsigned long)(a.waited / MS));
    free(c);
}

int main(void)
{
    test_refill_rate_cap_and_first_use();
    test_deficit();
    test_admit_sleeps_off_the_debt_and_counts_it();
    test_full_quota_never_waits();
    test_vgpu_quota_from_the_table();
    test_vgpu_no_share_no_quota_is_unlimited();
    test_soft_quota_falls_back_to_its_share_when_the_daemon_is_gone();
    test_calibrated_only_while_the_daemon_beats();
    test_standalone_steer_can_only_lower();
    test_live_change_wakes_a_sleeping_thread();
    test_real_wait_is_woken_by_a_write();
    test_wakes_without_a_write_cost_a_paced_sleeper_little();
    test_shared_bucket_holds_the_quota();
    test_concurrent_refill_credits_time_once();
    return check_report("test_pacer");
}
