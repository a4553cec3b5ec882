/* SPDX-License-Identifier: MIT */
/*
 * What core/, api/ and server/ share (a static library linked into each, not
 * part of the public API): the calling thread's error message behind
 * dormant_last_error(), clocks, and the parsers of sizes and tag names. The
 * private headers of each component stay with it.
 */
#ifndef DORMANT_COMMON_H
#define DORMANT_COMMON_H

#include <stddef.h>
#include <stdint.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif

static inline size_t round_up(size_t value, size_t multiple)
{
	return (value + multiple - 1) / multiple * multiple;
}

/* ---- errors (error.c) ---------------------------------------------------- */

/* Record a message for the calling thread's dormant_last_error() and return
 * err (a negative errno), so that `return error_set(-EINVAL, "...")` works. */
int error_set(int err, const char *fmt, ...) PRINTF_LIKE(2, 3);

/* Prepend context to the calling thread's current message: "ctx: old". */
int error_prefix(int err, const char *fmt, ...) PRINTF_LIKE(2, 3);

/* Forget the calling thread's message. */
void error_clear(void);

/* ---- clocks (clock.c) ---------------------------------------------------- */

/* Seconds on the monotonic clock and on the wall clock. */
double now_monotonic_s(void);
double now_unix_s(void);

/* ---- parsers (parse.c) --------------------------------------------------- */

/* Valid tag: 1..DORMANT_TAG_MAX characters of [A-Za-z0-9_.:-]. */
int tag_name_check(const char *tag);

/* Read a size like "64MiB", "1G", "4096" into *ret; -EINVAL otherwise. */
int size_parse(const char *text, size_t *ret);

#endif
