/*
 * init.c - lazy one-time initialisation at the first intercepted call, mode
 * selection, per-process lifecycle (fork, exit) and cuInit.
 *
 *   VGPU_CONTROL and VGPU_USAGE set   -> vGPU mode: the daemon's blocks
 *   else a seed limit variable set    -> standalone: env limits, usage block
 *                                        at VGPU_USAGE or /tmp/vgpud-<uid>.usage
 *   else                              -> pass-through: forward everything
 * A configuration we cannot honour never runs unlimited: CUDA refuses to
 * start (every CUDA call answers the same error) after one clear line.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vgpu.h"

extern char **environ;

struct vgpu_state vgpu;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

VGPU_EXPORT const char *vgpu_version(void)
{
    return VGPU_VERSION;
}

static const char *get_env(const char *name)
{
    return secure_getenv(name);
}

static void fail(CUresult code, const char *why)
{
    vgpu.mode = VGPU_MODE_FAILED;
    vgpu.fail_code = code;
    log_error("%s; CUDA will not start", why);
}

static int pid_namespace(uint64_t *ino)
{
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) != 0) {
        vgpu_error_set("stat /proc/self/ns/pid: %s", strerror(errno));
        return -1;
    }
    *ino = (uint64_t)st.st_ino;
    return 0;
}

/* Standalone: record what the environment set, for the daemon and for the
 * other processes' NVML view. Every process of the block writes the same. */
static void publish_standalone_limits(void)
{
    struct vgpu_usage *usage = vgpu.usage;
    int count = (int)vgpu.env.uuid_count;
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        atomic_store(&usage->devices[i].mem_limit,
                     vgpu.env.has_limit[i] ? vgpu.env.mem_limit[i] : 0);
        atomic_store(&usage->devices[i].share_ppm, vgpu.env.share_ppm);
        if (vgpu.env.has_limit[i] && i >= count)
            count = i + 1;
    }
    for (unsigned i = 0; i < vgpu.env.uuid_count; i++)
        memcpy(usage->uuids[i], vgpu.env.uuids[i], VGPU_UUID_LEN);
    atomic_store(&usage->flags, vgpu.env.oversubscribe ? VGPU_FLAG_OVERSUBSCRIBE : 0u);
    atomic_store(&usage->device_count, (uint32_t)count);
}

static void select_mode(void)
{
    char why[400];
    const char *control = vgpu.env.control_path;
    const char *usage = vgpu.env.usage_path;
    if (control != NULL) {
        if (usage == NULL) {
            fail(CUDA_ERROR_NOT_PERMITTED, "VGPU_CONTROL is set but VGPU_USAGE is not");
            return;
        }
        if (blocks_map_control(control, &vgpu.control) != 0 ||
            blocks_map_usage(usage, false, &vgpu.usage) != 0) {
            snprintf(why, sizeof(why), "vGPU blocks refused: %s", vgpu_error());
            fail(CUDA_ERROR_NOT_PERMITTED, why);
            return;
        }
        vgpu.mode = VGPU_MODE_VGPU;
        log_verbose("vGPU %.*s: %u device(s)", VGPU_ID_LEN, vgpu.control->vgpu_id,
                    vgpu.control->device_count);
        return;
    }
    if (!vgpu.env.standalone) {
        vgpu.mode = VGPU_MODE_PASSTHROUGH;
        return;
    }
    char default_path[64];
    if (usage == NULL) {
        snprintf(default_path, sizeof(default_path), "/tmp/vgpud-%u.usage", (unsigned)getuid());
        usage = default_path;
    }
    if (blocks_map_usage(usage, true, &vgpu.usage) != 0) {
        snprintf(why, sizeof(why), "standalone usage block refused: %s", vgpu_error());
        fail(CUDA_ERROR_NOT_PERMITTED, why);
        return;
    }
    vgpu.mode = VGPU_MODE_STANDALONE;
    publish_standalone_limits();
    log_verbose("standalone: usage block %s", usage);
}

static void init_process(void)
{
    char why[400];
    int level = env_log_level(get_env);
    if (level >= 0)
        vgpu_log_set_level(level);
    if (env_load(&vgpu.env, get_env, environ) != 0) {
        fail(CUDA_ERROR_INVALID_VALUE, vgpu_error());
        return;
    }
    if (resolve_init() != 0) {
        snprintf(why, sizeof(why), "no CUDA driver: %s", vgpu_error());
        fail(CUDA_ERROR_NOT_INITIALIZED, why);
        return;
    }
    if (pid_namespace(&vgpu.pidns) != 0) {
        snprintf(why, sizeof(why), "process identity unknown: %s", vgpu_error());
        fail(CUDA_ERROR_NOT_PERMITTED, why);
        return;
    }
    select_mode();
}

CUresult vgpu_cuda_enter(void)
{
    pthread_once(&init_once, init_process);
    return vgpu.mode == VGPU_MODE_FAILED ? vgpu.fail_code : CUDA_SUCCESS;
}

bool vgpu_nvml_enter(void)
{
    pthread_once(&init_once, init_process);
    return vgpu_limited();
}

bool vgpu_oversubscribe(void)
{
    if (vgpu.mode == VGPU_MODE_VGPU)
        return (atomic_load(&vgpu.control->flags) & VGPU_FLAG_OVERSUBSCRIBE) != 0;
    return vgpu.mode == VGPU_MODE_STANDALONE && vgpu.env.oversubscribe;
}

VGPU_EXPORT CUresult cuInit(unsigned int Flags)
{
    VGPU_CUDA_ENTER(cuInit);
    return vgpu_real_cuda.cuInit(Flags);
}

/* A forked child is a new process: it gets its own slot at its first CUDA
 * call, and nothing it inherited (CUDA contexts do not survive fork) may be
 * freed against the parent's bytes. */
static void atfork_child(void)
{
    slot_forget();
    allocmap_reset();
    pools_reset();
    overhead_reset();
    devmap_reset();
    ctx_hooks_reset();
}

__attribute__((constructor)) static void vgpu_load(void)
{
    pthread_atfork(NULL, NULL, atfork_child);
}

/* Best effort: memory the process did not free is freed by the driver when
 * the process ends, so its bytes go back to the budget with the slot. */
__attribute__((destructor)) static void vgpu_unload(void)
{
    if (vgpu_limited())
        slot_release_own();
}
