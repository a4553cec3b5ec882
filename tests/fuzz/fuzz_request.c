/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness: the request path without sockets. The input is a
 * request written as text,
 *
 *   POST /sleep?tags=weights&level=1
 *   Content-Type: application/json
 *   Authorization: Bearer s3cret
 *
 *   {"tags": ["weights"]}
 *
 * decoded as the server does (route, method, token, body limit, query
 * parameters with %XX escapes) and handed to the api/ handlers, with a
 * manager on the host backend behind them. After each input every tag is
 * woken and the weights must hold their pattern: no request may lose data.
 * Every response must be a well-formed answer (a status, a content type, a
 * JSON body that parses, a problem document whose status is the response's).
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "api.h"
#include "auth.h"
#include "dormant.h"
#include "routes.h"

#define TOKEN "s3cret"
#define LINE_MAX_BYTES 8192

static struct dormant *manager;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	manager = fuzz_scene_new();
	return 0;
}

/* A copy of the next line of [*p, end) without its "\r\n"; NULL at the end. */
static char *next_line(const char **p, const char *end)
{
	const char *nl, *stop;
	size_t len;
	char *line;

	if (*p >= end)
		return NULL;
	nl = memchr(*p, '\n', (size_t)(end - *p));
	stop = nl ? nl : end;
	len = (size_t)(stop - *p);
	if (len > 0 && (*p)[len - 1] == '\r')
		len--;
	if (len > LINE_MAX_BYTES)
		len = LINE_MAX_BYTES;
	line = strndup(*p, len); /* a NUL inside cuts it, as in a C string */
	CHECK(line);
	*p = nl ? nl + 1 : end;
	return line;
}

static int hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Decode %XX and '+' in place, as libmicrohttpd does for arguments. */
static void unescape(char *s)
{
	char *out = s;

	for (; *s; s++) {
		if (*s == '%' && hex_value(s[1]) >= 0 && hex_value(s[2]) >= 0) {
			*out++ = (char)(hex_value(s[1]) * 16 + hex_value(s[2]));
			s += 2;
		} else {
			*out++ = *s == '+' ? ' ' : *s;
		}
	}
	*out = '\0';
}

/* Split "a=1&b&c=" into params; false when there are too many. */
static bool query_split(char *query, struct api_param *params, size_t *count)
{
	char *item, *rest = query;

	*count = 0;
	while ((item = strsep(&rest, "&"))) {
		char *eq = strchr(item, '=');

		if (!*item)
			continue;
		if (*count == API_PARAMS_MAX)
			return false;
		if (eq)
			*eq = '\0';
		unescape(item);
		if (eq)
			unescape(eq + 1);
		params[(*count)++] = (struct api_param){ .key = item, .value = eq ? eq + 1 : NULL };
	}
	return true;
}

static void check_response(const struct api_response *resp)
{
	CHECK(resp->status >= 200 && resp->status <= 599);
	CHECK(resp->content_type);
	CHECK(resp->body || resp->body_size == 0);
	if (resp->status == 405)
		CHECK(resp->allow);
	if (strcmp(resp->content_type, API_JSON) == 0 ||
	    strcmp(resp->content_type, API_PROBLEM_JSON) == 0) {
		json_error_t error;
		json_t *doc = json_loadb(resp->body, resp->body_size, 0, &error);

		if (!doc) {
			fprintf(stderr, "fuzz_request: %d body is not JSON (%s): %.*s\n",
				resp->status, error.text, (int)resp->body_size, resp->body);
			abort();
		}
		if (strcmp(resp->content_type, API_PROBLEM_JSON) == 0) {
			const char *type = json_string_value(json_object_get(doc, "type"));

			CHECK(resp->status >= 400);
			CHECK(json_integer_value(json_object_get(doc, "status")) == resp->status);
			CHECK(type && strncmp(type, "urn:dormant:problem:", 20) == 0);
			CHECK(json_is_string(json_object_get(doc, "detail")));
		} else {
			CHECK(resp->status == 200);
		}
		json_decref(doc);
	}
}

/* Nothing but blanks (space, tab, CR, LF): the same as no body. */
static bool blank(const char *body, size_t size)
{
	for (size_t i = 0; i < size; i++)
		if (body[i] != ' ' && body[i] != '\t' && body[i] != '\r' && body[i] != '\n')
			return false;
	return true;
}

/* What the server would answer; the manager acts on it. */
static void serve(const char *method, const char *target, const char *content_type,
		  const char *authorization, const char *body, size_t body_size)
{
	static struct api_context ctx;
	struct api_param params[API_PARAMS_MAX];
	struct api_request req = { 0 };
	struct api_response resp = { 0 };
	const struct route *route;
	char *path = strdup(target), *query;

	CHECK(path);
	query = strchr(path, '?');
	if (query)
		*query++ = '\0';
	ctx.manager = manager;
	route = route_find(path);
	/* with no Authorization header: a server without a token */
	if (authorization && !auth_check(TOKEN, authorization))
		api_problem(&resp, 401, "unauthorized", NULL, "needs a token");
	else if (!route)
		api_problem(&resp, 404, "not-found", NULL, "no such path");
	else if (!route_allows(route, method)) {
		api_problem(&resp, 405, "method-not-allowed", NULL, "no");
		resp.allow = route_allow_header(route);
	} else if (body_size > API_BODY_MAX)
		api_problem(&resp, 413, "payload-too-large", NULL, "too large");
	else if (query && !query_split(query, params, &req.param_count))
		api_problem(&resp, 400, "bad-request", NULL, "too many query parameters");
	else {
		req.method = strcmp(method, "HEAD") == 0 ? "GET" : method;
		req.params = params;
		req.content_type = content_type;
		req.body = body_size ? body : NULL;
		req.body_size = body_size;
		route->handle(&ctx, &req, &resp);
		/* a body that says something must be JSON for a transition to
		 * run (vLLM's /wake_up ignores a body not sent as JSON) */
		if (route->slow && resp.status == 200 && !blank(body, body_size) &&
		    !(strcmp(path, "/wake_up") == 0 && !api_body_is_json(&req))) {
			json_t *doc = json_loadb(body, body_size, 0, NULL);

			CHECK(json_is_object(doc));
			json_decref(doc);
		}
	}
	check_response(&resp);
	api_response_finish(&resp);
	free(path);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
	const char *p = (const char *)data, *end = p + size;
	char *request_line, *line, *content_type = NULL, *authorization = NULL;
	char *method, *target, *space;

	request_line = next_line(&p, end);
	if (!request_line)
		return 0;
	while ((line = next_line(&p, end))) {
		char *colon = strchr(line, ':');
		char **slot = NULL;

		if (!*line) {
			free(line);
			break;
		}
		if (colon) {
			*colon = '\0';
			if (strcasecmp(line, "Content-Type") == 0)
				slot = &content_type;
			else if (strcasecmp(line, "Authorization") == 0)
				slot = &authorization;
		}
		if (slot) {
			free(*slot);
			*slot = strdup(colon + 1 + strspn(colon + 1, " \t"));
			CHECK(*slot);
		}
		free(line);
	}
	method = request_line;
	space = strchr(request_line, ' ');
	target = space ? space + 1 : (char *)"/";
	if (space)
		*space = '\0';
	serve(method, target, content_type, authorization, p, (size_t)(end - p));

	/* Whatever the request did, a wake brings everything back intact. */
	fuzz_scene_check(manager);
	free(request_line);
	free(content_type);
	free(authorization);
	return 0;
}
