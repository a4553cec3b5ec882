/* SPDX-License-Identifier: MIT */
/*
 * Host copies after their transition (a stage of the engine, above state.h):
 * freed on a worker, unpinned and handed to the kernel (host mode
 * reclaimable), or kept pinned under reclaimable_pinned_bytes, as the host
 * mode says once a wake no longer needs them; and the wake's commit, which
 * gives them up. Freeing one now, and waiting for its unpin, are state.h's
 * (engine_host_free(), engine_host_settle()).
 */
#ifndef DORMANT_ENGINE_HOSTCOPY_H
#define DORMANT_ENGINE_HOSTCOPY_H

#include "state.h"

/* Wait until every queued unpin is done (a host-mode switch). */
void engine_reclaims_wait(struct engine *e);
/* Host mode reclaimable: take room for size bytes of host copy that stays
 * pinned while awake under reclaim_pinned_max; false when there is none
 * (engine_pinned_awake_unreserve(), state.h, gives it back). */
bool engine_pinned_awake_reserve(struct engine *e, size_t size);
/* Give a host copy back; unmapping gigabytes takes a while, so it happens on
 * a worker thread and the host bytes fall when it is done. */
void engine_host_release(struct engine *e, struct held_bytes *held, struct chunk *c);
/* A host copy no wake needs any more (the wake is done), as the host mode
 * says: retain keeps it, release frees it on a worker, reclaimable unpins it
 * on a worker (or keeps it pinned under reclaimable_pinned_bytes). */
void engine_host_done(struct engine *e, struct held_bytes *held, struct chunk *c);
/* The copies of items that no wake needs any more, each chunk's host copy
 * as engine_host_done() says and its disk copy removed. restored: the
 * chunks a wake mapped (mapped_here), whose retained host copy (retain
 * mode, its hash known) now holds what the device has; else every chunk
 * still mapped (a sleep rolled back: copies made for chunks that never left
 * the device). */
void engine_copies_done(struct engine *e, struct xfer_item *items, size_t count,
			bool restored);
/* The wake is done, the data on the device: engine_copies_done() of what
 * it restored. */
void engine_wake_commit(struct engine *e, struct xfer_item *items, size_t count);

#endif
