/*
 * test_turnless.c - which paced processes go without the GPU turn: only
 * after a whole window in which their share did not bind (no launch
 * waited in the pacer) and they used little of the GPU; back to turns at
 * once when the pacer holds them back, when they use more, or after a
 * pause that says nothing of their work.
 */
#include <string.h>

#include "../src/turnless.c"

#include "check.h"

#define MS 1000000ull
#define T0 (1000 * MS) /* any clock value but 0 */

/* A vGPU's counters on one device, and this process's view of them. */
struct fixture {
    struct vgpu_usage_device bucket;
    struct turnless t;
};

static void reset(struct fixture *f)
{
    memset(f, 0, sizeof(*f));
}

/* `used` ms of GPU time and `waited` ms in the pacer over the next `ms` ms,
 * then the question at the end of that time. */
static bool after(struct fixture *f, uint64_t *now, uint64_t ms, uint64_t used, uint64_t waited)
{
    atomic_fetch_add(&f->bucket.gpu_time_ns, used * MS);
    atomic_fetch_add(&f->bucket.throttled_ns, waited * MS);
    *now += ms * MS;
    return turnless_turn_needed(&f->t, &f->bucket, 0, *now);
}

static void test_turns_until_a_light_window_has_passed(void)
{
    struct fixture f;
    reset(&f);
    uint64_t now = T0;
    /* Nothing known yet: the first batches take turns, whatever they use. */
    CHECK(turnless_turn_needed(&f.t, &f.bucket, 0, now));
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
    turnless_turn_needed(&f.t, &f.bucket, 0, now);
    CHECK(!after(&f, &now, 100, 10, 0));
    /* The pacer is about to hold a launch back: this very batch takes the turn. */
    now += MS;
    CHECK(turnless_turn_needed(&f.t, &f.bucket, -1, now));
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
    turnless_turn_needed(&f.t, &f.bucket, 0, now);
    /* Light, but another process of the vGPU waited in the pacer. */
    CHECK(after(&f, &now, 100, 10, 1));
    CHECK(!after(&f, &now, 100, 10, 0));
}

static void test_heavy_use_keeps_turns(void)
{
    struct fixture f;
    reset(&f);
    uint64_t now = T0;
    turnless_turn_needed(&f.t, &f.bucket, 0, now);
    /* 30 % of the window is the bound: at it, turns. */
    CHECK(after(&f, &now, 100, 30, 0));
    CHECK(!after(&f, &now, 100, 29, 0));
    /* Its use grows (a decoder turned GPU-bound): turns from the next window. */
    CHECK(after(&f, &now, 100, 60, 0));
}

static void test_a_pause_says_nothing_of_the_work(void)
{
    struct fixture f;
    reset(&f);
    uint64_t now = T0;
    turnless_turn_needed(&f.t, &f.bucket, 0, now);
    CHECK(!after(&f, &now, 100, 10, 0));
    /* A minute idle, then GPU-bound: the minute does not make it light. */
    CHECK(after(&f, &now, 60000, 50, 0));
    CHECK(after(&f, &now, 100, 60, 0));
}

int main(void)
{
    test_turns_until_a_light_window_has_passed();
    test_a_share_that_binds_takes_turns_at_once();
    test_a_window_that_waited_keeps_turns();
    test_heavy_use_keeps_turns();
    test_a_pause_says_nothing_of_the_work();
    return check_report("test_turnless");
}
