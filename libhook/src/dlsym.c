/*
 * dlsym.c - the dlsym override: the road of programs (and the CUDA runtime)
 * that dlopen the driver and look entry points up by name.
 *
 * We ask glibc's dlsym first, exactly as the caller asked. If it finds a
 * hooked name, the caller gets our wrapper instead, whatever the handle (the
 * driver's, RTLD_DEFAULT, a library that depends on it, or another copy of
 * the driver than the one we loaded: a hooked name never escapes, so a
 * misconfigured VGPU_REAL_LIBCUDA cannot open a way around the limits).
 * Every other answer is exactly glibc's.
 *
 * RTLD_NEXT is relative to the caller, and glibc takes the caller from the
 * return address, which would be us. We therefore walk the link map from
 * the caller's object onwards ourselves.
 *
 * That walk must not call dlopen while the loader is still running the
 * initialisers of the objects loaded with us: a sanitizer's runtime looks
 * its real functions up with dlsym(RTLD_NEXT) from its initialiser, before
 * its own dlopen interceptor is ready (a call through NULL), and glibc's
 * dlopen of an object not yet initialised would run its constructors out
 * of order. Until our constructor has run, an object's definitions are read
 * from its own symbol table (elfsym.c); from then on each object is opened
 * with RTLD_NOLOAD and asked through glibc, which also keeps it loaded
 * while we look.
 */
#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>

#include "hooks.h"
#include "vgpu.h"

static atomic_bool loader_up;

__attribute__((constructor)) static void dlsym_loader_up(void)
{
    atomic_store_explicit(&loader_up, true, memory_order_release);
}

/* `symbol` as defined by `obj` itself (not by its dependencies); the
 * program (an object with no name) is not searched, as glibc's RTLD_NEXT
 * from a library does not search it. */
static void *defined_by(struct link_map *obj, const char *symbol)
{
    Dl_info info;
    struct link_map *owner = NULL;
    if (obj->l_name == NULL || obj->l_name[0] == '\0')
        return NULL;
    if (!atomic_load_explicit(&loader_up, memory_order_acquire))
        return elfsym_lookup(obj, symbol);
    void *handle = dlopen(obj->l_name, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == NULL)
        return NULL;
    void *fn = resolve_real_dlsym(handle, symbol);
    if (fn != NULL && (dladdr1(fn, &info, (void **)&owner, RTLD_DL_LINKMAP) == 0 || owner != obj))
        fn = NULL;
    dlclose(handle);
    return fn;
}

/*
 * RTLD_NEXT for `caller`: the first object after the caller's that defines
 * `symbol`. For a caller loaded before us (the program, an earlier preload)
 * the objects up to us are searched one by one, and from us on glibc's own
 * RTLD_NEXT (asked from here) is exact. For a caller loaded after us we walk
 * the rest of the link map ourselves; that walk also sees objects opened
 * RTLD_LOCAL, which glibc would skip (a documented limit).
 */
static void *next_after(const void *caller, const char *symbol)
{
    Dl_info info;
    struct link_map *from = NULL, *self = NULL;
    if (dladdr1(caller, &info, (void **)&from, RTLD_DL_LINKMAP) == 0 || from == NULL ||
        dladdr1((void *)dlsym, &info, (void **)&self, RTLD_DL_LINKMAP) == 0 || self == NULL)
        return resolve_real_dlsym(RTLD_NEXT, symbol);
    struct link_map *obj = from->l_next;
    for (; obj != NULL && obj != self; obj = obj->l_next) {
        void *fn = defined_by(obj, symbol);
        if (fn != NULL)
            return fn;
    }
    if (obj == self) {
        void *fn = defined_by(self, symbol);
        return fn != NULL ? fn : resolve_real_dlsym(RTLD_NEXT, symbol);
    }
    for (obj = from->l_next; obj != NULL; obj = obj->l_next) {
        void *fn = defined_by(obj, symbol);
        if (fn != NULL)
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
    return row != NULL ? row->wrapper : fn;
}
