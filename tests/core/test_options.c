/* SPDX-License-Identifier: MIT */
/*
 * The options of dormant_new() (core/options.c), through the public calls
 * only: every option the library lists can be set and reads back from a
 * manager, its environment variable is honoured unless the option is set,
 * and bad names and values are refused with a message naming both, leaving
 * the options as they were. The tests walk the library's own list, so an
 * option added to the table is covered without a line here.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dormant.h"

#define VALUE_MAX DORMANT_PATH_MAX /* a path option reads back whole */

static size_t option_count(void)
{
	size_t n = 0;

	while (dormant_option_name(n))
		n++;
	return n;
}

/* No option comes from the test's environment unless a test puts it there. */
static void environment_clear(void)
{
	for (size_t i = 0; dormant_option_name(i); i++)
		if (dormant_option_env(i))
			unsetenv(dormant_option_env(i));
}

TestSuite(options, .init = environment_clear);

/* Option i's value in a manager made with every option unset. */
static void default_value(size_t i, char *buf, size_t size)
{
	struct dormant *m = NULL;

	cr_assert_eq(dormant_new(NULL, &m), 0, "%s", dormant_last_error());
	cr_assert_gt(dormant_option_value(m, dormant_option_name(i), buf, size), 0, "%s",
		     dormant_last_error());
	dormant_destroy(m);
}

/* A valid value of option i other than its default, and the text a manager
 * then reports for it. The backend's is host: this machine may have no GPU. */
static void candidate(size_t i, char *value, char *reads)
{
	const char *type = dormant_option_type(i);
	char current[VALUE_MAX];

	default_value(i, current, sizeof(current));
	if (strcmp(dormant_option_name(i), "backend") == 0) {
		strcpy(value, "host");
	} else if (strcmp(type, "enum") == 0) {
		const char *p = dormant_option_values(i);

		/* its first value that is not the default */
		for (;;) {
			size_t n = strcspn(p, "|");

			cr_assert(n > 0 && n < VALUE_MAX, "%s: values %s", dormant_option_name(i),
				  dormant_option_values(i));
			memcpy(value, p, n);
			value[n] = '\0';
			if (strcmp(value, current) != 0)
				break;
			cr_assert_eq(p[n], '|', "%s has one value", dormant_option_name(i));
			p += n + 1;
		}
	} else if (strcmp(type, "bool") == 0) {
		strcpy(value, strcmp(current, "true") == 0 ? "false" : "true");
	} else if (strcmp(type, "size") == 0) {
		bool eight = strcmp(current, "8388608") == 0;

		strcpy(value, eight ? "16MiB" : "8MiB");
		strcpy(reads, eight ? "16777216" : "8388608");
		return;
	} else if (strcmp(type, "int") == 0) {
		strcpy(value, strcmp(current, "1") == 0 ? "2" : "1");
	} else if (strcmp(type, "path") == 0) {
		strcpy(value, strcmp(current, "/var/tmp") == 0 ? "/tmp" : "/var/tmp");
	} else {
		cr_assert_fail("option %s has a type this test does not know: %s",
			       dormant_option_name(i), type);
	}
	strcpy(reads, value);
}

static struct dormant *manager_new(struct dormant_options *o)
{
	struct dormant *m = NULL;
	int r = dormant_new(o, &m);

	cr_assert_eq(r, 0, "dormant_new: %s", dormant_last_error());
	return m;
}

static void expect_value(struct dormant *m, const char *name, const char *want)
{
	char got[VALUE_MAX];
	int n = dormant_option_value(m, name, got, sizeof(got));

	cr_assert_geq(n, 0, "dormant_option_value(%s): %s", name, dormant_last_error());
	cr_expect_str_eq(got, want, "option %s reads back as '%s', not '%s'", name, got, want);
}

static struct dormant_options *options_on_host(void)
{
	struct dormant_options *o = NULL;

	cr_assert_eq(dormant_options_new(&o), 0);
	cr_assert_eq(dormant_options_set(o, "backend", "host"), 0, "%s", dormant_last_error());
	return o;
}

Test(options, every_option_is_listed_with_its_doc)
{
	size_t n = option_count();

	cr_assert_geq(n, 10, "the options of dormant.h are listed");
	for (size_t i = 0; i < n; i++) {
		const char *type = dormant_option_type(i);

		cr_expect_not_null(type);
		cr_expect_not_null(dormant_option_default(i), "%s has a default", dormant_option_name(i));
		cr_expect_not_null(dormant_option_doc(i));
		cr_expect_eq(dormant_option_values(i) != NULL, strcmp(type, "enum") == 0,
			     "%s: values exactly for enums", dormant_option_name(i));
		for (size_t j = 0; j < i; j++)
			cr_expect_str_neq(dormant_option_name(i), dormant_option_name(j));
	}
	cr_expect_null(dormant_option_type(n));
	cr_expect_null(dormant_option_doc(n));
	cr_expect_null(dormant_option_default(n + 100));
	cr_expect_null(dormant_option_env(n));
}

Test(options, every_option_is_settable_and_reads_back)
{
	for (size_t i = 0; dormant_option_name(i); i++) {
		const char *name = dormant_option_name(i);
		struct dormant_options *o = options_on_host();
		char value[VALUE_MAX], reads[VALUE_MAX];
		struct dormant *m;

		candidate(i, value, reads);
		cr_assert_eq(dormant_options_set(o, name, value), 0, "set %s=%s: %s", name, value,
			     dormant_last_error());
		m = manager_new(o);
		dormant_options_destroy(o); /* the manager keeps none of it */
		expect_value(m, name, reads);
		dormant_destroy(m);
	}
}

Test(options, defaults_are_what_the_list_says)
{
	struct dormant *m = NULL;
	char got[VALUE_MAX];

	/* NULL: all defaults (the backend is auto, which is host without a GPU) */
	cr_assert_eq(dormant_new(NULL, &m), 0, "%s", dormant_last_error());
	for (size_t i = 0; dormant_option_name(i); i++) {
		const char *name = dormant_option_name(i);
		struct dormant_options *o = NULL;
		struct dormant *with_default;
		char want[VALUE_MAX];

		cr_assert_gt(dormant_option_value(m, name, got, sizeof(got)), 0);
		/* a default given as a value: setting it changes nothing */
		cr_assert_eq(dormant_options_new(&o), 0);
		if (dormant_options_set(o, name, dormant_option_default(i)) < 0) {
			/* computed, like copy_threads: then it says how */
			cr_expect(strchr(dormant_option_default(i), ' ') ||
					  strchr(dormant_option_default(i), '('),
				  "%s: default '%s' is neither a value nor a rule", name,
				  dormant_option_default(i));
			dormant_options_destroy(o);
			continue;
		}
		cr_assert_eq(dormant_new(o, &with_default), 0, "%s", dormant_last_error());
		dormant_options_destroy(o);
		cr_assert_gt(dormant_option_value(with_default, name, want, sizeof(want)), 0);
		cr_expect_str_eq(got, want, "%s: the default reads '%s', setting '%s' reads '%s'",
				 name, got, dormant_option_default(i), want);
		dormant_destroy(with_default);
	}
	expect_value(m, "chunk_bytes", "1073741824");
	expect_value(m, "guard_timeout_ms", "30000");
	expect_value(m, "host_mode", "release");
	expect_value(m, "pin_host", "true");
	cr_expect_eq(dormant_host_mode(m), DORMANT_HOST_RELEASE);
	dormant_destroy(m);
}

Test(options, the_environment_applies_unless_the_option_is_set)
{
	for (size_t i = 0; dormant_option_name(i); i++) {
		const char *name = dormant_option_name(i), *env = dormant_option_env(i);
		char value[VALUE_MAX], reads[VALUE_MAX], fallback[VALUE_MAX];
		struct dormant_options *o = NULL;
		struct dormant *m = NULL;

		if (!env)
			continue;
		default_value(i, fallback, sizeof(fallback));
		candidate(i, value, reads);
		setenv(env, value, 1);
		/* no options object at all, and one with other options set */
		m = manager_new(NULL);
		expect_value(m, name, reads);
		dormant_destroy(m);
		cr_assert_eq(dormant_options_new(&o), 0);
		cr_assert_eq(dormant_options_set(o, "guard_timeout_ms", "5"), 0);
		m = manager_new(o);
		expect_value(m, name, reads);
		dormant_destroy(m);

		/* set, the option wins over the variable */
		cr_assert_eq(dormant_options_set(o, name, fallback), 0, "%s", dormant_last_error());
		m = manager_new(o);
		expect_value(m, name, fallback);
		dormant_destroy(m);

		/* a bad variable fails the manager, naming it and the option */
		setenv(env, "bad!", 1);
		cr_assert_eq(dormant_options_set(o, name, NULL), 0); /* unset: the variable counts */
		m = NULL;
		cr_expect_eq(dormant_new(o, &m), -EINVAL, "$%s=bad! is refused", env);
		cr_expect_null(m);
		cr_expect(strstr(dormant_last_error(), env) && strstr(dormant_last_error(), name),
			  "message names $%s and %s: %s", env, name, dormant_last_error());
		dormant_destroy(m);
		dormant_options_destroy(o);
		unsetenv(env);
	}
}

Test(options, bad_values_are_refused_naming_option_and_value)
{
	static const char *const bad[][2] = {
		{ "backend", "tpu" },		{ "backend", "" },
		{ "host_mode", "keep" },	{ "chunk_bytes", "12XB" },
		{ "chunk_bytes", "0" },		{ "chunk_bytes", "-1" },
		{ "chunk_bytes", "99999999999999999999" },
		{ "copy_threads", "0" },	{ "copy_threads", "257" },
		{ "copy_threads", "2x" },	{ "guard_timeout_ms", "99999999999" },
		{ "guard_timeout_ms", "" },	{ "pin_host", "maybe" },
		{ "pin_piece_bytes", "5000" },	{ "host_devices", "17" },
		{ "host_devices", "0" },	{ "staging_bytes", "1MiB" },
		{ "pin_threads", "0" },		{ "pin_threads", "33" },
	};
	struct dormant_options *o = options_on_host();
	struct dormant *m;

	/* good values first: a refused one must leave them */
	cr_assert_eq(dormant_options_parse(o, "chunk_bytes=4MiB,copy_threads=3,host_devices=2,"
					   "host_mode=retain,pin_host=false,staging_bytes=16MiB,"
					   "pin_piece_bytes=1MiB,guard_timeout_ms=7"),
		     0, "%s", dormant_last_error());
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *name = bad[i][0], *value = bad[i][1];

		cr_expect_eq(dormant_options_set(o, name, value), -EINVAL, "%s=%s is refused", name,
			     value);
		cr_expect(strstr(dormant_last_error(), name) &&
				  (!*value || strstr(dormant_last_error(), value)),
			  "message names %s and '%s': %s", name, value, dormant_last_error());
	}
	/* every option refuses what is no value of any type */
	for (size_t i = 0; dormant_option_name(i); i++)
		cr_expect_eq(dormant_options_set(o, dormant_option_name(i), "?!"), -EINVAL, "%s",
			     dormant_option_name(i));
	m = manager_new(o);
	expect_value(m, "backend", "host");
	expect_value(m, "chunk_bytes", "4194304");
	expect_value(m, "copy_threads", "3");
	expect_value(m, "host_devices", "2");
	expect_value(m, "host_mode", "retain");
	expect_value(m, "pin_host", "false");
	expect_value(m, "staging_bytes", "16777216");
	expect_value(m, "pin_piece_bytes", "1048576");
	expect_value(m, "guard_timeout_ms", "7");
	cr_expect_eq(dormant_host_mode(m), DORMANT_HOST_RETAIN);
	cr_expect_eq(dormant_device_count(m), 2);
	dormant_destroy(m);
	dormant_options_destroy(o);
}

Test(options, unknown_names_and_bad_lists_are_refused)
{
	struct dormant_options *o = NULL;
	struct dormant *m;
	char buf[VALUE_MAX];

	cr_assert_eq(dormant_options_new(&o), 0);
	cr_expect_eq(dormant_options_set(o, "chunk_size", "1GiB"), -EINVAL);
	cr_expect_not_null(strstr(dormant_last_error(), "chunk_size"), "%s", dormant_last_error());
	cr_expect_eq(dormant_options_set_int(o, "nope", 1), -EINVAL);
	cr_expect_eq(dormant_options_set_int(o, "backend", 1), -EINVAL, "an enum takes no number");
	cr_expect_eq(dormant_options_set(NULL, "backend", "host"), -EINVAL);
	cr_expect_eq(dormant_options_set(o, NULL, "host"), -EINVAL);
	cr_expect_eq(dormant_options_set_log(NULL, NULL, NULL), -EINVAL);
	cr_expect_eq(dormant_options_new(NULL), -EINVAL);
	dormant_options_destroy(NULL);

	/* all or nothing: a bad pair anywhere leaves every option unset */
	cr_expect_eq(dormant_options_parse(o, "backend=host,chunk_bytes=2MiB,nope=1"), -EINVAL);
	cr_expect_not_null(strstr(dormant_last_error(), "nope"), "%s", dormant_last_error());
	cr_expect_eq(dormant_options_parse(o, "backend=host chunk_bytes"), -EINVAL);
	cr_expect_not_null(strstr(dormant_last_error(), "chunk_bytes"), "%s", dormant_last_error());
	cr_expect_eq(dormant_options_parse(o, "host_mode=retain,copy_threads=300"), -EINVAL);
	m = manager_new(o);
	expect_value(m, "backend", "auto");
	expect_value(m, "chunk_bytes", "1073741824");
	expect_value(m, "host_mode", "release");
	cr_expect_eq(dormant_option_value(m, "nope", buf, sizeof(buf)), -EINVAL);
	cr_expect_eq(dormant_option_value(m, "chunk_bytes", buf, 4), -ENOSPC);
	dormant_destroy(m);

	/* separators: commas and white space; NULL unsets */
	cr_expect_eq(dormant_options_parse(o, " backend=host,\tchunk_bytes=2MiB  copy_threads=2,"), 0,
		     "%s", dormant_last_error());
	cr_expect_eq(dormant_options_set_int(o, "pin_host", 0), 0);
	cr_expect_eq(dormant_options_set_int(o, "host_device_bytes", 256 << 20), 0);
	cr_expect_eq(dormant_options_set(o, "copy_threads", NULL), 0);
	m = manager_new(o);
	expect_value(m, "chunk_bytes", "2097152");
	expect_value(m, "pin_host", "false");
	expect_value(m, "host_device_bytes", "268435456");
	dormant_destroy(m);
	dormant_options_destroy(o);
}

/* guard_timeout_ms 0: a sleep does not wait for a running step at all */
Test(options, guard_timeout_zero_does_not_wait)
{
	struct dormant_options *o = options_on_host();
	struct dormant_report report;
	struct dormant *m;
	void *p = NULL;

	cr_assert_eq(dormant_options_set_int(o, "guard_timeout_ms", 0), 0);
	m = manager_new(o);
	dormant_options_destroy(o);
	cr_assert_eq(dormant_alloc(m, "weights", 1 << 20, &p), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_step_enter(m, 0), 0);
	cr_expect_eq(dormant_sleep(m, NULL, &report), -EBUSY, "%s", dormant_last_error());
	cr_expect_not_null(strstr(dormant_last_error(), "after 0 ms"), "%s", dormant_last_error());
	cr_assert_eq(dormant_step_leave(m), 0);
	cr_expect_eq(dormant_sleep(m, NULL, &report), 0, "%s", dormant_last_error());
	cr_expect_eq(dormant_wake(m, NULL, &report), 0, "%s", dormant_last_error());
	dormant_free(m, p);
	dormant_destroy(m);
}

/* What name reads back as on a manager (expect_value()); host_mode also as
 * the mode the manager runs in. */
static void expect_mode(struct dormant *m, const char *name, const char *want)
{
	expect_value(m, name, want);
	if (strcmp(name, "host_mode") == 0)
		cr_expect_str_eq(dormant_host_mode_name(dormant_host_mode(m)), want,
				 "the manager runs in host mode %s",
				 dormant_host_mode_name(dormant_host_mode(m)));
}

/* residue=checkpoint gives option name the value checkpointed unless name
 * is given: as an option (given), through its variable env (from_env); the
 * mode from its own variable counts the same, and keep leaves name at kept. */
static void expect_checkpoint_default(const char *name, const char *env,
				      const char *checkpointed, const char *given,
				      const char *from_env, const char *kept)
{
	struct dormant_options *o = options_on_host();
	struct dormant *m;

	cr_assert_eq(dormant_options_set(o, "residue", "checkpoint"), 0, "%s", dormant_last_error());
	m = manager_new(o);
	expect_mode(m, name, checkpointed);
	dormant_destroy(m);

	cr_assert_eq(dormant_options_set(o, name, given), 0);
	m = manager_new(o);
	expect_mode(m, name, given);
	dormant_destroy(m);

	cr_assert_eq(dormant_options_set(o, name, NULL), 0);
	setenv(env, from_env, 1);
	m = manager_new(o);
	expect_mode(m, name, from_env);
	dormant_destroy(m);
	unsetenv(env);

	cr_assert_eq(dormant_options_set(o, "residue", NULL), 0);
	setenv("DORMANT_RESIDUE", "checkpoint", 1);
	m = manager_new(o);
	expect_mode(m, name, checkpointed);
	dormant_destroy(m);
	setenv("DORMANT_RESIDUE", "keep", 1);
	m = manager_new(o);
	expect_mode(m, name, kept);
	dormant_destroy(m);
	unsetenv("DORMANT_RESIDUE");
	dormant_options_destroy(o);
}

/* residue=checkpoint: registered host memory slows the driver's checkpoint
 * and restore, so the host copies stay unpinned unless pin_host is given,
 * as an option or through its variable. */
Test(options, pin_host_is_false_under_residue_checkpoint_unless_given)
{
	expect_checkpoint_default("pin_host", "DORMANT_PIN_HOST", "false", "true", "true", "true");
}

/* residue=checkpoint: a release-mode sleep would fault in fresh host copies
 * at every sleep, so the host mode is reclaimable unless host_mode is given,
 * as an option, through its variable or after dormant_new(). */
Test(options, host_mode_is_reclaimable_under_residue_checkpoint_unless_given)
{
	struct dormant_options *o = options_on_host();
	struct dormant *m;

	expect_checkpoint_default("host_mode", "DORMANT_HOST_MODE", "reclaimable", "release",
				  "retain", "release");
	/* a switch at run time is the caller's word, as before */
	cr_assert_eq(dormant_options_set(o, "residue", "checkpoint"), 0, "%s", dormant_last_error());
	m = manager_new(o);
	cr_expect_eq(dormant_set_host_mode(m, DORMANT_HOST_RELEASE), 0, "%s", dormant_last_error());
	cr_expect_eq(dormant_host_mode(m), DORMANT_HOST_RELEASE);
	dormant_destroy(m);
	dormant_options_destroy(o);
}
