/* SPDX-License-Identifier: MIT */
/*
 * common/ on its own: the option-table parser that core/options.c and
 * server/server_options.c share (option_table.h), over a table of this
 * test's own with a row of every type, and the limits common.h keeps in step
 * with core/dormant.h.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "dormant.h"
#include "option_table.h"

/* common/ includes nothing of core/: its copies of the public limits must
 * say the same */
_Static_assert(COMMON_ERROR_MAX == DORMANT_ERROR_MAX, "error message size");
_Static_assert(COMMON_TAG_MAX == DORMANT_TAG_MAX, "tag length");
_Static_assert(OPTION_PATH_MAX == DORMANT_PATH_MAX, "path size");

struct fields {
	const char *colour;
	size_t bytes;
	int delta;
	unsigned count;
	bool flag;
	char dir[OPTION_PATH_MAX];
	const char *word;
};

static int word_check(const char *text)
{
	return strchr(text, ' ') ? error_set(-EINVAL, "'%s' has a space", text) : 0;
}

#define FIELD(f) offsetof(struct fields, f)

static const struct option_row rows[] = {
	{ .name = "colour", .type = OPTION_ENUM, .offset = FIELD(colour),
	  .values = (const char *const[]){ "red", "green", "blue", NULL } },
	{ .name = "bytes", .type = OPTION_SIZE, .offset = FIELD(bytes), .min = 4096,
	  .max = 1 << 30, .multiple = 4096 },
	{ .name = "delta", .type = OPTION_INT, .offset = FIELD(delta), .min = -5, .max = 5 },
	{ .name = "count", .type = OPTION_UINT, .offset = FIELD(count), .min = 1, .max = 64 },
	{ .name = "flag", .type = OPTION_BOOL, .offset = FIELD(flag) },
	{ .name = "dir", .type = OPTION_PATH, .offset = FIELD(dir) },
	{ .name = "word", .type = OPTION_TEXT, .offset = FIELD(word), .check = word_check },
};

static const struct option_row *row(const char *name)
{
	size_t i = SIZE_MAX;
	const struct option_row *r = option_row_find(rows, ARRAY_SIZE(rows), name, &i);

	cr_assert(r, "no row %s", name);
	cr_assert_eq(r, &rows[i]);
	return r;
}

/* Parse text into row name of *f, expecting failure: the message must
 * contain what and the field must stay as it was. */
static void refused(struct fields *f, const char *name, const char *text, const char *what)
{
	struct fields before = *f;

	error_clear();
	cr_assert_eq(option_parse(row(name), text, f), -EINVAL, "%s=%s accepted", name, text);
	cr_assert(strstr(error_text(), what), "%s=%s: message '%s' lacks '%s'", name, text,
		  error_text(), what);
	cr_assert(memcmp(&before, f, sizeof(before)) == 0, "%s=%s changed the struct", name,
		  text);
}

static void reads_back(const struct fields *f, const char *name, const char *want)
{
	char buf[OPTION_PATH_MAX + 1];
	int n = option_format(row(name), f, buf, sizeof(buf));

	cr_assert_eq(n, (int)strlen(want), "%s: %d", name, n);
	cr_assert_str_eq(buf, want);
}

Test(option_table, finds_rows_by_name)
{
	size_t i = 77;

	cr_assert_eq(option_row_find(rows, ARRAY_SIZE(rows), "count", &i), &rows[3]);
	cr_assert_eq(i, 3);
	i = 77;
	cr_assert_null(option_row_find(rows, ARRAY_SIZE(rows), "counts", &i));
	cr_assert_null(option_row_find(rows, ARRAY_SIZE(rows), "", &i));
	cr_assert_eq(i, 77, "a miss leaves the index alone");
}

Test(option_table, enum)
{
	struct fields f = { 0 };
	char text[64];

	cr_assert_eq(option_parse(row("colour"), "green", &f), 0);
	cr_assert_eq(f.colour, rows[0].values[1], "the field points at the row's own value");
	reads_back(&f, "colour", "green");
	refused(&f, "colour", "Green", "'Green' is not one of red|green|blue");
	refused(&f, "colour", "", "is not one of");
	cr_assert_eq(option_values_text(row("colour"), text, sizeof(text)), 14);
	cr_assert_str_eq(text, "red|green|blue");
	/* cut to fit, at a value's end */
	cr_assert_eq(option_values_text(row("colour"), text, 12), 9);
	cr_assert_str_eq(text, "red|green");
}

Test(option_table, size)
{
	struct fields f = { 0 };

	cr_assert_eq(option_parse(row("bytes"), "64KiB", &f), 0, "%s", error_text());
	cr_assert_eq(f.bytes, 65536);
	reads_back(&f, "bytes", "65536");
	cr_assert_eq(option_parse(row("bytes"), "1GiB", &f), 0, "the max itself");
	refused(&f, "bytes", "2048", "too small (at least 4096 bytes)");
	refused(&f, "bytes", "2GiB", "too large (at most 1073741824 bytes)");
	refused(&f, "bytes", "6000", "not a multiple of 4096");
	refused(&f, "bytes", "lots", "");
}

Test(option_table, int)
{
	struct fields f = { 0 };

	cr_assert_eq(option_parse(row("delta"), "-5", &f), 0);
	cr_assert_eq(f.delta, -5);
	reads_back(&f, "delta", "-5");
	cr_assert_eq(option_parse(row("delta"), "5", &f), 0);
	refused(&f, "delta", "6", "'6' is out of range (-5 to 5)");
	refused(&f, "delta", "-6", "out of range");
	refused(&f, "delta", "", "is not an integer");
	refused(&f, "delta", "3x", "is not an integer");
	refused(&f, "delta", "99999999999999999999", "is not an integer");
}

Test(option_table, uint)
{
	struct fields f = { 0 };

	cr_assert_eq(option_parse(row("count"), "64", &f), 0);
	cr_assert_eq(f.count, 64);
	reads_back(&f, "count", "64");
	refused(&f, "count", "0", "'0' is out of range (1 to 64)");
	refused(&f, "count", "65", "out of range");
	refused(&f, "count", "-1", "is not a whole number");
	refused(&f, "count", "+1", "is not a whole number");
	refused(&f, "count", " 1", "is not a whole number");
	refused(&f, "count", "", "is not a whole number");
}

Test(option_table, bool)
{
	static const char *const yes[] = { "1", "true", "YES", "On" };
	static const char *const no[] = { "0", "False", "no", "OFF" };
	struct fields f = { 0 };
	char long_text[200];

	for (size_t i = 0; i < ARRAY_SIZE(yes); i++) {
		f.flag = false;
		cr_assert_eq(option_parse(row("flag"), yes[i], &f), 0, "%s", yes[i]);
		cr_assert(f.flag, "%s", yes[i]);
		reads_back(&f, "flag", "true");
		cr_assert_eq(option_parse(row("flag"), no[i], &f), 0, "%s", no[i]);
		cr_assert_not(f.flag, "%s", no[i]);
		reads_back(&f, "flag", "false");
	}
	refused(&f, "flag", "2", "'2' is not a boolean (true or false)");
	refused(&f, "flag", "", "is not a boolean");
	/* the message repeats at most 64 bytes of the value */
	memset(long_text, 'y', sizeof(long_text) - 1);
	long_text[sizeof(long_text) - 1] = '\0';
	refused(&f, "flag", long_text, "is not a boolean");
	cr_assert_lt(strlen(error_text()), 64 + 40, "%s", error_text());
}

Test(option_table, path)
{
	static char long_path[OPTION_PATH_MAX + 1];
	struct fields f = { 0 };

	cr_assert_eq(option_parse(row("dir"), "/var/tmp", &f), 0);
	reads_back(&f, "dir", "/var/tmp");
	refused(&f, "dir", "var/tmp", "'var/tmp' is not an absolute path");
	refused(&f, "dir", "", "is not an absolute path");
	memset(long_path, 'p', OPTION_PATH_MAX);
	long_path[0] = '/';
	refused(&f, "dir", long_path, "the path is longer than 4095 bytes");
	long_path[OPTION_PATH_MAX - 1] = '\0'; /* 4095 bytes: fits */
	cr_assert_eq(option_parse(row("dir"), long_path, &f), 0);
	reads_back(&f, "dir", long_path);
}

Test(option_table, text)
{
	struct fields f = { 0 };
	const char *word = "hello";

	reads_back(&f, "word", "");
	cr_assert_eq(option_parse(row("word"), word, &f), 0);
	cr_assert_eq(f.word, word, "a text field borrows the text");
	reads_back(&f, "word", "hello");
	refused(&f, "word", "two words", "'two words' has a space");
}

Test(option_table, format_says_what_it_needs)
{
	struct fields f = { .count = 12345 };
	char buf[4];

	cr_assert_eq(option_format(row("count"), &f, buf, sizeof(buf)), 5);
	cr_assert_str_eq(buf, "123");
}

Test(option_table, field_sizes_and_type_names)
{
	cr_assert_eq(option_field_size(OPTION_ENUM), sizeof(const char *));
	cr_assert_eq(option_field_size(OPTION_TEXT), sizeof(const char *));
	cr_assert_eq(option_field_size(OPTION_SIZE), sizeof(size_t));
	cr_assert_eq(option_field_size(OPTION_INT), sizeof(int));
	cr_assert_eq(option_field_size(OPTION_UINT), sizeof(unsigned));
	cr_assert_eq(option_field_size(OPTION_BOOL), sizeof(bool));
	cr_assert_eq(option_field_size(OPTION_PATH), OPTION_PATH_MAX);
	/* what dormant_option_type() and dormant_server_option_type() list */
	cr_assert_str_eq(option_type_name(OPTION_ENUM), "enum");
	cr_assert_str_eq(option_type_name(OPTION_SIZE), "size");
	cr_assert_str_eq(option_type_name(OPTION_INT), "int");
	cr_assert_str_eq(option_type_name(OPTION_UINT), "int");
	cr_assert_str_eq(option_type_name(OPTION_BOOL), "bool");
	cr_assert_str_eq(option_type_name(OPTION_PATH), "path");
	cr_assert_str_eq(option_type_name(OPTION_TEXT), "text");
}

/* What option_text_apply() hands over: "name=value;" for each pair. */
struct pairs {
	char seen[512];
	const char *refuse; /* a name set() fails on */
};

static int pair_seen(void *ctx, const char *name, const char *value)
{
	struct pairs *p = ctx;

	if (p->refuse && strcmp(name, p->refuse) == 0)
		return error_set(-ERANGE, "refused %s", name);
	snprintf(p->seen + strlen(p->seen), sizeof(p->seen) - strlen(p->seen), "%s=%s;", name,
		 value);
	return 0;
}

Test(option_table, text_apply_splits_pairs)
{
	struct pairs p = { .seen = "" };

	cr_assert_eq(option_text_apply(" a=1,\tb=x y\n,c=", false, "option", pair_seen, &p), -EINVAL);
	cr_assert_str_eq(p.seen, "a=1;b=x;", "blanks part pairs: %s", p.seen);
	cr_assert(strstr(error_text(), "'y' is not name=value"), "%s", error_text());

	p = (struct pairs){ .seen = "" };
	cr_assert_eq(option_text_apply(",, a=1,,b=2 ,", false, "option", pair_seen, &p), 0);
	cr_assert_str_eq(p.seen, "a=1;b=2;");

	/* a piece without '=' goes on with the value before it */
	p = (struct pairs){ .seen = "" };
	cr_assert_eq(option_text_apply(" f=w:c,s:d, g=x y \t,h=3", true, "server option",
				       pair_seen, &p), 0);
	cr_assert_str_eq(p.seen, "f=w:c,s:d;g=x y;h=3;", "%s", p.seen);
	p = (struct pairs){ .seen = "" };
	cr_assert_eq(option_text_apply("", true, "server option", pair_seen, &p), 0);
	cr_assert_str_eq(p.seen, "");
	cr_assert_eq(option_text_apply("nothing", true, "server option", pair_seen, &p), -EINVAL);

	/* the first failure stops it, the pairs before it applied */
	p = (struct pairs){ .refuse = "b" };
	cr_assert_eq(option_text_apply("a=1,b=2,c=3", false, "option", pair_seen, &p), -ERANGE);
	cr_assert_str_eq(p.seen, "a=1;");
}

Test(option_table, text_apply_takes_a_whole_path)
{
	static char text[OPTION_PATH_MAX + 200];
	struct pairs p = { .seen = "" };
	size_t n = (size_t)snprintf(text, sizeof(text), "dir=/");

	memset(text + n, 'd', OPTION_PATH_MAX - 2);
	text[n + OPTION_PATH_MAX - 2] = '\0';
	cr_assert_eq(option_text_apply(text, false, "option", pair_seen, &p), 0, "%s",
		     error_text());
	memset(text + n, 'd', OPTION_PATH_MAX + 150);
	text[n + OPTION_PATH_MAX + 150] = '\0';
	cr_assert_eq(option_text_apply(text, true, "server option", pair_seen, &p), -EINVAL);
	cr_assert(strstr(error_text(), "server option 'dir=/ddd"), "%s", error_text());
	cr_assert(strstr(error_text(), "is too long"), "%s", error_text());
}

Test(option_table, number_text)
{
	char buf[32];

	cr_assert_eq(option_number_text(row("bytes"), 8192, buf, sizeof(buf), "option"), 0);
	cr_assert_str_eq(buf, "8192");
	cr_assert_eq(option_number_text(row("delta"), -3, buf, sizeof(buf), "option"), 0);
	cr_assert_str_eq(buf, "-3");
	cr_assert_eq(option_number_text(row("flag"), 7, buf, sizeof(buf), "option"), 0);
	cr_assert_str_eq(buf, "1", "any number but 0 is true");
	cr_assert_eq(option_number_text(row("count"), 2, buf, sizeof(buf), "option"), 0);
	cr_assert_str_eq(buf, "2");
	strcpy(buf, "kept");
	cr_assert_eq(option_number_text(row("colour"), 1, buf, sizeof(buf), "option"), -EINVAL);
	cr_assert_str_eq(error_text(), "option colour is an enum, not a number");
	cr_assert_eq(option_number_text(row("dir"), 1, buf, sizeof(buf), "option"), -EINVAL);
	cr_assert_str_eq(error_text(), "option dir is a path, not a number");
	cr_assert_eq(option_number_text(row("word"), 1, buf, sizeof(buf), "server option"), -EINVAL);
	cr_assert_str_eq(error_text(), "server option word is text, not a number");
	cr_assert_str_eq(buf, "kept", "a refused number writes nothing");
}

Test(parse, sizes_and_tags)
{
	size_t size = 0;
	char tag[COMMON_TAG_MAX + 2];

	cr_assert_eq(size_parse("3MiB", &size), 0);
	cr_assert_eq(size, 3 * MiB);
	cr_assert_eq(size_parse("1GB", &size), 0);
	cr_assert_eq(size, 1000000000);
	cr_assert_lt(size_parse("1 MiB", &size), 0);
	memset(tag, 'a', sizeof(tag) - 1);
	tag[COMMON_TAG_MAX] = '\0';
	cr_assert_eq(tag_name_check(tag), 0, "%s", error_text());
	tag[COMMON_TAG_MAX] = 'a';
	tag[COMMON_TAG_MAX + 1] = '\0';
	cr_assert_lt(tag_name_check(tag), 0);
	cr_assert_lt(tag_name_check("a b"), 0);
}

Test(error, the_public_face_is_the_thread_message)
{
	error_set(-EIO, "first %d", 1);
	error_prefix(-EIO, "context");
	cr_assert_str_eq(error_text(), "context: first 1");
	cr_assert_eq(dormant_last_error(), error_text());
	error_clear();
	cr_assert_str_eq(dormant_last_error(), "");
}
