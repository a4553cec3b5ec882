/* SPDX-License-Identifier: MIT */
/*
 * Options as a table: each row says an option's name, type, where its field
 * lies in the caller's struct, its default, environment variable, bounds and
 * doc line. The options of dormant_new() (core/options.c) and of
 * dormant_server_start() (server/server_options.c) are such tables; what
 * reads a row (find it by name, parse a value into its field, write the
 * field back as text) is here, once.
 *
 * Conventions as in common.h: 0 or a negative errno, the message in
 * error_set()'s thread buffer, output untouched on failure; never prints.
 */
#ifndef DORMANT_COMMON_OPTION_TABLE_H
#define DORMANT_COMMON_OPTION_TABLE_H

#include <stdbool.h>
#include <stddef.h>

/* The field's C type by option type: enum -> const char * (one of the row's
 * static values), size -> size_t, int -> int, uint -> unsigned, bool ->
 * bool, path -> char[OPTION_PATH_MAX] (inline: copied with the struct),
 * text -> const char * (borrows the parsed text). */
enum option_type {
	OPTION_ENUM,
	OPTION_SIZE,
	OPTION_INT,
	OPTION_BOOL,
	OPTION_PATH,
	OPTION_TEXT,
	OPTION_UINT,
};

/* Bytes of a path field, its NUL included (DORMANT_PATH_MAX: core/options.c
 * checks that they agree). */
#define OPTION_PATH_MAX 4096

struct option_row {
	const char *name;
	enum option_type type;
	size_t offset; /* of the field in the table's struct */
	/* Parsed like a user's value when neither set nor in the environment.
	 * NULL: the field stays zero and its user decides (say how in
	 * default_doc). */
	const char *default_value;
	const char *default_doc; /* what the listing says; NULL: default_value */
	const char *env;	 /* NULL: none */
	/* Rows of one env_group (non-zero) read their environment variables only
	 * when the caller set none of the group (the table's user applies it). */
	int env_group;
	const char *const *values; /* enum: its values, NULL-terminated */
	long long min, max;	   /* int, uint; size (0, 0: any size) */
	size_t multiple;	   /* size: must be a multiple of this (0: any) */
	int (*check)(const char *text); /* text: NULL: any */
	bool secret;		   /* the table's user never repeats the value */
	const char *doc;
};

/* The row of rows[0..count) called name, its index in *ret_index; NULL
 * (and *ret_index untouched) when there is none. */
const struct option_row *option_row_find(const struct option_row *rows, size_t count,
					 const char *name, size_t *ret_index);

/* Parse text for row into its field of the struct at base. The message of a
 * failure (-EINVAL) says what is wrong with text; the caller says whose
 * value it was. A text row's field borrows text. */
int option_parse(const struct option_row *row, const char *text, void *base);

/* "1", "true", "yes", "on" and "0", "false", "no", "off", any case. */
int option_bool_parse(const char *text, bool *ret);

/* Write row's field of the struct at base as text (what option_parse()
 * takes back) into buf, as snprintf() does: the length it needs, which is
 * size or more when buf is too small. */
int option_format(const struct option_row *row, const void *base, char *buf, size_t size);

/* Bytes of a field of type (what copying one option from struct to struct
 * copies). */
size_t option_field_size(enum option_type type);

/* The listing's name of type: "enum", "size", "int" (uint too), "bool",
 * "path", "text". */
const char *option_type_name(enum option_type type);

/* An enum row's values as "a|b|c" into buf (cut to fit); the length written. */
size_t option_values_text(const struct option_row *row, char *buf, size_t size);

/* What a listing says of row's default: default_doc, else default_value
 * (NULL: none). */
const char *option_row_default_text(const struct option_row *row);

/* Apply "name=value[,name=value...]" text through set(ctx, name, value), pair
 * by pair in order, up to the first that fails (its error returned; the
 * pairs before it stay applied). Pairs part at commas and newlines, and at
 * blanks unless values_continue; with values_continue a piece without '='
 * continues the value before it, comma and all (faults=wake:create,sleep:copy),
 * and blanks after a value are dropped. Empty pieces are skipped. who names
 * the table in messages ("option", "server option"). */
int option_text_apply(const char *text, bool values_continue, const char *who,
		      int (*set)(void *ctx, const char *name, const char *value), void *ctx);

/* value as the text that option_parse() takes for row (a bool row: "1" for
 * any value but 0, else "0"), into buf of size bytes (32 is enough);
 * -EINVAL where row takes no number (an enum, path or text row), the
 * message naming it as "who name". */
int option_number_text(const struct option_row *row, long long value, char *buf, size_t size,
		       const char *who);

/* Give each field of rows[0..count) (at most 64) in the zeroed struct at out
 * its value: from the struct at given where row i's bit of set is on (given
 * may be NULL), else from the row's environment variable when it is set,
 * not empty and row i's bit of env_skip is off, else the row's default.
 * *ret_from_env (may be NULL) gets the bits of the rows that came from the
 * environment. A bad variable fails it (-EINVAL), the message naming the
 * variable and "who name" (who: "option", "server option"); out is then
 * part filled. */
int option_rows_resolve(const struct option_row *rows, size_t count, const void *given,
			unsigned long long set, unsigned long long env_skip, void *out,
			unsigned long long *ret_from_env, const char *who);

#endif
