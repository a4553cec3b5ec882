/* SPDX-License-Identifier: MIT */
/*
 * The copy pipeline: one device's copies in one direction, a window of
 * ENGINE_WINDOW pieces in flight on the device's copy stream, each with an
 * event. A chunk's runs (extent.h) are queued in pieces that never span two
 * pinned pieces of its host copy (one cuMemcpy cannot span two registered
 * ranges) nor more than a staging slot; a host copy that is not pinned goes
 * through the staging ring (staging.h), its memcpy on the worker threads.
 * On sleep, a chunk is released the moment its last piece is done. On wake,
 * direct pieces go to the copy engines or the copy kernel as the wake's
 * struct wake_copy says, and its probes are cut and timed here.
 */
#ifndef DORMANT_PIPELINE_H
#define DORMANT_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>

#include "state.h"
#include "wakecopy.h"

struct flight {
	struct engine_item *item;
	size_t host_offset, length;
	int slot;  /* staging slot, or -1 for a direct copy */
	bool last; /* last piece of its chunk */
};

struct pipeline {
	struct engine *e;
	int device;
	struct engine_device *ed;
	bool to_host;
	struct engine_totals *totals;
	/* wake: what copies the direct pieces, and its probes (wakecopy.h);
	 * NULL: the copy engines */
	struct wake_copy *wc;
	struct flight ring[ENGINE_WINDOW];
	unsigned head, count;
	bool slot_busy[ENGINE_STAGING_SLOTS];
};

/* Queue the runs of an item's plan (its staging ring must be ready when its
 * host copy is not pinned). pin: a sleep registers the host copy piece by
 * piece just ahead of its copies (a wake passes false). */
int pipeline_issue_chunk(struct pipeline *p, struct engine_item *it, bool pin);
/* The event recorded after the last piece queued (NULL: none in flight). */
void *pipeline_last_event(const struct pipeline *p);
/* Wait for everything in flight, finishing each piece. */
int pipeline_drain(struct pipeline *p);
/* After a failure: wait out what is in flight, finishing nothing. */
void pipeline_abort(struct pipeline *p);

#endif
