/*
 * allocmap.c - this process's allocations: key -> {size, device, kind}.
 *
 * One open-addressing hash table per key space (device pointers, VMM
 * handles, arrays, VMM mappings, context limits), under one in-process mutex: a free must find exactly
 * what its allocation charged, and only this process's threads touch it.
 * Tombstones keep probe chains intact; the table doubles at 1/2 load
 * (counting tombstones) and starts small.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "vgpu.h"

enum slot_state { SLOT_EMPTY = 0, SLOT_FULL, SLOT_TOMB };

struct entry {
    uint64_t key;
    enum slot_state state;
    struct alloc_info info;
};

struct table {
    struct entry *entries;
    size_t capacity; /* power of two */
    size_t occupied; /* full + tombstones */
};

static struct table tables[SPACE_COUNT];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* Device-resident bytes this process holds per device (no host-backed). */
static uint64_t tracked[VGPU_MAX_DEVICES];

#define INITIAL_CAPACITY 256

static size_t hash(uint64_t key, size_t capacity)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & (capacity - 1);
}

static struct entry *find(struct table *t, uint64_t key)
{
    if (t->capacity == 0)
        return NULL;
    for (size_t i = hash(key, t->capacity);; i = (i + 1) & (t->capacity - 1)) {
        struct entry *e = &t->entries[i];
        if (e->state == SLOT_EMPTY)
            return NULL;
        if (e->state == SLOT_FULL && e->key == key)
            return e;
    }
}

static void insert(struct table *t, uint64_t key, const struct alloc_info *info)
{
    size_t i = hash(key, t->capacity);
    while (t->entries[i].state == SLOT_FULL)
        i = (i + 1) & (t->capacity - 1);
    if (t->entries[i].state == SLOT_EMPTY)
        t->occupied++;
    t->entries[i] = (struct entry){.key = key, .state = SLOT_FULL, .info = *info};
}

static int grow(struct table *t)
{
    size_t capacity = t->capacity ? t->capacity * 2 : INITIAL_CAPACITY;
    struct entry *old = t->entries;
    size_t old_capacity = t->capacity;
    struct entry *fresh = calloc(capacity, sizeof(*fresh));
    if (fresh == NULL) {
        vgpu_error_set("allocation map: out of host memory");
        return -1;
    }
    t->entries = fresh;
    t->capacity = capacity;
    t->occupied = 0;
    for (size_t i = 0; i < old_capacity; i++)
        if (old[i].state == SLOT_FULL)
            insert(t, old[i].key, &old[i].info);
    free(old);
    return 0;
}

/* Memos (a mapping, a pool's home, a graph freed or run) charge nothing. */
static bool memo(const struct alloc_info *info)
{
    return info->kind == ALLOC_MAPPING || info->kind == ALLOC_POOL ||
           info->kind == ALLOC_GRAPH_FREED || info->kind == ALLOC_GRAPH_MARK;
}

/* Host memory and memos are not device memory this process holds. */
static bool device_resident(const struct alloc_info *info)
{
    return info->kind != ALLOC_HOST_BACKED && !memo(info) && info->index >= 0;
}

int allocmap_put(enum alloc_space space, uint64_t key, const struct alloc_info *info)
{
    struct table *t = &tables[space];
    int rc = -1;
    pthread_mutex_lock(&lock);
    if ((t->occupied + 1) * 2 > t->capacity && grow(t) != 0)
        goto out;
    struct entry *e = find(t, key);
    if (e != NULL) {
        /* The driver reused an address we never saw freed: the old entry is
         * stale. Give its bytes back before recording the new one. */
        if (device_resident(&e->info))
            tracked[e->info.index] -= e->info.size;
        if (!memo(&e->info))
            budget_release(e->info.index, e->info.size);
        e->state = SLOT_TOMB;
    }
    insert(t, key, info);
    if (device_resident(info))
        tracked[info->index] += info->size;
    rc = 0;
out:
    pthread_mutex_unlock(&lock);
    return rc;
}

/* Remove a full entry, returning its info. Lock held. */
static void remove_entry(struct entry *e, struct alloc_info *out)
{
    if (out != NULL)
        *out = e->info;
    e->state = SLOT_TOMB;
    if (device_resident(&e->info))
        tracked[e->info.index] -= e->info.size;
}

int allocmap_take(enum alloc_space space, uint64_t key, struct alloc_info *out)
{
    int rc = -1;
    pthread_mutex_lock(&lock);
    struct entry *e = find(&tables[space], key);
    if (e != NULL) {
        remove_entry(e, out);
        rc = 0;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int allocmap_get(enum alloc_space space, uint64_t key, struct alloc_info *out)
{
    pthread_mutex_lock(&lock);
    struct entry *e = find(&tables[space], key);
    if (e != NULL)
        *out = e->info;
    pthread_mutex_unlock(&lock);
    return e != NULL ? 0 : -1;
}

int allocmap_update(enum alloc_space space, uint64_t key, alloc_change change, const void *arg,
                    struct alloc_info *out)
{
    int rc = -1;
    pthread_mutex_lock(&lock);
    struct entry *e = find(&tables[space], key);
    if (e != NULL) {
        /* `change` may alter the size: keep the per-device total exact. */
        if (device_resident(&e->info))
            tracked[e->info.index] -= e->info.size;
        bool remove = change(&e->info, arg);
        if (device_resident(&e->info))
            tracked[e->info.index] += e->info.size;
        rc = 0;
        if (remove) {
            remove_entry(e, out);
            rc = 1;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

size_t allocmap_take_all(enum alloc_space space, alloc_match match, const void *arg,
                         struct alloc_entry **out)
{
    struct table *t = &tables[space];
    size_t n = 0;
    *out = NULL;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < t->capacity; i++)
        if (t->entries[i].state == SLOT_FULL && match(t->entries[i].key, &t->entries[i].info, arg))
            n++;
    /* Without room to hand them over, the entries stay (and stay charged). */
    struct alloc_entry *items = n > 0 ? malloc(n * sizeof(*items)) : NULL;
    size_t taken = 0;
    for (size_t i = 0; items != NULL && i < t->capacity && taken < n; i++) {
        struct entry *e = &t->entries[i];
        if (e->state != SLOT_FULL || !match(e->key, &e->info, arg))
            continue;
        items[taken].key = e->key;
        remove_entry(e, &items[taken].info);
        taken++;
    }
    pthread_mutex_unlock(&lock);
    *out = items;
    return taken;
}

uint64_t allocmap_tracked(int index)
{
    pthread_mutex_lock(&lock);
    uint64_t bytes = index >= 0 ? tracked[index] : 0;
    pthread_mutex_unlock(&lock);
    return bytes;
}

/* Fork child: the parent's allocations are not ours to free or count. */
void allocmap_reset(void)
{
    pthread_mutex_init(&lock, NULL);
    for (int s = 0; s < SPACE_COUNT; s++) {
        free(tables[s].entries);
        tables[s] = (struct table){0};
    }
    memset(tracked, 0, sizeof(tracked));
}
