/* SPDX-License-Identifier: MIT */
/* Small helpers shared by the core: error messages, logging, time, sizes. */
#ifndef DORMANT_UTIL_H
#define DORMANT_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "dormant.h"

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

/* Record a message for the calling thread's dormant_last_error() and return
 * err (a negative errno), so that `return error_set(-EINVAL, "...")` works. */
int error_set(int err, const char *fmt, ...) PRINTF_LIKE(2, 3);

/* Prepend context to the calling thread's current message: "ctx: old". */
int error_prefix(int err, const char *fmt, ...) PRINTF_LIKE(2, 3);

/* Forget the calling thread's message. */
void error_clear(void);

/* The logger of one manager; a NULL fn logs nothing. */
struct logger {
	dormant_log_fn fn;
	void *userdata;
};

void log_write(const struct logger *log, enum dormant_log_level level, const char *fmt, ...)
	PRINTF_LIKE(3, 4);

/* Seconds on the monotonic clock and on the wall clock. */
double now_monotonic_s(void);
double now_unix_s(void);

static inline size_t round_up(size_t value, size_t multiple)
{
	return (value + multiple - 1) / multiple * multiple;
}

/* mmap() an anonymous private range of size bytes aligned to align (a power
 * of two), with the slack trimmed so that munmap(ptr, size) frees it all.
 * Returns MAP_FAILED with errno set on failure. */
void *mmap_aligned(size_t size, size_t align, int prot, int flags);

/* Valid tag: 1..DORMANT_TAG_MAX characters of [A-Za-z0-9_.:-]. */
int tag_name_check(const char *tag);

/* Read a size like "64MiB", "1G", "4096" into *ret; -EINVAL otherwise. */
int size_parse(const char *text, size_t *ret);

#endif
