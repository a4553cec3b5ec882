/* SPDX-License-Identifier: MIT */
/*
 * dormant-verify-bench: what chunk checksums (issue 15) cost and save.
 *
 * Two KEEP tags in retain mode: "frozen" (never written after the fill, as a
 * LoRA base model or an RL reference model) and "trained" (a "step" writes a
 * word in every chunk of it between cycles, as an optimizer would). Each
 * cycle: step, sleep "trained" (changed: copied), sleep "frozen" (unchanged:
 * released without a copy), then wake "frozen" and "trained" one at a time,
 * with verification on in even cycles and off in odd ones. Reported, as
 * medians over the cycles after the first (which copies everything):
 *  - the device hash rate (dormant_debug_checksum() of all of "frozen"), and
 *    the same hash right after a wake without verification (memory the wake
 *    has just mapped and filled);
 *  - wake of "frozen" with verification on and off: the cost of verifying
 *    (the wake hashes each group of chunks while later ones copy: what is
 *    left is the last group's hash and one read-back of the hashes);
 *  - sleep of "frozen": how fast unchanged memory goes;
 *  - sleep of "trained": the changed part's copy rate.
 * After the last wake both tags must hold their data (the pattern, and the
 * steps' words); anything else fails the run.
 *
 * Usage: dormant-verify-bench [--backend B] [--frozen SIZE] [--trained SIZE]
 *        [--chunk SIZE] [--cycles N]
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dormant.h"
#include "common.h"

#define CYCLES_MAX 100
#define FILL_PIECE (64 * MiB)

struct options {
	const char *backend;
	size_t frozen, trained, chunk;
	unsigned cycles;
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int fail(const char *what)
{
	fprintf(stderr, "dormant-verify-bench: %s: %s\n", what, dormant_last_error());
	return 1;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double med(double *v, size_t n)
{
	if (n == 0)
		return NAN;
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static uint64_t word_of(uint64_t seed, size_t i)
{
	uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 1;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The fill of seed: the same FILL_PIECE of words in every piece, but for
 * its first word, which numbers the piece (cheap to make for 32 GiB). */
static uint64_t fill_word(uint64_t seed, size_t off)
{
	return off % FILL_PIECE == 0 ? word_of(seed + 7, off / FILL_PIECE)
				     : word_of(seed, off % FILL_PIECE / 8);
}

/* Fill [dev, dev + size) with the fill of seed, FILL_PIECE at a time. */
static int fill(struct dormant *m, char *dev, size_t size, uint64_t seed, uint64_t *buf)
{
	for (size_t i = 0; i < FILL_PIECE / 8; i++)
		buf[i] = word_of(seed, i);
	for (size_t at = 0; at < size; at += FILL_PIECE) {
		buf[0] = fill_word(seed, at);
		if (dormant_copy_to_device(m, dev + at, buf, MIN(FILL_PIECE, size - at)) < 0)
			return -1;
	}
	return 0;
}

/* The word a step writes at the start of every chunk of "trained". */
static uint64_t step_word(unsigned step, size_t chunk)
{
	return word_of(1000 + step, chunk);
}

static int step(struct dormant *m, char *dev, size_t size, size_t chunk, unsigned n)
{
	for (size_t at = 0; at < size; at += chunk) {
		uint64_t w = step_word(n, at / chunk);

		if (dormant_copy_to_device(m, dev + at, &w, sizeof(w)) < 0)
			return -1;
	}
	return 0;
}

static int check(struct dormant *m, char *dev, size_t size, uint64_t seed, size_t chunk,
		 int last_step, uint64_t *buf)
{
	for (size_t at = 0; at < size; at += FILL_PIECE) {
		size_t n = MIN(FILL_PIECE, size - at);

		if (dormant_copy_to_host(m, buf, dev + at, n) < 0)
			return -1;
		for (size_t i = 0; i < n / 8; i++) {
			size_t off = at + 8 * i;
			uint64_t want = last_step >= 0 && off % chunk == 0
						? step_word((unsigned)last_step, off / chunk)
						: fill_word(seed, off);

			if (buf[i] != want) {
				fprintf(stderr, "dormant-verify-bench: byte %zu differs after the "
						"last wake\n", off);
				return 1;
			}
		}
	}
	return 0;
}

static int transition(struct dormant *m, bool sleep, const char *tag, struct dormant_report *rep)
{
	const char *tags[] = { tag, NULL };
	int r = sleep ? dormant_sleep(m, tags, rep) : dormant_wake(m, tags, rep);

	if (r < 0)
		fprintf(stderr, "dormant-verify-bench: %s %s: %s\n", sleep ? "sleep" : "wake", tag,
			rep->error);
	return r;
}

static int parse(int argc, char **argv, struct options *o)
{
	static const struct option longs[] = {
		{ "backend", required_argument, NULL, 'b' },
		{ "frozen", required_argument, NULL, 'f' },
		{ "trained", required_argument, NULL, 't' },
		{ "chunk", required_argument, NULL, 'c' },
		{ "cycles", required_argument, NULL, 'n' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	*o = (struct options){ .backend = "auto", .frozen = 16 * GiB, .trained = 16 * GiB,
			       .chunk = 0, .cycles = 5 };
	while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		size_t *size = c == 'f' ? &o->frozen : c == 't' ? &o->trained : &o->chunk;
		char *end;

		switch (c) {
		case 'b':
			o->backend = optarg;
			break;
		case 'f':
		case 't':
		case 'c':
			if (size_parse(optarg, size) < 0 || (c != 'c' && *size % 8)) {
				fprintf(stderr, "dormant-verify-bench: bad size %s\n", optarg);
				return -1;
			}
			break;
		case 'n':
			o->cycles = (unsigned)strtoul(optarg, &end, 10);
			if (*end || o->cycles < 2 || o->cycles > CYCLES_MAX) {
				fprintf(stderr, "dormant-verify-bench: --cycles takes 2..%d\n",
					CYCLES_MAX);
				return -1;
			}
			break;
		default:
			fprintf(stderr, "usage: dormant-verify-bench [--backend B] [--frozen SIZE] "
					"[--trained SIZE] [--chunk SIZE] [--cycles N]\n");
			return -1;
		}
	}
	if (o->frozen == 0 || o->trained == 0) {
		fprintf(stderr, "dormant-verify-bench: --frozen and --trained must not be 0\n");
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct options o;
	struct dormant_options *mo = NULL;
	struct dormant *m = NULL;
	struct dormant_report rep;
	double wake_on[CYCLES_MAX], wake_off[CYCLES_MAX], frozen_sleep[CYCLES_MAX],
		trained_gbps[CYCLES_MAX], trained_sleep[CYCLES_MAX], fresh_hash[CYCLES_MAX];
	size_t n_on = 0, n_off = 0, n = 0, n_fresh = 0;
	uint64_t unchanged = 0, copied_frozen = 0, verified = 0;
	char *frozen = NULL, *trained = NULL;
	uint64_t *buf = NULL, sum[2];
	size_t chunk;
	double t0, hash_s;
	int rc = 1;

	if (parse(argc, argv, &o) < 0)
		return 2;
	/* a flag left out (NULL, 0) leaves the option to its default */
	rc = dormant_options_new(&mo);
	if (rc == 0 && o.backend)
		rc = dormant_options_set(mo, "backend", o.backend);
	if (rc == 0)
		rc = dormant_options_set(mo, "host_mode", "retain");
	if (rc == 0 && o.chunk)
		rc = dormant_options_set_int(mo, "chunk_bytes", (long long)o.chunk);
	if (rc == 0)
		rc = dormant_new(mo, &m);
	dormant_options_destroy(mo);
	rc = rc < 0 ? fail("dormant_new") : 1;
	if (!m)
		return rc;
	buf = malloc(FILL_PIECE);
	if (!buf || dormant_alloc(m, "frozen", o.frozen, (void **)&frozen) < 0 ||
	    dormant_alloc(m, "trained", o.trained, (void **)&trained) < 0) {
		fail("allocating");
		goto out;
	}
	chunk = o.chunk ? o.chunk : GiB;
	if (fill(m, frozen, o.frozen, 1, buf) < 0 || fill(m, trained, o.trained, 2, buf) < 0) {
		fail("filling");
		goto out;
	}
	/* the kernel alone, over the whole frozen allocation (warm once) */
	if (dormant_debug_checksum(m, frozen, o.frozen, 0, sum) < 0) {
		fail("hashing");
		goto out;
	}
	t0 = now_s();
	dormant_debug_checksum(m, frozen, o.frozen, 0, sum);
	hash_s = now_s() - t0;

	for (unsigned c = 0; c < o.cycles; c++) {
		bool verify = c % 2 == 0;

		if (step(m, trained, o.trained, chunk, c) < 0) {
			fail("step");
			goto out;
		}
		dormant_set_verify(m, verify);
		if (transition(m, true, "trained", &rep) < 0)
			goto out;
		if (c > 0) {
			trained_sleep[n] = rep.duration_s;
			trained_gbps[n] = rep.copy_gbps;
		}
		if (transition(m, true, "frozen", &rep) < 0)
			goto out;
		if (c > 0) {
			frozen_sleep[n++] = rep.duration_s;
			unchanged += rep.bytes_unchanged;
			copied_frozen += rep.bytes_copied;
		}
		if (transition(m, false, "frozen", &rep) < 0)
			goto out;
		verified += rep.chunks_verified;
		if (c > 0) {
			if (verify)
				wake_on[n_on++] = rep.duration_s;
			else
				wake_off[n_off++] = rep.duration_s;
		}
		if (c > 0 && !verify) {
			/* the hash of memory the wake has just mapped and filled,
			 * as the wake's verification met it before it overlapped */
			t0 = now_s();
			if (dormant_debug_checksum(m, frozen, o.frozen, 0, sum) < 0) {
				fail("hashing");
				goto out;
			}
			fresh_hash[n_fresh++] = now_s() - t0;
		}
		if (transition(m, false, "trained", &rep) < 0)
			goto out;
		verified += rep.chunks_verified;
	}
	rc = check(m, frozen, o.frozen, 1, chunk, -1, buf);
	if (rc == 0)
		rc = check(m, trained, o.trained, 2, chunk, (int)o.cycles - 1, buf);
	if (rc < 0) {
		fail("reading back");
		rc = 1;
	}
	if (rc)
		goto out;

	{
		double on = med(wake_on, n_on), off = med(wake_off, n_off);
		double fs = med(frozen_sleep, n), ts = med(trained_sleep, n);
		double tg = med(trained_gbps, n);

		printf("backend %s, frozen %.2f GiB, trained %.2f GiB, %u cycles (retain mode)\n",
		       dormant_backend_name(m), (double)o.frozen / GiB, (double)o.trained / GiB,
		       o.cycles);
		printf("hash (device, %.2f GiB): %.2f ms, %.0f GB/s\n", (double)o.frozen / GiB,
		       hash_s * 1e3, (double)o.frozen / hash_s / 1e9);
		printf("hash after a wake (fresh mappings): %.2f ms (median of %zu)\n",
		       med(fresh_hash, n_fresh) * 1e3, n_fresh);
		printf("wake frozen, verify on:  %.1f ms (median of %zu)\n", on * 1e3, n_on);
		printf("wake frozen, verify off: %.1f ms (median of %zu)\n", off * 1e3, n_off);
		printf("verify cost: %.2f ms = %.2f %% of the wake\n", (on - off) * 1e3,
		       (on - off) / off * 100);
		printf("sleep frozen (unchanged): %.2f ms (median of %zu); %.2f GiB unchanged, "
		       "%llu bytes copied over the cycles\n",
		       fs * 1e3, n, (double)unchanged / GiB, (unsigned long long)copied_frozen);
		printf("sleep trained (changed): %.1f ms, copy %.1f GB/s (medians)\n", ts * 1e3, tg);
		printf("chunks verified: %llu; data after the last wake: exact\n",
		       (unsigned long long)verified);
	}
out:
	free(buf);
	dormant_destroy(m);
	return rc;
}
