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
 *  - wake (checksum_verify(), after the restore copies of a device): hash the
 *    restored chunks again and compare; a mismatch fails the wake (-EIO,
 *    the chunk named) and, as every failed wake, leaves the tags asleep with
 *    their host copies. Only with verification on.
 *  - wake commit (checksum_commit()): remember, per chunk, that its retained
 *    host copy holds what the device now has.
 * Ranges marked unused and slab holes are not copied and come back zero:
 * they are not hashed, the runs are (extent.h).
 */
#ifndef DORMANT_VERIFY_H
#define DORMANT_VERIFY_H

#include "transfer.h"

int checksum_sleep(struct engine *e, int d, struct xfer_item *items, size_t count,
		   struct xfer_totals *t);
int checksum_verify(struct engine *e, int d, struct xfer_item *items, size_t count,
		    struct xfer_totals *t);
void checksum_commit(struct engine *e, struct xfer_item *it);

#endif
