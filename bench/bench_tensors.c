/* SPDX-License-Identifier: MIT */
/* dormant-bench's tensors: their sizes, the pattern they are filled with,
 * the fill and the check after the last wake. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"
#include "dormant-bench.h"

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

size_t slices_of(size_t words)
{
	return (words + PATTERN_SLICE_WORDS - 1) / PATTERN_SLICE_WORDS;
}

/* Write the pattern of bytes [offset, offset + len) of a tensor into the
 * pattern buffer (offset is a multiple of 8). */
static void pattern_generate(struct bench *b, uint64_t key, size_t offset, size_t len)
{
	struct pattern_job job = {
		.words = b->pattern_ptr, .count = (len + 7) / 8, .key = key, .base = offset / 8,
	};

	core_parallel(b, pattern_fill_slice, &job, slices_of(job.count));
}

/* Check bytes [offset, offset + len) of tensor t, read back into the pattern
 * buffer. Returns -1 (with a message) on the first difference. */
static int pattern_check(struct bench *b, size_t index, size_t offset, size_t len)
{
	const struct tensor *t = &b->tensors[index];
	bool zero = !t->keep;
	struct pattern_job job = {
		.words = b->pattern_ptr, .count = len / 8, .key = t->key, .base = offset / 8,
		.zero = zero, .bad = b->bad_slices,
	};
	size_t slices = slices_of(job.count);
	size_t first = SIZE_MAX, tail = len % 8;
	uint64_t expected, got = 0;

	core_parallel(b, pattern_check_slice, &job, slices);
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
		const unsigned char *bytes = (const unsigned char *)b->pattern_ptr + len - tail;

		expected = zero ? 0 : pattern_word(t->key, job.base + job.count);
		memcpy(&got, bytes, tail);
		if (memcmp(bytes, &expected, tail) != 0)
			return bench_fail("check failed: %s tensor %zu, last %zu bytes differ",
				    t->keep ? "kept" : "discarded", index, tail);
	}
	return 0;
}

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
int tensors_plan(struct bench *b)
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
void tensor_sizes(const struct bench *b, bool keep, double *ret_min, double *ret_median,
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

int tensors_allocate(struct bench *b)
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

int tensors_fill(struct bench *b)
{
	double start = now_monotonic_s();
	size_t piece = b->pattern_size;

	for (size_t i = 0; i < b->tensor_count; i++) {
		const struct tensor *t = &b->tensors[i];

		for (size_t off = 0; off < t->size; off += piece) {
			size_t len = MIN(piece, t->size - off);

			pattern_generate(b, t->key, off, len);
			if (dormant_copy_to_device(b->m, (char *)t->ptr + off, b->pattern_ptr, len) < 0)
				return bench_fail_lib("filling tensor %zu", i);
		}
	}
	b->fill_s = now_monotonic_s() - start;
	return 0;
}

int tensors_check(struct bench *b)
{
	double start = now_monotonic_s();
	size_t piece = b->pattern_size;

	for (size_t i = 0; i < b->tensor_count; i++) {
		const struct tensor *t = &b->tensors[i];

		for (size_t off = 0; off < t->size; off += piece) {
			size_t len = MIN(piece, t->size - off);

			if (dormant_copy_to_host(b->m, b->pattern_ptr, (char *)t->ptr + off, len) < 0)
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
int tensors_corrupt(struct bench *b)
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
