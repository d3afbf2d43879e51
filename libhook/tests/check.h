/*
 * check.h - the C tests' one assertion: CHECK(cond) reports the failed
 * condition with its place and counts it, so a test runs on after a
 * failure and says everything that broke; CHECKF adds a printf-style
 * message saying what was seen; check_report() ends main().
 */
#ifndef VGPU_TEST_CHECK_H
#define VGPU_TEST_CHECK_H

#include <stdio.h>

static int failures;

#define CHECK(cond) \
    do { \
        if (!(cond)) { \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
            failures++; \
        } \
    } while (0)

#define CHECKF(cond, ...) \
    do { \
        if (!(cond)) { \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__); \
            fputc('\n', stderr); \
            failures++; \
        } \
    } while (0)

/* main()'s return: 0 when every CHECK held. */
static inline int check_report(const char *test)
{
    if (failures != 0) {
        fprintf(stderr, "%s: %d failure(s)\n", test, failures);
        return 1;
    }
    printf("%s: all passed\n", test);
    return 0;
}

#endif
