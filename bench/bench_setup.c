/* SPDX-License-Identifier: MIT */
/* dormant-bench's setup: the manager as the flags ask, whether the run fits
 * in memory, the warm-up before the first sleep, and the end. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "benchutil.h"
#include "dormant-bench.h"

static void log_to_stderr(enum dormant_log_level level, const char *message, void *userdata)
{
	static const char *const names[] = { "error", "warning", "info", "debug" };

	(void)userdata;
	fprintf(stderr, "libdormant %s: %s\n", names[level], message);
}

int bench_setup(struct bench *b)
{
	const struct options *o = &b->opt;
	struct dormant_options *dopts = NULL;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	size_t largest = 8;
	int r;

	b->stats = calloc(1, sizeof(*b->stats));
	b->report = calloc(1, sizeof(*b->report));
	b->cycles = calloc(o->cycles, sizeof(*b->cycles));
	if (!b->stats || !b->report || !b->cycles)
		return bench_fail("out of host memory");
	r = core_workers_start(b, (unsigned)MAX(1L, MIN(cpus, 16L)));
	if (r < 0)
		return bench_fail("starting threads: %s", strerror(-r));
	/* a flag left out (NULL, 0) leaves the option to its default */
	r = dormant_options_new(&dopts);
	if (r == 0 && o->backend)
		r = dormant_options_set(dopts, "backend", o->backend);
	if (r == 0 && o->host_mode != DORMANT_HOST_DEFAULT)
		r = dormant_options_set(dopts, "host_mode", dormant_host_mode_name(o->host_mode));
	if (r == 0 && o->chunk_bytes)
		r = dormant_options_set_int(dopts, "chunk_bytes", (long long)o->chunk_bytes);
	if (r == 0 && o->copy_threads)
		r = dormant_options_set_int(dopts, "copy_threads", o->copy_threads);
	if (r == 0 && o->staging_bytes)
		r = dormant_options_set_int(dopts, "staging_bytes", (long long)o->staging_bytes);
	if (r == 0 && o->devices > 1)
		r = dormant_options_set_int(dopts, "host_devices", (long long)o->devices);
	if (r == 0 && o->verbose)
		r = dormant_options_set_log(dopts, log_to_stderr, NULL);
	/* the cold cycle is cold unless asked: no background run may land
	 * between the fill and the first sleep by chance */
	if (r == 0)
		r = dormant_options_set(dopts, "warmup",
					strcmp(o->warm_up, "wait") == 0 ? "auto" : "off");
	if (r == 0)
		r = dormant_new(dopts, &b->m);
	dormant_options_destroy(dopts);
	if (r < 0)
		return bench_fail_lib("creating the manager");
	if (dormant_set_policy(b->m, KEEP_TAG, DORMANT_KEEP) < 0 ||
	    dormant_set_policy(b->m, DISCARD_TAG, DORMANT_DISCARD) < 0)
		return bench_fail_lib("setting tag policies");
	b->host_backend = strcmp(dormant_backend_name(b->m), "host") == 0;
	b->device = core_current_device(b);
	if (o->devices > 1) {
		int count = dormant_device_count(b->m);

		if (count < (int)o->devices) {
			fprintf(stderr, "dormant-bench: skipped: --devices %u, but the %s backend has %d\n",
				o->devices, dormant_backend_name(b->m), count);
			return EXIT_SKIP;
		}
		b->device = 0; /* the ceiling's and the granularity's */
	}
	if (core_granularity(b, b->device, &b->granularity) < 0)
		return bench_fail_lib("reading the device's granularity");
	if (tensors_plan(b) < 0)
		return -1;
	for (size_t i = 0; i < b->tensor_count; i++)
		largest = MAX(largest, b->tensors[i].size);
	if (core_pattern_alloc(b, round_up(largest, 8)) < 0)
		return bench_fail_lib("allocating the pattern buffer");
	b->bad_slices = calloc(slices_of(b->pattern_size / 8) + 1, sizeof(*b->bad_slices));
	if (!b->bad_slices)
		return bench_fail("out of host memory");
	return 0;
}

/* Skip (EXIT_SKIP) when the run cannot fit: the device must hold the tensors
 * (and, before them, the ceiling's buffer); the host must hold the kept bytes
 * (pinned in retain mode) and, on the host backend, the device's bytes too.
 * The pattern buffer is already allocated, so MemAvailable has counted it. */
int fit_check(struct bench *b)
{
	struct core_settings settings;
	uint64_t dev_free = 0, dev_total = 0, host_avail = host_mem_available();
	uint64_t host_total = host_mem_total();
	uint64_t dev_run = (b->keep_reserved + b->discard_reserved) / b->opt.devices;
	uint64_t dev_ceiling = b->opt.ceiling_reps ? round_up(b->opt.keep_bytes, b->granularity) : 0;
	uint64_t host_run = (uint64_t)b->opt.keep_bytes * b->opt.devices;
	uint64_t host_ceiling = b->opt.ceiling_reps ? b->opt.keep_bytes : 0;
	uint64_t dev_need, host_need, margin = host_total / 20;
	char need_text[32], have_text[32];

	core_settings_read(b, &settings);
	if (dormant_host_mode(b->m) == DORMANT_HOST_RELEASE && b->opt.keep_bytes)
		host_run += settings.staging_bytes;
	if (b->host_backend) {
		host_run += dev_run * b->opt.devices;
		host_ceiling += dev_ceiling;
	}
	if (core_device_memory(b, b->device, &dev_free, &dev_total) < 0)
		return bench_fail_lib("reading device %d's free memory", b->device);
	b->device_total_bytes = dev_total;
	/* every device holds the same: the one with the least free decides */
	for (unsigned d = 1; d < b->opt.devices; d++) {
		uint64_t other_free = 0, other_total = 0;

		if (core_device_memory(b, (int)d, &other_free, &other_total) < 0)
			return bench_fail_lib("reading device %u's free memory", d);
		dev_free = MIN(dev_free, other_free);
	}
	dev_need = MAX(dev_run, dev_ceiling);
	host_need = MAX(host_run, host_ceiling);
	if (b->opt.force)
		return 0;
	if (dev_need > dev_free) {
		fprintf(stderr, "dormant-bench: skipped: needs %s of device memory, %s free\n",
			bytes_human(dev_need, need_text, sizeof(need_text)),
			bytes_human(dev_free, have_text, sizeof(have_text)));
		return EXIT_SKIP;
	}
	if (host_avail && host_need + margin > host_avail) {
		fprintf(stderr,
			"dormant-bench: skipped: needs %s of host memory (+ 5%% margin), %s available\n",
			bytes_human(host_need, need_text, sizeof(need_text)),
			bytes_human(host_avail, have_text, sizeof(have_text)));
		return EXIT_SKIP;
	}
	return 0;
}

/* --warm-up: prepare the first sleep ahead (call), or wait for the library to
 * (wait: its background run once the allocations settled), timed. */
int warm_up(struct bench *b)
{
	double start = now_monotonic_s();

	if (strcmp(b->opt.warm_up, "call") == 0) {
		if (dormant_warm_up(b->m) < 0)
			return bench_fail_lib("warming up");
	} else if (strcmp(b->opt.warm_up, "wait") == 0) {
		for (;;) {
			if (dormant_stats_get(b->m, b->stats) < 0)
				return bench_fail_lib("reading stats");
			if (b->stats->warmup.runs && b->stats->warmup.state == DORMANT_WARMUP_IDLE)
				break;
			if (now_monotonic_s() - start > 300)
				return bench_fail("the background warm-up did not finish in 300 s");
			usleep(10000);
		}
		if (b->stats->warmup.last_result < 0)
			fprintf(stderr, "dormant-bench: the warm-up failed (the sleep does it): %s\n",
				b->stats->warmup.last_error);
	}
	b->warmup_s = now_monotonic_s() - start;
	return 0;
}

void bench_finish(struct bench *b)
{
	if (b->m) {
		core_pattern_free(b);
		dormant_destroy(b->m);
	}
	core_workers_stop(b);
	free(b->bad_slices);
	free(b->tensors);
	free(b->cycles);
	free(b->report);
	free(b->stats);
}
