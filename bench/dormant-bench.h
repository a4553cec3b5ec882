/* SPDX-License-Identifier: MIT */
/*
 * dormant-bench: how long a trainer's memory takes to sleep and wake, next to
 * the copy ceiling of the same device.
 *
 * One run: create a manager, measure the ceiling (plain pinned copies of the
 * kept bytes each way, in pinned pieces, as the engine copies), allocate the
 * kept ("weights", DORMANT_KEEP) and discarded ("grads", DORMANT_DISCARD)
 * tensors, fill both with a pattern, then run the cycles: sleep every tag,
 * wake every tag, with GPU free bytes, host bytes held and process CPU time
 * recorded around each transition. After the last wake the kept bytes must
 * match the pattern and the discarded bytes must read zero; anything else
 * fails the run.
 *
 * With --devices N the same tensors are allocated on each of devices 0 to
 * N-1 (the sizes are per device) and every transition moves all of them:
 * the figures are the totals, the ceiling that of device 0 times N.
 *
 * The program's files, by what they do: bench_options.c (the flags),
 * bench_tensors.c (tensor sizes, the pattern, fill and check), bench_setup.c
 * (the manager, what fits, the warm-up), bench_ceiling.c (the ceiling),
 * bench_cycles.c (the cycles and their medians), bench_report.c (the table
 * and the JSON), dormant-bench.c (the run). It links the core statically and
 * uses a few internals: bench_ceiling.c drives the backend table, and
 * bench_core.c is the one door to the rest (the worker pool, pinned host
 * memory, the device's figures, the manager's resolved settings); no other
 * file includes a private header of the core. It never changes the
 * manager's state.
 */
#ifndef DORMANT_BENCH_H
#define DORMANT_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"
#include "dormant.h"

#define EXIT_USAGE 2
#define EXIT_SKIP 77 /* Meson's "skipped" */

#define KEEP_TAG "weights"
#define DISCARD_TAG "grads"

/* Tensor sizes: log-uniform over [TENSOR_LOG_MIN, TENSOR_LOG_MAX], then scaled
 * so that each policy's sizes sum exactly to its bytes, in TENSOR_ALIGN
 * multiples (the last one takes any remainder). */
#define TENSOR_LOG_MIN (4 * KiB)
#define TENSOR_LOG_MAX (256 * MiB)
#define TENSOR_ALIGN 256
#define TENSORS_MAX 1000000

#define CYCLES_MAX 1000
#define CEILING_REPS_MAX 20
#define PATTERN_SLICE_WORDS (1u << 20) /* 8 MiB per worker task */

struct options {
	const char *backend;
	enum dormant_host_mode host_mode;
	size_t keep_bytes;
	size_t discard_bytes;
	size_t tensors; /* per policy */
	unsigned devices;
	unsigned cycles;
	size_t chunk_bytes;
	size_t staging_bytes;
	unsigned copy_threads;
	unsigned ceiling_reps;
	uint64_t seed;
	const char *label;
	bool json;
	const char *json_out;
	bool force;
	bool verbose;
	const char *warm_up; /* off, call, wait */
	bool debug_corrupt;
};

struct tensor {
	void *ptr;
	size_t size;
	uint64_t key; /* pattern key */
	int device;
	bool keep;
};

struct ceiling {
	bool measured;
	size_t bytes;
	size_t piece_bytes; /* each copy stays in one pinned piece, as the engine's */
	unsigned reps;
	double pin_s, unpin_s;
	double d2h_s[CEILING_REPS_MAX];
	double h2d_s[CEILING_REPS_MAX];
	double d2h_median_s, h2d_median_s;
};

struct sample {
	double duration_s; /* the report's */
	struct dormant_transition_times times; /* the report's parts */
	double wall_s;     /* around the call */
	double cpu_s;      /* process CPU time during the call */
	double copy_gbps;  /* the engine's own figure */
	uint64_t copied, released, mapped, zeroed;
	struct dormant_wake_copy wake_copy; /* a wake: what copied (option wake_copy) */
};

/* Host memory of the process the way its users look at it (issue 24):
 * RSS, and of it LazyFree (MADV_FREE pages the kernel has not taken yet:
 * reclaimable mode's host copies while awake), from /proc/self/smaps_rollup;
 * the cgroup's memory.current (v2; v1: memory.usage_in_bytes) and its
 * working set as the kubelet counts it (less the inactive file pages, where
 * MADV_FREE pages sit). UINT64_MAX:
 * not readable here. On the
 * host backend the simulated device's memory is in RSS too. */
struct process_memory {
	uint64_t rss, lazyfree, cgroup, working_set;
};

struct cycle {
	struct sample sleep, wake;
	struct process_memory proc_asleep, proc_settled;
	uint64_t managed_bytes;      /* device bytes of the manager, awake */
	uint64_t free_awake_bytes;   /* GPU free before the sleep */
	uint64_t free_asleep_bytes;  /* GPU free after it */
	uint64_t device_asleep_bytes; /* manager's device bytes asleep: 0 */
	uint64_t host_asleep_bytes;  /* host copies + staging, asleep */
	uint64_t host_awake_bytes;   /* the same right after the wake */
	uint64_t host_settled_bytes; /* ... once background frees are done */
	double settle_s, settle_cpu_s;
};

/* Figures derived from a cycle and the ceiling. */
struct derived {
	double sleep_gbps, wake_gbps;
	double sleep_ratio, wake_ratio;
	int64_t returned_bytes;
	double returned_pct;
};

/* The manager's settings as it resolved them, for the report. */
struct core_settings {
	size_t chunk_bytes;
	size_t staging_bytes;
	size_t pin_piece_bytes;
	size_t reclaimable_pinned_bytes;
	unsigned copy_threads;
	bool serial_devices;
};

struct workers;
struct hostbuf;

struct bench {
	struct options opt;
	struct dormant *m;
	struct workers *workers; /* the bench's own: pattern and checks */
	struct dormant_stats *stats;
	struct dormant_report *report;
	struct hostbuf *pattern; /* pinned: what fill and check copy through */
	void *pattern_ptr;       /* its bytes */
	size_t pattern_size;
	size_t *bad_slices;
	struct tensor *tensors;
	size_t tensor_count;
	size_t keep_count, discard_count; /* over every device */
	uint64_t keep_reserved, discard_reserved; /* over every device */
	size_t granularity;
	int device;
	bool host_backend;
	uint64_t device_total_bytes;
	struct ceiling ceiling;
	struct cycle *cycles;
	unsigned cycles_done;
	double alloc_s, fill_s, verify_s;
	double warmup_s; /* --warm-up call: dormant_warm_up(); wait: until the background run is done */
	uint64_t verified_keep_bytes, verified_zero_bytes;
};

/* The per-cycle figures that get a median over the warm cycles. */
enum figure {
	FIG_SLEEP_S, FIG_WAKE_S, FIG_SLEEP_GBPS, FIG_WAKE_GBPS, FIG_SLEEP_RATIO, FIG_WAKE_RATIO,
	FIG_SLEEP_CPU_S, FIG_WAKE_CPU_S, FIG_RETURNED_PCT, FIG_HOST_ASLEEP, FIG_HOST_AWAKE,
	FIG_HOST_SETTLED, FIG_SETTLE_S, FIGURES,
};

/* Medians over the warm cycles (all but the first); NAN where none. */
struct medians {
	unsigned warm;
	double value[FIGURES];
};

/* ---- the flags (bench_options.c) ----------------------------------------- */

/* Fill *o from the command line; -1 (said on stderr) on a bad one. */
int options_parse(int argc, char **argv, struct options *o);

/* ---- tensors and the pattern (bench_tensors.c) --------------------------- */

size_t slices_of(size_t words);
int tensors_plan(struct bench *b);
void tensor_sizes(const struct bench *b, bool keep, double *ret_min, double *ret_median,
		  double *ret_max);
int tensors_allocate(struct bench *b);
int tensors_fill(struct bench *b);
int tensors_check(struct bench *b);
int tensors_corrupt(struct bench *b);

/* ---- the manager, what fits, the warm-up (bench_setup.c) ----------------- */

int bench_setup(struct bench *b);
int fit_check(struct bench *b);
int warm_up(struct bench *b);
void bench_finish(struct bench *b);

/* ---- the ceiling (bench_ceiling.c) --------------------------------------- */

int ceiling_measure(struct bench *b);
double ceiling_gbps(const struct bench *b, bool to_host);

/* ---- the cycles (bench_cycles.c) ----------------------------------------- */

int cycle_run(struct bench *b, struct cycle *c);
struct derived derive(const struct bench *b, const struct cycle *c);
struct medians medians_compute(const struct bench *b);

/* ---- the report (bench_report.c) ----------------------------------------- */

/* The table (or the JSON with --json) on stdout, the JSON to --json-out. */
int results_write(const struct bench *b);

/* ---- the core's internals (bench_core.c) --------------------------------- */

/* The bench's own worker pool (pattern and checks), of threads threads. */
int core_workers_start(struct bench *b, unsigned threads);
void core_workers_stop(struct bench *b);
/* fn(ctx, i) for i in [0, count), over the bench's workers, all done. */
void core_parallel(struct bench *b, void (*fn)(void *ctx, size_t i), void *ctx, size_t count);
/* The backend's current device, and a device's mapping granularity and
 * memory. */
int core_current_device(struct bench *b);
int core_granularity(struct bench *b, int device, size_t *ret);
int core_device_memory(struct bench *b, int device, uint64_t *ret_free, uint64_t *ret_total);
/* The pattern buffer: pinned, bytes long, as the engine pins (b->pattern*). */
int core_pattern_alloc(struct bench *b, size_t bytes);
void core_pattern_free(struct bench *b);
/* Wait for the manager's background work (release mode's frees). */
void core_settle(struct bench *b);
void core_settings_read(const struct bench *b, struct core_settings *ret);

#endif
