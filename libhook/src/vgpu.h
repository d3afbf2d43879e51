/*
 * vgpu.h - libvgpu.so's internal header: the modules and what they offer
 * each other. Nothing here is exported; only the wrappers named in hooks.h,
 * dlsym and vgpu_version leave the library.
 *
 * Error style: functions return -1 (or NULL) and record "what failed: cause"
 * with vgpu_error_set(); the caller decides whether to log it.
 */
#ifndef VGPU_H
#define VGPU_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_api.h"
#include "nvml_api.h"
#include "vgpu_abi.h"

#define VGPU_EXPORT __attribute__((visibility("default")))
/* VGPU_VERSION comes from the build (-D, from vgpud/__init__.py). */
#ifndef VGPU_VERSION
#error "VGPU_VERSION is not defined: build with make"
#endif
#define VGPU_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))

/* The library's version string (exported). */
VGPU_EXPORT const char *vgpu_version(void);

/* a * b, saturating at UINT64_MAX (sizes a caller chose). */
static inline uint64_t vgpu_mul_sat(uint64_t a, uint64_t b)
{
    return a != 0 && b > UINT64_MAX / a ? UINT64_MAX : a * b;
}

/* Subtract without wrapping below zero (counters another process may have
 * left too small must not wrap to 2^64). */
static inline void vgpu_sub_clamp(_Atomic uint64_t *counter, uint64_t bytes)
{
    uint64_t cur = atomic_load_explicit(counter, memory_order_relaxed);
    while (!atomic_compare_exchange_weak(counter, &cur, cur > bytes ? cur - bytes : 0))
        ;
}

/* ---- log.c -------------------------------------------------------------
 * LOGGER_LEVEL categories, the seed's meaning: category i is printed when
 * the level is >= i; info is always printed. Default level 3. */
enum vgpu_log_category {
    VGPU_LOG_INFO = 0,
    VGPU_LOG_ERROR = 1,
    VGPU_LOG_WARNING = 2,
    VGPU_LOG_FATAL = 3,
    VGPU_LOG_VERBOSE = 4,
    VGPU_LOG_DETAIL = 5,
};
#define VGPU_LOG_DEFAULT_LEVEL 3
void vgpu_log_set_level(int level);
bool vgpu_log_enabled(enum vgpu_log_category category);
void vgpu_log(enum vgpu_log_category category, const char *fmt, ...) VGPU_PRINTF(2, 3);
#define log_info(...) vgpu_log(VGPU_LOG_INFO, __VA_ARGS__)
#define log_error(...) vgpu_log(VGPU_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) vgpu_log(VGPU_LOG_WARNING, __VA_ARGS__)
#define log_fatal(...) vgpu_log(VGPU_LOG_FATAL, __VA_ARGS__)
#define log_verbose(...) vgpu_log(VGPU_LOG_VERBOSE, __VA_ARGS__)
#define log_detail(...) vgpu_log(VGPU_LOG_DETAIL, __VA_ARGS__)

/* The calling thread's last recorded error ("what failed: cause"). */
void vgpu_error_set(const char *fmt, ...) VGPU_PRINTF(1, 2);
const char *vgpu_error(void);

/* ---- env.c: the seed's environment interface, pure parsers ------------- */
struct vgpu_env {
    bool standalone;                          /* a seed limit variable is set */
    bool has_limit[VGPU_MAX_DEVICES];         /* CUDA_MEM_LIMIT[_i] applies */
    uint64_t mem_limit[VGPU_MAX_DEVICES];     /* bytes */
    uint32_t share_ppm;                       /* CUDA_CORE_(SOFT_)LIMIT; FULL = none */
    bool core_soft;                           /* the share came from CUDA_CORE_SOFT_LIMIT */
    bool oversubscribe;                       /* CUDA_MEMORY_OVERSUBSCRIBE */
    unsigned uuid_count;                      /* GPU_DEVICES_UUID */
    char uuids[VGPU_MAX_DEVICES][VGPU_UUID_LEN];
    int log_level;                            /* LOGGER_LEVEL */
    const char *control_path;                 /* VGPU_CONTROL */
    const char *usage_path;                   /* VGPU_USAGE */
    const char *arbiter_dir;                  /* VGPU_ARBITER_DIR (standalone) */
    const char *batch_stats_path;             /* VGPU_BATCH_STATS */
};
typedef const char *(*env_getter)(const char *name);
int env_parse_size(const char *text, uint64_t *out);
int env_parse_percent(const char *text, unsigned *out);
int env_parse_bool(const char *text, bool *out);
int env_parse_level(const char *text, int *out);
int env_parse_uuids(const char *text, char out[][VGPU_UUID_LEN], unsigned max, unsigned *count);
/* Reads every variable through `get`; `names` (NULL-terminated NAME=VALUE
 * strings, e.g. environ) is only scanned for CUDA_MEM_LIMIT_* names so a
 * misspelt index is refused rather than ignored. -1 names the variable. */
int env_load(struct vgpu_env *env, env_getter get, char *const *names);
/* The log level alone, for before anything else is parsed. */
int env_log_level(env_getter get);

/* ---- resolve.c: the real driver and NVML -------------------------------- */
#define RESOLVE_FIELD(ret, name, params, args) __typeof__(name) *name;
struct vgpu_cuda_fns {
    CUDA_API_LIST(RESOLVE_FIELD)
};
struct vgpu_nvml_fns {
    NVML_API_LIST(RESOLVE_FIELD)
};
#undef RESOLVE_FIELD
extern struct vgpu_cuda_fns vgpu_real_cuda;
extern struct vgpu_nvml_fns vgpu_real_nvml;
/* Load libcuda/libnvidia-ml and fill the tables (once). 0, or -1 if the
 * driver cannot be found. NVML is optional. */
int resolve_init(void);
bool resolve_nvml_available(void);
/* dlsym as glibc implements it (never our override). */
void *resolve_real_dlsym(void *handle, const char *symbol);
/* True on a thread that is inside resolve_init (its dlopen may run driver
 * constructors that call dlsym: those must pass straight through). */
bool resolve_busy(void);

/* ---- elfsym.c: what one loaded object defines, without the loader ----- */
struct link_map;
/* `symbol`'s default definition in `obj` itself (as dlsym on a handle of
 * `obj` would find it there), or NULL. Reads the object's dynamic symbol
 * table: no dlopen, no loader lock. */
void *elfsym_lookup(const struct link_map *obj, const char *symbol);

/* ---- init.c: mode selection, per-process state ------------------------- */
enum vgpu_mode {
    VGPU_MODE_PASSTHROUGH = 0, /* no limits configured: forward everything */
    VGPU_MODE_STANDALONE = 1,  /* seed env limits, hook-created usage block */
    VGPU_MODE_VGPU = 2,        /* daemon's control + usage blocks */
    VGPU_MODE_FAILED = 3,      /* bad configuration: CUDA refuses to start */
};
struct vgpu_state {
    enum vgpu_mode mode;
    CUresult fail_code;          /* FAILED: what every CUDA call returns */
    struct vgpu_env env;
    const struct vgpu_control *control; /* VGPU mode, read-only mapping */
    struct vgpu_usage *usage;           /* VGPU and STANDALONE modes */
    uint64_t pidns;              /* inode of /proc/self/ns/pid */
};
extern struct vgpu_state vgpu;
/* Lazy one-time init; CUDA_SUCCESS or the code every CUDA call must fail with. */
CUresult vgpu_cuda_enter(void);
/* Same for NVML wrappers: false means forward untouched. */
bool vgpu_nvml_enter(void);
static inline bool vgpu_limited(void)
{
    return vgpu.mode == VGPU_MODE_STANDALONE || vgpu.mode == VGPU_MODE_VGPU;
}
bool vgpu_oversubscribe(void);

/*
 * Wrapper prologue: initialise, fail with the configured code, and refuse a
 * function the driver does not have. Every CUDA wrapper starts with it.
 */
#define VGPU_CUDA_ENTER(name) \
    do { \
        CUresult enter_rc_ = vgpu_cuda_enter(); \
        if (enter_rc_ != CUDA_SUCCESS) \
            return enter_rc_; \
        if (vgpu_real_cuda.name == NULL) \
            return CUDA_ERROR_NOT_FOUND; \
    } while (0)

/* ---- devmap.c: CUdevice / NVML device -> the budget entry --------------- */
#define VGPU_DEV_UNTRACKED (-1) /* not limited: forward untouched, show as is */
#define VGPU_DEV_FOREIGN (-2)   /* vGPU mode, not one of the vGPU's GPUs: limit 0 */
/* Budget index of a CUDA device: vGPU mode by UUID, standalone by ordinal. */
int devmap_index(CUdevice dev);
/* Budget index of the calling thread's current context's device;
 * VGPU_DEV_UNTRACKED without a context (the driver call then fails itself). */
int devmap_current(CUdevice *dev_out);
/* Is the stream (the per-thread default stream when ptsz and h is NULL)
 * being captured into a graph? */
bool devmap_stream_capturing(CUstream h, bool ptsz);
/* The device of a context that may not be current: 0, or -1. */
int devmap_ctx_device(CUcontext ctx, CUdevice *dev);
/* Budget index of an NVML device (by UUID). */
int devmap_nvml(nvmlDevice_t dev);
/* The UUID of a budget index, for logs; never NULL. */
const char *devmap_uuid(int index);
/* The UUID string ("GPU-xxxxxxxx-...", lowercase) of a CUDA device. */
int devmap_cuda_uuid(CUdevice dev, char out[VGPU_UUID_LEN]);
/* Forget cached CUDA state (fork child). */
void devmap_reset(void);

/* ---- blocks.c: mapping, validation, slots, reclaim ---------------------- */
int blocks_map_control(const char *path, const struct vgpu_control **out);
/* Open an existing usage block (vGPU mode), or open/create one (standalone). */
int blocks_map_usage(const char *path, bool create, struct vgpu_usage **out);
/* Open (creating it 0600 if missing) a standalone user's arbiter block of
 * one GPU; refused unless this user owns it alone. */
int blocks_map_arbiter(const char *path, struct vgpu_arbiter **out);
struct vgpu_identity {
    uint64_t pidns;
    int32_t pid;
    uint64_t start_time;
};
int blocks_self_identity(struct vgpu_identity *id);
/* Is the process of this identity still alive? Only for our pidns. */
bool blocks_identity_alive(const struct vgpu_identity *id);
/* Reclaim slots of our pid namespace whose process is gone; returns how
 * many were reclaimed. */
int blocks_reclaim_dead(struct vgpu_usage *usage, uint64_t our_pidns);
/* Claim a free slot for `self`; -1 if the block is full. A slot still
 * carrying our own identity (left by our image before exec) is reclaimed. */
int blocks_claim_slot(struct vgpu_usage *usage, const struct vgpu_identity *self);
/* Return a slot's bytes to the budget and free it. */
void blocks_release_slot(struct vgpu_usage *usage, int slot);

/* ---- slot.c: this process's slot ---------------------------------------- */
/* The process's slot, claimed lazily on first use; NULL if none can be had
 * (the block is full). */
struct vgpu_proc_slot *vgpu_slot(void);
/* Its index, or -1 if not claimed yet. */
int vgpu_slot_index(void);
/* Fork child: the parent's slot is not ours. */
void slot_forget(void);
/* Exit: give the slot and its bytes back. */
void slot_release_own(void);

/* ---- budget.c: the vGPU-wide budget of one device ----------------------- */
/* The limit in force now (live: read on every reservation). UINT64_MAX =
 * no limit on this device. */
uint64_t budget_limit(int index);
/* Reserve atomically against the limit, then charge the slot. 0 or -1. */
int budget_reserve(int index, uint64_t bytes);
/* Return bytes: the slot first, then the vGPU total. */
void budget_release(int index, uint64_t bytes);
/* vGPU-wide bytes in use on this device (allocations + overhead). */
uint64_t budget_used(int index);
/* Log and count a refusal, then return CUDA_ERROR_OUT_OF_MEMORY. */
CUresult budget_oom(int index, const char *what, uint64_t bytes);

/* ---- allocmap.c: this process's allocations ----------------------------- */
enum alloc_kind {
    ALLOC_DEVICE = 0,  /* cuMemAlloc/pitch */
    ALLOC_MANAGED,     /* cuMemAllocManaged */
    ALLOC_HOST_BACKED, /* oversubscription: pinned host memory mapped in */
    ALLOC_ASYNC,       /* stream-ordered, from a pool */
    ALLOC_GRAPH,       /* a graph memory node's allocation */
    ALLOC_VMM,         /* cuMemCreate handle */
    ALLOC_ARRAY,       /* CUarray / CUmipmappedArray */
    ALLOC_MAPPING,     /* a cuMemMap of one of our handles: charges nothing */
    ALLOC_LIMIT,       /* a context limit's memory (cuCtxSetLimit) */
    ALLOC_POOL,        /* a memory pool's home device: charges nothing */
    ALLOC_GRAPH_FREED, /* a graph allocation freed in its own graph (a memo:
                        * its bytes are held by the graph pool) */
    ALLOC_GRAPH_MARK,  /* a memo about a graph: it may have run, or it has
                        * memory nodes */
};
struct alloc_info {
    uint64_t size;
    int index;         /* budget index */
    enum alloc_kind kind;
    void *host;        /* ALLOC_HOST_BACKED: the host allocation to free */
    CUmemoryPool pool; /* ALLOC_ASYNC: the pool it came from */
    CUcontext ctx;     /* the context whose destruction frees it; NULL: none */
    uint32_t maps;     /* ALLOC_VMM: mappings in place */
    uint32_t refs;     /* ALLOC_VMM: handle references (cuMemCreate's, retains) */
    bool exported;     /* handed to other processes (IPC handle, shareable
                        * VMM handle): its bytes stay charged when freed */
    uint64_t aux;      /* ALLOC_MAPPING: the handle mapped; ALLOC_LIMIT: the
                        * limit's value when first seen (counted as overhead);
                        * ALLOC_GRAPH, ALLOC_GRAPH_FREED: the graph */
};
/* Keys live in separate spaces: device pointers, VMM handles, arrays, VMM
 * mappings (by address), context limits ((ctx << 2) | limit), pools, graph
 * allocations freed in their graph (by address), graphs instantiated,
 * graphs with memory nodes, exported allocations freed here (by a serial
 * number: share_pin). */
enum alloc_space {
    SPACE_PTR = 0, SPACE_HANDLE, SPACE_ARRAY, SPACE_MAP, SPACE_LIMIT, SPACE_POOL,
    SPACE_GRAPH_FREED, SPACE_GRAPH_RUN, SPACE_GRAPH_MEM, SPACE_PINNED, SPACE_COUNT
};
int allocmap_put(enum alloc_space space, uint64_t key, const struct alloc_info *info);
/* Copy an entry out, leaving it; -1 if the key is not ours. */
int allocmap_get(enum alloc_space space, uint64_t key, struct alloc_info *out);
/* Remove and return an entry; -1 if the key is not ours. */
int allocmap_take(enum alloc_space space, uint64_t key, struct alloc_info *out);
/* Change an entry in place, atomically with respect to every other map
 * operation: `change` edits it and returns true to remove it (copied to
 * *out). -1 if the key is not ours, 0 kept, 1 removed. */
typedef bool (*alloc_change)(struct alloc_info *info, const void *arg);
int allocmap_update(enum alloc_space space, uint64_t key, alloc_change change, const void *arg,
                    struct alloc_info *out);
/* Remove every entry of a space that `match` selects; returns how many, in
 * a malloc'd array (*out, the caller frees it; NULL when none). */
struct alloc_entry {
    uint64_t key;
    struct alloc_info info;
};
typedef bool (*alloc_match)(uint64_t key, const struct alloc_info *info, const void *arg);
size_t allocmap_take_all(enum alloc_space space, alloc_match match, const void *arg,
                         struct alloc_entry **out);
/* Tracked bytes of this process on a device (for overhead measurement). */
uint64_t allocmap_tracked(int index);
void allocmap_reset(void);

/* ---- pools.c: bytes stream-ordered pools keep after a free -------------- *
 * A freed stream-ordered (or graph) allocation stays charged as "held by its
 * pool" until the pool gives the memory back: a trim, a destroy, or - asked
 * of the driver before any refusal - the pool's reserved size dropping.
 * Pool NULL stands for the device's graph memory pool. */
/* A new allocation of `bytes` from `pool`: returns how much of it reuses
 * bytes the pool already holds (charged already; the rest must be reserved). */
uint64_t pools_take(CUmemoryPool pool, int index, uint64_t bytes);
/* Undo pools_take after the driver refused the allocation. */
void pools_untake(CUmemoryPool pool, int index, uint64_t bytes, uint64_t reused);
/* A free: the bytes stay charged, held by the pool. */
void pools_hold(CUmemoryPool pool, int index, uint64_t bytes);
/* Bytes a pool was said to hold that it never got (a graph destroyed
 * before it ran): give back up to `bytes` of what is held. */
void pools_unhold(CUmemoryPool pool, int index, uint64_t bytes);
/* After cuMemPoolTrimTo / cuMemPoolDestroy / cuDeviceGraphMemTrim. */
void pools_trimmed(CUmemoryPool pool, int index, uint64_t keep);
void pools_destroyed(CUmemoryPool pool);
/* Before refusing an allocation: release what no pool of ours still holds
 * (asks the driver). Returns how many pools gave bytes back. */
int pools_settle_all(void);
/* Bytes our pools hold for a device (device memory the driver still has). */
uint64_t pools_held(int index);
void pools_reset(void);

/* ---- testpoint.c: the budget's windows, for tests ------------------------ */
enum testpoint {
    TESTPOINT_RESERVE = 1, /* the total is charged, the slot not yet */
    TESTPOINT_RELEASE = 2, /* the slot is given back, the total not yet */
};
/* Stop the process here once if VGPU_TEST_STOP_IN names this window. */
void testpoint(enum testpoint where);

/* ---- overhead.c: context and module overhead ----------------------------- */
/* Bracket a driver call that changes this process's untracked device memory
 * (context creation/destruction, module load/unload). */
struct overhead_probe {
    int index;               /* budget index; < 0: nothing to do */
    nvmlDevice_t nvml;       /* the device through the real NVML, or NULL */
    bool by_device;          /* no host pid: use the device's used delta */
    uint64_t device_before;  /* by_device: device used before the call */
    uint64_t wanted;         /* the overhead overhead_end tried to charge */
};
void overhead_begin(struct overhead_probe *probe, CUdevice dev, int index);
/* After the call succeeded: re-measure and charge the difference. -1 if the
 * charge would pass the limit (the caller undoes the call: OOM). */
int overhead_end(struct overhead_probe *probe);
/* Measure once per device if nothing did yet (a context the hook did not
 * see created, e.g. through the driver's private export tables). -1: the
 * overhead does not fit (refuse). */
int overhead_ensure(CUdevice dev, int index);
/* Measure again by the exact method (NVML's figure for this process minus
 * what the hook tracks) and charge the difference as overhead: for memory
 * the driver sizes on its own (array padding). Nothing where only the
 * device-wide method works. -1 if the charge would pass the limit. */
int overhead_true_up(CUdevice dev, int index);
void overhead_reset(void);

/* ---- mem_hooks.c / ctx_hooks.c ------------------------------------------ */
/* A context is gone (destroyed, or a primary context released or reset):
 * the driver freed every allocation made in it; give their bytes back. */
void mem_ctx_destroyed(CUcontext ctx);
/* Fork child: forget the parent's contexts, re-initialise the locks. */
void ctx_hooks_reset(void);
/* A module of the hook's own (gt_touch.c) into the current context: its
 * memory measured and charged as any module's, but one that does not fit
 * is no out-of-memory of the application's (not counted, not warned). */
CUresult ctx_own_module_load(CUmodule *module, const void *image);

/* ---- share_hooks.c: memory other processes may hold --------------------- *
 * An allocation exported to another process (cuIpcGetMemHandle, a VMM handle
 * exported as a shareable handle) may outlive this process's free: the
 * importer's mapping keeps it on the device, and nothing here can see when
 * the importer lets go. Its charge stays with this process until it exits. */
/* A freed exported allocation: keep its bytes charged (and tracked). */
void share_pin(const struct alloc_info *info);

/* ---- oversub.c: host-backed allocations -------------------------------- */
/* Serve `bytes` from pinned host memory mapped into the device. */
CUresult oversub_alloc(CUdeviceptr *dptr, uint64_t bytes, void **host);
CUresult oversub_free(void *host);

#endif
