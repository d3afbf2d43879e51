/*
 * cu_sim.h - private interface between the simulated libcuda.so.1's files.
 *
 * Process-local objects (contexts, streams, events, modules, graphs, the
 * allocation table) live here; what other processes must see lives in the
 * shared sim_state. Exported cu* functions are thin: they validate and call
 * the cu_* helpers below, never each other, so a preloaded hook exporting
 * the same names is never re-entered from inside the simulator.
 */
#ifndef VGPU_CU_SIM_H
#define VGPU_CU_SIM_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_api.h"
#include "sim_state.h"

/* Internal to the simulator libraries: only the driver API is exported. */
#pragma GCC visibility push(hidden)

/* Result codes the simulator returns beyond those cuda_api.h names. */
#define CUDA_ERROR_INVALID_SOURCE 300
#define CUDA_ERROR_FILE_NOT_FOUND 301
#define CUDA_ERROR_ILLEGAL_STATE 401
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CUDA_ERROR_CONTEXT_ALREADY_IN_USE 216
#define CUDA_ERROR_PEER_ACCESS_UNSUPPORTED 217
#define CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED 704
#define CUDA_ERROR_PEER_ACCESS_NOT_ENABLED 705
#define CUDA_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD 908

#define CU_SIM_DRIVER_VERSION 13000
#define CU_SIM_MAX_CTX_STACK 16

/* Handle tags: a handle whose tag does not match is rejected, not used. */
enum cu_tag {
    CU_TAG_CTX = 0x43545831,
    CU_TAG_STREAM = 0x53545231,
    CU_TAG_EVENT = 0x45564e31,
    CU_TAG_MODULE = 0x4d4f4431,
    CU_TAG_FUNC = 0x46554e31,
    CU_TAG_GRAPH = 0x47525031,
    CU_TAG_EXEC = 0x45584531,
    CU_TAG_POOL = 0x504f4c31,
    CU_TAG_ARRAY = 0x41525231,
    CU_TAG_NODE = 0x4e4f4431,
    CU_TAG_DEAD = 0x44454144,
};

struct cu_held_work;

struct CUstream_st {
    uint32_t tag;
    CUcontext ctx;
    unsigned flags;
    _Atomic uint64_t tail; /* end of the last work queued on this stream */
    CUgraph capture;       /* non-NULL while capturing */
    /* Work behind an unsatisfied wait, oldest first, and the process's list
     * of held streams (all under the gate lock of cu_gate.c). */
    struct cu_held_work *held, *held_last;
    struct CUstream_st *held_next;
    _Atomic bool is_held; /* held != NULL, readable without the lock */
    _Atomic bool after_copy; /* its last work run was a copy, not a kernel (cu_gate.c, stamp) */
    bool destroyed;       /* destroyed while held: freed once released */
};

struct CUevent_st {
    uint32_t tag;
    unsigned flags;
    _Atomic bool recorded;
    _Atomic bool pending;  /* its latest record waits on a held stream */
    _Atomic uint64_t gen;  /* records so far: a held one stamps only if still the latest */
    _Atomic uint64_t time; /* CLOCK_MONOTONIC ns when the marker completes */
    int refs;              /* the handle + held work naming it (gate lock) */
};

struct CUctx_st {
    uint32_t tag;
    unsigned dev;   /* simulated device index */
    int ordinal;    /* CUDA ordinal (after CUDA_VISIBLE_DEVICES) */
    bool primary;
    unsigned flags;
    _Atomic uint64_t last_end; /* end of the last work queued in this context */
    struct CUstream_st legacy; /* the NULL / CU_STREAM_LEGACY stream */
    size_t limits[3];          /* stack, printf FIFO, malloc heap (cuCtxSetLimit) */
    uint64_t limit_charged;    /* device bytes the limits above their defaults cost */
    _Atomic uint32_t peers;    /* simulated devices whose memory it may access (bit per index) */
};

/* Per visible device, process-local. */
struct cu_device {
    unsigned dev; /* simulated device index */
    pthread_mutex_t lock; /* guards the primary context */
    /* Guards cursor. Apart from d->lock because released held work runs
     * under the gate lock, which a primary context's end takes under lock. */
    pthread_mutex_t run_lock;
    struct sim_engine_cursor cursor;
    struct CUctx_st primary;
    int primary_refs;
    CUmemoryPool default_pool;
    CUmemoryPool current_pool;
};

struct cu_process {
    struct sim_state *st;
    struct sim_proc *slot;
    int pid;
    int count; /* visible devices */
    struct cu_device devices[SIM_MAX_DEVICES];
};

/* The process's driver, or NULL before a successful cuInit. */
extern struct cu_process *cu_proc;
/* One process-local lock for the tables (allocations, modules, pools). */
extern pthread_mutex_t cu_lock;
/* The API lock a real driver holds inside some calls: a synchronous copy or
 * memset holds it while it waits for the context's queued work, and an
 * event record takes it. So a thread that waits in the driver for work
 * held behind a gate blocks another thread's event record meanwhile, as on
 * a GPU (docs/simulator.md). */
extern pthread_mutex_t cu_api_lock;

/* ---- init and devices (cu_init.c) ---- */
CUresult cu_ready(void); /* CUDA_SUCCESS once cuInit succeeded */
CUresult cu_device_of(CUdevice ordinal, struct cu_device **out);

/* ---- contexts (cu_ctx.c) ---- */
CUresult cu_current(CUcontext *out); /* the current context, INVALID_CONTEXT if none */
bool cu_ctx_valid(CUcontext ctx);
/* After fork: the child's thread starts with no current context. */
void cu_ctx_forget_thread(void);

/* ---- memory (cu_alloc.c) ---- */
enum cu_alloc_kind {
    CU_ALLOC_DEVICE,     /* cuMemAlloc*, pitch, async/pool */
    CU_ALLOC_MANAGED,    /* cuMemAllocManaged: charged to the device */
    CU_ALLOC_ARRAY,      /* CUDA array backing: charged, not addressable */
    CU_ALLOC_HOST,       /* cuMemHostAlloc / cuMemAllocHost: host memory */
    CU_ALLOC_REGISTERED, /* cuMemHostRegister: the caller's own memory */
    CU_ALLOC_IPC,        /* another process's allocation, opened here */
    CU_ALLOC_VMM,        /* a cuMemMap'd range of a reservation */
};

/* One entry of the process's allocation table: a non-overlapping range. */
struct cu_alloc {
    uintptr_t base;
    size_t size;    /* as asked */
    size_t map_len; /* length of the mapping we own (0 if none) */
    enum cu_alloc_kind kind;
    CUcontext ctx; /* NULL for VMM ranges */
    unsigned dev;
    uint64_t charged;  /* device bytes charged to this process */
    int fd;            /* memfd once exported through IPC, else -1 */
    CUmemoryPool pool; /* stream-ordered allocations: the owning pool */
    bool in_pool;      /* freed to the pool, held until trimmed */
    void *vmm;         /* CU_ALLOC_VMM: the physical allocation mapped here */
    bool launched;     /* a graph memory node's allocation: its graph ran */
};

/* Charge bytes on dev to this process: CUDA_SUCCESS or OUT_OF_MEMORY. */
CUresult cu_charge(unsigned dev, uint64_t bytes);
void cu_uncharge(unsigned dev, uint64_t bytes);
/* Charge, map and record `bytes` of zeroed device memory on dev for ctx;
 * *out (optional) receives the entry. Takes cu_lock. */
CUresult cu_alloc_new(CUcontext ctx, unsigned dev, size_t bytes, enum cu_alloc_kind kind,
                      struct cu_alloc **out);
/* Free the entry starting at ptr if it has one of the kinds in kind_mask
 * (bit per enum cu_alloc_kind); INVALID_VALUE otherwise. Takes cu_lock. */
CUresult cu_alloc_free(uintptr_t ptr, unsigned kind_mask);
/* Unmap, uncharge and drop an entry (cu_lock held). */
void cu_alloc_release(struct cu_alloc *a);
/* Record a range; NULL if out of host memory (cu_lock held). */
struct cu_alloc *cu_table_insert(const struct cu_alloc *a);
struct cu_alloc *cu_table_find(uintptr_t addr);  /* entry containing addr */
struct cu_alloc *cu_table_base(uintptr_t base);  /* entry starting at base */
/* Does any entry overlap [addr, addr + len)? */
bool cu_table_overlaps(uintptr_t addr, size_t len);
/* The table in address order (cu_lock held). */
size_t cu_table_len(void);
struct cu_alloc *cu_table_at(size_t i);
/* First entry of kind starting in [addr, addr + len). */
struct cu_alloc *cu_table_next_in(uintptr_t addr, size_t len, enum cu_alloc_kind kind);
/* Drop every allocation of a context that goes away (cu_lock held). */
void cu_table_release_ctx(CUcontext ctx);
/* Does [addr, addr + len) lie inside one addressable allocation? */
bool cu_range_known(uintptr_t addr, size_t len);
/* Map fresh zeroed memory (page-rounded length in *map_len). */
void *cu_map_anon(size_t bytes, size_t *map_len);
/* CUDA ordinal of a simulated device in this process, -1 if not visible. */
int cu_ordinal_of(unsigned dev);

#define CU_KIND(k) (1u << (k))

/* ---- pools (cu_pool.c) ---- */
void cu_pools_release_on_sync(void); /* pools give back memory above their threshold */
/* Take a freed pool allocation back into its pool (cu_lock held). */
void cu_pool_take_back(struct cu_alloc *a);
/* A pool allocation leaves the table: the pool forgets it (cu_lock held). */
void cu_pool_note_release(const struct cu_alloc *a);

/* ---- streams and timeline (cu_stream.c) ---- */
/* Resolve a stream argument; per_thread: NULL means the per-thread stream. */
CUresult cu_stream_resolve(CUstream h, bool per_thread, CUstream *out);
/* Queue `duration` ns of device work on s; returns its end time. */
uint64_t cu_stream_run(CUstream s, uint64_t duration);
/* Until when the stream's device has work claimed, by any process. */
uint64_t cu_device_busy_until(CUstream s);
/* Raise *target to value if it is lower. */
void cu_store_max(_Atomic uint64_t *target, uint64_t value);
/* Wait for a time; pools then release what they hold above threshold. */
void cu_wait_until(uint64_t t);

/* ---- modules and launches (cu_module.c, cu_launch.c) ---- */
/* vgpu_touch: the hook's empty kernel (libhook/src/gt_touch.c), no time. */
enum cu_kernel_kind { CU_KERNEL_OTHER, CU_KERNEL_SPIN, CU_KERNEL_FILL, CU_KERNEL_TOUCH };

struct CUfunc_st {
    uint32_t tag;
    CUmodule module;
    enum cu_kernel_kind kind;
    struct CUfunc_st *next;
    char name[];
};

/* A kernel ready to run: how long, and what it does to memory. */
struct cu_kernel_work {
    enum cu_kernel_kind kind;
    uint64_t duration;
    uint64_t fill_ptr, fill_n;
    uint32_t fill_value;
};

CUresult cu_kernel_prepare(CUfunction f, uint64_t blocks, void **params, void **extra,
                           struct cu_kernel_work *out);
/* Run or capture prepared work on a resolved stream. */
CUresult cu_kernel_submit(CUstream s, const struct cu_kernel_work *work);
/* Its effect on memory and its device time, when its stream reaches it. */
void cu_kernel_execute(CUstream s, const struct cu_kernel_work *work);

/* ---- stream work and host-gated waits (cu_gate.c) ---- */
enum cu_work_kind {
    CU_WORK_KERNEL,
    CU_WORK_COPY,        /* an asynchronous copy or set */
    CU_WORK_RECORD,      /* cuEventRecord */
    CU_WORK_WAIT_EVENT,  /* cuStreamWaitEvent */
    CU_WORK_WAIT_VALUE,  /* cuStreamWaitValue32/64 */
    CU_WORK_WRITE_VALUE, /* cuStreamWriteValue32/64 */
};

/* One item of a stream's queue, kept as it is while the stream is held. */
struct cu_work {
    enum cu_work_kind kind;
    union {
        struct cu_kernel_work kernel;
        struct {
            uintptr_t dst, src;
            size_t n;
            bool dst_known, src_known; /* in the allocation table: checked again when run */
            bool stage; /* pageable source: copied aside if the work has to wait */
            void *owned; /* that copy, then the source */
        } copy;
        struct {
            CUevent event;
            uint64_t gen; /* the record this work is (RECORD, set when held) */
        } event;
        struct {
            uintptr_t addr;
            uint64_t value;
            unsigned flags;
            bool wide; /* 64-bit */
        } mem;
    };
};

/* How often blocking calls look at the host words of held streams. */
#define CU_GATE_POLL_NS 20000u

/* Queue work on a resolved, non-capturing stream: it runs now, or waits
 * behind the stream's unsatisfied wait (or, on the legacy stream and
 * blocking streams, behind the other side's held work). Takes `owned`. */
CUresult cu_stream_submit(CUstream s, const struct cu_work *w);
/* Notice host words that changed and run the work they release. */
void cu_gates_poll(void);
bool cu_stream_held(CUstream s);
/* Block, polling every CU_GATE_POLL_NS, until s holds nothing. */
void cu_stream_wait_released(CUstream s);
/* The same for the streams of ctx: all, or those the legacy stream
 * synchronises with (itself and the blocking streams). */
void cu_ctx_wait_released(CUcontext ctx, bool blocking_only);
/* After fork: the child holds nothing of the parent's. */
void cu_gates_forget(void);
/* A context goes away: its held work goes with it. */
void cu_ctx_drop_held(CUcontext ctx);
/* A stream handle goes away: freed now, or once its held work has run. */
void cu_stream_free(CUstream s);
/* An event handle goes away: freed now, or once no held work names it. */
void cu_event_free(CUevent e);
/* Block, polling, until e's latest record has been stamped. */
void cu_event_wait_stamped(CUevent e);

/* ---- graphs (cu_graph.c) ---- */
/* Record a kernel into a graph being built or captured. */
CUresult cu_graph_add_kernel(CUgraph g, const struct cu_kernel_work *work, CUgraphNode *node);

#pragma GCC visibility pop

#endif
