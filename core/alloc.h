/* SPDX-License-Identifier: MIT */
/* An allocation as the engine sees it (its chunks' owner) and an
 * allocation's end, below the manager's files that hand one to the engine or
 * end one (manager.c, transition.c, warmup.c). */
#ifndef DORMANT_ALLOC_H
#define DORMANT_ALLOC_H

#include "manager_state.h"

/* What the engine knows of a's chunks' owner (chunk.h). */
struct chunk_owner alloc_owner(struct alloc *a);
/* What ending allocations could not give back (the rest goes all the same):
 * how many pieces, and the first one's message. */
struct alloc_failures {
	unsigned count;
	char first[DORMANT_ERROR_MAX];
};

/* Give back everything a (unlinked from its tag already) holds: its chunks'
 * device memory, host and disk copies, its address range, a itself; what
 * could not be given back is added to *fail. */
void alloc_destroy_into(struct dormant *m, struct alloc *a, struct alloc_failures *fail);
/* The same, its failures logged (one line). */
void alloc_destroy(struct dormant *m, struct alloc *a);
/* Destroy what dormant_free() deferred while checkpointed, failures added to
 * *fail. With m->lock. */
void alloc_destroy_deferred(struct dormant *m, struct alloc_failures *fail);
/* A transition's allocations leave it (in_transition cleared): those freed
 * meanwhile (doomed) are destroyed, and, when it restored the residue (the
 * driver takes frees again), those deferred while checkpointed; failures
 * added to *fail. With m->lock. */
void alloc_transition_end(struct dormant *m, struct alloc *const *allocs, size_t count,
			  bool restored, struct alloc_failures *fail);
/* Log the line that says what *fail holds, if anything. */
void alloc_failures_log(struct dormant *m, const struct alloc_failures *fail);

#endif
