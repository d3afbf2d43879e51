/*
 * cu_module.c - modules and functions. No code runs: a PTX image is
 * scanned for its `.entry NAME` declarations so that a missing kernel
 * fails like on a GPU; a binary image (cubin ELF, fatbin) is trusted to
 * hold whatever function is asked for. Two names mean something to the
 * simulator (see docs/simulator.md): vgpu_spin runs for the time it is
 * given, vgpu_fill writes memory.
 */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "cu_sim.h"

#define ELF_MAGIC 0x464c457fu     /* "\x7fELF" */
#define FATBIN_MAGIC 0xba55ed50u  /* fatbin payload */
#define FATBIN_WRAPPER 0x466243b1u /* fatbin wrapper */

struct CUmod_st {
    uint32_t tag;
    bool any_name; /* a binary image: every name resolves */
    char *entries; /* PTX: the .entry names, each NUL-terminated, then "" */
    struct CUfunc_st *functions;
    unsigned dev;      /* the simulated device its context is on */
    uint64_t charged;  /* VGPU_SIM_MODULE_BYTES, given back at unload */
};

static bool ident_char(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == '$';
}

/* The .entry names of a PTX text as a NUL-separated, ""-terminated list. */
static char *ptx_entries(const char *text)
{
    size_t len = strlen(text);
    char *names = malloc(len + 2), *out = names;
    if (names == NULL)
        return NULL;
    for (const char *p = strstr(text, ".entry"); p != NULL; p = strstr(p + 1, ".entry")) {
        if ((p > text && !isspace((unsigned char)p[-1])) || !isspace((unsigned char)p[6]))
            continue;
        const char *name = p + 6;
        while (isspace((unsigned char)*name))
            name++;
        size_t n = 0;
        while (ident_char(name[n]))
            n++;
        if (n == 0)
            continue;
        memcpy(out, name, n);
        out += n;
        *out++ = '\0';
    }
    *out = '\0';
    return names;
}

static bool ptx_defines(const char *entries, const char *name)
{
    for (const char *e = entries; *e != '\0'; e += strlen(e) + 1)
        if (strcmp(e, name) == 0)
            return true;
    return false;
}

static CUresult module_load(CUmodule *module, const void *image)
{
    CUcontext ctx;
    CUresult r = cu_current(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (module == NULL || image == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUmodule m = calloc(1, sizeof(*m));
    if (m == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint32_t magic;
    memcpy(&magic, image, sizeof(magic));
    if (magic == ELF_MAGIC || magic == FATBIN_MAGIC || magic == FATBIN_WRAPPER) {
        m->any_name = true;
    } else if (strstr(image, ".version") == NULL) {
        free(m);
        return CUDA_ERROR_INVALID_IMAGE;
    } else if ((m->entries = ptx_entries(image)) == NULL) {
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->dev = ctx->dev;
    m->charged = cu_proc->st->config.module_bytes;
    if (cu_charge(m->dev, m->charged) != CUDA_SUCCESS) {
        free(m->entries);
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->tag = CU_TAG_MODULE;
    *module = m;
    return CUDA_SUCCESS;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    return module_load(module, image);
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options,
                            void **optionValues)
{
    if (numOptions > 0 && (options == NULL || optionValues == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    return module_load(module, image); /* JIT options change nothing here */
}

static enum cu_kernel_kind kind_of(const char *name)
{
    if (strcmp(name, "vgpu_spin") == 0)
        return CU_KERNEL_SPIN;
    if (strcmp(name, "vgpu_fill") == 0)
        return CU_KERNEL_FILL;
    if (strcmp(name, "vgpu_touch") == 0)
        return CU_KERNEL_TOUCH;
    return CU_KERNEL_OTHER;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (hfunc == NULL || name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (hmod == NULL || hmod->tag != CU_TAG_MODULE)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&cu_lock);
    struct CUfunc_st *f = hmod->functions;
    while (f != NULL && strcmp(f->name, name) != 0)
        f = f->next;
    if (f == NULL && !hmod->any_name && !ptx_defines(hmod->entries, name)) {
        r = CUDA_ERROR_NOT_FOUND;
    } else if (f == NULL) {
        f = malloc(sizeof(*f) + strlen(name) + 1);
        if (f == NULL) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            f->tag = CU_TAG_FUNC;
            f->module = hmod;
            f->kind = kind_of(name);
            strcpy(f->name, name);
            f->next = hmod->functions;
            hmod->functions = f;
        }
    }
    if (r == CUDA_SUCCESS)
        *hfunc = f;
    pthread_mutex_unlock(&cu_lock);
    return r;
}

CUresult cuModuleUnload(CUmodule hmod)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (hmod == NULL || hmod->tag != CU_TAG_MODULE)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&cu_lock);
    for (struct CUfunc_st *f = hmod->functions, *next; f != NULL; f = next) {
        next = f->next;
        f->tag = CU_TAG_DEAD;
        free(f);
    }
    hmod->tag = CU_TAG_DEAD;
    cu_uncharge(hmod->dev, hmod->charged);
    free(hmod->entries);
    free(hmod);
    pthread_mutex_unlock(&cu_lock);
    return CUDA_SUCCESS;
}

/* CU_FUNC_ATTRIBUTE_* values of a small kernel on compute capability 9.0. */
static const int FUNC_ATTRIBUTES[] = {
    1024,  /* MAX_THREADS_PER_BLOCK */
    0,     /* SHARED_SIZE_BYTES */
    0,     /* CONST_SIZE_BYTES */
    0,     /* LOCAL_SIZE_BYTES */
    32,    /* NUM_REGS */
    70,    /* PTX_VERSION */
    90,    /* BINARY_VERSION */
    0,     /* CACHE_MODE_CA */
    49152, /* MAX_DYNAMIC_SHARED_SIZE_BYTES */
    -1,    /* PREFERRED_SHARED_MEMORY_CARVEOUT */
};
#define FUNC_ATTRIBUTE_LIMIT 20 /* the driver's enum ends below this */

CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    CUresult r = cu_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (pi == NULL || attrib < 0 || attrib >= FUNC_ATTRIBUTE_LIMIT)
        return CUDA_ERROR_INVALID_VALUE;
    if (hfunc == NULL || hfunc->tag != CU_TAG_FUNC)
        return CUDA_ERROR_INVALID_HANDLE;
    size_t known = sizeof(FUNC_ATTRIBUTES) / sizeof(FUNC_ATTRIBUTES[0]);
    *pi = (size_t)attrib < known ? FUNC_ATTRIBUTES[attrib] : 0;
    return CUDA_SUCCESS;
}
