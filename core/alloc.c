/* SPDX-License-Identifier: MIT */
/* An allocation's owner for the engine, its end, and the ends deferred while
 * checkpointed (alloc.h). */
#include "alloc.h"

#include <stdio.h>
#include <stdlib.h>

struct chunk_owner alloc_owner(struct alloc *a)
{
	return (struct chunk_owner){
		.device = a->device, .ptr = a->ptr, .tag = a->tag->name, .held = &a->tag->held,
	};
}

void alloc_destroy_into(struct dormant *m, struct alloc *a, struct alloc_failures *fail)
{
	struct chunk_owner owner = alloc_owner(a);

	/* every piece goes whatever fails before it */
	for (size_t i = 0; i < a->chunk_count; i++) {
		if (engine_chunk_drop(&m->engine, &owner, &a->chunks[i]) < 0 && fail->count++ == 0)
			snprintf(fail->first, sizeof(fail->first), "%s", dormant_last_error());
		plan_finish(&a->chunks[i].plan);
	}
	marks_finish(&a->marks);
	if (m->backend->ops->va_free(m->backend, (uintptr_t)a->ptr, a->reserved) < 0 &&
	    fail->count++ == 0)
		snprintf(fail->first, sizeof(fail->first), "an address range: %s",
			 dormant_last_error());
	if (a->is_slab)
		slab_space_finish(&a->space);
	free(a);
}

void alloc_failures_log(struct dormant *m, const struct alloc_failures *fail)
{
	if (fail->count)
		log_write(&m->log, DORMANT_LOG_ERROR,
			  "freeing an allocation: %u failure(s), the first: %s", fail->count,
			  fail->first);
}

void alloc_destroy(struct dormant *m, struct alloc *a)
{
	struct alloc_failures fail = { 0 };

	alloc_destroy_into(m, a, &fail);
	alloc_failures_log(m, &fail);
}

void alloc_destroy_deferred(struct dormant *m, struct alloc_failures *fail)
{
	while (m->deferred) {
		struct alloc *a = m->deferred;

		m->deferred = a->next;
		alloc_destroy_into(m, a, fail);
	}
}

void alloc_transition_end(struct dormant *m, struct alloc *const *allocs, size_t count,
			  bool restored, struct alloc_failures *fail)
{
	for (size_t i = 0; i < count; i++) {
		struct alloc *a = allocs[i];

		a->in_transition = false;
		if (a->doomed)
			alloc_destroy_into(m, a, fail);
	}
	if (restored)
		alloc_destroy_deferred(m, fail);
}
