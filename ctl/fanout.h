/* SPDX-License-Identifier: MIT */
/*
 * Send one request to many endpoints at once over the libcurl multi
 * interface: at most `concurrency` in flight, a timeout per attempt, retries
 * with backoff on 503 and on connection errors, responses bounded in size.
 */
#ifndef DORMANTCTL_FANOUT_H
#define DORMANTCTL_FANOUT_H

#include <stdbool.h>

#include "endpoint.h"
#include "outcome.h"

/* Largest response body read; a longer one fails that endpoint. */
#define CTL_RESPONSE_MAX (1024 * 1024)
/* Most requests in flight at once. */
#define CTL_CONCURRENCY_MAX 4096

struct ctl_run_options {
	enum ctl_command command;
	const char *body;         /* JSON request body, or NULL for none */
	const char *token;        /* bearer token, or NULL */
	unsigned concurrency;     /* 1..CTL_CONCURRENCY_MAX */
	long timeout_ms;          /* whole attempt, connection included */
	long connect_timeout_ms;
	struct ctl_retry_policy retry;
	bool keep_responses;      /* store each parsed body in its result */
	bool progress;            /* draw a progress line on stderr */
};

/*
 * Run the command against every endpoint; results[i] (initialised by the
 * caller with ctl_result_init()) receives endpoint i's outcome. Returns the
 * number of endpoints that failed, or a negative errno when the run itself
 * could not start (message in err).
 */
int ctl_run(const struct ctl_endpoints *endpoints, const struct ctl_run_options *o,
	    struct ctl_result *results, char *err, size_t err_size);

#endif
