/* SPDX-License-Identifier: MIT */
#include "transfer.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "manager.h"

/* ---- accounting ---------------------------------------------------------- */

static void account_device(struct engine *e, struct alloc *a, int64_t delta)
{
	atomic_fetch_add(&e->device_bytes[a->device], (uint64_t)delta);
	atomic_fetch_add(&a->tag->device_bytes, (uint64_t)delta);
}

static void account_host(struct tag *tag, int64_t delta)
{
	atomic_fetch_add(&tag->host_bytes, (uint64_t)delta);
}

static bool is_keep(const struct xfer_item *it)
{
	return it->policy == DORMANT_KEEP;
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
	if (ed->staging.ptr) {
		atomic_fetch_sub(&e->staging_held, ed->staging.size);
		hostbuf_free(e->backend, &ed->staging);
	}
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

static int staging_ready(struct engine *e, int d)
{
	struct engine_device *ed = &e->devices[d];
	int r;

	if (ed->staging.ptr)
		return 0;
	r = hostbuf_alloc(e->backend, e->staging_bytes, &ed->staging);
	if (r < 0)
		return error_prefix(r, "allocating the staging ring");
	hostbuf_touch(e->workers, &ed->staging);
	r = hostbuf_pin(e->backend, &ed->staging, e->pin_piece);
	if (r < 0) {
		hostbuf_free(e->backend, &ed->staging);
		return error_prefix(r, "allocating the staging ring");
	}
	ed->slot_bytes = ed->staging.size / ENGINE_STAGING_SLOTS / 4096 * 4096;
	atomic_fetch_add(&e->staging_held, ed->staging.size);
	return 0;
}

/* ---- chunk release ------------------------------------------------------- */

static int chunk_release(struct engine *e, struct alloc *a, struct chunk *c)
{
	struct backend *b = e->backend;
	int r;

	r = b->ops->mem_unmap(b, a->device, c->va, c->size);
	if (r < 0)
		return error_prefix(r, "unmapping %zu bytes at %#lx", c->size, (unsigned long)c->va);
	c->mapped = false;
	account_device(e, a, -(int64_t)c->size);
	r = b->ops->mem_release(b, a->device, c->handle);
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
	account_host(job->tag, -(int64_t)size);
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
		account_host(tag, -(int64_t)size);
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
	if (c->mapped && chunk_release(e, a, c) < 0)
		log_write(&e->log, DORMANT_LOG_ERROR, "freeing an allocation: %s",
			  dormant_last_error());
	if (c->host.ptr) {
		size_t size = c->host.size;

		hostbuf_free(e->backend, &c->host);
		account_host(a->tag, -(int64_t)size);
	}
	c->host_valid = false;
}

/* ---- the copy pipeline --------------------------------------------------- */

struct flight {
	struct xfer_item *item;
	size_t host_offset, length;
	int slot;  /* staging slot, or -1 for a direct copy */
	bool last; /* last piece of its chunk */
};

struct pipeline {
	struct engine *e;
	int device;
	struct engine_device *ed;
	bool to_host;
	struct xfer_totals *totals;
	struct flight ring[ENGINE_WINDOW];
	unsigned head, count;
	bool slot_busy[ENGINE_STAGING_SLOTS];
};

static char *slot_ptr(struct pipeline *p, int slot)
{
	return (char *)p->ed->staging.ptr + (size_t)slot * p->ed->slot_bytes;
}

/* Wait for the oldest piece; finish its host side; on sleep, release its
 * chunk when it was the chunk's last piece. */
static int complete_oldest(struct pipeline *p)
{
	struct engine *e = p->e;
	struct flight f = p->ring[p->head];
	void *event = p->ed->events[p->head];
	int r;

	p->head = (p->head + 1) % ENGINE_WINDOW;
	p->count--;
	r = e->backend->ops->event_wait(e->backend, p->device, event);
	if (f.slot >= 0) {
		if (r == 0 && p->to_host)
			workers_memcpy(e->workers, (char *)f.item->chunk->host.ptr + f.host_offset,
				       slot_ptr(p, f.slot), f.length);
		p->slot_busy[f.slot] = false;
	}
	if (r < 0)
		return error_prefix(r, "waiting for a copy on device %d", p->device);
	if (p->to_host && f.last) {
		struct xfer_item *it = f.item;

		it->chunk->host_valid = true;
		r = chunk_release(e, it->alloc, it->chunk);
		if (r < 0)
			return r;
		it->change->bytes_released += it->chunk->size;
		p->totals->released += it->chunk->size;
		it->change->bytes_skipped += it->chunk->plan.skipped;
		p->totals->skipped += it->chunk->plan.skipped;
	}
	return 0;
}

/* Wait out everything in flight after a failure, keeping the first error. */
static void pipeline_abort(struct pipeline *p)
{
	while (p->count) {
		struct flight *f = &p->ring[p->head];

		f->last = false; /* release nothing on the way out */
		(void)p->e->backend->ops->event_wait(p->e->backend, p->device,
						     p->ed->events[p->head]);
		if (f->slot >= 0)
			p->slot_busy[f->slot] = false;
		p->head = (p->head + 1) % ENGINE_WINDOW;
		p->count--;
	}
}

static int pipeline_drain(struct pipeline *p)
{
	while (p->count) {
		int r = complete_oldest(p);
		if (r < 0)
			return r;
	}
	return 0;
}

static int free_slot(struct pipeline *p)
{
	for (;;) {
		for (int s = 0; s < ENGINE_STAGING_SLOTS; s++)
			if (!p->slot_busy[s])
				return s;
		int r = complete_oldest(p);
		if (r < 0)
			return r;
	}
}

/* Queue one piece of an item's copy, direct or through a staging slot. */
static int issue_piece(struct pipeline *p, struct xfer_item *it, size_t offset,
		       size_t host_offset, size_t length, bool last)
{
	struct engine *e = p->e;
	struct chunk *c = it->chunk;
	char *host = (char *)c->host.ptr + host_offset;
	uintptr_t dev = c->va + offset;
	unsigned index;
	int slot = -1, r;

	if (!c->host.pin_piece) {
		slot = free_slot(p);
		if (slot < 0)
			return slot;
	}
	while (p->count == ENGINE_WINDOW) {
		r = complete_oldest(p);
		if (r < 0)
			return r;
	}
	if (slot >= 0) {
		p->slot_busy[slot] = true;
		if (!p->to_host)
			workers_memcpy(e->workers, slot_ptr(p, slot), host, length);
		host = slot_ptr(p, slot);
	}
	index = (p->head + p->count) % ENGINE_WINDOW;
	if (p->to_host)
		r = backend_copy_to_host(e->backend, p->device, host, dev, length, p->ed->stream);
	else
		r = backend_copy_to_device(e->backend, p->device, dev, host, length, p->ed->stream);
	if (r == 0)
		r = e->backend->ops->event_record(e->backend, p->device, p->ed->events[index],
						  p->ed->stream);
	if (r < 0) {
		if (slot >= 0)
			p->slot_busy[slot] = false;
		return error_prefix(r, "copying %zu bytes %s device %d", length,
				    p->to_host ? "from" : "to", p->device);
	}
	p->ring[index] = (struct flight){ .item = it, .host_offset = host_offset,
					  .length = length, .slot = slot, .last = last };
	p->count++;
	it->change->bytes_copied += length;
	p->totals->copied += length;
	return 0;
}

/* Queue the runs of a chunk's plan (extent.h), each split where the host
 * side requires: one copy never spans two pinned pieces of the packed host
 * copy, nor more than a staging slot. */
static int issue_chunk(struct pipeline *p, struct xfer_item *it)
{
	struct chunk *c = it->chunk;
	const struct copy_plan *plan = &c->plan;
	size_t piece = c->host.pin_piece ? c->host.pin_piece : p->ed->slot_bytes;
	int r;

	for (size_t i = 0; i < plan->count; i++) {
		const struct copy_run *run = &plan->runs[i];

		for (size_t done = 0; done < run->size;) {
			size_t host = run->host_offset + done;
			size_t len = MIN(run->size - done, c->host.pin_piece ? piece - host % piece
									      : piece);

			done += len;
			r = issue_piece(p, it, run->offset + done - len, host, len,
					i + 1 == plan->count && done == run->size);
			if (r < 0)
				return r;
		}
	}
	return 0;
}

/* ---- host buffers for a sleep -------------------------------------------- */

/*
 * Host copies are pinned so that the copy engine moves them at full speed,
 * both ways. A fresh buffer must be faulted in (per-core work, spread over
 * the workers) and registered (a driver call that does not run in parallel
 * with itself); together they are the slow part of a first sleep. So two
 * threads run ahead of the copies: one faults in the buffers of the next
 * chunks, the other registers those already faulted in, and the copies of
 * earlier chunks run meanwhile. When registering fails, the copy stays in
 * ordinary memory and goes through the pinned staging ring instead.
 */
struct prep {
	struct engine *e;
	struct xfer_item **queue; /* items needing a buffer, in issue order */
	size_t count;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	size_t faulted; /* queue[0..faulted) are allocated and touched */
	size_t ready;   /* queue[0..ready) are pinned (or left unpinned) */
	size_t next;    /* the consumer's next queue entry */
	bool stop;
	int error;
	char message[DORMANT_ERROR_MAX];
	pthread_t fault_thread, pin_thread;
	bool fault_running, pin_running;
};

/* A buffer of the plan's size: a kept one (retain mode) serves while it is
 * large enough and not much larger (host memory stays near the live bytes). */
static bool needs_host_buffer(const struct engine *e, const struct chunk *c)
{
	size_t want = round_up(c->plan.kept, 4096);

	return !c->host.ptr || c->host.size < want ||
	       c->host.size - want > MAX(c->host.size / 4, HOSTBUF_SLACK_BYTES) ||
	       (e->pin_host && !c->host.pin_piece);
}

/* Stage one: a buffer of the right size, faulted in. */
static int host_fault_in(struct engine *e, struct xfer_item *it)
{
	struct chunk *c = it->chunk;
	int r;

	if (c->host.ptr) { /* grown since its last sleep, or left unpinned */
		size_t size = c->host.size;

		hostbuf_free(e->backend, &c->host);
		account_host(it->tag, -(int64_t)size);
	}
	r = hostbuf_alloc(e->backend, c->plan.kept, &c->host);
	if (r < 0)
		return r;
	account_host(it->tag, (int64_t)c->host.size);
	if (e->pin_host)
		hostbuf_touch(e->workers, &c->host);
	return 0;
}

/* Stage two: registered with the device, or left for the staging ring. */
static void host_pin(struct engine *e, struct xfer_item *it)
{
	if (e->pin_host && hostbuf_pin(e->backend, &it->chunk->host, e->pin_piece) < 0)
		log_write(&e->log, DORMANT_LOG_WARNING,
			  "host copy stays unpinned (copied through the staging ring): %s",
			  dormant_last_error());
}

static void prep_fail(struct prep *p, int r)
{
	if (!p->error) {
		p->error = r;
		snprintf(p->message, sizeof(p->message), "%s", dormant_last_error());
	}
	pthread_cond_broadcast(&p->cond);
}

static void *prep_fault_main(void *arg)
{
	struct prep *p = arg;

	for (size_t k = 0; k < p->count; k++) {
		int r;

		pthread_mutex_lock(&p->lock);
		if (p->stop || p->error) {
			pthread_mutex_unlock(&p->lock);
			break;
		}
		pthread_mutex_unlock(&p->lock);
		r = host_fault_in(p->e, p->queue[k]);
		pthread_mutex_lock(&p->lock);
		if (r < 0)
			prep_fail(p, r);
		else
			p->faulted = k + 1;
		pthread_cond_broadcast(&p->cond);
		pthread_mutex_unlock(&p->lock);
		if (r < 0)
			break;
	}
	return NULL;
}

static void *prep_pin_main(void *arg)
{
	struct prep *p = arg;

	for (size_t k = 0; k < p->count; k++) {
		pthread_mutex_lock(&p->lock);
		while (p->faulted <= k && !p->stop && !p->error)
			pthread_cond_wait(&p->cond, &p->lock);
		if (p->faulted <= k) {
			pthread_mutex_unlock(&p->lock);
			break;
		}
		pthread_mutex_unlock(&p->lock);
		host_pin(p->e, p->queue[k]);
		pthread_mutex_lock(&p->lock);
		p->ready = k + 1;
		pthread_cond_broadcast(&p->cond);
		pthread_mutex_unlock(&p->lock);
	}
	return NULL;
}

static int prep_start(struct prep *p, struct engine *e, int d, struct xfer_item *items,
		      size_t count)
{
	memset(p, 0, sizeof(*p));
	p->e = e;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	p->queue = malloc(MAX(count, (size_t)1) * sizeof(*p->queue));
	if (!p->queue)
		return error_set(-ENOMEM, "out of host memory");
	for (size_t i = 0; i < count; i++) {
		struct xfer_item *it = &items[i];

		if (it->alloc->device == d && is_keep(it) && it->chunk->mapped &&
		    it->chunk->plan.kept && needs_host_buffer(e, it->chunk))
			p->queue[p->count++] = it;
	}
	if (!p->count)
		return 0;
	/* Without both threads, prep_wait() prepares each buffer itself. */
	if (pthread_create(&p->fault_thread, NULL, prep_fault_main, p) != 0)
		return 0;
	p->fault_running = true;
	if (pthread_create(&p->pin_thread, NULL, prep_pin_main, p) == 0) {
		p->pin_running = true;
		return 0;
	}
	/* prep_wait() redoes whatever the fault thread got to */
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_mutex_unlock(&p->lock);
	pthread_join(p->fault_thread, NULL);
	p->fault_running = false;
	return 0;
}

/* Wait until it has its host buffer (the consumer takes the queue in order). */
static int prep_wait(struct prep *p, struct xfer_item *it)
{
	size_t k = p->next;
	int r = 0;

	if (k == p->count || p->queue[k] != it)
		return 0; /* its buffer was there already */
	p->next++;
	if (!p->pin_running) {
		r = host_fault_in(p->e, it);
		if (r == 0)
			host_pin(p->e, it);
		return r;
	}
	pthread_mutex_lock(&p->lock);
	while (p->ready <= k && !p->error)
		pthread_cond_wait(&p->cond, &p->lock);
	if (p->ready <= k)
		r = error_set(p->error, "%s", p->message);
	pthread_mutex_unlock(&p->lock);
	return r;
}

static void prep_finish(struct prep *p)
{
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	if (p->fault_running)
		pthread_join(p->fault_thread, NULL);
	if (p->pin_running)
		pthread_join(p->pin_thread, NULL);
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
	free(p->queue);
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
		r = chunk_release(e, it->alloc, it->chunk);
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
	double start;
	int r;

	r = device_ready(e, d);
	if (r < 0)
		return r;
	/* Every kernel that may still write this memory must be done. */
	r = e->backend->ops->synchronize(e->backend, d);
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

		if (it->alloc->device != d || !is_keep(it) || !c->mapped)
			continue;
		if (c->plan.kept == 0) {
			/* a slab's free tail, or all marked unused: nothing to keep */
			r = chunk_release(e, it->alloc, c);
			if (r < 0)
				goto err;
			it->change->bytes_released += c->size;
			t->released += c->size;
			it->change->bytes_skipped += c->plan.skipped;
			t->skipped += c->plan.skipped;
			continue;
		}
		r = prep_wait(&prep, it);
		if (r < 0)
			goto err;
		if (!c->host.pin_piece) {
			r = staging_ready(e, d);
			if (r < 0)
				goto err;
		}
		r = issue_chunk(&p, it);
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
	int r = 0, rr;

	memset(t, 0, sizeof(*t));
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
		if (chunk_release(e, it->alloc, it->chunk) < 0) {
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

static int restore_device(struct engine *e, int d, struct xfer_item *items, size_t count,
			  struct xfer_totals *t)
{
	struct engine_device *ed = &e->devices[d];
	struct pipeline p = { .e = e, .device = d, .ed = ed, .to_host = false, .totals = t };
	const struct backend_ops *ops = e->backend->ops;
	int r;

	for (size_t i = 0; i < count; i++) {
		struct xfer_item *it = &items[i];
		struct chunk *c = it->chunk;

		if (it->alloc->device != d || !it->mapped_here)
			continue;
		if (is_keep(it) && c->host_valid) {
			/* what the host copy does not hold: marked, holes */
			struct gap_fill g = { .e = e, .device = d, .item = it, .totals = t };

			r = plan_for_each_gap(&c->plan, zero_gap, &g);
			if (r < 0)
				return r;
			continue;
		}
		/* DISCARD memory, and KEEP memory that never had a copy. */
		r = ops->zero(e->backend, d, c->va, c->size, ed->zero_stream);
		if (r < 0)
			return error_prefix(r, "zero-filling %zu bytes on device %d", c->size, d);
		it->change->bytes_zeroed += c->size;
		t->zeroed += c->size;
	}
	r = ops->event_record(e->backend, d, ed->zero_event, ed->zero_stream);
	if (r < 0)
		return r;

	for (size_t i = 0; i < count; i++) {
		struct xfer_item *it = &items[i];

		if (it->alloc->device != d || !it->mapped_here || !is_keep(it) ||
		    !it->chunk->host_valid)
			continue;
		if (!it->chunk->host.pin_piece) {
			r = staging_ready(e, d);
			if (r < 0)
				goto err;
		}
		r = issue_chunk(&p, it);
		if (r < 0)
			goto err;
	}
	r = pipeline_drain(&p);
	if (r < 0)
		goto err;
	r = ops->event_wait(e->backend, d, ed->zero_event);
	if (r < 0)
		return error_prefix(r, "zero-filling on device %d", d);
	return 0;

err:
	pipeline_abort(&p);
	(void)ops->event_wait(e->backend, d, ed->zero_event);
	return r;
}

static int wake_items(struct engine *e, struct xfer_item *items, size_t count,
		      struct xfer_totals *t)
{
	bool devices[DORMANT_DEVICES_MAX] = { false };
	double start;
	int r;

	/* Map everything first: if memory is short, fail before any copy. */
	for (size_t i = 0; i < count; i++) {
		struct xfer_item *it = &items[i];
		struct chunk *c = it->chunk;
		int d = it->alloc->device;

		it->mapped_here = false;
		if (c->mapped)
			continue;
		r = device_ready(e, d);
		if (r < 0)
			goto err;
		r = backend_mem_create_map(e->backend, d, c->va, c->size, &c->handle);
		if (r < 0) {
			error_prefix(r, "mapping %zu bytes on device %d", c->size, d);
			goto err;
		}
		c->mapped = true;
		it->mapped_here = true;
		devices[d] = true;
		account_device(e, it->alloc, (int64_t)c->size);
		it->change->bytes_mapped += c->size;
		t->mapped += c->size;
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
	memset(t, 0, sizeof(*t));
	return wake_items(e, items, count, t);
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
