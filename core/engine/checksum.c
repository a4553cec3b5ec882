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

#include "verify.h"

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
	struct engine_item **items;
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

static int batch_collect(struct batch *bt, struct engine_item *items, size_t count, int d,
			 bool (*fits)(const struct engine_item *))
{
	size_t n = 0, runs = 0;

	memset(bt, 0, sizeof(*bt));
	for (size_t i = 0; i < count; i++)
		if (items[i].owner.device == d && fits(&items[i])) {
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

		if (items[i].owner.device != d || !fits(&items[i]))
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
static int unavailable(struct engine *e, struct engine_totals *t, int r)
{
	if (r != -ENOTSUP)
		return r;
	if (!atomic_exchange(&e->checksum_warned, true))
		engine_warn(t, "chunks are neither verified nor skipped when unchanged: %s",
			    dormant_last_error());
	return 0;
}

/* ---- sleep --------------------------------------------------------------- */

static bool sleep_fits(const struct engine_item *it)
{
	return engine_item_keep(it) && it->chunk->mapped && it->chunk->plan.kept > 0;
}

int checksum_sleep(struct engine *e, int d, struct engine_item *items, size_t count,
		   struct engine_totals *t)
{
	bool skip = e->mode == DORMANT_HOST_RETAIN && e->skip_unchanged;
	struct batch bt;
	int r;

	for (size_t i = 0; i < count; i++)
		if (items[i].owner.device == d && sleep_fits(&items[i]))
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
		return unavailable(e, t, r);
	}
	for (size_t i = 0; i < bt.count; i++) {
		struct engine_item *it = bt.items[i];
		struct chunk *c = it->chunk;
		uint64_t layout = checksum_plan_signature(&c->plan);

		if (skip && c->retained && c->host.ptr && !engine_item_disk(it) &&
		    c->sum_layout == layout &&
		    checksum_equal(&c->sum, &bt.sums[i])) {
			/* the host copy holds these very bytes: no copy */
			r = engine_chunk_release(e, &it->owner, c, t);
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

/* A chunk of device d that the wake restores from its host copy (it maps
 * what is not mapped; with DORMANT_WAKE_OVERLAP=0 it has mapped it already)
 * and that has the hash of what that copy holds. */
static bool wake_fits_ahead(const struct engine_item *it, int d)
{
	const struct chunk *c = it->chunk;

	return it->owner.device == d && (it->mapped_here || !c->mapped) && engine_item_keep(it) &&
	       c->host_valid && c->sum_valid && c->plan.kept > 0;
}

/* Say why the first mismatching chunk differs: its host copy hashes as the
 * device does now (the host copy changed after the sleep), or the device's
 * bytes differ from their host copy (the copy to the device went wrong). */
static int mismatch_error(struct engine *e, struct engine_item *it, const struct checksum *device)
{
	struct chunk *c = it->chunk;
	size_t offset = c->va - (uintptr_t)it->owner.ptr;
	struct checksum host = { { 0, 0 } };
	bool disk = engine_item_disk(it);
	const char *why;

	if (disk) {
		if (diskfile_checksum(&c->disk, &c->plan, &host) < 0)
			host.lane[0] = ~device->lane[0]; /* unreadable: not the device's */
	} else {
		for (size_t k = 0; k < c->plan.count; k++) {
			const struct copy_run *run = &c->plan.runs[k];
			struct checksum part = checksum_cpu(
				(const char *)c->host.ptr + run->host_offset, run->size, run->offset);

			checksum_add(&host, &part);
		}
	}
	if (checksum_equal(&host, device))
		why = disk ? "the disk copy changed after the sleep (its file was corrupted)"
			   : "the host copy changed after the sleep";
	else
		why = disk ? "the bytes on the device differ from their disk copy"
			   : "the bytes on the device differ from their host copy";
	return error_set(-EIO,
			 "checksum mismatch after the restore of tag '%s', allocation %p, chunk at "
			 "offset %zu (%zu bytes kept of %zu): %s; the tag stays asleep with its %s "
			 "copy",
			 it->owner.tag, it->owner.ptr, offset, c->plan.kept, c->size, why,
			 disk ? "disk" : "host");
	(void)e;
}

/* A group closes once it holds this many bytes: one launch each, hashed
 * while the next group copies; the last group's hash is what the wake waits
 * for after its last copy. */
#define WAKE_GROUP_BYTES (64 * MiB)

static void wake_free(struct verify_wake *w)
{
	free(w->items);
	free(w->group_end);
	free(w->groups);
	free(w->ranges);
	w->items = NULL;
	w->group_end = w->groups = NULL;
	w->ranges = NULL;
	w->count = 0;
	w->active = false;
}

int checksum_wake_start(struct engine *e, int d, struct engine_item *items, size_t count,
			struct engine_totals *t, struct verify_wake *w)
{
	struct backend *b = e->backend;
	size_t runs = 0, bytes = 0;

	memset(w, 0, sizeof(*w));
	w->e = e;
	w->device = d;
	w->totals = t;
	if (!atomic_load(&e->verify))
		return 0;
	for (size_t i = 0; i < count; i++)
		if (wake_fits_ahead(&items[i], d)) {
			w->count++;
			runs += items[i].chunk->plan.count;
		}
	if (w->count == 0)
		return 0;
	if (!b->ops->checksum_start) {
		wake_free(w);
		return unavailable(e, t, error_set(-ENOTSUP, "the %s backend cannot hash",
						b->ops->name));
	}
	w->items = malloc(w->count * sizeof(*w->items));
	w->group_end = malloc(w->count * sizeof(*w->group_end));
	w->groups = calloc(w->count, sizeof(*w->groups));
	w->ranges = malloc(runs * sizeof(*w->ranges));
	if (!w->items || !w->group_end || !w->groups || !w->ranges) {
		wake_free(w);
		return error_set(-ENOMEM, "out of host memory");
	}
	w->count = 0;
	for (size_t i = 0; i < count; i++) {
		struct chunk *c = items[i].chunk;

		if (!wake_fits_ahead(&items[i], d))
			continue;
		w->items[w->count++] = &items[i];
		for (size_t k = 0; k < c->plan.count; k++)
			w->ranges[w->range_count++] = (struct checksum_range){
				.ptr = c->va + c->plan.runs[k].offset,
				.size = c->plan.runs[k].size,
				.offset = c->plan.runs[k].offset,
			};
		w->groups[w->group_count] += c->plan.count;
		bytes += c->plan.kept;
		if (bytes >= WAKE_GROUP_BYTES) {
			w->group_end[w->group_count++] = w->count;
			bytes = 0;
		}
	}
	/* the open group, if any */
	if (w->group_count == 0 || w->group_end[w->group_count - 1] != w->count)
		w->group_end[w->group_count++] = w->count;
	w->active = true;
	return 0;
}

/* The backend's job, made once the first group's copies are queued: its work
 * buffer is allocated and its range table uploaded while they run. */
static int wake_job(struct verify_wake *w)
{
	struct backend *b = w->e->backend;
	int r;

	r = b->ops->checksum_start(b, w->device, w->ranges, w->range_count, w->groups,
				   w->group_count, w->e->devices[w->device].hash_stream, &w->job);
	if (r == 0)
		return 0;
	w->job = NULL;
	error_prefix(r, "hashing %zu chunks on device %d", w->count, w->device);
	r = unavailable(w->e, w->totals, r);
	if (r == 0)
		wake_free(w); /* no kernel: unverified */
	return r;
}

int checksum_wake_chunk(struct verify_wake *w, struct engine_item *it, void *event)
{
	struct backend *b = w->e->backend;
	int r;

	if (!w->active || w->next == w->count || w->items[w->next] != it)
		return 0;
	w->next++;
	if (w->next < w->group_end[w->next_group])
		return 0;
	if (!w->job) {
		r = wake_job(w);
		if (r < 0 || !w->active)
			return r;
	}
	/* the group's last chunk: its copies, and every earlier one's, are
	 * before event on the copy stream */
	r = b->ops->checksum_queue(b, w->device, w->job, w->next_group, event);
	if (r < 0)
		return error_prefix(r, "hashing chunks on device %d", w->device);
	w->next_group++;
	return 0;
}

void checksum_wake_abort(struct verify_wake *w)
{
	if (w->job)
		(void)w->e->backend->ops->checksum_finish(w->e->backend, w->device, w->job, NULL);
	w->job = NULL;
	wake_free(w);
}

int checksum_wake_finish(struct verify_wake *w, struct engine_totals *t)
{
	struct engine *e = w->e;
	struct backend *b = e->backend;
	struct engine_item *first = NULL;
	struct checksum first_sum = { { 0, 0 } }, *sums = NULL;
	size_t k = 0;
	int r;

	if (!w->active) {
		wake_free(w);
		return 0;
	}
	if (!w->job || w->next_group != w->group_count) {
		checksum_wake_abort(w);
		return error_set(-EPROTO, "internal error: %zu of %zu chunk groups hashed on device %d",
				 w->next_group, w->group_count, w->device);
	}
	sums = malloc(MAX(w->range_count, (size_t)1) * sizeof(*sums));
	if (!sums) {
		checksum_wake_abort(w);
		return error_set(-ENOMEM, "out of host memory");
	}
	r = b->ops->checksum_finish(b, w->device, w->job, sums);
	w->job = NULL;
	if (r < 0) {
		error_prefix(r, "hashing %zu chunks on device %d", w->count, w->device);
		goto out;
	}
	for (size_t i = 0; i < w->count; i++) {
		struct engine_item *it = w->items[i];
		const struct chunk *c = it->chunk;
		struct checksum sum = { { 0, 0 } };

		for (size_t j = 0; j < c->plan.count; j++)
			checksum_add(&sum, &sums[k++]);
		if (checksum_equal(&c->sum, &sum)) {
			it->change->chunks_verified++;
			t->verified++;
			continue;
		}
		it->change->chunk_mismatches++;
		t->mismatches++;
		if (!first) {
			first = it;
			first_sum = sum;
		}
	}
	r = first ? mismatch_error(e, first, &first_sum) : 0;
out:
	free(sums);
	wake_free(w);
	return r;
}
