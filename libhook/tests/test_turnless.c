/*
 * test_turnless.c - which paced processes go without the GPU turn: only
 * after a whole window in which their share did not bind (no launch
 * waited in the pacer) and they used little of the GPU; back to turns at
 * once when the pacer holds them back, when they use more, or after a
 * pause that says nothing of their work. And which may gate only a sample
 * of their batches: a whole window with no wait and a use under 75 % of
 * their quota.
 */
#include <string.h>

#include "../src/turnless.c"

#include "check.h"

#define MS 1000000ull
#define T0 (1000 * MS) /* any clock value but 0 */
#define QUOTA_FULL 1000000u

/* A vGPU's counters on one device, and this process's view of them. */
struct fixture {
    struct vgpu_usage_device bucket;
    struct turnless t;
    bool beside; /* another paced tenant stamps the GPU */
};

static void reset(struct fixture *f)
{
    memset(f, 0, sizeof(*f));
}

/* `used` ms of GPU time and `waited` ms in the pacer over the next `ms` ms,
 * then the question at the end of that time, at quota `quota_ppm`. */
static bool after_at(struct fixture *f, uint64_t *now, uint64_t ms, uint64_t used,
                     uint64_t waited, uint32_t quota_ppm)
{
    atomic_fetch_add(&f->bucket.gpu_time_ns, used * MS);
    atomic_fetch_add(&f->bucket.throttled_ns, waited * MS);
    *now += ms * MS;
    return turnless_turn_needed(&f->t, &f->bucket, 0, quota_ppm, f->beside, *now);
}

static bool after(struct fixture *f, uint64_t *now, uint64_t ms, uint64_t used, uint64_t waited)
{
    return after_at(f, now, ms, used, waited, QUOTA_FULL);
}

static void test_turns_until_a_light_window_has_passed(void)
{
    struct fixture f;
    reset(&f);
    uint64_t now = T0;
    /* Nothing known yet: the first batches take turns, whatever they use. */
    CHECK(turnless_turn_needed(&f.t, &f.bucket, 0, QUOTA_FULL, false, now));
    CHECK(after(&f, &now, 50, 5, 0)); /* half a window: still turns */
    /* A whole window at 10 % and no wait: the next batches go without. */
    CHECK(!after(&f, &now, 50, 5, 0));
    CHECK(!after(&f, &now, 60, 6, 0));
}

static void test_a_share_that_binds_takes_turns_at_once(void)
{
    struct fixture f;
    reset(&f);
    uint64_t now = T0;
    turnless_turn_needed(&f.t, &f.bucket, 0, QUOTA_FULL, false, now);
    CHECK(!after(&f, &now, 100, 10, 0));
    /* The pacer is about to hold a launch back: this very batch takes the turn. */
    now += MS;
    CHECK(turnless_turn_needed(&f.t, &f.bucket, -1, QUOTA_FULL, false, now));
    /* It waited in the pacer: the window it waited in does not qualify. */
    CHECK(after(&f, &now, 110, 10, 3));
    /* A whole window without waiting again: turnless again. */
    CHECK(!after(&f, &now, 100, 10, 0));
}

static void test_a_window_that_waited_keeps_turns(void)
{
    struct fixture f;
    reset(&f);
    uint64_t now = T0;
    turnless_turn_needed(&f.t, &f.bucket, 0, QUOTA_FULL, false, now);
    /* Light, but another process of the vGPU waited in the pacer. */
    CHECK(after(&f, &now, 100, 10, 1));
    CHECK(!after(&f, &now, 100, 10, 0));
}

static void test_heavy_use_keeps_turns(void)
{
    struct fixture f;
    reset(&f);
    uint64_t now = T0;
    turnless_turn_needed(&f.t, &f.bucket, 0, QUOTA_FULL, false, now);
    /* 30 % of the window is the bound: at it, turns. */
    CHECK(after(&f, &now, 100, 30, 0));
    CHECK(!after(&f, &now, 100, 29, 0));
    /* Its use grows (a decoder turned GPU-bound): turns from the next window. */
    CHECK(after(&f, &now, 100, 60, 0));
}

static void test_beside_a_paced_tenant_a_little_more_use_keeps_it_without(void)
{
    struct fixture f;
    reset(&f);
    f.beside = true;
    uint64_t now = T0;
    turnless_turn_needed(&f.t, &f.bucket, 0, QUOTA_FULL, false, now);
    CHECK(!after(&f, &now, 100, 25, 0));
    /* A window above the entry bound but under the stay bound: still without. */
    CHECK(!after(&f, &now, 100, 33, 0));
    CHECK(!after(&f, &now, 100, 39, 0));
    /* Over the stay bound: turns, and back only under the entry bound. */
    CHECK(after(&f, &now, 100, 41, 0));
    CHECK(after(&f, &now, 100, 33, 0));
    CHECK(!after(&f, &now, 100, 29, 0));
    /* A wait in the pacer ends it whatever the use. */
    CHECK(after(&f, &now, 100, 20, 1));
}

static void test_alone_the_entry_bound_is_the_only_one(void)
{
    struct fixture f;
    reset(&f);
    uint64_t now = T0;
    turnless_turn_needed(&f.t, &f.bucket, 0, QUOTA_FULL, false, now);
    CHECK(!after(&f, &now, 100, 25, 0));
    /* Nobody waits for its turns: no reason to stay above the entry bound. */
    CHECK(after(&f, &now, 100, 33, 0));
}

static void test_a_pause_says_nothing_of_the_work(void)
{
    struct fixture f;
    reset(&f);
    uint64_t now = T0;
    turnless_turn_needed(&f.t, &f.bucket, 0, QUOTA_FULL, false, now);
    CHECK(!after(&f, &now, 100, 10, 0));
    /* A minute idle, then GPU-bound: the minute does not make it light. */
    CHECK(after(&f, &now, 60000, 50, 0));
    CHECK(after(&f, &now, 100, 60, 0));
}

static void test_gates_are_sampled_only_with_room_under_the_quota(void)
{
    struct fixture f;
    reset(&f);
    uint64_t now = T0;
    /* Nothing known yet: every batch gated. */
    turnless_turn_needed(&f.t, &f.bucket, 0, 600000, false, now);
    CHECK(!turnless_gates_sampled(&f.t));
    after_at(&f, &now, 50, 20, 0, 600000);
    CHECK(!turnless_gates_sampled(&f.t));
    /* A whole window at 40 % of the GPU under a quota of 60 %: room (and
     * too heavy to go without the turn). */
    CHECK(after_at(&f, &now, 50, 20, 0, 600000));
    CHECK(turnless_gates_sampled(&f.t));
    /* 45 % is 75 % of that quota: no room. */
    after_at(&f, &now, 100, 45, 0, 600000);
    CHECK(!turnless_gates_sampled(&f.t));
    /* The same use under a quota of 90 % leaves room again. */
    after_at(&f, &now, 100, 45, 0, 900000);
    CHECK(turnless_gates_sampled(&f.t));
}

static void test_a_wait_or_a_pause_gates_every_batch(void)
{
    struct fixture f;
    reset(&f);
    uint64_t now = T0;
    turnless_turn_needed(&f.t, &f.bucket, 0, 600000, false, now);
    after_at(&f, &now, 100, 10, 0, 600000);
    CHECK(turnless_gates_sampled(&f.t));
    /* The pacer is about to hold a launch back: gated from this batch on. */
    now += MS;
    turnless_turn_needed(&f.t, &f.bucket, -1, 600000, false, now);
    CHECK(!turnless_gates_sampled(&f.t));
    /* A window in which it waited does not qualify either. */
    after_at(&f, &now, 110, 10, 2, 600000);
    CHECK(!turnless_gates_sampled(&f.t));
    after_at(&f, &now, 100, 10, 0, 600000);
    CHECK(turnless_gates_sampled(&f.t));
    /* A pause: gated until a fresh window qualifies. */
    after_at(&f, &now, 60000, 10, 0, 600000);
    CHECK(!turnless_gates_sampled(&f.t));
}

int main(void)
{
    test_turns_until_a_light_window_has_passed();
    test_a_share_that_binds_takes_turns_at_once();
    test_a_window_that_waited_keeps_turns();
    test_heavy_use_keeps_turns();
    test_beside_a_paced_tenant_a_little_more_use_keeps_it_without();
    test_alone_the_entry_bound_is_the_only_one();
    test_a_pause_says_nothing_of_the_work();
    test_gates_are_sampled_only_with_room_under_the_quota();
    test_a_wait_or_a_pause_gates_every_batch();
    return check_report("test_turnless");
}
