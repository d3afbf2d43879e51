/*
 * cu_init.c - cuInit, the process's view of the simulated machine, and
 * CUDA_VISIBLE_DEVICES (indices or UUID prefixes, read like the real driver:
 * the list stops at the first entry that names no device or repeats one).
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cu_sim.h"

struct cu_process *cu_proc;
pthread_mutex_t cu_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t cu_api_lock = PTHREAD_MUTEX_INITIALIZER;

static struct cu_process g_proc;
static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER;
static CUresult g_init_result = CUDA_ERROR_NOT_INITIALIZED;
static bool g_atfork_installed;

/* Index of the device a CUDA_VISIBLE_DEVICES entry names, or -1. */
static int visible_entry(const struct sim_config *cfg, const char *entry, size_t len)
{
    if (len > 0 && isdigit((unsigned char)entry[0])) {
        char *end = NULL;
        unsigned long index = strtoul(entry, &end, 10);
        return (size_t)(end - entry) == len && index < cfg->devices ? (int)index : -1;
    }
    if (len <= 4 || strncmp(entry, "GPU-", 4) != 0)
        return -1;
    int found = -1;
    for (unsigned i = 0; i < cfg->devices; i++) {
        if (strncmp(cfg->uuids[i], entry, len) == 0) {
            if (found >= 0)
                return -1; /* an ambiguous prefix names no device */
            found = (int)i;
        }
    }
    return found;
}

static int visible_devices(const struct sim_config *cfg, unsigned *map)
{
    const char *list = getenv("CUDA_VISIBLE_DEVICES");
    if (list == NULL) {
        for (unsigned i = 0; i < cfg->devices; i++)
            map[i] = i;
        return (int)cfg->devices;
    }
    int count = 0;
    uint32_t seen = 0;
    for (const char *p = list; *p != '\0' && count < SIM_MAX_DEVICES;) {
        while (*p == ' ')
            p++;
        size_t len = strcspn(p, ", ");
        int index = visible_entry(cfg, p, len);
        if (index < 0 || (seen & (1u << index)))
            break;
        seen |= 1u << index;
        map[count++] = (unsigned)index;
        p += len;
        while (*p == ' ' || *p == ',')
            p++;
    }
    return count;
}

/* A forked child starts with no driver state: it may cuInit afresh and
 * gets its own process slot; the parent's objects are not its own. */
static void forget_after_fork(void)
{
    pthread_mutex_init(&g_init_lock, NULL);
    pthread_mutex_init(&cu_lock, NULL);
    cu_proc = NULL;
    cu_ctx_forget_thread();
    cu_gates_forget();
    g_init_result = CUDA_ERROR_NOT_INITIALIZED;
}

static CUresult init_process(void)
{
    struct sim_state *st = sim_state_get();
    if (st == NULL)
        return CUDA_ERROR_NO_DEVICE; /* the reason is on stderr */
    unsigned map[SIM_MAX_DEVICES];
    int count = visible_devices(&st->config, map);
    if (count == 0)
        return CUDA_ERROR_NO_DEVICE;
    memset(&g_proc, 0, sizeof(g_proc));
    g_proc.slot = sim_proc_self(st);
    if (g_proc.slot == NULL)
        return CUDA_ERROR_OPERATING_SYSTEM; /* the reason is on stderr */
    g_proc.st = st;
    g_proc.pid = getpid();
    g_proc.count = count;
    for (int i = 0; i < count; i++) {
        struct cu_device *d = &g_proc.devices[i];
        d->dev = map[i];
        pthread_mutex_init(&d->lock, NULL);
        pthread_mutex_init(&d->run_lock, NULL);
    }
    cu_proc = &g_proc;
    return CUDA_SUCCESS;
}

CUresult cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_init_lock);
    if (!g_atfork_installed) {
        pthread_atfork(NULL, NULL, forget_after_fork);
        g_atfork_installed = true;
    }
    if (g_init_result == CUDA_ERROR_NOT_INITIALIZED)
        g_init_result = init_process();
    CUresult r = g_init_result;
    pthread_mutex_unlock(&g_init_lock);
    return r;
}

CUresult cu_ready(void)
{
    return cu_proc != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult cu_device_of(CUdevice ordinal, struct cu_device **out)
{
    if (cu_proc == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= cu_proc->count)
        return CUDA_ERROR_INVALID_DEVICE;
    *out = &cu_proc->devices[ordinal];
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *driverVersion)
{
    if (driverVersion == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = CU_SIM_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    (void)pExportTableId;
    if (ppExportTable != NULL)
        *ppExportTable = NULL;
    return CUDA_ERROR_NOT_SUPPORTED; /* no CUDA runtime runs on the simulator */
}
