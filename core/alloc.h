/* SPDX-License-Identifier: MIT */
/* An allocation as the engine sees it (its chunks' owner) and an
 * allocation's end, below the manager's files that hand one to the engine or
 * end one (manager.c, transition.c, warmup.c). */
#ifndef DORMANT_ALLOC_H
#define DORMANT_ALLOC_H

#include "manager_state.h"

/* What the engine knows of a's chunks' owner (chunk.h). */
struct chunk_owner alloc_owner(struct alloc *a);
/* Give back everything a (unlinked from its tag already) holds: its chunks'
 * device memory and host copies, its address range, a itself. */
void alloc_destroy(struct dormant *m, struct alloc *a);
/* Destroy what dormant_free() deferred while checkpointed. With m->lock. */
void alloc_destroy_deferred(struct dormant *m);

#endif
