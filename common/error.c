/* SPDX-License-Identifier: MIT */
/* The calling thread's error message: what dormant_last_error() returns. */
#include "common.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char thread_error[COMMON_ERROR_MAX];

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
	char old[COMMON_ERROR_MAX];
	char prefix[COMMON_ERROR_MAX];
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

const char *error_text(void)
{
	return thread_error;
}

void error_clear(void)
{
	thread_error[0] = '\0';
}

COMMON_EXPORT const char *dormant_last_error(void)
{
	return thread_error;
}
