/* SPDX-License-Identifier: MIT */
/*
 * dormant-bench: how long a trainer's memory takes to sleep and wake, next to
 * the copy ceiling of the same device.
 *
 * One run: create a manager, measure the ceiling (plain pinned copies of the
 * kept bytes each way, in HOSTBUF_PIN_PIECE pieces, as the engine copies),
 * allocate the kept ("weights", DORMANT_KEEP) and discarded ("grads",
 * DORMANT_DISCARD) tensors, fill both with a pattern, then run the cycles:
 * sleep every tag, wake every tag, with GPU free bytes, host bytes held and
 * process CPU time recorded around each transition. After the last wake the
 * kept bytes must match the pattern and the discarded bytes must read zero;
 * anything else fails the run.
 *
 * With --devices N the same tensors are allocated on each of devices 0 to
 * N-1 (the sizes are per device) and every transition moves all of them:
 * the figures are the totals, the ceiling that of device 0 times N.
 *
 * It links the core statically and uses a few internals: the backend table
 * for the ceiling, the manager's worker pool to wait for background frees,
 * and a few of the manager's settings for the report. It never changes the
 * manager's state.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "backend.h"
#include "benchutil.h"
#include "dormant.h"
#include "hostbuf.h"
#include "manager.h"
#include "util.h"
#include "workers.h"

#define EXIT_USAGE 2
#ifndef DORMANT_VERSION
#define DORMANT_VERSION "unknown"
#endif
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

struct bench {
	struct options opt;
	struct dormant *m;
	struct workers *workers; /* the bench's own: pattern and checks */
	struct dormant_stats *stats;
	struct dormant_report *report;
	struct hostbuf pattern;  /* pinned: what fill and check copy through */
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

/* ---- errors -------------------------------------------------------------- */

static void log_to_stderr(enum dormant_log_level level, const char *message, void *userdata)
{
	static const char *const names[] = { "error", "warning", "info", "debug" };

	(void)userdata;
	fprintf(stderr, "libdormant %s: %s\n", names[level], message);
}

/* ---- options ------------------------------------------------------------- */

static void usage(FILE *f)
{
	fputs("usage: dormant-bench [options]\n"
	      "Measure sleep and wake of kept and discarded device memory against the\n"
	      "pinned copy ceiling of the same device.\n"
	      "\n"
	      "  --keep SIZE         bytes kept (copied to host on sleep); default 16GiB\n"
	      "  --discard SIZE      bytes discarded (zero-filled on wake); default 16GiB\n"
	      "  --tensors N         split the kept bytes into N allocations and the\n"
	      "                      discarded bytes into N more, of mixed sizes; default 1\n"
	      "  --cycles N          sleep+wake cycles, the first one cold; default 6\n"
	      "  --devices N         the same tensors on each of devices 0 to N-1 (sizes are\n"
	      "                      per device), all moved by each transition; default 1\n"
	      "  --backend NAME      auto, cuda or host; default auto\n"
	      "  --host-mode MODE    retain, release or reclaimable; default the library's\n"
	      "  --chunk SIZE        physical chunk size (chunk_bytes); default the library's\n"
	      "  --staging SIZE      pinned staging ring for host copies that stay unpinned\n"
	      "                      (pinning failed, or DORMANT_PIN_HOST=0); default the library's\n"
	      "  --copy-threads N    host threads that fault in host copies and do the host side\n"
	      "                      of staged copies; default the library's (CPUs, at most 16)\n"
	      "  --ceiling-reps N    repetitions of the ceiling copies (median); 0 skips; default 3\n"
	      "  --seed N            seed of the sizes and the pattern; default 1\n"
	      "  --label NAME        name of the run, stored in the JSON\n"
	      "  --json              print one JSON object on stdout instead of the table\n"
	      "  --json-out FILE     also write that JSON object to FILE\n"
	      "  --force             run even when the sizes do not seem to fit in memory\n"
	      "  --warm-up MODE      before the first sleep: off (the library's warm-up off:\n"
	      "                      the cold cycle sets everything up), call (dormant_warm_up()\n"
	      "                      after the fill) or wait (the library's background warm-up,\n"
	      "                      waited for); default off\n"
	      "  --verbose           the library's log on stderr\n"
	      "  --debug-corrupt     change one kept byte before the check (the run must fail)\n"
	      "  -h, --help          this text\n"
	      "  -V, --version       the version\n"
	      "SIZE: a number with an optional unit: K, M, G, T, KiB, MiB, GiB, TiB, KB, MB, GB.\n"
	      "Exit status: 0 done and verified, 1 error, 2 bad usage, 77 skipped (does not fit).\n",
	      f);
}

static int parse_size(const char *name, const char *text, size_t *ret)
{
	if (size_parse(text, ret) < 0) {
		fprintf(stderr, "dormant-bench: %s: %s\n", name, dormant_last_error());
		return -1;
	}
	return 0;
}

static int parse_number(const char *name, const char *text, unsigned long long min,
			unsigned long long max, unsigned long long *ret)
{
	if (number_parse(text, min, max, ret) < 0) {
		fprintf(stderr, "dormant-bench: %s must be a whole number from %llu to %llu, not '%s'\n",
			name, min, max, text);
		return -1;
	}
	return 0;
}

static int options_parse(int argc, char **argv, struct options *o)
{
	enum {
		OPT_KEEP = 256, OPT_DISCARD, OPT_TENSORS, OPT_CYCLES, OPT_BACKEND, OPT_HOST_MODE,
		OPT_CHUNK, OPT_STAGING, OPT_COPY_THREADS, OPT_CEILING_REPS, OPT_SEED, OPT_LABEL,
		OPT_JSON, OPT_JSON_OUT, OPT_FORCE, OPT_VERBOSE, OPT_DEBUG_CORRUPT, OPT_HELP,
		OPT_DEVICES, OPT_WARM_UP,
	};
	static const struct option longopts[] = {
		{ "keep", required_argument, NULL, OPT_KEEP },
		{ "discard", required_argument, NULL, OPT_DISCARD },
		{ "tensors", required_argument, NULL, OPT_TENSORS },
		{ "cycles", required_argument, NULL, OPT_CYCLES },
		{ "devices", required_argument, NULL, OPT_DEVICES },
		{ "backend", required_argument, NULL, OPT_BACKEND },
		{ "host-mode", required_argument, NULL, OPT_HOST_MODE },
		{ "chunk", required_argument, NULL, OPT_CHUNK },
		{ "staging", required_argument, NULL, OPT_STAGING },
		{ "copy-threads", required_argument, NULL, OPT_COPY_THREADS },
		{ "ceiling-reps", required_argument, NULL, OPT_CEILING_REPS },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "label", required_argument, NULL, OPT_LABEL },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "json-out", required_argument, NULL, OPT_JSON_OUT },
		{ "force", no_argument, NULL, OPT_FORCE },
		{ "verbose", no_argument, NULL, OPT_VERBOSE },
		{ "warm-up", required_argument, NULL, OPT_WARM_UP },
		{ "debug-corrupt", no_argument, NULL, OPT_DEBUG_CORRUPT },
		{ "help", no_argument, NULL, OPT_HELP },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	unsigned long long n;
	int c;

	*o = (struct options){
		.backend = "auto",
		.warm_up = "off",
		.host_mode = DORMANT_HOST_DEFAULT,
		.keep_bytes = 16 * GiB,
		.discard_bytes = 16 * GiB,
		.tensors = 1,
		.cycles = 6,
		.devices = 1,
		.ceiling_reps = 3,
		.seed = 1,
	};
	opterr = 0; /* bench_flag_error() says it in one line */
	while ((c = getopt_long(argc, argv, ":hV", longopts, NULL)) != -1) {
		switch (c) {
		case OPT_KEEP:
			if (parse_size("--keep", optarg, &o->keep_bytes) < 0)
				return -1;
			break;
		case OPT_DISCARD:
			if (parse_size("--discard", optarg, &o->discard_bytes) < 0)
				return -1;
			break;
		case OPT_TENSORS:
			if (parse_number("--tensors", optarg, 1, TENSORS_MAX, &n) < 0)
				return -1;
			o->tensors = (size_t)n;
			break;
		case OPT_CYCLES:
			if (parse_number("--cycles", optarg, 1, CYCLES_MAX, &n) < 0)
				return -1;
			o->cycles = (unsigned)n;
			break;
		case OPT_DEVICES:
			if (parse_number("--devices", optarg, 1, DORMANT_DEVICES_MAX, &n) < 0)
				return -1;
			o->devices = (unsigned)n;
			break;
		case OPT_BACKEND:
			if (strcmp(optarg, "auto") && strcmp(optarg, "cuda") && strcmp(optarg, "host")) {
				fprintf(stderr, "dormant-bench: --backend must be auto, cuda or host\n");
				return -1;
			}
			o->backend = optarg;
			break;
		case OPT_HOST_MODE:
			if (strcmp(optarg, "retain") == 0)
				o->host_mode = DORMANT_HOST_RETAIN;
			else if (strcmp(optarg, "release") == 0)
				o->host_mode = DORMANT_HOST_RELEASE;
			else if (strcmp(optarg, "reclaimable") == 0)
				o->host_mode = DORMANT_HOST_RECLAIMABLE;
			else {
				fprintf(stderr, "dormant-bench: --host-mode must be retain, release or "
						"reclaimable\n");
				return -1;
			}
			break;
		case OPT_CHUNK:
			if (parse_size("--chunk", optarg, &o->chunk_bytes) < 0)
				return -1;
			if (o->chunk_bytes == 0) {
				fprintf(stderr, "dormant-bench: --chunk must not be 0\n");
				return -1;
			}
			break;
		case OPT_STAGING:
			if (parse_size("--staging", optarg, &o->staging_bytes) < 0)
				return -1;
			break;
		case OPT_COPY_THREADS:
			if (parse_number("--copy-threads", optarg, 1, 256, &n) < 0)
				return -1;
			o->copy_threads = (unsigned)n;
			break;
		case OPT_CEILING_REPS:
			if (parse_number("--ceiling-reps", optarg, 0, CEILING_REPS_MAX, &n) < 0)
				return -1;
			o->ceiling_reps = (unsigned)n;
			break;
		case OPT_SEED:
			if (parse_number("--seed", optarg, 0, UINT64_MAX, &n) < 0)
				return -1;
			o->seed = n;
			break;
		case OPT_LABEL:
			o->label = optarg;
			break;
		case OPT_JSON:
			o->json = true;
			break;
		case OPT_JSON_OUT:
			o->json_out = optarg;
			break;
		case OPT_FORCE:
			o->force = true;
			break;
		case OPT_VERBOSE:
			o->verbose = true;
			break;
		case OPT_WARM_UP:
			if (strcmp(optarg, "off") && strcmp(optarg, "call") && strcmp(optarg, "wait")) {
				fprintf(stderr, "dormant-bench: --warm-up must be off, call or wait\n");
				return -1;
			}
			o->warm_up = optarg;
			break;
		case OPT_DEBUG_CORRUPT:
			o->debug_corrupt = true;
			break;
		case OPT_HELP:
		case 'h':
			usage(stdout);
			exit(0);
		case 'V':
			printf("dormant-bench %s\n", DORMANT_VERSION);
			exit(0);
		default:
			return bench_flag_error(c, argv, longopts);
		}
	}
	if (optind < argc) {
		fprintf(stderr, "dormant-bench: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	if (o->keep_bytes == 0 && o->discard_bytes == 0) {
		fprintf(stderr, "dormant-bench: --keep and --discard are both 0: nothing to measure\n");
		return -1;
	}
	if (o->debug_corrupt && o->keep_bytes == 0) {
		fprintf(stderr, "dormant-bench: --debug-corrupt needs kept bytes\n");
		return -1;
	}
	return 0;
}

/* ---- the pattern --------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The word at index of the tensor with this key: within one tensor no two
 * words are equal (each step is a bijection of index), and every tensor has
 * its own key, so a chunk restored at the wrong offset or from the wrong
 * tensor shows. */
static inline uint64_t pattern_word(uint64_t key, uint64_t index)
{
	uint64_t x = key ^ (index * 0x9e3779b97f4a7c15ull);

	x ^= x >> 32;
	x *= 0xd6e8feb86659fd93ull;
	x ^= x >> 32;
	return x;
}

struct pattern_job {
	uint64_t *words;
	size_t count;  /* words in the buffer */
	uint64_t key;
	uint64_t base; /* index of words[0] in its tensor */
	bool zero;     /* check: expect zero instead of the pattern */
	size_t *bad;   /* check: per slice, the first bad word or SIZE_MAX */
};

static void pattern_fill_slice(void *ctx, size_t slice)
{
	struct pattern_job *job = ctx;
	size_t start = slice * PATTERN_SLICE_WORDS;
	size_t end = MIN(start + PATTERN_SLICE_WORDS, job->count);

	for (size_t i = start; i < end; i++)
		job->words[i] = pattern_word(job->key, job->base + i);
}

static void pattern_check_slice(void *ctx, size_t slice)
{
	struct pattern_job *job = ctx;
	size_t start = slice * PATTERN_SLICE_WORDS;
	size_t end = MIN(start + PATTERN_SLICE_WORDS, job->count);

	job->bad[slice] = SIZE_MAX;
	for (size_t i = start; i < end; i++) {
		uint64_t expected = job->zero ? 0 : pattern_word(job->key, job->base + i);

		if (job->words[i] != expected) {
			job->bad[slice] = i;
			return;
		}
	}
}

static size_t slices_of(size_t words)
{
	return (words + PATTERN_SLICE_WORDS - 1) / PATTERN_SLICE_WORDS;
}

/* Write the pattern of bytes [offset, offset + len) of a tensor into the
 * pattern buffer (offset is a multiple of 8). */
static void pattern_generate(struct bench *b, uint64_t key, size_t offset, size_t len)
{
	struct pattern_job job = {
		.words = b->pattern.ptr, .count = (len + 7) / 8, .key = key, .base = offset / 8,
	};

	workers_parallel(b->workers, pattern_fill_slice, &job, slices_of(job.count));
}

/* Check bytes [offset, offset + len) of tensor t, read back into the pattern
 * buffer. Returns -1 (with a message) on the first difference. */
static int pattern_check(struct bench *b, size_t index, size_t offset, size_t len)
{
	const struct tensor *t = &b->tensors[index];
	bool zero = !t->keep;
	struct pattern_job job = {
		.words = b->pattern.ptr, .count = len / 8, .key = t->key, .base = offset / 8,
		.zero = zero, .bad = b->bad_slices,
	};
	size_t slices = slices_of(job.count);
	size_t first = SIZE_MAX, tail = len % 8;
	uint64_t expected, got = 0;

	workers_parallel(b->workers, pattern_check_slice, &job, slices);
	for (size_t s = 0; s < slices && first == SIZE_MAX; s++)
		first = b->bad_slices[s];
	if (first != SIZE_MAX) {
		expected = zero ? 0 : pattern_word(t->key, job.base + first);
		got = job.words[first];
		return bench_fail("check failed: %s tensor %zu (%zu bytes at %p), byte offset %zu holds "
			    "%016llx, expected %016llx%s",
			    t->keep ? "kept" : "discarded", index, t->size, t->ptr,
			    offset + first * 8, (unsigned long long)got,
			    (unsigned long long)expected,
			    zero ? " (discarded memory must be zero-filled on wake)" : "");
	}
	if (tail) {
		const unsigned char *bytes = (const unsigned char *)b->pattern.ptr + len - tail;

		expected = zero ? 0 : pattern_word(t->key, job.base + job.count);
		memcpy(&got, bytes, tail);
		if (memcmp(bytes, &expected, tail) != 0)
			return bench_fail("check failed: %s tensor %zu, last %zu bytes differ",
				    t->keep ? "kept" : "discarded", index, tail);
	}
	return 0;
}

/* ---- tensors ------------------------------------------------------------- */

/* Split total into count sizes; see TENSOR_LOG_MIN. */
static int sizes_split(size_t total, size_t count, uint64_t *rng, size_t *sizes)
{
	double *weights, sum = 0, prefix = 0;
	const double lo = log((double)TENSOR_LOG_MIN), hi = log((double)TENSOR_LOG_MAX);
	size_t previous = 0;

	if (total / TENSOR_ALIGN < count)
		return bench_fail("%zu bytes cannot be split into %zu tensors of at least %d bytes", total,
			    count, TENSOR_ALIGN);
	weights = malloc(count * sizeof(*weights));
	if (!weights)
		return bench_fail("out of host memory");
	for (size_t i = 0; i < count; i++) {
		double u = (double)(splitmix64(rng) >> 11) * 0x1.0p-53;

		weights[i] = exp(lo + u * (hi - lo));
		sum += weights[i];
	}
	/* Cut [0, total) at the weights' cumulative shares; every piece keeps
	 * at least TENSOR_ALIGN bytes, and the sum is exact by construction. */
	for (size_t i = 0; i + 1 < count; i++) {
		size_t cut, low = previous + TENSOR_ALIGN;
		size_t high = total - TENSOR_ALIGN * (count - 1 - i);

		prefix += weights[i];
		cut = (size_t)((double)total * (prefix / sum)) / TENSOR_ALIGN * TENSOR_ALIGN;
		cut = MIN(MAX(cut, low), high);
		sizes[i] = cut - previous;
		previous = cut;
	}
	sizes[count - 1] = total - previous;
	free(weights);
	return 0;
}

/* Decide every tensor's size and key; nothing is allocated yet. Kept and
 * discarded tensors alternate, as parameters and gradients do. */
static int tensors_plan(struct bench *b)
{
	const struct options *o = &b->opt;
	size_t n = o->tensors;
	size_t *keep = NULL, *discard = NULL;
	uint64_t rng = o->seed;
	int r = -1;

	b->keep_count = o->keep_bytes ? n * o->devices : 0;
	b->discard_count = o->discard_bytes ? n * o->devices : 0;
	b->tensors = calloc(b->keep_count + b->discard_count, sizeof(*b->tensors));
	keep = calloc(n, sizeof(*keep));
	discard = calloc(n, sizeof(*discard));
	if (!b->tensors || !keep || !discard) {
		bench_fail("out of host memory");
		goto out;
	}
	if (b->keep_count && sizes_split(o->keep_bytes, n, &rng, keep) < 0)
		goto out;
	if (b->discard_count && sizes_split(o->discard_bytes, n, &rng, discard) < 0)
		goto out;
	for (unsigned d = 0; d < o->devices; d++)
		for (size_t i = 0; i < n; i++) {
			if (b->keep_count) {
				struct tensor *t = &b->tensors[b->tensor_count++];

				t->size = keep[i];
				t->keep = true;
				t->device = o->devices > 1 ? (int)d : b->device;
				b->keep_reserved += round_up(t->size, b->granularity);
			}
			if (b->discard_count) {
				struct tensor *t = &b->tensors[b->tensor_count++];

				t->size = discard[i];
				t->keep = false;
				t->device = o->devices > 1 ? (int)d : b->device;
				b->discard_reserved += round_up(t->size, b->granularity);
			}
		}
	for (size_t i = 0; i < b->tensor_count; i++) {
		uint64_t state = o->seed ^ ((uint64_t)i << 1);

		b->tensors[i].key = splitmix64(&state);
	}
	r = 0;
out:
	free(keep);
	free(discard);
	return r;
}

/* Smallest, median and largest size of one policy's tensors. */
static void tensor_sizes(const struct bench *b, bool keep, double *ret_min, double *ret_median,
			 double *ret_max)
{
	size_t count = keep ? b->keep_count : b->discard_count, used = 0;
	double *sizes = calloc(MAX(count, (size_t)1), sizeof(*sizes));
	double lo = INFINITY, hi = 0;

	*ret_min = *ret_median = *ret_max = NAN;
	if (!sizes)
		return;
	for (size_t i = 0; i < b->tensor_count; i++) {
		if (b->tensors[i].keep != keep)
			continue;
		sizes[used++] = (double)b->tensors[i].size;
		lo = MIN(lo, (double)b->tensors[i].size);
		hi = MAX(hi, (double)b->tensors[i].size);
	}
	if (used) {
		*ret_median = median(sizes, used);
		*ret_min = lo;
		*ret_max = hi;
	}
	free(sizes);
}

static int tensors_allocate(struct bench *b)
{
	double start = now_monotonic_s();

	for (size_t i = 0; i < b->tensor_count; i++) {
		struct tensor *t = &b->tensors[i];

		if (dormant_alloc_on(b->m, t->keep ? KEEP_TAG : DISCARD_TAG, t->size, t->device,
				     &t->ptr) < 0)
			return bench_fail_lib("allocating tensor %zu of %zu (%zu bytes)", i + 1,
					b->tensor_count, t->size);
	}
	b->alloc_s = now_monotonic_s() - start;
	return 0;
}

static int tensors_fill(struct bench *b)
{
	double start = now_monotonic_s();
	size_t piece = b->pattern.size;

	for (size_t i = 0; i < b->tensor_count; i++) {
		const struct tensor *t = &b->tensors[i];

		for (size_t off = 0; off < t->size; off += piece) {
			size_t len = MIN(piece, t->size - off);

			pattern_generate(b, t->key, off, len);
			if (dormant_copy_to_device(b->m, (char *)t->ptr + off, b->pattern.ptr, len) < 0)
				return bench_fail_lib("filling tensor %zu", i);
		}
	}
	b->fill_s = now_monotonic_s() - start;
	return 0;
}

static int tensors_check(struct bench *b)
{
	double start = now_monotonic_s();
	size_t piece = b->pattern.size;

	for (size_t i = 0; i < b->tensor_count; i++) {
		const struct tensor *t = &b->tensors[i];

		for (size_t off = 0; off < t->size; off += piece) {
			size_t len = MIN(piece, t->size - off);

			if (dormant_copy_to_host(b->m, b->pattern.ptr, (char *)t->ptr + off, len) < 0)
				return bench_fail_lib("reading tensor %zu back", i);
			if (pattern_check(b, i, off, len) < 0)
				return -1;
		}
		if (t->keep)
			b->verified_keep_bytes += t->size;
		else
			b->verified_zero_bytes += t->size;
	}
	b->verify_s = now_monotonic_s() - start;
	return 0;
}

/* Flip one byte in the middle of the first kept tensor: proves the check. */
static int tensors_corrupt(struct bench *b)
{
	const struct tensor *t = &b->tensors[0];
	char *where = (char *)t->ptr + t->size / 2;
	unsigned char byte;

	if (dormant_copy_to_host(b->m, &byte, where, 1) < 0)
		return bench_fail_lib("reading a byte to corrupt");
	byte ^= 0x5a;
	if (dormant_copy_to_device(b->m, where, &byte, 1) < 0)
		return bench_fail_lib("corrupting a byte");
	fprintf(stderr, "dormant-bench: --debug-corrupt: changed the byte at %p\n", (void *)where);
	return 0;
}

/* ---- memory figures ------------------------------------------------------ */

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

/* "1.23 GiB", or "-" where unreadable; into buf (32 bytes). */
static const char *gib_or_none(uint64_t bytes, char *buf)
{
	if (bytes == UINT64_MAX)
		snprintf(buf, 32, "-");
	else
		snprintf(buf, 32, "%.2f GiB", (double)bytes / (double)GiB);
	return buf;
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

/* Skip (EXIT_SKIP) when the run cannot fit: the device must hold the tensors
 * (and, before them, the ceiling's buffer); the host must hold the kept bytes
 * (pinned in retain mode) and, on the host backend, the device's bytes too.
 * The pattern buffer is already allocated, so MemAvailable has counted it. */
static int fit_check(struct bench *b)
{
	const struct backend_ops *ops = b->m->backend->ops;
	uint64_t dev_free = 0, dev_total = 0, host_avail = host_mem_available();
	uint64_t host_total = host_mem_total();
	uint64_t dev_run = (b->keep_reserved + b->discard_reserved) / b->opt.devices;
	uint64_t dev_ceiling = b->opt.ceiling_reps ? round_up(b->opt.keep_bytes, b->granularity) : 0;
	uint64_t host_run = (uint64_t)b->opt.keep_bytes * b->opt.devices;
	uint64_t host_ceiling = b->opt.ceiling_reps ? b->opt.keep_bytes : 0;
	uint64_t dev_need, host_need, margin = host_total / 20;
	char need_text[32], have_text[32];

	if (dormant_host_mode(b->m) == DORMANT_HOST_RELEASE && b->opt.keep_bytes)
		host_run += b->m->engine.staging_bytes;
	if (b->host_backend) {
		host_run += dev_run * b->opt.devices;
		host_ceiling += dev_ceiling;
	}
	if (ops->mem_info(b->m->backend, b->device, &dev_free, &dev_total) < 0)
		return bench_fail_lib("reading device %d's free memory", b->device);
	b->device_total_bytes = dev_total;
	/* every device holds the same: the one with the least free decides */
	for (unsigned d = 1; d < b->opt.devices; d++) {
		uint64_t other_free = 0, other_total = 0;

		if (ops->mem_info(b->m->backend, (int)d, &other_free, &other_total) < 0)
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

/* ---- the ceiling ----------------------------------------------------------- */

/* One direction over the whole buffer, as one stream of piece-sized copies
 * (a copy must not cross a pinned piece), timed to the last one's event. */
static int ceiling_copy(struct backend *be, int d, const struct hostbuf *host, uintptr_t va,
			size_t bytes, bool to_host, void *stream, void *event, double *ret_s)
{
	double start = now_monotonic_s();
	int r;

	for (size_t off = 0; off < bytes; off += HOSTBUF_PIN_PIECE) {
		size_t len = MIN((size_t)HOSTBUF_PIN_PIECE, bytes - off);
		char *h = (char *)host->ptr + off;

		r = to_host ? backend_copy_to_host(be, d, h, va + off, len, stream)
			    : backend_copy_to_device(be, d, va + off, h, len, stream);
		if (r < 0)
			return r;
	}
	r = be->ops->event_record(be, d, event, stream);
	if (r == 0)
		r = be->ops->event_wait(be, d, event);
	if (r == 0)
		*ret_s = now_monotonic_s() - start;
	return r;
}

static int ceiling_measure(struct bench *b)
{
	struct ceiling *c = &b->ceiling;
	struct backend *be = b->m->backend;
	const struct backend_ops *ops = be->ops;
	int d = b->device;
	size_t bytes = b->opt.keep_bytes;
	size_t size = round_up(bytes, b->granularity);
	size_t chunk = MAX(MIN(round_up(GiB, b->granularity), size), (size_t)1);
	size_t count = (size + chunk - 1) / chunk, mapped = 0;
	struct hostbuf host = { 0 };
	uint64_t *handles;
	void *stream = NULL, *event = NULL;
	double start, ignored;
	uintptr_t va;
	int r = -1;

	c->bytes = bytes;
	c->reps = b->opt.ceiling_reps;
	if (bytes == 0 || c->reps == 0)
		return 0;
	handles = calloc(count, sizeof(*handles));
	if (!handles)
		return bench_fail("out of host memory");
	if (ops->va_reserve(be, d, size, b->granularity, &va) < 0) {
		bench_fail_lib("ceiling: reserving %zu bytes of device addresses", size);
		goto err_handles;
	}
	for (; mapped < count; mapped++) {
		size_t len = MIN(chunk, size - mapped * chunk);

		if (backend_mem_create_map(be, d, va + mapped * chunk, len, &handles[mapped]) < 0) {
			bench_fail_lib("ceiling: mapping %zu bytes of device memory", len);
			goto err_unmap;
		}
	}
	start = now_monotonic_s();
	if (pinned_alloc(be, b->workers, bytes, HOSTBUF_PIN_PIECE, &host) < 0) {
		bench_fail_lib("ceiling: allocating %zu bytes of pinned host memory", bytes);
		goto err_unmap;
	}
	c->pin_s = now_monotonic_s() - start;
	if (ops->stream_create(be, d, &stream) < 0 || ops->event_create(be, d, &event) < 0) {
		bench_fail_lib("ceiling: creating a stream and an event");
		goto err_host;
	}
	/* One piece each way first, so that nothing is paid for the first time
	 * inside the measurement. */
	if (ceiling_copy(be, d, &host, va, MIN(bytes, (size_t)HOSTBUF_PIN_PIECE), true, stream,
			 event, &ignored) < 0 ||
	    ceiling_copy(be, d, &host, va, MIN(bytes, (size_t)HOSTBUF_PIN_PIECE), false, stream,
			 event, &ignored) < 0) {
		bench_fail_lib("ceiling: copying");
		goto err_host;
	}
	for (unsigned rep = 0; rep < c->reps; rep++) {
		if (ceiling_copy(be, d, &host, va, bytes, true, stream, event, &c->d2h_s[rep]) < 0 ||
		    ceiling_copy(be, d, &host, va, bytes, false, stream, event, &c->h2d_s[rep]) < 0) {
			bench_fail_lib("ceiling: copying %zu bytes", bytes);
			goto err_host;
		}
	}
	c->d2h_median_s = median(c->d2h_s, c->reps);
	c->h2d_median_s = median(c->h2d_s, c->reps);
	c->measured = true;
	r = 0;

err_host:
	if (event)
		ops->event_destroy(be, d, event);
	if (stream)
		ops->stream_destroy(be, d, stream);
	start = now_monotonic_s();
	hostbuf_free(be, &host);
	c->unpin_s = now_monotonic_s() - start;
err_unmap:
	while (mapped--) {
		size_t len = MIN(chunk, size - mapped * chunk);

		backend_mem_unmap_release(be, d, va + mapped * chunk, len, handles[mapped]);
	}
	ops->va_free(be, va, size);
err_handles:
	free(handles);
	return r;
}

static double ceiling_gbps(const struct bench *b, bool to_host)
{
	const struct ceiling *c = &b->ceiling;

	if (!c->measured)
		return NAN;
	return (double)c->bytes / (to_host ? c->d2h_median_s : c->h2d_median_s) / 1e9;
}

/* ---- cycles -------------------------------------------------------------- */

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

static int cycle_run(struct bench *b, struct cycle *c)
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
	workers_drain(b->m->workers);
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

static struct derived derive(const struct bench *b, const struct cycle *c)
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

/* The per-cycle figures that get a median over the warm cycles. */
enum figure {
	FIG_SLEEP_S, FIG_WAKE_S, FIG_SLEEP_GBPS, FIG_WAKE_GBPS, FIG_SLEEP_RATIO, FIG_WAKE_RATIO,
	FIG_SLEEP_CPU_S, FIG_WAKE_CPU_S, FIG_RETURNED_PCT, FIG_HOST_ASLEEP, FIG_HOST_AWAKE,
	FIG_HOST_SETTLED, FIG_SETTLE_S, FIGURES,
};

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

/* Medians over the warm cycles (all but the first); NAN where none. */
struct medians {
	unsigned warm;
	double value[FIGURES];
};

static struct medians medians_compute(const struct bench *b)
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

/* ---- output -------------------------------------------------------------- */

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

	printf("dormant-bench%s%s: %s backend, %s mode, %s kept + %s discarded, %zu + %zu "
	       "tensors, %s chunks, %u cycles\n",
	       o->label ? " " : "", o->label ? o->label : "", dormant_backend_name(b->m),
	       dormant_host_mode_name(dormant_host_mode(b->m)),
	       bytes_human(o->keep_bytes, keep, sizeof(keep)),
	       bytes_human(o->discard_bytes, discard, sizeof(discard)), b->keep_count,
	       b->discard_count, bytes_human(b->m->chunk_bytes, chunk, sizeof(chunk)), o->cycles);
	if (dormant_host_mode(b->m) == DORMANT_HOST_RECLAIMABLE && b->m->engine.reclaim_pinned_max)
		printf("reclaimable_pinned_bytes: %s kept pinned while awake, at most\n",
		       bytes_human(b->m->engine.reclaim_pinned_max, text, sizeof(text)));
	if (o->devices > 1)
		printf("devices: %u, the sizes on each, driven %s\n", o->devices,
		       b->m->engine.serial_devices ? "one after another (DORMANT_PARALLEL_DEVICES=0)"
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
		       keep, (size_t)HOSTBUF_PIN_PIECE / MiB, b->ceiling.reps,
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
	struct utsname uts;
	struct json_out j;

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
	json_out_bool(&j, "parallel_devices", !b->m->engine.serial_devices);
	json_out_u64(&j, "chunk_bytes", b->m->chunk_bytes);
	json_out_u64(&j, "staging_bytes", b->m->engine.staging_bytes);
	json_out_u64(&j, "pin_piece_bytes", b->m->engine.pin_piece);
	json_out_u64(&j, "reclaimable_pinned_bytes", b->m->engine.reclaim_pinned_max);
	json_out_u64(&j, "copy_threads", workers_threads(b->m->workers));
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
		json_out_u64(&j, "piece_bytes", HOSTBUF_PIN_PIECE);
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

static int results_write(const struct bench *b)
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

/* ---- main ---------------------------------------------------------------- */

static int bench_setup(struct bench *b)
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
	r = workers_new((unsigned)MAX(1L, MIN(cpus, 16L)), &b->workers);
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
	b->device = b->m->backend->ops->current_device(b->m->backend);
	if (o->devices > 1) {
		int count = dormant_device_count(b->m);

		if (count < (int)o->devices) {
			fprintf(stderr, "dormant-bench: skipped: --devices %u, but the %s backend has %d\n",
				o->devices, dormant_backend_name(b->m), count);
			return EXIT_SKIP;
		}
		b->device = 0; /* the ceiling's and the granularity's */
	}
	if (b->m->backend->ops->granularity(b->m->backend, b->device, &b->granularity) < 0)
		return bench_fail_lib("reading the device's granularity");
	if (tensors_plan(b) < 0)
		return -1;
	for (size_t i = 0; i < b->tensor_count; i++)
		largest = MAX(largest, b->tensors[i].size);
	if (pinned_alloc(b->m->backend, b->workers, MIN(round_up(largest, 8), HOSTBUF_PIN_PIECE),
			 HOSTBUF_PIN_PIECE, &b->pattern) < 0)
		return bench_fail_lib("allocating the pattern buffer");
	b->bad_slices = calloc(slices_of(b->pattern.size / 8) + 1, sizeof(*b->bad_slices));
	if (!b->bad_slices)
		return bench_fail("out of host memory");
	return 0;
}

/* --warm-up: prepare the first sleep ahead (call), or wait for the library to
 * (wait: its background run once the allocations settled), timed. */
static int warm_up(struct bench *b)
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

static void bench_finish(struct bench *b)
{
	if (b->m) {
		hostbuf_free(b->m->backend, &b->pattern);
		dormant_destroy(b->m);
	}
	workers_destroy(b->workers);
	free(b->bad_slices);
	free(b->tensors);
	free(b->cycles);
	free(b->report);
	free(b->stats);
}

static int bench_run(struct bench *b)
{
	int r;

	r = bench_setup(b);
	if (r != 0)
		return r;
	r = fit_check(b);
	if (r != 0)
		return r;
	if (ceiling_measure(b) < 0 || tensors_allocate(b) < 0 || tensors_fill(b) < 0 ||
	    warm_up(b) < 0)
		return -1;
	for (unsigned i = 0; i < b->opt.cycles; i++) {
		if (cycle_run(b, &b->cycles[i]) < 0) {
			fprintf(stderr, "dormant-bench: in cycle %u of %u\n", i + 1, b->opt.cycles);
			return -1;
		}
		b->cycles_done++;
	}
	if (b->opt.debug_corrupt && tensors_corrupt(b) < 0)
		return -1;
	if (tensors_check(b) < 0)
		return -1;
	return results_write(b);
}

int main(int argc, char **argv)
{
	struct bench b = { 0 };
	int r;

	bench_program = "dormant-bench";
	/* The kept bytes stand for weights a trainer changes every step: retain
	 * mode must copy them, not skip them as unchanged (the frozen case is
	 * dormant-verify-bench's). Set it to 1 to see the skip here. */
	setenv("DORMANT_SKIP_UNCHANGED", "0", 0);
	if (options_parse(argc, argv, &b.opt) < 0)
		return EXIT_USAGE;
	r = bench_run(&b);
	bench_finish(&b);
	if (r == EXIT_SKIP)
		return EXIT_SKIP;
	return r < 0 ? 1 : 0;
}
