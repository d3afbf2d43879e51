/*
 * vgpu_guard.c - the daemon survives a container shrinking its usage block.
 *
 * A usage block is a file the container may write, so it may also truncate
 * it under the daemon's shared mapping; the daemon's next touch of a page
 * past the new end raises SIGBUS, which would kill the daemon and with it
 * every other vGPU's steering and accounting. The daemon registers each
 * mapping of a container-writable block here. A SIGBUS inside a registered
 * range puts a private zero page where the lost page was and the access
 * goes on: the daemon then reads zeros (no slots, no usage) and writes into
 * memory no one else sees, and the range is marked lost so the daemon can
 * report it and let the block go. A SIGBUS anywhere else kills the process
 * as it would have.
 *
 * The table is lock-free (the handler may run on any thread at any time):
 * a range is published by storing its length, then its base.
 */
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#define VGPU_GUARD_API __attribute__((visibility("default")))
#define GUARD_RANGES 4096

VGPU_GUARD_API int vgpu_guard_add(void *base, size_t len);
VGPU_GUARD_API void vgpu_guard_remove(int id);
VGPU_GUARD_API int vgpu_guard_lost(int id);

struct guard_range {
    _Atomic uintptr_t base; /* 0 = free entry */
    _Atomic size_t len;
    _Atomic int lost;
};

static struct guard_range g_ranges[GUARD_RANGES];
static uintptr_t g_page_mask;

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    uintptr_t addr = (uintptr_t)info->si_addr;
    for (int i = 0; i < GUARD_RANGES; i++) {
        uintptr_t base = atomic_load(&g_ranges[i].base);
        if (base == 0 || addr < base || addr - base >= atomic_load(&g_ranges[i].len))
            continue;
        void *page = (void *)(addr & g_page_mask);
        size_t size = (size_t)~g_page_mask + 1;
        if (mmap(page, size, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0) != MAP_FAILED) {
            atomic_store(&g_ranges[i].lost, 1);
            return;
        }
        break;
    }
    /* Not ours: the default action. Once this returns the access faults
     * again and the kernel ends the process as it would have. (Chaining to
     * a previous handler instead can loop: Python's faulthandler, for one,
     * reinstalls the handler it displaced, which is this one.) */
    (void)context;
    signal(sig, SIG_DFL);
}

/* Install our handler; checked on every add, since a later sigaction
 * (Python's faulthandler.enable(), say) may have replaced it. */
static int install(void)
{
    struct sigaction current;
    if (sigaction(SIGBUS, NULL, &current) != 0)
        return -1;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigbus)
        return 0;
    g_page_mask = ~((uintptr_t)sysconf(_SC_PAGESIZE) - 1);
    struct sigaction action = {0};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    return sigaction(SIGBUS, &action, NULL);
}

/* Watch [base, base + len); returns an id for the other calls, or -1. */
int vgpu_guard_add(void *base, size_t len)
{
    if (base == NULL || len == 0 || install() != 0)
        return -1;
    for (int i = 0; i < GUARD_RANGES; i++) {
        uintptr_t expected = 0;
        /* Claim the entry with a marker base no address can match. */
        if (atomic_compare_exchange_strong(&g_ranges[i].base, &expected, UINTPTR_MAX)) {
            atomic_store(&g_ranges[i].lost, 0);
            atomic_store(&g_ranges[i].len, len);
            atomic_store(&g_ranges[i].base, (uintptr_t)base);
            return i;
        }
    }
    return -1;
}

/* Stop watching (before the mapping is unmapped). */
void vgpu_guard_remove(int id)
{
    if (id >= 0 && id < GUARD_RANGES)
        atomic_store(&g_ranges[id].base, 0);
}

/* 1 once a page of the range was lost to a shrunk file. */
int vgpu_guard_lost(int id)
{
    return id >= 0 && id < GUARD_RANGES ? atomic_load(&g_ranges[id].lost) : 0;
}
