/*
 * elfsym.c - a symbol's default definition in one loaded object, read from
 * the object's own dynamic symbol table (ELF gABI, the GNU hash and symbol
 * versioning extensions), without asking the loader.
 *
 * The dlsym override needs "what does this object define" while the loader
 * is still running the initialisers of the objects loaded with us, when it
 * must not call dlopen (dlsym.c says why). Only what glibc's dlsym would
 * return for a handle of that object is returned: a defined, global or weak
 * function or object, of the default version (a hidden, older version of a
 * name is not its definition), resolved through its IFUNC resolver as the
 * loader would. Thread-local symbols need the loader: they are not found.
 *
 * It calls no libc function: while a sanitizer's runtime initialises, the
 * libc names it intercepts (strcmp, memset...) lead to its interceptors,
 * which cannot forward yet.
 */
#include <elf.h>
#include <link.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/auxv.h>

#include "vgpu.h"

struct dynsyms {
    ElfW(Addr) base;
    const ElfW(Sym) *symtab;
    const char *strtab;
    const ElfW(Half) *versym; /* NULL: the object has no versions */
    const uint32_t *gnu_hash;
    const ElfW(Word) *sysv_hash;
};

/* The loader writes absolute addresses into a writable dynamic section and
 * leaves a read-only one (the vDSO's) as offsets from the object's base. */
static const void *dyn_ptr(ElfW(Addr) base, ElfW(Addr) ptr)
{
    return (const void *)(ptr < base ? base + ptr : ptr);
}

static int dynsyms_of(const struct link_map *obj, struct dynsyms *out)
{
    *out = (struct dynsyms){.base = obj->l_addr};
    if (obj->l_ld == NULL)
        return -1;
    for (const ElfW(Dyn) *d = obj->l_ld; d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_SYMTAB:
            out->symtab = dyn_ptr(out->base, d->d_un.d_ptr);
            break;
        case DT_STRTAB:
            out->strtab = dyn_ptr(out->base, d->d_un.d_ptr);
            break;
        case DT_VERSYM:
            out->versym = dyn_ptr(out->base, d->d_un.d_ptr);
            break;
        case DT_GNU_HASH:
            out->gnu_hash = dyn_ptr(out->base, d->d_un.d_ptr);
            break;
        case DT_HASH:
            out->sysv_hash = dyn_ptr(out->base, d->d_un.d_ptr);
            break;
        default:
            break;
        }
    }
    return out->symtab != NULL && out->strtab != NULL &&
                   (out->gnu_hash != NULL || out->sysv_hash != NULL)
               ? 0
               : -1;
}

static bool same_name(const char *a, const char *b)
{
    while (*a != '\0' && *a == *b)
        a++, b++;
    return *a == *b;
}

static uint32_t gnu_hash(const char *name)
{
    uint32_t h = 5381;
    for (const unsigned char *c = (const unsigned char *)name; *c != '\0'; c++)
        h = h * 33 + *c;
    return h;
}

static uint32_t sysv_hash(const char *name)
{
    uint32_t h = 0;
    for (const unsigned char *c = (const unsigned char *)name; *c != '\0'; c++) {
        h = (h << 4) + *c;
        uint32_t g = h & 0xf0000000u;
        h ^= g >> 24;
        h &= ~g;
    }
    return h;
}

/* What the loader would bind `name` to at symbol index `i`, or 0. */
static ElfW(Addr) definition(const struct dynsyms *ds, uint32_t i, const char *name)
{
    const ElfW(Sym) *sym = &ds->symtab[i];
    /* st_info is one byte in both ELF classes, split the same way. */
    unsigned type = ELF64_ST_TYPE(sym->st_info), bind = ELF64_ST_BIND(sym->st_info);
    if (sym->st_shndx == SHN_UNDEF || sym->st_value == 0 ||
        (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE) ||
        (type != STT_NOTYPE && type != STT_OBJECT && type != STT_FUNC && type != STT_GNU_IFUNC))
        return 0;
    if (ds->versym != NULL && ((ds->versym[i] & 0x8000) != 0 || (ds->versym[i] & 0x7fff) == 0))
        return 0; /* a hidden (older) version, or local */
    if (!same_name(ds->strtab + sym->st_name, name))
        return 0;
    ElfW(Addr) addr = ds->base + sym->st_value;
    if (type != STT_GNU_IFUNC)
        return addr;
#if defined(__aarch64__)
    /* The loader's call: hwcap with _IFUNC_ARG_HWCAP, and the argument block. */
    struct {
        unsigned long size, hwcap, hwcap2;
    } arg = {sizeof(arg), getauxval(AT_HWCAP), getauxval(AT_HWCAP2)};
    return ((ElfW(Addr)(*)(uint64_t, const void *))addr)(arg.hwcap | (1ULL << 62), &arg);
#else
    return ((ElfW(Addr)(*)(void))addr)();
#endif
}

static ElfW(Addr) lookup_gnu(const struct dynsyms *ds, const char *name)
{
    const uint32_t *h = ds->gnu_hash;
    uint32_t nbuckets = h[0], symoffset = h[1], bloom_words = h[2];
    const uint32_t *buckets = (const uint32_t *)((const ElfW(Addr) *)&h[4] + bloom_words);
    const uint32_t *chain = buckets + nbuckets;
    uint32_t hash = gnu_hash(name);
    if (nbuckets == 0)
        return 0;
    for (uint32_t i = buckets[hash % nbuckets]; i >= symoffset && i != 0; i++) {
        uint32_t link = chain[i - symoffset];
        ElfW(Addr) addr = (link | 1) == (hash | 1) ? definition(ds, i, name) : 0;
        if (addr != 0)
            return addr;
        if (link & 1)
            break; /* the end of this bucket's chain */
    }
    return 0;
}

static ElfW(Addr) lookup_sysv(const struct dynsyms *ds, const char *name)
{
    const ElfW(Word) *h = ds->sysv_hash;
    ElfW(Word) nbuckets = h[0], nchain = h[1];
    const ElfW(Word) *buckets = &h[2], *chain = &buckets[nbuckets];
    if (nbuckets == 0)
        return 0;
    /* Bounded by the chain's length: a loop in a corrupt table ends. */
    ElfW(Word) i = buckets[sysv_hash(name) % nbuckets];
    for (ElfW(Word) n = 0; i != STN_UNDEF && i < nchain && n < nchain; i = chain[i], n++) {
        ElfW(Addr) addr = definition(ds, i, name);
        if (addr != 0)
            return addr;
    }
    return 0;
}

void *elfsym_lookup(const struct link_map *obj, const char *symbol)
{
    struct dynsyms ds;
    if (dynsyms_of(obj, &ds) != 0)
        return NULL;
    ElfW(Addr) addr = ds.gnu_hash != NULL ? lookup_gnu(&ds, symbol) : lookup_sysv(&ds, symbol);
    return (void *)addr;
}
