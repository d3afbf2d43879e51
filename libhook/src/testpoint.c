/*
 * testpoint.c - make the budget protocol's windows observable (tests only).
 *
 * VGPU_TEST_STOP_IN=reserve|release makes the process stop itself with
 * SIGSTOP, once, inside that window of budget.c: between charging the vGPU
 * total and charging its slot (reserve), or between giving back its slot and
 * giving back the total (release). A test then SIGKILLs it exactly there,
 * which no timing can do reliably. It only ever stops the process that set
 * it; unset, a window costs one relaxed load.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "vgpu.h"

#define TESTPOINT_UNREAD (-1)
#define TESTPOINT_NONE 0

static _Atomic int armed = TESTPOINT_UNREAD;

static int read_armed(void)
{
    const char *value = secure_getenv("VGPU_TEST_STOP_IN");
    if (value == NULL || *value == '\0')
        return TESTPOINT_NONE;
    if (strcmp(value, "reserve") == 0)
        return TESTPOINT_RESERVE;
    if (strcmp(value, "release") == 0)
        return TESTPOINT_RELEASE;
    log_warn("VGPU_TEST_STOP_IN=%s is neither reserve nor release: ignored", value);
    return TESTPOINT_NONE;
}

void testpoint(enum testpoint where)
{
    int now = atomic_load_explicit(&armed, memory_order_relaxed);
    if (now == TESTPOINT_UNREAD) {
        int expected = TESTPOINT_UNREAD;
        now = read_armed();
        if (!atomic_compare_exchange_strong(&armed, &expected, now))
            now = expected;
    }
    /* Once: the process goes on normally if the test lets it continue. */
    if (now == (int)where && atomic_compare_exchange_strong(&armed, &now, TESTPOINT_NONE))
        raise(SIGSTOP);
}
