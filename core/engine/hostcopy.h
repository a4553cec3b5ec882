/* SPDX-License-Identifier: MIT */
/*
 * Host copies after their transition (a stage of the engine, above state.h):
 * freed on a worker, unpinned and handed to the kernel (host mode
 * reclaimable), or kept pinned under reclaimable_pinned_bytes, as the host
 * mode says once a wake no longer needs them (engine_copies_done(): a
 * wake's commit, a sleep's rollback). Freeing one now, and waiting for its
 * unpin, are state.h's (engine_host_free(), engine_host_settle()). Disk
 * copies too, once a wake no longer needs them: removed at once, their files
 * closed on a worker.
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
/* pin_host false with pin_host_bytes: take room for size bytes of a
 * sleep's host copy pinned under pin_max (what is left of pin_host_bytes);
 * false when there is none. One budget for the devices that sleep at once;
 * the next sleep starts it again. */
bool engine_sleep_pin_reserve(struct engine *e, size_t size);
/* Give a host copy back; unmapping gigabytes takes a while, so it happens on
 * a worker thread and the host bytes fall when it is done. */
void engine_host_release(struct engine *e, struct held_bytes *held, struct chunk *c);
/* Remove a chunk's disk copy without waiting for the file system: the copy
 * is gone at once (its name out of the directory, its bytes out of the
 * disk bytes) and a worker gives its space back (closing a wake's file of
 * gigabytes takes the file system a while: 0.29 s a GiB for ext4 on a
 * virtual disk). engine_disk_closings_wait() waits for that. */
void engine_disk_release_later(struct engine *e, struct held_bytes *held, struct chunk *c);
/* Wait until the space of every disk copy so removed is given back (a sleep
 * that makes disk copies, before it allocates theirs). */
void engine_disk_closings_wait(struct engine *e);
/* The copies of items that no wake needs any more, once the data is on the
 * device: each chunk's host copy as the host mode says (retain keeps it,
 * release frees it on a worker, reclaimable unpins it on a worker or keeps
 * it pinned under reclaimable_pinned_bytes) and its disk copy removed
 * (engine_disk_release_later()). That is every item's chunk on the device
 * now: first those a wake (or a sleep's rollback) mapped (mapped_here), whose
 * retained host copy (retain mode, its hash known) now holds what the device
 * has; then, after a sleep rolled back, those that never left the device. One call, each chunk once: the
 * wake's commit, and the end of a rollback whatever came back
 * (engine_wake_end()). */
void engine_copies_done(struct engine *e, struct engine_item *items, size_t count);

#endif
