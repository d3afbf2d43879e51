/*
 * budget.c - the vGPU-wide memory budget of one device, shared by every
 * process of the vGPU through the usage block.
 *
 * Reserve before the driver call, release on failure:
 *   1. CAS loop on devices[d].used against the limit read NOW (a live change
 *      by the daemon applies at the next reservation);
 *   2. then add to our slot's dev[d].used.
 * A process killed between 1 and 2 leaves bytes in the total that no slot
 * owns: a leak, which the daemon repairs when the vGPU has no live process,
 * but never a total below what the processes hold, so the limit holds.
 * Release goes the other way (slot first, then total) for the same reason.
 * Why this cannot be made exact with two words: docs/hook.md, "Where the
 * budget can leak".
 */
#include <stdatomic.h>
#include <time.h>

#include "vgpu.h"

uint64_t budget_limit(int index)
{
    if (index == VGPU_DEV_FOREIGN)
        return 0;
    if (vgpu.mode == VGPU_MODE_VGPU)
        return (uint32_t)index < vgpu.control->device_count
                   ? atomic_load_explicit(&vgpu.control->devices[index].mem_limit,
                                          memory_order_acquire)
                   : 0;
    return vgpu.env.has_limit[index] ? vgpu.env.mem_limit[index] : UINT64_MAX;
}

uint64_t budget_used(int index)
{
    if (index < 0)
        return 0;
    return atomic_load_explicit(&vgpu.usage->devices[index].used, memory_order_acquire);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void raise_peak(_Atomic uint64_t *peak, uint64_t value)
{
    uint64_t cur = atomic_load_explicit(peak, memory_order_relaxed);
    while (cur < value && !atomic_compare_exchange_weak(peak, &cur, value))
        ;
}

static bool try_reserve(int index, uint64_t bytes)
{
    struct vgpu_usage_device *dev = &vgpu.usage->devices[index];
    uint64_t used = atomic_load_explicit(&dev->used, memory_order_relaxed);
    uint64_t next;
    do {
        uint64_t limit = budget_limit(index);
        if (bytes > limit || used > limit - bytes)
            return false;
        next = used + bytes;
    } while (!atomic_compare_exchange_weak_explicit(&dev->used, &used, next,
                                                    memory_order_acq_rel, memory_order_relaxed));
    raise_peak(&dev->peak, next);
    return true;
}

/* Looking for dead processes costs a few syscalls per slot: at most once
 * per interval per process, however many allocations are refused. */
#define RECLAIM_INTERVAL_NS 100000000ull
static _Atomic uint64_t last_reclaim_ns;

static int reclaim_now(void)
{
    uint64_t now = now_ns();
    uint64_t last = atomic_load_explicit(&last_reclaim_ns, memory_order_relaxed);
    if (now - last < RECLAIM_INTERVAL_NS ||
        !atomic_compare_exchange_strong(&last_reclaim_ns, &last, now))
        return 0;
    return blocks_reclaim_dead(vgpu.usage, vgpu.pidns);
}

int budget_reserve(int index, uint64_t bytes)
{
    if (index < 0) {
        vgpu_error_set("device is not part of the vGPU");
        return -1;
    }
    struct vgpu_proc_slot *slot = vgpu_slot();
    if (slot == NULL) {
        vgpu_error_set("no process slot");
        return -1;
    }
    /* Before refusing, give back what is provably not in use: bytes of dead
     * processes of our namespace, and what our own pools no longer hold. */
    if (!try_reserve(index, bytes)) {
        int freed = reclaim_now() + pools_settle_all();
        if (freed == 0 || !try_reserve(index, bytes)) {
            vgpu_error_set("over the limit");
            return -1;
        }
    }
    testpoint(TESTPOINT_RESERVE); /* a death here leaks `bytes` */
    atomic_fetch_add_explicit(&slot->dev[index].used, bytes, memory_order_relaxed);
    atomic_store_explicit(&slot->heartbeat_ns, now_ns(), memory_order_relaxed);
    return 0;
}

void budget_release(int index, uint64_t bytes)
{
    struct vgpu_proc_slot *slot = vgpu_slot();
    if (index < 0 || bytes == 0 || slot == NULL)
        return;
    vgpu_sub_clamp(&slot->dev[index].used, bytes);
    testpoint(TESTPOINT_RELEASE); /* a death here leaks `bytes` */
    vgpu_sub_clamp(&vgpu.usage->devices[index].used, bytes);
}

CUresult budget_oom(int index, const char *what, uint64_t bytes)
{
    const char *vgpu_id = vgpu.mode == VGPU_MODE_VGPU ? vgpu.control->vgpu_id : "standalone";
    if (index >= 0)
        atomic_fetch_add_explicit(&vgpu.usage->devices[index].oom_count, 1, memory_order_relaxed);
    log_warn("vGPU %.*s GPU %.*s: %s of %llu bytes refused (%s): %llu of %llu bytes in use",
             VGPU_ID_LEN, vgpu_id, VGPU_UUID_LEN, devmap_uuid(index), what,
             (unsigned long long)bytes, vgpu_error(), (unsigned long long)budget_used(index),
             (unsigned long long)budget_limit(index));
    return CUDA_ERROR_OUT_OF_MEMORY;
}
