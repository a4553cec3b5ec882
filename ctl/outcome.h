/* SPDX-License-Identifier: MIT */
/*
 * What dormantctl makes of one endpoint's answer: the commands and their
 * routes, the reading of a response (state, bytes, duration, error), and the
 * retry policy (which failures are retried, and after how long). No I/O here,
 * so all of it is tested without a network.
 */
#ifndef DORMANTCTL_OUTCOME_H
#define DORMANTCTL_OUTCOME_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "endpoint.h"

enum ctl_command {
	CTL_SLEEP = 0,
	CTL_WAKE,
	CTL_STATS,
	CTL_HEALTH,
	CTL_READY,
};

struct ctl_command_info {
	enum ctl_command command;
	const char *name;   /* "sleep" */
	const char *method; /* "POST" */
	const char *path;   /* "/sleep" */
	bool transition;    /* takes --tags */
};

/* The command named name, or NULL. */
const struct ctl_command_info *ctl_command_find(const char *name);
const struct ctl_command_info *ctl_command_info(enum ctl_command command);

/* The outcome for one endpoint. Embedded in the caller's memory:
 * ctl_result_finish() frees the response it may hold. */
struct ctl_result {
	bool ok;
	long http_status;        /* 0: no HTTP answer */
	unsigned attempts;
	char state[32];          /* "asleep", "ok", ...; "" unknown */
	int changed;             /* -1 unknown, else 0 or 1 */
	int64_t bytes;           /* -1 unknown; see ctl_result_from_response() */
	int64_t host_bytes;      /* stats: host bytes; -1 unknown */
	double duration_s;       /* the server's transition time; < 0 unknown */
	double elapsed_s;        /* this client's time, retries included */
	char problem[48];        /* problem slug ("out-of-memory"), "" none */
	char error[CTL_ERROR_MAX]; /* "" when ok */
	json_t *response;        /* the parsed body when kept, else NULL */
};

void ctl_result_init(struct ctl_result *r);
void ctl_result_finish(struct ctl_result *r);

/*
 * Read a complete HTTP answer into r (which ctl_result_init() prepared).
 * bytes is, for sleep, the device bytes released; for wake, the device bytes
 * mapped; for stats, the device bytes held now (host_bytes the host bytes).
 * A 200 is a success except for stats of an unhealthy manager; any other
 * status fails with the problem's slug and detail in error. With keep, the
 * parsed body is stored in r->response.
 */
void ctl_result_from_response(struct ctl_result *r, enum ctl_command command, long status,
			      const char *content_type, const char *body, size_t len, bool keep);

struct ctl_retry_policy {
	unsigned retries;    /* attempts after the first */
	double backoff_s;    /* delay before the first retry; doubles each time */
	double max_delay_s;  /* cap on every delay, Retry-After included */
};

/* Whether an HTTP status is worth retrying (503: the server is there but
 * cannot serve now, e.g. a wake that found the GPU memory still taken). */
bool ctl_status_retryable(long status);

/*
 * The delay before retry number `attempt` (1 for the first retry):
 * backoff_s * 2^(attempt-1), scaled by a jitter factor in [0.5, 1) drawn from
 * random01 in [0, 1); when retry_after_s >= 0 (the server's Retry-After) at
 * least that, plus up to 20% jitter; and at most max_delay_s.
 */
double ctl_retry_delay_s(const struct ctl_retry_policy *p, unsigned attempt,
			 double retry_after_s, double random01);

#endif
