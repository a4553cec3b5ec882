/* SPDX-License-Identifier: MIT */
#include "staging.h"

int staging_ready(struct engine *e, int d)
{
	struct engine_device *ed = &e->devices[d];
	double start;
	int r;

	if (ed->staging.ptr)
		return 0;
	start = now_monotonic_s(); /* a device's one-time setup (setup_s) */
	r = hostbuf_alloc(e->backend, e->staging_bytes, &ed->staging);
	if (r < 0) {
		engine_time_add(&e->setup_ns, start);
		return error_prefix(r, "allocating the staging ring");
	}
	hostbuf_touch(e->workers, &ed->staging);
	ed->slot_bytes = ed->staging.size / ENGINE_STAGING_SLOTS / 4096 * 4096;
	/* one piece per slot: a slot's copy never spans two pinned ranges,
	 * whatever pin_piece_bytes says */
	r = hostbuf_pin(e->backend, &ed->staging, ed->slot_bytes, e->pin_threads);
	engine_time_add(&e->setup_ns, start);
	if (r < 0) {
		hostbuf_free(e->backend, &ed->staging);
		ed->slot_bytes = 0;
		return error_prefix(r, "allocating the staging ring");
	}
	atomic_fetch_add(&e->staging_held, ed->staging.size);
	return 0;
}

void staging_finish(struct engine *e, int d)
{
	struct engine_device *ed = &e->devices[d];

	if (!ed->staging.ptr)
		return;
	atomic_fetch_sub(&e->staging_held, ed->staging.size);
	hostbuf_free(e->backend, &ed->staging);
	ed->slot_bytes = 0;
}
