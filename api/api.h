/* SPDX-License-Identifier: MIT */
/*
 * The API layer between the HTTP server and the manager: a request comes in
 * as plain data (method, query parameters, body), a response goes out as
 * plain data (status, content type, body, a few headers). Nothing here knows
 * about sockets or libmicrohttpd, so every handler can be tested alone.
 *
 * Handlers never fail: on any error they fill in a problem response (RFC
 * 9457). They are safe to call from several threads at once.
 */
#ifndef DORMANT_API_H
#define DORMANT_API_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dormant-json.h"
#include "dormant.h"

/* Largest request body accepted (413 beyond). */
#define API_BODY_MAX (64 * 1024)
/* Most query parameters looked at (400 beyond). */
#define API_PARAMS_MAX 96
/* Seconds a client is told to wait before retrying a wake that found no
 * device memory. */
#define API_RETRY_AFTER_S 5
/* Room for what a stats_extra or metrics_extra callback writes. */
#define API_STATS_EXTRA_MAX (16 * 1024)
#define API_METRICS_EXTRA_MAX (64 * 1024)

#define API_JSON "application/json"
#define API_PROBLEM_JSON "application/problem+json"
#define API_METRICS_TEXT "text/plain; version=0.0.4; charset=utf-8"

enum api_kind {
	API_SLEEP = 0,
	API_WAKE,
	API_KINDS,
};

/* What the handlers need besides the request; owned by the server. */
struct api_context {
	struct dormant *manager;
	dormant_stats_extra_fn stats_extra;
	void *stats_extra_userdata;
	dormant_metrics_extra_fn metrics_extra;
	void *metrics_extra_userdata;
	/* The fault switch's rules (a test tool) when it is armed, else NULL:
	 * GET /stats shows them ("faults"), /metrics dormant_faults_armed. */
	const char *faults;
};

struct api_param {
	const char *key;
	const char *value; /* NULL for "?key" with no "=" */
};

struct api_request {
	const char *method;       /* "GET" (HEAD is served as GET), "POST" */
	const struct api_param *params;
	size_t param_count;
	const char *content_type; /* NULL: none sent */
	const char *body;         /* not NUL-terminated; NULL when body_size is 0 */
	size_t body_size;
};

struct api_response {
	int status;
	const char *content_type; /* static string */
	char *body;               /* malloc()ed unless body_static; may be NULL */
	size_t body_size;
	bool body_static;
	const char *allow;        /* Allow header (405), static */
	unsigned retry_after_s;   /* Retry-After header when > 0 */
	const char *www_authenticate; /* static */
};

/* Free the body of a response (unless static) and clear it. */
void api_response_finish(struct api_response *resp);

/*
 * JSON numbers without float noise (1.19999982e-7): each double is rounded to
 * what it means, and every document is dumped with API_JSON_REAL, 15
 * significant digits (DBL_DIG), so that it prints as the decimal it was
 * rounded to. NaN and infinities become 0.
 */
#define API_JSON_REAL JSON_REAL_PRECISION(15)
/* The flags every document is dumped with. */
#define JSON_FLAGS_COMPACT (JSON_COMPACT | API_JSON_REAL)
#define JSON_FLAGS_PRETTY (JSON_INDENT(2) | API_JSON_REAL)
enum api_number {
	API_SECONDS = 0, /* a duration: to the nanosecond */
	API_UNIX_SECONDS, /* a time since the epoch: to the millisecond */
	API_RATE,        /* a rate such as copy_gbps: 6 significant digits */
};
json_t *api_number(double value, enum api_number kind);

/* Fill resp with a problem document. slug is one of the types in
 * openapi.yaml ("bad-request", "busy", ...); detail may be NULL. extra, if
 * not NULL, is merged into the document (stolen). */
void api_problem(struct api_response *resp, int status, const char *slug, json_t *extra,
		 const char *detail_fmt, ...) __attribute__((format(printf, 5, 6)));

/* ---- handlers (handlers.c) ----------------------------------------------- */

/* POST /sleep, /wake and their compatible aliases. level_allowed: the
 * route takes vLLM's ?level= (ignored: the tag policies decide). */
void api_handle_transition(struct api_context *ctx, enum api_kind kind, bool level_allowed,
			   const struct api_request *req, struct api_response *resp);
void api_handle_stats(struct api_context *ctx, const struct api_request *req,
		      struct api_response *resp);
void api_handle_healthz(struct api_context *ctx, const struct api_request *req,
			struct api_response *resp);
void api_handle_readyz(struct api_context *ctx, const struct api_request *req,
		       struct api_response *resp);
void api_handle_metrics(struct api_context *ctx, const struct api_request *req,
			struct api_response *resp);

/* Helpers of handlers.c that compat.c shares. api_respond_json steals doc
 * (NULL: out of memory); api_stats_fetch fills resp and returns < 0 on
 * failure, else *ret is malloc()ed; api_respond_transition answers the
 * report (stolen) of a transition that returned r; api_body_object returns
 * the body as a JSON object the caller owns, or NULL with a 400 in resp. */
void api_respond_json(struct api_response *resp, int status, json_t *doc);
void api_respond_out_of_memory(struct api_response *resp);
void api_quote(char *buf, size_t size, const char *s);
bool api_body_blank(const struct api_request *req);
bool api_body_is_json(const struct api_request *req);
json_t *api_body_object(const struct api_request *req, struct api_response *resp);
int api_stats_fetch(struct api_context *ctx, struct dormant_stats **ret,
		    struct api_response *resp);
void api_respond_transition(struct api_context *ctx, enum api_kind kind, int r, json_t *report,
			    struct api_response *resp);

/* ---- vLLM and SGLang (compat.c) ------------------------------------------ */

/* Most tag names one compat request may carry (400 beyond). */
#define API_COMPAT_NAMES_MAX 64

/* vLLM's POST /wake_up and GET /is_sleeping. */
void api_handle_vllm_wake_up(struct api_context *ctx, const struct api_request *req,
			     struct api_response *resp);
void api_handle_is_sleeping(struct api_context *ctx, const struct api_request *req,
			    struct api_response *resp);
/* SGLang's /release_memory_occupation (API_SLEEP), /resume_memory_occupation
 * (API_WAKE) and /flush_cache. */
void api_handle_sglang_occupation(struct api_context *ctx, enum api_kind kind,
				  const struct api_request *req, struct api_response *resp);
void api_handle_flush_cache(struct api_context *ctx, const struct api_request *req,
			    struct api_response *resp);

/* ---- JSON documents (json.c) --------------------------------------------- */

/* "EBUSY" for -EBUSY, ...; "ok" for 0. Never NULL. */
const char *api_result_name(int result);

/* The state of the whole manager: "awake", "asleep", "sleeping", "waking"
 * when every tag is in it (a manager with no tag is awake), else "mixed". */
const char *api_manager_state(const struct dormant_stats *stats);

/* The report document of a transition, its "residue" object (mode, state,
 * action: "checkpoint", "restore" or "none", result, seconds, error) and
 * "state" (of every tag after it: "awake", "asleep" or "mixed") included;
 * NULL when out of memory. */
json_t *api_report_json(enum api_kind kind, const struct dormant_report *rep);

/* The stats document; extra (stolen, may be NULL) becomes its "extra". NULL
 * when out of memory. */
json_t *api_stats_to_json(const struct dormant_stats *stats, json_t *extra);

/* The residue object of the stats document (struct dormant_residue_stats);
 * NULL when out of memory. */
json_t *api_residue_json(const struct dormant_residue_stats *r);

/* ---- transitions (transition.c) ------------------------------------------ */

/* Run a transition and build its report. Returns what dormant_sleep() or
 * dormant_wake() returned; *ret_report is NULL when out of memory. */
int api_transition_run(struct dormant *m, enum api_kind kind, const char *const *tags,
		       enum dormant_residue_mode residue, json_t **ret_report);

/* ---- Prometheus text (metrics.c) ----------------------------------------- */

/* The /metrics body; faults_armed is dormant_faults_armed; extra (may be
 * NULL) is appended as is. Returns 0 or -ENOMEM; *ret_text is malloc()ed. */
int api_metrics_text(const struct dormant_stats *stats,
		     const struct dormant_residue_stats *residue, bool faults_armed,
		     const char *extra, char **ret_text, size_t *ret_size);

#endif
