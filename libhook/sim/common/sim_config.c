/*
 * sim_config.c - VGPU_SIM_* environment to a struct sim_config.
 *
 * Every process parses its environment, even one that joins an existing
 * state file (whose stored config then wins): a typo fails loudly wherever
 * it is made instead of being silently ignored.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_state.h"

#define DEFAULT_DEVICES 2u
#define DEFAULT_MEMORY (8ULL << 30)
#define DEFAULT_SMS 132u
#define DEFAULT_CTX_OVERHEAD (48ULL << 20)
#define DEFAULT_KERNEL_NS 10000ULL
#define DEFAULT_NAME "vgpud simulated GPU"
#define MAX_SMS 100000u

static int bad(const char *var, const char *value, const char *why)
{
    fprintf(stderr, "vgpu-sim: %s='%s': %s\n", var, value, why);
    return -1;
}

int sim_parse_size(const char *text, uint64_t *out)
{
    char *end = NULL;
    if (!isdigit((unsigned char)text[0]))
        return -1;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0)
        return -1;
    unsigned shift = 0;
    switch (tolower((unsigned char)*end)) {
    case '\0': break;
    case 'k': shift = 10; break;
    case 'm': shift = 20; break;
    case 'g': shift = 30; break;
    case 't': shift = 40; break;
    default: return -1;
    }
    if (shift != 0 && end[1] != '\0')
        return -1;
    if (shift && value > (UINT64_MAX >> shift))
        return -1;
    *out = (uint64_t)value << shift;
    return 0;
}

int sim_parse_index_list(const char *text, uint32_t devices, uint32_t *mask)
{
    *mask = 0;
    const char *p = text;
    while (*p != '\0') {
        char *end = NULL;
        if (!isdigit((unsigned char)*p))
            return -1;
        unsigned long index = strtoul(p, &end, 10);
        if (index >= devices || (*end != ',' && *end != '\0'))
            return -1;
        *mask |= 1u << index;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

static int parse_count(const char *var, uint64_t min, uint64_t max, uint64_t *out)
{
    const char *value = getenv(var);
    if (value == NULL)
        return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(value, &end, 10);
    if (!isdigit((unsigned char)value[0]) || *end != '\0' || errno != 0 || n < min || n > max) {
        char why[96];
        snprintf(why, sizeof(why), "expected an integer from %" PRIu64 " to %" PRIu64, min, max);
        return bad(var, value, why);
    }
    *out = n;
    return 0;
}

static int parse_size_var(const char *var, bool allow_zero, uint64_t *out)
{
    const char *value = getenv(var);
    if (value == NULL)
        return 0;
    uint64_t size = 0;
    if (sim_parse_size(value, &size) != 0)
        return bad(var, value, "expected a size in bytes, optionally with a k/m/g/t suffix");
    if (size == 0 && !allow_zero)
        return bad(var, value, "must be greater than zero");
    *out = size;
    return 0;
}

static int parse_mask_var(const char *var, uint32_t devices, uint32_t *out)
{
    const char *value = getenv(var);
    if (value == NULL || value[0] == '\0')
        return 0;
    if (sim_parse_index_list(value, devices, out) != 0) {
        char why[96];
        snprintf(why, sizeof(why), "expected a comma list of device indices below %u", devices);
        return bad(var, value, why);
    }
    return 0;
}

static void default_uuid(char *out, unsigned index)
{
    snprintf(out, SIM_UUID_LEN, "GPU-5117a000-0000-4000-8000-%012x", index);
}

static int parse_uuids(struct sim_config *cfg)
{
    const char *value = getenv("VGPU_SIM_UUIDS");
    for (unsigned i = 0; i < cfg->devices; i++)
        default_uuid(cfg->uuids[i], i);
    if (value == NULL)
        return 0;
    unsigned n = 0;
    const char *p = value;
    for (;;) {
        size_t len = strcspn(p, ",");
        if (n == cfg->devices)
            return bad("VGPU_SIM_UUIDS", value, "more UUIDs than VGPU_SIM_DEVICES");
        if (len < 5 || len >= SIM_UUID_LEN || strncmp(p, "GPU-", 4) != 0)
            return bad("VGPU_SIM_UUIDS", value, "each UUID must look like GPU-<hex and dashes>");
        for (size_t i = 4; i < len; i++)
            if (!isxdigit((unsigned char)p[i]) && p[i] != '-')
                return bad("VGPU_SIM_UUIDS", value, "each UUID must look like GPU-<hex and dashes>");
        memcpy(cfg->uuids[n], p, len);
        cfg->uuids[n][len] = '\0';
        for (unsigned j = 0; j < n; j++)
            if (strcmp(cfg->uuids[j], cfg->uuids[n]) == 0)
                return bad("VGPU_SIM_UUIDS", value, "UUIDs must be distinct");
        n++;
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    if (n != cfg->devices)
        return bad("VGPU_SIM_UUIDS", value, "need exactly one UUID per device");
    return 0;
}

int sim_config_from_env(struct sim_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    uint64_t devices = DEFAULT_DEVICES, sms = DEFAULT_SMS;
    cfg->memory = DEFAULT_MEMORY;
    cfg->ctx_overhead = DEFAULT_CTX_OVERHEAD;
    cfg->kernel_ns = DEFAULT_KERNEL_NS;
    if (parse_count("VGPU_SIM_DEVICES", 1, SIM_MAX_DEVICES, &devices) != 0 ||
        parse_count("VGPU_SIM_SMS", 1, MAX_SMS, &sms) != 0 ||
        parse_count("VGPU_SIM_KERNEL_NS", 0, UINT32_MAX * 1000ULL, &cfg->kernel_ns) != 0 ||
        parse_count("VGPU_SIM_NVML_LAUNCH_NS", 0, 1000000ULL, &cfg->nvml_launch_ns) != 0 ||
        parse_size_var("VGPU_SIM_MEMORY", false, &cfg->memory) != 0 ||
        parse_size_var("VGPU_SIM_CTX_OVERHEAD", true, &cfg->ctx_overhead) != 0 ||
        parse_size_var("VGPU_SIM_MODULE_BYTES", true, &cfg->module_bytes) != 0)
        return -1;
    cfg->devices = (uint32_t)devices;
    cfg->sms = (uint32_t)sms;
    if (cfg->ctx_overhead > cfg->memory) {
        fprintf(stderr, "vgpu-sim: VGPU_SIM_CTX_OVERHEAD (%" PRIu64 " bytes) exceeds VGPU_SIM_MEMORY (%" PRIu64 " bytes)\n",
                cfg->ctx_overhead, cfg->memory);
        return -1;
    }
    if (parse_mask_var("VGPU_SIM_MIG", cfg->devices, &cfg->mig_mask) != 0 ||
        parse_mask_var("VGPU_SIM_LOST", cfg->devices, &cfg->lost_mask) != 0 || parse_uuids(cfg) != 0)
        return -1;
    const char *name = getenv("VGPU_SIM_NAME");
    if (name != NULL && (name[0] == '\0' || strlen(name) >= SIM_NAME_LEN))
        return bad("VGPU_SIM_NAME", name, "must be 1 to 95 characters");
    snprintf(cfg->name, sizeof(cfg->name), "%s", name != NULL ? name : DEFAULT_NAME);
    return 0;
}
