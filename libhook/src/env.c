/*
 * env.c - the seed's environment interface: parsing and validation.
 *
 * Pure functions over strings (the values come through a getter, which is
 * secure_getenv in the library and a table in the unit test). A bad value
 * is never guessed at: env_load fails naming the variable, and the caller
 * refuses to start CUDA rather than run unlimited.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "vgpu.h"

#define MEM_LIMIT_PREFIX "CUDA_MEM_LIMIT_"

/* Digits only, no sign, no spaces; *end is the first non-digit. */
static int parse_digits(const char *text, uint64_t *out, const char **end)
{
    uint64_t value = 0;
    const char *p = text;
    if (!isdigit((unsigned char)*p))
        return -1;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned digit = (unsigned)(*p - '0');
        if (value > (UINT64_MAX - digit) / 10)
            return -1;
        value = value * 10 + digit;
    }
    *out = value;
    *end = p;
    return 0;
}

int env_parse_size(const char *text, uint64_t *out)
{
    uint64_t value;
    const char *p;
    if (text == NULL || parse_digits(text, &value, &p) != 0)
        return -1;
    unsigned shift = 0;
    switch (tolower((unsigned char)*p)) {
    case '\0':
        break;
    case 'k':
        shift = 10;
        break;
    case 'm':
        shift = 20;
        break;
    case 'g':
        shift = 30;
        break;
    case 't':
        shift = 40;
        break;
    default:
        return -1;
    }
    if (shift != 0 && p[1] != '\0')
        return -1;
    if (value > (UINT64_MAX >> shift))
        return -1;
    *out = value << shift;
    return 0;
}

int env_parse_percent(const char *text, unsigned *out)
{
    uint64_t value;
    const char *end;
    if (text == NULL || parse_digits(text, &value, &end) != 0 || *end != '\0' || value > 100)
        return -1;
    *out = (unsigned)value;
    return 0;
}

int env_parse_bool(const char *text, bool *out)
{
    if (text == NULL)
        return -1;
    if (strcasecmp(text, "true") == 0 || strcmp(text, "1") == 0)
        *out = true;
    else if (strcasecmp(text, "false") == 0 || strcmp(text, "0") == 0)
        *out = false;
    else
        return -1;
    return 0;
}

int env_parse_level(const char *text, int *out)
{
    uint64_t value;
    const char *end;
    if (text == NULL || parse_digits(text, &value, &end) != 0 || *end != '\0' ||
        value > VGPU_LOG_DETAIL)
        return -1;
    *out = (int)value;
    return 0;
}

int env_parse_uuids(const char *text, char out[][VGPU_UUID_LEN], unsigned max, unsigned *count)
{
    unsigned n = 0;
    const char *p = text;
    if (text == NULL)
        return -1;
    for (;;) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= VGPU_UUID_LEN || n == max)
            return -1;
        for (size_t i = 0; i < len; i++)
            if (!isalnum((unsigned char)p[i]) && p[i] != '-')
                return -1;
        memcpy(out[n], p, len);
        out[n][len] = '\0';
        n++;
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    *count = n;
    return 0;
}

int env_log_level(env_getter get)
{
    int level = VGPU_LOG_DEFAULT_LEVEL;
    const char *text = get("LOGGER_LEVEL");
    if (text != NULL && env_parse_level(text, &level) != 0)
        return -1;
    return level;
}

static const char *nonempty(const char *text)
{
    return text != NULL && *text != '\0' ? text : NULL;
}

static int load_mem_limit(struct vgpu_env *env, const char *name, const char *text, int index)
{
    uint64_t bytes;
    if (env_parse_size(text, &bytes) != 0) {
        vgpu_error_set("%s=\"%s\": not a size (digits with an optional k/m/g/t suffix)", name,
                       text);
        return -1;
    }
    if (bytes == 0) {
        vgpu_error_set("%s=\"%s\": a memory limit must be at least 1 byte", name, text);
        return -1;
    }
    env->standalone = true;
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        if (index >= 0 && i != index)
            continue;
        env->has_limit[i] = true;
        env->mem_limit[i] = bytes;
    }
    return 0;
}

/* Index of a CUDA_MEM_LIMIT_<i> name: canonical decimal below
 * VGPU_MAX_DEVICES, or -1. `len` is the name's length. */
static int mem_limit_index(const char *name, size_t len)
{
    size_t prefix = sizeof(MEM_LIMIT_PREFIX) - 1;
    size_t digits = len - prefix;
    if (digits == 0 || digits > 2 || (digits == 2 && name[prefix] == '0'))
        return -1;
    int index = 0;
    for (size_t i = prefix; i < len; i++) {
        if (!isdigit((unsigned char)name[i]))
            return -1;
        index = index * 10 + (name[i] - '0');
    }
    return index < VGPU_MAX_DEVICES ? index : -1;
}

static int load_per_device_limits(struct vgpu_env *env, env_getter get, char *const *names)
{
    for (char *const *entry = names; entry != NULL && *entry != NULL; entry++) {
        const char *eq = strchr(*entry, '=');
        size_t len = eq != NULL ? (size_t)(eq - *entry) : strlen(*entry);
        size_t prefix = sizeof(MEM_LIMIT_PREFIX) - 1;
        char name[64];
        if (len <= prefix - 1 || len >= sizeof(name) || strncmp(*entry, MEM_LIMIT_PREFIX, prefix))
            continue;
        memcpy(name, *entry, len);
        name[len] = '\0';
        const char *text = get(name);
        if (text == NULL) /* secure mode hides it: so do we */
            continue;
        int index = mem_limit_index(name, len);
        if (index < 0) {
            vgpu_error_set("%s: unknown variable (device index must be 0..%d)", name,
                           VGPU_MAX_DEVICES - 1);
            return -1;
        }
        if (load_mem_limit(env, name, text, index) != 0)
            return -1;
    }
    return 0;
}

/* CUDA_CORE_LIMIT / CUDA_CORE_SOFT_LIMIT: -1 bad, 0 unset, 1 set. */
static int load_core_limit(env_getter get, const char *name, unsigned *percent)
{
    const char *text = get(name);
    if (text == NULL)
        return 0;
    if (env_parse_percent(text, percent) != 0) {
        vgpu_error_set("%s=\"%s\": not a percentage 0..100", name, text);
        return -1;
    }
    return 1;
}

/* The hard limit wins when both are given. 0 and 100 mean "no limit", as
 * in the seed. */
static int load_core_limits(struct vgpu_env *env, env_getter get)
{
    unsigned hard = 0, soft = 0;
    int has_hard = load_core_limit(get, "CUDA_CORE_LIMIT", &hard);
    int has_soft = load_core_limit(get, "CUDA_CORE_SOFT_LIMIT", &soft);
    if (has_hard < 0 || has_soft < 0)
        return -1;
    if (!has_hard && !has_soft)
        return 0;
    unsigned percent = has_hard ? hard : soft;
    env->standalone = true;
    env->core_soft = !has_hard;
    env->share_ppm = percent == 0 ? VGPU_PPM_FULL : percent * (VGPU_PPM_FULL / 100);
    return 0;
}

int env_load(struct vgpu_env *env, env_getter get, char *const *names)
{
    memset(env, 0, sizeof(*env));
    env->share_ppm = VGPU_PPM_FULL;
    env->log_level = env_log_level(get);
    if (env->log_level < 0) {
        vgpu_error_set("LOGGER_LEVEL=\"%s\": not a level 0..5", get("LOGGER_LEVEL"));
        return -1;
    }
    env->control_path = nonempty(get("VGPU_CONTROL"));
    env->usage_path = nonempty(get("VGPU_USAGE"));
    env->arbiter_dir = nonempty(get("VGPU_ARBITER_DIR"));
    env->batch_stats_path = nonempty(get("VGPU_BATCH_STATS"));

    const char *text = get("CUDA_MEM_LIMIT");
    if (text != NULL && load_mem_limit(env, "CUDA_MEM_LIMIT", text, -1) != 0)
        return -1;
    /* Per-device values override the global one, whatever environ's order. */
    if (load_per_device_limits(env, get, names) != 0)
        return -1;
    if (load_core_limits(env, get) != 0)
        return -1;

    text = get("CUDA_MEMORY_OVERSUBSCRIBE");
    if (text != NULL && env_parse_bool(text, &env->oversubscribe) != 0) {
        vgpu_error_set("CUDA_MEMORY_OVERSUBSCRIBE=\"%s\": not true/false/1/0", text);
        return -1;
    }
    text = get("GPU_DEVICES_UUID");
    if (text != NULL &&
        env_parse_uuids(text, env->uuids, VGPU_MAX_DEVICES, &env->uuid_count) != 0) {
        vgpu_error_set("GPU_DEVICES_UUID=\"%s\": not a comma list of at most %d GPU UUIDs", text,
                       VGPU_MAX_DEVICES);
        return -1;
    }
    return 0;
}
