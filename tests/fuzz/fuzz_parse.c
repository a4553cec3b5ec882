/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness: the small parsers of user input, each checked against a
 * plain reading of its rules. The first byte picks one, the rest (cut at a
 * NUL, as a C string would be) is its text:
 *   0  size strings ("64MiB", DORMANT_*_BYTES; common/parse.c size_parse)
 *   1  tag names (common/parse.c tag_name_check)
 *   2  dormantctl --tags lists, and the JSON body made of them: every tag
 *      dormantctl accepts the server accepts too
 *   3  dormantctl's whole numbers and seconds
 *   4  core's option lists (dormant_options_parse): 0 or -EINVAL, and the
 *      options it accepted make a manager (host backend) or a clear error
 *   5  the server's option lists (dormant_server_options_parse): all or
 *      nothing (a refused list changes no option), and a list accepted once
 *      is accepted again with the same result
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "dormant-server.h"
#include "dormant.h"
#include "fuzz_common.h"

/* dormantctl's own parsers are static in its main file: take them whole. */
#define main dormantctl_main
int dormantctl_main(int argc, char **argv);
#include "dormantctl.c"
#undef main

static int null_fd = -1, saved_stderr = -1;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
	saved_stderr = dup(STDERR_FILENO);
	CHECK(null_fd >= 0 && saved_stderr >= 0);
	return 0;
}

/* dormantctl's parsers explain a refusal on stderr: not here. */
static void quiet(bool on)
{
	fflush(stderr);
	dup2(on ? null_fd : saved_stderr, STDERR_FILENO);
}

static bool reference_size(const char *text, size_t *ret)
{
	static const struct {
		const char *suffix;
		unsigned long long factor;
	} units[] = {
		{ "", 1 }, { "B", 1 }, { "K", 1ull << 10 }, { "KB", 1000 }, { "KiB", 1ull << 10 },
		{ "M", 1ull << 20 }, { "MB", 1000000 }, { "MiB", 1ull << 20 },
		{ "G", 1ull << 30 }, { "GB", 1000000000 }, { "GiB", 1ull << 30 },
		{ "T", 1ull << 40 }, { "TB", 1000000000000ull }, { "TiB", 1ull << 40 },
	};
	unsigned long long value = 0;
	const char *p = text;

	if (*p < '0' || *p > '9')
		return false;
	for (; *p >= '0' && *p <= '9'; p++) {
		if (__builtin_mul_overflow(value, 10ull, &value) ||
		    __builtin_add_overflow(value, (unsigned long long)(*p - '0'), &value))
			return false;
	}
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		unsigned long long bytes;

		if (strcmp(p, units[i].suffix) != 0)
			continue;
		if (__builtin_mul_overflow(value, units[i].factor, &bytes) || bytes > SIZE_MAX)
			return false;
		*ret = (size_t)bytes;
		return true;
	}
	return false;
}

static bool reference_tag(const char *tag)
{
	size_t len = strlen(tag);

	if (len == 0 || len > DORMANT_TAG_MAX)
		return false;
	for (size_t i = 0; i < len; i++) {
		char c = tag[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_' || c == '.' || c == ':' || c == '-'))
			return false;
	}
	return true;
}

static void check_tags(char *text)
{
	struct options o = { .tags_spec = text };
	char *copy = strdup(text), *body;
	json_t *doc, *tags;
	int r;

	CHECK(copy);
	quiet(true);
	r = parse_tags(&o);
	quiet(false);
	if (r == 0) {
		size_t n = 0;

		CHECK(o.tags);
		for (; o.tags[n]; n++) {
			CHECK(tag_name_check(o.tags[n]) == 0);
			for (size_t j = 0; j < n; j++)
				CHECK(strcmp(o.tags[j], o.tags[n]) != 0);
		}
		CHECK(n >= 1 && n <= DORMANT_TAGS_MAX);
		body = request_body(&o);
		CHECK(body);
		doc = json_loads(body, JSON_REJECT_DUPLICATES, NULL);
		tags = json_object_get(doc, "tags");
		CHECK(json_is_array(tags) && json_array_size(tags) == n);
		for (size_t i = 0; i < n; i++)
			CHECK(strcmp(json_string_value(json_array_get(tags, i)), o.tags[i]) == 0);
		json_decref(doc);
		free(body);
	} else {
		/* refused: the list had a bad tag, a duplicate or too many */
		bool bad = false;
		size_t n = 0;
		char *item, *cursor = copy, *seen[DORMANT_TAGS_MAX + 1];

		while ((item = strsep(&cursor, ","))) {
			if (!reference_tag(item) || n == DORMANT_TAGS_MAX)
				bad = true;
			for (size_t j = 0; j < n && !bad; j++)
				bad = strcmp(seen[j], item) == 0;
			if (bad)
				break;
			seen[n++] = item;
		}
		CHECK(bad);
	}
	free(o.tags);
	free(copy);
}

static void check_numbers(const char *text)
{
	unsigned u = 0;
	double s = 0;
	int r;

	quiet(true);
	r = parse_unsigned("--n", text, 1, 1000, &u);
	quiet(false);
	if (r == 0) {
		char back[16];

		CHECK(u >= 1 && u <= 1000);
		snprintf(back, sizeof(back), "%u", u);
		/* digits only, leading zeros allowed */
		CHECK(strspn(text, "0123456789") == strlen(text));
		CHECK(strtoul(text, NULL, 10) == u);
	}
	quiet(true);
	r = parse_seconds("--timeout", text, 0.001, &s);
	quiet(false);
	if (r == 0)
		CHECK(isfinite(s) && s >= 0.001 && s <= SECONDS_MAX);
}

static void check_core_options(const char *text)
{
	struct dormant_options *o = NULL;
	struct dormant *m = NULL;
	int r;

	CHECK(dormant_options_new(&o) == 0);
	/* a small simulated device, so an accepted size never asks for much */
	CHECK(dormant_options_parse(o, "backend=host,host_device_bytes=64MiB") == 0);
	r = dormant_options_parse(o, text);
	CHECK(r == 0 || r == -EINVAL);
	CHECK(r == 0 || dormant_last_error()[0] != '\0');
	if (r == 0 && !strstr(text, "backend") && !strstr(text, "host_device")) {
		/* what the table accepted, the manager takes, or refuses with a message */
		r = dormant_new(o, &m);
		CHECK(r == 0 || (r < 0 && dormant_last_error()[0] != '\0'));
		dormant_destroy(m);
	}
	dormant_options_destroy(o);
}

/* Every server option's value, NUL-separated, into buf. */
static size_t server_values(const struct dormant_server_options *o, char *buf, size_t size)
{
	size_t used = 0;
	const char *name;

	for (size_t i = 0; (name = dormant_server_option_name(i)); i++) {
		int n = dormant_server_options_get(o, name, buf + used, size - used);

		CHECK(n >= 0);
		used += (size_t)n + 1;
		CHECK(used < size);
	}
	return used;
}

static void check_server_options(const char *text)
{
	static char before[1 << 14], after[1 << 14], again[1 << 14];
	struct dormant_server_options *o = NULL;
	size_t nb, na, ng;
	int r;

	CHECK(dormant_server_options_new(&o) == 0);
	CHECK(dormant_server_options_parse(o, "threads=3,quiet=true") == 0);
	nb = server_values(o, before, sizeof(before));
	r = dormant_server_options_parse(o, text);
	CHECK(r == 0 || r == -EINVAL);
	na = server_values(o, after, sizeof(after));
	if (r < 0) {
		CHECK(dormant_last_error()[0] != '\0');
		CHECK(na == nb && memcmp(before, after, nb) == 0); /* all or nothing */
	} else {
		CHECK(dormant_server_options_parse(o, text) == 0);
		ng = server_values(o, again, sizeof(again));
		CHECK(ng == na && memcmp(after, again, na) == 0);
	}
	dormant_server_options_destroy(o);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
	char *text;
	size_t got = 0, want = 0;
	bool ok;
	int r;

	if (size == 0 || size > 4096)
		return 0;
	text = strndup((const char *)data + 1, size - 1);
	CHECK(text);
	switch (data[0] % 6) {
	case 0:
		r = size_parse(text, &got);
		ok = reference_size(text, &want);
		CHECK((r == 0) == ok);
		CHECK(r == 0 ? got == want : r == -EINVAL);
		break;
	case 1:
		r = tag_name_check(text);
		CHECK((r == 0) == reference_tag(text));
		CHECK(r == 0 || r == -EINVAL);
		break;
	case 2:
		check_tags(text);
		break;
	case 3:
		check_numbers(text);
		break;
	case 4:
		check_core_options(text);
		break;
	case 5:
		check_server_options(text);
		break;
	}
	free(text);
	return 0;
}
