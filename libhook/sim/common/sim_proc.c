/*
 * sim_proc.c - process slots and per-device memory accounting.
 *
 * A process is known by its key: pid and start time (/proc/<pid>/stat field
 * 22), so a recycled pid never inherits a dead process's memory, and by its
 * PID namespace: a process in a container records the pid it sees, and a
 * caller elsewhere maps it to its own view (sim_pid_seen) before judging
 * it or listing it, as the kernel driver knows every process by its host
 * pid. Charging
 * is optimistic and lock-free: add to your own slot, then sum the device;
 * over capacity, clear dead owners and sum again, and if still over, take
 * the bytes back. Two racing allocators may both fail near the edge, but
 * the device is never overcommitted.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sim_state.h"

#define PID_BITS 22
/* The initial PID namespace's inode is fixed by the kernel (PROC_PID_INIT_INO). */
#define INIT_PIDNS 0xEFFFFFFCu
#define SEEN_CACHE 64

uint64_t sim_proc_key(int pid, uint64_t start_time)
{
    return (uint64_t)pid | (start_time << PID_BITS);
}

int sim_proc_key_pid(uint64_t key)
{
    return (int)(key & ((1u << PID_BITS) - 1));
}

/* Field 22 of /proc/<pid>/stat (clock ticks since boot, the same in every
 * namespace); 0 if the process does not exist or is a zombie. */
uint64_t sim_proc_start_time(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* The command name may hold spaces and parentheses: fields restart
     * after the last ')', with field 3 (state) two bytes on. */
    char *close_paren = strrchr(buf, ')');
    if (close_paren == NULL || close_paren[1] != ' ')
        return 0;
    /* A zombie's memory is already released, as a driver does at exit. */
    if (close_paren[2] == 'Z' || close_paren[2] == 'X')
        return 0;
    char *p = close_paren + 1;
    for (int field = 3; field < 22 && p != NULL; field++)
        p = strchr(p + 1, ' ');
    if (p == NULL)
        return 0;
    return strtoull(p + 1, NULL, 10);
}

uint64_t sim_proc_key_of(int pid)
{
    uint64_t start = sim_proc_start_time(pid);
    return start != 0 ? sim_proc_key(pid, start) : 0;
}

uint64_t sim_self_pidns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Is /proc/<pid> the process with pid `inner` in namespace `pidns`? */
static bool is_inner(int pid, uint64_t pidns, int inner)
{
    char path[64], buf[2048];
    struct stat st;
    snprintf(path, sizeof(path), "/proc/%d/ns/pid", pid);
    if (stat(path, &st) != 0 || (uint64_t)st.st_ino != pidns)
        return false;
    snprintf(path, sizeof(path), "/proc/%d/status", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    char *line = strstr(buf, "\nNSpid:");
    if (line == NULL)
        return false;
    char *end = strchr(line + 1, '\n'), *last = NULL;
    for (char *p = line + 7; p != NULL && (end == NULL || p < end); p = strpbrk(p + 1, " \t"))
        last = p; /* the innermost pid is the line's last field */
    return last != NULL && atoi(last) == inner;
}

/* Recent answers of sim_pid_seen: a lookup walks /proc, a check does not. */
static pthread_mutex_t g_seen_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t pidns;
    int inner, outer;
} g_seen[SEEN_CACHE];
static unsigned g_seen_next;

int sim_pid_seen(uint64_t pidns, int pid)
{
    static uint64_t self_ns;
    if (self_ns == 0)
        self_ns = sim_self_pidns();
    if (pidns == self_ns)
        return pid;
    if (self_ns != INIT_PIDNS)
        return -1; /* another container's namespace: not ours to judge */
    int found = 0;
    pthread_mutex_lock(&g_seen_lock);
    for (unsigned i = 0; i < SEEN_CACHE && found == 0; i++)
        if (g_seen[i].pidns == pidns && g_seen[i].inner == pid && is_inner(g_seen[i].outer, pidns, pid))
            found = g_seen[i].outer;
    pthread_mutex_unlock(&g_seen_lock);
    if (found != 0)
        return found;
    DIR *proc = opendir("/proc");
    if (proc == NULL)
        return -1;
    for (struct dirent *e; found == 0 && (e = readdir(proc)) != NULL;) {
        int outer = atoi(e->d_name);
        if (outer > 0 && is_inner(outer, pidns, pid))
            found = outer;
    }
    closedir(proc);
    if (found != 0) {
        pthread_mutex_lock(&g_seen_lock);
        unsigned i = g_seen_next++ % SEEN_CACHE;
        g_seen[i].pidns = pidns;
        g_seen[i].inner = pid;
        g_seen[i].outer = found;
        pthread_mutex_unlock(&g_seen_lock);
    }
    return found;
}

static bool key_is_owner(uint64_t key)
{
    return key != 0 && key != SIM_KEY_REAPING;
}

/* The owner's pid as the caller sees it; 0 if gone, -1 if it cannot tell.
 * What the caller remembers (sim_owners.c) spares it /proc. */
static int owner_seen(struct sim_state *st, struct sim_proc *slot, uint64_t key)
{
    uint64_t pidns = atomic_load(&slot->pidns);
    if (pidns == 0)
        return -1; /* being claimed right now */
    size_t index = (size_t)(slot - st->procs);
    int pid = sim_owners_lookup(index, key, pidns);
    if (pid != SIM_OWNER_UNKNOWN)
        return pid;
    pid = sim_pid_seen(pidns, sim_proc_key_pid(key));
    if (pid <= 0)
        return pid;
    uint64_t start = key >> PID_BITS;
    if (sim_proc_start_time(pid) != start)
        return 0;
    sim_owners_remember(index, key, pidns, pid, start);
    return pid;
}

/* Clear a dead owner's slot; exactly one reaper wins the CAS. */
static bool reap_if_dead(struct sim_state *st, struct sim_proc *slot, uint64_t key)
{
    if (owner_seen(st, slot, key) != 0)
        return false;
    if (atomic_compare_exchange_strong(&slot->key, &key, SIM_KEY_REAPING)) {
        for (unsigned d = 0; d < SIM_MAX_DEVICES; d++)
            atomic_store(&slot->used[d], 0);
        atomic_store(&slot->pidns, 0);
        atomic_store(&slot->key, 0);
    }
    return true;
}

static uint32_t slots_in_use(struct sim_state *st)
{
    uint32_t high = atomic_load(&st->proc_high);
    return high < SIM_MAX_PROCS ? high : SIM_MAX_PROCS;
}

static pthread_mutex_t g_self_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sim_proc *g_self;
static int g_self_pid;

static struct sim_proc *claim_slot(struct sim_state *st, uint64_t key)
{
    for (uint32_t i = 0; i < SIM_MAX_PROCS; i++) {
        struct sim_proc *slot = &st->procs[i];
        uint64_t seen = atomic_load(&slot->key);
        if (key_is_owner(seen) && !reap_if_dead(st, slot, seen))
            continue;
        seen = 0;
        if (atomic_compare_exchange_strong(&slot->key, &seen, key)) {
            atomic_store(&slot->pidns, sim_self_pidns());
            uint32_t high = atomic_load(&st->proc_high);
            while (high < i + 1 && !atomic_compare_exchange_weak(&st->proc_high, &high, i + 1))
                ;
            return slot;
        }
    }
    fprintf(stderr, "vgpu-sim: all %d process slots are taken\n", SIM_MAX_PROCS);
    return NULL;
}

struct sim_proc *sim_proc_self(struct sim_state *st)
{
    pthread_mutex_lock(&g_self_lock);
    int pid = getpid();
    if (g_self == NULL || g_self_pid != pid) { /* first use, or a forked child */
        uint64_t key = sim_proc_key_of(pid);
        g_self = key != 0 ? claim_slot(st, key) : NULL;
        g_self_pid = pid;
    }
    struct sim_proc *slot = g_self;
    pthread_mutex_unlock(&g_self_lock);
    return slot;
}

/* Sum of live usage on dev; with `reap`, dead owners are cleared first. */
static uint64_t device_sum(struct sim_state *st, unsigned dev, bool reap)
{
    uint64_t sum = 0;
    uint32_t n = slots_in_use(st);
    for (uint32_t i = 0; i < n; i++) {
        struct sim_proc *slot = &st->procs[i];
        uint64_t key = atomic_load(&slot->key);
        uint64_t used = atomic_load(&slot->used[dev]);
        if (!key_is_owner(key) || used == 0)
            continue;
        if (reap && reap_if_dead(st, slot, key))
            continue;
        sum += used;
    }
    return sum;
}

int sim_mem_charge(struct sim_state *st, struct sim_proc *slot, unsigned dev, uint64_t bytes)
{
    uint64_t capacity = st->config.memory;
    if (bytes > capacity)
        return -1;
    atomic_fetch_add(&slot->used[dev], bytes);
    if (device_sum(st, dev, false) <= capacity || device_sum(st, dev, true) <= capacity)
        return 0;
    atomic_fetch_sub(&slot->used[dev], bytes);
    return -1;
}

void sim_mem_uncharge(struct sim_proc *slot, unsigned dev, uint64_t bytes)
{
    atomic_fetch_sub(&slot->used[dev], bytes);
}

uint64_t sim_mem_device_used(struct sim_state *st, unsigned dev)
{
    sim_owners_update();
    return device_sum(st, dev, true);
}

size_t sim_mem_processes(struct sim_state *st, unsigned dev, struct sim_proc_usage *out, size_t cap)
{
    size_t count = 0;
    sim_owners_update();
    uint32_t n = slots_in_use(st);
    for (uint32_t i = 0; i < n; i++) {
        struct sim_proc *slot = &st->procs[i];
        uint64_t key = atomic_load(&slot->key);
        uint64_t used = atomic_load(&slot->used[dev]);
        if (!key_is_owner(key) || used == 0 || reap_if_dead(st, slot, key))
            continue;
        int pid = owner_seen(st, slot, key);
        if (pid <= 0)
            continue; /* alive, in a namespace the caller cannot see into */
        if (count < cap)
            out[count] = (struct sim_proc_usage){.pid = pid, .used = used};
        count++;
    }
    return count;
}
