/*
 * hooks.c - the table of hooks.h, and the three ways to look a row up.
 * The table is small (about a hundred rows) and looked up at symbol
 * resolution time only, so plain scans are enough.
 */
#include <string.h>

#include "hooks.h"
#include "vgpu.h"

#define CUDA_ROW(name, base, since, ptsz) \
    {#name, #base, since, ptsz, (void *)name, (void *const *)&vgpu_real_cuda.name},
#define NEWER_ROW(name, base, since, ptsz) {#name, #base, since, ptsz, NULL, NULL},
#define NVML_ROW(name) {#name, #name, 0, 0, (void *)name, (void *const *)&vgpu_real_nvml.name},

static const struct hook_entry table[] = {
    HOOK_CUDA_LIST(CUDA_ROW) HOOK_NEWER_LIST(NEWER_ROW) HOOK_NVML_LIST(NVML_ROW)};

#define TABLE_SIZE (sizeof(table) / sizeof(table[0]))

int hooks_maybe_hooked(const char *name)
{
    /* Character by character, no strncmp: the dlsym override asks this of
     * every name, also while a sanitizer's runtime, whose strncmp cannot
     * forward yet, looks up its real functions. */
    return name != NULL && ((name[0] == 'c' && name[1] == 'u') ||
                            (name[0] == 'n' && name[1] == 'v' && name[2] == 'm' && name[3] == 'l'));
}

const struct hook_entry *hooks_by_name(const char *name)
{
    for (size_t i = 0; i < TABLE_SIZE; i++)
        if (table[i].wrapper != NULL && strcmp(table[i].name, name) == 0)
            return &table[i];
    return NULL;
}

const struct hook_entry *hooks_by_real(const void *fn)
{
    if (fn == NULL)
        return NULL;
    for (size_t i = 0; i < TABLE_SIZE; i++)
        if (table[i].real != NULL && *table[i].real == fn)
            return &table[i];
    return NULL;
}

/* Best row of `base` for a version among rows with the given ptsz. */
static const struct hook_entry *best_variant(const char *base, int cuda_version, int ptsz)
{
    const struct hook_entry *best = NULL;
    for (size_t i = 0; i < TABLE_SIZE; i++) {
        const struct hook_entry *row = &table[i];
        if (row->ptsz != ptsz || row->since > cuda_version || strcmp(row->base, base) != 0)
            continue;
        if (best == NULL || row->since > best->since)
            best = row;
    }
    return best;
}

static bool base_has_ptsz(const char *base)
{
    for (size_t i = 0; i < TABLE_SIZE; i++)
        if (table[i].ptsz && strcmp(table[i].base, base) == 0)
            return true;
    return false;
}

const struct hook_entry *hooks_by_version(const char *base, int cuda_version, int ptsz)
{
    if (base == NULL)
        return NULL;
    return best_variant(base, cuda_version, ptsz && base_has_ptsz(base));
}
