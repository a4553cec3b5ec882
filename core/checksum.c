/* SPDX-License-Identifier: MIT */
/*
 * Chunk checksums (checksum.h) and what the transfer engine does with them
 * (verify.h): hash at sleep, verify after the wake's copies, skip what did
 * not change in retain mode.
 */
#include "checksum.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "manager.h"
#include "verify.h"

/* ---- the hash on the CPU ------------------------------------------------- */

static inline uint64_t load_le(const unsigned char *p, size_t n)
{
	uint64_t w = 0;

	for (size_t i = 0; i < n; i++)
		w |= (uint64_t)p[i] << (8 * i);
	return w;
}

struct checksum checksum_cpu(const void *p, size_t size, uint64_t offset)
{
	const unsigned char *bytes = p;
	uint64_t a0 = 0, a1 = 0, o = offset;
	size_t at = 0;

	for (; at + 8 <= size; at += 8, o += 8) {
		uint64_t w;

		memcpy(&w, bytes + at, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
		w = __builtin_bswap64(w);
#endif
		a0 += checksum_mix0(w ^ (o * CHECKSUM_P0 + CHECKSUM_S0));
		a1 += checksum_mix1(w ^ (o * CHECKSUM_P1 + CHECKSUM_S1));
	}
	if (at < size) {
		uint64_t w = load_le(bytes + at, size - at);

		a0 += checksum_mix0(w ^ (o * CHECKSUM_P0 + CHECKSUM_S0));
		a1 += checksum_mix1(w ^ (o * CHECKSUM_P1 + CHECKSUM_S1));
	}
	return (struct checksum){ .lane = { a0, a1 } };
}

uint64_t checksum_plan_signature(const struct copy_plan *plan)
{
	uint64_t h = checksum_mix0(plan->count ^ CHECKSUM_S0);

	for (size_t i = 0; i < plan->count; i++) {
		const struct copy_run *run = &plan->runs[i];

		h = checksum_mix1(h ^ run->offset);
		h = checksum_mix1(h ^ run->size);
		h = checksum_mix1(h ^ run->host_offset);
	}
	return checksum_mix0(h ^ plan->span);
}

/* ---- hashing a device's chunks ------------------------------------------- */

/* The items of device d that fit, and their runs as ranges. */
struct batch {
	struct xfer_item **items;
	struct checksum *sums; /* per item */
	struct checksum_range *ranges;
	struct checksum *range_sums;
	size_t count, range_count;
};

static void batch_finish(struct batch *bt)
{
	free(bt->items);
	free(bt->sums);
	free(bt->ranges);
	free(bt->range_sums);
	memset(bt, 0, sizeof(*bt));
}

static int batch_collect(struct batch *bt, struct xfer_item *items, size_t count, int d,
			 bool (*fits)(const struct xfer_item *))
{
	size_t n = 0, runs = 0;

	memset(bt, 0, sizeof(*bt));
	for (size_t i = 0; i < count; i++)
		if (items[i].alloc->device == d && fits(&items[i])) {
			n++;
			runs += items[i].chunk->plan.count;
		}
	if (n == 0)
		return 0;
	bt->items = malloc(n * sizeof(*bt->items));
	bt->sums = calloc(n, sizeof(*bt->sums));
	bt->ranges = malloc(runs * sizeof(*bt->ranges));
	bt->range_sums = calloc(runs, sizeof(*bt->range_sums));
	if (!bt->items || !bt->sums || !bt->ranges || !bt->range_sums) {
		batch_finish(bt);
		return error_set(-ENOMEM, "out of host memory");
	}
	for (size_t i = 0; i < count; i++) {
		struct chunk *c = items[i].chunk;

		if (items[i].alloc->device != d || !fits(&items[i]))
			continue;
		bt->items[bt->count++] = &items[i];
		for (size_t k = 0; k < c->plan.count; k++)
			bt->ranges[bt->range_count++] = (struct checksum_range){
				.ptr = c->va + c->plan.runs[k].offset,
				.size = c->plan.runs[k].size,
				.offset = c->plan.runs[k].offset,
			};
	}
	return 0;
}

/* Hash every range on the device (one launch), then sum them per item. */
static int batch_hash(struct engine *e, int d, struct batch *bt)
{
	struct backend *b = e->backend;
	size_t k = 0;
	int r;

	if (bt->range_count == 0)
		return 0;
	if (!b->ops->checksum)
		return error_set(-ENOTSUP, "the %s backend cannot hash", b->ops->name);
	r = b->ops->checksum(b, d, bt->ranges, bt->range_count, e->devices[d].stream,
			     bt->range_sums);
	if (r < 0)
		return error_prefix(r, "hashing %zu chunks on device %d", bt->count, d);
	for (size_t i = 0; i < bt->count; i++) {
		const struct chunk *c = bt->items[i]->chunk;

		bt->sums[i] = (struct checksum){ { 0, 0 } };
		for (size_t j = 0; j < c->plan.count; j++)
			checksum_add(&bt->sums[i], &bt->range_sums[k++]);
	}
	return 0;
}

/* A backend without the kernel (-ENOTSUP: a driver that cannot load its
 * PTX) hashes nothing: sleeps and wakes go on unverified, said once. */
static int unavailable(struct engine *e, int r)
{
	if (r != -ENOTSUP)
		return r;
	if (!atomic_exchange(&e->checksum_warned, true))
		log_write(&e->log, DORMANT_LOG_WARNING,
			  "chunks are neither verified nor skipped when unchanged: %s",
			  dormant_last_error());
	return 0;
}

/* ---- sleep --------------------------------------------------------------- */

static bool sleep_fits(const struct xfer_item *it)
{
	return xfer_is_keep(it) && it->chunk->mapped && it->chunk->plan.kept > 0;
}

int checksum_sleep(struct engine *e, int d, struct xfer_item *items, size_t count,
		   struct xfer_totals *t)
{
	bool skip = e->mode == DORMANT_HOST_RETAIN && e->skip_unchanged;
	struct batch bt;
	int r;

	for (size_t i = 0; i < count; i++)
		if (items[i].alloc->device == d && sleep_fits(&items[i]))
			items[i].chunk->sum_valid = false;
	if (!atomic_load(&e->verify) && !skip)
		return 0;
	r = batch_collect(&bt, items, count, d, sleep_fits);
	if (r < 0)
		return r;
	r = batch_hash(e, d, &bt);
	if (r < 0) {
		/* what was retained is still what its chunk had at the wake,
		 * but nothing vouches for the device now: copy everything */
		for (size_t i = 0; i < bt.count; i++)
			bt.items[i]->chunk->retained = false;
		batch_finish(&bt);
		return unavailable(e, r);
	}
	for (size_t i = 0; i < bt.count; i++) {
		struct xfer_item *it = bt.items[i];
		struct chunk *c = it->chunk;
		uint64_t layout = checksum_plan_signature(&c->plan);

		if (skip && c->retained && c->host.ptr && c->sum_layout == layout &&
		    checksum_equal(&c->sum, &bt.sums[i])) {
			/* the host copy holds these very bytes: no copy */
			r = engine_chunk_release(e, it->alloc, c);
			if (r < 0)
				break;
			c->host_valid = true;
			c->sum_valid = true;
			it->change->bytes_released += c->size;
			t->released += c->size;
			it->change->bytes_skipped += c->plan.skipped;
			t->skipped += c->plan.skipped;
			it->change->bytes_unchanged += c->plan.kept;
			t->unchanged += c->plan.kept;
			continue;
		}
		c->retained = false;
		c->sum = bt.sums[i];
		c->sum_layout = layout;
		c->sum_valid = true;
	}
	batch_finish(&bt);
	return r;
}

/* ---- wake ---------------------------------------------------------------- */

static bool wake_fits(const struct xfer_item *it)
{
	const struct chunk *c = it->chunk;

	return it->mapped_here && xfer_is_keep(it) && c->host_valid && c->sum_valid &&
	       c->plan.kept > 0;
}

/* Say why the first mismatching chunk differs: its host copy hashes as the
 * device does now (the host copy changed after the sleep), or the device's
 * bytes differ from their host copy (the copy to the device went wrong). */
static int mismatch_error(struct engine *e, struct xfer_item *it, const struct checksum *device)
{
	struct chunk *c = it->chunk;
	size_t offset = c->va - (uintptr_t)it->alloc->ptr;
	struct checksum host = { { 0, 0 } };

	for (size_t k = 0; k < c->plan.count; k++) {
		const struct copy_run *run = &c->plan.runs[k];
		struct checksum part = checksum_cpu((const char *)c->host.ptr + run->host_offset,
						    run->size, run->offset);

		checksum_add(&host, &part);
	}
	return error_set(-EIO,
			 "checksum mismatch after the restore of tag '%s', allocation %p, chunk at "
			 "offset %zu (%zu bytes kept of %zu): %s; the tag stays asleep with its host "
			 "copy",
			 it->tag->name, it->alloc->ptr, offset, c->plan.kept, c->size,
			 checksum_equal(&host, device) ?
				 "the host copy changed after the sleep" :
				 "the bytes on the device differ from their host copy");
	(void)e;
}

int checksum_verify(struct engine *e, int d, struct xfer_item *items, size_t count,
		    struct xfer_totals *t)
{
	struct xfer_item *first = NULL;
	struct checksum first_sum = { { 0, 0 } };
	struct batch bt;
	int r;

	if (!atomic_load(&e->verify))
		return 0;
	r = batch_collect(&bt, items, count, d, wake_fits);
	if (r < 0)
		return r;
	r = batch_hash(e, d, &bt);
	if (r < 0) {
		batch_finish(&bt);
		return unavailable(e, r);
	}
	for (size_t i = 0; i < bt.count; i++) {
		struct xfer_item *it = bt.items[i];

		if (checksum_equal(&it->chunk->sum, &bt.sums[i])) {
			it->change->chunks_verified++;
			t->verified++;
			continue;
		}
		it->change->chunk_mismatches++;
		t->mismatches++;
		if (!first) {
			first = it;
			first_sum = bt.sums[i];
		}
	}
	r = first ? mismatch_error(e, first, &first_sum) : 0;
	batch_finish(&bt);
	return r;
}

void checksum_commit(struct engine *e, struct xfer_item *it)
{
	struct chunk *c = it->chunk;

	/* restored from a host copy that stays: what the next sleep compares */
	c->retained = e->mode == DORMANT_HOST_RETAIN && xfer_is_keep(it) && c->host_valid &&
		      c->sum_valid && c->host.ptr;
}
