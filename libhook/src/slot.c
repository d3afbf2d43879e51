/*
 * slot.c - this process's slot in the usage block: claimed lazily at the
 * first reservation (a process that only asks NVML takes none), forgotten
 * by a forked child, given back at exit.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "vgpu.h"

static _Atomic int own_slot = -1;
static pthread_mutex_t claim_lock = PTHREAD_MUTEX_INITIALIZER;
static bool full_reported;

static int claim(void)
{
    struct vgpu_identity self;
    if (blocks_self_identity(&self) != 0) {
        log_error("cannot take a process slot: %s", vgpu_error());
        return -1;
    }
    blocks_reclaim_dead(vgpu.usage, self.pidns);
    int slot = blocks_claim_slot(vgpu.usage, &self);
    if (slot < 0 && !full_reported) {
        full_reported = true;
        log_error("no free process slot in the usage block (%d processes): allocations refused",
                  VGPU_MAX_PROCS);
    }
    if (slot >= 0)
        log_detail("process slot %d", slot);
    return slot;
}

struct vgpu_proc_slot *vgpu_slot(void)
{
    int slot = atomic_load_explicit(&own_slot, memory_order_acquire);
    if (slot < 0) {
        pthread_mutex_lock(&claim_lock);
        slot = atomic_load_explicit(&own_slot, memory_order_relaxed);
        if (slot < 0) {
            slot = claim();
            atomic_store_explicit(&own_slot, slot, memory_order_release);
        }
        pthread_mutex_unlock(&claim_lock);
    }
    return slot >= 0 ? &vgpu.usage->slots[slot] : NULL;
}

int vgpu_slot_index(void)
{
    return atomic_load_explicit(&own_slot, memory_order_acquire);
}

void slot_forget(void)
{
    pthread_mutex_init(&claim_lock, NULL);
    atomic_store(&own_slot, -1);
    full_reported = false;
}

void slot_release_own(void)
{
    int slot = atomic_exchange(&own_slot, -1);
    if (slot >= 0)
        blocks_release_slot(vgpu.usage, slot);
}
