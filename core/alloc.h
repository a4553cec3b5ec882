/* SPDX-License-Identifier: MIT */
/* An allocation's end, below the manager's files that end one (manager.c,
 * transition.c, warmup.c). */
#ifndef DORMANT_ALLOC_H
#define DORMANT_ALLOC_H

#include "manager_state.h"

/* Give back everything a (unlinked from its tag already) holds: its chunks'
 * device memory and host copies, its address range, a itself. */
void alloc_destroy(struct dormant *m, struct alloc *a);
/* Destroy what dormant_free() deferred while checkpointed. With m->lock. */
void alloc_destroy_deferred(struct dormant *m);

#endif
