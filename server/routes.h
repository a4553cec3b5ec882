/* SPDX-License-Identifier: MIT */
/* The HTTP routes: which path answers which methods, with which handler. */
#ifndef DORMANT_SERVER_ROUTES_H
#define DORMANT_SERVER_ROUTES_H

#include <stdbool.h>

#include "api.h"

enum route_methods {
	ROUTE_GET = 1 << 0, /* HEAD too */
	ROUTE_POST = 1 << 1,
	ROUTE_GET_NO_HEAD = 1 << 2, /* GET that changes state: HEAD refused */
};

struct route {
	const char *path;
	unsigned methods;
	/* /healthz, /readyz, /metrics: left open by the open_probes option */
	bool probe;
	/* may take seconds (sleep, wake): runs off the server's threads */
	bool slow;
	void (*handle)(struct api_context *ctx, const struct api_request *req,
		       struct api_response *resp);
};

/* The route of an exact path (no query), or NULL. */
const struct route *route_find(const char *path);

/* Whether the route answers an HTTP method ("HEAD" counts as GET). */
bool route_allows(const struct route *route, const char *method);

/* The Allow header of a route ("GET, HEAD", "POST", "GET, POST", ...). Static. */
const char *route_allow_header(const struct route *route);

/* The contract served at GET /openapi.yaml (generated from openapi.yaml). */
extern const char dormant_openapi_yaml[];
extern const unsigned long dormant_openapi_yaml_size;

#endif
