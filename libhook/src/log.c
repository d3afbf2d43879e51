/*
 * log.c - one-line diagnostics on stderr, filtered by LOGGER_LEVEL, and the
 * per-thread "what failed: cause" record.
 *
 * A line is formatted into a stack buffer and written with one write(2), so
 * lines of concurrent threads and processes never interleave mid-line.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "vgpu.h"

static _Atomic int log_level = VGPU_LOG_DEFAULT_LEVEL;
static _Thread_local char last_error[256];

static const char *const category_names[] = {
    [VGPU_LOG_INFO] = "info",
    [VGPU_LOG_ERROR] = "error",
    [VGPU_LOG_WARNING] = "warning",
    [VGPU_LOG_FATAL] = "fatal",
    [VGPU_LOG_VERBOSE] = "verbose",
    [VGPU_LOG_DETAIL] = "detail",
};

void vgpu_log_set_level(int level)
{
    atomic_store_explicit(&log_level, level, memory_order_relaxed);
}

bool vgpu_log_enabled(enum vgpu_log_category category)
{
    return category == VGPU_LOG_INFO ||
           (int)category <= atomic_load_explicit(&log_level, memory_order_relaxed);
}

void vgpu_log(enum vgpu_log_category category, const char *fmt, ...)
{
    if (!vgpu_log_enabled(category))
        return;
    int saved_errno = errno;
    char line[512];
    int n = snprintf(line, sizeof(line), "[vgpu %s %d] ", category_names[category], (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof(line) - 2)
        len = sizeof(line) - 2;
    line[len++] = '\n';
    /* Diagnostics are best effort: a closed stderr must not disturb the app. */
    ssize_t ignored = write(STDERR_FILENO, line, len);
    (void)ignored;
    errno = saved_errno;
}

void vgpu_error_set(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
}

const char *vgpu_error(void)
{
    return last_error[0] ? last_error : "unknown error";
}
