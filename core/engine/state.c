/* SPDX-License-Identifier: MIT */
/*
 * The engine's bottom floor (state.h): accounting, timing, what it tells the
 * manager, and a chunk's pieces given back, now or on a worker.
 */
#include "state.h"

#include <assert.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- accounting, timing, warnings ---------------------------------------- */

void engine_account_device(struct engine *e, const struct chunk_owner *o, int64_t delta)
{
	atomic_fetch_add(&e->device_bytes[o->device], (uint64_t)delta);
	atomic_fetch_add(&o->held->device_bytes, (uint64_t)delta);
}

void engine_account_host(struct held_bytes *held, int64_t delta)
{
	atomic_fetch_add(&held->host_bytes, (uint64_t)delta);
}

void engine_account_disk(struct held_bytes *held, int64_t delta)
{
	atomic_fetch_add(&held->disk_bytes, (uint64_t)delta);
}

void engine_time_add(_Atomic uint64_t *ns, double start)
{
	atomic_fetch_add(ns, (uint64_t)((now_monotonic_s() - start) * 1e9));
}

void engine_warn(struct engine_totals *t, const char *fmt, ...)
{
	va_list ap;

	if (t->warnings++)
		return;
	va_start(ap, fmt);
	vsnprintf(t->warning, sizeof(t->warning), fmt, ap);
	va_end(ap);
}

void engine_warnings_add(struct engine_totals *dst, const struct engine_totals *src)
{
	if (src->warnings && !dst->warnings)
		memcpy(dst->warning, src->warning, sizeof(dst->warning));
	dst->warnings += src->warnings;
}

void engine_reclaim_warning(struct engine *e, struct engine_totals *t)
{
	pthread_mutex_lock(&e->reclaims.lock);
	if (e->reclaim_warning[0])
		engine_warn(t, "%s", e->reclaim_warning);
	e->reclaim_warning[0] = '\0';
	pthread_mutex_unlock(&e->reclaims.lock);
}

/* ---- a chunk's pieces, given back ---------------------------------------- */

int engine_chunk_release(struct engine *e, const struct chunk_owner *o, struct chunk *c,
			 struct engine_totals *t)
{
	struct backend *b = e->backend;
	double start = now_monotonic_s();
	int unmapped, released = 0;

	unmapped = b->ops->mem_unmap(b, o->device, c->va, c->size);
	if (unmapped == 0) {
		c->mapped = false;
		engine_account_device(e, o, -(int64_t)c->size);
		released = b->ops->mem_release(b, o->device, c->handle);
	}
	engine_time_add(&e->release_ns, start);
	if (unmapped < 0)
		return error_prefix(unmapped, "unmapping %zu bytes at %#lx", c->size,
				    (unsigned long)c->va);
	if (released < 0 && !t)
		return error_prefix(released, "releasing physical memory");
	if (released < 0)
		engine_warn(t, "releasing physical memory: %s", dormant_last_error());
	return 0;
}

int engine_release_policy(struct engine *e, int d, enum dormant_policy policy,
			  struct engine_item *items, size_t count, struct engine_totals *t)
{
	for (size_t i = 0; i < count; i++) {
		struct engine_item *it = &items[i];
		int r;

		if ((d >= 0 && it->owner.device != d) || it->policy != policy ||
		    !it->chunk->mapped)
			continue;
		r = engine_chunk_release(e, &it->owner, it->chunk, t);
		if (r < 0)
			return r;
		it->change->bytes_released += it->chunk->size;
		t->released += it->chunk->size;
	}
	return 0;
}

void engine_host_settle(struct engine *e, struct hostbuf *hb)
{
	struct reclaim_job *job = hb->reclaim;

	if (!job)
		return;
	pthread_mutex_lock(&e->reclaims.lock);
	if (!job->done)
		log_write(&e->log, DORMANT_LOG_DEBUG,
			  "waiting for the unpin of a %zu-byte host copy", hb->size);
	while (!job->done)
		pthread_cond_wait(&e->reclaims.cond, &e->reclaims.lock);
	pthread_mutex_unlock(&e->reclaims.lock);
	free(job);
	hb->reclaim = NULL;
}

void engine_pinned_awake_unreserve(struct engine *e, size_t size)
{
	atomic_fetch_sub(&e->reclaim_pinned, size);
}

void engine_pinned_awake_end(struct engine *e, struct chunk *c)
{
	if (!c->pinned_awake)
		return;
	engine_pinned_awake_unreserve(e, c->host.size);
	c->pinned_awake = false;
}

void engine_host_free(struct engine *e, struct held_bytes *held, struct chunk *c)
{
	/* off the books first, then wait for its unpin and free it */
	engine_pinned_awake_end(e, c);
	if (!c->host.reclaimable) /* a reclaimable one is off them already */
		engine_account_host(held, -(int64_t)c->host.size);
	engine_host_settle(e, &c->host);
	hostbuf_free(e->backend, &c->host);
}

void engine_disk_release(struct held_bytes *held, struct chunk *c)
{
	if (!c->disk.open)
		return;
	engine_account_disk(held, -(int64_t)c->disk.size);
	diskfile_close(&c->disk);
}

int engine_chunk_drop(struct engine *e, const struct chunk_owner *o, struct chunk *c)
{
	bool disk = c->disk.open;
	int r = 0;

	if (c->mapped)
		r = engine_chunk_release(e, o, c, NULL);
	/* off the books, then the copies' own ends */
	if (disk)
		engine_account_disk(o->held, -(int64_t)c->disk.size);
	if (c->host.ptr)
		engine_host_free(e, o->held, c);
	if (disk)
		diskfile_close(&c->disk);
	c->host_valid = false;
	c->retained = false;
	return r;
}

/* ---- copies no wake needs any more --------------------------------------- */

static void pending_add(struct engine_pending *p)
{
	pthread_mutex_lock(&p->lock);
	p->count++;
	pthread_mutex_unlock(&p->lock);
}

/* With p->lock. */
static void pending_done(struct engine_pending *p)
{
	p->count--;
	pthread_cond_broadcast(&p->cond);
}

/* Queue job on *jobs for the workers, counted in pending at once (NULL:
 * nobody waits for it). */
static void later(struct engine_job **jobs, struct engine_pending *pending,
		  struct engine_job *job, void (*run)(void *))
{
	if (pending)
		pending_add(pending);
	job->run = run;
	job->next = *jobs;
	*jobs = job;
}

void engine_jobs_submit(struct engine *e, struct engine_job *jobs)
{
	struct engine_job *queued = NULL;

	/* in the order they were queued */
	while (jobs) {
		struct engine_job *job = jobs;

		jobs = job->next;
		job->next = queued;
		queued = job;
	}
	while (queued) {
		struct engine_job *job = queued;

		queued = job->next; /* before the job runs, and maybe frees itself */
		workers_submit(e->workers, job->run, job);
	}
}

/* Wait until none of p's jobs is left, saying so in a debug line first if
 * any is ("waiting for N <what>"). */
static void pending_wait(struct engine *e, struct engine_pending *p, const char *what)
{
	pthread_mutex_lock(&p->lock);
	if (p->count) {
		unsigned count = p->count;

		pthread_mutex_unlock(&p->lock);
		log_write(&e->log, DORMANT_LOG_DEBUG, "waiting for %u %s", count, what);
		pthread_mutex_lock(&p->lock);
	}
	while (p->count)
		pthread_cond_wait(&p->cond, &p->lock);
	pthread_mutex_unlock(&p->lock);
}

struct deferred_free {
	struct engine_job job;
	struct backend *backend;
	struct hostbuf buffer;
	struct held_bytes *held;
};

static void deferred_free_run(void *arg)
{
	struct deferred_free *job = arg;
	size_t size = job->buffer.size;

	hostbuf_free(job->backend, &job->buffer);
	engine_account_host(job->held, -(int64_t)size);
	free(job);
}

struct disk_closing {
	struct engine_job job;
	struct engine *e;
	struct diskfile_closing closing;
};

static void disk_closing_run(void *arg)
{
	struct disk_closing *job = arg;
	struct engine *e = job->e;

	diskfile_close_end(&job->closing);
	free(job);
	pthread_mutex_lock(&e->disk_closings.lock);
	pending_done(&e->disk_closings);
	pthread_mutex_unlock(&e->disk_closings.lock);
}

/* Remove a chunk's disk copy without waiting for the file system: the copy
 * is gone at once (its name out of the directory, its bytes out of the
 * disk bytes) and a worker gives its space back (closing a wake's file of
 * gigabytes takes the file system a while: 0.29 s a GiB for ext4 on a
 * virtual disk); engine_disk_closings_wait() waits for that. */
static void disk_release_later(struct engine *e, struct held_bytes *held, struct chunk *c,
			       struct engine_job **jobs)
{
	struct disk_closing *job;

	if (!c->disk.open)
		return;
	job = malloc(sizeof(*job));
	if (!job) {
		engine_disk_release(held, c); /* now, then */
		return;
	}
	engine_account_disk(held, -(int64_t)c->disk.size);
	job->e = e;
	diskfile_close_begin(&c->disk, &job->closing);
	later(jobs, &e->disk_closings, &job->job, disk_closing_run);
}

void engine_disk_closings_wait(struct engine *e)
{
	pending_wait(e, &e->disk_closings, "disk copies' closing");
}

/* Add size to *held unless that would take it past max, from any thread:
 * true when added. */
static bool reserve(_Atomic uint64_t *held, uint64_t size, uint64_t max)
{
	uint64_t now = atomic_load(held);

	do {
		if (now + size > max)
			return false;
	} while (!atomic_compare_exchange_weak(held, &now, now + size));
	return true;
}

bool engine_pinned_awake_reserve(struct engine *e, size_t size)
{
	return reserve(&e->reclaim_pinned, size, e->reclaim_pinned_max);
}

bool engine_sleep_pin_reserve(struct engine *e, size_t size)
{
	return reserve(&e->pin_taken, size, e->pin_max);
}

void engine_host_release(struct engine *e, struct held_bytes *held, struct chunk *c,
			 struct engine_job **jobs)
{
	struct deferred_free *job = malloc(sizeof(*job));

	assert(!c->host.reclaim); /* settled: no unpin of it on a worker */
	c->host_valid = false;
	c->retained = false;
	if (c->host.reclaimable) {
		/* counted again, as every buffer freed is */
		engine_account_host(held, (int64_t)c->host.size);
		c->host.reclaimable = false;
	}
	if (!job) { /* here, then */
		engine_host_free(e, held, c);
		return;
	}
	engine_pinned_awake_end(e, c);
	job->backend = e->backend;
	job->buffer = c->host;
	job->held = held;
	memset(&c->host, 0, sizeof(c->host));
	later(jobs, NULL, &job->job, deferred_free_run);
}

/* Unpin and hand to the kernel; a failure of MADV_FREE is kept, once, for
 * the next transition's totals (engine_reclaim_warning()). */
static void reclaim_pages(struct engine *e, struct hostbuf *hb, struct held_bytes *held)
{
	size_t size = hb->size;

	log_write(&e->log, DORMANT_LOG_DEBUG,
		  "unpinning a %zu-byte host copy for the kernel to reclaim", size);
	if (hostbuf_make_reclaimable(e->backend, hb) != 0) {
		pthread_mutex_lock(&e->reclaims.lock);
		if (!e->reclaim_warned)
			snprintf(e->reclaim_warning, sizeof(e->reclaim_warning),
				 "host mode reclaimable: %s", dormant_last_error());
		e->reclaim_warned = true;
		pthread_mutex_unlock(&e->reclaims.lock);
	}
	/* held until unpinned; what the kernel leaves shows as LazyFree */
	engine_account_host(held, -(int64_t)size);
}

static void reclaim_run(void *arg)
{
	struct reclaim_job *job = arg;
	struct engine *e = job->e;

	reclaim_pages(e, &job->buffer, job->held);
	pthread_mutex_lock(&e->reclaims.lock);
	job->done = true;
	pending_done(&e->reclaims);
	pthread_mutex_unlock(&e->reclaims.lock);
}

void engine_reclaims_wait(struct engine *e)
{
	pending_wait(e, &e->reclaims, "host copies' unpin");
}

/* Host mode reclaimable: whether c's host copy stays pinned while awake (it
 * did already, or the room left under reclaimable_pinned_bytes takes it). */
static bool pinned_awake_keeps(struct engine *e, struct chunk *c)
{
	if (!c->host.pin_piece) /* unpinned: nothing to keep */
		return false;
	if (!c->pinned_awake && !engine_pinned_awake_reserve(e, c->host.size))
		return false;
	c->pinned_awake = true;
	c->host_valid = false;
	c->retained = false; /* stale once the trainer writes: as reclaimed */
	return true;
}

/* Host mode reclaimable: the buffer stays mapped, unpinned, for the kernel to
 * take (not counted as host memory held once unpinned); the next sleep
 * reuses it. The wake does not wait for the unpin: a worker does it, and the
 * buffer is marked reclaimable at once. Without memory for the job the
 * buffer stays as it is, pinned and counted, for the next sleep to reuse
 * (the next wake tries again). */
static void host_reclaim(struct engine *e, struct held_bytes *held, struct chunk *c,
			 struct engine_job **jobs)
{
	struct reclaim_job *job = malloc(sizeof(*job));

	c->host_valid = false;
	c->retained = false;
	if (!job)
		return;
	*job = (struct reclaim_job){ .e = e, .buffer = c->host, .held = held };
	c->host.pin_piece = 0;
	c->host.reclaimable = true;
	c->host.reclaim = job;
	later(jobs, &e->reclaims, &job->job, reclaim_run);
}

/* A host copy no wake needs any more (the wake is done), as the host mode
 * says: retain keeps it, release frees it on a worker, reclaimable unpins it
 * on a worker (or keeps it pinned under reclaimable_pinned_bytes). */
static void host_done(struct engine *e, struct held_bytes *held, struct chunk *c,
		      struct engine_job **jobs)
{
	if (!c->host.ptr || c->host.reclaimable)
		return;
	if (e->mode == DORMANT_HOST_RECLAIMABLE && pinned_awake_keeps(e, c))
		return;
	if (e->mode == DORMANT_HOST_RELEASE)
		engine_host_release(e, held, c, jobs);
	else if (e->mode == DORMANT_HOST_RECLAIMABLE)
		host_reclaim(e, held, c, jobs);
}

void engine_copies_done(struct engine *e, struct engine_item *items, size_t count)
{
	struct engine_job *jobs = NULL;

	/* what was restored first, as ever (it takes the room under
	 * reclaimable_pinned_bytes first), then what never left the device */
	for (int restored = 1; restored >= 0; restored--)
		for (size_t i = 0; i < count; i++) {
			struct engine_item *it = &items[i];
			struct chunk *c = it->chunk;

			if (restored ? !it->mapped_here : it->mapped_here || !c->mapped)
				continue;
			/* restored from a host copy that stays (retain mode):
			 * what the next sleep compares, by its hash */
			if (restored)
				c->retained = e->mode == DORMANT_HOST_RETAIN &&
					      engine_item_keep(it) && c->host_valid &&
					      c->sum_valid && c->host.ptr;
			c->host_valid = false;
			host_done(e, it->owner.held, c, &jobs);
			/* a disk copy is never kept: its file goes, retain mode or
			 * not, without the wake waiting for the file system */
			disk_release_later(e, it->owner.held, c, &jobs);
		}
	engine_jobs_submit(e, jobs);
}
