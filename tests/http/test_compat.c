/* SPDX-License-Identifier: MIT */
/*
 * The vLLM and SGLang routes behave as those engines' servers do wherever
 * their clients can tell. Each test names the upstream file it follows:
 * - vLLM: vllm-project/vllm vllm/entrypoints/serve/dev/sleep/api_router.py at
 *   e7a47b821ef469bb455f75b4129eb365bb6ab9eb (earlier in
 *   vllm/entrypoints/openai/api_server.py), vllm/v1/executor/abstract.py
 *   (wake_up(): a tag not asleep is skipped with a warning);
 * - SGLang: sgl-project/sglang python/sglang/srt/entrypoints/http_server.py at
 *   0025436eab0556737d615b36a4dd3e1e26e82f3d, python/sglang/srt/managers/
 *   io_struct.py at 001067fffe33427bee0ed2f007fb7551a1d76b44;
 * - slime: THUDM/slime slime/backends/sglang_utils/sglang_engine.py at
 *   03b32d8baeb8932ccac1d20151f1474ec07651bb (miles has the same file).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

static struct fixture f;
static void *optimizer;

static void setup(void)
{
	fixture_start(&f, NULL);
	/* a second kept tag, as a trainer has (weights and optimizer state) */
	cr_assert_eq(dormant_alloc(f.m, "optimizer", TEST_TAG_BYTES, &optimizer), 0);
	memset(optimizer, 0x5a, TEST_TAG_BYTES);
}

static void teardown(void)
{
	fixture_stop(&f);
}

TestSuite(compat, .init = setup, .fini = teardown, .timeout = 60);

static bool optimizer_intact(void)
{
	for (size_t i = 0; i < TEST_TAG_BYTES; i++)
		if (((unsigned char *)optimizer)[i] != 0x5a)
			return false;
	return true;
}

static bool is_sleeping(void)
{
	struct http_response r;
	bool sleeping;

	http_get(&f, "/is_sleeping", &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	cr_assert(strcmp(r.body, "{\"is_sleeping\":true}\n") == 0 ||
		  strcmp(r.body, "{\"is_sleeping\":false}\n") == 0, "%s", r.body);
	sleeping = strstr(r.body, "true") != NULL;
	http_response_free(&r);
	return sleeping;
}

static void post_ok(const char *path, const char *body, json_t **ret_doc)
{
	struct http_response r;

	http_post(&f, path, body, &r);
	cr_assert_eq(r.status, 200, "%s: %s", path, r.body);
	if (ret_doc)
		*ret_doc = http_json(&r);
	http_response_free(&r);
}

static void do_ok(const char *method, const char *path, const char *body, json_t **ret_doc)
{
	struct http_request req = { .method = method, .path = path, .body = body };
	struct http_response r;

	http_do(&f, &req, &r);
	cr_assert_eq(r.status, 200, "%s %s: %s", method, path, r.body);
	if (ret_doc)
		*ret_doc = http_json(&r);
	http_response_free(&r);
}

/* vLLM api_router.py sleep(): level defaults to 1 and mode to "abort"; the
 * sleep is done when the answer comes. */
Test(compat, vllm_sleep_level_and_mode)
{
	static const char *const ok[] = { "/sleep", "/sleep?level=1", "/sleep?level=2",
					  "/sleep?level=1&mode=abort", "/sleep?mode=wait",
					  "/sleep?level=2&mode=keep" };
	struct http_response r;

	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		post_ok(ok[i], NULL, NULL);
		cr_assert(is_sleeping(), "%s", ok[i]);
		cr_assert_str_eq(tag_state(&f, "optimizer"), "asleep");
		post_ok("/wake_up", NULL, NULL);
		cr_assert(!is_sleeping());
	}
	/* vLLM's level 0 pauses scheduling and frees nothing: no meaning here */
	http_post(&f, "/sleep?level=0", NULL, &r);
	assert_problem(&r, 400, "bad-request");
	cr_assert(strstr(r.body, "level 0"), "%s", r.body);
	http_response_free(&r);
	http_post(&f, "/sleep?mode=later", NULL, &r);
	assert_problem(&r, 400, "bad-request");
	http_response_free(&r);
	/* dormant's own route keeps its contract: unknown parameters are 400 */
	http_post(&f, "/sleep?offload=1", NULL, &r);
	assert_problem(&r, 400, "bad-request");
	http_response_free(&r);
	cr_assert(!is_sleeping());
}

/* vLLM's RLHF sequence (docs/features/sleep_mode.md, verl's vLLM rollout):
 * sleep, wake_up?tags=weights, then wake_up?tags=kv_cache. vLLM's names map
 * by policy: weights = every kept tag, kv_cache = every discarded one. */
Test(compat, vllm_weights_then_kv_cache)
{
	json_t *doc;

	post_ok("/sleep?level=1", NULL, NULL);
	post_ok("/wake_up?tags=weights", NULL, &doc);
	cr_assert_null(json_object_get(doc, "ignored_tags"));
	json_decref(doc);
	cr_assert_str_eq(tag_state(&f, "weights"), "awake");
	cr_assert_str_eq(tag_state(&f, "optimizer"), "awake");
	cr_assert_str_eq(tag_state(&f, "grads"), "asleep");
	/* executor/abstract.py: is_sleeping until every tag is woken */
	cr_assert(is_sleeping());
	post_ok("/wake_up?tags=kv_cache", NULL, NULL);
	cr_assert_str_eq(tag_state(&f, "grads"), "awake");
	cr_assert(!is_sleeping());
	cr_assert(weights_intact(&f));
	cr_assert(optimizer_intact());
	cr_assert(grads_zero(&f));
}

/* vLLM api_router.py wake_up(): query_params.getlist("tags"), so tags may
 * repeat, and nothing else of the request is read. */
Test(compat, vllm_wake_up_repeated_tags_and_other_parameters)
{
	json_t *doc;

	post_ok("/sleep", NULL, NULL);
	post_ok("/wake_up?tags=optimizer&tags=grads&level=1&x", NULL, &doc);
	cr_assert_eq(json_array_size(json_object_get(doc, "tags")), 2);
	json_decref(doc);
	cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
	cr_assert_str_eq(tag_state(&f, "optimizer"), "awake");
	/* a plain POST wakes every tag */
	post_ok("/wake_up", NULL, NULL);
	cr_assert(!is_sleeping());
	/* a form body is ignored, as vLLM reads none */
	post_ok("/sleep", NULL, NULL);
	{
		struct http_request req = { .method = "POST", .path = "/wake_up",
					    .body = "tags=grads",
					    .content_type = "application/x-www-form-urlencoded" };
		struct http_response r;

		http_do(&f, &req, &r);
		cr_assert_eq(r.status, 200, "%s", r.body);
		http_response_free(&r);
	}
	cr_assert(!is_sleeping());
}

/* executor/abstract.py wake_up(): a tag that is not asleep is skipped with a
 * warning, never an error; dormant lists it in ignored_tags. */
Test(compat, vllm_unknown_tag_skipped)
{
	json_t *doc, *ignored;

	post_ok("/sleep", NULL, NULL);
	post_ok("/wake_up?tags=nope&tags=&tags=a/b", NULL, &doc);
	ignored = json_object_get(doc, "ignored_tags");
	cr_assert_eq(json_array_size(ignored), 3);
	cr_assert_str_eq(json_string_value(json_array_get(ignored, 0)), "nope");
	cr_assert_str_eq(json_string_value(json_array_get(ignored, 1)), "");
	cr_assert(json_is_false(json_object_get(doc, "changed")));
	json_decref(doc);
	cr_assert(is_sleeping());
	/* the known ones of a mixed list still wake */
	post_ok("/wake_up?tags=nope&tags=grads", NULL, NULL);
	cr_assert_str_eq(tag_state(&f, "grads"), "awake");
	cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
}

/* vLLM api_router.py is_sleeping(): {"is_sleeping": bool}, parameters not
 * read. */
Test(compat, vllm_is_sleeping_ignores_parameters)
{
	struct http_response r;

	http_get(&f, "/is_sleeping?x=1&verbose", &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	cr_assert_str_eq(r.body, "{\"is_sleeping\":false}\n");
	http_response_free(&r);
}

/* SGLang http_server.py: @app.api_route(..., methods=["GET", "POST"]); the
 * body a ReleaseMemoryOccupationReqInput (io_struct.py: tags, and BaseReq's
 * rid and http_worker_ipc). */
Test(compat, sglang_get_and_post_with_request_fields)
{
	json_t *doc;

	do_ok("GET", "/release_memory_occupation", NULL, &doc);
	cr_assert(json_is_true(json_object_get(doc, "success")));
	cr_assert_str_eq(json_string_value(json_object_get(doc, "message")), "");
	cr_assert_str_eq(json_string_value(json_object_get(doc, "state")), "asleep");
	json_decref(doc);
	do_ok("GET", "/resume_memory_occupation", "{\"tags\": null}", NULL);
	cr_assert(!is_sleeping());
	post_ok("/release_memory_occupation",
		"{\"tags\": [\"weights\"], \"rid\": \"r-1\", \"http_worker_ipc\": null}", NULL);
	cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
	cr_assert_str_eq(tag_state(&f, "optimizer"), "asleep");
	cr_assert_str_eq(tag_state(&f, "grads"), "awake");
	post_ok("/resume_memory_occupation?unused=1", "{\"tags\": [\"weights\"], \"rid\": null}",
		NULL);
	cr_assert(!is_sleeping());
	cr_assert(weights_intact(&f));
	cr_assert(optimizer_intact());
}

/* slime sglang_engine.py: release_memory_occupation() posts json={} (no
 * tags), resume_memory_occupation(tags) posts {"tags": tags}, and each
 * calls response.raise_for_status() then response.json(); miles resumes
 * weights, then kv_cache (and cuda_graph). */
Test(compat, sglang_slime_sequence)
{
	json_t *doc;

	post_ok("/release_memory_occupation", "{}", &doc);
	cr_assert(json_is_true(json_object_get(doc, "success")));
	json_decref(doc);
	cr_assert_str_eq(tag_state(&f, "grads"), "asleep");
	cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
	post_ok("/resume_memory_occupation", "{\"tags\": [\"weights\"]}", NULL);
	cr_assert(is_sleeping());
	post_ok("/resume_memory_occupation", "{\"tags\": [\"kv_cache\", \"cuda_graph\"]}", &doc);
	cr_assert_null(json_object_get(doc, "ignored_tags"));
	json_decref(doc);
	cr_assert(!is_sleeping());
	cr_assert(weights_intact(&f));
	cr_assert(grads_zero(&f));
	/* the same tags again: a no-op that succeeds */
	post_ok("/resume_memory_occupation", "{\"tags\": [\"cuda_graph\"]}", &doc);
	cr_assert(json_is_false(json_object_get(doc, "changed")));
	json_decref(doc);
}

/* slime sglang_engine.py flush_cache(): GET /flush_cache before every
 * release, retried until 200. */
Test(compat, sglang_flush_cache)
{
	json_t *doc;

	do_ok("GET", "/flush_cache", NULL, &doc);
	cr_assert(json_is_true(json_object_get(doc, "success")));
	json_decref(doc);
	do_ok("POST", "/flush_cache", NULL, NULL);
	cr_assert(!is_sleeping());
}

/* SGLang http_server.py _create_error_response(): {"error": {"message"}}; a
 * body of the wrong shape fails validation with 400. dormant adds those
 * members to its problem document and keeps its status. */
Test(compat, sglang_errors)
{
	struct http_response r;
	json_t *doc;

	http_post(&f, "/release_memory_occupation", "{\"tags\": \"weights\"}", &r);
	assert_problem(&r, 400, "bad-request");
	doc = http_json(&r);
	cr_assert(json_is_false(json_object_get(doc, "success")));
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "error"),
							   "message")),
			 json_string_value(json_object_get(doc, "detail")));
	json_decref(doc);
	http_response_free(&r);
	http_post(&f, "/resume_memory_occupation", "[\"weights\"]", &r);
	assert_problem(&r, 400, "bad-request");
	http_response_free(&r);
	http_post(&f, "/resume_memory_occupation", "{\"tags\": [1]}", &r);
	assert_problem(&r, 400, "bad-request");
	http_response_free(&r);
	http_post(&f, "/release_memory_occupation", "{\"tags\": [", &r);
	assert_problem(&r, 400, "bad-request");
	http_response_free(&r);
	/* HEAD would change state: refused */
	{
		struct http_request req = { .method = "HEAD", .path = "/release_memory_occupation" };
		char allow[64];

		http_do(&f, &req, &r);
		cr_assert_eq(r.status, 405);
		cr_assert(http_header(&r, "Allow", allow, sizeof(allow)));
		cr_assert_str_eq(allow, "GET, POST");
		http_response_free(&r);
	}
	cr_assert(!is_sleeping());
}

/* A failed wake: dormant's status and Retry-After, SGLang's members. */
Test(compat, sglang_failed_wake_keeps_status)
{
	struct http_response r;
	char retry[16];
	json_t *doc;

	post_ok("/release_memory_occupation", NULL, NULL);
	cr_assert_eq(dormant_debug_inject_fault(f.m, DORMANT_FAULT_CREATE, 1, -ENOMEM, false), 0);
	http_post(&f, "/resume_memory_occupation", "{\"tags\": null}", &r);
	assert_problem(&r, 503, "out-of-memory");
	cr_assert(http_header(&r, "Retry-After", retry, sizeof(retry)));
	doc = http_json(&r);
	cr_assert(json_is_false(json_object_get(doc, "success")));
	cr_assert(json_is_string(json_object_get(json_object_get(doc, "error"), "message")));
	cr_assert(json_is_object(json_object_get(doc, "report")));
	json_decref(doc);
	http_response_free(&r);
	post_ok("/resume_memory_occupation", "{\"tags\": null}", NULL);
	cr_assert(weights_intact(&f));
}

/* Bounded: at most API_COMPAT_NAMES_MAX names. */
Test(compat, too_many_names)
{
	char body[8192] = "{\"tags\": [";
	struct http_response r;

	for (int i = 0; i < 65; i++)
		strcat(body, i ? ", \"n\"" : "\"n\"");
	strcat(body, "]}");
	http_post(&f, "/resume_memory_occupation", body, &r);
	assert_problem(&r, 400, "bad-request");
	http_response_free(&r);
}
