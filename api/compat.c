/* SPDX-License-Identifier: MIT */
/*
 * The routes copied from vLLM's and SGLang's servers, answering as those
 * engines do wherever their clients can tell, so that an orchestrator written
 * against them drives a trainer unchanged (docs/http.md, "vLLM and SGLang").
 *
 * What the engines do, read from their sources:
 * - vLLM (vllm-project/vllm, vllm/entrypoints/serve/dev/sleep/api_router.py at
 *   e7a47b821ef4): POST /wake_up takes ?tags= repeated, none meaning every
 *   tag, and reads nothing else of the request; a tag that is not asleep is
 *   skipped with a warning, not refused (vllm/v1/executor/abstract.py,
 *   wake_up()). GET /is_sleeping -> {"is_sleeping": bool}.
 * - SGLang (sgl-project/sglang, python/sglang/srt/entrypoints/http_server.py
 *   at 0025436eab05): /release_memory_occupation and /resume_memory_occupation
 *   answer GET and POST, the body is a ReleaseMemoryOccupationReqInput /
 *   ResumeMemoryOccupationReqInput (managers/io_struct.py: "tags", a list or
 *   null for all, besides BaseReq's "rid" and "http_worker_ipc"), fields it
 *   does not know are ignored, tags it does not handle are skipped, an error
 *   is {"error": {"message": ...}}. slime and miles call GET /flush_cache
 *   before every release and retry until it answers 200
 *   (slime/backends/sglang_utils/sglang_engine.py).
 *
 * The engines' own tag names mean kinds of memory, and map onto a trainer's
 * tags by policy: "weights" names every tag whose content is kept (policy
 * keep, rebuild or disk), "kv_cache" and "cuda_graph" every tag whose content is
 * not (discard). A dormant tag of the same name is included too, so the
 * engines' "wake weights, then kv_cache" sequence wakes every tag. Any other
 * name is a dormant tag; one that is neither is skipped, as the engines do,
 * and listed in the answer's "ignored_tags".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "common.h"

/* The tags a compat request resolved to, in the manager's order. */
struct compat_tags {
	bool given; /* false: every tag */
	bool selected[DORMANT_TAGS_MAX];
	const char *ptrs[DORMANT_TAGS_MAX + 1];
	size_t names; /* names looked at */
	json_t *ignored;
};

static bool name_is(const char *name, size_t len, const char *literal)
{
	return len == strlen(literal) && memcmp(name, literal, len) == 0;
}

/* Resolve one name of the request against the manager's tags. */
static bool compat_add(struct compat_tags *t, const struct dormant_stats *stats, const char *name,
		       size_t len, struct api_response *resp)
{
	bool keep_kind = name_is(name, len, "weights");
	bool scratch_kind = name_is(name, len, "kv_cache") || name_is(name, len, "cuda_graph");
	bool matched = keep_kind || scratch_kind;
	char shown[DORMANT_TAG_MAX + 1];

	if (++t->names > API_COMPAT_NAMES_MAX) {
		api_problem(resp, 400, "bad-request", NULL, "more than %d tag names",
			    API_COMPAT_NAMES_MAX);
		return false;
	}
	t->given = true;
	for (size_t i = 0; i < stats->tag_count; i++) {
		const struct dormant_tag_stats *tag = &stats->tags[i];
		bool kept = tag->policy == DORMANT_KEEP || tag->policy == DORMANT_REBUILD ||
			    tag->policy == DORMANT_DISK;

		if (name_is(name, len, tag->tag) || (keep_kind && kept) ||
		    (scratch_kind && tag->policy == DORMANT_DISCARD)) {
			t->selected[i] = true;
			matched = true;
		}
	}
	if (matched)
		return true;
	/* the name may be anything a client sent: shown cut and cleaned */
	snprintf(shown, sizeof(shown), "%.*s", (int)(len < sizeof(shown) ? len : sizeof(shown) - 1),
		 name);
	api_quote(shown, sizeof(shown), shown);
	if (json_array_append_new(t->ignored, json_string(shown)) < 0) {
		api_respond_out_of_memory(resp);
		return false;
	}
	return true;
}

/* The tags argument of dormant_sleep()/dormant_wake(): NULL for every tag. */
static const char *const *compat_list(struct compat_tags *t, const struct dormant_stats *stats)
{
	size_t n = 0;

	if (!t->given)
		return NULL;
	for (size_t i = 0; i < stats->tag_count; i++)
		if (t->selected[i])
			t->ptrs[n++] = stats->tags[i].tag;
	t->ptrs[n] = NULL; /* no tag at all: a transition that changes nothing */
	return t->ptrs;
}

/*
 * A JSON body with "tags" (an array of strings or null); every other field is
 * ignored, as the engines' request classes do. A blank body says nothing.
 */
static bool compat_body(const struct api_request *req, const struct dormant_stats *stats,
			struct compat_tags *t, struct api_response *resp)
{
	json_t *doc, *tags, *value;
	bool ok = false;
	char shown[64];
	size_t i;

	if (api_body_blank(req))
		return true;
	if (!api_body_is_json(req)) {
		api_quote(shown, sizeof(shown), req->content_type ? req->content_type : "none");
		api_problem(resp, 415, "unsupported-media-type", NULL,
			    "the body must be JSON sent as Content-Type: application/json, not '%s'",
			    shown);
		return false;
	}
	doc = api_body_object(req, resp);
	if (!doc)
		return false;
	tags = json_object_get(doc, "tags");
	if (!tags || json_is_null(tags)) {
		ok = true;
		goto out;
	}
	if (t->given) {
		api_problem(resp, 400, "bad-request", NULL,
			    "tags given both in the query and in the body");
		goto out;
	}
	if (!json_is_array(tags)) {
		api_problem(resp, 400, "bad-request", NULL,
			    "\"tags\" must be an array of strings or null");
		goto out;
	}
	t->given = true; /* also when empty: no tag */
	json_array_foreach(tags, i, value) {
		if (!json_is_string(value)) {
			api_problem(resp, 400, "bad-request", NULL, "\"tags\"[%zu] must be a string",
				    i);
			goto out;
		}
		if (!compat_add(t, stats, json_string_value(value), json_string_length(value), resp))
			goto out;
	}
	ok = true;
out:
	json_decref(doc);
	return ok;
}

/*
 * Add what SGLang's clients read to the answer already in resp (a report or
 * a problem document): "success" and "message" (its newer
 * ReleaseMemoryOccupationReqOutput), and on failure "error": {"message"}
 * (http_server.py, _create_error_response()).
 */
static void sglang_decorate(struct api_response *resp)
{
	int status = resp->status;
	unsigned retry_after_s = resp->retry_after_s;
	const char *content_type = resp->content_type;
	bool ok = status >= 200 && status < 300;
	const char *detail;
	json_t *doc;
	int r;

	doc = resp->body ? json_loadb(resp->body, resp->body_size, 0, NULL) : NULL;
	if (!doc) {
		api_respond_out_of_memory(resp);
		return;
	}
	detail = json_string_value(json_object_get(doc, "detail"));
	if (ok)
		r = json_object_update_new(doc, json_pack("{s:b, s:s}", "success", 1, "message", ""));
	else
		r = json_object_update_new(doc, json_pack("{s:b, s:s, s:{s:s}}", "success", 0,
							  "message", detail ? detail : "failed",
							  "error", "message",
							  detail ? detail : "failed"));
	if (r < 0) {
		json_decref(doc);
		api_respond_out_of_memory(resp);
		return;
	}
	api_respond_json(resp, status, doc);
	resp->content_type = content_type;
	resp->retry_after_s = retry_after_s;
}

enum compat_engine {
	COMPAT_VLLM,
	COMPAT_SGLANG,
};

static void compat_run(struct api_context *ctx, enum api_kind kind, enum compat_engine engine,
		       struct dormant_stats *stats, struct compat_tags *t,
		       struct api_response *resp)
{
	json_t *report;
	int r;

	r = api_transition_run(ctx->manager, kind, compat_list(t, stats), DORMANT_RESIDUE_DEFAULT,
			       &report);
	if (report && json_array_size(t->ignored) > 0)
		json_object_set(report, "ignored_tags", t->ignored);
	api_respond_transition(ctx, kind, r, report, resp);
	if (engine == COMPAT_SGLANG)
		sglang_decorate(resp);
}

void api_handle_vllm_wake_up(struct api_context *ctx, const struct api_request *req,
			     struct api_response *resp)
{
	struct dormant_stats *stats;
	struct compat_tags t = { 0 };

	if (api_stats_fetch(ctx, &stats, resp) < 0)
		return;
	t.ignored = json_array();
	if (!t.ignored) {
		api_respond_out_of_memory(resp);
		goto out;
	}
	/* vLLM reads ?tags= only; every other parameter is ignored */
	for (size_t i = 0; i < req->param_count; i++) {
		const struct api_param *p = &req->params[i];
		const char *value = p->value ? p->value : "";

		if (strcmp(p->key, "tags") == 0 &&
		    !compat_add(&t, stats, value, strlen(value), resp))
			goto out;
	}
	/* vLLM ignores the body; dormant's {"tags": [...]} is still read */
	if (api_body_is_json(req) && !compat_body(req, stats, &t, resp))
		goto out;
	compat_run(ctx, API_WAKE, COMPAT_VLLM, stats, &t, resp);
out:
	json_decref(t.ignored);
	free(stats);
}

void api_handle_is_sleeping(struct api_context *ctx, const struct api_request *req,
			    struct api_response *resp)
{
	struct dormant_stats *stats;

	/* parameters ignored, as by vLLM */
	(void)req;
	if (api_stats_fetch(ctx, &stats, resp) < 0)
		return;
	api_respond_json(resp, 200,
			 json_pack("{s:b}", "is_sleeping",
				   strcmp(api_manager_state(stats), "awake") != 0));
	free(stats);
}

void api_handle_sglang_occupation(struct api_context *ctx, enum api_kind kind,
				  const struct api_request *req, struct api_response *resp)
{
	struct dormant_stats *stats;
	struct compat_tags t = { 0 };

	/* query parameters are ignored, as by SGLang */
	if (api_stats_fetch(ctx, &stats, resp) < 0)
		return;
	t.ignored = json_array();
	if (!t.ignored) {
		api_respond_out_of_memory(resp);
		goto out;
	}
	if (!compat_body(req, stats, &t, resp)) {
		sglang_decorate(resp);
		goto out;
	}
	compat_run(ctx, kind, COMPAT_SGLANG, stats, &t, resp);
out:
	json_decref(t.ignored);
	free(stats);
}

void api_handle_flush_cache(struct api_context *ctx, const struct api_request *req,
			    struct api_response *resp)
{
	/* a trainer holds no request cache: there is nothing to flush, and
	 * nothing to wait for (SGLang answers 400 while requests run) */
	(void)ctx;
	(void)req;
	api_respond_json(resp, 200,
			 json_pack("{s:b, s:s}", "success", 1, "message",
				   "nothing to flush: a dormant trainer keeps no request cache"));
}
