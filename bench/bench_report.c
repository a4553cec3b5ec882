/* SPDX-License-Identifier: MIT */
/* dormant-bench's report: the table, or one JSON object, of the run's
 * figures. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "benchutil.h"
#include "dormant-bench.h"

/* "1.23 GiB", or "-" where unreadable; into buf (32 bytes). */
static const char *gib_or_none(uint64_t bytes, char *buf)
{
	if (bytes == UINT64_MAX)
		snprintf(buf, 32, "-");
	else
		snprintf(buf, 32, "%.2f GiB", (double)bytes / (double)GiB);
	return buf;
}

static void print_num(double value, int width, int precision)
{
	if (isfinite(value))
		printf(" %*.*f", width, precision, value);
	else
		printf(" %*s", width, "-");
}

static void print_gib(double bytes)
{
	print_num(bytes / (double)GiB, 7, 3);
}

static void print_row(const char *name, double sleep_s, double sleep_gbps, double sleep_ratio,
		      double sleep_cpu, double wake_s, double wake_gbps, double wake_ratio,
		      double wake_cpu, double returned_pct, double asleep, double awake,
		      double settled)
{
	printf("%-7s", name);
	print_num(sleep_s, 8, 4);
	print_num(sleep_gbps, 6, 1);
	print_num(sleep_ratio, 5, 2);
	print_num(sleep_cpu, 6, 2);
	printf(" |");
	print_num(wake_s, 8, 4);
	print_num(wake_gbps, 6, 1);
	print_num(wake_ratio, 5, 2);
	print_num(wake_cpu, 6, 2);
	printf(" |");
	print_num(returned_pct, 7, 2);
	printf(" |");
	print_gib(asleep);
	print_gib(awake);
	print_gib(settled);
	printf("\n");
}

static void table_print(const struct bench *b, const struct medians *md)
{
	const struct options *o = &b->opt;
	char keep[32], discard[32], chunk[32], text[32];
	struct core_settings settings;

	core_settings_read(b, &settings);
	printf("dormant-bench%s%s: %s backend, %s mode, %s kept + %s discarded, %zu + %zu "
	       "tensors, %s chunks, %u cycles\n",
	       o->label ? " " : "", o->label ? o->label : "", dormant_backend_name(b->m),
	       dormant_host_mode_name(dormant_host_mode(b->m)),
	       bytes_human(o->keep_bytes, keep, sizeof(keep)),
	       bytes_human(o->discard_bytes, discard, sizeof(discard)), b->keep_count,
	       b->discard_count, bytes_human(settings.chunk_bytes, chunk, sizeof(chunk)), o->cycles);
	if (dormant_host_mode(b->m) == DORMANT_HOST_RECLAIMABLE && settings.reclaimable_pinned_bytes)
		printf("reclaimable_pinned_bytes: %s kept pinned while awake, at most\n",
		       bytes_human(settings.reclaimable_pinned_bytes, text, sizeof(text)));
	if (o->devices > 1)
		printf("devices: %u, the sizes on each, driven %s\n", o->devices,
		       settings.serial_devices ? "one after another (DORMANT_PARALLEL_DEVICES=0)"
						   : "at once");
	printf("setup: allocate %.3f s, fill %.3f s; device mapped %s; warm-up %s", b->alloc_s,
	       b->fill_s, bytes_human(b->keep_reserved + b->discard_reserved, text, sizeof(text)),
	       o->warm_up);
	if (strcmp(o->warm_up, "off") != 0)
		printf(" (%.3f s)", b->warmup_s);
	printf("\n");
	if (b->ceiling.measured)
		printf("ceiling: pinned copies of %s in %zu MiB pieces, median of %u: "
		       "device->host %.4f s = %.1f GB/s, host->device %.4f s = %.1f GB/s "
		       "(pinning it took %.3f s, unpinning %.3f s)\n",
		       keep, b->ceiling.piece_bytes / MiB, b->ceiling.reps,
		       b->ceiling.d2h_median_s, ceiling_gbps(b, true), b->ceiling.h2d_median_s,
		       ceiling_gbps(b, false), b->ceiling.pin_s, b->ceiling.unpin_s);
	else
		printf("ceiling: not measured (%s)\n",
		       o->keep_bytes ? "--ceiling-reps 0" : "no kept bytes");
	printf("\n%-7s %8s %6s %5s %6s | %8s %6s %5s %6s | %7s | %23s\n", "", "sleep", "GB/s",
	       "ceil", "CPU s", "wake", "GB/s", "ceil", "CPU s", "GPU", "host GiB held");
	printf("%-7s %8s %6s %5s %6s | %8s %6s %5s %6s | %7s | %7s %7s %7s\n", "cycle", "s", "",
	       "ratio", "", "s", "", "ratio", "", "back %", "asleep", "awake", "settled");
	for (unsigned i = 0; i < b->cycles_done; i++) {
		const struct cycle *c = &b->cycles[i];
		struct derived d = derive(b, c);
		char name[16];

		if (i == 0)
			snprintf(name, sizeof(name), "cold");
		else
			snprintf(name, sizeof(name), "%u", i);
		print_row(name, c->sleep.duration_s, d.sleep_gbps, d.sleep_ratio, c->sleep.cpu_s,
			  c->wake.duration_s, d.wake_gbps, d.wake_ratio, c->wake.cpu_s,
			  d.returned_pct, (double)c->host_asleep_bytes, (double)c->host_awake_bytes,
			  (double)c->host_settled_bytes);
	}
	if (md->warm) {
		const double *v = md->value;

		print_row("median", v[FIG_SLEEP_S], v[FIG_SLEEP_GBPS], v[FIG_SLEEP_RATIO],
			  v[FIG_SLEEP_CPU_S], v[FIG_WAKE_S], v[FIG_WAKE_GBPS], v[FIG_WAKE_RATIO],
			  v[FIG_WAKE_CPU_S], v[FIG_RETURNED_PCT], v[FIG_HOST_ASLEEP],
			  v[FIG_HOST_AWAKE], v[FIG_HOST_SETTLED]);
	}
	/* where the cold sleep's extra time went, beside the last warm one */
	for (unsigned i = 0; i < b->cycles_done; i += MAX(b->cycles_done - 1, 1u)) {
		const struct dormant_transition_times *t = &b->cycles[i].sleep.times;

		printf("%-7s sleep parts s: setup %.4f, checksum %.4f, host prep %.4f, pin %.4f, "
		       "wait %.4f, copy %.4f, release %.4f, warm-up wait %.4f\n",
		       i == 0 ? "cold" : "last", t->setup_s, t->checksum_s, t->host_prep_s,
		       t->host_pin_s, t->host_wait_s, t->copy_s, t->release_s, t->warmup_wait_s);
	}
	/* what carried each wake's copies (wake_copy=auto decides per wake) */
	for (unsigned i = 0; i < b->cycles_done; i += MAX(b->cycles_done - 1, 1u)) {
		const struct dormant_wake_copy *w = &b->cycles[i].wake.wake_copy;

		if (!w->method[0])
			continue;
		printf("%-7s wake copy: %s, engines %.3f GiB, kernel %.3f GiB, %u probes "
		       "(engines %.1f GB/s, kernel %.1f GB/s)\n",
		       i == 0 ? "cold" : "last", w->method, (double)w->bytes_engine / GiB,
		       (double)w->bytes_kernel / GiB, w->probes, w->engine_gbps, w->kernel_gbps);
	}
	if (b->cycles_done) {
		const struct cycle *c = &b->cycles[b->cycles_done - 1];
		char t[8][32];

		printf("process host memory, last cycle: asleep RSS %s (LazyFree %s), cgroup %s "
		       "(working set %s); awake, settled: RSS %s (LazyFree %s), cgroup %s "
		       "(working set %s)\n",
		       gib_or_none(c->proc_asleep.rss, t[0]), gib_or_none(c->proc_asleep.lazyfree, t[1]),
		       gib_or_none(c->proc_asleep.cgroup, t[2]),
		       gib_or_none(c->proc_asleep.working_set, t[3]),
		       gib_or_none(c->proc_settled.rss, t[4]),
		       gib_or_none(c->proc_settled.lazyfree, t[5]),
		       gib_or_none(c->proc_settled.cgroup, t[6]),
		       gib_or_none(c->proc_settled.working_set, t[7]));
	}
	printf("(median: of the %u warm cycles; GB/s: kept bytes per second, 1e9 bytes; ceil "
	       "ratio: to the pinned copy ceiling; GPU back: device bytes freed by sleep / bytes "
	       "managed; host: copies + pinned staging; settled: after background frees)\n",
	       md->warm);
	printf("verified after the last wake (%.3f s):", b->verify_s);
	if (b->verified_keep_bytes)
		printf(" %s kept bytes match the pattern;",
		       bytes_human(b->verified_keep_bytes, keep, sizeof(keep)));
	if (b->verified_zero_bytes)
		printf(" %s discarded bytes read zero;",
		       bytes_human(b->verified_zero_bytes, discard, sizeof(discard)));
	printf("\n");
}

static void json_process(struct json_out *j, const char *key, const struct process_memory *pm)
{
	json_out_object_begin(j, key);
	if (pm->rss != UINT64_MAX)
		json_out_u64(j, "rss_bytes", pm->rss);
	if (pm->lazyfree != UINT64_MAX)
		json_out_u64(j, "lazyfree_bytes", pm->lazyfree);
	if (pm->cgroup != UINT64_MAX)
		json_out_u64(j, "cgroup_memory_current_bytes", pm->cgroup);
	if (pm->working_set != UINT64_MAX)
		json_out_u64(j, "cgroup_working_set_bytes", pm->working_set);
	json_out_object_end(j);
}

static void json_sample(struct json_out *j, const char *key, const struct sample *s, double gbps,
			double ratio)
{
	json_out_object_begin(j, key);
	json_out_double(j, "seconds", s->duration_s);
	json_out_double(j, "wall_s", s->wall_s);
	json_out_double(j, "cpu_s", s->cpu_s);
	json_out_double(j, "gbps", gbps);
	json_out_double(j, "ceiling_ratio", ratio);
	json_out_double(j, "engine_copy_gbps", s->copy_gbps);
	json_out_u64(j, "bytes_copied", s->copied);
	json_out_u64(j, "bytes_released", s->released);
	json_out_u64(j, "bytes_mapped", s->mapped);
	json_out_u64(j, "bytes_zeroed", s->zeroed);
	/* the report's parts: a cold sleep's setup and host copies show here */
	json_out_object_begin(j, "times");
#define TIME(part) json_out_double(j, #part, s->times.part);
	TIME(sync_s) TIME(setup_s) TIME(checksum_s) TIME(host_prep_s) TIME(host_pin_s)
	TIME(host_wait_s) TIME(copy_s) TIME(release_s) TIME(map_s) TIME(map_wait_s)
	TIME(zero_wait_s) TIME(warmup_wait_s)
#undef TIME
	json_out_object_end(j);
	if (s->wake_copy.method[0]) {
		json_out_object_begin(j, "wake_copy");
		json_out_string(j, "method", s->wake_copy.method);
		json_out_u64(j, "bytes_engine", s->wake_copy.bytes_engine);
		json_out_u64(j, "bytes_kernel", s->wake_copy.bytes_kernel);
		json_out_u64(j, "probes", s->wake_copy.probes);
		json_out_double(j, "engine_gbps", s->wake_copy.engine_gbps);
		json_out_double(j, "kernel_gbps", s->wake_copy.kernel_gbps);
		json_out_object_end(j);
	}
	json_out_object_end(j);
}

static void json_tensors(struct json_out *j, const struct bench *b, const char *key, bool keep)
{
	double lo, mid, hi;

	tensor_sizes(b, keep, &lo, &mid, &hi);
	json_out_object_begin(j, key);
	json_out_u64(j, "count", keep ? b->keep_count : b->discard_count);
	json_out_u64(j, "bytes", keep ? b->opt.keep_bytes : b->opt.discard_bytes);
	json_out_u64(j, "reserved_bytes", keep ? b->keep_reserved : b->discard_reserved);
	json_out_double(j, "min_bytes", lo);
	json_out_double(j, "median_bytes", mid);
	json_out_double(j, "max_bytes", hi);
	json_out_object_end(j);
}

static void json_write(const struct bench *b, const struct medians *md, FILE *f)
{
	const struct options *o = &b->opt;
	const struct ceiling *c = &b->ceiling;
	struct core_settings settings;
	struct utsname uts;
	struct json_out j;

	core_settings_read(b, &settings);
	json_out_init(&j, f);
	json_out_object_begin(&j, NULL);
	json_out_string(&j, "tool", "dormant-bench");
	json_out_string(&j, "label", o->label);

	json_out_object_begin(&j, "config");
	json_out_string(&j, "backend", dormant_backend_name(b->m));
	json_out_string(&j, "host_mode", dormant_host_mode_name(dormant_host_mode(b->m)));
	json_out_u64(&j, "keep_bytes", o->keep_bytes);
	json_out_u64(&j, "discard_bytes", o->discard_bytes);
	json_out_u64(&j, "tensors_per_policy", o->tensors);
	json_out_u64(&j, "cycles", o->cycles);
	json_out_u64(&j, "devices", o->devices);
	json_out_bool(&j, "parallel_devices", !settings.serial_devices);
	json_out_u64(&j, "chunk_bytes", settings.chunk_bytes);
	json_out_u64(&j, "staging_bytes", settings.staging_bytes);
	json_out_u64(&j, "pin_piece_bytes", settings.pin_piece_bytes);
	json_out_u64(&j, "reclaimable_pinned_bytes", settings.reclaimable_pinned_bytes);
	json_out_u64(&j, "copy_threads", settings.copy_threads);
	json_out_u64(&j, "granularity_bytes", b->granularity);
	json_out_u64(&j, "ceiling_reps", o->ceiling_reps);
	json_out_u64(&j, "seed", o->seed);
	json_tensors(&j, b, "keep_tensors", true);
	json_tensors(&j, b, "discard_tensors", false);
	json_out_object_end(&j);

	json_out_object_begin(&j, "machine");
	json_out_i64(&j, "cpus", sysconf(_SC_NPROCESSORS_ONLN));
	json_out_u64(&j, "host_memory_bytes", host_mem_total());
	json_out_u64(&j, "device_memory_bytes", b->device_total_bytes);
	json_out_string(&j, "kernel", uname(&uts) == 0 ? uts.release : NULL);
	json_out_object_end(&j);

	if (c->measured) {
		json_out_object_begin(&j, "ceiling");
		json_out_u64(&j, "bytes", c->bytes);
		json_out_u64(&j, "piece_bytes", c->piece_bytes);
		json_out_u64(&j, "reps", c->reps);
		json_out_double(&j, "pin_s", c->pin_s);
		json_out_double(&j, "unpin_s", c->unpin_s);
		json_out_object_begin(&j, "d2h");
		json_out_double(&j, "seconds", c->d2h_median_s);
		json_out_double(&j, "gbps", ceiling_gbps(b, true));
		json_out_array_begin(&j, "reps_s");
		for (unsigned i = 0; i < c->reps; i++)
			json_out_double(&j, NULL, c->d2h_s[i]);
		json_out_array_end(&j);
		json_out_object_end(&j);
		json_out_object_begin(&j, "h2d");
		json_out_double(&j, "seconds", c->h2d_median_s);
		json_out_double(&j, "gbps", ceiling_gbps(b, false));
		json_out_array_begin(&j, "reps_s");
		for (unsigned i = 0; i < c->reps; i++)
			json_out_double(&j, NULL, c->h2d_s[i]);
		json_out_array_end(&j);
		json_out_object_end(&j);
		json_out_object_end(&j);
	} else {
		json_out_null(&j, "ceiling");
	}

	json_out_object_begin(&j, "setup");
	json_out_double(&j, "alloc_s", b->alloc_s);
	json_out_double(&j, "fill_s", b->fill_s);
	json_out_double(&j, "verify_s", b->verify_s);
	json_out_string(&j, "warm_up", b->opt.warm_up);
	json_out_double(&j, "warmup_s", b->warmup_s);
	json_out_object_end(&j);

	json_out_array_begin(&j, "cycles");
	for (unsigned i = 0; i < b->cycles_done; i++) {
		const struct cycle *cy = &b->cycles[i];
		struct derived d = derive(b, cy);

		json_out_object_begin(&j, NULL);
		json_out_u64(&j, "index", i);
		json_out_bool(&j, "cold", i == 0);
		json_sample(&j, "sleep", &cy->sleep, d.sleep_gbps, d.sleep_ratio);
		json_sample(&j, "wake", &cy->wake, d.wake_gbps, d.wake_ratio);
		json_out_object_begin(&j, "gpu");
		json_out_u64(&j, "managed_bytes", cy->managed_bytes);
		json_out_u64(&j, "free_awake_bytes", cy->free_awake_bytes);
		json_out_u64(&j, "free_asleep_bytes", cy->free_asleep_bytes);
		json_out_i64(&j, "returned_bytes", d.returned_bytes);
		json_out_double(&j, "returned_pct", d.returned_pct);
		json_out_u64(&j, "managed_asleep_bytes", cy->device_asleep_bytes);
		json_out_object_end(&j);
		json_out_object_begin(&j, "host");
		json_out_u64(&j, "asleep_bytes", cy->host_asleep_bytes);
		json_out_u64(&j, "awake_bytes", cy->host_awake_bytes);
		json_out_u64(&j, "awake_settled_bytes", cy->host_settled_bytes);
		json_out_double(&j, "settle_s", cy->settle_s);
		json_out_double(&j, "settle_cpu_s", cy->settle_cpu_s);
		json_process(&j, "process_asleep", &cy->proc_asleep);
		json_process(&j, "process_awake_settled", &cy->proc_settled);
		json_out_object_end(&j);
		json_out_object_end(&j);
	}
	json_out_array_end(&j);

	if (md->warm) {
		static const char *const keys[FIGURES] = {
			[FIG_SLEEP_S] = "sleep_s",
			[FIG_WAKE_S] = "wake_s",
			[FIG_SLEEP_GBPS] = "sleep_gbps",
			[FIG_WAKE_GBPS] = "wake_gbps",
			[FIG_SLEEP_RATIO] = "sleep_ceiling_ratio",
			[FIG_WAKE_RATIO] = "wake_ceiling_ratio",
			[FIG_SLEEP_CPU_S] = "sleep_cpu_s",
			[FIG_WAKE_CPU_S] = "wake_cpu_s",
			[FIG_RETURNED_PCT] = "gpu_returned_pct",
			[FIG_HOST_ASLEEP] = "host_asleep_bytes",
			[FIG_HOST_AWAKE] = "host_awake_bytes",
			[FIG_HOST_SETTLED] = "host_awake_settled_bytes",
			[FIG_SETTLE_S] = "settle_s",
		};

		json_out_object_begin(&j, "medians");
		json_out_u64(&j, "warm_cycles", md->warm);
		for (int fig = 0; fig < FIGURES; fig++)
			json_out_double(&j, keys[fig], md->value[fig]);
		json_out_object_end(&j);
	} else {
		json_out_null(&j, "medians");
	}

	json_out_object_begin(&j, "verify");
	json_out_bool(&j, "ok", true);
	json_out_u64(&j, "keep_bytes", b->verified_keep_bytes);
	json_out_u64(&j, "zero_bytes", b->verified_zero_bytes);
	json_out_object_end(&j);
	json_out_object_end(&j);
	json_out_finish(&j);
}

int results_write(const struct bench *b)
{
	struct medians md = medians_compute(b);
	FILE *f;

	if (b->opt.json)
		json_write(b, &md, stdout);
	else
		table_print(b, &md);
	fflush(stdout);
	if (!b->opt.json_out)
		return 0;
	f = fopen(b->opt.json_out, "w");
	if (!f)
		return bench_fail("cannot write %s: %s", b->opt.json_out, strerror(errno));
	json_write(b, &md, f);
	if (fclose(f) != 0)
		return bench_fail("writing %s: %s", b->opt.json_out, strerror(errno));
	return 0;
}
