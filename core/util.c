/* SPDX-License-Identifier: MIT */
/* The core's logging and aligned mappings; the helpers it shares with api/
 * and server/ are in common/. */
#include "util.h"

#include <stdio.h>
#include <sys/mman.h>

void log_write(const struct logger *log, enum dormant_log_level level, const char *fmt, ...)
{
	char line[512];
	va_list ap;

	if (!log || !log->fn)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	log->fn(level, line, log->userdata);
}

void *mmap_aligned(size_t size, size_t align, int prot, int flags)
{
	size_t span = size + align;
	uintptr_t base, aligned;
	void *p = mmap(NULL, span, prot, flags | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return p;
	base = (uintptr_t)p;
	aligned = round_up(base, align);
	if (aligned > base)
		munmap(p, aligned - base);
	if (base + span > aligned + size)
		munmap((void *)(aligned + size), base + span - aligned - size);
	return (void *)aligned;
}

