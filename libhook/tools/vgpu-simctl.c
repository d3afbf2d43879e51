/*
 * vgpu-simctl - poke the simulated GPU machine (tests, demos): inject Xid
 * events, mark devices lost, show what NVML sees. It talks to whatever
 * libnvidia-ml.so.1 the loader finds and refuses to act on a real one.
 *
 *   vgpu-simctl xid DEV CODE      post Xid CODE on device DEV
 *   vgpu-simctl lost DEV on|off   NVML reports DEV lost (GPU_IS_LOST), or not
 *   vgpu-simctl status            devices, memory, utilization, processes
 *
 * The machine is the one VGPU_SIM_STATE names (see docs/simulator.md).
 * Exit status: 0, 1 on failure, 2 for bad arguments.
 */
#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml_api.h"

#define MAX_PROCESSES 256

/* field, exported name */
#define SIMCTL_NVML(X)                                                \
    X(nvmlInit_v2)                                                    \
    X(nvmlShutdown)                                                   \
    X(nvmlErrorString)                                                \
    X(nvmlDeviceGetCount_v2)                                          \
    X(nvmlDeviceGetHandleByIndex_v2)                                  \
    X(nvmlDeviceGetName)                                              \
    X(nvmlDeviceGetUUID)                                              \
    X(nvmlDeviceGetMemoryInfo)                                        \
    X(nvmlDeviceGetUtilizationRates)                                  \
    X(nvmlDeviceGetComputeRunningProcesses_v3)

#define FIELD(name) __typeof__(name) *name;
static struct {
    SIMCTL_NVML(FIELD)
    int (*inject_xid)(unsigned int index, unsigned long long xid);
    int (*set_lost)(unsigned int index, int lost);
} nv;
#undef FIELD

static int usage(void)
{
    fputs("usage: vgpu-simctl xid DEV CODE | lost DEV on|off | status\n", stderr);
    return 2;
}

static int load(void)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "vgpu-simctl: cannot load libnvidia-ml.so.1: %s\n", dlerror());
        return -1;
    }
    nv.inject_xid = (__typeof__(nv.inject_xid))dlsym(lib, "vgpuSimInjectXid");
    nv.set_lost = (__typeof__(nv.set_lost))dlsym(lib, "vgpuSimSetLost");
    if (nv.inject_xid == NULL || nv.set_lost == NULL) {
        fprintf(stderr, "vgpu-simctl: libnvidia-ml.so.1 is not the simulator (run with LD_LIBRARY_PATH=build/sim)\n");
        return -1;
    }
#define RESOLVE(name)                                                  \
    if ((*(void **)&nv.name = dlsym(lib, #name)) == NULL) {            \
        fprintf(stderr, "vgpu-simctl: libnvidia-ml.so.1 lacks %s\n", #name); \
        return -1;                                                     \
    }
    SIMCTL_NVML(RESOLVE)
#undef RESOLVE
    return 0;
}

static int parse_number(const char *text, unsigned long long max, unsigned long long *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (!isdigit((unsigned char)text[0]) || *end != '\0' || errno != 0 || v > max) {
        fprintf(stderr, "vgpu-simctl: '%s' is not a number from 0 to %llu\n", text, max);
        return -1;
    }
    *out = v;
    return 0;
}

static int status(void)
{
    unsigned count = 0;
    nvmlReturn_t r = nv.nvmlInit_v2();
    if (r == NVML_SUCCESS)
        r = nv.nvmlDeviceGetCount_v2(&count);
    if (r != NVML_SUCCESS) {
        fprintf(stderr, "vgpu-simctl: %s\n", nv.nvmlErrorString(r));
        return 1;
    }
    for (unsigned i = 0; i < count; i++) {
        nvmlDevice_t dev;
        char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE], uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
        nvmlMemory_t mem;
        nvmlUtilization_t util;
        nvmlProcessInfo_t procs[MAX_PROCESSES];
        unsigned nprocs = MAX_PROCESSES;
        if ((r = nv.nvmlDeviceGetHandleByIndex_v2(i, &dev)) != NVML_SUCCESS ||
            (r = nv.nvmlDeviceGetName(dev, name, sizeof(name))) != NVML_SUCCESS ||
            (r = nv.nvmlDeviceGetUUID(dev, uuid, sizeof(uuid))) != NVML_SUCCESS ||
            (r = nv.nvmlDeviceGetMemoryInfo(dev, &mem)) != NVML_SUCCESS ||
            (r = nv.nvmlDeviceGetUtilizationRates(dev, &util)) != NVML_SUCCESS ||
            (r = nv.nvmlDeviceGetComputeRunningProcesses_v3(dev, &nprocs, procs)) != NVML_SUCCESS) {
            printf("%u: %s\n", i, nv.nvmlErrorString(r));
            continue;
        }
        printf("%u: %s %s used %llu / %llu bytes, gpu %u%%, processes:", i, name, uuid, mem.used, mem.total,
               util.gpu);
        for (unsigned k = 0; k < nprocs; k++)
            printf(" %u (%llu bytes)", procs[k].pid, procs[k].usedGpuMemory);
        printf("%s\n", nprocs == 0 ? " none" : "");
    }
    nv.nvmlShutdown();
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage();
    bool is_xid = strcmp(argv[1], "xid") == 0, is_lost = strcmp(argv[1], "lost") == 0;
    if (strcmp(argv[1], "status") == 0 ? argc != 2 : !(is_xid || is_lost) || argc != 4)
        return usage();
    if (load() != 0)
        return 1;
    if (!is_xid && !is_lost)
        return status();
    unsigned long long dev = 0, code = 0;
    if (parse_number(argv[2], 1023, &dev) != 0)
        return 2;
    if (is_xid) {
        if (parse_number(argv[3], UINT32_MAX, &code) != 0)
            return 2;
        return nv.inject_xid((unsigned)dev, code) == 0 ? 0 : 1;
    }
    if (strcmp(argv[3], "on") != 0 && strcmp(argv[3], "off") != 0)
        return usage();
    return nv.set_lost((unsigned)dev, strcmp(argv[3], "on") == 0) == 0 ? 0 : 1;
}
