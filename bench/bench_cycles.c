/* SPDX-License-Identifier: MIT */
/* dormant-bench's cycles: a sleep and a wake of every tag, with the device's
 * and the host's memory read around each, and the figures derived from
 * them (their medians over the warm cycles). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"
#include "dormant-bench.h"

struct snapshot {
	uint64_t free_bytes;    /* GPU free, over the manager's devices */
	uint64_t managed_bytes; /* physical bytes of the manager mapped */
	uint64_t host_bytes;    /* host copies + pinned staging */
};

/* One number read from a file, or UINT64_MAX. */
static uint64_t file_u64(const char *path)
{
	unsigned long long v;
	uint64_t value = UINT64_MAX;
	FILE *f = fopen(path, "r");

	if (!f)
		return UINT64_MAX;
	if (fscanf(f, "%llu", &v) == 1)
		value = v;
	fclose(f);
	return value;
}

/* A "name N" line's N in a cgroup's memory.stat; UINT64_MAX if absent. */
static uint64_t memory_stat_u64(const char *dir, const char *name)
{
	char path[700], key[64];
	unsigned long long v;
	uint64_t value = UINT64_MAX;
	FILE *f;

	snprintf(path, sizeof(path), "%s/memory.stat", dir);
	f = fopen(path, "r");
	if (!f)
		return UINT64_MAX;
	while (fscanf(f, "%63s %llu", key, &v) == 2)
		if (strcmp(key, name) == 0) {
			value = v;
			break;
		}
	fclose(f);
	return value;
}

/* This process's cgroup memory: in use (v2's memory.current, else v1's
 * memory.usage_in_bytes) and the working set as the kubelet and cAdvisor
 * count it, in use less the inactive file pages (v2's inactive_file, v1's
 * total_inactive_file). MADV_FREE pages sit on the inactive file list, so a
 * reclaimable host copy is in use but not in the working set. UINT64_MAX
 * where not readable. */
static void cgroup_memory_read(uint64_t *current, uint64_t *working_set)
{
	char line[512], dir[600] = "", v1dir[600] = "", path[700];
	const char *inactive = NULL;
	FILE *f = fopen("/proc/self/cgroup", "r");

	*current = *working_set = UINT64_MAX;
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char *at = strchr(line, ':');
		char *rel = at ? strchr(at + 1, ':') : NULL;

		if (!rel)
			continue;
		*rel++ = '\0';
		rel[strcspn(rel, "\n")] = '\0';
		if (strcmp(rel, "/") == 0)
			rel = "";
		if (strcmp(at + 1, "") == 0 && strncmp(line, "0", 1) == 0)
			snprintf(dir, sizeof(dir), "/sys/fs/cgroup%s", rel);
		else if (strcmp(at + 1, "memory") == 0)
			snprintf(v1dir, sizeof(v1dir), "/sys/fs/cgroup/memory%s", rel);
	}
	fclose(f);
	if (dir[0]) { /* v2 */
		snprintf(path, sizeof(path), "%s/memory.current", dir);
		*current = file_u64(path);
		inactive = "inactive_file";
	}
	if (*current == UINT64_MAX && v1dir[0]) {
		snprintf(path, sizeof(path), "%s/memory.usage_in_bytes", v1dir);
		*current = file_u64(path);
		if (*current == UINT64_MAX) { /* a namespace shows its own root only */
			snprintf(v1dir, sizeof(v1dir), "/sys/fs/cgroup/memory");
			*current = file_u64("/sys/fs/cgroup/memory/memory.usage_in_bytes");
		}
		snprintf(dir, sizeof(dir), "%s", v1dir);
		inactive = "total_inactive_file";
	}
	if (*current != UINT64_MAX) {
		uint64_t in = memory_stat_u64(dir, inactive);

		if (in != UINT64_MAX)
			*working_set = *current > in ? *current - in : 0;
	}
}

static void process_memory_read(struct process_memory *ret)
{
	static const char *const names[] = { "Rss", "LazyFree" };
	uint64_t v[2];

	proc_kib_fields("/proc/self/smaps_rollup", names, v, 2);
	ret->rss = v[0];
	ret->lazyfree = v[1];
	cgroup_memory_read(&ret->cgroup, &ret->working_set);
}

static int snapshot_take(struct bench *b, struct snapshot *ret)
{
	const struct dormant_stats *s = b->stats;

	if (dormant_stats_get(b->m, b->stats) < 0)
		return bench_fail_lib("reading statistics");
	memset(ret, 0, sizeof(*ret));
	for (size_t d = 0; d < s->device_count; d++) {
		ret->free_bytes += s->devices[d].free_bytes;
		ret->managed_bytes += s->devices[d].managed_bytes;
	}
	ret->host_bytes = s->host_bytes + s->staging_bytes;
	return 0;
}

static int transition(struct bench *b, bool sleep, struct sample *s)
{
	const char *kind = sleep ? "sleep" : "wake";
	struct dormant_report *rep = b->report;
	enum dormant_state target = sleep ? DORMANT_ASLEEP : DORMANT_AWAKE;
	double cpu = process_cpu_s(), start = now_monotonic_s();
	int r;

	r = sleep ? dormant_sleep(b->m, NULL, rep) : dormant_wake(b->m, NULL, rep);
	s->wall_s = now_monotonic_s() - start;
	s->cpu_s = process_cpu_s() - cpu;
	if (r < 0)
		return bench_fail_lib("%s", kind);
	for (size_t i = 0; i < rep->tag_count; i++)
		if (rep->tags[i].after != target)
			return bench_fail("%s: tag '%s' is %s afterwards", kind, rep->tags[i].tag,
				    dormant_state_name(rep->tags[i].after));
	s->duration_s = rep->duration_s;
	s->times = rep->times;
	s->copy_gbps = rep->copy_gbps;
	s->copied = rep->bytes_copied;
	s->released = rep->bytes_released;
	s->mapped = rep->bytes_mapped;
	s->zeroed = rep->bytes_zeroed;
	s->wake_copy = rep->wake_copy;
	return 0;
}

int cycle_run(struct bench *b, struct cycle *c)
{
	struct snapshot awake, asleep, woken, settled;
	double cpu, start;

	if (snapshot_take(b, &awake) < 0 || transition(b, true, &c->sleep) < 0 ||
	    snapshot_take(b, &asleep) < 0)
		return -1;
	process_memory_read(&c->proc_asleep);
	if (transition(b, false, &c->wake) < 0 || snapshot_take(b, &woken) < 0)
		return -1;
	/* Release mode gives host copies back on a worker thread after the
	 * wake returns: wait for that, and count it apart. */
	cpu = process_cpu_s();
	start = now_monotonic_s();
	core_settle(b);
	c->settle_s = now_monotonic_s() - start;
	c->settle_cpu_s = process_cpu_s() - cpu;
	if (snapshot_take(b, &settled) < 0)
		return -1;
	c->managed_bytes = awake.managed_bytes;
	c->free_awake_bytes = awake.free_bytes;
	c->free_asleep_bytes = asleep.free_bytes;
	c->device_asleep_bytes = asleep.managed_bytes;
	c->host_asleep_bytes = asleep.host_bytes;
	c->host_awake_bytes = woken.host_bytes;
	c->host_settled_bytes = settled.host_bytes;
	process_memory_read(&c->proc_settled);
	return 0;
}

struct derived derive(const struct bench *b, const struct cycle *c)
{
	double keep = (double)b->opt.keep_bytes * b->opt.devices;
	struct derived d = { .sleep_gbps = NAN, .wake_gbps = NAN, .sleep_ratio = NAN,
			     .wake_ratio = NAN, .returned_pct = NAN };

	if (keep > 0) {
		d.sleep_gbps = keep / c->sleep.duration_s / 1e9;
		d.wake_gbps = keep / c->wake.duration_s / 1e9;
		/* against device 0's ceiling on each device */
		d.sleep_ratio = d.sleep_gbps / (ceiling_gbps(b, true) * b->opt.devices);
		d.wake_ratio = d.wake_gbps / (ceiling_gbps(b, false) * b->opt.devices);
	}
	d.returned_bytes = (int64_t)c->free_asleep_bytes - (int64_t)c->free_awake_bytes;
	if (c->managed_bytes)
		d.returned_pct = 100.0 * (double)d.returned_bytes / (double)c->managed_bytes;
	return d;
}

static void figures_of(const struct bench *b, const struct cycle *c, double ret[FIGURES])
{
	struct derived d = derive(b, c);

	ret[FIG_SLEEP_S] = c->sleep.duration_s;
	ret[FIG_WAKE_S] = c->wake.duration_s;
	ret[FIG_SLEEP_GBPS] = d.sleep_gbps;
	ret[FIG_WAKE_GBPS] = d.wake_gbps;
	ret[FIG_SLEEP_RATIO] = d.sleep_ratio;
	ret[FIG_WAKE_RATIO] = d.wake_ratio;
	ret[FIG_SLEEP_CPU_S] = c->sleep.cpu_s;
	ret[FIG_WAKE_CPU_S] = c->wake.cpu_s;
	ret[FIG_RETURNED_PCT] = d.returned_pct;
	ret[FIG_HOST_ASLEEP] = (double)c->host_asleep_bytes;
	ret[FIG_HOST_AWAKE] = (double)c->host_awake_bytes;
	ret[FIG_HOST_SETTLED] = (double)c->host_settled_bytes;
	ret[FIG_SETTLE_S] = c->settle_s;
}

struct medians medians_compute(const struct bench *b)
{
	unsigned n = b->cycles_done > 1 ? b->cycles_done - 1 : 0;
	struct medians md = { .warm = n };
	double (*rows)[FIGURES] = calloc(MAX(n, 1u), sizeof(*rows));
	double *column = calloc(MAX(n, 1u), sizeof(*column));

	for (int f = 0; f < FIGURES; f++)
		md.value[f] = NAN;
	if (!rows || !column)
		md.warm = n = 0;
	for (unsigned i = 0; i < n; i++)
		figures_of(b, &b->cycles[i + 1], rows[i]);
	for (int f = 0; f < FIGURES && n; f++) {
		for (unsigned i = 0; i < n; i++)
			column[i] = rows[i][f];
		md.value[f] = median(column, n);
	}
	free(column);
	free(rows);
	return md;
}
