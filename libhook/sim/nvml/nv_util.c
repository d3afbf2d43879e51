/*
 * nv_util.c - utilization from the engine's record of executed kernels.
 *
 * Device utilization is the busy share of the last 200 ms. The device's
 * sample buffer (nvmlDeviceGetSamples, GPU utilization) and per-process
 * utilization follow NVML's sampling model: one sample per period (per
 * process), periods of 200 ms aligned on multiples of 200 ms of
 * CLOCK_REALTIME, stamped (µs) with the period's end; only periods that
 * have ended and end after lastSeenTimeStamp are returned, at most the
 * last few seconds.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nv_sim.h"

#define PERIOD_NS 200000000ULL
#define PERIOD_US (PERIOD_NS / 1000)
#define MAX_PERIODS 25      /* 5 s of history, like NVML's sample buffer */
#define MAX_PIDS_PER_PERIOD 64

static unsigned percent(uint64_t busy, uint64_t window)
{
    uint64_t p = (busy * 100 + window / 2) / window;
    return p > 100 ? 100 : (unsigned)p;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    if (r != NVML_SUCCESS)
        return r;
    if (utilization == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t now = sim_now(), busy = 0;
    sim_engine_usage(st, i, now - PERIOD_NS, now, NULL, 0, &busy);
    utilization->gpu = percent(busy, PERIOD_NS);
    utilization->memory = 0;
    return NVML_SUCCESS;
}

static uint64_t realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* The periods that ended after last_seen and are still kept: [*first_end,
 * newest_end] in realtime µs; returns the realtime - monotonic offset (ns). */
static uint64_t periods(unsigned long long last_seen, uint64_t *first_end, uint64_t *newest_end)
{
    uint64_t mono = sim_now(), real = realtime_ns();
    *newest_end = real / 1000 / PERIOD_US * PERIOD_US;
    uint64_t oldest_end = *newest_end - (MAX_PERIODS - 1) * PERIOD_US;
    *first_end = (last_seen / PERIOD_US + 1) * PERIOD_US;
    if (*first_end < oldest_end)
        *first_end = oldest_end;
    return real - mono;
}

/* All samples newer than last_seen into out (room for `cap`); returns how many. */
static size_t collect(struct sim_state *st, unsigned dev, unsigned long long last_seen,
                      nvmlProcessUtilizationSample_t *out, size_t cap)
{
    uint64_t first_end, newest_end;
    uint64_t offset = periods(last_seen, &first_end, &newest_end);
    size_t count = 0;
    for (uint64_t end = first_end; end <= newest_end; end += PERIOD_US) {
        struct sim_pid_busy pids[MAX_PIDS_PER_PERIOD];
        uint64_t to = end * 1000 - offset, total = 0;
        size_t n = sim_engine_usage(st, dev, to - PERIOD_NS, to, pids, MAX_PIDS_PER_PERIOD, &total);
        for (size_t k = 0; k < n && k < MAX_PIDS_PER_PERIOD; k++, count++) {
            if (count < cap)
                out[count] = (nvmlProcessUtilizationSample_t){
                    .pid = (unsigned)pids[k].pid, .timeStamp = end, .smUtil = percent(pids[k].busy_ns, PERIOD_NS)};
        }
    }
    return count;
}

/* The device's busy share of each period that ended after lastSeenTimeStamp.
 * As NVML: with samples NULL, *sampleCount is set to how many there are;
 * else up to *sampleCount are written, oldest first. None newer: NOT_FOUND. */
nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, nvmlSamplingType_t type, unsigned long long lastSeenTimeStamp,
                                  nvmlValueType_t *sampleValType, unsigned int *sampleCount, nvmlSample_t *samples)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    if (r != NVML_SUCCESS)
        return r;
    if (sampleValType == NULL || sampleCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (type != NVML_GPU_UTILIZATION_SAMPLES)
        return NVML_ERROR_NOT_SUPPORTED;
    uint64_t first_end, newest_end;
    uint64_t offset = periods(lastSeenTimeStamp, &first_end, &newest_end);
    unsigned n = first_end > newest_end ? 0 : (unsigned)((newest_end - first_end) / PERIOD_US + 1);
    *sampleValType = NVML_VALUE_TYPE_UNSIGNED_INT;
    if (n == 0)
        return NVML_ERROR_NOT_FOUND;
    if (samples == NULL) {
        *sampleCount = n;
        return NVML_SUCCESS;
    }
    if (n > *sampleCount)
        n = *sampleCount;
    for (unsigned k = 0; k < n; k++) {
        uint64_t end = first_end + k * PERIOD_US, to = end * 1000 - offset, busy = 0;
        sim_engine_usage(st, i, to - PERIOD_NS, to, NULL, 0, &busy);
        samples[k] = (nvmlSample_t){.timeStamp = end, .sampleValue.uiVal = percent(busy, PERIOD_NS)};
    }
    *sampleCount = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    if (r != NVML_SUCCESS)
        return r;
    if (processSamplesCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    size_t cap = MAX_PERIODS * MAX_PIDS_PER_PERIOD;
    nvmlProcessUtilizationSample_t *samples = malloc(cap * sizeof(*samples));
    if (samples == NULL)
        return NVML_ERROR_UNKNOWN;
    size_t n = collect(st, i, lastSeenTimeStamp, samples, cap);
    if (n == 0) {
        r = NVML_ERROR_NOT_FOUND;
    } else if (utilization == NULL || *processSamplesCount < n) {
        r = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        memcpy(utilization, samples, n * sizeof(*samples));
    }
    *processSamplesCount = (unsigned)n;
    free(samples);
    return r;
}
