/*
 * vgpu_atomics.c - C11 atomic operations on the shared blocks, for the
 * daemon. Python's mmap offers plain loads and stores only; the daemon must
 * compare-and-swap slot states and subtract from budgets that hooks update
 * concurrently, so it calls these through ctypes with addresses inside its
 * mappings. Every address must be naturally aligned (the ABI guarantees it).
 */
#include <limits.h>
#include <stddef.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#define VGPU_ATOMICS_API __attribute__((visibility("default")))

VGPU_ATOMICS_API uint64_t vgpu_atomic_load_u64(_Atomic uint64_t *p);
VGPU_ATOMICS_API void vgpu_atomic_store_u64(_Atomic uint64_t *p, uint64_t v);
VGPU_ATOMICS_API uint64_t vgpu_atomic_fetch_add_u64(_Atomic uint64_t *p, uint64_t v);
VGPU_ATOMICS_API int vgpu_atomic_sub_clamp_u64(_Atomic uint64_t *p, uint64_t v);
VGPU_ATOMICS_API int vgpu_atomic_cas_u64(_Atomic uint64_t *p, uint64_t expected, uint64_t desired);
VGPU_ATOMICS_API uint32_t vgpu_atomic_load_u32(_Atomic uint32_t *p);
VGPU_ATOMICS_API void vgpu_atomic_store_u32(_Atomic uint32_t *p, uint32_t v);
VGPU_ATOMICS_API int vgpu_atomic_cas_u32(_Atomic uint32_t *p, uint32_t expected, uint32_t desired);
VGPU_ATOMICS_API void vgpu_futex_wake_all(_Atomic uint32_t *p);
VGPU_ATOMICS_API void vgpu_atomic_load_u64_each(_Atomic uint64_t *const *addrs, size_t count, uint64_t *out);
VGPU_ATOMICS_API void vgpu_atomic_store_u64_each(_Atomic uint64_t *const *addrs, size_t count, uint64_t v);

uint64_t vgpu_atomic_load_u64(_Atomic uint64_t *p) { return atomic_load(p); }
void vgpu_atomic_store_u64(_Atomic uint64_t *p, uint64_t v) { atomic_store(p, v); }
uint64_t vgpu_atomic_fetch_add_u64(_Atomic uint64_t *p, uint64_t v) { return atomic_fetch_add(p, v); }

/* The control tick reads two counters of every vGPU and stores a heartbeat
 * into each, ten times a second: one ctypes call per word cost more than
 * the rest of the tick, so these take every address at once. */
void vgpu_atomic_load_u64_each(_Atomic uint64_t *const *addrs, size_t count, uint64_t *out)
{
    for (size_t i = 0; i < count; i++)
        out[i] = atomic_load(addrs[i]);
}

void vgpu_atomic_store_u64_each(_Atomic uint64_t *const *addrs, size_t count, uint64_t v)
{
    for (size_t i = 0; i < count; i++)
        atomic_store(addrs[i], v);
}

/* Tries before a subtraction gives up: a live hook's concurrent update
 * fails our CAS a few times at most. */
#define SUB_CLAMP_TRIES 1024

/* Subtract without wrapping below zero (a budget that a buggy or hostile
 * writer left too small must not wrap to 2^64); 1 when done. The word is in
 * a tenant-writable block, and a tenant storing to it in a loop could fail
 * the CAS for ever: after SUB_CLAMP_TRIES the daemon moves on (0) and the
 * bytes stay charged to that tenant's own budget. */
int vgpu_atomic_sub_clamp_u64(_Atomic uint64_t *p, uint64_t v)
{
    uint64_t cur = atomic_load(p);
    for (int tries = 0; tries < SUB_CLAMP_TRIES; tries++) {
        uint64_t next = cur > v ? cur - v : 0;
        if (atomic_compare_exchange_weak(p, &cur, next))
            return 1;
    }
    return 0;
}

int vgpu_atomic_cas_u64(_Atomic uint64_t *p, uint64_t expected, uint64_t desired)
{
    return atomic_compare_exchange_strong(p, &expected, desired);
}

uint32_t vgpu_atomic_load_u32(_Atomic uint32_t *p) { return atomic_load(p); }
void vgpu_atomic_store_u32(_Atomic uint32_t *p, uint32_t v) { atomic_store(p, v); }

int vgpu_atomic_cas_u32(_Atomic uint32_t *p, uint32_t expected, uint32_t desired)
{
    return atomic_compare_exchange_strong(p, &expected, desired);
}

/* Wake every thread of any process sleeping on the word (FUTEX_WAIT without
 * the private flag: the word is in a MAP_SHARED file mapping, which the
 * kernel keys by file and offset, so hooks that map it read-only in a
 * container are woken too). */
void vgpu_futex_wake_all(_Atomic uint32_t *p)
{
    syscall(SYS_futex, (uint32_t *)p, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
