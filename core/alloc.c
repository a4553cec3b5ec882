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

void alloc_destroy(struct dormant *m, struct alloc *a)
{
	struct chunk_owner owner = alloc_owner(a);
	char why[DORMANT_ERROR_MAX] = "";
	unsigned failed = 0;

	/* every piece goes whatever fails before it; one line says what did */
	for (size_t i = 0; i < a->chunk_count; i++) {
		if (engine_chunk_drop(&m->engine, &owner, &a->chunks[i]) < 0 && failed++ == 0)
			snprintf(why, sizeof(why), "%s", dormant_last_error());
		plan_finish(&a->chunks[i].plan);
	}
	marks_finish(&a->marks);
	if (m->backend->ops->va_free(m->backend, (uintptr_t)a->ptr, a->reserved) < 0 &&
	    failed++ == 0)
		snprintf(why, sizeof(why), "its address range: %s", dormant_last_error());
	if (a->is_slab)
		slab_space_finish(&a->space);
	free(a);
	if (failed)
		log_write(&m->log, DORMANT_LOG_ERROR,
			  "freeing an allocation: %u failure(s), the first: %s", failed, why);
}

void alloc_destroy_deferred(struct dormant *m)
{
	while (m->deferred) {
		struct alloc *a = m->deferred;

		m->deferred = a->next;
		alloc_destroy(m, a);
	}
}
