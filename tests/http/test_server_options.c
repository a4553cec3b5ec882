/* SPDX-License-Identifier: MIT */
/*
 * The options of dormant_server_start() (server/server_options.c), through the
 * public calls only: every option the library lists has a default, can be
 * set and reads back, refuses a bad value with a message naming both and is
 * left as it was; unknown names are refused; environment variables apply
 * unless the option is set; dormant_server_options_parse() is all or
 * nothing; the checks across options run at check and start. The tests walk
 * the library's list: a row added without a line in the tables below fails.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dormant-server.h"

#define VALUE_MAX 256

static void environment_clear(void)
{
	for (size_t i = 0; dormant_server_option_name(i); i++)
		if (dormant_server_option_env(i))
			unsetenv(dormant_server_option_env(i));
}

TestSuite(server_options, .init = environment_clear);

/* Per row: its default as read back, a good value (and how it reads back),
 * a bad one. */
static const struct row {
	const char *name, *def, *good, *good_back, *bad;
} rows[] = {
	{ "listen", "127.0.0.1:8787", "[::1]:0", NULL, "localhost" },
	{ "unix_path", "", "/tmp/x.sock", NULL, "" },
	{ "token", "", "s3cret", NULL, "two words" },
	{ "token_file", "", "/etc/token", NULL, "" },
	{ "open_probes", "false", "yes", "true", "perhaps" },
	{ "insecure_no_auth", "false", "1", "true", "maybe" },
	{ "threads", "4", "8", NULL, "257" },
	{ "max_connections", "64", "1000", NULL, "65537" },
	{ "max_connections_per_ip", "32", "7", NULL, "0" },
	{ "connection_timeout_s", "30", "86400", NULL, "86401" },
	{ "request_timeout_s", "10", "1", NULL, "-1" },
	{ "quiet", "false", "on", "true", "2" },
	{ "faults", "", "wake:create,sleep:copy:2:EIO:0", NULL, "wake:nothing" },
	{ "publish", "0", "/run/dormant", NULL, "somewhere" },
};

static const struct row *row_of(const char *name)
{
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		if (strcmp(rows[i].name, name) == 0)
			return &rows[i];
	return NULL;
}

static const char *get(const struct dormant_server_options *o, const char *name)
{
	static char buf[VALUE_MAX];
	int r = dormant_server_options_get(o, name, buf, sizeof(buf));

	cr_assert_geq(r, 0, "get %s: %s", name, dormant_last_error());
	cr_assert_eq((size_t)r, strlen(buf));
	return buf;
}

static struct dormant_server_options *fresh(void)
{
	struct dormant_server_options *o = NULL;

	cr_assert_eq(dormant_server_options_new(&o), 0);
	return o;
}

Test(server_options, every_row_is_listed_here_and_documented)
{
	size_t n = 0;

	for (size_t i = 0; dormant_server_option_name(i); i++, n++) {
		const char *name = dormant_server_option_name(i);
		const char *type = dormant_server_option_type(i);

		cr_expect(row_of(name), "server option %s has no row in this test", name);
		cr_expect(dormant_server_option_doc(i) && *dormant_server_option_doc(i), "%s", name);
		cr_expect(dormant_server_option_default(i), "%s has no default text", name);
		cr_expect(strcmp(type, "text") == 0 || strcmp(type, "int") == 0 ||
				  strcmp(type, "bool") == 0,
			  "%s: type %s", name, type);
	}
	cr_expect_eq(n, sizeof(rows) / sizeof(rows[0]), "the table has %zu rows", n);
	cr_expect_null(dormant_server_option_type(n));
	cr_expect_null(dormant_server_option_doc(n));
}

Test(server_options, defaults)
{
	struct dormant_server_options *o = fresh();

	for (size_t i = 0; dormant_server_option_name(i); i++) {
		const char *name = dormant_server_option_name(i);
		const struct row *row = row_of(name);

		cr_assert(row, "%s", name);
		cr_expect_str_eq(get(o, name), row->def, "%s", name);
		cr_expect_str_eq(get(NULL, name), row->def, "%s (NULL options)", name);
	}
	dormant_server_options_destroy(o);
}

Test(server_options, every_row_set_and_read_back)
{
	struct dormant_server_options *o = fresh();

	for (size_t i = 0; dormant_server_option_name(i); i++) {
		const char *name = dormant_server_option_name(i);
		const struct row *row = row_of(name);

		cr_assert(row, "%s", name);
		cr_assert_eq(dormant_server_options_set(o, name, row->good), 0, "%s=%s: %s", name,
			     row->good, dormant_last_error());
		cr_expect_str_eq(get(o, name), row->good_back ? row->good_back : row->good, "%s",
				 name);
		/* NULL: back to the default */
		cr_assert_eq(dormant_server_options_set(o, name, NULL), 0);
		cr_expect_str_eq(get(o, name), row->def, "%s after NULL", name);
	}
	/* numbers through set_int */
	cr_assert_eq(dormant_server_options_set_int(o, "threads", 16), 0);
	cr_expect_str_eq(get(o, "threads"), "16");
	cr_assert_eq(dormant_server_options_set_int(o, "quiet", 5), 0);
	cr_expect_str_eq(get(o, "quiet"), "true");
	cr_expect_eq(dormant_server_options_set_int(o, "listen", 1), -EINVAL);
	cr_expect(strstr(dormant_last_error(), "listen"));
	dormant_server_options_destroy(o);
}

Test(server_options, a_bad_value_is_named_and_changes_nothing)
{
	struct dormant_server_options *o = fresh();

	for (size_t i = 0; dormant_server_option_name(i); i++) {
		const char *name = dormant_server_option_name(i);
		const struct row *row = row_of(name);
		char before[VALUE_MAX];

		cr_assert(row, "%s", name);
		cr_assert_eq(dormant_server_options_set(o, name, row->good), 0, "%s", name);
		snprintf(before, sizeof(before), "%s", get(o, name));
		cr_expect_eq(dormant_server_options_set(o, name, row->bad), -EINVAL, "%s=%s", name,
			     row->bad);
		cr_expect(strstr(dormant_last_error(), name), "%s: %s", name, dormant_last_error());
		if (*row->bad && strcmp(name, "token") != 0) /* a token is never repeated */
			cr_expect(strstr(dormant_last_error(), row->bad), "%s: %s", name,
				  dormant_last_error());
		cr_expect_str_eq(get(o, name), before, "%s changed by a bad value", name);
	}
	cr_expect_eq(dormant_server_options_set(o, "token", "two words"), -EINVAL);
	cr_expect_null(strstr(dormant_last_error(), "two words"), "the token was repeated");
	cr_expect_eq(dormant_server_options_set_int(o, "threads", 0), -EINVAL);
	cr_expect_eq(dormant_server_options_set(o, "threads", " 8"), -EINVAL);
	cr_expect_eq(dormant_server_options_set(o, "threads", "+8"), -EINVAL);
	cr_expect_eq(dormant_server_options_set(o, "threads", "8x"), -EINVAL);
	cr_expect_eq(dormant_server_options_set_int(o, "threads", 1LL << 40), -EINVAL);
	cr_expect_str_eq(get(o, "threads"), "8");
	dormant_server_options_destroy(o);
}

Test(server_options, unknown_names_and_null_arguments)
{
	struct dormant_server_options *o = fresh();
	char buf[8];

	cr_expect_eq(dormant_server_options_set(o, "treads", "4"), -EINVAL);
	cr_expect(strstr(dormant_last_error(), "'treads'"), "%s", dormant_last_error());
	cr_expect_eq(dormant_server_options_set_int(o, "treads", 4), -EINVAL);
	cr_expect_eq(dormant_server_options_get(o, "treads", buf, sizeof(buf)), -EINVAL);
	cr_expect_eq(dormant_server_options_set(NULL, "threads", "4"), -EINVAL);
	cr_expect_eq(dormant_server_options_set(o, NULL, "4"), -EINVAL);
	cr_expect_eq(dormant_server_options_parse(o, NULL), -EINVAL);
	cr_expect_eq(dormant_server_options_new(NULL), -EINVAL);
	cr_expect_eq(dormant_server_options_get(o, "listen", buf, sizeof(buf)), -ENOSPC);
	cr_expect_eq(dormant_server_options_set_stats_extra(NULL, NULL, NULL), -EINVAL);
	dormant_server_options_destroy(NULL);
	dormant_server_options_destroy(o);
}

Test(server_options, parse_is_all_or_nothing)
{
	struct dormant_server_options *o = fresh();

	cr_expect_eq(dormant_server_options_parse(o, "threads=8,quiet=on,treads=2"), -EINVAL);
	cr_expect(strstr(dormant_last_error(), "treads"), "%s", dormant_last_error());
	cr_expect_eq(dormant_server_options_parse(o, "threads=8,max_connections=x"), -EINVAL);
	cr_expect(strstr(dormant_last_error(), "max_connections"));
	cr_expect_eq(dormant_server_options_parse(o, "threads=8,quiet"), -EINVAL);
	cr_expect_str_eq(get(o, "threads"), "4");
	cr_expect_str_eq(get(o, "quiet"), "false");
	/* a piece without '=' continues the fault rules */
	cr_assert_eq(dormant_server_options_parse(o, " threads=8, faults=wake:create,sleep:copy,"
						     "quiet=on\ntoken=a=b "), 0,
		     "%s", dormant_last_error());
	cr_expect_str_eq(get(o, "threads"), "8");
	cr_expect_str_eq(get(o, "faults"), "wake:create,sleep:copy");
	cr_expect_str_eq(get(o, "quiet"), "true");
	cr_expect_str_eq(get(o, "token"), "a=b");
	cr_expect_eq(dormant_server_options_parse(o, ""), 0);
	dormant_server_options_destroy(o);
}

Test(server_options, environment_unless_set)
{
	struct dormant_server_options *o = fresh();

	setenv("DORMANT_FAULTS", "wake:map", 1);
	setenv("DORMANT_TOKEN", "from-env", 1);
	setenv("DORMANT_PUBLISH", "0", 1);
	/* the fault switch is never armed from the environment (issue 25) */
	cr_expect_str_eq(get(o, "faults"), "", "$DORMANT_FAULTS armed faults");
	cr_expect_str_eq(get(o, "token"), "from-env");
	cr_assert_eq(dormant_server_options_set(o, "faults", "wake:map"), 0);
	cr_expect_str_eq(get(o, "faults"), "wake:map");
	cr_assert_eq(dormant_server_options_set(o, "faults", NULL), 0);
	/* an explicit token_file beats $DORMANT_TOKEN */
	cr_assert_eq(dormant_server_options_set(o, "token_file", "/nonexistent/token"), 0);
	cr_expect_str_eq(get(o, "token"), "");
	cr_expect_eq(dormant_server_options_check(o), -EINVAL);
	cr_expect(strstr(dormant_last_error(), "/nonexistent/token"), "%s", dormant_last_error());
	cr_assert_eq(dormant_server_options_set(o, "token_file", NULL), 0);
	cr_expect_eq(dormant_server_options_check(o), 0, "%s", dormant_last_error());
	/* a bad $DORMANT_FAULTS is no error: it is not read */
	setenv("DORMANT_FAULTS", "wake:nothing", 1);
	cr_expect_eq(dormant_server_options_check(o), 0, "%s", dormant_last_error());
	unsetenv("DORMANT_FAULTS");
	/* a bad variable is named at check */
	setenv("DORMANT_INSECURE_NO_AUTH", "perhaps", 1);
	cr_expect_eq(dormant_server_options_check(o), -EINVAL);
	cr_expect(strstr(dormant_last_error(), "$DORMANT_INSECURE_NO_AUTH"), "%s",
		  dormant_last_error());
	unsetenv("DORMANT_INSECURE_NO_AUTH");
	setenv("DORMANT_PUBLISH", "relative/dir", 1);
	cr_expect_eq(dormant_server_options_check(o), -EINVAL);
	cr_expect(strstr(dormant_last_error(), "$DORMANT_PUBLISH"), "%s", dormant_last_error());
	dormant_server_options_destroy(o);
}

/* Safe by default (issue 25): no token is fine on loopback and Unix sockets
 * only, unless insecure_no_auth (or its variable) says so. */
Test(server_options, no_token_beyond_loopback_needs_insecure_no_auth)
{
	static const char *const local[] = { "127.0.0.1:0", "127.0.0.2:0", "[::1]:0",
					     "localhost:0" };
	static const char *const exposed[] = { "0.0.0.0:0", "[::]:0" };
	struct dormant_server_options *o = fresh();

	for (size_t i = 0; i < sizeof(local) / sizeof(local[0]); i++) {
		cr_assert_eq(dormant_server_options_set(o, "listen", local[i]), 0);
		cr_expect_eq(dormant_server_options_check(o), 0, "%s: %s", local[i],
			     dormant_last_error());
	}
	for (size_t i = 0; i < sizeof(exposed) / sizeof(exposed[0]); i++) {
		cr_assert_eq(dormant_server_options_set(o, "listen", exposed[i]), 0);
		cr_expect_eq(dormant_server_options_check(o), -EINVAL, "%s", exposed[i]);
		cr_expect(strstr(dormant_last_error(), "without a token") &&
				  strstr(dormant_last_error(), "insecure_no_auth") &&
				  strstr(dormant_last_error(), exposed[i]),
			  "%s", dormant_last_error());
		/* a token, the explicit option, or its variable */
		cr_assert_eq(dormant_server_options_set(o, "token", "s3cret"), 0);
		cr_expect_eq(dormant_server_options_check(o), 0, "%s", dormant_last_error());
		cr_assert_eq(dormant_server_options_set(o, "token", NULL), 0);
		cr_assert_eq(dormant_server_options_set(o, "insecure_no_auth", "true"), 0);
		cr_expect_eq(dormant_server_options_check(o), 0, "%s", dormant_last_error());
		cr_assert_eq(dormant_server_options_set(o, "insecure_no_auth", NULL), 0);
		setenv("DORMANT_INSECURE_NO_AUTH", "1", 1);
		cr_expect_eq(dormant_server_options_check(o), 0, "%s", dormant_last_error());
		unsetenv("DORMANT_INSECURE_NO_AUTH");
		cr_expect_eq(dormant_server_options_check(o), -EINVAL);
	}
	cr_assert_eq(dormant_server_options_set(o, "listen", NULL), 0);
	cr_assert_eq(dormant_server_options_set(o, "unix_path", "/tmp/never.sock"), 0);
	cr_expect_eq(dormant_server_options_check(o), 0, "%s", dormant_last_error());
	dormant_server_options_destroy(o);
}

/* deploy/kubernetes/secret.yaml's placeholder is no token. */
Test(server_options, the_placeholder_token_is_refused)
{
	struct dormant_server_options *o = fresh();
	char path[] = "/tmp/dormant-token-XXXXXX";
	FILE *f;
	int fd;

	cr_expect_eq(dormant_server_options_set(o, "token", "REPLACE-ME-openssl-rand-hex-32"),
		     -EINVAL);
	cr_expect(strstr(dormant_last_error(), "placeholder"), "%s", dormant_last_error());
	cr_expect_eq(dormant_server_options_set(o, "token", "replace-me"), -EINVAL);
	cr_expect_str_eq(get(o, "token"), "");
	/* from a file, as the manifests pass it */
	fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	f = fdopen(fd, "w");
	fputs("  REPLACE-ME-openssl-rand-hex-32\n", f);
	fclose(f);
	cr_assert_eq(dormant_server_options_set(o, "token_file", path), 0);
	cr_expect_eq(dormant_server_options_check(o), -EINVAL);
	cr_expect(strstr(dormant_last_error(), "placeholder"), "%s", dormant_last_error());
	/* from the environment */
	cr_assert_eq(dormant_server_options_set(o, "token_file", NULL), 0);
	setenv("DORMANT_TOKEN", "REPLACE-ME", 1);
	cr_expect_eq(dormant_server_options_check(o), -EINVAL);
	cr_expect(strstr(dormant_last_error(), "placeholder"), "%s", dormant_last_error());
	unsetenv("DORMANT_TOKEN");
	unlink(path);
	dormant_server_options_destroy(o);
}
