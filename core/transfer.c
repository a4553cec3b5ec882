/* SPDX-License-Identifier: MIT */
#include "transfer.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "manager.h"
#include "mapper.h"
#include "pipeline.h"
#include "prepare.h"
#include "staging.h"

/* ---- accounting ---------------------------------------------------------- */

void engine_account_device(struct engine *e, struct alloc *a, int64_t delta)
{
	atomic_fetch_add(&e->device_bytes[a->device], (uint64_t)delta);
	atomic_fetch_add(&a->tag->device_bytes, (uint64_t)delta);
}

void engine_account_host(struct tag *tag, int64_t delta)
{
	atomic_fetch_add(&tag->host_bytes, (uint64_t)delta);
}

/* ---- per-device resources ------------------------------------------------ */

void engine_init(struct engine *e, struct backend *b, struct workers *w,
		 const struct logger *log, enum dormant_host_mode mode, size_t staging_bytes,
		 size_t pin_piece, bool pin_host)
{
	memset(e, 0, sizeof(*e));
	e->backend = b;
	e->workers = w;
	e->log = *log;
	e->mode = mode;
	e->staging_bytes = staging_bytes;
	e->pin_piece = pin_piece;
	e->pin_host = pin_host;
}

static void device_finish(struct engine *e, int d)
{
	struct engine_device *ed = &e->devices[d];
	const struct backend_ops *ops = e->backend->ops;

	for (int i = 0; i < ENGINE_WINDOW; i++)
		if (ed->events[i])
			ops->event_destroy(e->backend, d, ed->events[i]);
	if (ed->zero_event)
		ops->event_destroy(e->backend, d, ed->zero_event);
	if (ed->zero_stream)
		ops->stream_destroy(e->backend, d, ed->zero_stream);
	if (ed->stream)
		ops->stream_destroy(e->backend, d, ed->stream);
	staging_finish(e, d);
	memset(ed, 0, sizeof(*ed));
}

void engine_finish(struct engine *e)
{
	for (int d = 0; d < DORMANT_DEVICES_MAX; d++)
		if (e->devices[d].ready || e->devices[d].stream)
			device_finish(e, d);
}

static int device_ready(struct engine *e, int d)
{
	struct engine_device *ed = &e->devices[d];
	const struct backend_ops *ops = e->backend->ops;
	int r;

	if (ed->ready)
		return 0;
	r = ops->stream_create(e->backend, d, &ed->stream);
	if (r < 0)
		goto err;
	r = ops->stream_create(e->backend, d, &ed->zero_stream);
	if (r < 0)
		goto err;
	r = ops->event_create(e->backend, d, &ed->zero_event);
	if (r < 0)
		goto err;
	for (int i = 0; i < ENGINE_WINDOW; i++) {
		r = ops->event_create(e->backend, d, &ed->events[i]);
		if (r < 0)
			goto err;
	}
	ed->ready = true;
	return 0;

err:
	device_finish(e, d);
	return error_prefix(r, "preparing streams on device %d", d);
}

/* ---- chunk release ------------------------------------------------------- */

int engine_chunk_release(struct engine *e, struct alloc *a, struct chunk *c)
{
	struct backend *b = e->backend;
	double start = now_monotonic_s();
	int r;

	r = b->ops->mem_unmap(b, a->device, c->va, c->size);
	if (r < 0) {
		engine_time_add(&e->release_ns, start);
		return error_prefix(r, "unmapping %zu bytes at %#lx", c->size, (unsigned long)c->va);
	}
	c->mapped = false;
	engine_account_device(e, a, -(int64_t)c->size);
	r = b->ops->mem_release(b, a->device, c->handle);
	engine_time_add(&e->release_ns, start);
	if (r < 0)
		log_write(&e->log, DORMANT_LOG_WARNING, "releasing physical memory: %s",
			  dormant_last_error());
	return 0;
}

struct deferred_free {
	struct backend *backend;
	struct hostbuf buffer;
	struct tag *tag;
};

static void deferred_free_run(void *arg)
{
	struct deferred_free *job = arg;
	size_t size = job->buffer.size;

	hostbuf_free(job->backend, &job->buffer);
	engine_account_host(job->tag, -(int64_t)size);
	free(job);
}

/* Give a host copy back; unmapping gigabytes takes a while, so it happens on
 * a worker thread and the host bytes fall when it is done. */
static void host_release(struct engine *e, struct tag *tag, struct chunk *c)
{
	struct deferred_free *job = malloc(sizeof(*job));

	c->host_valid = false;
	if (!job) {
		size_t size = c->host.size;

		hostbuf_free(e->backend, &c->host);
		engine_account_host(tag, -(int64_t)size);
		return;
	}
	job->backend = e->backend;
	job->buffer = c->host;
	job->tag = tag;
	memset(&c->host, 0, sizeof(c->host));
	workers_submit(e->workers, deferred_free_run, job);
}

void engine_chunk_drop(struct engine *e, struct alloc *a, struct chunk *c)
{
	if (c->mapped && engine_chunk_release(e, a, c) < 0)
		log_write(&e->log, DORMANT_LOG_ERROR, "freeing an allocation: %s",
			  dormant_last_error());
	if (c->host.ptr) {
		size_t size = c->host.size;

		hostbuf_free(e->backend, &c->host);
		engine_account_host(a->tag, -(int64_t)size);
	}
	c->host_valid = false;
}

/* The calls' times of one transition, from the engine's counters. */
struct time_marks {
	uint64_t release_ns, map_ns, host_prep_ns, host_pin_ns;
};

static void times_mark(struct engine *e, struct time_marks *m)
{
	m->release_ns = atomic_load(&e->release_ns);
	m->map_ns = atomic_load(&e->map_ns);
	m->host_prep_ns = atomic_load(&e->host_prep_ns);
	m->host_pin_ns = atomic_load(&e->host_pin_ns);
}

static void times_since(struct engine *e, const struct time_marks *m, struct xfer_totals *t)
{
	t->times.release_s = (double)(atomic_load(&e->release_ns) - m->release_ns) / 1e9;
	t->times.map_s = (double)(atomic_load(&e->map_ns) - m->map_ns) / 1e9;
	t->times.host_prep_s = (double)(atomic_load(&e->host_prep_ns) - m->host_prep_ns) / 1e9;
	t->times.host_pin_s = (double)(atomic_load(&e->host_pin_ns) - m->host_pin_ns) / 1e9;
	t->times.copy_s = t->copy_s;
}

/* ---- sleep --------------------------------------------------------------- */

/* Release the mapped chunks of one policy on device d (-1: every device). */
static int release_policy(struct engine *e, int d, enum dormant_policy policy,
			  struct xfer_item *items, size_t count, struct xfer_totals *t)
{
	for (size_t i = 0; i < count; i++) {
		struct xfer_item *it = &items[i];
		int r;

		if ((d >= 0 && it->alloc->device != d) || it->policy != policy ||
		    !it->chunk->mapped)
			continue;
		r = engine_chunk_release(e, it->alloc, it->chunk);
		if (r < 0)
			return r;
		it->change->bytes_released += it->chunk->size;
		t->released += it->chunk->size;
	}
	return 0;
}

static int sleep_device(struct engine *e, int d, struct xfer_item *items, size_t count,
			struct xfer_totals *t)
{
	struct pipeline p = { .e = e, .device = d, .ed = &e->devices[d], .to_host = true,
			      .totals = t };
	bool discards_done = false;
	struct prep prep;
	double start, wait;
	int r;

	r = device_ready(e, d);
	if (r < 0)
		return r;
	/* Every kernel that may still write this memory must be done. */
	start = now_monotonic_s();
	r = e->backend->ops->synchronize(e->backend, d);
	t->times.sync_s += now_monotonic_s() - start;
	if (r < 0)
		return error_prefix(r, "synchronizing device %d", d);

	start = now_monotonic_s();
	r = prep_start(&prep, e, d, items, count);
	if (r < 0) {
		prep_finish(&prep);
		return r;
	}
	for (size_t i = 0; i < count; i++) {
		struct xfer_item *it = &items[i];
		struct chunk *c = it->chunk;

		if (it->alloc->device != d || !xfer_is_keep(it) || !c->mapped)
			continue;
		if (c->plan.kept == 0) {
			/* a slab's free tail, or all marked unused: nothing to keep */
			r = engine_chunk_release(e, it->alloc, c);
			if (r < 0)
				goto err;
			it->change->bytes_released += c->size;
			t->released += c->size;
			it->change->bytes_skipped += c->plan.skipped;
			t->skipped += c->plan.skipped;
			/* a retained host copy would hold nothing now */
			if (c->host.ptr)
				host_release(e, it->tag, c);
			continue;
		}
		wait = now_monotonic_s();
		r = prep_wait(&prep, it);
		t->times.host_wait_s += now_monotonic_s() - wait;
		if (r < 0)
			goto err;
		if (!c->host.pin_piece) {
			r = staging_ready(e, d);
			if (r < 0)
				goto err;
		}
		r = pipeline_issue_chunk(&p, it);
		if (r < 0)
			goto err;
		/* The first copies are queued: release DISCARD memory while
		 * they run. */
		if (!discards_done) {
			r = release_policy(e, d, DORMANT_DISCARD, items, count, t);
			if (r < 0)
				goto err;
			discards_done = true;
		}
	}
	r = pipeline_drain(&p);
	if (r < 0)
		goto err;
	prep_finish(&prep);
	if (!discards_done) {
		r = release_policy(e, d, DORMANT_DISCARD, items, count, t);
		if (r < 0)
			return r;
	}
	t->copy_s += now_monotonic_s() - start;
	return 0;

err:
	prep_finish(&prep);
	pipeline_abort(&p);
	return r;
}

static int wake_items(struct engine *e, struct xfer_item *items, size_t count,
		      struct xfer_totals *t);

int engine_sleep(struct engine *e, struct xfer_item *items, size_t count, struct xfer_totals *t)
{
	char message[DORMANT_ERROR_MAX];
	struct xfer_totals undo = { 0 };
	struct time_marks marks;
	int r = 0, rr;

	memset(t, 0, sizeof(*t));
	times_mark(e, &marks);
	for (int d = 0; d < DORMANT_DEVICES_MAX && r == 0; d++) {
		bool any = false;

		for (size_t i = 0; i < count && !any; i++)
			any = items[i].alloc->device == d;
		if (any)
			r = sleep_device(e, d, items, count, t);
	}
	/* REBUILD memory goes last, once every copy is done: a sleep that
	 * fails before rolls back with it intact, and nothing is lost. */
	if (r == 0)
		r = release_policy(e, -1, DORMANT_REBUILD, items, count, t);
	times_since(e, &marks, t);
	if (r == 0)
		return 0;

	/* Roll back: what was released comes back, restored from the host. */
	snprintf(message, sizeof(message), "%s", dormant_last_error());
	log_write(&e->log, DORMANT_LOG_WARNING, "sleep failed, rolling back: %s", message);
	rr = wake_items(e, items, count, &undo);
	if (rr == 0)
		engine_wake_commit(e, items, count);
	if (rr < 0) {
		t->rollback_failed = true;
		log_write(&e->log, DORMANT_LOG_ERROR, "rollback failed: %s", dormant_last_error());
		error_set(r, "%s; rollback failed, the data stays on the host: %s", message,
			  dormant_last_error());
	} else {
		error_set(r, "%s", message);
	}
	/* Copies made for chunks that never left the device are not needed. */
	for (size_t i = 0; i < count; i++) {
		struct chunk *c = items[i].chunk;

		if (c->mapped) {
			c->host_valid = false;
			if (c->host.ptr && e->mode == DORMANT_HOST_RELEASE)
				host_release(e, items[i].tag, c);
		}
	}
	return r;
}

/* ---- wake ---------------------------------------------------------------- */

static void unmap_fresh(struct engine *e, struct xfer_item *items, size_t count,
			struct xfer_totals *t)
{
	for (size_t i = 0; i < count; i++) {
		struct xfer_item *it = &items[i];

		if (!it->mapped_here)
			continue;
		it->mapped_here = false;
		if (engine_chunk_release(e, it->alloc, it->chunk) < 0) {
			log_write(&e->log, DORMANT_LOG_ERROR, "undoing a wake: %s",
				  dormant_last_error());
			continue;
		}
		it->change->bytes_mapped -= it->chunk->size;
		t->mapped -= it->chunk->size;
	}
}

struct gap_fill {
	struct engine *e;
	int device;
	struct xfer_item *item;
	struct xfer_totals *totals;
};

/* Zero-fill a range of a chunk that its host copy does not hold. */
static int zero_gap(void *ctx, size_t offset, size_t size)
{
	struct gap_fill *g = ctx;
	struct engine_device *ed = &g->e->devices[g->device];
	int r;

	r = g->e->backend->ops->zero(g->e->backend, g->device, g->item->chunk->va + offset, size,
				     ed->zero_stream);
	if (r < 0)
		return error_prefix(r, "zero-filling %zu bytes on device %d", size, g->device);
	g->item->change->bytes_zeroed += size;
	g->totals->zeroed += size;
	return 0;
}

/* Map (through the mapper: ahead, on its thread), zero-fill and restore
 * device d's chunks of the wake, in items order. */
static int restore_device(struct engine *e, int d, struct xfer_item *items, size_t count,
			  struct xfer_totals *t)
{
	struct engine_device *ed = &e->devices[d];
	struct pipeline p = { .e = e, .device = d, .ed = ed, .to_host = false, .totals = t };
	const struct backend_ops *ops = e->backend->ops;
	struct mapper mp;
	double wait;
	int r;

	r = mapper_start(&mp, e, d, items, count);
	if (r < 0)
		goto err_mapper;
	for (size_t i = 0; i < count; i++) {
		struct xfer_item *it = &items[i];
		struct chunk *c = it->chunk;

		if (it->alloc->device != d)
			continue;
		r = mapper_wait(&mp, it);
		if (r < 0)
			goto err;
		if (!it->mapped_here)
			continue;
		if (xfer_is_keep(it) && c->host_valid) {
			/* what the host copy does not hold: marked, holes */
			struct gap_fill g = { .e = e, .device = d, .item = it, .totals = t };

			r = plan_for_each_gap(&c->plan, zero_gap, &g);
			if (r < 0)
				goto err;
			if (!c->host.pin_piece) {
				r = staging_ready(e, d);
				if (r < 0)
					goto err;
			}
			r = pipeline_issue_chunk(&p, it);
			if (r < 0)
				goto err;
			continue;
		}
		/* DISCARD memory, and KEEP memory that never had a copy. */
		r = ops->zero(e->backend, d, c->va, c->size, ed->zero_stream);
		if (r < 0) {
			error_prefix(r, "zero-filling %zu bytes on device %d", c->size, d);
			goto err;
		}
		it->change->bytes_zeroed += c->size;
		t->zeroed += c->size;
	}
	r = ops->event_record(e->backend, d, ed->zero_event, ed->zero_stream);
	if (r < 0)
		goto err;
	r = pipeline_drain(&p);
	if (r < 0)
		goto err_zero;
	wait = now_monotonic_s();
	r = ops->event_wait(e->backend, d, ed->zero_event);
	t->times.zero_wait_s += now_monotonic_s() - wait;
	mapper_finish(&mp, t);
	if (r < 0)
		return error_prefix(r, "zero-filling on device %d", d);
	return 0;

err:
	/* the zero-fill queued so far must be done before the memory goes */
	(void)ops->event_record(e->backend, d, ed->zero_event, ed->zero_stream);
err_zero:
	pipeline_abort(&p);
	(void)ops->event_wait(e->backend, d, ed->zero_event);
err_mapper:
	mapper_finish(&mp, t);
	return r;
}

/* Before a wake that maps ahead of its copies: a device that has less free
 * memory than the wake maps (another process still holds it) fails it at
 * once, before any copy, as the map-first order did. When the device cannot
 * tell, the mappings decide. */
static int room_check(struct engine *e, int d, struct xfer_item *items, size_t count)
{
	uint64_t need = 0, free_bytes, total;

	for (size_t i = 0; i < count; i++)
		if (items[i].alloc->device == d && !items[i].chunk->mapped)
			need += items[i].chunk->size;
	if (e->backend->ops->mem_info(e->backend, d, &free_bytes, &total) < 0)
		return 0;
	if (free_bytes >= need)
		return 0;
	return error_set(-ENOMEM,
			 "device %d has %llu bytes free and the wake maps %llu: another process "
			 "holds the memory (retry once it gives it back)",
			 d, (unsigned long long)free_bytes, (unsigned long long)need);
}

static int wake_items(struct engine *e, struct xfer_item *items, size_t count,
		      struct xfer_totals *t)
{
	bool devices[DORMANT_DEVICES_MAX] = { false };
	double start;
	int r;

	for (size_t i = 0; i < count; i++) {
		struct xfer_item *it = &items[i];
		int d = it->alloc->device;

		it->mapped_here = false;
		if (it->chunk->mapped)
			continue;
		r = device_ready(e, d);
		if (r < 0)
			goto err;
		devices[d] = true;
	}
	for (int d = 0; d < DORMANT_DEVICES_MAX && e->wake_overlap; d++) {
		if (!devices[d])
			continue;
		r = room_check(e, d, items, count);
		if (r < 0)
			goto err;
	}
	/* The order before the mapper (DORMANT_WAKE_OVERLAP=0): map everything
	 * first, so that a wake short of memory fails before any copy. With
	 * the mapper, the copies start at once; a wake short of memory fails
	 * at room_check(), or (memory taken meanwhile, fragmentation) at the
	 * first chunk that does not fit. The host copies stay intact either
	 * way. */
	for (size_t i = 0; i < count && !e->wake_overlap; i++) {
		struct xfer_item *it = &items[i];

		if (it->chunk->mapped)
			continue;
		r = mapper_map_one(e, it);
		if (r < 0)
			goto err;
		it->change->bytes_mapped += it->chunk->size;
		t->mapped += it->chunk->size;
	}

	start = now_monotonic_s();
	for (int d = 0; d < DORMANT_DEVICES_MAX; d++) {
		if (!devices[d])
			continue;
		r = restore_device(e, d, items, count, t);
		if (r < 0)
			goto err;
	}
	t->copy_s += now_monotonic_s() - start;
	return 0;

err:
	unmap_fresh(e, items, count, t);
	return r;
}

int engine_wake(struct engine *e, struct xfer_item *items, size_t count, struct xfer_totals *t)
{
	struct time_marks marks;
	int r;

	memset(t, 0, sizeof(*t));
	times_mark(e, &marks);
	r = wake_items(e, items, count, t);
	times_since(e, &marks, t);
	return r;
}

void engine_wake_commit(struct engine *e, struct xfer_item *items, size_t count)
{
	/* The data is on the device: host copies are no longer needed. */
	for (size_t i = 0; i < count; i++) {
		struct xfer_item *it = &items[i];
		struct chunk *c = it->chunk;

		if (!it->mapped_here)
			continue;
		c->host_valid = false;
		if (c->host.ptr && e->mode == DORMANT_HOST_RELEASE)
			host_release(e, it->tag, c);
	}
}

void engine_wake_undo(struct engine *e, struct xfer_item *items, size_t count,
		      struct xfer_totals *t)
{
	unmap_fresh(e, items, count, t);
}
