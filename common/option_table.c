/* SPDX-License-Identifier: MIT */
/* Reading the rows of an option table (option_table.h). */
#include "option_table.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common.h"

const struct option_row *option_row_find(const struct option_row *rows, size_t count,
					 const char *name, size_t *ret_index)
{
	for (size_t i = 0; i < count; i++) {
		if (strcmp(rows[i].name, name) == 0) {
			*ret_index = i;
			return &rows[i];
		}
	}
	return NULL;
}

int option_bool_parse(const char *text, bool *ret)
{
	static const char *const yes[] = { "1", "true", "yes", "on" };
	static const char *const no[] = { "0", "false", "no", "off" };

	for (size_t i = 0; i < ARRAY_SIZE(yes); i++) {
		if (strcasecmp(text, yes[i]) == 0) {
			*ret = true;
			return 0;
		}
		if (strcasecmp(text, no[i]) == 0) {
			*ret = false;
			return 0;
		}
	}
	return error_set(-EINVAL, "'%.64s' is not a boolean (true or false)", text);
}

size_t option_values_text(const struct option_row *row, char *buf, size_t size)
{
	size_t used = 0;

	if (size == 0)
		return 0;
	buf[0] = '\0';
	for (size_t v = 0; row->values && row->values[v]; v++) {
		int n = snprintf(buf + used, size - used, "%s%s", v ? "|" : "", row->values[v]);

		if (n < 0 || (size_t)n >= size - used) {
			buf[used] = '\0';
			break;
		}
		used += (size_t)n;
	}
	return used;
}

/* The row's own copy of value among its values, or NULL. */
static const char *enum_value(const struct option_row *row, const char *value)
{
	for (size_t i = 0; row->values && row->values[i]; i++)
		if (strcmp(row->values[i], value) == 0)
			return row->values[i];
	return NULL;
}

static int size_row_parse(const struct option_row *row, const char *text, size_t *ret)
{
	size_t size;
	int r = size_parse(text, &size);

	if (r < 0)
		return r;
	if (row->min && size < (unsigned long long)row->min)
		return error_set(-EINVAL, "'%s' is too small (at least %lld bytes)", text, row->min);
	if (row->max && size > (unsigned long long)row->max)
		return error_set(-EINVAL, "'%s' is too large (at most %lld bytes)", text, row->max);
	if (row->multiple && size % row->multiple)
		return error_set(-EINVAL, "'%s' is not a multiple of %zu", text, row->multiple);
	*ret = size;
	return 0;
}

static int int_row_parse(const struct option_row *row, const char *text, int *ret)
{
	long long n;
	char *end;

	errno = 0;
	n = strtoll(text, &end, 10);
	if (!*text || *end || errno)
		return error_set(-EINVAL, "'%s' is not an integer", text);
	if (n < row->min || n > row->max)
		return error_set(-EINVAL, "'%s' is out of range (%lld to %lld)", text, row->min,
				 row->max);
	*ret = (int)n;
	return 0;
}

static int uint_row_parse(const struct option_row *row, const char *text, unsigned *ret)
{
	unsigned long long n;
	char *end;

	errno = 0;
	n = strtoull(text, &end, 10);
	if (!isdigit((unsigned char)text[0]) || *end || errno)
		return error_set(-EINVAL, "'%.64s' is not a whole number", text);
	if (n < (unsigned long long)row->min || n > (unsigned long long)row->max)
		return error_set(-EINVAL, "'%.64s' is out of range (%lld to %lld)", text, row->min,
				 row->max);
	*ret = (unsigned)n;
	return 0;
}

int option_parse(const struct option_row *row, const char *text, void *base)
{
	char *field = (char *)base + row->offset;
	char values[128];
	const char *v;
	int r;

	switch (row->type) {
	case OPTION_ENUM:
		v = enum_value(row, text);
		if (!v) {
			option_values_text(row, values, sizeof(values));
			return error_set(-EINVAL, "'%s' is not one of %s", text, values);
		}
		*(const char **)field = v;
		return 0;
	case OPTION_SIZE:
		return size_row_parse(row, text, (size_t *)field);
	case OPTION_INT:
		return int_row_parse(row, text, (int *)field);
	case OPTION_UINT:
		return uint_row_parse(row, text, (unsigned *)field);
	case OPTION_BOOL:
		return option_bool_parse(text, (bool *)field);
	case OPTION_PATH:
		if (text[0] != '/')
			return error_set(-EINVAL, "'%.64s' is not an absolute path", text);
		if (strlen(text) >= OPTION_PATH_MAX)
			return error_set(-EINVAL, "the path is longer than %d bytes",
					 OPTION_PATH_MAX - 1);
		snprintf(field, OPTION_PATH_MAX, "%s", text);
		return 0;
	case OPTION_TEXT:
		if (row->check) {
			r = row->check(text);
			if (r < 0)
				return r;
		}
		*(const char **)field = text;
		return 0;
	}
	return error_set(-EINVAL, "option %s has an unknown type", row->name);
}

int option_format(const struct option_row *row, const void *base, char *buf, size_t size)
{
	const char *field = (const char *)base + row->offset;
	const char *text;

	switch (row->type) {
	case OPTION_ENUM:
	case OPTION_TEXT:
		text = *(const char *const *)field;
		return snprintf(buf, size, "%s", text ? text : "");
	case OPTION_SIZE:
		return snprintf(buf, size, "%zu", *(const size_t *)field);
	case OPTION_INT:
		return snprintf(buf, size, "%d", *(const int *)field);
	case OPTION_UINT:
		return snprintf(buf, size, "%u", *(const unsigned *)field);
	case OPTION_BOOL:
		return snprintf(buf, size, "%s", *(const bool *)field ? "true" : "false");
	case OPTION_PATH:
		return snprintf(buf, size, "%s", field);
	}
	return snprintf(buf, size, "%s", "");
}

size_t option_field_size(enum option_type type)
{
	switch (type) {
	case OPTION_ENUM:
	case OPTION_TEXT:
		return sizeof(const char *);
	case OPTION_SIZE:
		return sizeof(size_t);
	case OPTION_INT:
		return sizeof(int);
	case OPTION_UINT:
		return sizeof(unsigned);
	case OPTION_BOOL:
		return sizeof(bool);
	case OPTION_PATH:
		return OPTION_PATH_MAX;
	}
	return 0;
}

const char *option_type_name(enum option_type type)
{
	static const char *const names[] = {
		[OPTION_ENUM] = "enum", [OPTION_SIZE] = "size", [OPTION_INT] = "int",
		[OPTION_BOOL] = "bool", [OPTION_PATH] = "path", [OPTION_TEXT] = "text",
		[OPTION_UINT] = "int",
	};

	return (size_t)type < ARRAY_SIZE(names) ? names[type] : "unknown";
}

const char *option_row_default_text(const struct option_row *row)
{
	return row->default_doc ? row->default_doc : row->default_value;
}

int option_rows_resolve(const struct option_row *rows, size_t count, const void *given,
			unsigned long long set, unsigned long long env_skip, void *out,
			unsigned long long *ret_from_env, const char *who)
{
	unsigned long long from_env = 0;
	const char *env;
	int r;

	for (size_t i = 0; i < count; i++) {
		const struct option_row *row = &rows[i];

		if (given && (set & (1ull << i))) {
			memcpy((char *)out + row->offset, (const char *)given + row->offset,
			       option_field_size(row->type));
			continue;
		}
		if (row->env && !(env_skip & (1ull << i)) && (env = getenv(row->env)) && *env) {
			r = option_parse(row, env, out);
			if (r < 0)
				return error_prefix(r, "$%s (%s %s)", row->env, who, row->name);
			from_env |= 1ull << i;
			continue;
		}
		/* the tables' defaults parse: tests/core/test_options.c and
		 * tests/http/test_server_options.c */
		if (row->default_value)
			(void)option_parse(row, row->default_value, out);
	}
	if (ret_from_env)
		*ret_from_env = from_env;
	return 0;
}

/* The length of the pair at p (p at no separator): to the next separator,
 * and with values_continue past each comma or newline whose piece after it
 * holds no '=' (a value that goes on). */
static size_t pair_length(const char *p, bool values_continue)
{
	size_t n;

	if (!values_continue)
		return strcspn(p, ", \t\n");
	n = strcspn(p, ",\n");
	while (p[n] == ',' || p[n] == '\n') {
		const char *next = p + n + 1;
		size_t len = strcspn(next, ",\n");

		if (memchr(next, '=', len) || len == 0)
			break;
		n += 1 + len;
	}
	return n;
}

int option_text_apply(const char *text, bool values_continue, const char *who,
		      int (*set)(void *ctx, const char *name, const char *value), void *ctx)
{
	char pair[OPTION_PATH_MAX + 128]; /* a path's value, its name before it */
	const char *p = text;

	for (;;) {
		size_t n;
		char *eq;
		int r;

		p += strspn(p, ", \t\n");
		if (!*p)
			return 0;
		n = pair_length(p, values_continue);
		if (n >= sizeof(pair))
			return error_set(-EINVAL, "%s '%.32s...' is too long", who, p);
		memcpy(pair, p, n);
		pair[n] = '\0';
		p += n;
		while (n > 0 && (pair[n - 1] == ' ' || pair[n - 1] == '\t'))
			pair[--n] = '\0';
		eq = strchr(pair, '=');
		if (!eq)
			return error_set(-EINVAL, "'%.64s' is not name=value", pair);
		*eq = '\0';
		r = set(ctx, pair, eq + 1);
		if (r < 0)
			return r;
	}
}

int option_number_text(const struct option_row *row, long long value, char *buf, size_t size,
		       const char *who)
{
	switch (row->type) {
	case OPTION_BOOL:
		value = value != 0;
		break;
	case OPTION_SIZE:
	case OPTION_INT:
	case OPTION_UINT:
		break;
	case OPTION_ENUM:
		return error_set(-EINVAL, "%s %s is an enum, not a number", who, row->name);
	case OPTION_PATH:
		return error_set(-EINVAL, "%s %s is a path, not a number", who, row->name);
	case OPTION_TEXT:
	default:
		return error_set(-EINVAL, "%s %s is text, not a number", who, row->name);
	}
	snprintf(buf, size, "%lld", value);
	return 0;
}
