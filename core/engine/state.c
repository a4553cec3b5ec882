/* SPDX-License-Identifier: MIT */
/* The engine's bottom floor (state.h): accounting, and a chunk's release. */
#include "state.h"

/* ---- accounting ---------------------------------------------------------- */

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

/* ---- chunk release ------------------------------------------------------- */

int engine_chunk_release(struct engine *e, const struct chunk_owner *o, struct chunk *c)
{
	struct backend *b = e->backend;
	double start = now_monotonic_s();
	int r;

	r = b->ops->mem_unmap(b, o->device, c->va, c->size);
	if (r < 0) {
		engine_time_add(&e->release_ns, start);
		return error_prefix(r, "unmapping %zu bytes at %#lx", c->size, (unsigned long)c->va);
	}
	c->mapped = false;
	engine_account_device(e, o, -(int64_t)c->size);
	r = b->ops->mem_release(b, o->device, c->handle);
	engine_time_add(&e->release_ns, start);
	if (r < 0)
		log_write(&e->log, DORMANT_LOG_WARNING, "releasing physical memory: %s",
			  dormant_last_error());
	return 0;
}
