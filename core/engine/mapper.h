/* SPDX-License-Identifier: MIT */
/*
 * Device memory of a wake, created and mapped ahead of the copies. After
 * another process used the memory, creating physical memory takes about as
 * long as copying into it (the driver clears pages another process held), so
 * a thread maps one device's chunks in order while the copies of the chunks
 * already mapped run: the wake costs about the larger of the two instead of
 * their sum. The consumer takes the chunks in the same order and waits for
 * each one's mapping. The first failure (out of memory: another process
 * still holds it) stops the threads; the consumer sees it at the next chunk,
 * and the wake gives back everything mapped (mapped_here), as before.
 * DORMANT_WAKE_MAP_THREADS (1 by default) threads map, each claiming the
 * next chunk in order: whether the driver maps faster so is for the GPU to
 * say (bench/handover.py).
 */
#ifndef DORMANT_MAPPER_H
#define DORMANT_MAPPER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "state.h"

#define MAPPER_THREADS_MAX 8

struct mapper {
	struct engine *e;
	int device;
	struct engine_item **queue; /* device's unmapped items, in items order */
	size_t count;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool *mapped;   /* per queue entry: its mapping is done */
	size_t claimed; /* queue[0..claimed) were taken by a thread */
	size_t next;    /* the consumer's next queue entry */
	double wait_s;  /* the consumer's time waiting for mappings */
	bool stop;
	int error;      /* the first failure; the threads stop */
	char message[DORMANT_ERROR_MAX];
	pthread_t threads[MAPPER_THREADS_MAX];
	unsigned running;
};

/* Queue device d's unmapped chunks of items and start mapping them (on
 * e->map_threads threads; without one, mapper_wait() maps each chunk
 * itself). -ENOMEM. */
int mapper_start(struct mapper *mp, struct engine *e, int d, struct engine_item *items,
		 size_t count);
/* Wait until it is mapped (call in items order; items not queued return at
 * once). Returns the mapping's error, or the first error of an earlier one. */
int mapper_wait(struct mapper *mp, struct engine_item *it);
/* Stop the thread and count what it mapped into t; after any result. */
void mapper_finish(struct mapper *mp, struct engine_totals *t);

/* Create and map one item's chunk at its address, with device accounting;
 * marks it mapped_here (bytes_mapped is counted by the caller). */
int mapper_map_one(struct engine *e, struct engine_item *it);

#endif
