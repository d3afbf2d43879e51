/*
 * sim_owners.c - the live owners of process slots, as one caller of the
 * simulator remembers them.
 *
 * A driver answers NVML's process lists and memory figures from its own
 * table of contexts. The simulator must tell the slots of live processes
 * from those of dead ones, and asking /proc for that (twice per process,
 * for each device, at each query) cost the node daemon, which asks several
 * times a second, most of a core at 1000 processes: a benchmark of the
 * daemon measured the simulator. So a caller that asks often (NVML's side:
 * nvmlInit calls sim_owners_watch) remembers each owner it has found alive
 * by a pidfd in an epoll set, and takes it for alive until that pidfd says
 * it ended: exact, since a pidfd is one process (never a recycled pid) and
 * turns readable when it exits, when /proc starts showing a zombie.
 * Descriptors are bounded (a quarter of the open-files limit); without a
 * pidfd (an old kernel, none left) the caller asks /proc as before.
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sim_state.h"

struct owner {
    uint64_t key; /* the slot's key when its owner was found alive; 0 = nothing known */
    uint64_t pidns;
    int pid;   /* as the caller sees it */
    int pidfd; /* in the epoll set; -1 once it said the owner ended */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct owner g_owners[SIM_MAX_PROCS];
static int g_exits = -1; /* the epoll set; -1: this process does not remember */
static size_t g_fds;

static void forget(struct owner *o)
{
    if (o->key != 0 && o->pidfd >= 0) {
        close(o->pidfd); /* leaves the epoll set with its last descriptor */
        g_fds--;
    }
    *o = (struct owner){.pidfd = -1};
}

/* Around a fork the lock is held, so the child's copy of the table is
 * whole. The child drops what its parent knew without touching the
 * parent's epoll set (the descriptors are copies, the set itself is
 * shared, so the child must not read it): it asks /proc from then on. */
static void before_fork(void)
{
    pthread_mutex_lock(&g_lock);
}

static void after_fork_parent(void)
{
    pthread_mutex_unlock(&g_lock);
}

static void after_fork_child(void)
{
    if (g_exits >= 0) {
        for (size_t i = 0; i < SIM_MAX_PROCS; i++)
            forget(&g_owners[i]);
        close(g_exits);
        g_exits = -1;
    }
    pthread_mutex_unlock(&g_lock);
}

static bool watching(void)
{
    return g_exits >= 0;
}

/* Whether one more descriptor leaves the caller three quarters of its
 * open-files limit (asked each time: the daemon raises it after init). */
static bool room_for_one_more(void)
{
    struct rlimit limit;
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0)
        return false;
    return limit.rlim_cur == RLIM_INFINITY || g_fds < limit.rlim_cur / 4;
}

void sim_owners_watch(void)
{
    pthread_mutex_lock(&g_lock);
    if (!watching()) {
        for (size_t i = 0; i < SIM_MAX_PROCS; i++)
            g_owners[i] = (struct owner){.pidfd = -1};
        g_exits = epoll_create1(EPOLL_CLOEXEC);
        static bool once;
        if (g_exits >= 0 && !once)
            once = pthread_atfork(before_fork, after_fork_parent, after_fork_child) == 0;
    }
    pthread_mutex_unlock(&g_lock);
}

void sim_owners_update(void)
{
    pthread_mutex_lock(&g_lock);
    if (watching()) {
        struct epoll_event ended[64];
        int n;
        do {
            n = epoll_wait(g_exits, ended, 64, 0);
            for (int k = 0; k < n; k++) {
                struct owner *o = &g_owners[ended[k].data.u32];
                if (o->key != 0 && o->pidfd >= 0) {
                    close(o->pidfd);
                    g_fds--;
                    o->pidfd = -1; /* the key stays: its owner ended */
                }
            }
        } while (n == 64 || (n < 0 && errno == EINTR));
    }
    pthread_mutex_unlock(&g_lock);
}

int sim_owners_lookup(size_t index, uint64_t key, uint64_t pidns)
{
    int pid = SIM_OWNER_UNKNOWN;
    pthread_mutex_lock(&g_lock);
    if (watching() && index < SIM_MAX_PROCS) {
        struct owner *o = &g_owners[index];
        if (o->key == key && o->pidns == pidns)
            pid = o->pidfd >= 0 ? o->pid : 0;
        else if (o->key != 0)
            forget(o); /* the slot has another owner now */
    }
    pthread_mutex_unlock(&g_lock);
    return pid;
}

void sim_owners_remember(size_t index, uint64_t key, uint64_t pidns, int pid, uint64_t start_time)
{
    pthread_mutex_lock(&g_lock);
    if (watching() && index < SIM_MAX_PROCS && room_for_one_more()) {
        forget(&g_owners[index]);
        int fd = (int)syscall(SYS_pidfd_open, pid, 0);
        /* The pid may have been reused since the caller checked it: the
         * pidfd is the owner only if the start time still matches. */
        struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)index};
        if (fd >= 0 && sim_proc_start_time(pid) == start_time &&
            epoll_ctl(g_exits, EPOLL_CTL_ADD, fd, &ev) == 0) {
            g_owners[index] = (struct owner){.key = key, .pidns = pidns, .pid = pid, .pidfd = fd};
            g_fds++;
        } else if (fd >= 0) {
            close(fd);
        }
    }
    pthread_mutex_unlock(&g_lock);
}
