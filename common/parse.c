/* SPDX-License-Identifier: MIT */
/* Parsers of user input shared by the components: tag names and sizes. */
#include "common.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

int tag_name_check(const char *tag)
{
	size_t len;

	if (!tag)
		return error_set(-EINVAL, "tag is missing");
	len = strlen(tag);
	if (len == 0 || len > COMMON_TAG_MAX)
		return error_set(-EINVAL, "tag must be 1 to %d characters long", COMMON_TAG_MAX);
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)tag[i];
		if (!isalnum(c) && c != '_' && c != '.' && c != ':' && c != '-')
			return error_set(-EINVAL, "tag '%.*s' has a character outside [A-Za-z0-9_.:-]",
					 COMMON_TAG_MAX, tag);
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
