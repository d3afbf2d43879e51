/*
 * gt_streams.c - stream states: the record a launch's stream uses. Explicit
 * streams are named by handle, the legacy stream by context, the
 * per-thread stream by context and thread; each thread caches its last few
 * lookups.
 */
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "gt_state.h"

static __thread struct {
    struct gt_stream *s;
    struct gt_key key;
} tcache[GT_CACHE];
static __thread unsigned tcache_next;
static __thread pid_t thread_id;

pid_t gt_current_tid(void)
{
    if (thread_id == 0)
        thread_id = (pid_t)syscall(SYS_gettid);
    return thread_id;
}


void gt_streams_forget_thread(void)
{
    memset(tcache, 0, sizeof(tcache));
    thread_id = 0;
}

static bool key_equal(const struct gt_key *a, const struct gt_key *b)
{
    return a->handle == b->handle && a->ctx == b->ctx && a->tid == b->tid;
}

/* The key of a launch's stream, and the handle to record our events on. */
static bool stream_key(CUstream h, bool ptsz, struct gt_key *key, CUstream *record_on)
{
    if (h == NULL)
        h = ptsz ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    *record_on = h;
    if (h != CU_STREAM_LEGACY && h != CU_STREAM_PER_THREAD) {
        *key = (struct gt_key){.handle = h};
        return true;
    }
    CUcontext ctx = NULL;
    if (vgpu_real_cuda.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL)
        return false;
    *key = (struct gt_key){.ctx = ctx, .tid = h == CU_STREAM_PER_THREAD ? gt_current_tid() : 0};
    return true;
}

static struct gt_stream *table_find(const struct gt_key *key)
{
    unsigned high = atomic_load_explicit(&gt.table_high, memory_order_acquire);
    for (unsigned i = 0; i < high; i++) {
        struct gt_stream *s = &gt.streams[i];
        if (atomic_load_explicit(&s->used, memory_order_acquire) && key_equal(&s->key, key))
            return s;
    }
    return NULL;
}

/* A new state for a stream of the current context; NULL if the stream's
 * device is not paced or the table is full (its launches go unmeasured). */
static struct gt_stream *table_add(const struct gt_key *key, CUstream record_on)
{
    CUcontext ctx = key->ctx;
    CUdevice dev;
    if (ctx == NULL && (vgpu_real_cuda.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL))
        return NULL;
    int index = devmap_current(&dev);
    if (index < 0 || index >= VGPU_MAX_DEVICES)
        return NULL;
    struct gt_stream *s = NULL;
    unsigned high = atomic_load_explicit(&gt.table_high, memory_order_relaxed);
    for (unsigned i = 0; i < high && s == NULL; i++)
        if (!atomic_load_explicit(&gt.streams[i].used, memory_order_relaxed))
            s = &gt.streams[i];
    if (s == NULL) {
        if (high == GT_STREAMS) {
            static bool reported;
            if (!reported)
                log_warn("more than %d streams: launches on new ones go unmeasured", GT_STREAMS);
            reported = true;
            return NULL;
        }
        s = &gt.streams[high];
        pthread_mutex_init(&s->lock, NULL);
        atomic_store_explicit(&gt.table_high, high + 1, memory_order_release);
    }
    s->key = *key;
    s->record_on = record_on;
    s->ctx = ctx;
    s->dev = index;
    s->open = NULL;
    s->last_size = 0;
    atomic_store(&s->graph_cost_ns, 0);
    atomic_store(&s->gated_cost_ns, 0);
    atomic_store(&s->gated_fresh_until_ns, 0);
    atomic_store(&s->proven_at_ns, 0);
    atomic_store(&s->renewals, 0);
    /* s->gates goes on from the slot's last stream: its word holds the last
     * value written, and a gate must be above it to shut. */
    atomic_store_explicit(&s->used, true, memory_order_release);
    return s;
}

/* The state of a launch's stream (created on first sight when `create`). */
struct gt_stream *gt_stream_get(CUstream h, bool ptsz, bool create)
{
    struct gt_key key;
    CUstream record_on;
    if (!stream_key(h, ptsz, &key, &record_on))
        return NULL;
    for (unsigned i = 0; i < GT_CACHE; i++) {
        struct gt_stream *s = tcache[i].s;
        if (s != NULL && key_equal(&tcache[i].key, &key) &&
            atomic_load_explicit(&s->used, memory_order_acquire) && key_equal(&s->key, &key))
            return s;
    }
    pthread_mutex_lock(&gt.table_lock);
    struct gt_stream *s = table_find(&key);
    if (s == NULL && create)
        s = table_add(&key, record_on);
    pthread_mutex_unlock(&gt.table_lock);
    if (s != NULL) {
        unsigned slot = tcache_next++ % GT_CACHE;
        tcache[slot].s = s;
        tcache[slot].key = key;
    }
    return s;
}

