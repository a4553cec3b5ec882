/* SPDX-License-Identifier: MIT */
/* The manager's reports and statistics as JSON documents (jansson), and the
 * exported dormant_*_json() functions built on them (running a transition,
 * dormant_transition_json() too, is transition.c's). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "dormant-json.h"
#include "common.h"

const char *api_result_name(int result)
{
	static const struct {
		int err;
		const char *name;
	} names[] = {
		{ EPERM, "EPERM" },	    { ENOENT, "ENOENT" },	{ EINTR, "EINTR" },
		{ EIO, "EIO" },		    { E2BIG, "E2BIG" },		{ EAGAIN, "EAGAIN" },
		{ ENOMEM, "ENOMEM" },	    { EACCES, "EACCES" },	{ EFAULT, "EFAULT" },
		{ EBUSY, "EBUSY" },	    { EEXIST, "EEXIST" },	{ ENODEV, "ENODEV" },
		{ EINVAL, "EINVAL" },	    { ENOSPC, "ENOSPC" },	{ ERANGE, "ERANGE" },
		{ ENOSYS, "ENOSYS" },	    { ENOTSUP, "ENOTSUP" },	{ ETIMEDOUT, "ETIMEDOUT" },
		{ ECANCELED, "ECANCELED" }, { EOVERFLOW, "EOVERFLOW" }, { ENXIO, "ENXIO" },
		{ EPROTO, "EPROTO" },	    { EBADF, "EBADF" },		{ EADDRINUSE, "EADDRINUSE" },
	};

	if (result >= 0)
		return "ok";
	for (size_t i = 0; i < ARRAY_SIZE(names); i++)
		if (names[i].err == -result)
			return names[i].name;
	return "EUNKNOWN";
}

const char *api_manager_state(const struct dormant_stats *stats)
{
	enum dormant_state state;

	if (stats->tag_count == 0)
		return "awake";
	state = stats->tags[0].state;
	for (size_t i = 1; i < stats->tag_count; i++)
		if (stats->tags[i].state != state)
			return "mixed";
	return dormant_state_name(state);
}

static const char *kind_name(enum api_kind kind)
{
	return kind == API_SLEEP ? "sleep" : "wake";
}

/* value rounded to digits decimals (digits may be negative): the nearest
 * double to that decimal, which %.15g prints back exactly. */
static double round_decimals(double value, int digits)
{
	if (digits >= 0) {
		double scale = pow(10.0, digits);
		return round(value * scale) / scale;
	}
	double scale = pow(10.0, -digits);
	return round(value / scale) * scale;
}

json_t *api_number(double value, enum api_number kind)
{
	/* json_real() refuses NaN and infinities; a rate or a duration is never
	 * either unless something went wrong, and then 0 says it best. */
	if (!isfinite(value) || value == 0.0)
		return json_real(0.0);
	switch (kind) {
	case API_SECONDS:
		value = round_decimals(value, 9);
		break;
	case API_UNIX_SECONDS:
		value = round_decimals(value, 3);
		break;
	case API_RATE:
		value = round_decimals(value, 5 - (int)floor(log10(fabs(value))));
		break;
	}
	return json_real(value);
}

static json_t *count_json(uint64_t value)
{
	/* json_int_t is long long: bytes and counts stay far below 2^63. */
	return json_integer((json_int_t)MIN(value, (uint64_t)INT64_MAX));
}

/* A JSON string of at most max bytes of text, which may be cut in the middle
 * of a UTF-8 sequence (the library's message buffers are fixed): bytes
 * outside ASCII become '?', so the document stays valid. */
static json_t *text(const char *s, size_t max)
{
	size_t len = strnlen(s, max);
	char *copy = malloc(len + 1);
	json_t *o;

	if (!copy)
		return NULL;
	for (size_t i = 0; i < len; i++)
		copy[i] = (unsigned char)s[i] < 0x80 ? s[i] : '?';
	copy[len] = '\0';
	o = json_stringn(copy, len);
	free(copy);
	return o;
}

/* The checksum counts (issue 15) beside the others: bytes_unchanged,
 * chunks_verified, chunk_mismatches. Steals nothing; NULL o stays NULL. */
static json_t *with_checksums(json_t *o, uint64_t unchanged, uint64_t verified,
			      uint64_t mismatches)
{
	if (o && (json_object_set_new(o, "bytes_unchanged", count_json(unchanged)) < 0 ||
		  json_object_set_new(o, "chunks_verified", count_json(verified)) < 0 ||
		  json_object_set_new(o, "chunk_mismatches", count_json(mismatches)) < 0)) {
		json_decref(o);
		return NULL;
	}
	return o;
}

/* Where a transition's time went (struct dormant_transition_times). */
static json_t *times_json(const struct dormant_transition_times *t)
{
	return json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
			 "sync_s", api_number(t->sync_s, API_SECONDS),
			 "host_prep_s", api_number(t->host_prep_s, API_SECONDS),
			 "host_pin_s", api_number(t->host_pin_s, API_SECONDS),
			 "host_wait_s", api_number(t->host_wait_s, API_SECONDS),
			 "copy_s", api_number(t->copy_s, API_SECONDS),
			 "release_s", api_number(t->release_s, API_SECONDS),
			 "map_s", api_number(t->map_s, API_SECONDS),
			 "map_wait_s", api_number(t->map_wait_s, API_SECONDS),
			 "zero_wait_s", api_number(t->zero_wait_s, API_SECONDS),
			 "comms_s", api_number(t->comms_s, API_SECONDS),
			 "setup_s", api_number(t->setup_s, API_SECONDS),
			 "checksum_s", api_number(t->checksum_s, API_SECONDS),
			 "rebuild_s", api_number(t->rebuild_s, API_SECONDS),
			 "warmup_wait_s", api_number(t->warmup_wait_s, API_SECONDS));
}

/* The background warm-up (struct dormant_warmup_stats). */
static json_t *warmup_json(const struct dormant_warmup_stats *w)
{
	return json_pack("{s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:i, s:o}",
			 "state", dormant_warmup_state_name(w->state),
			 "runs", count_json(w->runs),
			 "failures", count_json(w->failures),
			 "cancelled", count_json(w->cancelled),
			 "device_setups", count_json(w->device_setups),
			 "host_bytes_total", count_json(w->host_bytes),
			 "seconds_total", api_number(w->seconds_total, API_SECONDS),
			 "last_result", w->last_result,
			 "last_error", text(w->last_error, sizeof(w->last_error)));
}

json_t *api_residue_json(const struct dormant_residue_stats *r)
{
	return json_pack("{s:s, s:s, s:o, s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:{s:s, s:i, "
			 "s:o, s:o}, s:o}",
			 "mode", dormant_residue_mode_name(r->mode),
			 "state", dormant_residue_state_name(r->state),
			 "reason", text(r->reason, sizeof(r->reason)),
			 "helper_pid", r->helper_pid,
			 "helper_starts", count_json(r->helper_starts),
			 "checkpoints", count_json(r->checkpoints),
			 "checkpoint_failures", count_json(r->checkpoint_failures),
			 "restores", count_json(r->restores),
			 "restore_failures", count_json(r->restore_failures),
			 "checkpoint_seconds_total", api_number(r->checkpoint_seconds_total, API_SECONDS),
			 "restore_seconds_total", api_number(r->restore_seconds_total, API_SECONDS),
			 "residue_bytes", count_json(r->residue_bytes),
			 "last",
			 "op", r->last_op,
			 "result", r->last_result,
			 "seconds", api_number(r->last_seconds, API_SECONDS),
			 "error", text(r->last_error, sizeof(r->last_error)),
			 "calls_while_checkpointed", count_json(r->calls_while_checkpointed));
}

/* What one transition did with the residue: the report's "residue". */
static json_t *residue_step_json(const struct dormant_residue_step *step)
{
	bool acted = step->op[0] != '\0';

	return json_pack("{s:s, s:s, s:s, s:s, s:o, s:o}",
			 "mode", dormant_residue_mode_name(step->mode),
			 "state", dormant_residue_state_name(step->state),
			 "action", acted ? step->op : "none",
			 "result", api_result_name(acted ? step->result : 0),
			 "seconds", api_number(acted ? step->seconds : 0, API_SECONDS),
			 "error", text(step->error, sizeof(step->error)));
}

/* What copied a wake to the device (struct dormant_wake_copy). */
static json_t *wake_copy_json(const struct dormant_wake_copy *w)
{
	char method[sizeof(w->method) + 1];

	/* the struct's "": the wake copied nothing */
	snprintf(method, sizeof(method), "%.*s", (int)sizeof(w->method),
		 w->method[0] ? w->method : "none");
	return json_pack("{s:s, s:o, s:o, s:i, s:o, s:o}",
			 "method", method,
			 "bytes_engine", count_json(w->bytes_engine),
			 "bytes_kernel", count_json(w->bytes_kernel),
			 "probes", (json_int_t)w->probes,
			 "engine_gbps", api_number(w->engine_gbps, API_RATE),
			 "kernel_gbps", api_number(w->kernel_gbps, API_RATE));
}

static json_t *tag_change_json(const struct dormant_tag_change *c)
{
	return with_checksums(json_pack("{s:s, s:s, s:s, s:s, s:b, s:o, s:o, s:o, s:o, s:o}",
			 "tag", c->tag,
			 "policy", dormant_policy_name(c->policy),
			 "before", dormant_state_name(c->before),
			 "after", dormant_state_name(c->after),
			 "changed", c->changed,
			 "bytes_copied", count_json(c->bytes_copied),
			 "bytes_released", count_json(c->bytes_released),
			 "bytes_mapped", count_json(c->bytes_mapped),
			 "bytes_zeroed", count_json(c->bytes_zeroed),
			 "bytes_skipped", count_json(c->bytes_skipped)),
			      c->bytes_unchanged, c->chunks_verified, c->chunk_mismatches);
}

json_t *api_report_json(enum api_kind kind, const struct dormant_report *rep)
{
	const char *state = rep->tags_asleep == 0 ? "awake"
			    : rep->tags_awake == 0 ? "asleep"
						   : "mixed";
	json_t *report, *tags;
	bool changed = false;

	tags = json_array();
	if (!tags)
		return NULL;
	for (size_t i = 0; i < rep->tag_count && i < DORMANT_TAGS_MAX; i++) {
		changed = changed || rep->tags[i].changed;
		if (json_array_append_new(tags, tag_change_json(&rep->tags[i])) < 0) {
			json_decref(tags);
			return NULL;
		}
	}
	/* json_pack steals tags ("o") even when it fails. */
	report = json_pack("{s:s, s:s, s:b, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
			   "action", kind_name(kind),
			   "result", api_result_name(rep->result),
			   "changed", changed,
			   "state", state,
			   "duration_s", api_number(rep->duration_s, API_SECONDS),
			   "guard_wait_s", api_number(rep->guard_wait_s, API_SECONDS),
			   "bytes_copied", count_json(rep->bytes_copied),
			   "bytes_released", count_json(rep->bytes_released),
			   "bytes_mapped", count_json(rep->bytes_mapped),
			   "bytes_zeroed", count_json(rep->bytes_zeroed),
			   "bytes_skipped", count_json(rep->bytes_skipped),
			   "copy_gbps", api_number(rep->copy_gbps, API_RATE),
			   "tags", tags);
	report = with_checksums(report, rep->bytes_unchanged, rep->chunks_verified,
				rep->chunk_mismatches);
	if (!report)
		return NULL;
	if (json_object_set_new(report, "times", times_json(&rep->times)) < 0 ||
	    json_object_set_new(report, "residue", residue_step_json(&rep->residue)) < 0 ||
	    (kind == API_WAKE &&
	     json_object_set_new(report, "wake_copy", wake_copy_json(&rep->wake_copy)) < 0)) {
		json_decref(report);
		return NULL;
	}
	if (rep->result < 0 &&
	    json_object_set_new(report, "error", rep->error[0] ? text(rep->error, sizeof(rep->error))
							       : json_string(strerror(-rep->result))) < 0) {
		json_decref(report);
		return NULL;
	}
	return report;
}

static json_t *last_transition_json(const struct dormant_transition_stats *t, bool wake)
{
	json_t *o;

	if (!t->valid)
		return json_null();
	o = json_pack("{s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
		      "result", api_result_name(t->result),
		      "started_unix_s", api_number(t->started_unix_s, API_UNIX_SECONDS),
		      "duration_s", api_number(t->duration_s, API_SECONDS),
		      "bytes_copied", count_json(t->bytes_copied),
		      "bytes_released", count_json(t->bytes_released),
		      "bytes_mapped", count_json(t->bytes_mapped),
		      "bytes_zeroed", count_json(t->bytes_zeroed),
		      "bytes_skipped", count_json(t->bytes_skipped),
		      "copy_gbps", api_number(t->copy_gbps, API_RATE));
	o = with_checksums(o, t->bytes_unchanged, t->chunks_verified, t->chunk_mismatches);
	if (o && (json_object_set_new(o, "times", times_json(&t->times)) < 0 ||
		  (wake && json_object_set_new(o, "wake_copy", wake_copy_json(&t->wake_copy)) < 0))) {
		json_decref(o);
		return NULL;
	}
	if (o && t->result < 0 &&
	    json_object_set_new(o, "error", text(t->error, sizeof(t->error))) < 0) {
		json_decref(o);
		return NULL;
	}
	return o;
}

static json_t *tag_stats_json(const struct dormant_tag_stats *t)
{
	return json_pack("{s:s, s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
			 "tag", t->tag,
			 "policy", dormant_policy_name(t->policy),
			 "state", dormant_state_name(t->state),
			 "allocations", count_json(t->allocations),
			 "bytes", count_json(t->bytes),
			 "reserved_bytes", count_json(t->reserved_bytes),
			 "device_bytes", count_json(t->device_bytes),
			 "host_bytes", count_json(t->host_bytes),
			 "disk_bytes", count_json(t->disk_bytes),
			 "sleeps", count_json(t->sleeps),
			 "wakes", count_json(t->wakes));
}

static json_t *device_stats_json(const struct dormant_device_stats *d)
{
	return json_pack("{s:i, s:o, s:o, s:o}",
			 "ordinal", d->ordinal,
			 "free_bytes", count_json(d->free_bytes),
			 "total_bytes", count_json(d->total_bytes),
			 "managed_bytes", count_json(d->managed_bytes));
}

json_t *api_stats_to_json(const struct dormant_stats *st, json_t *extra)
{
	json_t *o = NULL, *tags, *devices, *counters;

	tags = json_array();
	devices = json_array();
	if (!tags || !devices)
		goto err;
	for (size_t i = 0; i < st->tag_count && i < DORMANT_TAGS_MAX; i++)
		if (json_array_append_new(tags, tag_stats_json(&st->tags[i])) < 0)
			goto err;
	for (size_t i = 0; i < st->device_count && i < DORMANT_DEVICES_MAX; i++)
		if (json_array_append_new(devices, device_stats_json(&st->devices[i])) < 0)
			goto err;

	o = json_pack("{s:s, s:s, s:b, s:o, s:s, s:b, s:I, s:o, s:{s:o, s:o, s:o, s:o, s:o, s:o}, "
		      "s:o, s:{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}, s:o, s:o}",
		      "backend", st->backend,
		      "host_mode", dormant_host_mode_name(st->host_mode),
		      "healthy", st->healthy,
		      "health_error", text(st->health_error, sizeof(st->health_error)),
		      "state", api_manager_state(st),
		      "transition_running", st->transition_running,
		      "steps_running", (json_int_t)st->steps_running,
		      "tags", tags,
		      "totals",
		      "allocations", count_json(st->allocations),
		      "bytes", count_json(st->bytes),
		      "device_bytes", count_json(st->device_bytes),
		      "host_bytes", count_json(st->host_bytes),
		      "staging_bytes", count_json(st->staging_bytes),
		      "disk_bytes", count_json(st->disk_bytes),
		      "devices", devices,
		      "counters",
		      "sleeps_ok", count_json(st->sleeps_ok),
		      "sleeps_failed", count_json(st->sleeps_failed),
		      "wakes_ok", count_json(st->wakes_ok),
		      "wakes_failed", count_json(st->wakes_failed),
		      "noops", count_json(st->noops),
		      "busy_rejections", count_json(st->busy_rejections),
		      "bytes_to_host_total", count_json(st->bytes_to_host_total),
		      "bytes_to_device_total", count_json(st->bytes_to_device_total),
		      "bytes_released_total", count_json(st->bytes_released_total),
		      "bytes_zeroed_total", count_json(st->bytes_zeroed_total),
		      "bytes_skipped_total", count_json(st->bytes_skipped_total),
		      "last_sleep", last_transition_json(&st->last_sleep, false),
		      "last_wake", last_transition_json(&st->last_wake, true));
	/* json_pack has consumed tags and devices, failed or not */
	tags = devices = NULL;
	if (!o)
		goto err;
	counters = json_object_get(o, "counters");
	if (json_object_set_new(o, "verify", json_boolean(st->verify)) < 0 ||
	    json_object_set_new(o, "warmup", warmup_json(&st->warmup)) < 0 ||
	    json_object_set_new(counters, "bytes_unchanged_total",
				count_json(st->bytes_unchanged_total)) < 0 ||
	    json_object_set_new(counters, "chunks_verified_total",
				count_json(st->chunks_verified_total)) < 0 ||
	    json_object_set_new(counters, "chunk_mismatches_total",
				count_json(st->chunk_mismatches_total)) < 0 ||
	    json_object_set_new(counters, "wakes_copy_engine", count_json(st->wakes_copy_engine)) < 0 ||
	    json_object_set_new(counters, "wakes_copy_kernel", count_json(st->wakes_copy_kernel)) < 0 ||
	    json_object_set_new(counters, "wakes_copy_mixed", count_json(st->wakes_copy_mixed)) < 0 ||
	    json_object_set_new(counters, "bytes_to_device_engine_total",
				count_json(st->bytes_to_device_engine_total)) < 0 ||
	    json_object_set_new(counters, "bytes_to_device_kernel_total",
				count_json(st->bytes_to_device_kernel_total)) < 0)
		goto err;
	if (extra && json_object_set_new(o, "extra", extra) < 0) {
		extra = NULL; /* stolen */
		goto err;
	}
	return o;

err:
	json_decref(o);
	json_decref(tags);
	json_decref(devices);
	json_decref(extra);
	return NULL;
}

/* ---- exported ------------------------------------------------------------ */

static int dump(json_t *doc, bool pretty, char **ret_json)
{
	char *text = json_dumps(doc, pretty ? JSON_FLAGS_PRETTY : JSON_FLAGS_COMPACT);

	if (!text)
		return error_set(-ENOMEM, "out of host memory");
	*ret_json = text;
	return 0;
}

DORMANT_EXPORT int dormant_stats_json(struct dormant *m, bool pretty, char **ret_json)
{
	struct dormant_stats *stats;
	json_t *doc;
	int r;

	if (!m || !ret_json)
		return error_set(-EINVAL, "manager or ret_json is NULL");
	stats = malloc(sizeof(*stats));
	if (!stats)
		return error_set(-ENOMEM, "out of host memory");
	r = dormant_stats_get(m, stats);
	if (r < 0) {
		free(stats);
		return r;
	}
	doc = api_stats_to_json(stats, NULL);
	free(stats);
	if (!doc)
		return error_set(-ENOMEM, "out of host memory");
	{
		struct dormant_residue_stats residue;

		dormant_residue_stats_get(m, &residue);
		if (json_object_set_new(doc, "residue", api_residue_json(&residue)) < 0) {
			json_decref(doc);
			return error_set(-ENOMEM, "out of host memory");
		}
	}
	r = dump(doc, pretty, ret_json);
	json_decref(doc);
	return r;
}

DORMANT_EXPORT void dormant_json_free(char *json)
{
	free(json);
}
