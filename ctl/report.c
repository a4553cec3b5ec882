/* SPDX-License-Identifier: MIT */
#include "report.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <string.h>

void ctl_format_bytes(int64_t bytes, char *buf, size_t size)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB" };
	double v = (double)bytes;
	size_t unit = 0;

	if (bytes < 0) {
		snprintf(buf, size, "-");
		return;
	}
	if (bytes < 1024) {
		snprintf(buf, size, "%" PRId64 " B", bytes);
		return;
	}
	v /= 1024;
	while (v >= 1024 && unit + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024;
		unit++;
	}
	snprintf(buf, size, "%.1f %s", v, units[unit]);
}

/* For transitions the server's own time; for reads this client's. */
static double shown_duration(enum ctl_command command, const struct ctl_result *r)
{
	if (command == CTL_SLEEP || command == CTL_WAKE)
		return r->duration_s;
	return r->attempts > 0 ? r->elapsed_s : -1;
}

static void cell_duration(double seconds, char *buf, size_t size)
{
	if (seconds < 0)
		snprintf(buf, size, "-");
	else
		snprintf(buf, size, "%.3fs", seconds);
}

static void cell_state(const struct ctl_result *r, char *buf, size_t size)
{
	snprintf(buf, size, "%s%s", r->state[0] ? r->state : "-",
		 r->ok && r->changed == 0 ? " (no change)" : "");
}

void ctl_report_table(FILE *out, enum ctl_command command, const struct ctl_endpoints *endpoints,
		      const struct ctl_result *results)
{
	int w_endpoint = (int)strlen("ENDPOINT"), w_state = (int)strlen("STATE");
	int w_bytes = (int)strlen("BYTES"), w_duration = (int)strlen("DURATION");
	size_t failed = 0;
	char cell[64];

	for (size_t i = 0; i < endpoints->count; i++) {
		const struct ctl_result *r = &results[i];
		int len = (int)strlen(endpoints->items[i].name);

		if (len > w_endpoint)
			w_endpoint = len;
		cell_state(r, cell, sizeof(cell));
		if ((int)strlen(cell) > w_state)
			w_state = (int)strlen(cell);
		ctl_format_bytes(r->bytes, cell, sizeof(cell));
		if ((int)strlen(cell) > w_bytes)
			w_bytes = (int)strlen(cell);
		cell_duration(shown_duration(command, r), cell, sizeof(cell));
		if ((int)strlen(cell) > w_duration)
			w_duration = (int)strlen(cell);
	}
	fprintf(out, "%-*s  %-*s  %*s  %*s  %s\n", w_endpoint, "ENDPOINT", w_state, "STATE",
		w_bytes, "BYTES", w_duration, "DURATION", "ERROR");
	for (size_t i = 0; i < endpoints->count; i++) {
		const struct ctl_result *r = &results[i];
		char state[64], bytes[32], duration[32];

		cell_state(r, state, sizeof(state));
		ctl_format_bytes(r->bytes, bytes, sizeof(bytes));
		cell_duration(shown_duration(command, r), duration, sizeof(duration));
		fprintf(out, "%-*s  %-*s  %*s  %*s%s%s\n", w_endpoint, endpoints->items[i].name,
			w_state, state, w_bytes, bytes, w_duration, duration, r->ok ? "" : "  ",
			r->ok ? "" : r->error);
		if (!r->ok)
			failed++;
	}
	fprintf(out, "%zu endpoint%s: %zu ok, %zu failed\n", endpoints->count,
		endpoints->count == 1 ? "" : "s", endpoints->count - failed, failed);
}

static json_t *number_or_null(double v)
{
	return v < 0 ? json_null() : json_real(v);
}

static json_t *integer_or_null(int64_t v)
{
	return v < 0 ? json_null() : json_integer(v);
}

static json_t *string_or_null(const char *s)
{
	return s && *s ? json_string(s) : json_null();
}

static json_t *result_json(const struct ctl_command_info *info, const struct ctl_endpoint *e,
			   const struct ctl_result *r)
{
	char url[CTL_SPEC_MAX + 64];
	json_t *o;

	snprintf(url, sizeof(url), "%s%s", e->base_url, info->path);
	o = json_pack("{s:s, s:s, s:o, s:b, s:o, s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
		      "endpoint", e->name,
		      "url", url,
		      "unix_socket", string_or_null(e->unix_path),
		      "ok", r->ok,
		      "http_status", r->http_status > 0 ? json_integer(r->http_status) : json_null(),
		      "attempts", (json_int_t)r->attempts,
		      "state", string_or_null(r->state),
		      "changed", r->changed < 0 ? json_null() : json_boolean(r->changed),
		      "bytes", integer_or_null(r->bytes),
		      "host_bytes", integer_or_null(r->host_bytes),
		      "duration_s", number_or_null(r->duration_s),
		      "elapsed_s", number_or_null(r->attempts > 0 ? r->elapsed_s : -1),
		      "problem", string_or_null(r->problem),
		      "error", r->ok ? json_null() : json_string(r->error));
	if (o && json_object_set(o, "response", r->response ? r->response : json_null()) < 0) {
		json_decref(o);
		return NULL;
	}
	return o;
}

int ctl_report_json(FILE *out, enum ctl_command command, const char *const *tags,
		    const struct ctl_endpoints *endpoints, const struct ctl_result *results)
{
	const struct ctl_command_info *info = ctl_command_info(command);
	json_auto_t *doc = NULL;
	json_t *list = json_array(), *tag_list = tags ? json_array() : json_null();
	size_t failed = 0;

	for (size_t i = 0; tags && tags[i]; i++)
		json_array_append_new(tag_list, json_string(tags[i]));
	for (size_t i = 0; i < endpoints->count; i++) {
		if (!results[i].ok)
			failed++;
		if (json_array_append_new(list, result_json(info, &endpoints->items[i], &results[i])) < 0) {
			json_decref(list);
			json_decref(tag_list);
			return -ENOMEM;
		}
	}
	doc = json_pack("{s:s, s:o, s:I, s:I, s:I, s:o}",
			"command", info->name,
			"tags", tag_list,
			"endpoints", (json_int_t)endpoints->count,
			"ok", (json_int_t)(endpoints->count - failed),
			"failed", (json_int_t)failed,
			"results", list);
	if (!doc || json_dumpf(doc, out, JSON_INDENT(2) | JSON_REAL_PRECISION(6)) < 0)
		return -ENOMEM;
	fputc('\n', out);
	return 0;
}

void ctl_report_failures(FILE *err, const struct ctl_endpoints *endpoints,
			 const struct ctl_result *results)
{
	for (size_t i = 0; i < endpoints->count; i++)
		if (!results[i].ok)
			fprintf(err, "dormantctl: %s: %s\n", endpoints->items[i].name, results[i].error);
}
