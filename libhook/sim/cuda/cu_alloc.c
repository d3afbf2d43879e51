/*
 * cu_alloc.c - the process's allocation table and device memory charging.
 *
 * Device memory is real host memory (anonymous mmap, so device pointers
 * are host addresses and copies can be checked); its bytes are charged to
 * this process in the shared state, where NVML and every other process's
 * cuMemGetInfo see them. The table is sorted by address so any pointer
 * inside an allocation resolves to it.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cu_sim.h"

static struct cu_alloc **g_table;
static size_t g_len, g_cap;

CUresult cu_charge(unsigned dev, uint64_t bytes)
{
    if (bytes == 0)
        return CUDA_SUCCESS;
    if (sim_mem_charge(cu_proc->st, cu_proc->slot, dev, bytes) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return CUDA_SUCCESS;
}

void cu_uncharge(unsigned dev, uint64_t bytes)
{
    if (bytes != 0)
        sim_mem_uncharge(cu_proc->slot, dev, bytes);
}

int cu_ordinal_of(unsigned dev)
{
    for (int i = 0; i < cu_proc->count; i++)
        if (cu_proc->devices[i].dev == dev)
            return i;
    return -1;
}

void *cu_map_anon(size_t bytes, size_t *map_len)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (bytes > SIZE_MAX - page)
        return NULL;
    size_t len = bytes == 0 ? page : (bytes + page - 1) / page * page;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    *map_len = len;
    return p;
}

/* Index of the first entry whose base is above addr. */
static size_t upper_bound(uintptr_t addr)
{
    size_t lo = 0, hi = g_len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g_table[mid]->base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static size_t extent(const struct cu_alloc *a)
{
    return a->size > 0 ? a->size : 1;
}

struct cu_alloc *cu_table_find(uintptr_t addr)
{
    size_t i = upper_bound(addr);
    if (i == 0)
        return NULL;
    struct cu_alloc *a = g_table[i - 1];
    return addr - a->base < extent(a) ? a : NULL;
}

struct cu_alloc *cu_table_base(uintptr_t base)
{
    struct cu_alloc *a = cu_table_find(base);
    return a != NULL && a->base == base ? a : NULL;
}

bool cu_table_overlaps(uintptr_t addr, size_t len)
{
    if (cu_table_find(addr) != NULL)
        return true;
    size_t i = upper_bound(addr);
    return i < g_len && g_table[i]->base < addr + len;
}

struct cu_alloc *cu_table_next_in(uintptr_t addr, size_t len, enum cu_alloc_kind kind)
{
    for (size_t i = upper_bound(addr == 0 ? 0 : addr - 1); i < g_len && g_table[i]->base < addr + len; i++)
        if (g_table[i]->base >= addr && g_table[i]->kind == kind)
            return g_table[i];
    return NULL;
}

size_t cu_table_len(void)
{
    return g_len;
}

struct cu_alloc *cu_table_at(size_t i)
{
    return g_table[i];
}

bool cu_range_known(uintptr_t addr, size_t len)
{
    pthread_mutex_lock(&cu_lock);
    struct cu_alloc *a = cu_table_find(addr);
    bool ok = a != NULL && a->kind != CU_ALLOC_ARRAY && len <= extent(a) - (addr - a->base);
    pthread_mutex_unlock(&cu_lock);
    return ok;
}

struct cu_alloc *cu_table_insert(const struct cu_alloc *entry)
{
    if (g_len == g_cap) {
        size_t cap = g_cap ? g_cap * 2 : 64;
        struct cu_alloc **grown = realloc(g_table, cap * sizeof(*grown));
        if (grown == NULL)
            return NULL;
        g_table = grown;
        g_cap = cap;
    }
    struct cu_alloc *a = malloc(sizeof(*a));
    if (a == NULL)
        return NULL;
    *a = *entry;
    size_t i = upper_bound(a->base);
    memmove(&g_table[i + 1], &g_table[i], (g_len - i) * sizeof(*g_table));
    g_table[i] = a;
    g_len++;
    return a;
}

void cu_alloc_release(struct cu_alloc *a)
{
    size_t i = upper_bound(a->base) - 1;
    memmove(&g_table[i], &g_table[i + 1], (g_len - i - 1) * sizeof(*g_table));
    g_len--;
    if (a->pool != NULL)
        cu_pool_note_release(a);
    if (a->map_len != 0)
        munmap((void *)a->base, a->map_len);
    if (a->fd >= 0)
        close(a->fd);
    cu_uncharge(a->dev, a->charged);
    free(a);
}

void cu_table_release_ctx(CUcontext ctx)
{
    for (size_t i = g_len; i-- > 0;)
        if (g_table[i]->ctx == ctx)
            cu_alloc_release(g_table[i]);
}

CUresult cu_alloc_new(CUcontext ctx, unsigned dev, size_t bytes, enum cu_alloc_kind kind,
                      struct cu_alloc **out)
{
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cu_charge(dev, bytes);
    if (r != CUDA_SUCCESS)
        return r;
    struct cu_alloc entry = {.size = bytes, .kind = kind, .ctx = ctx, .dev = dev, .charged = bytes, .fd = -1};
    void *p = cu_map_anon(bytes, &entry.map_len);
    if (p == NULL) {
        cu_uncharge(dev, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    entry.base = (uintptr_t)p;
    pthread_mutex_lock(&cu_lock);
    struct cu_alloc *a = cu_table_insert(&entry);
    if (a != NULL && out != NULL)
        *out = a;
    pthread_mutex_unlock(&cu_lock);
    if (a == NULL) {
        munmap(p, entry.map_len);
        cu_uncharge(dev, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

CUresult cu_alloc_free(uintptr_t ptr, unsigned kind_mask)
{
    pthread_mutex_lock(&cu_lock);
    struct cu_alloc *a = cu_table_base(ptr);
    CUresult r = CUDA_ERROR_INVALID_VALUE;
    if (a != NULL && (kind_mask & CU_KIND(a->kind)) && !a->in_pool) {
        cu_alloc_release(a);
        r = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&cu_lock);
    return r;
}
