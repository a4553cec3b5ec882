/* SPDX-License-Identifier: MIT */
/*
 * Host-copy preparation for a sleep: a buffer of each kept chunk's plan size
 * (extent.h), faulted in before its copies are queued. Host copies are
 * pinned so that the copy engine moves them at full speed, both ways. A
 * fresh buffer must be faulted in (per-core work, spread over the workers)
 * and registered; together they are the slow part of a first sleep. So a
 * thread runs ahead of the copies, faulting in the buffers of the next
 * chunks (first waiting for the last wake's unpin of a reclaimable one).
 * Registering is not done here: the driver serializes it with every other
 * call, so the thread that queues the copies registers each piece itself,
 * just ahead of its copy (pipeline.c), and the copies of earlier pieces run
 * meanwhile. When registering fails, the copy stays in ordinary memory and
 * goes through the pinned staging ring instead.
 */
#ifndef DORMANT_PREPARE_H
#define DORMANT_PREPARE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "state.h"

struct prep {
	struct engine *e;
	struct engine_item **queue; /* items needing a buffer, in issue order */
	size_t count;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	size_t faulted; /* queue[0..faulted) are allocated and touched */
	size_t next;    /* the consumer's next queue entry */
	bool stop;
	int error;
	char message[DORMANT_ERROR_MAX];
	pthread_t fault_thread;
	bool fault_running;
};

/* Start preparing the host copies of device d's kept chunks that need a
 * fresh buffer (of their plan's size), in items order. */
int prep_start(struct prep *p, struct engine *e, int d, struct engine_item *items, size_t count);
/* Wait until it has its host buffer, faulted in but not registered yet
 * (call in items order). */
int prep_wait(struct prep *p, struct engine_item *it);
/* Stop the threads and free what prep_start() took; after any result. */
void prep_finish(struct prep *p);

/* Whether a host buffer serves as the host copy of kept bytes: large
 * enough, and not much larger (host memory stays near the live bytes). */
bool prep_host_fits(const struct hostbuf *hb, size_t kept);
/* A host copy of kept bytes ahead of any sleep (the warm-up): allocated,
 * and where the engine pins, faulted in and pinned; a sleep that finds it
 * fitting uses it as it is. reclaimable (host mode reclaimable): faulted in
 * (paying the fresh pages' clearing and, the first time, the kernel's
 * compaction for huge pages) and handed to the kernel with MADV_FREE,
 * unpinned: the state a wake leaves a host copy in, which the next sleep
 * reuses where the kernel left it; -EOPNOTSUPP where MADV_FREE fails. On
 * failure nothing stays allocated. */
int prep_host_copy(struct engine *e, size_t kept, bool reclaimable, struct hostbuf *ret);

#endif
