/* SPDX-License-Identifier: MIT */
#include "pipeline.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>

#include "staging.h"

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
	if (r < 0) {
		if (f.slot >= 0)
			p->slot_busy[f.slot] = false;
		return error_prefix(r, "waiting for a copy on device %d", p->device);
	}
	if (f.slot >= 0) {
		if (p->to_host && engine_item_disk(f.item))
			/* whole blocks: the slot's tail past length is padding */
			r = diskfile_write(e->backend, &f.item->chunk->disk,
					   staging_slot(p->ed, f.slot),
					   round_up(f.length, DISKFILE_ALIGN), f.host_offset);
		else if (p->to_host)
			workers_memcpy(e->workers, (char *)f.item->chunk->host.ptr + f.host_offset,
				       staging_slot(p->ed, f.slot), f.length);
		p->slot_busy[f.slot] = false;
		if (r < 0)
			return error_prefix(r, "tag '%s'", f.item->owner.tag);
	}
	if (p->to_host && f.last) {
		struct engine_item *it = f.item;

		it->chunk->host_valid = true;
		r = engine_chunk_release(e, &it->owner, it->chunk, p->totals);
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
void pipeline_abort(struct pipeline *p)
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

void *pipeline_last_event(const struct pipeline *p)
{
	return p->count ? p->ed->events[(p->head + p->count - 1) % ENGINE_WINDOW] : NULL;
}

int pipeline_drain(struct pipeline *p)
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

/* Queue the copy of one piece from host (a pinned piece of the host copy,
 * or the staging slot, busy, that holds it: slot >= 0). The slot is free
 * again when this fails. */
static int queue_copy(struct pipeline *p, struct engine_item *it, size_t offset,
		      size_t host_offset, size_t length, bool last, bool kernel, int slot,
		      char *host)
{
	struct engine *e = p->e;
	uintptr_t dev = it->chunk->va + offset;
	unsigned index;
	int r;

	while (p->count == ENGINE_WINDOW) {
		r = complete_oldest(p);
		if (r < 0) {
			if (slot >= 0)
				p->slot_busy[slot] = false;
			return r;
		}
	}
	index = (p->head + p->count) % ENGINE_WINDOW;
	if (p->to_host)
		r = backend_copy_to_host(e->backend, p->device, host, dev, length, p->ed->stream);
	else if (kernel)
		r = backend_copy_to_device_kernel(e->backend, p->device, dev, host, length,
						  p->ed->stream);
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
	if (p->wc && slot >= 0)
		p->wc->bytes_engine += length; /* staged: always the copy engines */
	it->change->bytes_copied += length;
	p->totals->copied += length;
	return 0;
}

/* Queue one piece of an item's copy, direct or through a staging slot
 * (a disk copy's pieces on wake go through issue_disk_runs() instead). */
static int issue_piece(struct pipeline *p, struct engine_item *it, size_t offset,
		       size_t host_offset, size_t length, bool last, bool kernel)
{
	struct engine *e = p->e;
	struct chunk *c = it->chunk;
	bool disk = engine_item_disk(it);
	char *host = disk ? NULL : (char *)c->host.ptr + host_offset;
	int slot = -1, r;

	if (disk || !c->host.pin_piece) {
		slot = free_slot(p);
		if (slot < 0)
			return slot;
		p->slot_busy[slot] = true;
		r = 0;
		if (!p->to_host && disk)
			r = diskfile_read(e->backend, &c->disk, staging_slot(p->ed, slot),
					  round_up(length, DISKFILE_ALIGN), host_offset);
		else if (!p->to_host)
			workers_memcpy(e->workers, staging_slot(p->ed, slot), host, length);
		if (r < 0) {
			p->slot_busy[slot] = false;
			return error_prefix(r, "tag '%s'", it->owner.tag);
		}
		host = staging_slot(p->ed, slot);
	}
	return queue_copy(p, it, offset, host_offset, length, last, kernel, slot, host);
}

/*
 * A wake's disk reads: up to DISK_READS_AHEAD pieces read at once on the
 * worker threads, each into a staging slot of its own, and a new read
 * started as soon as a slot is free again, so the disk always has work
 * queued; the thread that issues takes the reads back oldest first and
 * queues each one's copy to the device. Reads in batches that waited for
 * their slowest left the disk idle between them (issue 32).
 */
#define DISK_READS_AHEAD ENGINE_STAGING_SLOTS

struct disk_reads;

struct disk_read {
	struct disk_reads *owner;
	struct diskfile *file;
	void *buf;
	size_t size;
	uint64_t offset;
	/* the piece of the item, its copy queued once read */
	size_t dev_offset, host_offset, length;
	bool last;
	int slot;
	bool done; /* under owner->lock */
	int result;
	char error[DORMANT_ERROR_MAX]; /* the worker thread's message */
};

/* The reads in flight, oldest first. */
struct disk_reads {
	struct backend *backend;
	pthread_mutex_t lock;
	pthread_cond_t done;
	struct disk_read ring[DISK_READS_AHEAD];
	size_t head, count;
};

static void disk_read_one(void *arg)
{
	struct disk_read *d = arg;
	int r = diskfile_read(d->owner->backend, d->file, d->buf, d->size, d->offset);

	if (r < 0)
		snprintf(d->error, sizeof(d->error), "%s", dormant_last_error());
	pthread_mutex_lock(&d->owner->lock);
	d->result = r;
	d->done = true;
	pthread_cond_broadcast(&d->owner->done);
	pthread_mutex_unlock(&d->owner->lock);
}

/* Take the oldest read back once it is done. */
static struct disk_read disk_read_take(struct disk_reads *q)
{
	struct disk_read *d = &q->ring[q->head];
	struct disk_read out;

	pthread_mutex_lock(&q->lock);
	while (!d->done)
		pthread_cond_wait(&q->done, &q->lock);
	pthread_mutex_unlock(&q->lock);
	out = *d;
	q->head = (q->head + 1) % DISK_READS_AHEAD;
	q->count--;
	return out;
}

/* A wake's disk copy of an item: its runs in pieces of at most piece bytes. */
static int issue_disk_runs(struct pipeline *p, struct engine_item *it, size_t piece)
{
	const struct copy_plan *plan = &it->chunk->plan;
	struct disk_reads q = { .backend = p->e->backend };
	/* stream: one read at a time, in file order, the kernel's read-ahead
	 * ahead of it (cached: four, as direct) */
	size_t run = 0, done = 0, ahead = p->e->disk_read == ENGINE_DISK_STREAM ? 1 : DISK_READS_AHEAD;
	int r = 0;

	if (p->e->disk_read != ENGINE_DISK_DIRECT) {
		r = diskstore_read_cached(it->chunk->disk.store);
		if (r < 0)
			return error_prefix(r, "tag '%s'", it->owner.tag);
	}
	pthread_mutex_init(&q.lock, NULL);
	pthread_cond_init(&q.done, NULL);
	for (;;) {
		struct disk_read d;

		/* start reads while pieces and slots are left */
		while (r == 0 && run < plan->count && q.count < ahead) {
			const struct copy_run *cr = &plan->runs[run];
			size_t len = MIN(cr->size - done, piece);
			struct disk_read *n = &q.ring[(q.head + q.count) % DISK_READS_AHEAD];
			int slot = free_slot(p);

			if (slot < 0) {
				r = slot;
				break;
			}
			p->slot_busy[slot] = true;
			*n = (struct disk_read){
				.owner = &q,
				.file = &it->chunk->disk,
				.buf = staging_slot(p->ed, slot),
				.size = round_up(len, DISKFILE_ALIGN),
				.offset = cr->host_offset + done,
				.dev_offset = cr->offset + done,
				.host_offset = cr->host_offset + done,
				.length = len,
				.last = run + 1 == plan->count && done + len == cr->size,
				.slot = slot,
			};
			q.count++;
			done += len;
			if (done == cr->size) {
				run++;
				done = 0;
			}
			workers_submit(p->e->workers, disk_read_one, n);
		}
		if (q.count == 0)
			break;
		/* after a failure only wait for the rest: they write into slots */
		d = disk_read_take(&q);
		if (r == 0 && d.result < 0)
			r = error_prefix(error_set(d.result, "%s", d.error), "tag '%s'",
					 it->owner.tag);
		if (r < 0) {
			p->slot_busy[d.slot] = false;
			continue;
		}
		/* queue_copy() frees the slot when it fails */
		r = queue_copy(p, it, d.dev_offset, d.host_offset, d.length, d.last, false, d.slot,
			       staging_slot(p->ed, d.slot));
	}
	pthread_cond_destroy(&q.done);
	pthread_mutex_destroy(&q.lock);
	return r;
}

/* Close the open segment of a wake's probe: wait for its copies, then time
 * it (the simulated device supplies the rate instead). */
static int probe_close(struct pipeline *p)
{
	struct backend *b = p->e->backend;
	double gbps = 0;
	int r = pipeline_drain(p);

	if (r < 0)
		return r;
	if (b->ops->simulated_copy_gbps && p->wc->probe_left == 0)
		gbps = b->ops->simulated_copy_gbps(b, p->device, p->wc->kernel);
	wake_copy_segment_close(p->wc, now_monotonic_s(), gbps);
	return 0;
}

/* A sleep's host copy not registered yet is registered here, piece by
 * piece, just ahead of each piece's copy, on the thread that queues the
 * copies: the driver serializes registration with the other calls, so a
 * thread of its own registering held up the queueing of every copy (16 GiB
 * on the H200: 0.61 s so, 0.42 s here; docs/benchmarks.md). */
struct pin_ahead {
	struct hostbuf *hb; /* NULL: nothing to register */
	size_t piece;
	size_t done; /* bytes registered, from the start of the buffer */
	bool failed; /* registering failed (the error is set) */
};

/* Register the pieces of pa's buffer that hold [0, end). */
static int pin_through(struct pipeline *p, struct pin_ahead *pa, size_t end)
{
	double start = now_monotonic_s();
	int r = hostbuf_pin_upto(p->e->backend, pa->hb, pa->piece, &pa->done, end);

	engine_time_add(&p->e->host_pin_ns, start);
	if (r < 0) {
		pa->failed = true;
		r = error_prefix(r, "pinning %zu bytes of host memory", pa->hb->size);
	}
	return r;
}

/* Registering stopped part way: wait for the copies in flight (finishing
 * them, or after a failure of another kind, not), unregister the pieces that
 * were registered and leave the buffer unpinned. */
static int pin_undo(struct pipeline *p, struct pin_ahead *pa, bool finish)
{
	int r = 0;

	if (finish)
		r = pipeline_drain(p);
	if (!finish || r < 0)
		pipeline_abort(p); /* no copy may still use a piece */
	hostbuf_unpin_first(p->e->backend, pa->hb, pa->piece, pa->done);
	pa->done = 0;
	pa->hb->pin_piece = 0;
	return r;
}

/* Queue the runs of a chunk's plan (extent.h), each split where the host
 * side requires: one copy never spans two pinned pieces of the packed host
 * copy, nor more than a staging slot; on wake, a probe's pieces end where
 * the probe does, and a probe's segment ends with the chunk (the next
 * chunk's mapping is no copy time). pa: register the host copy on the way. */
static int issue_runs(struct pipeline *p, struct engine_item *it, struct pin_ahead *pa)
{
	struct chunk *c = it->chunk;
	const struct copy_plan *plan = &c->plan;
	/* pinned: up to the pin piece's end; else a slot, and for a disk copy
	 * at most disk_chunk_bytes (whole blocks, so each piece of a run
	 * starts on a block of its file) */
	bool pinned = !engine_item_disk(it) && c->host.pin_piece;
	size_t piece = pinned ? c->host.pin_piece : p->ed->slot_bytes;
	struct wake_copy *wc = pinned && !p->to_host ? p->wc : NULL;
	int r;

	if (engine_item_disk(it))
		piece = MAX(MIN(piece, p->e->disk_chunk_bytes) / DISKFILE_ALIGN * DISKFILE_ALIGN,
			    (size_t)DISKFILE_ALIGN);
	if (engine_item_disk(it) && !p->to_host)
		return issue_disk_runs(p, it, piece);
	for (size_t i = 0; i < plan->count; i++) {
		const struct copy_run *run = &plan->runs[i];

		for (size_t done = 0; done < run->size;) {
			size_t host = run->host_offset + done;
			size_t len = MIN(run->size - done, pinned ? piece - host % piece : piece);

			if (pa->hb) {
				r = pin_through(p, pa, host + len);
				if (r < 0)
					return r;
			}
			if (wc && wake_copy_probing(wc)) {
				if (wc->segment_start == 0) {
					r = pipeline_drain(p);
					if (r < 0)
						return r;
					wake_copy_segment_open(wc, now_monotonic_s());
				}
				len = MIN(len, wc->probe_left);
			}
			done += len;
			r = issue_piece(p, it, run->offset + done - len, host, len,
					i + 1 == plan->count && done == run->size,
					wc && wc->kernel);
			if (r < 0)
				return r;
			if (!wc)
				continue;
			wake_copy_count(wc, len);
			if (wake_copy_probing(wc) && wc->probe_left == 0) {
				r = probe_close(p);
				if (r < 0)
					return r;
			}
		}
	}
	if (wc && wake_copy_probing(wc) && wc->segment_start != 0)
		return probe_close(p);
	return 0;
}

int pipeline_issue_chunk(struct pipeline *p, struct engine_item *it, bool pin)
{
	struct engine *e = p->e;
	struct chunk *c = it->chunk;
	struct pin_ahead pa = { 0 };
	uint64_t change_copied = it->change->bytes_copied, copied = p->totals->copied;
	bool tail;
	int r;

	if (p->to_host && pin && !engine_item_disk(it) && !c->host.pin_piece && c->host.ptr) {
		pa = (struct pin_ahead){ .hb = &c->host, .piece = e->pin_piece };
		c->host.pin_piece = e->pin_piece; /* its copies split at the pieces */
	}
	r = issue_runs(p, it, &pa);
	tail = r == 0;
	if (r == 0 && pa.hb)
		r = pin_through(p, &pa, c->host.size); /* a tail no run reached */
	if (r == 0 || !pa.hb)
		return r;
	if (!pa.failed) {
		(void)pin_undo(p, &pa, false);
		return r;
	}
	/* Registering failed: the copy goes through the staging ring instead,
	 * from its start unless every piece is queued already. */
	engine_warn(p->totals, "host copy stays unpinned (copied through the staging ring): %s",
		    dormant_last_error());
	r = pin_undo(p, &pa, true);
	if (r < 0 || tail)
		return r; /* tail: copied; a wake copies it back through the ring */
	it->change->bytes_copied = change_copied;
	p->totals->copied = copied;
	r = staging_ready(e, p->device);
	if (r < 0)
		return r;
	return issue_runs(p, it, &(struct pin_ahead){ 0 });
}
