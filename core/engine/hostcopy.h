/* SPDX-License-Identifier: MIT */
/*
 * Host copies after their transition (a stage of the engine, above state.h):
 * freed now or on a worker, unpinned and handed to the kernel (host mode
 * reclaimable), or kept pinned under reclaimable_pinned_bytes, as the host
 * mode says once a wake no longer needs them.
 */
#ifndef DORMANT_ENGINE_HOSTCOPY_H
#define DORMANT_ENGINE_HOSTCOPY_H

#include "state.h"

/* Free a chunk's host buffer now, taking it off the tag's host bytes (a
 * reclaimable one is off them already); waits for its reclaim job first. */
void engine_host_free(struct engine *e, struct held_bytes *held, struct chunk *c);
/* Host mode reclaimable: a wake unpins its host copies on the workers
 * (hostbuf_make_reclaimable()), marking them reclaimable at once. Wait
 * until hb's unpin is done, if one was queued, and forget it: whoever
 * touches a reclaimable buffer (reuses, frees) calls this first. The
 * buffer's host bytes fall when its unpin is done (it is pinned until
 * then). Any thread; not from a worker job. */
void engine_host_settle(struct engine *e, struct hostbuf *hb);
/* Wait until every queued unpin is done (a host-mode switch). */
void engine_reclaims_wait(struct engine *e);
/* Host mode reclaimable: take room for size bytes of host copy that stays
 * pinned while awake under reclaim_pinned_max; false when there is none. */
bool engine_pinned_awake_reserve(struct engine *e, size_t size);
/* Give back that room (the copy is freed, or unpinned after all). Any
 * thread. */
void engine_pinned_awake_unreserve(struct engine *e, size_t size);
/* Give a host copy back; unmapping gigabytes takes a while, so it happens on
 * a worker thread and the host bytes fall when it is done. */
void engine_host_release(struct engine *e, struct held_bytes *held, struct chunk *c);
/* A host copy no wake needs any more (the wake is done), as the host mode
 * says: retain keeps it, release frees it on a worker, reclaimable unpins it
 * on a worker (or keeps it pinned under reclaimable_pinned_bytes). */
void engine_host_done(struct engine *e, struct held_bytes *held, struct chunk *c);

#endif
