/*
 * nv_sim.h - private interface between the simulated libnvidia-ml.so.1's
 * files. NVML answers from the shared sim_state: memory from the process
 * slots, utilization from the engine's interval rings, events from the
 * Xid rings.
 */
#ifndef VGPU_NV_SIM_H
#define VGPU_NV_SIM_H

#include <stdbool.h>

#include "nvml_api.h"
#include "sim_state.h"

/*
 * Simulator controls, exported for build/vgpu-simctl (which dlopens this
 * library): post an Xid event on a device, or mark it GPU-lost (lost != 0)
 * or back. They return 0, or -1 with a line on stderr.
 */
int vgpuSimInjectXid(unsigned int index, unsigned long long xid);
int vgpuSimSetLost(unsigned int index, int lost);

#pragma GCC visibility push(hidden)

#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NV_NOT_AVAILABLE_ID 0xFFFFFFFFu /* gpu/compute instance of a non-MIG process */

struct nvmlDevice_st {
    unsigned index;
};

/* The state once nvmlInit succeeded, else NULL. */
struct sim_state *nv_state(void);
/* Validate a handle: NVML_SUCCESS with the state and index, or the error
 * (UNINITIALIZED, INVALID_ARGUMENT, GPU_IS_LOST). */
nvmlReturn_t nv_device(nvmlDevice_t device, struct sim_state **st, unsigned *index);
nvmlDevice_t nv_handle(unsigned index);

#pragma GCC visibility pop

#endif
