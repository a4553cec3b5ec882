/* SPDX-License-Identifier: MIT */
/* Host copies once their wake is done (hostcopy.h). */
#include "hostcopy.h"

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

bool engine_pinned_awake_reserve(struct engine *e, size_t size)
{
	uint64_t held = atomic_load(&e->reclaim_pinned);

	do {
		if (held + size > e->reclaim_pinned_max)
			return false;
	} while (!atomic_compare_exchange_weak(&e->reclaim_pinned, &held, held + size));
	return true;
}

void engine_pinned_awake_unreserve(struct engine *e, size_t size)
{
	atomic_fetch_sub(&e->reclaim_pinned, size);
}

/* A chunk's host copy leaves (freed, or reclaimable after all): the room it
 * held under reclaimable_pinned_bytes goes back. */
static void pinned_awake_end(struct engine *e, struct chunk *c)
{
	if (!c->pinned_awake)
		return;
	engine_pinned_awake_unreserve(e, c->host.size);
	c->pinned_awake = false;
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
	pinned_awake_end(e, c);
	job->backend = e->backend;
	job->buffer = c->host;
	job->held = held;
	memset(&c->host, 0, sizeof(c->host));
	workers_submit(e->workers, deferred_free_run, job);
}

void engine_host_free(struct engine *e, struct held_bytes *held, struct chunk *c)
{
	size_t size;
	bool counted;

	engine_host_settle(e, &c->host);
	size = c->host.size;
	counted = !c->host.reclaimable;
	pinned_awake_end(e, c);
	hostbuf_free(e->backend, &c->host);
	if (counted)
		engine_account_host(held, -(int64_t)size);
}

/* Host mode reclaimable: a chunk's unpin and MADV_FREE, on a worker. It
 * works on a copy of the buffer (the chunk is its owner's, who waits for
 * done before touching the buffer: engine_host_settle()). */
struct reclaim_job {
	struct engine *e;
	struct hostbuf buffer;
	struct held_bytes *held;
	bool done; /* under e->reclaim_lock */
};

/* Unpin and hand to the kernel; a failure of MADV_FREE is said once. */
static void reclaim_pages(struct engine *e, struct hostbuf *hb, struct held_bytes *held)
{
	size_t size = hb->size;

	log_write(&e->log, DORMANT_LOG_DEBUG,
		  "unpinning a %zu-byte host copy for the kernel to reclaim", size);
	if (hostbuf_make_reclaimable(e->backend, hb) != 0 &&
	    !atomic_exchange(&e->reclaim_warned, true))
		log_write(&e->log, DORMANT_LOG_WARNING, "host mode reclaimable: %s",
			  dormant_last_error());
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

void engine_host_settle(struct engine *e, struct hostbuf *hb)
{
	struct reclaim_job *job = hb->reclaim;

	if (!job)
		return;
	pthread_mutex_lock(&e->reclaim_lock);
	if (!job->done)
		log_write(&e->log, DORMANT_LOG_DEBUG,
			  "waiting for the unpin of a %zu-byte host copy", hb->size);
	while (!job->done)
		pthread_cond_wait(&e->reclaim_cond, &e->reclaim_lock);
	pthread_mutex_unlock(&e->reclaim_lock);
	free(job);
	hb->reclaim = NULL;
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

void engine_host_done(struct engine *e, struct held_bytes *held, struct chunk *c)
{
	if (!c->host.ptr || c->host.reclaimable)
		return;
	if (e->mode == DORMANT_HOST_RELEASE)
		engine_host_release(e, held, c);
	else if (e->mode == DORMANT_HOST_RECLAIMABLE && !pinned_awake_keeps(e, c))
		host_reclaim(e, held, c);
}
