/*
 * test_hook_env.c - the seed environment interface: every variable's
 * accepted and refused values, and that a refusal names the variable.
 * Pure functions: no driver, no preload.
 */
#include <stdio.h>
#include <string.h>

#include "../src/env.c"
#include "../src/log.c"
#include "check.h"

static void test_sizes(void)
{
    static const struct {
        const char *text;
        int rc;
        uint64_t value;
    } cases[] = {
        {"0", 0, 0},
        {"1", 0, 1},
        {"4096", 0, 4096},
        {"10k", 0, 10240},
        {"10K", 0, 10240},
        {"3m", 0, 3ull << 20},
        {"2G", 0, 2ull << 30},
        {"1t", 0, 1ull << 40},
        {"18446744073709551615", 0, UINT64_MAX},
        {"18446744073709551616", -1, 0},
        {"16777216t", -1, 0},
        {"", -1, 0},
        {"k", -1, 0},
        {"10kb", -1, 0},
        {"10MiB", -1, 0},
        {"10 m", -1, 0},
        {" 1", -1, 0},
        {"-1", -1, 0},
        {"+1", -1, 0},
        {"1.5g", -1, 0},
        {"0x10", -1, 0},
        {"10p", -1, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint64_t value = 12345;
        int rc = env_parse_size(cases[i].text, &value);
        CHECKF(rc == cases[i].rc, "size \"%s\": rc %d", cases[i].text, rc);
        if (rc == 0)
            CHECKF(value == cases[i].value, "size \"%s\": %llu", cases[i].text,
                  (unsigned long long)value);
    }
}

static void test_scalars(void)
{
    static const char *const good_percent[] = {"0", "1", "50", "100"};
    static const char *const bad_percent[] = {"101", "-1", "", "50%", "abc", "1e2", " 5"};
    unsigned percent;
    for (size_t i = 0; i < sizeof(good_percent) / sizeof(good_percent[0]); i++)
        CHECKF(env_parse_percent(good_percent[i], &percent) == 0, "percent \"%s\"", good_percent[i]);
    for (size_t i = 0; i < sizeof(bad_percent) / sizeof(bad_percent[0]); i++)
        CHECKF(env_parse_percent(bad_percent[i], &percent) != 0, "percent \"%s\"", bad_percent[i]);

    bool flag;
    CHECKF(env_parse_bool("true", &flag) == 0 && flag, "true");
    CHECKF(env_parse_bool("TRUE", &flag) == 0 && flag, "TRUE");
    CHECKF(env_parse_bool("1", &flag) == 0 && flag, "1");
    CHECKF(env_parse_bool("false", &flag) == 0 && !flag, "false");
    CHECKF(env_parse_bool("0", &flag) == 0 && !flag, "0");
    CHECKF(env_parse_bool("yes", &flag) != 0, "yes");
    CHECKF(env_parse_bool("2", &flag) != 0, "2");
    CHECKF(env_parse_bool("", &flag) != 0, "empty bool");

    int level;
    for (int l = 0; l <= 5; l++) {
        char text[12]; /* any int: -O1 does not see l <= 5 */
        snprintf(text, sizeof(text), "%d", l);
        CHECKF(env_parse_level(text, &level) == 0 && level == l, "level %d", l);
    }
    CHECKF(env_parse_level("6", &level) != 0, "level 6");
    CHECKF(env_parse_level("-1", &level) != 0, "level -1");
    CHECKF(env_parse_level("", &level) != 0, "level empty");
    CHECKF(env_parse_level("info", &level) != 0, "level word");
}

static void test_uuids(void)
{
    char uuids[VGPU_MAX_DEVICES][VGPU_UUID_LEN];
    unsigned count = 0;
    CHECKF(env_parse_uuids("GPU-5117a000-0000-4000-8000-000000000000,GPU-b", uuids,
                          VGPU_MAX_DEVICES, &count) == 0 &&
              count == 2 && strcmp(uuids[1], "GPU-b") == 0,
          "two uuids");
    CHECKF(env_parse_uuids("", uuids, VGPU_MAX_DEVICES, &count) != 0, "empty list");
    CHECKF(env_parse_uuids("GPU-a,,GPU-b", uuids, VGPU_MAX_DEVICES, &count) != 0, "empty item");
    CHECKF(env_parse_uuids("GPU-a,", uuids, VGPU_MAX_DEVICES, &count) != 0, "trailing comma");
    CHECKF(env_parse_uuids("GPU a", uuids, VGPU_MAX_DEVICES, &count) != 0, "space");
    CHECKF(env_parse_uuids("GPU-a;rm", uuids, VGPU_MAX_DEVICES, &count) != 0, "bad char");
    char many[512] = "";
    for (int i = 0; i <= VGPU_MAX_DEVICES; i++)
        strcat(many, i ? ",g" : "g");
    CHECKF(env_parse_uuids(many, uuids, VGPU_MAX_DEVICES, &count) != 0, "17 uuids");
    char longest[VGPU_UUID_LEN + 1];
    memset(longest, 'a', VGPU_UUID_LEN);
    longest[VGPU_UUID_LEN] = '\0';
    CHECKF(env_parse_uuids(longest, uuids, VGPU_MAX_DEVICES, &count) != 0, "too long");
}

/* A fake environment: NULL-terminated "NAME=VALUE" strings. */
static char *const *fake_env;

static const char *fake_get(const char *name)
{
    size_t len = strlen(name);
    for (char *const *e = fake_env; *e != NULL; e++)
        if (strncmp(*e, name, len) == 0 && (*e)[len] == '=')
            return *e + len + 1;
    return NULL;
}

static int load(char *const *env, struct vgpu_env *out)
{
    fake_env = env;
    return env_load(out, fake_get, env);
}

static void test_load(void)
{
    struct vgpu_env env;
    char *none[] = {"PATH=/bin", NULL};
    CHECKF(load(none, &env) == 0 && !env.standalone && env.share_ppm == VGPU_PPM_FULL &&
              env.log_level == 3,
          "empty environment is pass-through");

    char *global[] = {"CUDA_MEM_LIMIT=1g", "CUDA_MEM_LIMIT_1=2g", NULL};
    CHECKF(load(global, &env) == 0 && env.standalone && env.has_limit[0] &&
              env.mem_limit[0] == 1ull << 30 && env.mem_limit[1] == 2ull << 30 &&
              env.mem_limit[15] == 1ull << 30,
          "global limit, per-device override");
    char *per_device[] = {"CUDA_MEM_LIMIT_1=2g", "CUDA_MEM_LIMIT=1g", NULL};
    CHECKF(load(per_device, &env) == 0 && env.mem_limit[1] == 2ull << 30,
          "per-device wins whatever the order");
    char *only_one[] = {"CUDA_MEM_LIMIT_3=512m", NULL};
    CHECKF(load(only_one, &env) == 0 && env.standalone && !env.has_limit[0] &&
              env.has_limit[3] && env.mem_limit[3] == 512ull << 20,
          "one device limited");

    char *hard[] = {"CUDA_CORE_LIMIT=30", "CUDA_CORE_SOFT_LIMIT=60", NULL};
    CHECKF(load(hard, &env) == 0 && env.share_ppm == 300000 && !env.core_soft,
          "hard wins over soft");
    char *soft[] = {"CUDA_CORE_SOFT_LIMIT=60", NULL};
    CHECKF(load(soft, &env) == 0 && env.standalone && env.share_ppm == 600000 && env.core_soft,
          "soft alone");
    char *zero[] = {"CUDA_CORE_LIMIT=0", NULL};
    CHECKF(load(zero, &env) == 0 && env.share_ppm == VGPU_PPM_FULL, "core 0 = no limit");

    char *misc[] = {"CUDA_MEMORY_OVERSUBSCRIBE=TRUE", "GPU_DEVICES_UUID=GPU-a,GPU-b",
                    "LOGGER_LEVEL=5", "VGPU_CONTROL=/c", "VGPU_USAGE=/u", NULL};
    CHECKF(load(misc, &env) == 0 && env.oversubscribe && env.uuid_count == 2 &&
              env.log_level == 5 && strcmp(env.control_path, "/c") == 0 &&
              strcmp(env.usage_path, "/u") == 0 && !env.standalone,
          "other variables");
    char *empty_paths[] = {"VGPU_CONTROL=", "VGPU_USAGE=", NULL};
    CHECKF(load(empty_paths, &env) == 0 && env.control_path == NULL && env.usage_path == NULL,
          "empty block paths are unset");
}

/* Every bad value fails, and the message names its variable. */
static void test_refusals(void)
{
    static const char *const bad[][2] = {
        {"CUDA_MEM_LIMIT=12x", "CUDA_MEM_LIMIT"},
        {"CUDA_MEM_LIMIT=", "CUDA_MEM_LIMIT"},
        {"CUDA_MEM_LIMIT=0", "CUDA_MEM_LIMIT"},
        {"CUDA_MEM_LIMIT=1MiB", "CUDA_MEM_LIMIT"},
        {"CUDA_MEM_LIMIT_2=-5", "CUDA_MEM_LIMIT_2"},
        {"CUDA_MEM_LIMIT_16=1g", "CUDA_MEM_LIMIT_16"},
        {"CUDA_MEM_LIMIT_01=1g", "CUDA_MEM_LIMIT_01"},
        {"CUDA_MEM_LIMIT_X=1g", "CUDA_MEM_LIMIT_X"},
        {"CUDA_MEM_LIMIT_=1g", "CUDA_MEM_LIMIT_"},
        {"CUDA_CORE_LIMIT=101", "CUDA_CORE_LIMIT"},
        {"CUDA_CORE_LIMIT=half", "CUDA_CORE_LIMIT"},
        {"CUDA_CORE_SOFT_LIMIT=-1", "CUDA_CORE_SOFT_LIMIT"},
        {"CUDA_MEMORY_OVERSUBSCRIBE=maybe", "CUDA_MEMORY_OVERSUBSCRIBE"},
        {"GPU_DEVICES_UUID=,", "GPU_DEVICES_UUID"},
        {"LOGGER_LEVEL=9", "LOGGER_LEVEL"},
        {"LOGGER_LEVEL=debug", "LOGGER_LEVEL"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *env_list[] = {(char *)bad[i][0], NULL};
        struct vgpu_env env;
        vgpu_error_set("%s", "");
        int rc = load(env_list, &env);
        CHECKF(rc != 0, "%s accepted", bad[i][0]);
        char expect[64];
        snprintf(expect, sizeof(expect), "%s", bad[i][1]);
        CHECKF(strstr(vgpu_error(), expect) == vgpu_error(), "%s: message \"%s\"", bad[i][0],
              vgpu_error());
    }
}

int main(void)
{
    test_sizes();
    test_scalars();
    test_uuids();
    test_load();
    test_refusals();
    return check_report("test_hook_env");
}
