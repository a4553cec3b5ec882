/* SPDX-License-Identifier: MIT */
/* Every route, its answers, and bad input. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

static struct fixture f;

static void setup(void)
{
	fixture_start(&f, NULL);
}

static void teardown(void)
{
	fixture_stop(&f);
}

TestSuite(routes, .init = setup, .fini = teardown, .timeout = 60);

static json_t *tag_entry(json_t *tags, const char *name)
{
	size_t i;
	json_t *t;

	json_array_foreach(tags, i, t)
		if (strcmp(json_string_value(json_object_get(t, "tag")), name) == 0)
			return t;
	return NULL;
}

Test(routes, healthz_readyz)
{
	struct http_response r;
	char ct[64];

	http_get(&f, "/healthz", &r);
	cr_assert_eq(r.status, 200);
	cr_assert_str_eq(r.body, "{\"status\":\"ok\"}\n");
	cr_assert(http_header(&r, "Content-Type", ct, sizeof(ct)));
	cr_assert_str_eq(ct, "application/json");
	http_response_free(&r);

	http_get(&f, "/readyz", &r);
	cr_assert_eq(r.status, 200);
	cr_assert_str_eq(r.body, "{\"status\":\"ready\"}\n");
	http_response_free(&r);
}

Test(routes, sleep_and_wake_every_tag)
{
	struct http_response r;
	json_t *doc, *t;

	http_post(&f, "/sleep", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	doc = http_json(&r);
	cr_assert_str_eq(json_string_value(json_object_get(doc, "action")), "sleep");
	cr_assert_str_eq(json_string_value(json_object_get(doc, "result")), "ok");
	cr_assert(json_is_true(json_object_get(doc, "changed")));
	cr_assert_str_eq(json_string_value(json_object_get(doc, "state")), "asleep");
	cr_assert_null(json_object_get(doc, "error"));
	cr_assert_eq(json_integer_value(json_object_get(doc, "bytes_copied")), TEST_TAG_BYTES);
	cr_assert_eq(json_integer_value(json_object_get(doc, "bytes_released")),
		     2 * TEST_TAG_BYTES);
	cr_assert_eq(json_array_size(json_object_get(doc, "tags")), 2);
	t = tag_entry(json_object_get(doc, "tags"), "grads");
	cr_assert(t);
	cr_assert_str_eq(json_string_value(json_object_get(t, "policy")), "discard");
	cr_assert_str_eq(json_string_value(json_object_get(t, "before")), "awake");
	cr_assert_str_eq(json_string_value(json_object_get(t, "after")), "asleep");
	cr_assert_eq(json_integer_value(json_object_get(t, "bytes_copied")), 0);
	json_decref(doc);
	http_response_free(&r);
	cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
	cr_assert_str_eq(tag_state(&f, "grads"), "asleep");

	http_get(&f, "/is_sleeping", &r);
	cr_assert_str_eq(r.body, "{\"is_sleeping\":true}\n");
	http_response_free(&r);

	http_post(&f, "/wake", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	doc = http_json(&r);
	cr_assert_str_eq(json_string_value(json_object_get(doc, "state")), "awake");
	cr_assert_eq(json_integer_value(json_object_get(doc, "bytes_zeroed")), TEST_TAG_BYTES);
	json_decref(doc);
	http_response_free(&r);
	cr_assert(weights_intact(&f));
	cr_assert(grads_zero(&f));

	http_get(&f, "/is_sleeping", &r);
	cr_assert_str_eq(r.body, "{\"is_sleeping\":false}\n");
	http_response_free(&r);
}

/* Bytes marked unused are not copied: the report, /stats and /metrics say
 * how many. */
Test(routes, marked_bytes_are_skipped_and_counted)
{
	struct http_response r;
	json_t *doc, *t;

	cr_assert_eq(dormant_mark_unused(f.m, (char *)f.weights + 4096, 3 << 20), 0, "%s",
		     dormant_last_error());
	http_post(&f, "/sleep", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	doc = http_json(&r);
	cr_assert_eq(json_integer_value(json_object_get(doc, "bytes_skipped")), 3 << 20);
	cr_assert_eq(json_integer_value(json_object_get(doc, "bytes_copied")),
		     TEST_TAG_BYTES - (3 << 20));
	t = tag_entry(json_object_get(doc, "tags"), "weights");
	cr_assert_eq(json_integer_value(json_object_get(t, "bytes_skipped")), 3 << 20);
	t = tag_entry(json_object_get(doc, "tags"), "grads");
	cr_assert_eq(json_integer_value(json_object_get(t, "bytes_skipped")), 0);
	json_decref(doc);
	http_response_free(&r);
	http_get(&f, "/stats", &r);
	doc = http_json(&r);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(doc, "counters"),
							"bytes_skipped_total")),
		     3 << 20);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(doc, "last_sleep"),
							"bytes_skipped")),
		     3 << 20);
	json_decref(doc);
	http_response_free(&r);
	http_get(&f, "/metrics", &r);
	cr_assert(strstr(r.body, "\ndormant_bytes_skipped_total 3145728\n"), "%s", r.body);
	http_response_free(&r);
}

static int failing_rebuild(struct dormant *m, const char *tag, void *userdata)
{
	int *fail = userdata;

	(void)m;
	(void)tag;
	return (*fail)-- > 0 ? -1 : 0;
}

/* A rebuild tag shows its policy; a failing callback fails the wake (409,
 * cancelled) and the retry works. */
Test(routes, rebuild_tags_and_failed_rebuilds)
{
	struct http_response r;
	json_t *doc, *t;
	int fail = 1;
	void *p;

	cr_assert_eq(dormant_set_policy(f.m, "bf16", DORMANT_REBUILD), 0);
	cr_assert_eq(dormant_set_rebuild(f.m, "bf16", failing_rebuild, &fail), 0);
	cr_assert_eq(dormant_alloc(f.m, "bf16", 1 << 20, &p), 0);
	http_get(&f, "/stats", &r);
	doc = http_json(&r);
	t = tag_entry(json_object_get(doc, "tags"), "bf16");
	cr_assert_str_eq(json_string_value(json_object_get(t, "policy")), "rebuild");
	json_decref(doc);
	http_response_free(&r);
	http_post(&f, "/sleep", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_response_free(&r);
	http_post(&f, "/wake", NULL, &r);
	cr_assert_eq(r.status, 409, "%s", r.body);
	cr_assert(strstr(r.body, "cancelled") && strstr(r.body, "bf16"), "%s", r.body);
	http_response_free(&r);
	cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
	http_post(&f, "/wake", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_response_free(&r);
	cr_assert(weights_intact(&f));
}

Test(routes, tags_in_body_and_query)
{
	struct http_response r;
	json_t *doc;

	http_post(&f, "/sleep", "{\"tags\": [\"grads\"]}", &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	doc = http_json(&r);
	cr_assert_str_eq(json_string_value(json_object_get(doc, "state")), "mixed");
	cr_assert_eq(json_array_size(json_object_get(doc, "tags")), 1);
	json_decref(doc);
	http_response_free(&r);
	cr_assert_str_eq(tag_state(&f, "weights"), "awake");
	cr_assert_str_eq(tag_state(&f, "grads"), "asleep");

	http_post(&f, "/sleep?tags=weights&tags=grads", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	doc = http_json(&r);
	cr_assert_str_eq(json_string_value(json_object_get(doc, "state")), "asleep");
	cr_assert_eq(json_array_size(json_object_get(doc, "tags")), 2);
	cr_assert(json_is_true(json_object_get(doc, "changed")));
	json_decref(doc);
	http_response_free(&r);

	/* an empty list names no tag: nothing changes */
	http_post(&f, "/wake", "{\"tags\": []}", &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	doc = http_json(&r);
	cr_assert(json_is_false(json_object_get(doc, "changed")));
	cr_assert_eq(json_array_size(json_object_get(doc, "tags")), 0);
	json_decref(doc);
	http_response_free(&r);

	http_post(&f, "/wake", "{\"tags\": null}", &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_response_free(&r);
	cr_assert_str_eq(tag_state(&f, "weights"), "awake");
	cr_assert_str_eq(tag_state(&f, "grads"), "awake");
	cr_assert(weights_intact(&f));
}

Test(routes, noop_says_nothing_changed)
{
	struct http_response r;
	json_t *doc;

	http_post(&f, "/wake", "{}", &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	doc = http_json(&r);
	cr_assert(json_is_false(json_object_get(doc, "changed")));
	cr_assert_str_eq(json_string_value(json_object_get(doc, "state")), "awake");
	cr_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(doc,
											   "tags"),
									  0),
							   "before")),
			 "awake");
	json_decref(doc);
	http_response_free(&r);
}

/* the vLLM and SGLang routes: test_compat.c */

Test(routes, stats)
{
	struct http_response r;
	json_t *doc, *t, *counters;

	http_post(&f, "/sleep", NULL, &r);
	http_response_free(&r);
	http_post(&f, "/wake", NULL, &r);
	http_response_free(&r);

	http_get(&f, "/stats", &r);
	cr_assert_eq(r.status, 200);
	cr_assert_null(strchr(r.body, ' '), "compact unless asked: %.200s", r.body);
	doc = http_json(&r);
	cr_assert_str_eq(json_string_value(json_object_get(doc, "backend")), "host");
	cr_assert_str_eq(json_string_value(json_object_get(doc, "host_mode")), "release");
	cr_assert(json_is_true(json_object_get(doc, "healthy")));
	cr_assert_str_eq(json_string_value(json_object_get(doc, "state")), "awake");
	cr_assert(json_is_false(json_object_get(doc, "transition_running")));
	cr_assert_null(json_object_get(doc, "extra"));
	t = tag_entry(json_object_get(doc, "tags"), "weights");
	cr_assert(t);
	cr_assert_eq(json_integer_value(json_object_get(t, "bytes")), TEST_TAG_BYTES);
	cr_assert_eq(json_integer_value(json_object_get(t, "sleeps")), 1);
	cr_assert_eq(json_integer_value(json_object_get(t, "wakes")), 1);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(doc, "totals"), "bytes")),
		     2 * TEST_TAG_BYTES);
	cr_assert_eq(json_array_size(json_object_get(doc, "devices")), 1);
	counters = json_object_get(doc, "counters");
	cr_assert_eq(json_integer_value(json_object_get(counters, "sleeps_ok")), 1);
	cr_assert_eq(json_integer_value(json_object_get(counters, "wakes_ok")), 1);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "last_sleep"),
							   "result")),
			 "ok");
	json_decref(doc);
	http_response_free(&r);

	http_get(&f, "/stats?pretty", &r);
	cr_assert_eq(r.status, 200);
	cr_assert(strstr(r.body, "\n  \"backend\": \"host\""), "%.200s", r.body);
	http_response_free(&r);
	http_get(&f, "/stats?pretty=false", &r);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(strchr(r.body, '\n'), r.body + r.size - 1, "not indented: %.200s", r.body);
	http_response_free(&r);
	http_get(&f, "/stats?pretty=maybe", &r);
	assert_problem(&r, 400, "bad-request");
	http_response_free(&r);
}

Test(routes, stats_before_any_transition)
{
	struct http_response r;
	json_t *doc;

	http_get(&f, "/stats", &r);
	doc = http_json(&r);
	cr_assert(json_is_null(json_object_get(doc, "last_sleep")));
	cr_assert(json_is_null(json_object_get(doc, "last_wake")));
	json_decref(doc);
	http_response_free(&r);
}

Test(routes, head_answers_like_get)
{
	struct http_request req = { .method = "HEAD", .path = "/stats" };
	struct http_response r;
	char ct[64];

	http_do(&f, &req, &r);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(r.size, 0);
	cr_assert(http_header(&r, "Content-Type", ct, sizeof(ct)));
	cr_assert_str_eq(ct, "application/json");
	http_response_free(&r);
}

Test(routes, openapi_is_the_file)
{
	struct http_response r;
	char ct[64];
	FILE *file;
	char *expected;
	long size;

	http_get(&f, "/openapi.yaml", &r);
	cr_assert_eq(r.status, 200);
	cr_assert(http_header(&r, "Content-Type", ct, sizeof(ct)));
	cr_assert_str_eq(ct, "application/yaml");
	file = fopen(OPENAPI_PATH, "rb");
	cr_assert(file, "%s", OPENAPI_PATH);
	fseek(file, 0, SEEK_END);
	size = ftell(file);
	rewind(file);
	expected = malloc((size_t)size);
	cr_assert(expected);
	cr_assert_eq(fread(expected, 1, (size_t)size, file), (size_t)size);
	fclose(file);
	cr_assert_eq(r.size, (size_t)size);
	cr_assert(memcmp(r.body, expected, (size_t)size) == 0);
	free(expected);
	http_response_free(&r);
}

Test(routes, unknown_path_and_method)
{
	static const char *const paths[] = { "/", "/sleep/", "/SLEEP", "/stats/x",
					     "/metrics.txt" };
	struct http_request req = { 0 };
	struct http_response r;
	char allow[64];

	for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
		http_get(&f, paths[i], &r);
		assert_problem(&r, 404, "not-found");
		http_response_free(&r);
	}

	http_get(&f, "/sleep", &r);
	assert_problem(&r, 405, "method-not-allowed");
	cr_assert(http_header(&r, "Allow", allow, sizeof(allow)));
	cr_assert_str_eq(allow, "POST");
	http_response_free(&r);

	http_post(&f, "/stats", NULL, &r);
	assert_problem(&r, 405, "method-not-allowed");
	cr_assert(http_header(&r, "Allow", allow, sizeof(allow)));
	cr_assert_str_eq(allow, "GET, HEAD");
	http_response_free(&r);

	req.method = "DELETE";
	req.path = "/wake";
	http_do(&f, &req, &r);
	assert_problem(&r, 405, "method-not-allowed");
	http_response_free(&r);
	req.method = "PUT";
	req.path = "/metrics";
	req.body = "{}";
	http_do(&f, &req, &r);
	assert_problem(&r, 405, "method-not-allowed");
	http_response_free(&r);
	req.method = "OPTIONS";
	req.path = "/healthz";
	req.body = NULL;
	http_do(&f, &req, &r);
	assert_problem(&r, 405, "method-not-allowed");
	http_response_free(&r);
}

Test(routes, unknown_tag)
{
	struct http_response r;
	json_t *doc, *report;

	http_post(&f, "/sleep", "{\"tags\": [\"weights\", \"kv_cache\"]}", &r);
	assert_problem(&r, 404, "unknown-tag");
	doc = http_json(&r);
	cr_assert(strstr(json_string_value(json_object_get(doc, "detail")), "kv_cache"));
	report = json_object_get(doc, "report");
	cr_assert_str_eq(json_string_value(json_object_get(report, "result")), "ENOENT");
	cr_assert(json_is_string(json_object_get(report, "error")));
	json_decref(doc);
	http_response_free(&r);
	/* nothing moved */
	cr_assert_str_eq(tag_state(&f, "weights"), "awake");
}

struct bad_case {
	const char *method, *path, *content_type, *body;
	long status;
	const char *slug;
};

Test(routes, bad_input)
{
	static const struct bad_case cases[] = {
		/* malformed and truncated JSON */
		{ "POST", "/sleep", NULL, "{", 400, "bad-request" },
		{ "POST", "/sleep", NULL, "{\"tags\": [\"weights\"", 400, "bad-request" },
		{ "POST", "/sleep", NULL, "{\"tags\": [\"wei", 400, "bad-request" },
		{ "POST", "/sleep", NULL, "{\"tags\": [\"weights\"]} x", 400, "bad-request" },
		{ "POST", "/sleep", NULL, "{'tags': ['weights']}", 400, "bad-request" },
		{ "POST", "/sleep", NULL, "\xff\xfe{}", 400, "bad-request" },
		{ "POST", "/sleep", NULL, "{\"tags\": [\"a\\u0000b\"]}", 400, "bad-request" },
		{ "POST", "/sleep", NULL, "{\"tags\": [], \"tags\": null}", 400, "bad-request" },
		/* wrong types */
		{ "POST", "/sleep", NULL, "[]", 400, "bad-request" },
		{ "POST", "/sleep", NULL, "\"weights\"", 400, "bad-request" },
		{ "POST", "/sleep", NULL, "null", 400, "bad-request" },
		{ "POST", "/sleep", NULL, "{\"tags\": \"weights\"}", 400, "bad-request" },
		{ "POST", "/sleep", NULL, "{\"tags\": [1]}", 400, "bad-request" },
		{ "POST", "/sleep", NULL, "{\"tags\": [[\"weights\"]]}", 400, "bad-request" },
		{ "POST", "/sleep", NULL, "{\"tags\": {\"weights\": true}}", 400, "bad-request" },
		/* unknown fields and parameters */
		{ "POST", "/sleep", NULL, "{\"tag\": [\"weights\"]}", 400, "bad-request" },
		{ "POST", "/sleep", NULL, "{\"tags\": null, \"level\": 1}", 400, "bad-request" },
		{ "POST", "/sleep?tag=weights", NULL, NULL, 400, "bad-request" },
		{ "POST", "/sleep?tags", NULL, NULL, 400, "bad-request" },
		{ "POST", "/wake?tags=weights", NULL, "{\"tags\": [\"grads\"]}", 400, "bad-request" },
		{ "POST", "/wake?tags=weights", NULL, "{\"tags\": null}", 400, "bad-request" },
		{ "GET", "/healthz?verbose=1", NULL, NULL, 400, "bad-request" },
		{ "GET", "/metrics?name=x", NULL, NULL, 400, "bad-request" },
		{ "GET", "/readyz?x=1", NULL, NULL, 400, "bad-request" },
		{ "GET", "/openapi.yaml?x=1", NULL, NULL, 400, "bad-request" },
		/* bad tag names are the manager's to refuse */
		{ "POST", "/sleep", NULL, "{\"tags\": [\"\"]}", 400, "bad-request" },
		{ "POST", "/sleep", NULL, "{\"tags\": [\"a b\"]}", 400, "bad-request" },
		{ "POST", "/sleep?tags=a/b", NULL, NULL, 400, "bad-request" },
		{ "POST", "/sleep?tags=", NULL, NULL, 400, "bad-request" },
		{ "POST", "/sleep", NULL,
		  "{\"tags\": [\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"]}",
		  400, "bad-request" },
		/* not JSON */
		{ "POST", "/sleep", "text/plain", "{}", 415, "unsupported-media-type" },
		{ "POST", "/sleep", "application/x-www-form-urlencoded", "tags=weights", 415,
		  "unsupported-media-type" },
		{ "POST", "/wake", "application/jsonx", "{}", 415, "unsupported-media-type" },
		{ "POST", "/wake", "json", "{}", 415, "unsupported-media-type" },
	};
	struct http_response r;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct http_request req = {
			.method = cases[i].method,
			.path = cases[i].path,
			.body = cases[i].body,
			.content_type = cases[i].content_type,
		};

		http_do(&f, &req, &r);
		cr_assert_eq(r.curl_error, CURLE_OK);
		cr_expect_eq(r.status, cases[i].status, "case %zu (%s %s %s): %ld %s", i,
			     cases[i].method, cases[i].path, cases[i].body ? cases[i].body : "",
			     r.status, r.body);
		if (r.status == cases[i].status)
			assert_problem(&r, cases[i].status, cases[i].slug);
		http_response_free(&r);
	}
	/* none of it moved anything */
	cr_assert_str_eq(tag_state(&f, "weights"), "awake");
	cr_assert_str_eq(tag_state(&f, "grads"), "awake");
}

Test(routes, json_media_types_accepted)
{
	static const char *const types[] = { "application/json", "application/json; charset=utf-8",
					     "Application/JSON", "application/merge-patch+json" };
	struct http_response r;

	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		struct http_request req = {
			.method = "POST", .path = "/wake", .body = "{}", .content_type = types[i],
		};

		http_do(&f, &req, &r);
		cr_assert_eq(r.status, 200, "%s: %s", types[i], r.body);
		http_response_free(&r);
	}
	/* an empty body needs no type; a blank one neither */
	{
		struct http_request req = { .method = "POST", .path = "/wake",
					    .content_type = "text/plain" };

		http_do(&f, &req, &r);
		cr_assert_eq(r.status, 200, "%s", r.body);
		http_response_free(&r);
		req.body = " \r\n";
		http_do(&f, &req, &r);
		cr_assert_eq(r.status, 200, "%s", r.body);
		http_response_free(&r);
	}
}

Test(routes, too_many_tags)
{
	char body[64 * 8 + 64];
	size_t len;
	struct http_response r;

	len = (size_t)snprintf(body, sizeof(body), "{\"tags\": [");
	for (int i = 0; i < 65; i++)
		len += (size_t)snprintf(body + len, sizeof(body) - len, "%s\"t%d\"", i ? "," : "",
					i);
	snprintf(body + len, sizeof(body) - len, "]}");
	http_post(&f, "/sleep", body, &r);
	assert_problem(&r, 400, "bad-request");
	http_response_free(&r);
}

Test(routes, duplicate_tags_count_once)
{
	struct http_response r;
	json_t *doc;

	http_post(&f, "/sleep?tags=weights&tags=weights", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	doc = http_json(&r);
	cr_assert_eq(json_array_size(json_object_get(doc, "tags")), 1);
	json_decref(doc);
	http_response_free(&r);
}

Test(routes, keep_alive_serves_many)
{
	CURL *handle = curl_easy_init();
	struct http_response r;

	cr_assert(handle);
	for (int i = 0; i < 50; i++) {
		struct http_request req = { .path = i % 2 ? "/healthz" : "/stats",
					    .handle = handle };

		http_do(&f, &req, &r);
		cr_assert_eq(r.status, 200);
		http_response_free(&r);
	}
	curl_easy_cleanup(handle);
}

TestSuite(routes_nomanager_tags, .timeout = 60);

Test(routes_nomanager_tags, empty_manager_is_awake)
{
	struct fixture_config config = { .no_tags = true };
	struct fixture g;
	struct http_response r;
	json_t *doc;

	fixture_start(&g, &config);
	http_get(&g, "/is_sleeping", &r);
	cr_assert_str_eq(r.body, "{\"is_sleeping\":false}\n");
	http_response_free(&r);
	http_post(&g, "/sleep", NULL, &r);
	cr_assert_eq(r.status, 200);
	doc = http_json(&r);
	cr_assert(json_is_false(json_object_get(doc, "changed")));
	cr_assert_str_eq(json_string_value(json_object_get(doc, "state")), "awake");
	json_decref(doc);
	http_response_free(&r);
	fixture_stop(&g);
}

/* Found by fuzz-request: a body of NUL bytes passed for a blank one, so the
 * transition ran on every tag without a JSON body or a Content-Type. */
Test(routes, nul_bytes_are_not_a_blank_body)
{
	static const char nuls[8] = { 0 };
	struct http_request req = { .method = "POST", .path = "/sleep", .body = nuls,
				    .body_size = sizeof(nuls), .content_type = "text/plain" };
	struct http_response r;

	http_do(&f, &req, &r);
	assert_problem(&r, 415, "unsupported-media-type");
	http_response_free(&r);
	req.content_type = NULL; /* application/json */
	http_do(&f, &req, &r);
	assert_problem(&r, 400, "bad-request");
	http_response_free(&r);
	req.body = " \r\n\t";
	req.body_size = 0;
	req.content_type = "text/plain";
	http_do(&f, &req, &r);
	cr_expect_eq(r.status, 200, "%s", r.body);
	http_response_free(&r);
	cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
}
