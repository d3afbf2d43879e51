/*
 * gt_touch.c - an empty kernel of the hook's own, queued between a gate
 * and its batch's start event where the stream has nothing left on the
 * GPU (gputime.h, "Touched"). One module per context, loaded at the
 * first batch that wants it, and run once there before any gate of the
 * stream shuts: a module's first launch may load it lazily, which waits
 * for the context's work, and behind a shut gate that would be for ever.
 */
#include <string.h>

#include "gt_state.h"

static const char touch_ptx[] = ".version 6.0\n"
                                ".target sm_50\n"
                                ".address_size 64\n"
                                ".visible .entry vgpu_touch()\n"
                                "{\n"
                                "\tret;\n"
                                "}\n";

/* Contexts with a touch kernel (or where it failed): beyond that many,
 * batches go untouched, and may be charged more, never less. */
#define TOUCH_CONTEXTS 32

static struct {
    CUcontext ctx;
    CUfunction fn; /* NULL: it failed there, not tried again */
} touches[TOUCH_CONTEXTS];
static pthread_mutex_t touch_lock = PTHREAD_MUTEX_INITIALIZER;

static int slot_of(CUcontext ctx)
{
    for (int i = 0; i < TOUCH_CONTEXTS; i++)
        if (touches[i].ctx == ctx)
            return i;
    return -1;
}

static CUresult launch(CUfunction fn, CUstream stream)
{
    return vgpu_real_cuda.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL);
}

static void failed(const char *what)
{
    log_info("no touch kernel in a context (%s): its batches that open on a drained stream "
             "beside another context may be charged that context's time slice",
             what);
}

/* See gt_state.h. Its memory counts in the vGPU as any module's does
 * (ctx_own_module_load). */
CUfunction gt_touch_function(struct gt_stream *s)
{
    pthread_mutex_lock(&touch_lock);
    int i = slot_of(s->ctx);
    CUfunction fn = i >= 0 ? touches[i].fn : NULL;
    if (i < 0 && (i = slot_of(NULL)) >= 0) {
        CUmodule module = NULL;
        if (ctx_own_module_load(&module, touch_ptx) != CUDA_SUCCESS ||
            vgpu_real_cuda.cuModuleGetFunction(&fn, module, "vgpu_touch") != CUDA_SUCCESS ||
            launch(fn, s->record_on) != CUDA_SUCCESS) {
            fn = NULL;
            if (module != NULL)
                cuModuleUnload(module); /* the hook's own: its charge given back */
            failed("not loaded");
        }
        touches[i].ctx = s->ctx;
        touches[i].fn = fn;
    }
    pthread_mutex_unlock(&touch_lock);
    return fn;
}

/* See gt_state.h. */
void gt_touch(struct gt_stream *s, CUfunction fn)
{
    if (launch(fn, s->record_on) == CUDA_SUCCESS) {
        gt_tally_touch();
        return;
    }
    pthread_mutex_lock(&touch_lock);
    int i = slot_of(s->ctx);
    if (i >= 0 && touches[i].fn != NULL) {
        touches[i].fn = NULL;
        failed("a launch failed");
    }
    pthread_mutex_unlock(&touch_lock);
}

void gt_touch_reset(void)
{
    memset(touches, 0, sizeof(touches));
    pthread_mutex_init(&touch_lock, NULL);
}

void gt_touch_forget(CUcontext ctx)
{
    pthread_mutex_lock(&touch_lock);
    int i = slot_of(ctx);
    if (i >= 0)
        touches[i].ctx = NULL;
    pthread_mutex_unlock(&touch_lock);
}
