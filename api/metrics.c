/* SPDX-License-Identifier: MIT */
/*
 * GET /metrics: the statistics in the Prometheus text exposition format,
 * version 0.0.4. Each family is written once, with its HELP and TYPE lines
 * first; label values are escaped as the format asks (\\, \", \n).
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "common.h"

#ifndef DORMANT_VERSION
#define DORMANT_VERSION "unknown"
#endif

static const char *const kind_names[API_KINDS] = { "sleep", "wake" };

/* The parts of struct dormant_transition_times, by their phase label. */
static const struct {
	const char *name;
	size_t offset;
} phases[] = {
	{ "sync", offsetof(struct dormant_transition_times, sync_s) },
	{ "host_prep", offsetof(struct dormant_transition_times, host_prep_s) },
	{ "host_pin", offsetof(struct dormant_transition_times, host_pin_s) },
	{ "host_wait", offsetof(struct dormant_transition_times, host_wait_s) },
	{ "copy", offsetof(struct dormant_transition_times, copy_s) },
	{ "release", offsetof(struct dormant_transition_times, release_s) },
	{ "map", offsetof(struct dormant_transition_times, map_s) },
	{ "map_wait", offsetof(struct dormant_transition_times, map_wait_s) },
	{ "zero_wait", offsetof(struct dormant_transition_times, zero_wait_s) },
	{ "comms", offsetof(struct dormant_transition_times, comms_s) },
	{ "setup", offsetof(struct dormant_transition_times, setup_s) },
	{ "checksum", offsetof(struct dormant_transition_times, checksum_s) },
	{ "rebuild", offsetof(struct dormant_transition_times, rebuild_s) },
	{ "warmup_wait", offsetof(struct dormant_transition_times, warmup_wait_s) },
};

static double phase_seconds(const struct dormant_transition_times *t, size_t i)
{
	return *(const double *)((const char *)t + phases[i].offset);
}

static void family(FILE *f, const char *name, const char *type, const char *help)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value, escaped. */
static void label_value(FILE *f, const char *value)
{
	for (const char *p = value; *p; p++) {
		if (*p == '\\')
			fputs("\\\\", f);
		else if (*p == '"')
			fputs("\\\"", f);
		else if (*p == '\n')
			fputs("\\n", f);
		else
			fputc(*p, f);
	}
}

/* A sample value: integers exactly, others with enough digits. */
static void value_double(FILE *f, double v)
{
	if (isnan(v))
		fputs(" NaN\n", f);
	else if (isinf(v))
		fputs(v > 0 ? " +Inf\n" : " -Inf\n", f);
	else
		fprintf(f, " %.17g\n", v);
}

static void value_u64(FILE *f, uint64_t v)
{
	fprintf(f, " %llu\n", (unsigned long long)v);
}

static void tag_sample(FILE *f, const char *name, const char *tag)
{
	fprintf(f, "%s{tag=\"", name);
	label_value(f, tag);
	fputs("\"", f);
}

static void histogram(FILE *f, const char *kind, const struct dormant_histogram *h)
{
	uint64_t cumulative = 0;

	for (int i = 0; i < DORMANT_HISTOGRAM_BUCKETS; i++) {
		cumulative += h->counts[i];
		fprintf(f, "dormant_transition_duration_seconds_bucket{kind=\"%s\",le=\"%g\"}", kind,
			h->bounds_s[i]);
		value_u64(f, cumulative);
	}
	cumulative += h->counts[DORMANT_HISTOGRAM_BUCKETS];
	fprintf(f, "dormant_transition_duration_seconds_bucket{kind=\"%s\",le=\"+Inf\"}", kind);
	/* the +Inf bucket is the count by definition */
	value_u64(f, h->count > cumulative ? h->count : cumulative);
	fprintf(f, "dormant_transition_duration_seconds_sum{kind=\"%s\"}", kind);
	value_double(f, h->sum_s);
	fprintf(f, "dormant_transition_duration_seconds_count{kind=\"%s\"}", kind);
	value_u64(f, h->count > cumulative ? h->count : cumulative);
}

static void write_metrics(FILE *f, const struct dormant_stats *st)
{
	const struct dormant_transition_stats *last[API_KINDS] = { &st->last_sleep,
								    &st->last_wake };
	const struct dormant_histogram *hist[API_KINDS] = { &st->sleep_seconds,
							     &st->wake_seconds };
	const struct dormant_transition_times *times_total[API_KINDS] = {
		&st->sleep_times_total, &st->wake_times_total
	};
	const uint64_t ok[API_KINDS] = { st->sleeps_ok, st->wakes_ok };
	const uint64_t failed[API_KINDS] = { st->sleeps_failed, st->wakes_failed };

	family(f, "dormant_info", "gauge", "The manager's backend, host memory mode and version.");
	fputs("dormant_info{backend=\"", f);
	label_value(f, st->backend);
	fprintf(f, "\",host_mode=\"%s\",version=\"%s\"} 1\n", dormant_host_mode_name(st->host_mode),
		DORMANT_VERSION);

	family(f, "dormant_healthy", "gauge",
	       "1 unless a failed sleep could not be rolled back (a wake recovers).");
	fprintf(f, "dormant_healthy %d\n", st->healthy ? 1 : 0);

	family(f, "dormant_tag_state", "gauge", "1 for the state each tag is in, else 0.");
	for (size_t i = 0; i < st->tag_count; i++) {
		for (int s = DORMANT_AWAKE; s <= DORMANT_WAKING; s++) {
			tag_sample(f, "dormant_tag_state", st->tags[i].tag);
			fprintf(f, ",state=\"%s\"} %d\n", dormant_state_name((enum dormant_state)s),
				st->tags[i].state == (enum dormant_state)s);
		}
	}

	family(f, "dormant_tag_bytes", "gauge",
	       "Bytes each tag holds now, on the device, in host memory and on disk.");
	for (size_t i = 0; i < st->tag_count; i++) {
		tag_sample(f, "dormant_tag_bytes", st->tags[i].tag);
		fputs(",location=\"device\"}", f);
		value_u64(f, st->tags[i].device_bytes);
		tag_sample(f, "dormant_tag_bytes", st->tags[i].tag);
		fputs(",location=\"host\"}", f);
		value_u64(f, st->tags[i].host_bytes);
		tag_sample(f, "dormant_tag_bytes", st->tags[i].tag);
		fputs(",location=\"disk\"}", f);
		value_u64(f, st->tags[i].disk_bytes);
	}

	family(f, "dormant_tag_allocations", "gauge", "Live allocations of each tag.");
	for (size_t i = 0; i < st->tag_count; i++) {
		tag_sample(f, "dormant_tag_allocations", st->tags[i].tag);
		fputs("}", f);
		value_u64(f, st->tags[i].allocations);
	}

	family(f, "dormant_gpu_free_bytes", "gauge", "Free memory of each device, as it reports it.");
	for (size_t i = 0; i < st->device_count; i++) {
		fprintf(f, "dormant_gpu_free_bytes{device=\"%d\"}", st->devices[i].ordinal);
		value_u64(f, st->devices[i].free_bytes);
	}
	family(f, "dormant_gpu_total_bytes", "gauge", "Total memory of each device.");
	for (size_t i = 0; i < st->device_count; i++) {
		fprintf(f, "dormant_gpu_total_bytes{device=\"%d\"}", st->devices[i].ordinal);
		value_u64(f, st->devices[i].total_bytes);
	}
	family(f, "dormant_managed_device_bytes", "gauge",
	       "Physical device memory this manager has mapped now, per device.");
	for (size_t i = 0; i < st->device_count; i++) {
		fprintf(f, "dormant_managed_device_bytes{device=\"%d\"}", st->devices[i].ordinal);
		value_u64(f, st->devices[i].managed_bytes);
	}

	family(f, "dormant_staging_bytes", "gauge", "Pinned staging host memory held now.");
	fputs("dormant_staging_bytes", f);
	value_u64(f, st->staging_bytes);
	family(f, "dormant_disk_bytes", "gauge",
	       "Disk bytes held now by the copies of tags with policy disk.");
	fputs("dormant_disk_bytes", f);
	value_u64(f, st->disk_bytes);

	family(f, "dormant_transitions_total", "counter",
	       "Sleeps and wakes asked of the manager, by result.");
	for (int k = 0; k < API_KINDS; k++) {
		fprintf(f, "dormant_transitions_total{kind=\"%s\",result=\"ok\"}", kind_names[k]);
		value_u64(f, ok[k]);
		fprintf(f, "dormant_transitions_total{kind=\"%s\",result=\"failed\"}", kind_names[k]);
		value_u64(f, failed[k]);
		fprintf(f, "dormant_transitions_total{kind=\"%s\",result=\"busy\"}", kind_names[k]);
		value_u64(f, k == API_SLEEP ? st->sleeps_busy : st->wakes_busy);
		fprintf(f, "dormant_transitions_total{kind=\"%s\",result=\"noop\"}", kind_names[k]);
		value_u64(f, k == API_SLEEP ? st->sleeps_noop : st->wakes_noop);
	}

	family(f, "dormant_transition_duration_seconds", "histogram",
	       "Wall time of the sleeps and wakes that ran (changed something or failed).");
	for (int k = 0; k < API_KINDS; k++)
		histogram(f, kind_names[k], hist[k]);

	family(f, "dormant_transition_phase_seconds_total", "counter",
	       "Seconds the sleeps and wakes that ran spent in each phase (the parts of "
	       "their reports' times; a part is summed over the threads that did it, so "
	       "the parts may add up to more than the duration).");
	for (int k = 0; k < API_KINDS; k++) {
		for (size_t i = 0; i < sizeof(phases) / sizeof(phases[0]); i++) {
			fprintf(f, "dormant_transition_phase_seconds_total{kind=\"%s\",phase=\"%s\"}",
				kind_names[k], phases[i].name);
			value_double(f, phase_seconds(times_total[k], i));
		}
	}

	family(f, "dormant_warmup_runs_total", "counter",
	       "Warm-up runs (dormant_warm_up(), background), by result: ok, failed (the next "
	       "sleep does the rest itself), cancelled (a sleep or wake stopped it).");
	fputs("dormant_warmup_runs_total{result=\"ok\"}", f);
	value_u64(f, st->warmup.runs - st->warmup.failures - st->warmup.cancelled);
	fputs("dormant_warmup_runs_total{result=\"failed\"}", f);
	value_u64(f, st->warmup.failures);
	fputs("dormant_warmup_runs_total{result=\"cancelled\"}", f);
	value_u64(f, st->warmup.cancelled);
	family(f, "dormant_warmup_seconds_total", "counter", "Time the warm-up runs took.");
	fputs("dormant_warmup_seconds_total", f);
	value_double(f, st->warmup.seconds_total);
	family(f, "dormant_warmup_host_bytes_total", "counter",
	       "Host copies the warm-up allocated and pinned ahead of a sleep (retain mode).");
	fputs("dormant_warmup_host_bytes_total", f);
	value_u64(f, st->warmup.host_bytes);
	family(f, "dormant_warmup_running", "gauge", "1 while a warm-up runs.");
	fprintf(f, "dormant_warmup_running %d\n",
		st->warmup.state == DORMANT_WARMUP_RUNNING ? 1 : 0);

	family(f, "dormant_transition_running", "gauge", "1 while a sleep or wake runs.");
	fprintf(f, "dormant_transition_running %d\n", st->transition_running ? 1 : 0);

	family(f, "dormant_steps_running", "gauge", "Training steps inside the guard now.");
	fprintf(f, "dormant_steps_running %u\n", st->steps_running);

	family(f, "dormant_bytes_copied_total", "counter",
	       "Bytes copied between device and host memory.");
	fputs("dormant_bytes_copied_total{direction=\"to_host\"}", f);
	value_u64(f, st->bytes_to_host_total);
	fputs("dormant_bytes_copied_total{direction=\"to_device\"}", f);
	value_u64(f, st->bytes_to_device_total);

	family(f, "dormant_wakes_by_copy_total", "counter",
	       "Wakes that copied, by what copied them (option wake_copy; mixed: auto switched).");
	fputs("dormant_wakes_by_copy_total{method=\"engine\"}", f);
	value_u64(f, st->wakes_copy_engine);
	fputs("dormant_wakes_by_copy_total{method=\"kernel\"}", f);
	value_u64(f, st->wakes_copy_kernel);
	fputs("dormant_wakes_by_copy_total{method=\"mixed\"}", f);
	value_u64(f, st->wakes_copy_mixed);
	family(f, "dormant_bytes_to_device_by_copy_total", "counter",
	       "Bytes copied to the device by wakes, by the copy engines or the copy kernel.");
	fputs("dormant_bytes_to_device_by_copy_total{method=\"engine\"}", f);
	value_u64(f, st->bytes_to_device_engine_total);
	fputs("dormant_bytes_to_device_by_copy_total{method=\"kernel\"}", f);
	value_u64(f, st->bytes_to_device_kernel_total);

	family(f, "dormant_bytes_released_total", "counter", "Device bytes given back by sleeps.");
	fputs("dormant_bytes_released_total", f);
	value_u64(f, st->bytes_released_total);

	family(f, "dormant_bytes_zeroed_total", "counter",
	       "Device bytes zero-filled by wakes (discarded memory, ranges marked unused).");
	fputs("dormant_bytes_zeroed_total", f);
	value_u64(f, st->bytes_zeroed_total);

	family(f, "dormant_bytes_skipped_total", "counter",
	       "Kept bytes that sleeps did not copy because they were marked unused.");
	fputs("dormant_bytes_skipped_total", f);
	value_u64(f, st->bytes_skipped_total);

	family(f, "dormant_bytes_unchanged_total", "counter",
	       "Kept bytes that sleeps did not copy because their retained host copy already "
	       "held them (checksum unchanged).");
	fputs("dormant_bytes_unchanged_total", f);
	value_u64(f, st->bytes_unchanged_total);

	family(f, "dormant_chunks_verified_total", "counter",
	       "Restored chunks whose checksum after the wake matched the sleep's.");
	fputs("dormant_chunks_verified_total", f);
	value_u64(f, st->chunks_verified_total);

	family(f, "dormant_chunk_mismatches_total", "counter",
	       "Restored chunks whose checksum after the wake did not match (the wake failed).");
	fputs("dormant_chunk_mismatches_total", f);
	value_u64(f, st->chunk_mismatches_total);

	family(f, "dormant_verify_enabled", "gauge", "1 while wakes verify checksums.");
	fprintf(f, "dormant_verify_enabled %d\n", st->verify ? 1 : 0);

	family(f, "dormant_last_transition_timestamp_seconds", "gauge",
	       "Unix time at which the last sleep or wake that ran ended.");
	for (int k = 0; k < API_KINDS; k++) {
		if (!last[k]->valid)
			continue;
		fprintf(f, "dormant_last_transition_timestamp_seconds{kind=\"%s\"}", kind_names[k]);
		value_double(f, last[k]->started_unix_s + last[k]->duration_s);
	}
	family(f, "dormant_last_transition_success", "gauge",
	       "1 if the last sleep or wake that ran succeeded, else 0.");
	for (int k = 0; k < API_KINDS; k++) {
		if (!last[k]->valid)
			continue;
		fprintf(f, "dormant_last_transition_success{kind=\"%s\"} %d\n", kind_names[k],
			last[k]->result == 0);
	}
}

/* Residue mode (struct dormant_residue_stats). */
static void write_residue(FILE *f, const struct dormant_residue_stats *r)
{
	static const enum dormant_residue_state states[] = {
		DORMANT_RESIDUE_RESIDENT, DORMANT_RESIDUE_CHECKPOINTED, DORMANT_RESIDUE_UNAVAILABLE,
		DORMANT_RESIDUE_STUCK,
	};

	family(f, "dormant_residue_state", "gauge",
	       "1 for the state of what the process holds on its devices outside tags "
	       "(residue mode checkpoint), 0 for the others.");
	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
		fprintf(f, "dormant_residue_state{mode=\"%s\",state=\"%s\"} %d\n",
			dormant_residue_mode_name(r->mode), dormant_residue_state_name(states[i]),
			r->state == states[i]);
	family(f, "dormant_residue_operations_total", "counter",
	       "Process checkpoints and restores of the residue, by result.");
	fputs("dormant_residue_operations_total{op=\"checkpoint\",result=\"ok\"}", f);
	value_u64(f, r->checkpoints);
	fputs("dormant_residue_operations_total{op=\"checkpoint\",result=\"failed\"}", f);
	value_u64(f, r->checkpoint_failures);
	fputs("dormant_residue_operations_total{op=\"restore\",result=\"ok\"}", f);
	value_u64(f, r->restores);
	fputs("dormant_residue_operations_total{op=\"restore\",result=\"failed\"}", f);
	value_u64(f, r->restore_failures);
	family(f, "dormant_residue_seconds_total", "counter",
	       "Time the successful checkpoints and restores took.");
	fputs("dormant_residue_seconds_total{op=\"checkpoint\"}", f);
	value_double(f, r->checkpoint_seconds_total);
	fputs("dormant_residue_seconds_total{op=\"restore\"}", f);
	value_double(f, r->restore_seconds_total);
	family(f, "dormant_residue_bytes", "gauge",
	       "Device bytes the last checkpoint gave back (the residue), over every device.");
	fputs("dormant_residue_bytes", f);
	value_u64(f, r->residue_bytes);
	family(f, "dormant_residue_helper_starts_total", "counter",
	       "Residue helper processes started (one that dies is replaced).");
	fputs("dormant_residue_helper_starts_total", f);
	value_u64(f, r->helper_starts);
}

int api_metrics_text(const struct dormant_stats *stats,
		     const struct dormant_residue_stats *residue, bool faults_armed,
		     const char *extra, char **ret_text, size_t *ret_size)
{
	char *text = NULL;
	size_t size = 0;
	FILE *f;
	bool failed;

	f = open_memstream(&text, &size);
	if (!f)
		return error_set(-ENOMEM, "out of host memory");
	write_metrics(f, stats);
	if (residue)
		write_residue(f, residue);
	family(f, "dormant_faults_armed", "gauge",
	       "1 when the fault switch (a test tool) makes sleeps and wakes fail on purpose.");
	fprintf(f, "dormant_faults_armed %d\n", faults_armed ? 1 : 0);
	if (extra && *extra) {
		fputs(extra, f);
		if (extra[strlen(extra) - 1] != '\n')
			fputc('\n', f);
	}
	failed = ferror(f) != 0;
	if (fclose(f) != 0 || failed) {
		free(text);
		return error_set(-ENOMEM, "out of host memory");
	}
	*ret_text = text;
	*ret_size = size;
	return 0;
}
