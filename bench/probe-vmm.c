/* SPDX-License-Identifier: MIT */
/*
 * probe-vmm: what the device's virtual memory calls cost, to tell how fast
 * discard-only sleep and wake can get.
 *
 * For each chunk size, SIZE bytes are created, mapped, zero-filled (one
 * memset per chunk, as the engine does), unmapped and released, each phase
 * timed on its own, with the chunks shared out over 1 or more threads.
 * Then the overlap probe: does unmap/release (or create/map) of one chunk
 * wait for a copy running on another stream? If it does, the engine's
 * "release each chunk as soon as its copy is done" serializes the pipeline.
 *
 * It drives the backend table directly (the same calls the engine makes), so
 * it runs on the host backend too, where the numbers mean nothing but the
 * code paths are exercised.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "benchutil.h"
#include "hostbuf.h"
#include "pinned.h"
#include "util.h"
#include "workers.h"

#define EXIT_USAGE 2
#ifndef DORMANT_VERSION
#define DORMANT_VERSION "unknown"
#endif
#define EXIT_SKIP 77
#define LIST_MAX 32
#define THREADS_MAX 64
#define REPS_MAX 20

enum phase { PHASE_CREATE, PHASE_MAP, PHASE_ZERO, PHASE_UNMAP, PHASE_RELEASE, PHASES,
	     PHASE_STOP };

static const char *const phase_names[PHASES] = { "create", "map", "zero", "unmap", "release" };

struct options {
	const char *backend;
	size_t size;
	size_t chunks[LIST_MAX];
	size_t chunk_count;
	unsigned threads[LIST_MAX];
	size_t thread_count;
	unsigned reps;
	size_t overlap;
	const char *label;
	bool json;
	const char *json_out;
};

struct row {
	size_t chunk;
	size_t count;
	unsigned threads;
	double phase_s[PHASES];    /* medians */
	double create_map_s;       /* median of create + map */
	double unmap_release_s;    /* median of unmap + release */
};

struct overlap {
	bool measured;
	size_t copy_bytes, chunk_bytes;
	double d2h_alone_s, h2d_alone_s;
	double unmap_idle_s, release_idle_s, create_idle_s, map_idle_s;
	double unmap_busy_s, release_busy_s, d2h_busy_s;
	double create_busy_s, map_busy_s, h2d_busy_s;
};

enum chunk_state { CHUNK_NONE, CHUNK_CREATED, CHUNK_MAPPED };

struct probe {
	struct options opt;
	struct backend *be;
	int device;
	size_t granularity;
	uintptr_t va;
	size_t va_size;
	uint64_t *handles;
	unsigned char *state;
	void *stream, *event;
	struct row rows[LIST_MAX * LIST_MAX];
	size_t row_count;
	struct overlap overlap;
};

/* A team of threads that run one phase together, over shares of the chunks. */
struct team {
	struct probe *p;
	unsigned threads;
	pthread_t ids[THREADS_MAX];
	unsigned started;
	pthread_barrier_t start, done;
	enum phase phase;
	size_t chunk, count;
	pthread_mutex_t lock;
	pthread_cond_t ready_cond;
	bool ready;
	int error;
	char message[DORMANT_ERROR_MAX];
};

struct member {
	struct team *team;
	unsigned index;
};

static struct member members[THREADS_MAX];

/* ---- options ------------------------------------------------------------- */

static void usage(FILE *f)
{
	fputs("usage: probe-vmm [options]\n"
	      "Time create, map, zero, unmap and release of device memory by chunk size and\n"
	      "thread count, and whether unmap or map waits for copies in flight.\n"
	      "\n"
	      "  --backend NAME    auto, cuda or host; default auto\n"
	      "  --size SIZE       bytes per measurement; default 16GiB\n"
	      "  --chunks LIST     chunk sizes, comma-separated; default 2MiB doubling up to SIZE\n"
	      "  --threads LIST    thread counts, comma-separated; default 1,4,8\n"
	      "  --reps N          repetitions (median); default 3\n"
	      "  --overlap SIZE    bytes copied in the overlap probe; 0 skips; default 4GiB\n"
	      "  --label NAME      name stored in the JSON\n"
	      "  --json            print one JSON object on stdout instead of the table\n"
	      "  --json-out FILE   also write that JSON object to FILE\n"
	      "  -h, --help        this text\n"
	      "  -V, --version     the version\n"
	      "Exit status: 0 done, 1 error, 2 bad usage, 77 skipped (not enough device memory).\n",
	      f);
}

/* Split a comma-separated list; each item goes to parse(). */
static int list_parse(const char *name, const char *text, size_t *ret_count,
		      int (*parse)(const char *item, size_t index, void *out), void *out)
{
	char buf[512], *save = NULL, *item;
	size_t n = 0;

	if (strlen(text) >= sizeof(buf))
		return bench_fail("%s is too long", name);
	snprintf(buf, sizeof(buf), "%s", text);
	for (item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
		if (n == LIST_MAX)
			return bench_fail("%s: at most %d items", name, LIST_MAX);
		if (parse(item, n, out) < 0)
			return bench_fail("%s: bad item '%s'", name, item);
		n++;
	}
	if (n == 0)
		return bench_fail("%s is empty", name);
	*ret_count = n;
	return 0;
}

static int chunk_item(const char *item, size_t index, void *out)
{
	size_t *chunks = out;

	return size_parse(item, &chunks[index]) < 0 || chunks[index] == 0 ? -1 : 0;
}

static int thread_item(const char *item, size_t index, void *out)
{
	unsigned *threads = out;
	unsigned long long n;

	if (number_parse(item, 1, THREADS_MAX, &n) < 0)
		return -1;
	threads[index] = (unsigned)n;
	return 0;
}

static int options_parse(int argc, char **argv, struct options *o)
{
	enum { OPT_BACKEND = 256, OPT_SIZE, OPT_CHUNKS, OPT_THREADS, OPT_REPS, OPT_OVERLAP,
	       OPT_LABEL, OPT_JSON, OPT_JSON_OUT, OPT_HELP };
	static const struct option longopts[] = {
		{ "backend", required_argument, NULL, OPT_BACKEND },
		{ "size", required_argument, NULL, OPT_SIZE },
		{ "chunks", required_argument, NULL, OPT_CHUNKS },
		{ "threads", required_argument, NULL, OPT_THREADS },
		{ "reps", required_argument, NULL, OPT_REPS },
		{ "overlap", required_argument, NULL, OPT_OVERLAP },
		{ "label", required_argument, NULL, OPT_LABEL },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "json-out", required_argument, NULL, OPT_JSON_OUT },
		{ "help", no_argument, NULL, OPT_HELP },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	const char *chunks = NULL, *threads = "1,4,8";
	unsigned long long n;
	int c;

	*o = (struct options){ .backend = "auto", .size = 16 * GiB, .reps = 3, .overlap = 4 * GiB };
	opterr = 0; /* bench_flag_error() says it in one line */
	while ((c = getopt_long(argc, argv, ":hV", longopts, NULL)) != -1) {
		switch (c) {
		case OPT_BACKEND:
			if (strcmp(optarg, "auto") && strcmp(optarg, "cuda") && strcmp(optarg, "host"))
				return bench_fail("--backend must be auto, cuda or host");
			o->backend = optarg;
			break;
		case OPT_SIZE:
			if (size_parse(optarg, &o->size) < 0 || o->size == 0)
				return bench_fail("--size: '%s' is not a size above 0", optarg);
			break;
		case OPT_CHUNKS:
			chunks = optarg;
			break;
		case OPT_THREADS:
			threads = optarg;
			break;
		case OPT_REPS:
			if (number_parse(optarg, 1, REPS_MAX, &n) < 0)
				return bench_fail("--reps must be 1 to %d", REPS_MAX);
			o->reps = (unsigned)n;
			break;
		case OPT_OVERLAP:
			if (size_parse(optarg, &o->overlap) < 0)
				return bench_fail("--overlap: '%s' is not a size", optarg);
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
		case OPT_HELP:
		case 'h':
			usage(stdout);
			exit(0);
		case 'V':
			printf("probe-vmm %s\n", DORMANT_VERSION);
			exit(0);
		default:
			return bench_flag_error(c, argv, longopts);
		}
	}
	if (optind < argc)
		return bench_fail("unexpected argument '%s'", argv[optind]);
	if (list_parse("--threads", threads, &o->thread_count, thread_item, o->threads) < 0)
		return -1;
	if (chunks)
		return list_parse("--chunks", chunks, &o->chunk_count, chunk_item, o->chunks);
	for (size_t chunk = 2 * MiB; chunk <= o->size && o->chunk_count < LIST_MAX; chunk *= 2)
		o->chunks[o->chunk_count++] = chunk;
	if (o->chunk_count == 0)
		o->chunks[o->chunk_count++] = o->size;
	return 0;
}

/* ---- the team ------------------------------------------------------------ */

static void team_error(struct team *t, int r)
{
	pthread_mutex_lock(&t->lock);
	if (t->error == 0) {
		t->error = r;
		snprintf(t->message, sizeof(t->message), "%s", dormant_last_error());
	}
	pthread_mutex_unlock(&t->lock);
}

/* Run the team's phase over member index's share of the chunks. */
static void phase_share(struct team *t, unsigned index)
{
	struct probe *p = t->p;
	struct backend *be = p->be;
	size_t lo = t->count * index / t->threads, hi = t->count * (index + 1) / t->threads;

	for (size_t k = lo; k < hi; k++) {
		uintptr_t va = p->va + k * t->chunk;
		int r = 0;

		switch (t->phase) {
		case PHASE_CREATE:
			r = be->ops->mem_create(be, p->device, t->chunk, &p->handles[k]);
			if (r == 0)
				p->state[k] = CHUNK_CREATED;
			break;
		case PHASE_MAP:
			r = be->ops->mem_map(be, p->device, va, t->chunk, p->handles[k]);
			if (r == 0)
				p->state[k] = CHUNK_MAPPED;
			break;
		case PHASE_UNMAP:
			r = be->ops->mem_unmap(be, p->device, va, t->chunk);
			if (r == 0)
				p->state[k] = CHUNK_CREATED;
			break;
		case PHASE_RELEASE:
			r = be->ops->mem_release(be, p->device, p->handles[k]);
			if (r == 0)
				p->state[k] = CHUNK_NONE;
			break;
		default:
			break;
		}
		if (r < 0) {
			team_error(t, r);
			return;
		}
	}
}

static void *member_main(void *arg)
{
	struct member *m = arg;
	struct team *t = m->team;

	/* The barriers exist once every member has started. */
	pthread_mutex_lock(&t->lock);
	while (!t->ready)
		pthread_cond_wait(&t->ready_cond, &t->lock);
	pthread_mutex_unlock(&t->lock);
	for (;;) {
		pthread_barrier_wait(&t->start);
		if (t->phase == PHASE_STOP)
			break;
		phase_share(t, m->index);
		pthread_barrier_wait(&t->done);
	}
	return NULL;
}

static void team_finish(struct team *t)
{
	if (t->started) {
		t->phase = PHASE_STOP;
		pthread_barrier_wait(&t->start);
		for (unsigned i = 0; i < t->started; i++)
			pthread_join(t->ids[i], NULL);
	}
	if (t->threads > 1) {
		pthread_barrier_destroy(&t->start);
		pthread_barrier_destroy(&t->done);
	}
	pthread_cond_destroy(&t->ready_cond);
	pthread_mutex_destroy(&t->lock);
}

static int team_start(struct team *t, struct probe *p, unsigned threads)
{
	unsigned wanted = threads;

	memset(t, 0, sizeof(*t));
	t->p = p;
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->ready_cond, NULL);
	for (unsigned i = 1; i < wanted; i++) {
		members[i] = (struct member){ .team = t, .index = i };
		if (pthread_create(&t->ids[t->started], NULL, member_main, &members[i]) != 0)
			break;
		t->started++;
	}
	t->threads = t->started + 1;
	if (t->threads > 1) {
		pthread_barrier_init(&t->start, NULL, t->threads);
		pthread_barrier_init(&t->done, NULL, t->threads);
	}
	pthread_mutex_lock(&t->lock);
	t->ready = true;
	pthread_cond_broadcast(&t->ready_cond);
	pthread_mutex_unlock(&t->lock);
	if (t->threads < wanted) {
		team_finish(t);
		return bench_fail("could start only %u of %u threads", t->threads, wanted);
	}
	return 0;
}

/* Zero-fill every mapped chunk with one memset each, on one stream. */
static int zero_chunks(struct probe *p, size_t chunk, size_t count)
{
	const struct backend_ops *ops = p->be->ops;
	int r = 0;

	for (size_t k = 0; k < count && r == 0; k++)
		r = ops->zero(p->be, p->device, p->va + k * chunk, chunk, p->stream);
	if (r == 0)
		r = ops->event_record(p->be, p->device, p->event, p->stream);
	if (r == 0)
		r = ops->event_wait(p->be, p->device, p->event);
	return r;
}

static int team_phase(struct team *t, enum phase phase, double *ret_s)
{
	double start = now_monotonic_s();
	int r;

	t->phase = phase;
	if (phase == PHASE_ZERO) {
		r = zero_chunks(t->p, t->chunk, t->count);
		*ret_s = now_monotonic_s() - start;
		return r < 0 ? bench_fail_lib("zero-filling %zu chunks", t->count) : 0;
	}
	if (t->threads > 1)
		pthread_barrier_wait(&t->start);
	phase_share(t, 0);
	if (t->threads > 1)
		pthread_barrier_wait(&t->done);
	*ret_s = now_monotonic_s() - start;
	if (t->error)
		return bench_fail("%s of %zu chunks of %zu bytes: %s", phase_names[phase], t->count,
			    t->chunk, t->message);
	return 0;
}

/* Give back whatever a failed phase left. */
static void chunks_cleanup(struct probe *p, size_t chunk, size_t count)
{
	for (size_t k = 0; k < count; k++) {
		if (p->state[k] == CHUNK_MAPPED)
			p->be->ops->mem_unmap(p->be, p->device, p->va + k * chunk, chunk);
		if (p->state[k] != CHUNK_NONE)
			p->be->ops->mem_release(p->be, p->device, p->handles[k]);
		p->state[k] = CHUNK_NONE;
	}
}

static int measure_row(struct probe *p, size_t chunk, unsigned threads, struct row *row)
{
	double times[PHASES][REPS_MAX], create_map[REPS_MAX], unmap_release[REPS_MAX];
	size_t count = p->opt.size / chunk;
	struct team team;
	int r = 0;

	if (team_start(&team, p, MIN(threads, (unsigned)MAX(count, (size_t)1))) < 0)
		return -1;
	team.chunk = chunk;
	team.count = count;
	for (unsigned rep = 0; rep < p->opt.reps && r == 0; rep++) {
		for (int ph = 0; ph < PHASES && r == 0; ph++)
			r = team_phase(&team, (enum phase)ph, &times[ph][rep]);
		create_map[rep] = times[PHASE_CREATE][rep] + times[PHASE_MAP][rep];
		unmap_release[rep] = times[PHASE_UNMAP][rep] + times[PHASE_RELEASE][rep];
	}
	team_finish(&team);
	if (r < 0) {
		chunks_cleanup(p, chunk, count);
		return r;
	}
	*row = (struct row){ .chunk = chunk, .count = count, .threads = team.threads };
	for (int ph = 0; ph < PHASES; ph++)
		row->phase_s[ph] = median(times[ph], p->opt.reps);
	row->create_map_s = median(create_map, p->opt.reps);
	row->unmap_release_s = median(unmap_release, p->opt.reps);
	return 0;
}

/* ---- overlap ------------------------------------------------------------- */

/* Queue a copy of bytes between the host buffer and va, in pinned pieces. */
static int copy_queue(struct probe *p, struct hostbuf *host, uintptr_t va, size_t bytes,
		      bool to_host)
{
	for (size_t off = 0; off < bytes; off += HOSTBUF_PIN_PIECE) {
		size_t len = MIN((size_t)HOSTBUF_PIN_PIECE, bytes - off);
		char *h = (char *)host->ptr + off;
		int r = to_host ? backend_copy_to_host(p->be, p->device, h, va + off, len, p->stream)
				: backend_copy_to_device(p->be, p->device, va + off, h, len,
							 p->stream);
		if (r < 0)
			return r;
	}
	return p->be->ops->event_record(p->be, p->device, p->event, p->stream);
}

static int copy_wait(struct probe *p)
{
	return p->be->ops->event_wait(p->be, p->device, p->event);
}

static double elapsed_s(double start)
{
	return now_monotonic_s() - start;
}

static int measure_overlap(struct probe *p, struct workers *w)
{
	struct overlap *o = &p->overlap;
	const struct backend_ops *ops = p->be->ops;
	struct backend *be = p->be;
	int d = p->device;
	size_t bytes = round_up(p->opt.overlap, p->granularity);
	size_t chunk = MIN(round_up(GiB, p->granularity), bytes);
	size_t count = bytes / chunk + 1; /* the copied range, then one chunk X */
	size_t copy_chunks = count - 1;
	uintptr_t x;
	uint64_t x_handle = 0;
	struct hostbuf host = { 0 };
	double start, t;
	int r;

	/* Memory: the copied range in count - 1 chunks, then chunk X, all in
	 * the probe's reserved range (it holds SIZE bytes). */
	if (bytes + chunk > p->va_size)
		return bench_fail("--overlap %zu bytes (+ one %zu-byte chunk) does not fit in --size",
			    p->opt.overlap, chunk);
	o->copy_bytes = bytes;
	o->chunk_bytes = chunk;
	for (size_t k = 0; k < copy_chunks; k++) {
		r = backend_mem_create_map(be, d, p->va + k * chunk, chunk, &p->handles[k]);
		if (r < 0) {
			bench_fail_lib("overlap: mapping the copied range");
			goto out;
		}
		p->state[k] = CHUNK_MAPPED;
	}
	x = p->va + copy_chunks * chunk;
	r = pinned_alloc(be, w, bytes, HOSTBUF_PIN_PIECE, &host);
	if (r < 0) {
		bench_fail_lib("overlap: allocating %zu bytes of pinned host memory", bytes);
		goto out;
	}
	/* Warm the copy path, then the copies alone. */
	r = copy_queue(p, &host, p->va, MIN(bytes, (size_t)HOSTBUF_PIN_PIECE), true);
	if (r == 0)
		r = copy_wait(p);
	start = now_monotonic_s();
	if (r == 0)
		r = copy_queue(p, &host, p->va, bytes, true);
	if (r == 0)
		r = copy_wait(p);
	o->d2h_alone_s = now_monotonic_s() - start;
	start = now_monotonic_s();
	if (r == 0)
		r = copy_queue(p, &host, p->va, bytes, false);
	if (r == 0)
		r = copy_wait(p);
	o->h2d_alone_s = now_monotonic_s() - start;
	if (r < 0) {
		bench_fail_lib("overlap: copying");
		goto out_host;
	}

	/* X with the device idle. */
	t = now_monotonic_s();
	r = ops->mem_create(be, d, chunk, &x_handle);
	o->create_idle_s = elapsed_s(t);
	if (r == 0) {
		t = now_monotonic_s();
		r = ops->mem_map(be, d, x, chunk, x_handle);
		o->map_idle_s = elapsed_s(t);
		if (r < 0)
			ops->mem_release(be, d, x_handle);
	}
	if (r == 0) {
		t = now_monotonic_s();
		r = ops->mem_unmap(be, d, x, chunk);
		o->unmap_idle_s = elapsed_s(t);
		t = now_monotonic_s();
		if (ops->mem_release(be, d, x_handle) < 0 && r == 0)
			r = -EIO;
		o->release_idle_s = elapsed_s(t);
	}
	if (r < 0) {
		bench_fail_lib("overlap: chunk operations on an idle device");
		goto out_host;
	}

	/* Sleep's case: unmap and release X while a copy to the host runs. */
	r = backend_mem_create_map(be, d, x, chunk, &x_handle);
	if (r < 0) {
		bench_fail_lib("overlap: mapping a chunk");
		goto out_host;
	}
	start = now_monotonic_s();
	r = copy_queue(p, &host, p->va, bytes, true);
	if (r < 0) {
		backend_mem_unmap_release(be, d, x, chunk, x_handle);
		bench_fail_lib("overlap: copying");
		goto out_host;
	}
	t = now_monotonic_s();
	r = ops->mem_unmap(be, d, x, chunk);
	o->unmap_busy_s = elapsed_s(t);
	t = now_monotonic_s();
	if (ops->mem_release(be, d, x_handle) < 0 && r == 0)
		r = -EIO;
	o->release_busy_s = elapsed_s(t);
	if (copy_wait(p) < 0 && r == 0)
		r = -EIO;
	o->d2h_busy_s = elapsed_s(start);
	if (r < 0) {
		bench_fail_lib("overlap: unmapping while copying");
		goto out_host;
	}

	/* Wake's case: create and map X while a copy to the device runs. */
	start = now_monotonic_s();
	r = copy_queue(p, &host, p->va, bytes, false);
	if (r < 0) {
		bench_fail_lib("overlap: copying");
		goto out_host;
	}
	t = now_monotonic_s();
	r = ops->mem_create(be, d, chunk, &x_handle);
	o->create_busy_s = elapsed_s(t);
	if (r == 0) {
		t = now_monotonic_s();
		r = ops->mem_map(be, d, x, chunk, x_handle);
		o->map_busy_s = elapsed_s(t);
		if (r < 0)
			ops->mem_release(be, d, x_handle);
	}
	if (copy_wait(p) < 0 && r == 0)
		r = -EIO;
	o->h2d_busy_s = elapsed_s(start);
	if (r == 0)
		backend_mem_unmap_release(be, d, x, chunk, x_handle);
	if (r < 0) {
		bench_fail_lib("overlap: mapping while copying");
		goto out_host;
	}
	o->measured = true;

out_host:
	hostbuf_free(be, &host);
out:
	chunks_cleanup(p, chunk, copy_chunks);
	return r < 0 ? -1 : 0;
}

/* ---- output -------------------------------------------------------------- */

static void table_print(const struct probe *p)
{
	const struct overlap *o = &p->overlap;
	char size[32], chunk[32];

	printf("probe-vmm%s%s: %s backend, %s per measurement, granularity %s, median of %u\n",
	       p->opt.label ? " " : "", p->opt.label ? p->opt.label : "", p->be->ops->name,
	       bytes_human(p->opt.size, size, sizeof(size)),
	       bytes_human(p->granularity, chunk, sizeof(chunk)), p->opt.reps);
	printf("\n%-10s %6s %3s %9s %9s %9s %9s %9s | %11s %14s\n", "chunk", "count", "thr",
	       "create", "map", "zero", "unmap", "release", "create+map", "unmap+release");
	for (size_t i = 0; i < p->row_count; i++) {
		const struct row *r = &p->rows[i];

		printf("%-10s %6zu %3u", bytes_human(r->chunk, chunk, sizeof(chunk)), r->count,
		       r->threads);
		for (int ph = 0; ph < PHASES; ph++)
			printf(" %9.3f", r->phase_s[ph] * 1e3);
		printf(" | %11.3f %14.3f\n", r->create_map_s * 1e3, r->unmap_release_s * 1e3);
	}
	printf("(milliseconds; zero: one memset per chunk on one stream; thr: threads sharing "
	       "the chunks)\n");
	if (!o->measured)
		return;
	printf("\noverlap: one %s chunk X beside copies of %s (ms)\n",
	       bytes_human(o->chunk_bytes, chunk, sizeof(chunk)),
	       bytes_human(o->copy_bytes, size, sizeof(size)));
	printf("  copy alone:        device->host %9.3f   host->device %9.3f\n",
	       o->d2h_alone_s * 1e3, o->h2d_alone_s * 1e3);
	printf("  X, device idle:    unmap %9.3f  release %9.3f  create %9.3f  map %9.3f\n",
	       o->unmap_idle_s * 1e3, o->release_idle_s * 1e3, o->create_idle_s * 1e3,
	       o->map_idle_s * 1e3);
	printf("  X during d->h:     unmap %9.3f  release %9.3f  (copy took %9.3f)\n",
	       o->unmap_busy_s * 1e3, o->release_busy_s * 1e3, o->d2h_busy_s * 1e3);
	printf("  X during h->d:     create %9.3f  map %9.3f      (copy took %9.3f)\n",
	       o->create_busy_s * 1e3, o->map_busy_s * 1e3, o->h2d_busy_s * 1e3);
	printf("  (an unmap or map close to the copy's time waits for the copy)\n");
}

static void json_write(const struct probe *p, FILE *f)
{
	const struct overlap *o = &p->overlap;
	struct json_out j;

	json_out_init(&j, f);
	json_out_object_begin(&j, NULL);
	json_out_string(&j, "tool", "probe-vmm");
	json_out_string(&j, "label", p->opt.label);
	json_out_object_begin(&j, "config");
	json_out_string(&j, "backend", p->be->ops->name);
	json_out_u64(&j, "size_bytes", p->opt.size);
	json_out_u64(&j, "reps", p->opt.reps);
	json_out_u64(&j, "granularity_bytes", p->granularity);
	json_out_i64(&j, "cpus", sysconf(_SC_NPROCESSORS_ONLN));
	json_out_object_end(&j);
	json_out_array_begin(&j, "rows");
	for (size_t i = 0; i < p->row_count; i++) {
		const struct row *r = &p->rows[i];

		json_out_object_begin(&j, NULL);
		json_out_u64(&j, "chunk_bytes", r->chunk);
		json_out_u64(&j, "chunks", r->count);
		json_out_u64(&j, "threads", r->threads);
		for (int ph = 0; ph < PHASES; ph++) {
			char key[32];

			snprintf(key, sizeof(key), "%s_s", phase_names[ph]);
			json_out_double(&j, key, r->phase_s[ph]);
		}
		json_out_double(&j, "create_map_s", r->create_map_s);
		json_out_double(&j, "unmap_release_s", r->unmap_release_s);
		json_out_object_end(&j);
	}
	json_out_array_end(&j);
	if (o->measured) {
		json_out_object_begin(&j, "overlap");
		json_out_u64(&j, "copy_bytes", o->copy_bytes);
		json_out_u64(&j, "chunk_bytes", o->chunk_bytes);
		json_out_double(&j, "d2h_alone_s", o->d2h_alone_s);
		json_out_double(&j, "h2d_alone_s", o->h2d_alone_s);
		json_out_double(&j, "unmap_idle_s", o->unmap_idle_s);
		json_out_double(&j, "release_idle_s", o->release_idle_s);
		json_out_double(&j, "create_idle_s", o->create_idle_s);
		json_out_double(&j, "map_idle_s", o->map_idle_s);
		json_out_double(&j, "unmap_busy_s", o->unmap_busy_s);
		json_out_double(&j, "release_busy_s", o->release_busy_s);
		json_out_double(&j, "d2h_busy_s", o->d2h_busy_s);
		json_out_double(&j, "create_busy_s", o->create_busy_s);
		json_out_double(&j, "map_busy_s", o->map_busy_s);
		json_out_double(&j, "h2d_busy_s", o->h2d_busy_s);
		json_out_object_end(&j);
	} else {
		json_out_null(&j, "overlap");
	}
	json_out_object_end(&j);
	json_out_finish(&j);
}

/* ---- main ---------------------------------------------------------------- */

static int probe_run(struct probe *p, struct workers *w)
{
	const struct backend_ops *ops;
	struct backend_config config = { .name = p->opt.backend };
	uint64_t dev_free = 0, dev_total = 0;
	size_t max_count = 1;
	char need[32], have[32];
	FILE *f;
	int r;

	if (backend_new(&config, &p->be) < 0)
		return bench_fail_lib("starting the %s backend", p->opt.backend);
	ops = p->be->ops;
	p->device = ops->current_device(p->be);
	if (ops->granularity(p->be, p->device, &p->granularity) < 0)
		return bench_fail_lib("reading the granularity");
	p->va_size = round_up(p->opt.size, p->granularity);
	if (ops->mem_info(p->be, p->device, &dev_free, &dev_total) < 0)
		return bench_fail_lib("reading free device memory");
	if (p->va_size > dev_free) {
		fprintf(stderr, "probe-vmm: skipped: needs %s of device memory, %s free\n",
			bytes_human(p->va_size, need, sizeof(need)),
			bytes_human(dev_free, have, sizeof(have)));
		return EXIT_SKIP;
	}
	for (size_t i = 0; i < p->opt.chunk_count; i++) {
		p->opt.chunks[i] = round_up(p->opt.chunks[i], p->granularity);
		if (p->opt.chunks[i] > p->va_size)
			return bench_fail("chunk %zu is larger than --size", p->opt.chunks[i]);
		max_count = MAX(max_count, p->va_size / p->opt.chunks[i]);
	}
	max_count = MAX(max_count, p->va_size / MIN(round_up(GiB, p->granularity), p->va_size));
	p->handles = calloc(max_count + 1, sizeof(*p->handles));
	p->state = calloc(max_count + 1, 1);
	if (!p->handles || !p->state)
		return bench_fail("out of host memory");
	if (ops->va_reserve(p->be, p->device, p->va_size, p->granularity, &p->va) < 0)
		return bench_fail_lib("reserving %zu bytes of device addresses", p->va_size);
	if (ops->stream_create(p->be, p->device, &p->stream) < 0 ||
	    ops->event_create(p->be, p->device, &p->event) < 0)
		return bench_fail_lib("creating a stream and an event");
	p->opt.size = p->va_size;

	for (size_t c = 0; c < p->opt.chunk_count; c++) {
		size_t first = p->row_count, count = p->va_size / p->opt.chunks[c];

		for (size_t t = 0; t < p->opt.thread_count; t++) {
			unsigned threads = (unsigned)MIN((size_t)p->opt.threads[t], count);
			bool seen = false;

			/* More threads than chunks: the same as fewer threads. */
			for (size_t i = first; i < p->row_count && !seen; i++)
				seen = p->rows[i].threads == threads;
			if (seen)
				continue;
			r = measure_row(p, p->opt.chunks[c], threads, &p->rows[p->row_count]);
			if (r < 0)
				return r;
			p->row_count++;
		}
	}
	if (p->opt.overlap && measure_overlap(p, w) < 0)
		return -1;

	if (p->opt.json)
		json_write(p, stdout);
	else
		table_print(p);
	fflush(stdout);
	if (!p->opt.json_out)
		return 0;
	f = fopen(p->opt.json_out, "w");
	if (!f)
		return bench_fail("cannot write %s: %s", p->opt.json_out, strerror(errno));
	json_write(p, f);
	if (fclose(f) != 0)
		return bench_fail("writing %s: %s", p->opt.json_out, strerror(errno));
	return 0;
}

static void probe_finish(struct probe *p)
{
	if (!p->be)
		return;
	if (p->event)
		p->be->ops->event_destroy(p->be, p->device, p->event);
	if (p->stream)
		p->be->ops->stream_destroy(p->be, p->device, p->stream);
	if (p->va)
		p->be->ops->va_free(p->be, p->va, p->va_size);
	backend_destroy(p->be);
	free(p->handles);
	free(p->state);
}

int main(int argc, char **argv)
{
	struct probe *p = calloc(1, sizeof(*p));
	struct workers *w = NULL;
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	int r;

	bench_program = "probe-vmm";
	if (!p) {
		bench_fail("out of host memory");
		return 1;
	}
	if (options_parse(argc, argv, &p->opt) < 0) {
		free(p);
		return EXIT_USAGE;
	}
	r = workers_new((unsigned)MAX(1L, MIN(cpus, 16L)), &w);
	if (r < 0) {
		free(p);
		bench_fail("starting threads: %s", strerror(-r));
		return 1;
	}
	r = probe_run(p, w);
	probe_finish(p);
	workers_destroy(w);
	free(p);
	if (r == EXIT_SKIP)
		return EXIT_SKIP;
	return r < 0 ? 1 : 0;
}
