/* SPDX-License-Identifier: MIT */
/*
 * The engine's bottom floor (state.h): accounting, timing, what it tells the
 * manager, and a chunk's pieces given back.
 */
#include "state.h"

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
	pthread_mutex_lock(&e->reclaim_lock);
	if (e->reclaim_warning[0])
		engine_warn(t, "%s", e->reclaim_warning);
	e->reclaim_warning[0] = '\0';
	pthread_mutex_unlock(&e->reclaim_lock);
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
	int r = 0;

	if (c->mapped)
		r = engine_chunk_release(e, o, c, NULL);
	if (c->host.ptr)
		engine_host_free(e, o->held, c);
	engine_disk_release(o->held, c);
	c->host_valid = false;
	c->retained = false;
	return r;
}
