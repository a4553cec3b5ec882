/* SPDX-License-Identifier: MIT */
/*
 * Every route of the HTTP API, in one table. openapi.yaml describes each of
 * them; the handlers are in api/handlers.c, those of the vLLM and SGLang
 * routes in api/compat.c.
 */
#include "routes.h"

#include <string.h>

#include "common.h"

static void sleep_route(struct api_context *ctx, const struct api_request *req,
			struct api_response *resp)
{
	/* also vLLM's POST /sleep?level=1&mode=abort */
	api_handle_transition(ctx, API_SLEEP, true, req, resp);
}

static void wake_route(struct api_context *ctx, const struct api_request *req,
		       struct api_response *resp)
{
	api_handle_transition(ctx, API_WAKE, false, req, resp);
}

static void release_route(struct api_context *ctx, const struct api_request *req,
			  struct api_response *resp)
{
	api_handle_sglang_occupation(ctx, API_SLEEP, req, resp);
}

static void resume_route(struct api_context *ctx, const struct api_request *req,
			 struct api_response *resp)
{
	api_handle_sglang_occupation(ctx, API_WAKE, req, resp);
}

static void openapi_route(struct api_context *ctx, const struct api_request *req,
			  struct api_response *resp)
{
	if (req->param_count > 0) {
		api_problem(resp, 400, "bad-request", NULL, "GET /openapi.yaml takes no parameter");
		return;
	}
	resp->status = 200;
	resp->content_type = "application/yaml";
	resp->body = (char *)dormant_openapi_yaml;
	resp->body_size = dormant_openapi_yaml_size;
	resp->body_static = true;
}

static const struct route routes[] = {
	/* path, methods, probe, slow, handler */
	{ "/sleep", ROUTE_POST, false, true, sleep_route },
	{ "/wake", ROUTE_POST, false, true, wake_route },
	{ "/stats", ROUTE_GET, false, false, api_handle_stats },
	{ "/healthz", ROUTE_GET, true, false, api_handle_healthz },
	{ "/readyz", ROUTE_GET, true, false, api_handle_readyz },
	{ "/metrics", ROUTE_GET, true, false, api_handle_metrics },
	{ "/openapi.yaml", ROUTE_GET, false, false, openapi_route },
	/* vLLM (api/compat.c) */
	{ "/wake_up", ROUTE_POST, false, true, api_handle_vllm_wake_up },
	{ "/is_sleeping", ROUTE_GET, false, false, api_handle_is_sleeping },
	/* SGLang (api/compat.c): GET too, as SGLang's api_route has it, but no
	 * HEAD, which would change state */
	{ "/release_memory_occupation", ROUTE_GET_NO_HEAD | ROUTE_POST, false, true, release_route },
	{ "/resume_memory_occupation", ROUTE_GET_NO_HEAD | ROUTE_POST, false, true, resume_route },
	{ "/flush_cache", ROUTE_GET | ROUTE_POST, false, false, api_handle_flush_cache },
};

const struct route *route_find(const char *path)
{
	for (size_t i = 0; i < ARRAY_SIZE(routes); i++)
		if (strcmp(routes[i].path, path) == 0)
			return &routes[i];
	return NULL;
}

bool route_allows(const struct route *route, const char *method)
{
	if (strcmp(method, "HEAD") == 0)
		return route->methods & ROUTE_GET;
	if (strcmp(method, "GET") == 0)
		return route->methods & (ROUTE_GET | ROUTE_GET_NO_HEAD);
	if (strcmp(method, "POST") == 0)
		return route->methods & ROUTE_POST;
	return false;
}

const char *route_allow_header(const struct route *route)
{
	if (route->methods & ROUTE_GET)
		return route->methods & ROUTE_POST ? "GET, HEAD, POST" : "GET, HEAD";
	if (route->methods & ROUTE_GET_NO_HEAD)
		return route->methods & ROUTE_POST ? "GET, POST" : "GET";
	return "POST";
}
