/*
 * sim_state.c - create or join the shared state file.
 *
 * The first process creates the file with O_EXCL, sizes it, writes the
 * config and stores the magic last (release); later processes wait briefly
 * for the magic (acquire) and then trust the stored config, not their env.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sim_state.h"

#define JOIN_TIMEOUT_NS 3000000000ULL
#define JOIN_POLL_NS 1000000L

static struct sim_state *g_state;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void *map_state(int fd, const char *path)
{
    void *p = mmap(NULL, sizeof(struct sim_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "vgpu-sim: mmap %s: %s\n", path, strerror(errno));
        return NULL;
    }
    return p;
}

static struct sim_state *create_state(int fd, const char *path, const struct sim_config *cfg)
{
    if (ftruncate(fd, (off_t)sizeof(struct sim_state)) != 0) {
        fprintf(stderr, "vgpu-sim: ftruncate %s: %s\n", path, strerror(errno));
        return NULL;
    }
    struct sim_state *st = map_state(fd, path);
    if (st == NULL)
        return NULL;
    st->version = SIM_STATE_VERSION;
    st->size = sizeof(struct sim_state);
    st->config = *cfg;
    for (unsigned i = 0; i < cfg->devices; i++)
        atomic_store(&st->devices[i].lost, (cfg->lost_mask >> i) & 1u);
    atomic_store_explicit(&st->magic, SIM_STATE_MAGIC, memory_order_release);
    return st;
}

static void pause_briefly(void)
{
    struct timespec ts = {0, JOIN_POLL_NS};
    nanosleep(&ts, NULL);
}

static struct sim_state *join_state(int fd, const char *path)
{
    uint64_t deadline = sim_now() + JOIN_TIMEOUT_NS;
    struct stat sb;
    /* The creator may not have sized the file yet. */
    while (fstat(fd, &sb) == 0 && sb.st_size < (off_t)sizeof(struct sim_state)) {
        if (sb.st_size > 0 || sim_now() > deadline) {
            fprintf(stderr, "vgpu-sim: %s is not a simulator state file of this version (remove it)\n", path);
            return NULL;
        }
        pause_briefly();
    }
    struct sim_state *st = map_state(fd, path);
    if (st == NULL)
        return NULL;
    while (atomic_load_explicit(&st->magic, memory_order_acquire) != SIM_STATE_MAGIC) {
        if (sim_now() > deadline) {
            fprintf(stderr, "vgpu-sim: %s never became ready (its creator died? remove it)\n", path);
            munmap(st, sizeof(*st));
            return NULL;
        }
        pause_briefly();
    }
    if (st->version != SIM_STATE_VERSION || st->size != sizeof(struct sim_state)) {
        fprintf(stderr, "vgpu-sim: %s has layout version %u, this simulator speaks %u (remove it)\n",
                path, st->version, SIM_STATE_VERSION);
        munmap(st, sizeof(*st));
        return NULL;
    }
    return st;
}

static void attach_once(void)
{
    struct sim_config cfg;
    if (sim_config_from_env(&cfg) != 0)
        return;
    char fallback[64];
    const char *path = getenv("VGPU_SIM_STATE");
    if (path == NULL || path[0] == '\0') {
        snprintf(fallback, sizeof(fallback), "/dev/shm/vgpu-sim-%u", (unsigned)getuid());
        path = fallback;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
        g_state = create_state(fd, path, &cfg);
    } else if (errno == EEXIST && (fd = open(path, O_RDWR | O_CLOEXEC)) >= 0) {
        g_state = join_state(fd, path);
    } else {
        fprintf(stderr, "vgpu-sim: open %s: %s\n", path, strerror(errno));
        return;
    }
    close(fd);
}

struct sim_state *sim_state_get(void)
{
    pthread_once(&g_once, attach_once);
    return g_state;
}
