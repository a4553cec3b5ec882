/* SPDX-License-Identifier: MIT */
#include "outcome.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define PROBLEM_PREFIX "urn:dormant:problem:"

static const struct ctl_command_info commands[] = {
	{ CTL_SLEEP, "sleep", "POST", "/sleep", true },
	{ CTL_WAKE, "wake", "POST", "/wake", true },
	{ CTL_STATS, "stats", "GET", "/stats", false },
	{ CTL_HEALTH, "health", "GET", "/healthz", false },
	{ CTL_READY, "ready", "GET", "/readyz", false },
};

const struct ctl_command_info *ctl_command_find(const char *name)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

const struct ctl_command_info *ctl_command_info(enum ctl_command command)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (commands[i].command == command)
			return &commands[i];
	return NULL;
}

void ctl_result_init(struct ctl_result *r)
{
	memset(r, 0, sizeof(*r));
	r->changed = -1;
	r->bytes = -1;
	r->host_bytes = -1;
	r->duration_s = -1;
}

void ctl_result_finish(struct ctl_result *r)
{
	if (!r)
		return;
	json_decref(r->response);
	r->response = NULL;
}

/* Copy a server string for display: control characters become spaces,
 * bytes outside ASCII '?' (a copy cut short could end inside a UTF-8
 * sequence, and a header need not be UTF-8 at all: the JSON report would
 * then fail; dormant servers send ASCII only). */
static void copy_clean(char *dst, size_t size, const char *src)
{
	size_t i = 0;

	for (; src && src[i] && i + 1 < size; i++) {
		unsigned char c = (unsigned char)src[i];

		dst[i] = c >= 0x80 ? '?' : iscntrl(c) ? ' ' : (char)c;
	}
	dst[i] = '\0';
}

static int64_t get_bytes(const json_t *obj, const char *key)
{
	const json_t *v = json_object_get(obj, key);

	return json_is_integer(v) && json_integer_value(v) >= 0 ? json_integer_value(v) : -1;
}

/* The fields a transition report shares with a problem's embedded report. */
static void read_report(struct ctl_result *r, enum ctl_command command, const json_t *report)
{
	const json_t *state = json_object_get(report, "state");
	const json_t *changed = json_object_get(report, "changed");
	const json_t *duration = json_object_get(report, "duration_s");

	if (json_is_string(state))
		copy_clean(r->state, sizeof(r->state), json_string_value(state));
	if (json_is_boolean(changed))
		r->changed = json_is_true(changed);
	if (json_is_number(duration) && json_number_value(duration) >= 0)
		r->duration_s = json_number_value(duration);
	r->bytes = get_bytes(report, command == CTL_SLEEP ? "bytes_released" : "bytes_mapped");
}

static void read_success(struct ctl_result *r, enum ctl_command command, const json_t *body)
{
	const json_t *totals, *healthy, *status;

	r->ok = true;
	switch (command) {
	case CTL_SLEEP:
	case CTL_WAKE:
		read_report(r, command, body);
		break;
	case CTL_STATS:
		copy_clean(r->state, sizeof(r->state),
			   json_string_value(json_object_get(body, "state")));
		totals = json_object_get(body, "totals");
		r->bytes = get_bytes(totals, "device_bytes");
		r->host_bytes = get_bytes(totals, "host_bytes");
		healthy = json_object_get(body, "healthy");
		if (json_is_false(healthy)) {
			char why[CTL_ERROR_MAX - 16];

			copy_clean(why, sizeof(why),
				   json_string_value(json_object_get(body, "health_error")));
			r->ok = false;
			snprintf(r->error, sizeof(r->error), "unhealthy: %s",
				 why[0] ? why : "(no reason given)");
		}
		break;
	case CTL_HEALTH:
	case CTL_READY:
		status = json_object_get(body, "status");
		copy_clean(r->state, sizeof(r->state), json_string_value(status));
		break;
	}
}

static void read_problem(struct ctl_result *r, enum ctl_command command, long status,
			 const char *content_type, const json_t *body)
{
	const char *type = json_string_value(json_object_get(body, "type"));
	const char *detail = json_string_value(json_object_get(body, "detail"));
	const char *title = json_string_value(json_object_get(body, "title"));
	const json_t *report = json_object_get(body, "report");
	char text[CTL_ERROR_MAX - 64];

	r->ok = false;
	if (type && strncmp(type, PROBLEM_PREFIX, strlen(PROBLEM_PREFIX)) == 0)
		copy_clean(r->problem, sizeof(r->problem), type + strlen(PROBLEM_PREFIX));
	if (json_is_object(report))
		read_report(r, command, report);
	copy_clean(text, sizeof(text), detail && *detail ? detail : title);
	if (r->problem[0] && text[0])
		snprintf(r->error, sizeof(r->error), "HTTP %ld %s: %s", status, r->problem, text);
	else if (text[0])
		snprintf(r->error, sizeof(r->error), "HTTP %ld: %s", status, text);
	else if (r->problem[0])
		snprintf(r->error, sizeof(r->error), "HTTP %ld %s", status, r->problem);
	else {
		copy_clean(text, sizeof(text), content_type);
		snprintf(r->error, sizeof(r->error), "HTTP %ld (%s)", status,
			 text[0] ? text : "no content type");
	}
}

void ctl_result_from_response(struct ctl_result *r, enum ctl_command command, long status,
			      const char *content_type, const char *body, size_t len, bool keep)
{
	json_t *json = NULL;
	json_error_t error;

	r->http_status = status;
	r->error[0] = '\0';
	r->problem[0] = '\0';
	if (len > 0)
		json = json_loadb(body, len, 0, &error);
	if (status == 200) {
		if (!json_is_object(json)) {
			r->ok = false;
			snprintf(r->error, sizeof(r->error), "HTTP 200 but the body is not a JSON object");
		} else {
			read_success(r, command, json);
		}
	} else {
		read_problem(r, command, status, content_type, json_is_object(json) ? json : NULL);
	}
	if (keep && json) {
		json_decref(r->response);
		r->response = json;
	} else {
		json_decref(json);
	}
}

bool ctl_status_retryable(long status)
{
	return status == 503;
}

double ctl_retry_delay_s(const struct ctl_retry_policy *p, unsigned attempt,
			 double retry_after_s, double random01)
{
	double delay = p->backoff_s;

	for (unsigned i = 1; i < attempt && delay < p->max_delay_s; i++)
		delay *= 2;
	if (random01 < 0 || random01 >= 1 || isnan(random01))
		random01 = 0;
	/* Equal jitter: ranks that failed together do not all retry together. */
	delay *= 0.5 + 0.5 * random01;
	/* Honour Retry-After, with up to 20% more so that ranks told the same
	 * time spread out a little. */
	if (retry_after_s >= 0 && delay < retry_after_s)
		delay = retry_after_s * (1 + 0.2 * random01);
	if (delay > p->max_delay_s)
		delay = p->max_delay_s;
	return delay;
}
