/* SPDX-License-Identifier: MIT */
/*
 * The endpoint handlers: turn a request into manager calls and the result
 * into a response. Errors become RFC 9457 problem documents; the slugs and
 * statuses are listed in openapi.yaml (components/responses).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api.h"
#include "common.h"

#define PROBLEM_TYPE_PREFIX "urn:dormant:problem:"

/* The document sent when not even a problem document can be built. */
static const char out_of_memory_problem[] =
	"{\"type\":\"" PROBLEM_TYPE_PREFIX "internal\",\"title\":\"Internal error\","
	"\"status\":500,\"detail\":\"out of host memory\"}\n";

void api_response_finish(struct api_response *resp)
{
	if (!resp->body_static)
		free(resp->body);
	resp->body = NULL;
	resp->body_size = 0;
	resp->body_static = false;
}

static void respond_static(struct api_response *resp, int status, const char *content_type,
			   const char *body, size_t size)
{
	api_response_finish(resp);
	resp->status = status;
	resp->content_type = content_type;
	resp->body = (char *)body;
	resp->body_size = size;
	resp->body_static = true;
}

static void respond_out_of_memory(struct api_response *resp)
{
	respond_static(resp, 500, API_PROBLEM_JSON, out_of_memory_problem,
		       sizeof(out_of_memory_problem) - 1);
	resp->allow = NULL;
	resp->retry_after_s = 0;
	resp->www_authenticate = NULL;
}

/* Serialize doc (stolen) as the body, with a final newline for terminals. */
static void respond_json(struct api_response *resp, int status, const char *content_type,
			 json_t *doc, bool pretty)
{
	char *text;
	size_t len;

	if (!doc) {
		respond_out_of_memory(resp);
		return;
	}
	text = json_dumps(doc, (pretty ? JSON_INDENT(2) : JSON_COMPACT) | API_JSON_REAL);
	json_decref(doc);
	if (!text) {
		respond_out_of_memory(resp);
		return;
	}
	len = strlen(text);
	/* json_dumps allocates with malloc() unless the embedder changed
	 * jansson's allocator, which the API does not support */
	char *grown = realloc(text, len + 2);
	if (!grown) {
		free(text);
		respond_out_of_memory(resp);
		return;
	}
	grown[len] = '\n';
	grown[len + 1] = '\0';
	api_response_finish(resp);
	resp->status = status;
	resp->content_type = content_type;
	resp->body = grown;
	resp->body_size = len + 1;
}

static const char *problem_title(const char *slug)
{
	static const struct {
		const char *slug, *title;
	} titles[] = {
		{ "bad-request", "Bad request" },
		{ "unauthorized", "Unauthorized" },
		{ "not-found", "Not found" },
		{ "unknown-tag", "Unknown tag" },
		{ "method-not-allowed", "Method not allowed" },
		{ "payload-too-large", "Payload too large" },
		{ "unsupported-media-type", "Unsupported media type" },
		{ "busy", "Busy" },
		{ "cancelled", "Cancelled by a hook" },
		{ "out-of-memory", "Out of memory" },
		{ "restore-failed", "Restore failed" },
		{ "not-ready", "Not ready" },
		{ "overloaded", "Overloaded" },
		{ "device-error", "Device error" },
		{ "internal", "Internal error" },
	};

	for (size_t i = 0; i < ARRAY_SIZE(titles); i++)
		if (strcmp(titles[i].slug, slug) == 0)
			return titles[i].title;
	return "Error";
}

void api_problem(struct api_response *resp, int status, const char *slug, json_t *extra,
		 const char *detail_fmt, ...)
{
	char type[96], detail[512];
	json_t *doc;
	va_list ap;

	snprintf(type, sizeof(type), PROBLEM_TYPE_PREFIX "%s", slug);
	detail[0] = '\0';
	if (detail_fmt) {
		va_start(ap, detail_fmt);
		vsnprintf(detail, sizeof(detail), detail_fmt, ap);
		va_end(ap);
	}
	/* the detail may quote client input or a message cut short */
	for (char *p = detail; *p; p++)
		if ((unsigned char)*p >= 0x80)
			*p = '?';
	doc = json_pack("{s:s, s:s, s:i, s:s}", "type", type, "title", problem_title(slug),
			"status", status, "detail", detail[0] ? detail : problem_title(slug));
	if (doc && extra && json_object_update(doc, extra) < 0) {
		json_decref(doc);
		doc = NULL;
	}
	json_decref(extra);
	respond_json(resp, status, API_PROBLEM_JSON, doc, false);
}

/* ---- request helpers ----------------------------------------------------- */

/* Whether a Content-Type names JSON: application/json or application/...+json,
 * parameters (charset) allowed. */
static bool is_json_media_type(const char *content_type)
{
	const char *end, *slash;
	size_t len;

	if (!content_type)
		return false;
	content_type += strspn(content_type, " \t");
	end = content_type + strcspn(content_type, ";");
	while (end > content_type && (end[-1] == ' ' || end[-1] == '\t'))
		end--;
	len = (size_t)(end - content_type);
	if (len == strlen("application/json") &&
	    strncasecmp(content_type, "application/json", len) == 0)
		return true;
	slash = memchr(content_type, '/', len);
	return len > strlen("application/+json") &&
	       strncasecmp(content_type, "application/", strlen("application/")) == 0 && slash &&
	       strncasecmp(end - strlen("+json"), "+json", strlen("+json")) == 0;
}

static bool body_is_blank(const struct api_request *req)
{
	/* not strchr(): it finds a NUL byte too, and a body of NULs is no
	 * blank (found by fuzz-request) */
	for (size_t i = 0; i < req->body_size; i++)
		if (!memchr(" \t\r\n", req->body[i], 4))
			return false;
	return true;
}

/* Printable form of a client string for a message: cut, no control bytes. */
static void quote(char *buf, size_t size, const char *s)
{
	size_t i = 0;

	for (; s && s[i] && i + 1 < size; i++)
		buf[i] = (unsigned char)s[i] >= 0x20 && (unsigned char)s[i] < 0x7f ? s[i] : '?';
	buf[i] = '\0';
}

/* Any query parameter is an error on a route that takes none. */
static bool reject_params(const struct api_request *req, struct api_response *resp)
{
	char key[64];

	if (req->param_count == 0)
		return false;
	quote(key, sizeof(key), req->params[0].key);
	api_problem(resp, 400, "bad-request", NULL, "unknown query parameter '%s'", key);
	return true;
}

/* ---- transitions --------------------------------------------------------- */

struct tag_list {
	bool given;   /* false: every tag */
	size_t count;
	char names[DORMANT_TAGS_MAX][DORMANT_TAG_MAX + 1];
	const char *ptrs[DORMANT_TAGS_MAX + 1];
};

static bool tag_list_add(struct tag_list *list, const char *name, size_t len,
			 struct api_response *resp)
{
	char shown[DORMANT_TAG_MAX + 1];

	if (list->count == DORMANT_TAGS_MAX) {
		api_problem(resp, 400, "bad-request", NULL, "more than %d tags", DORMANT_TAGS_MAX);
		return false;
	}
	if (len > DORMANT_TAG_MAX || memchr(name, '\0', len)) {
		quote(shown, sizeof(shown), name);
		api_problem(resp, 400, "bad-request", NULL,
			    "tag '%s...' is not 1 to %d characters of [A-Za-z0-9_.:-]", shown,
			    DORMANT_TAG_MAX);
		return false;
	}
	/* the name's characters are checked by the manager: a bad one is
	 * -EINVAL, hence 400 */
	memcpy(list->names[list->count], name, len);
	list->names[list->count][len] = '\0';
	list->ptrs[list->count] = list->names[list->count];
	list->count++;
	list->ptrs[list->count] = NULL;
	list->given = true;
	return true;
}

/*
 * vLLM's ?mode= of POST /sleep: what happens to requests in flight (abort,
 * wait, keep). A trainer has none: its training step is waited for through
 * the guard whatever the mode, so each is accepted and changes nothing.
 */
static bool vllm_mode_valid(const char *mode, struct api_response *resp)
{
	static const char *const modes[] = { "abort", "wait", "keep" };

	for (size_t i = 0; mode && i < ARRAY_SIZE(modes); i++)
		if (strcmp(mode, modes[i]) == 0)
			return true;
	api_problem(resp, 400, "bad-request", NULL,
		    "query parameter 'mode' must be abort, wait or keep");
	return false;
}

static bool parse_query(const struct api_request *req, bool level_allowed, struct tag_list *list,
			struct api_response *resp)
{
	char shown[64];

	for (size_t i = 0; i < req->param_count; i++) {
		const struct api_param *p = &req->params[i];

		if (strcmp(p->key, "tags") == 0) {
			if (!p->value) {
				api_problem(resp, 400, "bad-request", NULL,
					    "query parameter 'tags' needs a value (?tags=NAME)");
				return false;
			}
			if (!tag_list_add(list, p->value, strlen(p->value), resp))
				return false;
		} else if (level_allowed && strcmp(p->key, "level") == 0) {
			/* vLLM's sleep level: here the tag policies decide */
			if (!p->value || (strcmp(p->value, "1") != 0 && strcmp(p->value, "2") != 0)) {
				api_problem(resp, 400, "bad-request", NULL,
					    "query parameter 'level' must be 1 or 2 (vLLM's level 0, "
					    "a pause that frees no memory, has no meaning here)");
				return false;
			}
		} else if (level_allowed && strcmp(p->key, "mode") == 0) {
			if (!vllm_mode_valid(p->value, resp))
				return false;
		} else {
			quote(shown, sizeof(shown), p->key);
			api_problem(resp, 400, "bad-request", NULL, "unknown query parameter '%s'",
				    shown);
			return false;
		}
	}
	return true;
}

/* The body as a JSON object (the caller owns it), or NULL with a 400 in resp:
 * malformed JSON, or JSON that is not an object. */
static json_t *body_object(const struct api_request *req, struct api_response *resp)
{
	json_error_t error;
	json_t *doc;

	doc = json_loadb(req->body, req->body_size, JSON_REJECT_DUPLICATES, &error);
	if (!doc) {
		api_problem(resp, 400, "bad-request", NULL, "malformed JSON at byte %d: %s",
			    error.position, error.text);
		return NULL;
	}
	if (!json_is_object(doc)) {
		api_problem(resp, 400, "bad-request", NULL,
			    "the body must be a JSON object such as {\"tags\": [\"weights\"]}");
		json_decref(doc);
		return NULL;
	}
	return doc;
}

/* The body's "residue" (a sleep's only): "keep" or "checkpoint" for this
 * sleep, null or absent for the manager's option. */
static bool parse_residue(json_t *value, enum dormant_residue_mode *ret,
			  struct api_response *resp)
{
	enum dormant_residue_mode mode;

	if (json_is_null(value))
		return true;
	if (!json_is_string(value) || strcmp(json_string_value(value), "default") == 0 ||
	    dormant_residue_mode_from_name(json_string_value(value), &mode) < 0) {
		api_problem(resp, 400, "bad-request", NULL,
			    "\"residue\" must be \"keep\", \"checkpoint\" or null");
		return false;
	}
	*ret = mode;
	return true;
}

static bool parse_body(const struct api_request *req, bool residue_allowed,
		       struct tag_list *list, enum dormant_residue_mode *residue,
		       struct api_response *resp)
{
	json_t *doc, *tags, *value;
	const char *key;
	bool ok = false;
	size_t i;

	doc = body_object(req, resp);
	if (!doc)
		return false;
	json_object_foreach(doc, key, value) {
		char shown[64];

		if (strcmp(key, "tags") == 0)
			continue;
		if (residue_allowed && strcmp(key, "residue") == 0) {
			if (!parse_residue(value, residue, resp))
				goto out;
			continue;
		}
		quote(shown, sizeof(shown), key);
		api_problem(resp, 400, "bad-request", NULL,
			    "unknown field '%s' (the body has only \"tags\"%s)", shown,
			    residue_allowed ? " and \"residue\"" : "");
		goto out;
	}
	tags = json_object_get(doc, "tags");
	if (tags && list->given) {
		api_problem(resp, 400, "bad-request", NULL,
			    "tags given both in the query and in the body");
		goto out;
	}
	if (!tags || json_is_null(tags)) {
		ok = true; /* every tag */
		goto out;
	}
	if (!json_is_array(tags)) {
		api_problem(resp, 400, "bad-request", NULL,
			    "\"tags\" must be an array of strings or null");
		goto out;
	}
	json_array_foreach(tags, i, value) {
		if (!json_is_string(value)) {
			api_problem(resp, 400, "bad-request", NULL, "\"tags\"[%zu] must be a string",
				    i);
			goto out;
		}
		if (!tag_list_add(list, json_string_value(value), json_string_length(value), resp))
			goto out;
	}
	/* an empty array names no tag: a transition that changes nothing */
	list->given = true;
	ok = true;
out:
	json_decref(doc);
	return ok;
}

/* Whether a wake's report says its residue restore failed (the room check's
 * -ENOMEM aside, which is out-of-memory). */
static bool residue_restore_failed(json_t *report)
{
	json_t *residue = json_object_get(report, "residue");
	const char *action = json_string_value(json_object_get(residue, "action"));
	const char *result = json_string_value(json_object_get(residue, "result"));

	return action && result && strcmp(action, "restore") == 0 && strcmp(result, "ok") != 0;
}

static void respond_transition(struct api_context *ctx, enum api_kind kind, int r,
			       json_t *report, struct api_response *resp)
{
	char detail[DORMANT_ERROR_MAX];
	const char *error;
	json_t *extra;

	if (!report) {
		respond_out_of_memory(resp);
		return;
	}
	if (r == 0) {
		respond_json(resp, 200, API_JSON, report, false);
		return;
	}
	error = json_string_value(json_object_get(report, "error"));
	snprintf(detail, sizeof(detail), "%s", error ? error : "failed");
	extra = json_pack("{s:o}", "report", report);
	switch (r) {
	case -EBUSY:
		api_problem(resp, 409, "busy", extra, "%s", detail);
		break;
	case -ENOENT:
		api_problem(resp, 404, "unknown-tag", extra, "%s", detail);
		break;
	case -EINVAL:
		api_problem(resp, 400, "bad-request", extra, "%s", detail);
		break;
	case -ECANCELED:
		api_problem(resp, 409, "cancelled", extra, "%s", detail);
		break;
	case -ENOMEM:
		/* the memory is taken (by a rollout engine, typically): nothing
		 * was lost, the same request can be retried */
		api_problem(resp, 503, "out-of-memory", extra, "%s", detail);
		resp->retry_after_s = API_RETRY_AFTER_S;
		break;
	default:
		/* a residue restore that failed: the tags are asleep with their
		 * host copies, the next wake tries it again; one that ran out of
		 * memory (-EPERM, "stuck") is refused for good: device-error */
		if (r != -EPERM && residue_restore_failed(report)) {
			api_problem(resp, 503, "restore-failed", extra, "%s", detail);
			resp->retry_after_s = API_RETRY_AFTER_S;
			break;
		}
		api_problem(resp, 500, "device-error", extra, "%s", detail);
		break;
	}
}

void api_handle_transition(struct api_context *ctx, enum api_kind kind, bool level_allowed,
			   const struct api_request *req, struct api_response *resp)
{
	enum dormant_residue_mode residue = DORMANT_RESIDUE_DEFAULT;
	struct tag_list *list;
	json_t *report;
	int r;

	list = calloc(1, sizeof(*list));
	if (!list) {
		respond_out_of_memory(resp);
		return;
	}
	if (!parse_query(req, level_allowed, list, resp))
		goto out;
	/* an empty or blank body says nothing: no type needed */
	if (!body_is_blank(req) && !is_json_media_type(req->content_type)) {
		char shown[64];

		quote(shown, sizeof(shown), req->content_type ? req->content_type : "none");
		api_problem(resp, 415, "unsupported-media-type", NULL,
			    "the body must be JSON sent as Content-Type: application/json, not '%s'",
			    shown);
		goto out;
	}
	if (!body_is_blank(req) && !parse_body(req, kind == API_SLEEP, list, &residue, resp))
		goto out;
	r = api_transition_run(ctx->manager, kind, list->given ? list->ptrs : NULL, residue,
			       &report);
	respond_transition(ctx, kind, r, report, resp);
out:
	free(list);
}

/* ---- reads --------------------------------------------------------------- */

static int stats_fetch(struct api_context *ctx, struct dormant_stats **ret,
		       struct api_response *resp)
{
	struct dormant_stats *stats = malloc(sizeof(*stats));
	int r;

	if (!stats) {
		respond_out_of_memory(resp);
		return -ENOMEM;
	}
	r = dormant_stats_get(ctx->manager, stats);
	if (r < 0) {
		api_problem(resp, 500, "internal", NULL, "%s", dormant_last_error());
		free(stats);
		return r;
	}
	*ret = stats;
	return 0;
}

/* The embedder's "extra" object, or NULL if it has none or it is not one. */
static json_t *stats_extra(struct api_context *ctx)
{
	json_t *extra = NULL;
	char *buf;
	int len;

	if (!ctx->stats_extra)
		return NULL;
	buf = malloc(API_STATS_EXTRA_MAX);
	if (!buf)
		return NULL;
	len = ctx->stats_extra(ctx->stats_extra_userdata, buf, API_STATS_EXTRA_MAX);
	if (len >= 0 && len < API_STATS_EXTRA_MAX)
		extra = json_loadb(buf, (size_t)len, JSON_REJECT_DUPLICATES, NULL);
	free(buf);
	if (extra && !json_is_object(extra)) {
		json_decref(extra);
		extra = NULL;
	}
	return extra;
}

void api_handle_stats(struct api_context *ctx, const struct api_request *req,
		      struct api_response *resp)
{
	struct dormant_stats *stats;
	bool pretty = false;
	char shown[64];
	json_t *doc;

	for (size_t i = 0; i < req->param_count; i++) {
		const struct api_param *p = &req->params[i];

		if (strcmp(p->key, "pretty") != 0) {
			quote(shown, sizeof(shown), p->key);
			api_problem(resp, 400, "bad-request", NULL, "unknown query parameter '%s'",
				    shown);
			return;
		}
		if (!p->value || !*p->value || strcmp(p->value, "1") == 0 ||
		    strcmp(p->value, "true") == 0) {
			pretty = true;
		} else if (strcmp(p->value, "0") == 0 || strcmp(p->value, "false") == 0) {
			pretty = false;
		} else {
			api_problem(resp, 400, "bad-request", NULL,
				    "query parameter 'pretty' takes no value, or 1, true, 0, false");
			return;
		}
	}
	if (stats_fetch(ctx, &stats, resp) < 0)
		return;
	doc = api_stats_to_json(stats, stats_extra(ctx));
	if (doc) {
		struct dormant_residue_stats residue;

		dormant_residue_stats_get(ctx->manager, &residue);
		if (json_object_set_new(doc, "residue", api_residue_json(&residue)) < 0) {
			json_decref(doc);
			doc = NULL;
		}
	}
	/* whether sleeps and wakes may fail on purpose: never hidden */
	if (doc && json_object_set_new(doc, "faults",
				       json_pack("{s:b, s:s?}", "armed", ctx->faults != NULL,
						 "rules", ctx->faults)) < 0) {
		json_decref(doc);
		doc = NULL;
	}
	respond_json(resp, 200, API_JSON, doc, pretty);
	free(stats);
}

void api_handle_healthz(struct api_context *ctx, const struct api_request *req,
			struct api_response *resp)
{
	static const char body[] = "{\"status\":\"ok\"}\n";

	if (reject_params(req, resp))
		return;
	/* liveness: answering is the proof; never touches the manager, so it
	 * stays fast during a long transition */
	respond_static(resp, 200, API_JSON, body, sizeof(body) - 1);
}

void api_handle_readyz(struct api_context *ctx, const struct api_request *req,
		       struct api_response *resp)
{
	static const char body[] = "{\"status\":\"ready\"}\n";
	struct dormant_stats *stats;

	if (reject_params(req, resp) || stats_fetch(ctx, &stats, resp) < 0)
		return;
	if (stats->healthy)
		respond_static(resp, 200, API_JSON, body, sizeof(body) - 1);
	else
		api_problem(resp, 503, "not-ready", NULL, "%s",
			    stats->health_error[0] ? stats->health_error : "the manager has failed");
	free(stats);
}

void api_handle_metrics(struct api_context *ctx, const struct api_request *req,
			struct api_response *resp)
{
	struct dormant_stats *stats;
	char *extra = NULL, *text;
	size_t size;
	int r;

	if (reject_params(req, resp) || stats_fetch(ctx, &stats, resp) < 0)
		return;
	if (ctx->metrics_extra) {
		extra = malloc(API_METRICS_EXTRA_MAX);
		if (extra) {
			int len = ctx->metrics_extra(ctx->metrics_extra_userdata, extra,
						     API_METRICS_EXTRA_MAX);

			if (len >= 0 && len < API_METRICS_EXTRA_MAX) {
				extra[len] = '\0';
			} else {
				free(extra);
				extra = NULL;
			}
		}
	}
	{
		struct dormant_residue_stats residue;

		dormant_residue_stats_get(ctx->manager, &residue);
		r = api_metrics_text(stats, &residue, ctx->faults != NULL, extra, &text, &size);
	}
	free(extra);
	free(stats);
	if (r < 0) {
		respond_out_of_memory(resp);
		return;
	}
	api_response_finish(resp);
	resp->status = 200;
	resp->content_type = API_METRICS_TEXT;
	resp->body = text;
	resp->body_size = size;
}

/* ---- shared with compat.c ------------------------------------------------ */

void api_respond_json(struct api_response *resp, int status, json_t *doc)
{
	respond_json(resp, status, API_JSON, doc, false);
}

void api_respond_out_of_memory(struct api_response *resp)
{
	respond_out_of_memory(resp);
}

void api_quote(char *buf, size_t size, const char *s)
{
	quote(buf, size, s);
}

bool api_body_blank(const struct api_request *req)
{
	return body_is_blank(req);
}

bool api_body_is_json(const struct api_request *req)
{
	return is_json_media_type(req->content_type);
}

json_t *api_body_object(const struct api_request *req, struct api_response *resp)
{
	return body_object(req, resp);
}

int api_stats_fetch(struct api_context *ctx, struct dormant_stats **ret,
		    struct api_response *resp)
{
	return stats_fetch(ctx, ret, resp);
}

void api_respond_transition(struct api_context *ctx, enum api_kind kind, int r, json_t *report,
			    struct api_response *resp)
{
	respond_transition(ctx, kind, r, report, resp);
}
