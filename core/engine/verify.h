/* SPDX-License-Identifier: MIT */
/*
 * What the transfer engine does with chunk checksums (checksum.h):
 *  - sleep (checksum_sleep(), after the device is synchronized, before any
 *    copy): hash each KEEP chunk's runs on the device, in one launch per
 *    device. In retain mode a chunk whose host copy still holds what its last
 *    wake restored, with the same layout and the same hash, is released at
 *    once without a copy (bytes_unchanged). Every other chunk's hash is kept
 *    as the hash of what its copy will hold. Done when verification is on or
 *    in retain mode.
 *  - wake (checksum_wake_*(), with verification on): hash each restored
 *    chunk on the device as soon as its copy is done, while later chunks
 *    still copy: the wake's restore queues the hash of each group of chunks
 *    (WAKE_GROUP_BYTES) on the device's hash stream, behind an event after
 *    the group's last copy; the results stay on the device and are read
 *    back once, after the last copy, and compared. A mismatch fails the
 *    wake (-EIO, the chunk named) and, as every failed wake, leaves the tags
 *    asleep with their host copies.
 *  - wake commit (engine_copies_done(), state.h): remember, per chunk,
 *    that its retained host copy holds what the device now has.
 * Ranges marked unused and slab holes are not copied and come back zero:
 * they are not hashed, the runs are (extent.h).
 */
#ifndef DORMANT_VERIFY_H
#define DORMANT_VERIFY_H

#include "state.h"

int checksum_sleep(struct engine *e, int d, struct engine_item *items, size_t count,
		   struct engine_totals *t);
/* One device's verification during its wake. */
struct verify_wake {
	struct engine *e;
	int device;
	struct engine_totals *totals; /* the device's: what it tells (engine_warn()) */
	bool active;              /* chunks to verify, and a kernel (so far) */
	void *job;                /* the backend's, from the first group on */
	struct engine_item **items; /* the chunks hashed, in restore order */
	size_t count, next;       /* next: the next one the restore issues */
	size_t *group_end;        /* per group: the index after its last chunk */
	size_t *groups;           /* per group: its ranges */
	size_t group_count, next_group;
	struct checksum_range *ranges; /* the chunks' runs, in order */
	size_t range_count;
};

/* Before the restore of device d's chunks: which are verified, in which
 * groups. The backend's job (work buffer, range table) is made when the
 * first group's copies are queued; a backend that cannot hash then warns
 * once (in t) and the wake goes on unverified. */
int checksum_wake_start(struct engine *e, int d, struct engine_item *items, size_t count,
			struct engine_totals *t, struct verify_wake *w);
/* After the restore queued the copies of it (event recorded after the last
 * of them on the copy stream): the hash of its group, once complete, is
 * queued behind event. Chunks must come in items order. */
int checksum_wake_chunk(struct verify_wake *w, struct engine_item *it, void *event);
/* After the restore's copies are done: read the hashes back, compare, count;
 * -EIO names the first chunk that differs. Frees w, whatever it returns. */
int checksum_wake_finish(struct verify_wake *w, struct engine_totals *t);
/* After a failed restore: wait for the hashes queued (they read the chunks'
 * memory, which the failed wake then unmaps) and free w. */
void checksum_wake_abort(struct verify_wake *w);

#endif
