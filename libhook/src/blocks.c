/*
 * blocks.c - map and validate the shared-memory blocks of vgpu_abi.h, and
 * the slot protocol that lets processes that die at any instant share them.
 *
 * Nothing here takes a lock another process could hold: slot ownership is a
 * CAS on slot.state, counters are atomics. A block we do not fully trust
 * (not a regular file, a symlink, wrong size, magic or version; a file of
 * our own that another user made or may write) is refused.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "vgpu.h"

/* How long a process waits for another to finish creating the standalone
 * block before giving up (the creator died half-way: remove the file). */
#define CREATE_WAIT_NS (2 * 1000000000LL)
#define CREATE_POLL_NS (1 * 1000000LL)

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int check_header(const struct vgpu_block_header *hdr, uint64_t magic, size_t size,
                        const char *kind, const char *path)
{
    uint64_t seen = __atomic_load_n(&hdr->magic, __ATOMIC_ACQUIRE);
    if (seen != magic) {
        vgpu_error_set("%s block %s: bad magic %#llx (not a vgpud %s block)", kind, path,
                       (unsigned long long)seen, kind);
        return -1;
    }
    if (hdr->version != VGPU_ABI_VERSION) {
        vgpu_error_set("%s block %s: layout version %u, this hook knows %u", kind, path,
                       hdr->version, VGPU_ABI_VERSION);
        return -1;
    }
    if (hdr->size != size) {
        vgpu_error_set("%s block %s: header size %u, layout v%u needs %zu", kind, path, hdr->size,
                       VGPU_ABI_VERSION, size);
        return -1;
    }
    return 0;
}

/* A regular file of exactly `size` bytes (anything else could SIGBUS us). */
static int check_file(int fd, size_t size, const char *kind, const char *path)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        vgpu_error_set("%s block %s: fstat: %s", kind, path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        vgpu_error_set("%s block %s is not a regular file", kind, path);
        return -1;
    }
    if ((uint64_t)st.st_size != size) {
        vgpu_error_set("%s block %s has %lld bytes, layout v%u needs %zu", kind, path,
                       (long long)st.st_size, VGPU_ABI_VERSION, size);
        return -1;
    }
    return 0;
}

static int open_block(const char *path, int flags, const char *kind)
{
    /* O_NOFOLLOW: a symlink where the block should be is refused. */
    int fd = open(path, flags | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        vgpu_error_set("cannot open %s block %s: %s", kind, path,
                       errno == ELOOP ? "it is a symbolic link" : strerror(errno));
    return fd;
}

static void *map_fd(int fd, size_t size, int prot, const char *kind, const char *path)
{
    void *addr = mmap(NULL, size, prot, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        vgpu_error_set("%s block %s: mmap: %s", kind, path, strerror(errno));
        return NULL;
    }
    return addr;
}

int blocks_map_control(const char *path, const struct vgpu_control **out)
{
    const size_t size = sizeof(struct vgpu_control);
    void *addr = NULL;
    int fd = open_block(path, O_RDONLY, "control");
    if (fd < 0 || check_file(fd, size, "control", path) != 0)
        goto fail;
    addr = map_fd(fd, size, PROT_READ, "control", path);
    if (addr == NULL)
        goto fail;
    const struct vgpu_control *control = addr;
    if (check_header(&control->hdr, VGPU_CONTROL_MAGIC, size, "control", path) != 0)
        goto fail;
    if (control->device_count < 1 || control->device_count > VGPU_MAX_DEVICES) {
        vgpu_error_set("control block %s: device_count %u out of range", path,
                       control->device_count);
        goto fail;
    }
    close(fd);
    *out = control;
    return 0;
fail:
    if (addr != NULL)
        munmap(addr, size);
    if (fd >= 0)
        close(fd);
    return -1;
}

/* A block the hook creates when it is missing (the standalone usage block,
 * an arbiter): its layout, for creating and checking. */
struct shared_kind {
    const char *name;
    uint64_t magic;
    size_t size;
};

/* We won the O_EXCL race: size the file, zero is a valid empty block, and
 * the magic goes in last so nobody trusts a half-made block. */
static void *create_shared(int fd, const char *path, const struct shared_kind *k)
{
    if (fchmod(fd, 0600) != 0 || ftruncate(fd, (off_t)k->size) != 0) {
        vgpu_error_set("%s block %s: cannot size it: %s", k->name, path, strerror(errno));
        return NULL;
    }
    struct vgpu_block_header *hdr = map_fd(fd, k->size, PROT_READ | PROT_WRITE, k->name, path);
    if (hdr == NULL)
        return NULL;
    hdr->version = VGPU_ABI_VERSION;
    hdr->size = (uint32_t)k->size;
    __atomic_store_n(&hdr->magic, k->magic, __ATOMIC_RELEASE);
    return hdr;
}

/* Another process is creating the block: wait (bounded, sleeping) until it
 * has its size and its magic. */
static void *await_shared(int fd, const char *path, const struct shared_kind *k)
{
    const struct timespec poll = {0, CREATE_POLL_NS};
    uint64_t deadline = monotonic_ns() + CREATE_WAIT_NS;
    struct stat st;
    while (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0 &&
           monotonic_ns() < deadline)
        nanosleep(&poll, NULL);
    if (check_file(fd, k->size, k->name, path) != 0)
        return NULL;
    struct vgpu_block_header *hdr = map_fd(fd, k->size, PROT_READ | PROT_WRITE, k->name, path);
    if (hdr == NULL)
        return NULL;
    while (__atomic_load_n(&hdr->magic, __ATOMIC_ACQUIRE) == 0 && monotonic_ns() < deadline)
        nanosleep(&poll, NULL);
    if (check_header(hdr, k->magic, k->size, k->name, path) != 0) {
        munmap(hdr, k->size);
        return NULL;
    }
    return hdr;
}

/*
 * A block the hook makes for itself (the standalone usage block, the
 * standalone arbiter) lies where another user may have put a file first:
 * /tmp is everyone's. Only a file we would have made is ours: owned by our
 * euid, with no group or other permission bit. Anything else is refused,
 * not used: its owner could rewrite our budget at will (docs/hook.md).
 */
static int check_own(int fd, const char *kind, const char *path)
{
    struct stat st;
    if (fstat(fd, &st) != 0) {
        vgpu_error_set("%s block %s: fstat: %s", kind, path, strerror(errno));
        return -1;
    }
    if (st.st_uid != geteuid()) {
        vgpu_error_set("%s block %s belongs to uid %u, not to this process (uid %u): "
                       "another user made it; remove it",
                       kind, path, (unsigned)st.st_uid, (unsigned)geteuid());
        return -1;
    }
    if ((st.st_mode & 077) != 0) {
        vgpu_error_set("%s block %s has mode %04o: others may write it; it must be 0600", kind,
                       path, (unsigned)(st.st_mode & 07777));
        return -1;
    }
    return 0;
}

/* Map a writable block, creating it first when `create` and it is missing;
 * `own`: an existing file must pass check_own (one we create passes). */
static void *map_shared(const char *path, bool create, bool own, const struct shared_kind *k)
{
    void *block = NULL;
    int fd = -1;
    if (create) {
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0) {
            block = create_shared(fd, path, k);
            if (block == NULL)
                unlink(path);
            goto done;
        }
        if (errno != EEXIST) {
            vgpu_error_set("cannot create %s block %s: %s", k->name, path, strerror(errno));
            goto done;
        }
    }
    fd = open_block(path, O_RDWR, k->name);
    if (fd >= 0 && (!own || check_own(fd, k->name, path) == 0))
        block = await_shared(fd, path, k);
done:
    if (fd >= 0)
        close(fd);
    return block;
}

int blocks_map_usage(const char *path, bool create, struct vgpu_usage **out)
{
    static const struct shared_kind usage = {"usage", VGPU_USAGE_MAGIC, sizeof(struct vgpu_usage)};
    /* Created on demand only in standalone mode, where the file is the
     * process's own; a vGPU's block is the daemon's, in its directory. */
    *out = map_shared(path, create, create, &usage);
    return *out != NULL ? 0 : -1;
}

int blocks_map_arbiter(const char *path, struct vgpu_arbiter **out)
{
    static const struct shared_kind arbiter = {"arbiter", VGPU_ARBITER_MAGIC,
                                               sizeof(struct vgpu_arbiter)};
    /* Standalone processes' turn, in /tmp or VGPU_ARBITER_DIR: whoever can
     * write it steers our turns, so it is this user's alone wherever it is
     * (vGPUs take turns through their own blocks and the broker). */
    *out = map_shared(path, true, true, &arbiter);
    return *out != NULL ? 0 : -1;
}

/* Field 22 of /proc/<pid>/stat: start time in clock ticks since boot. The
 * command name (field 2) may hold spaces and parentheses: skip to the last
 * ')' first. -1 if the process does not exist (or cannot be read). */
static int read_start_time(const char *stat_path, uint64_t *start_time)
{
    char buf[1024];
    int fd = open(stat_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return -1;
    p++;
    for (int field = 3; field <= 22; field++) {
        while (*p == ' ')
            p++;
        if (field == 22)
            break;
        p = strchr(p, ' ');
        if (p == NULL)
            return -1;
    }
    unsigned long long value;
    if (sscanf(p, "%llu", &value) != 1)
        return -1;
    *start_time = value;
    return 0;
}

int blocks_self_identity(struct vgpu_identity *id)
{
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) != 0) {
        vgpu_error_set("stat /proc/self/ns/pid: %s", strerror(errno));
        return -1;
    }
    id->pidns = (uint64_t)st.st_ino;
    id->pid = (int32_t)getpid();
    if (read_start_time("/proc/self/stat", &id->start_time) != 0) {
        vgpu_error_set("cannot read /proc/self/stat");
        return -1;
    }
    return 0;
}

/*
 * Dead means: no process has that pid (kill says ESRCH), or the process
 * with that pid started at another time (the pid was reused). When we
 * cannot tell (hidden /proc, another user's process) it counts as alive:
 * a wrong "dead" would free a live process's bytes.
 */
bool blocks_identity_alive(const struct vgpu_identity *id)
{
    char path[64];
    uint64_t start_time;
    if (id->pid <= 0)
        return false;
    if (kill(id->pid, 0) != 0 && errno == ESRCH)
        return false;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)id->pid);
    if (read_start_time(path, &start_time) != 0)
        return true;
    return start_time == id->start_time;
}

static void read_identity(const struct vgpu_proc_slot *slot, struct vgpu_identity *id)
{
    id->pidns = atomic_load(&slot->pidns);
    id->pid = atomic_load(&slot->pid);
    id->start_time = atomic_load(&slot->start_time);
}

static bool same_identity(const struct vgpu_identity *a, const struct vgpu_identity *b)
{
    return a->pidns == b->pidns && a->pid == b->pid && a->start_time == b->start_time;
}

static void clear_slot(struct vgpu_proc_slot *slot)
{
    atomic_store(&slot->pid, 0);
    atomic_store(&slot->pidns, 0);
    atomic_store(&slot->start_time, 0);
    atomic_store(&slot->heartbeat_ns, 0);
    for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
        atomic_store(&slot->dev[d].overhead, 0);
        atomic_store(&slot->dev[d].gpu_time_ns, 0);
        atomic_store(&slot->dev[d].launches, 0);
        atomic_store(&slot->dev[d].throttled_ns, 0);
    }
}

/* Give a slot's bytes back: the slot's counter first, then the vGPU total.
 * A death in between leaves the total too high (a leak the daemon repairs),
 * never too low (which would let the vGPU pass its limit). */
static void return_bytes(struct vgpu_usage *usage, struct vgpu_proc_slot *slot)
{
    for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
        uint64_t bytes = atomic_exchange(&slot->dev[d].used, 0);
        if (bytes != 0)
            vgpu_sub_clamp(&usage->devices[d].used, bytes);
    }
}

/* ACTIVE -> RECLAIMING for the identity we judged, or nothing: if the slot
 * changed hands after we looked, its new owner keeps it. */
static bool reclaim_slot(struct vgpu_usage *usage, int index, const struct vgpu_identity *seen)
{
    struct vgpu_proc_slot *slot = &usage->slots[index];
    uint32_t state = VGPU_SLOT_ACTIVE;
    if (!atomic_compare_exchange_strong(&slot->state, &state, VGPU_SLOT_RECLAIMING))
        return false;
    struct vgpu_identity now;
    read_identity(slot, &now);
    if (!same_identity(&now, seen)) {
        state = VGPU_SLOT_RECLAIMING;
        atomic_compare_exchange_strong(&slot->state, &state, VGPU_SLOT_ACTIVE);
        return false;
    }
    return_bytes(usage, slot);
    clear_slot(slot);
    atomic_store(&slot->state, VGPU_SLOT_FREE);
    return true;
}

int blocks_reclaim_dead(struct vgpu_usage *usage, uint64_t our_pidns)
{
    int reclaimed = 0;
    for (int i = 0; i < VGPU_MAX_PROCS; i++) {
        struct vgpu_proc_slot *slot = &usage->slots[i];
        if (atomic_load(&slot->state) != VGPU_SLOT_ACTIVE)
            continue;
        struct vgpu_identity id;
        read_identity(slot, &id);
        /* Only our own PID namespace's pids mean anything to us. */
        if (id.pidns != our_pidns || blocks_identity_alive(&id))
            continue;
        if (reclaim_slot(usage, i, &id)) {
            log_verbose("reclaimed slot %d of dead process %d", i, (int)id.pid);
            reclaimed++;
        }
    }
    return reclaimed;
}

/*
 * With no process left in the vGPU, whatever the totals still hold is a
 * leak (a process killed between charging the total and its slot): reset
 * them, as the daemon does. The CAS from the value we saw to 0 fails if any
 * process reserved or released meanwhile, so a live reservation is never
 * erased.
 */
static void reset_idle_totals(struct vgpu_usage *usage)
{
    uint64_t seen[VGPU_MAX_DEVICES];
    for (int d = 0; d < VGPU_MAX_DEVICES; d++)
        seen[d] = atomic_load(&usage->devices[d].used);
    for (int i = 0; i < VGPU_MAX_PROCS; i++)
        if (atomic_load(&usage->slots[i].state) != VGPU_SLOT_FREE)
            return;
    for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
        uint64_t expected = seen[d];
        if (expected != 0 && atomic_compare_exchange_strong(&usage->devices[d].used, &expected, 0))
            log_verbose("device %d: %llu bytes leaked by dead processes reset", d,
                        (unsigned long long)seen[d]);
    }
}

int blocks_claim_slot(struct vgpu_usage *usage, const struct vgpu_identity *self)
{
    /* A slot with our exact identity was taken by our image before an exec:
     * its driver state died with that image, so its bytes are free. */
    for (int i = 0; i < VGPU_MAX_PROCS; i++) {
        struct vgpu_identity id;
        if (atomic_load(&usage->slots[i].state) != VGPU_SLOT_ACTIVE)
            continue;
        read_identity(&usage->slots[i], &id);
        if (same_identity(&id, self))
            reclaim_slot(usage, i, &id);
    }
    reset_idle_totals(usage);
    for (int i = 0; i < VGPU_MAX_PROCS; i++) {
        struct vgpu_proc_slot *slot = &usage->slots[i];
        uint32_t state = VGPU_SLOT_FREE;
        if (!atomic_compare_exchange_strong(&slot->state, &state, VGPU_SLOT_CLAIMING))
            continue;
        clear_slot(slot);
        for (int d = 0; d < VGPU_MAX_DEVICES; d++)
            atomic_store(&slot->dev[d].used, 0);
        atomic_store(&slot->pidns, self->pidns);
        atomic_store(&slot->pid, self->pid);
        atomic_store(&slot->start_time, self->start_time);
        atomic_store(&slot->heartbeat_ns, monotonic_ns());
        atomic_store(&slot->state, VGPU_SLOT_ACTIVE);
        return i;
    }
    return -1;
}

void blocks_release_slot(struct vgpu_usage *usage, int index)
{
    struct vgpu_proc_slot *slot = &usage->slots[index];
    return_bytes(usage, slot);
    clear_slot(slot);
    atomic_store(&slot->state, VGPU_SLOT_FREE);
}
