/*
 * test_broker.c - the GPU turn between vGPUs: the daemon's broker
 * (atomics/vgpu_broker.c) and a vGPU's side of it (src/grant.c), on blocks
 * in plain memory shared by threads (shared futexes work alike within one
 * process). Two vGPUs on one GPU: one grant at a time, round robin; an idle
 * holder gives way; a holder that never lets go loses the turn by force and
 * sits out; a hostile request or stamp moves nothing of another vGPU's; no
 * broker, no wait.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../atomics/vgpu_broker.c"
#include "../src/arbiter.c"
#include "../src/grant.c"
#include "../src/pacer.c"

#include "check.h"

#define GPU "GPU-test-broker"

struct vgpu_blocks {
    struct vgpu_control control;
    struct vgpu_usage usage;
    struct grant_dev grant;
    int id;
};

static struct vgpu_blocks *vgpus[2];

static struct vgpu_blocks *enter(uint32_t quota_ppm)
{
    struct vgpu_blocks *v = calloc(1, sizeof(*v));
    v->control.device_count = 1;
    v->control.devices[0].throttle.quota_ppm = quota_ppm;
    v->grant = (struct grant_dev){&v->control.devices[0], &v->control.turn_beat_ns,
                                  &v->usage.devices[0].turn};
    v->id = vgpu_broker_add(GPU, &v->control, 0, &v->usage, 0);
    return v;
}

static void setup(void)
{
    vgpus[0] = enter(300000);
    vgpus[1] = enter(VGPU_PPM_FULL);
    CHECK(vgpus[0]->id >= 0 && vgpus[1]->id >= 0);
}

static void teardown(void)
{
    for (int i = 0; i < 2; i++) {
        vgpu_broker_remove(vgpus[i]->id);
        free(vgpus[i]);
    }
}

static uint32_t grant_of(int i)
{
    return atomic_load(&vgpus[i]->control.devices[0].turn_grant);
}

/* Bounded wait for a condition another thread brings about (no bare sleeps). */
#define AWAIT(cond) \
    do { \
        for (int n_ = 0; n_ < 5000 && !(cond); n_++) { \
            struct timespec ms_ = {0, 1000000}; \
            nanosleep(&ms_, NULL); \
        } \
    } while (0)

struct asker {
    pthread_t th;
    int vgpu;
    _Atomic uint32_t got; /* the grant id, once granted */
};

static void *ask(void *arg)
{
    struct asker *a = arg;
    atomic_store(&a->got, grant_acquire(&vgpus[a->vgpu]->grant, &pacer_monotonic));
    return NULL;
}

static void test_one_vgpu_at_a_time_in_turn(void)
{
    setup();
    uint32_t first = grant_acquire(&vgpus[0]->grant, &pacer_monotonic);
    CHECK(first > VGPU_TURN_WANT && grant_holds(&vgpus[0]->grant, first));
    CHECK(!grant_expired(&vgpus[0]->grant, pacer_monotonic.now(NULL))); /* nobody else waits */

    struct asker other = {.vgpu = 1};
    pthread_create(&other.th, NULL, ask, &other);
    /* The other asks: the holder's time is now bounded, the grant stays. */
    AWAIT(atomic_load(&vgpus[0]->control.devices[0].turn_until_ns) != 0);
    CHECK(atomic_load(&vgpus[0]->control.devices[0].turn_until_ns) != 0);
    CHECK(atomic_load(&other.got) == 0 && grant_of(1) == 0);
    CHECK(grant_holds(&vgpus[0]->grant, first));

    grant_release(&vgpus[0]->grant, false);
    pthread_join(other.th, NULL);
    CHECK(atomic_load(&other.got) > VGPU_TURN_WANT && atomic_load(&other.got) != first);
    CHECK(grant_of(0) == 0 && grant_holds(&vgpus[1]->grant, atomic_load(&other.got)));
    grant_release(&vgpus[1]->grant, false);
    teardown();
}

static void test_an_idle_holder_gives_way(void)
{
    setup();
    uint32_t first = grant_acquire(&vgpus[0]->grant, &pacer_monotonic);
    /* It said it is done, and nobody asked: it keeps the grant (the next
     * turn of its own costs nothing)... */
    grant_release(&vgpus[0]->grant, false);
    CHECK(grant_holds(&vgpus[0]->grant, first));
    /* ... until someone asks. */
    uint32_t second = grant_acquire(&vgpus[1]->grant, &pacer_monotonic);
    CHECK(second > VGPU_TURN_WANT && grant_of(0) == 0);
    grant_release(&vgpus[1]->grant, false);
    teardown();
}

/* A hostile vGPU echoes its grant for ever (it claims to be busy): the other
 * gets the turn all the same, past the holder's time and grace, and the
 * hostile one sits out its next turn while the other asks. */
static void test_a_holder_that_never_lets_go_loses_the_turn(void)
{
    setup();
    uint32_t hostile = grant_acquire(&vgpus[0]->grant, &pacer_monotonic);
    struct asker other = {.vgpu = 1};
    pthread_create(&other.th, NULL, ask, &other);
    pthread_join(other.th, NULL); /* bounded: TURN_HOLD_NS + TURN_REVOKE_GRACE_NS */
    CHECK(atomic_load(&other.got) > VGPU_TURN_WANT && grant_of(0) == 0);
    CHECK(!grant_holds(&vgpus[0]->grant, hostile));
    CHECK(vgpus[0]->usage.devices[0].turn.request == hostile); /* still claims it */
    /* The victim gives way; the hostile one asks: it owes its overstay, yet
     * it is the only one asking, so it is served. */
    grant_release(&vgpus[1]->grant, false);
    atomic_store(&vgpus[0]->usage.devices[0].turn.request, VGPU_TURN_WANT);
    wake_all(&vgpus[0]->usage.devices[0].turn.request);
    AWAIT(grant_of(0) != 0);
    CHECK(grant_of(0) != 0);
    teardown();
}

static uint64_t now_ms(void)
{
    return pacer_monotonic.now(NULL) / 1000000ull;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000l};
    nanosleep(&ts, NULL);
}

/* A holder whose batch, opened in its time, runs longer (a 300 ms graph)
 * says so (grant_overrun, as turn.c does when it opens the batch): the
 * broker leaves it the grant until the batch is done, rather than hand the
 * GPU to the other vGPU while the batch still runs (each would then measure
 * the other's work; before, it took the grant back 48 + 50 ms after the
 * other asked). */
static void test_a_long_batch_keeps_the_grant_until_it_ends(void)
{
    setup();
    uint32_t id = grant_acquire(&vgpus[0]->grant, &pacer_monotonic);
    uint64_t now = pacer_monotonic.now(NULL);
    grant_overrun(&vgpus[0]->grant, now + 2 * 300000000ull, now);
    CHECK(atomic_load(&vgpus[0]->usage.devices[0].turn.overrun_ms) == 600);
    struct asker other = {.vgpu = 1};
    pthread_create(&other.th, NULL, ask, &other);
    sleep_ms(250); /* well past its time and grace */
    CHECK(grant_holds(&vgpus[0]->grant, id) && atomic_load(&other.got) == 0);
    grant_release(&vgpus[0]->grant, false); /* the batch ended */
    CHECK(atomic_load(&vgpus[0]->usage.devices[0].turn.overrun_ms) == 0);
    pthread_join(other.th, NULL);
    CHECK(atomic_load(&other.got) > VGPU_TURN_WANT && grant_of(0) == 0);
    grant_release(&vgpus[1]->grant, false);
    teardown();
}

/* A hostile vGPU echoes its grant for ever and claims the longest batch
 * there is: the broker holds its revoke back at most BROKER_OVERRUN_CAP_NS
 * past the holder's time, and the holder, having spent its turn credit so,
 * gets no more than the grace in its next round. */
static void test_an_overrun_claim_is_capped_and_paid_for(void)
{
    setup();
    struct vgpu_turn *h = &vgpus[0]->usage.devices[0].turn; /* quota 30 % */
    uint32_t hostile = grant_acquire(&vgpus[0]->grant, &pacer_monotonic);
    atomic_store(&h->overrun_ms, UINT32_MAX);
    uint64_t asked = now_ms();
    uint32_t got = grant_acquire(&vgpus[1]->grant, &pacer_monotonic);
    uint64_t waited = now_ms() - asked;
    CHECK(got > VGPU_TURN_WANT && !grant_holds(&vgpus[0]->grant, hostile));
    /* Its claim was heard once, and cut to the cap. */
    CHECK(waited * 1000000ull > TURN_HOLD_NS + TURN_REVOKE_GRACE_NS + 100000000ull);
    CHECK(waited * 1000000ull < TURN_HOLD_NS + BROKER_OVERRUN_CAP_NS + 200000000ull);
    grant_release(&vgpus[1]->grant, false);

    /* It asks again, is served (nobody else asks), and holds on the same way. */
    atomic_store(&h->request, VGPU_TURN_WANT);
    wake_all(&h->request);
    AWAIT(grant_of(0) != 0);
    atomic_store(&h->request, grant_of(0));
    asked = now_ms();
    got = grant_acquire(&vgpus[1]->grant, &pacer_monotonic);
    waited = now_ms() - asked;
    CHECK(got > VGPU_TURN_WANT && grant_of(0) == 0);
    CHECK(waited * 1000000ull < TURN_HOLD_NS + TURN_REVOKE_GRACE_NS + 100000000ull);
    grant_release(&vgpus[1]->grant, false);
    teardown();
}

/* What a tenant writes in its turn reaches no other vGPU: garbage in its
 * request is a wish for the GPU and nothing more, a stamp from a vGPU whose
 * quota is 100 % paces nobody, and a far one is cut down. */
static void test_hostile_words_move_nothing_of_another_vgpu(void)
{
    setup();
    struct vgpu_turn *h = &vgpus[1]->usage.devices[0].turn; /* quota 100 % */
    atomic_store(&h->request, 0xffffffffu);
    atomic_store(&h->paced_until_ns, UINT64_MAX);
    atomic_store(&h->next, 0xdeadbeef);
    atomic_store(&h->serving, 7);
    atomic_store(&h->lease_ns, UINT64_MAX);
    wake_all(&h->request);
    AWAIT(grant_of(1) != 0);
    CHECK(atomic_load(&vgpus[0]->control.devices[0].paced_until_ns) == 0);
    /* The victim asks and gets the turn within the hostile one's grace. */
    uint32_t got = grant_acquire(&vgpus[0]->grant, &pacer_monotonic);
    CHECK(got > VGPU_TURN_WANT && grant_of(1) == 0);
    grant_release(&vgpus[0]->grant, false);

    /* A paced vGPU's stamp is published to every vGPU on the GPU, capped. */
    uint64_t now = pacer_monotonic.now(NULL);
    atomic_store(&vgpus[0]->usage.devices[0].turn.paced_until_ns, UINT64_MAX);
    wake_all(&vgpus[0]->usage.devices[0].turn.request);
    AWAIT(atomic_load(&vgpus[1]->control.devices[0].paced_until_ns) != 0);
    uint64_t stamp = atomic_load(&vgpus[1]->control.devices[0].paced_until_ns);
    CHECK(stamp > now && stamp <= pacer_monotonic.now(NULL) + BROKER_STAMP_CAP_NS);
    teardown();
}

static uint64_t published_to(int i)
{
    return atomic_load(&vgpus[i]->control.devices[0].paced_until_ns);
}

static void stamp(int i, uint64_t until)
{
    atomic_store(&vgpus[i]->usage.devices[0].turn.paced_until_ns, until);
    wake_all(&vgpus[i]->usage.devices[0].turn.request);
}

/* A vGPU is shown the other vGPUs' pacing, never its own: its processes
 * sample their gates only while no other tenant paces on the GPU, and a
 * stamp taken back (its pacer went turnless or exited) stops the others
 * taking turns at once rather than when it lapses. */
static void test_a_vgpu_sees_the_others_pacing_not_its_own(void)
{
    setup();
    atomic_store(&vgpus[1]->control.devices[0].throttle.quota_ppm, 500000);
    uint64_t now = pacer_monotonic.now(NULL);
    stamp(0, now + 800000000ull);
    AWAIT(published_to(1) != 0);
    CHECK(published_to(1) == now + 800000000ull);
    CHECK(published_to(0) == 0);

    stamp(1, now + 400000000ull); /* older than vGPU 0's, and still shown to it */
    AWAIT(published_to(0) != 0);
    CHECK(published_to(0) == now + 400000000ull);
    CHECK(published_to(1) == now + 800000000ull);

    stamp(0, 0);
    AWAIT(published_to(1) == 0);
    CHECK(published_to(1) == 0);
    CHECK(published_to(0) == now + 400000000ull);
    teardown();
}

/* A vGPU whose asking process died (it asks and never takes the turn up)
 * costs the others one hand-off grace, not one per turn: once passed over,
 * its unchanged request is not heard for a while, so a vGPU that gives
 * the GPU back and asks again keeps its grant. */
static void test_a_dead_asker_is_not_heard_again_at_once(void)
{
    setup();
    atomic_store(&vgpus[0]->usage.devices[0].turn.request, VGPU_TURN_WANT); /* then died */
    wake_all(&vgpus[0]->usage.devices[0].turn.request);
    AWAIT(grant_of(0) != 0);
    uint32_t got = grant_acquire(&vgpus[1]->grant, &pacer_monotonic); /* after its grace */
    CHECK(got > VGPU_TURN_WANT && grant_of(0) == 0);
    grant_release(&vgpus[1]->grant, false);
    uint32_t again = grant_acquire(&vgpus[1]->grant, &pacer_monotonic);
    CHECK(again == got && grant_of(0) == 0);
    grant_release(&vgpus[1]->grant, false);
    teardown();
}

/* How many times the broker beat in `ms` milliseconds, looked at every
 * millisecond. */
static int beats_in(int ms)
{
    uint64_t last = atomic_load(&vgpus[0]->control.turn_beat_ns);
    int beats = 0;
    for (int i = 0; i < ms; i++) {
        struct timespec t = {0, 1000000};
        nanosleep(&t, NULL);
        uint64_t beat = atomic_load(&vgpus[0]->control.turn_beat_ns);
        beats += beat != last;
        last = beat;
    }
    return beats;
}

/* While nothing goes on at its GPUs the broker looks four times a second,
 * not twenty (each look costs an idle node's daemon), and still hears a
 * request at once; a vGPU that paces brings the twenty looks back. */
static void test_an_idle_broker_looks_seldom_and_hears_a_request_at_once(void)
{
    setup();
    int idle = beats_in(1000);
    CHECK(idle >= 2 && idle <= 5);

    uint64_t asked = pacer_monotonic.now(NULL);
    uint32_t got = grant_acquire(&vgpus[0]->grant, &pacer_monotonic);
    CHECK(got > VGPU_TURN_WANT);
    CHECK(pacer_monotonic.now(NULL) - asked < BROKER_PERIOD_NS); /* no idle period's wait */
    grant_release(&vgpus[0]->grant, false);

    /* A stamp, written as a pacing hook writes it (no wake). */
    uint64_t now = pacer_monotonic.now(NULL);
    atomic_store(&vgpus[0]->usage.devices[0].turn.paced_until_ns, now + 3000000000ull);
    AWAIT(published_to(1) != 0);
    CHECK(published_to(1) != 0);
    CHECK(beats_in(1000) >= 10);

    stamp(0, 0);
    AWAIT(published_to(1) == 0);
    CHECK(beats_in(1000) <= 5);
    teardown();
}

struct waker {
    pthread_t th;
    _Atomic uint32_t *word;
    _Atomic bool stop;
};

static void *wake_for_ever(void *arg)
{
    struct waker *k = arg;
    while (!atomic_load(&k->stop))
        wake_all(k->word);
    return NULL;
}

static uint64_t thread_cpu_ns(pthread_t th)
{
    clockid_t clock;
    struct timespec ts;
    if (pthread_getcpuclockid(th, &clock) != 0 || clock_gettime(clock, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A tenant calls FUTEX_WAKE on its own request word in a loop without
 * changing it (anyone who maps a word may wake it): each wake used to make
 * the broker look again, a core of the daemon's for as long as the tenant
 * liked. Such wakes now count as changes do, and past its wakes of the
 * period the vGPU is not slept on; the other vGPU is still heard at once. */
static void test_wakes_without_a_change_cost_the_broker_little(void)
{
    setup();
    struct waker k = {.word = &vgpus[1]->usage.devices[0].turn.request};
    uint64_t cpu = thread_cpu_ns(broker.thread);
    uint64_t start = pacer_monotonic.now(NULL);
    pthread_create(&k.th, NULL, wake_for_ever, &k);
    sleep_ms(300);
    uint64_t asked = pacer_monotonic.now(NULL);
    uint32_t got = grant_acquire(&vgpus[0]->grant, &pacer_monotonic);
    uint64_t answered = pacer_monotonic.now(NULL);
    sleep_ms(200);
    atomic_store(&k.stop, true);
    pthread_join(k.th, NULL);
    uint64_t spent = thread_cpu_ns(broker.thread) - cpu, wall = pacer_monotonic.now(NULL) - start;
    CHECK(got > VGPU_TURN_WANT);
    CHECK(answered - asked < BROKER_LOOK_GAP_NS + 5000000ull); /* heard at once, or nearly */
    /* Unbounded, the broker spent 45-100 % of the wall here (one to a
     * hundred vGPUs); bounded, ~2000 cheap looks a second. */
    CHECK(spent * 20 < wall);
    grant_release(&vgpus[0]->grant, false);
    teardown();
}

/* Many hostile vGPUs, each within its own wakes of the period, together
 * still wake the broker at most BROKER_LOOKS_PER_PERIOD times a period at
 * once, then once every BROKER_LOOK_GAP_NS: the looks of any period stay
 * bounded however many vGPUs wake it. */
static void test_many_waking_vgpus_get_a_bounded_number_of_looks(void)
{
    enum { HOSTILE = 6 };
    setup();
    struct vgpu_blocks *hostile[HOSTILE];
    struct waker k[HOSTILE];
    for (int i = 0; i < HOSTILE; i++) {
        hostile[i] = enter(300000);
        k[i] = (struct waker){.word = &hostile[i]->usage.devices[0].turn.request};
        pthread_create(&k[i].th, NULL, wake_for_ever, &k[i]);
    }
    unsigned most = 0;
    for (int ms = 0; ms < 400; ms++) {
        sleep_ms(1);
        pthread_mutex_lock(&broker.lock);
        if (broker.looks > most)
            most = broker.looks;
        pthread_mutex_unlock(&broker.lock);
    }
    for (int i = 0; i < HOSTILE; i++) {
        atomic_store(&k[i].stop, true);
        pthread_join(k[i].th, NULL);
        vgpu_broker_remove(hostile[i]->id);
        free(hostile[i]);
    }
    /* Each alone may wake it BROKER_WAKES_PER_PERIOD times a period: six,
     * 600 looks, were they all answered at once. */
    CHECK(most > 0);
    CHECK(most <= BROKER_LOOKS_PER_PERIOD + BROKER_PERIOD_NS / BROKER_LOOK_GAP_NS + 2);
    teardown();
}

/* The daemon remakes a usage block its tenant cut short (registry.py,
 * repair_lost_usage): the broker's account of the vGPU goes on with the new
 * block. Entered afresh, it started with a full turn credit, so a tenant
 * that overstayed, truncated its block and asked again at every scan held
 * the GPU far past its quota plus the slack (a hostile vGPU at 70 % held
 * the grant 95.7 % of the time against 83.6 %). */
static void test_a_remade_usage_block_keeps_the_vgpus_turn_credit(void)
{
    setup();
    uint32_t hostile = grant_acquire(&vgpus[0]->grant, &pacer_monotonic);
    CHECK(hostile > VGPU_TURN_WANT);
    pthread_mutex_lock(&broker.lock);
    broker.members[vgpus[0]->id].credit_ns = -1000000000ll; /* it overstayed by a second */
    pthread_mutex_unlock(&broker.lock);

    struct vgpu_usage *remade = calloc(1, sizeof(*remade));
    CHECK(vgpu_broker_rebind(vgpus[0]->id, remade) == 0);
    CHECK(grant_of(0) == 0); /* its grant ended with the old block */
    pthread_mutex_lock(&broker.lock);
    int64_t credit = broker.members[vgpus[0]->id].credit_ns;
    struct vgpu_turn *watched = broker.members[vgpus[0]->id].turn;
    pthread_mutex_unlock(&broker.lock);
    CHECK(credit < -900000000ll);
    CHECK(watched == &remade->devices[0].turn);
    CHECK(vgpu_broker_rebind(BROKER_MEMBERS, remade) == -1);

    /* The new block is heard: its vGPU asks and is granted the turn. */
    vgpus[0]->grant.turn = &remade->devices[0].turn;
    uint32_t got = grant_acquire(&vgpus[0]->grant, &pacer_monotonic);
    CHECK(got > VGPU_TURN_WANT && got != hostile);
    grant_release(&vgpus[0]->grant, false);
    teardown();
    free(remade);
}

static void test_with_no_broker_nobody_waits(void)
{
    struct vgpu_blocks *v = calloc(1, sizeof(*v));
    v->control.device_count = 1;
    v->grant = (struct grant_dev){&v->control.devices[0], &v->control.turn_beat_ns,
                                  &v->usage.devices[0].turn};
    /* Never beaten (no daemon), then a beat gone stale (daemon stopped). */
    CHECK(grant_acquire(&v->grant, &pacer_monotonic) == 0);
    atomic_store(&v->control.turn_beat_ns,
                 pacer_monotonic.now(NULL) - GRANT_BROKER_STALE_NS - 1);
    CHECK(grant_acquire(&v->grant, &pacer_monotonic) == 0);
    CHECK(atomic_load(&v->usage.devices[0].turn.request) == 0);
    free(v);
}

int main(void)
{
    test_one_vgpu_at_a_time_in_turn();
    test_an_idle_holder_gives_way();
    test_a_holder_that_never_lets_go_loses_the_turn();
    test_a_long_batch_keeps_the_grant_until_it_ends();
    test_an_overrun_claim_is_capped_and_paid_for();
    test_hostile_words_move_nothing_of_another_vgpu();
    test_a_vgpu_sees_the_others_pacing_not_its_own();
    test_a_dead_asker_is_not_heard_again_at_once();
    test_an_idle_broker_looks_seldom_and_hears_a_request_at_once();
    test_wakes_without_a_change_cost_the_broker_little();
    test_many_waking_vgpus_get_a_bounded_number_of_looks();
    test_a_remade_usage_block_keeps_the_vgpus_turn_credit();
    test_with_no_broker_nobody_waits();
    vgpu_broker_stop();
    return check_report("test_broker");
}
