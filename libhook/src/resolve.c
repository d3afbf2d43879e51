/*
 * resolve.c - find the real driver and NVML, and the real dlsym.
 *
 * The preloaded hook is a different object from libcuda.so.1, so
 * dlopen("libcuda.so.1") yields the real driver (the one the program would
 * have used). VGPU_REAL_LIBCUDA / VGPU_REAL_LIBNVML (full paths) override
 * that for unusual layouts. Every entry point of CUDA_API_LIST and
 * NVML_API_LIST is looked up once with glibc's own dlsym; a name the driver
 * lacks stays NULL and its wrapper answers CUDA_ERROR_NOT_FOUND.
 * resolve_init() reports the driver; NVML is optional.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "vgpu.h"

struct vgpu_cuda_fns vgpu_real_cuda;
struct vgpu_nvml_fns vgpu_real_nvml;

typedef void *(*dlsym_fn)(void *, const char *);
static _Atomic(dlsym_fn) real_dlsym;
static pthread_once_t resolve_once = PTHREAD_ONCE_INIT;
static int resolve_status = -1;
static bool nvml_loaded;
static _Thread_local bool resolving;

/* glibc 2.34 moved dlsym into libc with a new version; older binaries and
 * libcs only have the 2.2.5 one. dlvsym is not overridden, so it is safe. */
static dlsym_fn find_real_dlsym(void)
{
    dlsym_fn fn = atomic_load_explicit(&real_dlsym, memory_order_acquire);
    if (fn != NULL)
        return fn;
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5"};
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]) && fn == NULL; i++)
        fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (fn != NULL)
        atomic_store_explicit(&real_dlsym, fn, memory_order_release);
    return fn;
}

void *resolve_real_dlsym(void *handle, const char *symbol)
{
    dlsym_fn fn = find_real_dlsym();
    return fn != NULL ? fn(handle, symbol) : NULL;
}

bool resolve_busy(void)
{
    return resolving;
}

static void *open_library(const char *override_var, const char *soname)
{
    const char *path = secure_getenv(override_var);
    const char *name = path != NULL && *path != '\0' ? path : soname;
    void *handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL)
        vgpu_error_set("cannot load %s: %s", name, dlerror());
    return handle;
}

/* The two libraries are independent: a process may use NVML without a
 * driver library (nothing to wrap then) or the driver without NVML (then
 * only the overhead measurement and the NVML view are missing). */
static void resolve_tables(void)
{
    resolving = true;
    void *cuda = open_library("VGPU_REAL_LIBCUDA", "libcuda.so.1");
    if (cuda != NULL) {
#define RESOLVE_CUDA(ret, name, params, args) \
    vgpu_real_cuda.name = (__typeof__(name) *)resolve_real_dlsym(cuda, #name);
        CUDA_API_LIST(RESOLVE_CUDA)
#undef RESOLVE_CUDA
        resolve_status = 0;
    } else {
        log_verbose("%s", vgpu_error());
    }
    void *nvml = open_library("VGPU_REAL_LIBNVML", "libnvidia-ml.so.1");
    if (nvml != NULL) {
#define RESOLVE_NVML(ret, name, params, args) \
    vgpu_real_nvml.name = (__typeof__(name) *)resolve_real_dlsym(nvml, #name);
        NVML_API_LIST(RESOLVE_NVML)
#undef RESOLVE_NVML
        nvml_loaded = true;
    } else {
        log_verbose("%s", vgpu_error());
    }
    resolving = false;
}

int resolve_init(void)
{
    pthread_once(&resolve_once, resolve_tables);
    return resolve_status;
}

bool resolve_nvml_available(void)
{
    resolve_init();
    return nvml_loaded;
}
