/* SPDX-License-Identifier: MIT */
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static _Thread_local char thread_error[DORMANT_ERROR_MAX];

int error_set(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(thread_error, sizeof(thread_error), fmt, ap);
	va_end(ap);
	return err;
}

int error_prefix(int err, const char *fmt, ...)
{
	char old[DORMANT_ERROR_MAX];
	char prefix[DORMANT_ERROR_MAX];
	va_list ap;

	size_t used;

	memcpy(old, thread_error, sizeof(old));
	va_start(ap, fmt);
	vsnprintf(prefix, sizeof(prefix), fmt, ap);
	va_end(ap);
	/* "prefix: old", cut to the buffer */
	used = strlen(prefix);
	memcpy(thread_error, prefix, used + 1);
	if (used + 2 < sizeof(thread_error)) {
		const char *rest = old[0] ? old : strerror(-err);
		size_t room = sizeof(thread_error) - used - 3;
		size_t len = strnlen(rest, room);

		memcpy(thread_error + used, ": ", 2);
		memcpy(thread_error + used + 2, rest, len);
		thread_error[used + 2 + len] = '\0';
	}
	return err;
}

void error_clear(void)
{
	thread_error[0] = '\0';
}

DORMANT_EXPORT const char *dormant_last_error(void)
{
	return thread_error;
}

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

double now_monotonic_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double now_unix_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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

int tag_name_check(const char *tag)
{
	size_t len;

	if (!tag)
		return error_set(-EINVAL, "tag is missing");
	len = strlen(tag);
	if (len == 0 || len > DORMANT_TAG_MAX)
		return error_set(-EINVAL, "tag must be 1 to %d characters long", DORMANT_TAG_MAX);
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)tag[i];
		if (!isalnum(c) && c != '_' && c != '.' && c != ':' && c != '-')
			return error_set(-EINVAL, "tag '%.*s' has a character outside [A-Za-z0-9_.:-]",
					 DORMANT_TAG_MAX, tag);
	}
	return 0;
}

int size_parse(const char *text, size_t *ret)
{
	static const struct {
		const char *suffix;
		size_t factor;
	} units[] = {
		{ "", 1 },	  { "B", 1 },	     { "K", KiB },	 { "KB", 1000 },
		{ "KiB", KiB },	  { "M", MiB },	     { "MB", 1000000 },	 { "MiB", MiB },
		{ "G", GiB },	  { "GB", 1000000000 }, { "GiB", GiB },	 { "T", GiB * 1024 },
		{ "TB", 1000000000000ull }, { "TiB", GiB * 1024 },
	};
	char *end;
	unsigned long long value;

	if (!text || !isdigit((unsigned char)text[0]))
		return error_set(-EINVAL, "'%s' is not a size", text ? text : "(null)");
	errno = 0;
	value = strtoull(text, &end, 10);
	if (errno)
		return error_set(-EINVAL, "'%s' is out of range", text);
	for (size_t i = 0; i < ARRAY_SIZE(units); i++) {
		if (strcmp(end, units[i].suffix) != 0)
			continue;
		if (value > SIZE_MAX / units[i].factor)
			return error_set(-EINVAL, "'%s' is out of range", text);
		*ret = (size_t)value * units[i].factor;
		return 0;
	}
	return error_set(-EINVAL, "'%s' has an unknown unit (use K, M, G, T, KiB, MiB, GiB, TiB)",
			 text);
}
