/*
 * test_elfsym.c - elfsym_lookup, which the dlsym override uses while the
 * loader is still starting up, finds in every object of this process what
 * glibc's dlsym finds defined there: functions, data, IFUNCs (strlen,
 * memcpy), names with several versions (the default one), the vDSO's
 * functions, and nothing for a name the object does not define.
 */
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

#include "../src/elfsym.c"
#include "check.h"

static const char *const names[] = {
    "mmap",              /* a plain function */
    "strlen",            /* an IFUNC: the loader's choice of implementation */
    "memcpy",            /* an IFUNC with a compat version beside the default */
    "pthread_cond_wait", /* two versions: the default one is the answer */
    "dlsym",             /* moved into libc with a new version in glibc 2.34 */
    "environ",           /* data */
    "clock_gettime",     /* in libc and in the vDSO */
    "__vdso_clock_gettime",
    "vgpu_no_such_symbol",
};

/* What glibc says `obj` itself defines: dlsym through a handle of it,
 * kept only when the definition is in `obj` (not one of its dependencies). */
static void *glibc_says(struct link_map *obj, const char *name)
{
    Dl_info info;
    struct link_map *owner = NULL;
    void *handle = dlopen(obj->l_name, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == NULL)
        return NULL;
    void *fn = dlsym(handle, name);
    if (fn != NULL && (dladdr1(fn, &info, (void **)&owner, RTLD_DL_LINKMAP) == 0 || owner != obj))
        fn = NULL;
    dlclose(handle);
    return fn;
}

int main(void)
{
    struct link_map *obj = NULL;
    void *self = dlopen(NULL, RTLD_NOW);
    CHECK(self != NULL && dlinfo(self, RTLD_DI_LINKMAP, &obj) == 0);
    int objects = 0, found = 0;
    for (; obj != NULL; obj = obj->l_next) {
        if (obj->l_name == NULL || obj->l_name[0] == '\0')
            continue; /* the program: not searched by the override either */
        objects++;
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            void *want = glibc_says(obj, names[i]), *got = elfsym_lookup(obj, names[i]);
            found += want != NULL;
            CHECKF(got == want, "%s in %s: elfsym %p, glibc %p", names[i], obj->l_name, got, want);
        }
    }
    CHECKF(objects >= 2 && found >= 6, "%d objects, %d definitions compared", objects, found);
    return check_report("test_elfsym");
}
