/*
 * nv_events.c - event sets delivering Xid events posted to the simulated
 * machine (vgpu-simctl xid DEV CODE). A set sees the events posted after a
 * device was registered; a wait sleeps on the state's futex, not a poll.
 */
#include <stdlib.h>

#include "nv_sim.h"

#define SUPPORTED_EVENTS NVML_EVENT_TYPE_XID_CRITICAL_ERROR
#define EVENT_SET_TAG 0x45565331u

struct nvmlEventSet_st {
    uint32_t tag;
    unsigned long long types[SIM_MAX_DEVICES]; /* 0: device not registered */
    uint32_t seen[SIM_MAX_DEVICES];            /* Xid events consumed per device */
};

static bool set_valid(nvmlEventSet_t set)
{
    return set != NULL && set->tag == EVENT_SET_TAG;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    if (r != NVML_SUCCESS)
        return r;
    if (eventTypes == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *eventTypes = SUPPORTED_EVENTS;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (nv_state() == NULL)
        return NVML_ERROR_UNINITIALIZED;
    if (set == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlEventSet_t s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NVML_ERROR_UNKNOWN;
    s->tag = EVENT_SET_TAG;
    *set = s;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    struct sim_state *st;
    unsigned i;
    nvmlReturn_t r = nv_device(device, &st, &i);
    if (r != NVML_SUCCESS)
        return r;
    if (!set_valid(set) || eventTypes == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if ((eventTypes & ~SUPPORTED_EVENTS) != 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (set->types[i] == 0)
        set->seen[i] = atomic_load(&st->devices[i].xid_head);
    set->types[i] |= eventTypes;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    struct sim_state *st = nv_state();
    if (st == NULL)
        return NVML_ERROR_UNINITIALIZED;
    if (!set_valid(set) || data == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t deadline = sim_now() + (uint64_t)timeoutms * 1000000ULL;
    for (;;) {
        uint32_t posted = atomic_load(&st->event_count);
        for (unsigned i = 0; i < st->config.devices; i++) {
            uint64_t code;
            if (set->types[i] != 0 && sim_xid_next(st, i, &set->seen[i], &code)) {
                *data = (nvmlEventData_t){.device = nv_handle(i),
                                          .eventType = NVML_EVENT_TYPE_XID_CRITICAL_ERROR,
                                          .eventData = code,
                                          .gpuInstanceId = NV_NOT_AVAILABLE_ID,
                                          .computeInstanceId = NV_NOT_AVAILABLE_ID};
                return NVML_SUCCESS;
            }
        }
        if (sim_now() >= deadline)
            return NVML_ERROR_TIMEOUT;
        sim_xid_wait(st, posted, deadline);
    }
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    if (!set_valid(set))
        return NVML_ERROR_INVALID_ARGUMENT;
    set->tag = 0;
    free(set);
    return NVML_SUCCESS;
}
