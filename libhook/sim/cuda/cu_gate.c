/*
 * cu_gate.c - held streams: work queued behind a stream wait that is not
 * yet satisfied (cuStreamWaitValue32/64 on a word another party writes,
 * cuStreamWaitEvent on an event a held stream has still to reach).
 *
 * On a GPU the stream's front end stalls at the wait. Here a held stream
 * keeps what is queued on it, in order, instead of placing it on the
 * device timeline. Nothing in the simulator runs by itself, so the host
 * words are looked at lazily: by every call that touches a stream, an
 * event or a context (cu_gates_poll), and every CU_GATE_POLL_NS by the
 * calls that block. What a wait releases then runs through the same engine
 * from the release time (or the stream's tail, if later), so a held batch
 * is timed and shared like any other work.
 *
 * Work on the legacy stream also waits for what blocking streams of its
 * context hold, and theirs for what the legacy stream holds, as the legacy
 * stream synchronises with them: an internal event recorded on the held
 * side and waited on by the other.
 *
 * One process-wide lock guards the queues; a count of held streams lets
 * every call skip it while nothing is held. Lock order: a device's lock,
 * then the gate lock, then cu_lock or a device's run lock.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cu_sim.h"

struct cu_held_work {
    struct cu_held_work *next;
    struct cu_work work;
};

static pthread_mutex_t gate_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int held_count;        /* streams on held_list */
static struct CUstream_st *held_list; /* (gate_lock) */

#define WAIT_OP_MASK 0x3u

static void nap(void)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = CU_GATE_POLL_NS};
    nanosleep(&ts, NULL);
}

/* ---- the memory operations ---- */

static uint64_t load_word(const struct cu_work *w)
{
    if (w->mem.wide)
        return __atomic_load_n((const uint64_t *)w->mem.addr, __ATOMIC_ACQUIRE);
    return __atomic_load_n((const uint32_t *)w->mem.addr, __ATOMIC_ACQUIRE);
}

/* The driver's conditions: GEQ is cyclic ((int32_t)(*addr - value) >= 0),
 * so a sequence number may wrap. Memory freed under a wait holds nothing. */
static bool value_satisfied(const struct cu_work *w)
{
    if (!cu_range_known(w->mem.addr, w->mem.wide ? 8 : 4))
        return true;
    uint64_t word = load_word(w), value = w->mem.value;
    uint64_t mask = w->mem.wide ? UINT64_MAX : UINT32_MAX;
    switch (w->mem.flags & WAIT_OP_MASK) {
    case CU_STREAM_WAIT_VALUE_GEQ:
        return w->mem.wide ? (int64_t)(word - value) >= 0 : (int32_t)(uint32_t)(word - value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ:
        return word == value;
    case CU_STREAM_WAIT_VALUE_AND:
        return (word & value) != 0;
    default: /* NOR */
        return (~(word | value) & mask) != 0;
    }
}

static void write_value(const struct cu_work *w)
{
    if (!cu_range_known(w->mem.addr, w->mem.wide ? 8 : 4))
        return;
    if (w->mem.wide)
        __atomic_store_n((uint64_t *)w->mem.addr, w->mem.value, __ATOMIC_RELEASE);
    else
        __atomic_store_n((uint32_t *)w->mem.addr, (uint32_t)w->mem.value, __ATOMIC_RELEASE);
}

static void copy_now(const struct cu_work *w)
{
    const struct cu_work *c = w;
    if ((c->copy.dst_known && !cu_range_known(c->copy.dst, c->copy.n)) ||
        (c->copy.src_known && c->copy.owned == NULL && !cu_range_known(c->copy.src, c->copy.n)))
        return; /* freed while it waited: a GPU would fault, the simulator skips it */
    memmove((void *)c->copy.dst, (const void *)c->copy.src, c->copy.n);
}

/* ---- events ---- */

static void event_unref(CUevent e)
{
    if (--e->refs == 0)
        free(e);
}

static void stamp(CUevent e, CUstream s, bool held)
{
    /* Stamped when its stream reaches it, not when the device does: as on a
     * GPU that time-slices contexts, a pair of events around a process's
     * work also spans the other contexts' work that runs between them. */
    uint64_t t = sim_now(), tail = atomic_load(&s->tail);
    /* But a record that waited in the queue (behind a gate) on a stream
     * with nothing left to run is stamped when the device could next run
     * the stream's work: an H200 stamps a start event when its context
     * runs, so a gated pair does not count the wait for another context's
     * queued work before it (benchmarks/pair_probe.cu). Not where the
     * stream's last work was a copy (a token read back): there the H200
     * stamps it at once, and the pair counts the other context's time
     * slice, unless a kernel (the hook's touch) runs between the copy and
     * the record. */
    if (held && tail <= t && !atomic_load(&s->after_copy)) {
        uint64_t busy = cu_device_busy_until(s);
        if (busy > t)
            t = busy;
    }
    if (tail > t)
        t = tail;
    atomic_store(&e->time, t);
    atomic_store(&e->pending, false);
}

void cu_event_free(CUevent e)
{
    pthread_mutex_lock(&gate_lock);
    e->tag = CU_TAG_DEAD;
    event_unref(e);
    pthread_mutex_unlock(&gate_lock);
}

/* ---- running work ---- */

/* Work the stream has reached: `held` when it waited in the queue. */
static void run(CUstream s, const struct cu_work *w, bool held)
{
    switch (w->kind) {
    case CU_WORK_KERNEL:
        cu_kernel_execute(s, &w->kernel);
        atomic_store(&s->after_copy, false);
        break;
    case CU_WORK_COPY:
        copy_now(w);
        atomic_store(&s->after_copy, true);
        break;
    case CU_WORK_RECORD:
        if (!held) {
            atomic_fetch_add(&w->event.event->gen, 1);
            stamp(w->event.event, s, false);
            atomic_store(&w->event.event->recorded, true);
        } else if (atomic_load(&w->event.event->gen) == w->event.gen) {
            stamp(w->event.event, s, true);
        }
        break;
    case CU_WORK_WAIT_EVENT:
        cu_store_max(&s->tail, atomic_load(&w->event.event->time));
        break;
    case CU_WORK_WAIT_VALUE:
        cu_store_max(&s->tail, sim_now()); /* released now: what follows starts no earlier */
        break;
    case CU_WORK_WRITE_VALUE:
        write_value(w);
        break;
    }
}

/* What a held item leaves behind once run or dropped. */
static void retire(struct cu_held_work *h)
{
    struct cu_work *w = &h->work;
    if (w->kind == CU_WORK_COPY)
        free(w->copy.owned);
    if (w->kind == CU_WORK_RECORD || w->kind == CU_WORK_WAIT_EVENT)
        event_unref(w->event.event);
    free(h);
}

static bool ready(const struct cu_work *w)
{
    if (w->kind == CU_WORK_WAIT_VALUE)
        return value_satisfied(w);
    if (w->kind == CU_WORK_WAIT_EVENT)
        return !atomic_load(&w->event.event->pending);
    return true;
}

static void unlist(struct CUstream_st **link)
{
    CUstream s = *link;
    *link = s->held_next;
    s->held_next = NULL;
    s->held_last = NULL;
    atomic_store(&s->is_held, false);
    atomic_fetch_sub(&held_count, 1);
    if (s->destroyed)
        free(s);
}

/* Run the stream's held work up to its first unsatisfied wait. */
static bool advance(CUstream s)
{
    bool moved = false;
    while (s->held != NULL && ready(&s->held->work)) {
        struct cu_held_work *h = s->held;
        s->held = h->next;
        run(s, &h->work, true);
        retire(h);
        moved = true;
    }
    return moved;
}

/* Until nothing moves: a record released on one stream may release a wait
 * on another, a write may satisfy any wait. */
static void release_all(void)
{
    bool moved = true;
    while (moved) {
        moved = false;
        for (struct CUstream_st **link = &held_list; *link != NULL;) {
            moved |= advance(*link);
            if ((*link)->held == NULL)
                unlist(link);
            else
                link = &(*link)->held_next;
        }
    }
}

/* ---- holding work ---- */

static CUresult hold(CUstream s, const struct cu_work *w)
{
    struct cu_held_work *h = malloc(sizeof(*h));
    if (h == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    h->next = NULL;
    h->work = *w;
    struct cu_work *held = &h->work;
    if (held->kind == CU_WORK_COPY && held->copy.stage) {
        /* A pageable source is staged when the call returns, as the driver does. */
        if ((held->copy.owned = malloc(held->copy.n)) == NULL) {
            free(h);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        memcpy(held->copy.owned, (const void *)held->copy.src, held->copy.n);
        held->copy.src = (uintptr_t)held->copy.owned;
    }
    if (held->kind == CU_WORK_RECORD) {
        CUevent e = held->event.event;
        held->event.gen = atomic_fetch_add(&e->gen, 1) + 1;
        atomic_store(&e->pending, true);
        atomic_store(&e->recorded, true);
    }
    if (held->kind == CU_WORK_RECORD || held->kind == CU_WORK_WAIT_EVENT)
        held->event.event->refs++;
    if (s->held == NULL) {
        s->held = h;
        s->held_next = held_list;
        held_list = s;
        atomic_store(&s->is_held, true);
        atomic_fetch_add(&held_count, 1);
    } else {
        s->held_last->next = h;
    }
    s->held_last = h;
    return CUDA_SUCCESS;
}

/* Streams the legacy stream synchronises with: those of its context
 * created without CU_STREAM_NON_BLOCKING (per-thread streams included). */
static bool syncs_with_legacy(CUstream s)
{
    return s != &s->ctx->legacy && s->flags == CU_STREAM_DEFAULT;
}

/* Before work on s: s waits for what the streams it synchronises with
 * hold now, through an internal event recorded at their end. */
static CUresult wait_for_held_peers(CUstream s)
{
    bool legacy = s == &s->ctx->legacy;
    if (!legacy && !syncs_with_legacy(s))
        return CUDA_SUCCESS;
    for (CUstream x = held_list; x != NULL; x = x->held_next) {
        if (x == s || x->ctx != s->ctx || x->held == NULL)
            continue;
        if (legacy ? !syncs_with_legacy(x) : x != &s->ctx->legacy)
            continue;
        CUevent marker = calloc(1, sizeof(*marker));
        if (marker == NULL)
            return CUDA_ERROR_OUT_OF_MEMORY;
        marker->tag = CU_TAG_EVENT;
        CUresult r = hold(x, &(struct cu_work){.kind = CU_WORK_RECORD, .event = {.event = marker}});
        if (r != CUDA_SUCCESS) {
            free(marker);
            return r;
        }
        r = hold(s, &(struct cu_work){.kind = CU_WORK_WAIT_EVENT, .event = {.event = marker}});
        if (r != CUDA_SUCCESS)
            return r; /* the marker goes with the record that names it */
    }
    return CUDA_SUCCESS;
}

CUresult cu_stream_submit(CUstream s, const struct cu_work *w)
{
    if (atomic_load(&held_count) == 0 && ready(w)) {
        run(s, w, false);
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&gate_lock);
    release_all();
    CUresult r = wait_for_held_peers(s);
    if (r == CUDA_SUCCESS) {
        if (s->held != NULL || !ready(w))
            r = hold(s, w);
        else
            run(s, w, false);
    }
    if (w->kind == CU_WORK_WRITE_VALUE || w->kind == CU_WORK_RECORD)
        release_all(); /* it may be what another stream waits for */
    pthread_mutex_unlock(&gate_lock);
    return r;
}

void cu_gates_poll(void)
{
    if (atomic_load(&held_count) == 0)
        return;
    pthread_mutex_lock(&gate_lock);
    release_all();
    pthread_mutex_unlock(&gate_lock);
}

bool cu_stream_held(CUstream s)
{
    return atomic_load(&s->is_held);
}

void cu_stream_wait_released(CUstream s)
{
    for (cu_gates_poll(); atomic_load(&s->is_held); cu_gates_poll())
        nap();
}

static bool ctx_holds(CUcontext ctx, bool blocking_only)
{
    for (CUstream x = held_list; x != NULL; x = x->held_next)
        if (x->ctx == ctx && (!blocking_only || x == &ctx->legacy || syncs_with_legacy(x)))
            return true;
    return false;
}

void cu_ctx_wait_released(CUcontext ctx, bool blocking_only)
{
    while (atomic_load(&held_count) != 0) {
        pthread_mutex_lock(&gate_lock);
        release_all();
        bool holds = ctx_holds(ctx, blocking_only);
        pthread_mutex_unlock(&gate_lock);
        if (!holds)
            return;
        nap();
    }
}

void cu_event_wait_stamped(CUevent e)
{
    for (cu_gates_poll(); atomic_load(&e->pending); cu_gates_poll())
        nap();
}

void cu_ctx_drop_held(CUcontext ctx)
{
    if (atomic_load(&held_count) == 0)
        return;
    pthread_mutex_lock(&gate_lock);
    for (struct CUstream_st **link = &held_list; *link != NULL;) {
        CUstream s = *link;
        if (s->ctx != ctx) {
            link = &s->held_next;
            continue;
        }
        while (s->held != NULL) {
            struct cu_held_work *h = s->held;
            s->held = h->next;
            if (h->work.kind == CU_WORK_RECORD && atomic_load(&h->work.event.event->gen) == h->work.event.gen)
                stamp(h->work.event.event, s, false); /* the context's end completes it */
            retire(h);
        }
        unlist(link);
    }
    pthread_mutex_unlock(&gate_lock); /* what the stamps release runs at the next poll */
}

void cu_gates_forget(void)
{
    pthread_mutex_init(&gate_lock, NULL);
    held_list = NULL;
    atomic_store(&held_count, 0);
}

void cu_stream_free(CUstream s)
{
    pthread_mutex_lock(&gate_lock);
    s->tag = CU_TAG_DEAD;
    if (s->held != NULL)
        s->destroyed = true; /* the driver returns at once; the work still runs */
    else
        free(s);
    pthread_mutex_unlock(&gate_lock);
}
