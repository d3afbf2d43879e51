/*
 * dlsym.c - the dlsym override: the road of programs (and the CUDA runtime)
 * that dlopen the driver and look entry points up by name.
 *
 * We ask glibc's dlsym first, exactly as the caller asked; if the answer is
 * the driver's own pointer for a hooked name, we hand out our wrapper
 * instead. Comparing pointers rather than handles covers every handle that
 * can reach the driver (its own, RTLD_DEFAULT, a library that depends on
 * it) and leaves everything else exactly as glibc answers it.
 *
 * RTLD_NEXT is relative to the caller, and glibc takes the caller from the
 * return address, which would be us. We therefore walk the link map from
 * the caller's object onwards ourselves.
 */
#include <dlfcn.h>
#include <link.h>

#include "hooks.h"
#include "vgpu.h"

/* The first object after the caller's, in load order, that itself defines
 * `symbol` (what RTLD_NEXT means for objects loaded at startup). Objects are
 * looked up through a proper handle (dlopen RTLD_NOLOAD); those without one
 * (the vDSO) are skipped. */
static void *next_after(const void *caller, const char *symbol)
{
    Dl_info info;
    struct link_map *self = NULL;
    if (dladdr1(caller, &info, (void **)&self, RTLD_DL_LINKMAP) == 0 || self == NULL)
        return resolve_real_dlsym(RTLD_NEXT, symbol);
    for (struct link_map *obj = self->l_next; obj != NULL; obj = obj->l_next) {
        void *handle = obj->l_name != NULL && obj->l_name[0] != '\0'
                           ? dlopen(obj->l_name, RTLD_LAZY | RTLD_NOLOAD)
                           : NULL;
        if (handle == NULL)
            continue;
        void *fn = resolve_real_dlsym(handle, symbol);
        struct link_map *owner = NULL;
        bool own = fn != NULL && dladdr1(fn, &info, (void **)&owner, RTLD_DL_LINKMAP) != 0 &&
                   owner == obj;
        dlclose(handle);
        if (own)
            return fn;
    }
    return NULL;
}

VGPU_EXPORT void *dlsym(void *handle, const char *symbol)
{
    void *fn = handle == RTLD_NEXT ? next_after(__builtin_return_address(0), symbol)
                                   : resolve_real_dlsym(handle, symbol);
    if (fn == NULL || !hooks_maybe_hooked(symbol) || resolve_busy())
        return fn;
    const struct hook_entry *row = hooks_by_name(symbol);
    if (row == NULL)
        return fn;
    resolve_init();
    return fn == *row->real ? row->wrapper : fn;
}
