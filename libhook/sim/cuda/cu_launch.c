/*
 * cu_launch.c - every launch path funnels into prepare (how long, what
 * effect) and submit (run on the stream's timeline, or record into the
 * graph the stream is capturing). Launches return at once, like on a GPU;
 * synchronisation waits for the simulated end time.
 */
#include <string.h>

#include "cu_sim.h"

#define CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE 720
#define LAUNCH_PARAM_END ((void *)0x00)
#define LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)
#define MAX_THREADS_PER_BLOCK 1024u
#define MAX_THREADS_PER_SM 2048u

/* Kernel arguments, passed either as kernelParams or as one packed buffer
 * in `extra`. Argument i of `size` bytes sits at `offset` in the buffer. */
struct kernel_args {
    void **params;
    const unsigned char *buffer;
    size_t buffer_size;
};

static CUresult args_from(void **params, void **extra, struct kernel_args *out)
{
    memset(out, 0, sizeof(*out));
    out->params = params;
    if (extra == NULL)
        return CUDA_SUCCESS;
    if (params != NULL)
        return CUDA_ERROR_INVALID_VALUE;
    for (void **p = extra; *p != LAUNCH_PARAM_END; p += 2) {
        if (p[0] == LAUNCH_PARAM_BUFFER_POINTER)
            out->buffer = p[1];
        else if (p[0] == LAUNCH_PARAM_BUFFER_SIZE && p[1] != NULL)
            out->buffer_size = *(const size_t *)p[1];
        else
            return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static bool arg(const struct kernel_args *a, unsigned index, size_t offset, size_t size, void *out)
{
    if (a->params != NULL && a->params[index] != NULL) {
        memcpy(out, a->params[index], size);
        return true;
    }
    if (a->buffer != NULL && offset + size <= a->buffer_size) {
        memcpy(out, a->buffer + offset, size);
        return true;
    }
    return false;
}

CUresult cu_kernel_prepare(CUfunction f, uint64_t blocks, void **params, void **extra,
                           struct cu_kernel_work *out)
{
    if (f == NULL || f->tag != CU_TAG_FUNC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (blocks == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct kernel_args a;
    CUresult r = args_from(params, extra, &a);
    if (r != CUDA_SUCCESS)
        return r;
    const struct sim_config *cfg = &cu_proc->st->config;
    memset(out, 0, sizeof(*out));
    out->kind = f->kind;
    out->duration = cfg->kernel_ns;
    switch (f->kind) {
    case CU_KERNEL_SPIN: { /* vgpu_spin(u64 ns, u64 *out): ns per wave of blocks */
        uint64_t ns = 0;
        if (!arg(&a, 0, 0, sizeof(ns), &ns))
            return CUDA_ERROR_INVALID_VALUE;
        out->duration = ns * ((blocks + cfg->sms - 1) / cfg->sms);
        break;
    }
    case CU_KERNEL_FILL: /* vgpu_fill(u32 *p, u32 value, u64 n) */
        if (!arg(&a, 0, 0, sizeof(out->fill_ptr), &out->fill_ptr) ||
            !arg(&a, 1, 8, sizeof(out->fill_value), &out->fill_value) ||
            !arg(&a, 2, 16, sizeof(out->fill_n), &out->fill_n))
            return CUDA_ERROR_INVALID_VALUE;
        break;
    case CU_KERNEL_TOUCH:
        out->duration = 0;
        break;
    case CU_KERNEL_OTHER:
        break;
    }
    return CUDA_SUCCESS;
}

static bool fill_in_range(const struct cu_kernel_work *work)
{
    return work->fill_n <= SIZE_MAX / 4 && cu_range_known(work->fill_ptr, work->fill_n * 4);
}

CUresult cu_kernel_submit(CUstream s, const struct cu_kernel_work *work)
{
    if (s->capture != NULL)
        return cu_graph_add_kernel(s->capture, work, NULL);
    if (work->kind == CU_KERNEL_FILL && work->fill_n != 0 && !fill_in_range(work))
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    return cu_stream_submit(s, &(struct cu_work){.kind = CU_WORK_KERNEL, .kernel = *work});
}

void cu_kernel_execute(CUstream s, const struct cu_kernel_work *work)
{
    /* Checked again: memory freed while the kernel was held is skipped. */
    if (work->kind == CU_KERNEL_FILL && work->fill_n != 0 && fill_in_range(work)) {
        uint32_t *p = (uint32_t *)(uintptr_t)work->fill_ptr;
        for (uint64_t i = 0; i < work->fill_n; i++)
            p[i] = work->fill_value;
    }
    cu_stream_run(s, work->duration);
}

struct launch {
    CUfunction f;
    unsigned grid[3], block[3];
    CUstream stream;
    bool per_thread;
    bool cooperative;
    void **params, **extra;
};

static CUresult launch(const struct launch *l)
{
    CUstream s;
    CUresult r = cu_stream_resolve(l->stream, l->per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t threads = (uint64_t)l->block[0] * l->block[1] * l->block[2];
    uint64_t blocks = (uint64_t)l->grid[0] * l->grid[1] * l->grid[2];
    if (threads == 0 || threads > MAX_THREADS_PER_BLOCK || blocks == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (l->cooperative && blocks > (uint64_t)cu_proc->st->config.sms * (MAX_THREADS_PER_SM / threads))
        return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE; /* all blocks must be resident at once */
    struct cu_kernel_work work;
    r = cu_kernel_prepare(l->f, blocks, l->params, l->extra, &work);
    if (r != CUDA_SUCCESS)
        return r;
    return cu_kernel_submit(s, &work);
}

#define LAUNCH_ARGS(per_thread_, coop_, extra_)                                               \
    launch(&(struct launch){.f = f,                                                           \
                            .grid = {gridDimX, gridDimY, gridDimZ},                           \
                            .block = {blockDimX, blockDimY, blockDimZ},                       \
                            .stream = hStream,                                                \
                            .per_thread = (per_thread_),                                      \
                            .cooperative = (coop_),                                           \
                            .params = kernelParams,                                           \
                            .extra = (extra_)})

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    (void)sharedMemBytes;
    return LAUNCH_ARGS(false, false, extra);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    (void)sharedMemBytes;
    return LAUNCH_ARGS(true, false, extra);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams)
{
    (void)sharedMemBytes;
    return LAUNCH_ARGS(false, true, NULL);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams)
{
    (void)sharedMemBytes;
    return LAUNCH_ARGS(true, true, NULL);
}

static CUresult launch_ex(const CUlaunchConfig *config, CUfunction f, void **params, void **extra, bool per_thread)
{
    if (config == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(&(struct launch){.f = f,
                                   .grid = {config->gridDimX, config->gridDimY, config->gridDimZ},
                                   .block = {config->blockDimX, config->blockDimY, config->blockDimZ},
                                   .stream = config->hStream,
                                   .per_thread = per_thread,
                                   .params = params,
                                   .extra = extra});
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    return launch_ex(config, f, kernelParams, extra, false);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    return launch_ex(config, f, kernelParams, extra, true);
}

CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *launchParamsList, unsigned int numDevices,
                                              unsigned int flags)
{
    (void)flags;
    if (launchParamsList == NULL || numDevices == 0)
        return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < numDevices; i++) {
        const CUDA_LAUNCH_PARAMS *p = &launchParamsList[i];
        CUresult r = launch(&(struct launch){.f = p->function,
                                             .grid = {p->gridDimX, p->gridDimY, p->gridDimZ},
                                             .block = {p->blockDimX, p->blockDimY, p->blockDimZ},
                                             .stream = p->hStream,
                                             .cooperative = true,
                                             .params = p->kernelParams});
        if (r != CUDA_SUCCESS)
            return r;
    }
    return CUDA_SUCCESS;
}

/* The pre-4.0 launch API: block shape and arguments were set by calls the
 * simulator does not model, so these run one-thread blocks, no arguments. */
static CUresult legacy_launch(CUfunction f, int width, int height, CUstream stream)
{
    if (width <= 0 || height <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(&(struct launch){
        .f = f, .grid = {(unsigned)width, (unsigned)height, 1}, .block = {1, 1, 1}, .stream = stream});
}

CUresult cuLaunch(CUfunction f)
{
    return legacy_launch(f, 1, 1, NULL);
}

CUresult cuLaunchGrid(CUfunction f, int grid_width, int grid_height)
{
    return legacy_launch(f, grid_width, grid_height, NULL);
}

CUresult cuLaunchGridAsync(CUfunction f, int grid_width, int grid_height, CUstream hStream)
{
    return legacy_launch(f, grid_width, grid_height, hStream);
}
