/* SPDX-License-Identifier: MIT */
/* The exported JSON functions (the Python package's ctypes calls) and the
 * embedder's "extra" in /stats. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api.h"
#include "client.h"
#include "dormant-json.h"

TestSuite(json, .timeout = 60);

static json_t *parse(const char *text)
{
	json_error_t error;
	json_t *doc = json_loads(text, 0, &error);

	cr_assert(doc, "%s: %s", error.text, text);
	return doc;
}

Test(json, stats_json)
{
	struct fixture_config config = { .no_server = true };
	struct fixture f;
	char *text = NULL;
	json_t *doc;

	fixture_start(&f, &config);
	cr_assert_eq(dormant_stats_json(f.m, false, &text), 0);
	cr_assert_null(strchr(text, '\n'));
	doc = parse(text);
	cr_assert_str_eq(json_string_value(json_object_get(doc, "backend")), "host");
	cr_assert_eq(json_array_size(json_object_get(doc, "tags")), 2);
	cr_assert_null(json_object_get(doc, "extra"));
	json_decref(doc);
	dormant_json_free(text);

	cr_assert_eq(dormant_stats_json(f.m, true, &text), 0);
	cr_assert(strstr(text, "\n  \"state\": \"awake\""), "%s", text);
	dormant_json_free(text);

	text = (char *)"untouched";
	cr_assert_eq(dormant_stats_json(NULL, false, &text), -EINVAL);
	cr_assert_str_eq(text, "untouched");
	cr_assert_eq(dormant_stats_json(f.m, false, NULL), -EINVAL);
	dormant_json_free(NULL);
	fixture_stop(&f);
}

Test(json, transition_json)
{
	struct fixture_config config = { .no_server = true };
	const char *weights[] = { "weights", NULL };
	const char *unknown[] = { "weights", "nope", NULL };
	struct fixture f;
	char *text = NULL;
	json_t *doc;

	fixture_start(&f, &config);
	cr_assert_eq(dormant_transition_json(f.m, "sleep", weights, &text), 0);
	doc = parse(text);
	cr_assert_str_eq(json_string_value(json_object_get(doc, "action")), "sleep");
	cr_assert_str_eq(json_string_value(json_object_get(doc, "result")), "ok");
	cr_assert_str_eq(json_string_value(json_object_get(doc, "state")), "mixed");
	cr_assert(json_is_true(json_object_get(doc, "changed")));
	cr_assert_null(json_object_get(doc, "error"));
	cr_assert_eq(json_array_size(json_object_get(doc, "tags")), 1);
	json_decref(doc);
	dormant_json_free(text);

	cr_assert_eq(dormant_transition_json(f.m, "sleep", NULL, &text), 0);
	doc = parse(text);
	cr_assert_str_eq(json_string_value(json_object_get(doc, "state")), "asleep");
	json_decref(doc);
	dormant_json_free(text);

	text = NULL;
	cr_assert_eq(dormant_transition_json(f.m, "wake", unknown, &text), -ENOENT);
	cr_assert(text);
	doc = parse(text);
	cr_assert_str_eq(json_string_value(json_object_get(doc, "result")), "ENOENT");
	cr_assert(strstr(json_string_value(json_object_get(doc, "error")), "nope"));
	cr_assert_str_eq(json_string_value(json_object_get(doc, "state")), "asleep");
	json_decref(doc);
	dormant_json_free(text);
	cr_assert(strstr(dormant_last_error(), "nope"), "%s", dormant_last_error());

	cr_assert_eq(dormant_debug_inject_fault(f.m, DORMANT_FAULT_CREATE, 1, -ENOMEM, false), 0);
	cr_assert_eq(dormant_transition_json(f.m, "wake", NULL, &text), -ENOMEM);
	doc = parse(text);
	cr_assert_str_eq(json_string_value(json_object_get(doc, "result")), "ENOMEM");
	json_decref(doc);
	dormant_json_free(text);

	cr_assert_eq(dormant_transition_json(f.m, "wake", NULL, &text), 0);
	dormant_json_free(text);
	cr_assert(weights_intact(&f));

	text = (char *)"untouched";
	cr_assert_eq(dormant_transition_json(f.m, "nap", NULL, &text), -EINVAL);
	cr_assert_eq(dormant_transition_json(f.m, NULL, NULL, &text), -EINVAL);
	cr_assert_eq(dormant_transition_json(NULL, "sleep", NULL, &text), -EINVAL);
	cr_assert_str_eq(text, "untouched");
	cr_assert_eq(dormant_transition_json(f.m, "sleep", NULL, NULL), -EINVAL);
	cr_assert_str_eq(tag_state(&f, "weights"), "awake");
	fixture_stop(&f);
}

static pthread_mutex_t hold_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cond = PTHREAD_COND_INITIALIZER;
static bool held, let_go;

static int hold_hook(struct dormant *m, enum dormant_hook_point point, void *userdata)
{
	pthread_mutex_lock(&hold_lock);
	held = true;
	pthread_cond_broadcast(&hold_cond);
	while (!let_go)
		pthread_cond_wait(&hold_cond, &hold_lock);
	pthread_mutex_unlock(&hold_lock);
	return 0;
}

static void *sleeper(void *arg)
{
	char *text = NULL;

	cr_assert_eq(dormant_transition_json(arg, "sleep", NULL, &text), 0);
	dormant_json_free(text);
	return NULL;
}

Test(json, transition_json_busy)
{
	struct fixture_config config = { .no_server = true };
	struct fixture f;
	pthread_t thread;
	char *text = NULL;
	json_t *doc;

	fixture_start(&f, &config);
	cr_assert_gt(dormant_hook_add(f.m, DORMANT_HOOK_BEFORE_SLEEP, hold_hook, NULL), 0);
	cr_assert_eq(pthread_create(&thread, NULL, sleeper, f.m), 0);
	pthread_mutex_lock(&hold_lock);
	while (!held)
		pthread_cond_wait(&hold_cond, &hold_lock);
	pthread_mutex_unlock(&hold_lock);

	cr_assert_eq(dormant_transition_json(f.m, "wake", NULL, &text), -EBUSY);
	doc = parse(text);
	cr_assert_str_eq(json_string_value(json_object_get(doc, "result")), "EBUSY");
	json_decref(doc);
	dormant_json_free(text);

	pthread_mutex_lock(&hold_lock);
	let_go = true;
	pthread_cond_broadcast(&hold_cond);
	pthread_mutex_unlock(&hold_lock);
	pthread_join(thread, NULL);
	fixture_stop(&f);
}

static int good_extra(void *userdata, char *buf, size_t size)
{
	return snprintf(buf, size, "{\"verifications\": 3, \"note\": \"%s\"}", (char *)userdata);
}

static int not_an_object(void *userdata, char *buf, size_t size)
{
	return snprintf(buf, size, "[1, 2]");
}

static int not_json(void *userdata, char *buf, size_t size)
{
	return snprintf(buf, size, "{verifications: 3");
}

static int too_long(void *userdata, char *buf, size_t size)
{
	memset(buf, ' ', size);
	return (int)size;
}

static int failing(void *userdata, char *buf, size_t size)
{
	return -EIO;
}

static char hello[] = "hello";

Test(json, stats_extra)
{
	dormant_stats_extra_fn broken[] = { not_an_object, not_json, too_long, failing };
	struct fixture_config config = { .server = { .stats_extra = good_extra,
						     .stats_extra_userdata = hello } };
	struct fixture f;
	struct http_response r;
	json_t *doc, *extra;

	fixture_start(&f, &config);
	http_get(&f, "/stats", &r);
	doc = http_json(&r);
	extra = json_object_get(doc, "extra");
	cr_assert(json_is_object(extra), "%s", r.body);
	cr_assert_eq(json_integer_value(json_object_get(extra, "verifications")), 3);
	cr_assert_str_eq(json_string_value(json_object_get(extra, "note")), "hello");
	json_decref(doc);
	http_response_free(&r);
	fixture_stop(&f);

	/* a broken callback costs its "extra", never the answer */
	for (size_t i = 0; i < sizeof(broken) / sizeof(broken[0]); i++) {
		config.server.stats_extra = broken[i];
		fixture_start(&f, &config);
		http_get(&f, "/stats", &r);
		cr_assert_eq(r.status, 200);
		doc = http_json(&r);
		cr_assert_null(json_object_get(doc, "extra"), "case %zu: %s", i, r.body);
		json_decref(doc);
		http_response_free(&r);
		fixture_stop(&f);
	}
}

/* What a number becomes in the API's JSON (the text jansson prints). */
static void expect_number(double value, enum api_number kind, const char *want)
{
	json_t *n = api_number(value, kind);
	char *text;

	cr_assert(n);
	text = json_dumps(n, JSON_ENCODE_ANY | API_JSON_REAL);
	cr_assert(text);
	cr_expect_str_eq(text, want, "%.17g (kind %d) printed as %s, not %s", value, (int)kind,
			 text, want);
	free(text);
	json_decref(n);
}

Test(json, numbers_without_float_noise)
{
	/* a float's 1.2e-7 seen as a double, and a sum that misses 0.3 */
	expect_number((double)1.2e-7f, API_SECONDS, "1.2e-7");
	expect_number(0.1 + 0.2, API_SECONDS, "0.3");
	expect_number(0.002063251, API_SECONDS, "0.002063251");
	expect_number(86400.5, API_SECONDS, "86400.5");
	/* 9 significant digits made this 1.79612236e9: ten seconds off */
	expect_number(1796122360.1234567, API_UNIX_SECONDS, "1796122360.123");
	expect_number(0.652957931, API_RATE, "0.652958");
	expect_number(12.3456789, API_RATE, "12.3457");
	expect_number(12345678.9, API_RATE, "12345700.0");
	expect_number(NAN, API_SECONDS, "0.0");
	expect_number(INFINITY, API_RATE, "0.0");
	expect_number(0.0, API_RATE, "0.0");
}

Test(json, started_unix_s_keeps_the_milliseconds)
{
	struct fixture_config config = { .no_server = true };
	struct fixture f;
	struct dormant_stats st;
	char *text = NULL;
	json_t *doc, *last;

	fixture_start(&f, &config);
	cr_assert_eq(dormant_transition_json(f.m, "sleep", NULL, &text), 0);
	dormant_json_free(text);
	cr_assert_eq(dormant_stats_get(f.m, &st), 0);
	cr_assert_eq(dormant_stats_json(f.m, false, &text), 0);
	doc = parse(text);
	last = json_object_get(doc, "last_sleep");
	cr_assert(json_is_real(json_object_get(last, "started_unix_s")), "%s", text);
	cr_expect(fabs(json_real_value(json_object_get(last, "started_unix_s")) -
		       st.last_sleep.started_unix_s) <= 0.0005,
		  "started_unix_s %s, the manager's %.6f", text, st.last_sleep.started_unix_s);
	json_decref(doc);
	dormant_json_free(text);
	fixture_stop(&f);
}

static int slow_check_hook(struct dormant *m, enum dormant_hook_point point, void *userdata)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = 60 * 1000 * 1000 };

	while (nanosleep(&ts, &ts) < 0)
		;
	return 0;
}

static json_t *transition_doc(struct fixture *f, const char *action, const char *const *tags)
{
	char *text = NULL;
	json_t *doc;

	cr_assert_eq(dormant_transition_json(f->m, action, tags, &text), 0, "%s",
		     dormant_last_error());
	doc = parse(text);
	dormant_json_free(text);
	return doc;
}

/* A wake that copied nothing says so ("none", not ""); the after-wake hooks
 * (where dormantd checks what came back) have their own part, beside
 * duration_s, which does not hold them. */
Test(json, wake_report_says_no_copy_and_the_after_hooks_part)
{
	struct fixture_config config = { .no_server = true };
	const char *grads[] = { "grads", NULL };
	struct fixture f;
	json_t *doc, *copy;
	double after, duration;

	fixture_start(&f, &config);
	json_decref(transition_doc(&f, "sleep", NULL));
	doc = transition_doc(&f, "wake", grads);
	copy = json_object_get(doc, "wake_copy");
	cr_assert_str_eq(json_string_value(json_object_get(copy, "method")), "none");
	cr_assert_eq(json_integer_value(json_object_get(copy, "bytes_engine")), 0);
	cr_assert(json_is_number(json_object_get(doc, "after_hooks_s")));
	json_decref(doc);

	cr_assert_gt(dormant_hook_add(f.m, DORMANT_HOOK_AFTER_WAKE, slow_check_hook, NULL), 0);
	doc = transition_doc(&f, "wake", NULL);
	copy = json_object_get(doc, "wake_copy");
	cr_assert_str_neq(json_string_value(json_object_get(copy, "method")), "none");
	after = json_number_value(json_object_get(doc, "after_hooks_s"));
	duration = json_number_value(json_object_get(doc, "duration_s"));
	cr_assert_geq(after, 0.06, "after_hooks_s %f (duration_s %f): the hook slept 60 ms", after,
		      duration);
	json_decref(doc);
	cr_assert(weights_intact(&f));

	/* a sleep's report has the part too (no after-sleep hook here) */
	doc = transition_doc(&f, "sleep", NULL);
	cr_assert_null(json_object_get(doc, "wake_copy"));
	cr_assert(json_is_number(json_object_get(doc, "after_hooks_s")));
	json_decref(doc);
	fixture_stop(&f);
}
