/* SPDX-License-Identifier: MIT */
/* Host copies once their wake is done, and the budgets of those kept pinned
 * (hostcopy.h). */
#include "hostcopy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct deferred_free {
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
	struct engine *e;
	struct diskfile_closing closing;
};

static void disk_closing_run(void *arg)
{
	struct disk_closing *job = arg;
	struct engine *e = job->e;

	diskfile_close_end(&job->closing);
	free(job);
	pthread_mutex_lock(&e->disk_lock);
	e->disk_closings--;
	pthread_cond_broadcast(&e->disk_cond);
	pthread_mutex_unlock(&e->disk_lock);
}

void engine_disk_release_later(struct engine *e, struct held_bytes *held, struct chunk *c)
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
	pthread_mutex_lock(&e->disk_lock);
	e->disk_closings++;
	pthread_mutex_unlock(&e->disk_lock);
	workers_submit(e->workers, disk_closing_run, job);
}

void engine_disk_closings_wait(struct engine *e)
{
	pthread_mutex_lock(&e->disk_lock);
	while (e->disk_closings)
		pthread_cond_wait(&e->disk_cond, &e->disk_lock);
	pthread_mutex_unlock(&e->disk_lock);
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

void engine_host_release(struct engine *e, struct held_bytes *held, struct chunk *c)
{
	struct deferred_free *job;

	engine_host_settle(e, &c->host);
	job = malloc(sizeof(*job));
	c->host_valid = false;
	c->retained = false;
	if (c->host.reclaimable) {
		/* counted again, as every buffer freed is */
		engine_account_host(held, (int64_t)c->host.size);
		c->host.reclaimable = false;
	}
	if (!job) {
		engine_host_free(e, held, c);
		return;
	}
	engine_pinned_awake_end(e, c);
	job->backend = e->backend;
	job->buffer = c->host;
	job->held = held;
	memset(&c->host, 0, sizeof(c->host));
	workers_submit(e->workers, deferred_free_run, job);
}

/* Unpin and hand to the kernel; a failure of MADV_FREE is kept, once, for
 * the next transition's totals (engine_reclaim_warning()). */
static void reclaim_pages(struct engine *e, struct hostbuf *hb, struct held_bytes *held)
{
	size_t size = hb->size;

	log_write(&e->log, DORMANT_LOG_DEBUG,
		  "unpinning a %zu-byte host copy for the kernel to reclaim", size);
	if (hostbuf_make_reclaimable(e->backend, hb) != 0) {
		pthread_mutex_lock(&e->reclaim_lock);
		if (!e->reclaim_warned)
			snprintf(e->reclaim_warning, sizeof(e->reclaim_warning),
				 "host mode reclaimable: %s", dormant_last_error());
		e->reclaim_warned = true;
		pthread_mutex_unlock(&e->reclaim_lock);
	}
	/* held until unpinned; what the kernel leaves shows as LazyFree */
	engine_account_host(held, -(int64_t)size);
}

static void reclaim_run(void *arg)
{
	struct reclaim_job *job = arg;
	struct engine *e = job->e;

	reclaim_pages(e, &job->buffer, job->held);
	pthread_mutex_lock(&e->reclaim_lock);
	job->done = true;
	e->reclaims_pending--;
	pthread_cond_broadcast(&e->reclaim_cond);
	pthread_mutex_unlock(&e->reclaim_lock);
}

void engine_reclaims_wait(struct engine *e)
{
	pthread_mutex_lock(&e->reclaim_lock);
	if (e->reclaims_pending)
		log_write(&e->log, DORMANT_LOG_DEBUG, "waiting for %u host copies' unpin",
			  e->reclaims_pending);
	while (e->reclaims_pending)
		pthread_cond_wait(&e->reclaim_cond, &e->reclaim_lock);
	pthread_mutex_unlock(&e->reclaim_lock);
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
 * buffer is marked reclaimable at once. */
static void host_reclaim(struct engine *e, struct held_bytes *held, struct chunk *c)
{
	struct reclaim_job *job = malloc(sizeof(*job));

	c->host_valid = false;
	c->retained = false;
	if (!job) { /* here, then */
		reclaim_pages(e, &c->host, held);
		return;
	}
	*job = (struct reclaim_job){ .e = e, .buffer = c->host, .held = held };
	c->host.pin_piece = 0;
	c->host.reclaimable = true;
	c->host.reclaim = job;
	pthread_mutex_lock(&e->reclaim_lock);
	e->reclaims_pending++;
	pthread_mutex_unlock(&e->reclaim_lock);
	workers_submit(e->workers, reclaim_run, job);
}

/* A host copy no wake needs any more (the wake is done), as the host mode
 * says: retain keeps it, release frees it on a worker, reclaimable unpins it
 * on a worker (or keeps it pinned under reclaimable_pinned_bytes). */
static void host_done(struct engine *e, struct held_bytes *held, struct chunk *c)
{
	if (!c->host.ptr || c->host.reclaimable)
		return;
	if (e->mode == DORMANT_HOST_RECLAIMABLE && pinned_awake_keeps(e, c))
		return;
	if (e->mode == DORMANT_HOST_RELEASE)
		engine_host_release(e, held, c);
	else if (e->mode == DORMANT_HOST_RECLAIMABLE)
		host_reclaim(e, held, c);
}

void engine_copies_done(struct engine *e, struct engine_item *items, size_t count)
{
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
			host_done(e, it->owner.held, c);
			/* a disk copy is never kept: its file goes, retain mode or
			 * not, without the wake waiting for the file system */
			engine_disk_release_later(e, it->owner.held, c);
		}
}
