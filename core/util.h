/* SPDX-License-Identifier: MIT */
/* The core's own helpers (logging, aligned mappings), and what it shares with
 * api/ and server/ (common/common.h: errors, clocks, sizes, tag names). */
#ifndef DORMANT_UTIL_H
#define DORMANT_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "dormant.h"

/* The logger of one manager; a NULL fn logs nothing. */
struct logger {
	dormant_log_fn fn;
	void *userdata;
};

void log_write(const struct logger *log, enum dormant_log_level level, const char *fmt, ...)
	PRINTF_LIKE(3, 4);

/* mmap() an anonymous private range of size bytes aligned to align (a power
 * of two), with the slack trimmed so that munmap(ptr, size) frees it all.
 * Returns MAP_FAILED with errno set on failure. */
void *mmap_aligned(size_t size, size_t align, int prot, int flags);

#endif
