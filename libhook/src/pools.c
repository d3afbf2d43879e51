/*
 * pools.c - accounting for memory pools (stream-ordered allocation and graph
 * memory), whose freed memory stays on the device until the pool releases
 * it. Freed bytes move from "live" to "held" and stay charged; a later
 * allocation from the same pool reuses held bytes before reserving more;
 * held bytes go back to the budget when the pool is trimmed or destroyed,
 * or when the driver says the pool reserves less than we charge (asked
 * before an allocation is refused, so a pool that released memory at a
 * synchronisation, as the default pool does, never causes a false refusal).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "vgpu.h"

/* CUmemPool_attribute: bytes of device memory the pool holds now. */
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5
/* The table grows on demand: a pool left untracked would have its freed
 * bytes given back while the driver still holds them. */
#define INITIAL_POOLS 64

struct pool_state {
    bool in_use;
    CUmemoryPool pool; /* NULL: the graph memory pool of `index` */
    int index;
    uint64_t live; /* bytes of allocations not freed yet */
    uint64_t held; /* freed bytes the pool may still hold */
    bool destroyed; /* destroyed with allocations outstanding */
};

static struct pool_state *pools;
static size_t pool_count; /* entries of `pools` */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static struct pool_state *find(CUmemoryPool pool, int index, bool add)
{
    struct pool_state *spare = NULL;
    for (size_t i = 0; i < pool_count; i++) {
        struct pool_state *p = &pools[i];
        if (p->in_use && !p->destroyed && p->pool == pool && p->index == index)
            return p;
        if (!p->in_use && spare == NULL)
            spare = p;
    }
    if (add && spare == NULL) {
        size_t count = pool_count ? pool_count * 2 : INITIAL_POOLS;
        struct pool_state *grown = realloc(pools, count * sizeof(*grown));
        if (grown == NULL)
            return NULL; /* out of host memory: plain accounting */
        memset(grown + pool_count, 0, (count - pool_count) * sizeof(*grown));
        spare = grown + pool_count;
        pools = grown;
        pool_count = count;
    }
    if (!add || spare == NULL)
        return NULL;
    *spare = (struct pool_state){.in_use = true, .pool = pool, .index = index};
    return spare;
}

/* The pool an allocation of `pool` is freed into: one destroyed with
 * allocations outstanding comes first, since a pool created later may have
 * been given the same handle. */
static struct pool_state *find_freed_into(CUmemoryPool pool, int index)
{
    for (size_t i = 0; i < pool_count; i++) {
        struct pool_state *p = &pools[i];
        if (p->in_use && p->destroyed && p->live > 0 && p->pool == pool && p->index == index)
            return p;
    }
    return find(pool, index, false);
}

/* Give back held bytes beyond `keep_held`. Called with the lock held. */
static uint64_t release_held(struct pool_state *p, uint64_t keep_held)
{
    if (p->held <= keep_held)
        return 0;
    uint64_t bytes = p->held - keep_held;
    p->held = keep_held;
    budget_release(p->index, bytes);
    return bytes;
}

uint64_t pools_take(CUmemoryPool pool, int index, uint64_t bytes)
{
    uint64_t reused = 0;
    pthread_mutex_lock(&lock);
    struct pool_state *p = find(pool, index, true);
    if (p != NULL) {
        reused = p->held < bytes ? p->held : bytes;
        p->held -= reused;
        p->live += bytes;
    }
    pthread_mutex_unlock(&lock);
    return reused;
}

void pools_untake(CUmemoryPool pool, int index, uint64_t bytes, uint64_t reused)
{
    pthread_mutex_lock(&lock);
    struct pool_state *p = find(pool, index, false);
    if (p != NULL) {
        p->live -= bytes < p->live ? bytes : p->live;
        p->held += reused;
    }
    pthread_mutex_unlock(&lock);
}

void pools_hold(CUmemoryPool pool, int index, uint64_t bytes)
{
    pthread_mutex_lock(&lock);
    struct pool_state *p = find_freed_into(pool, index);
    if (p != NULL) {
        p->live -= bytes < p->live ? bytes : p->live;
        p->held += bytes;
    }
    pthread_mutex_unlock(&lock);
    /* A pool we could not track (table full): plain accounting. */
    if (p == NULL)
        budget_release(index, bytes);
}

/* What the driver says the pool reserves, or -1 if it cannot say. */
static int reserved_now(CUmemoryPool pool, uint64_t *bytes)
{
    cuuint64_t value = 0;
    if (pool == NULL || vgpu_real_cuda.cuMemPoolGetAttribute == NULL ||
        vgpu_real_cuda.cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                                             &value) != CUDA_SUCCESS)
        return -1;
    *bytes = value;
    return 0;
}

void pools_unhold(CUmemoryPool pool, int index, uint64_t bytes)
{
    pthread_mutex_lock(&lock);
    struct pool_state *p = find(pool, index, false);
    if (p != NULL)
        release_held(p, p->held > bytes ? p->held - bytes : 0);
    pthread_mutex_unlock(&lock);
}

void pools_trimmed(CUmemoryPool pool, int index, uint64_t keep)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < pool_count; i++) {
        struct pool_state *p = &pools[i];
        if (!p->in_use || p->pool != pool || (pool == NULL && p->index != index))
            continue;
        uint64_t reserved;
        if (reserved_now(pool, &reserved) != 0)
            reserved = keep; /* the trim's own promise: at most keep, or what is live */
        release_held(p, reserved > p->live ? reserved - p->live : 0);
    }
    pthread_mutex_unlock(&lock);
}

void pools_destroyed(CUmemoryPool pool)
{
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < pool_count; i++) {
        struct pool_state *p = &pools[i];
        if (!p->in_use || p->destroyed || p->pool != pool)
            continue;
        release_held(p, 0);
        /* Allocations still live keep the pool's memory on the device after
         * it is destroyed, and so does what is freed into it later: on an
         * H100 (driver 580) it was still there after later allocations and
         * graph work. Those bytes stay charged, held by the destroyed pool,
         * for the process's life: the handle cannot be asked any more. */
        p->destroyed = true;
        if (p->live == 0)
            p->in_use = false;
    }
    pthread_mutex_unlock(&lock);
}

int pools_settle_all(void)
{
    int settled = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < pool_count; i++) {
        struct pool_state *p = &pools[i];
        uint64_t reserved;
        if (!p->in_use || p->destroyed || p->held == 0 || reserved_now(p->pool, &reserved) != 0)
            continue;
        if (release_held(p, reserved > p->live ? reserved - p->live : 0) != 0)
            settled++;
    }
    pthread_mutex_unlock(&lock);
    return settled;
}

uint64_t pools_held(int index)
{
    uint64_t bytes = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < pool_count; i++)
        if (pools[i].in_use && pools[i].index == index)
            bytes += pools[i].held;
    pthread_mutex_unlock(&lock);
    return bytes;
}

void pools_reset(void)
{
    pthread_mutex_init(&lock, NULL);
    free(pools);
    pools = NULL;
    pool_count = 0;
}
