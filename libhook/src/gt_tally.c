/*
 * gt_tally.c - what became of the process's launches: batches counted by
 * how they were measured, and written out at exit where VGPU_BATCH_STATS
 * names a file (docs/hook.md). A benchmark reads it to know, for instance,
 * how many of a launch-bound stream's batches were gated (docs/compute.md,
 * "Sampled gates"): the pace of such a stream depends on it, and nothing
 * else tells it from outside the process.
 */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "gt_state.h"

static const char *const kind_names[GT_KINDS] = {
    [GT_KIND_GATED] = "gated",     [GT_KIND_SHARED] = "shared", [GT_KIND_SAMPLED] = "sampled",
    [GT_KIND_GRAPH] = "graph",     [GT_KIND_PLAIN] = "plain",   [GT_KIND_UNMEASURED] = "unmeasured",
};

static struct {
    _Atomic uint64_t batches, launches, busy_ns, at_cost;
} tally[GT_KINDS];

/* Batches the hook's touch kernel went in front of (gputime.h, "Touched"). */
static _Atomic uint64_t touches;

static unsigned long long counted(_Atomic uint64_t *counter)
{
    return (unsigned long long)atomic_load_explicit(counter, memory_order_relaxed);
}

enum gt_kind gt_kind_of(const struct gt_batch *b)
{
    if (b->graph)
        return GT_KIND_GRAPH;
    if (b->shared)
        return GT_KIND_SHARED;
    if (b->gated)
        return GT_KIND_GATED;
    return b->estimated ? GT_KIND_SAMPLED : GT_KIND_PLAIN;
}

void gt_tally(enum gt_kind kind, uint64_t launches, uint64_t busy_ns, bool at_cost)
{
    /* Counted only where a file asks for it: the counters are one line the
     * monitor and the launching threads would otherwise share for nothing. */
    if (vgpu.env.batch_stats_path == NULL)
        return;
    atomic_fetch_add_explicit(&tally[kind].batches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&tally[kind].launches, launches, memory_order_relaxed);
    atomic_fetch_add_explicit(&tally[kind].busy_ns, busy_ns, memory_order_relaxed);
    if (at_cost)
        atomic_fetch_add_explicit(&tally[kind].at_cost, 1, memory_order_relaxed);
}

void gt_tally_touch(void)
{
    if (vgpu.env.batch_stats_path != NULL)
        atomic_fetch_add_explicit(&touches, 1, memory_order_relaxed);
}

/* One JSON line, appended with a single write so that the processes of a
 * run may share the file. */
void gt_tally_write(void)
{
    const char *path = vgpu.env.batch_stats_path;
    if (path == NULL)
        return;
    char line[1024];
    int n = snprintf(line, sizeof(line), "{\"pid\": %d, \"touched\": %llu", (int)getpid(),
                     counted(&touches));
    for (int k = 0; k < GT_KINDS && n > 0 && (size_t)n < sizeof(line); k++)
        n += snprintf(line + n, sizeof(line) - (size_t)n,
                      ", \"%s\": {\"batches\": %llu, \"launches\": %llu, \"busy_ns\": %llu, "
                      "\"at_cost\": %llu}",
                      kind_names[k], counted(&tally[k].batches), counted(&tally[k].launches),
                      counted(&tally[k].busy_ns), counted(&tally[k].at_cost));
    if (n <= 0 || (size_t)n + 2 > sizeof(line)) {
        log_warn("VGPU_BATCH_STATS: the line did not fit; nothing written");
        return;
    }
    line[n++] = '}';
    line[n++] = '\n';
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || write(fd, line, (size_t)n) != (ssize_t)n)
        log_warn("VGPU_BATCH_STATS=%s: not written", path);
    if (fd >= 0)
        close(fd);
}
