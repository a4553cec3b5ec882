/* SPDX-License-Identifier: MIT */
/*
 * What a sleep copies of a chunk, in one place.
 *
 * A chunk of a DORMANT_KEEP allocation is copied to host memory on sleep,
 * but not all of it: only its *live* bytes, the ones that must survive.
 * Not copied are
 *  - the bytes past the allocation's data (the granularity-rounded tail, a
 *    slab's free space after its highest live byte): chunk->data_bytes ends
 *    the data;
 *  - a slab's free holes between live sub-allocations, when they are at least
 *    EXTENT_MIN_HOLE long (a shorter hole costs less to copy than a copy of
 *    its own);
 *  - ranges marked unused (dormant_mark_unused()), whatever their length.
 * What is left are the chunk's *runs*: each is at least one copy, and the
 * host copy holds the runs packed one after another, in one exact-size
 * buffer per chunk (host memory is the live bytes, page-rounded, and one
 * registration per pin piece). The plan of a chunk is fixed when a sleep
 * collects it (under the manager lock) and describes its host copy until the
 * wake that consumes it: that wake copies the runs back and zero-fills the
 * rest of [0, span), marked bytes and holes alike.
 *
 * DORMANT_DISCARD (and DORMANT_REBUILD) chunks are never copied: they have
 * no plan, and a wake zero-fills them whole.
 */
#ifndef DORMANT_EXTENT_H
#define DORMANT_EXTENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

/* A range of bytes: a run, a mark, a slab's free space (slab.h). */
struct extent {
	size_t offset;
	size_t size;
};

/* Free slab space shorter than this between live bytes is copied. */
#define EXTENT_MIN_HOLE (64 * KiB)

/* Ranges marked unused in one chunk owner (a dedicated allocation or a
 * slab), offsets from the owner's start. Marks that come in address order
 * (as a caching allocator's free blocks are listed) are merged as they come;
 * others are appended and the set is sorted and coalesced when next read,
 * so that any order costs O(n log n), not O(n^2). */
struct mark_set {
	struct extent *v;
	size_t count, capacity;
	bool unsorted; /* v[] needs marks_normalize() before it is read */
};

/* Add [offset, offset + size); -ENOMEM (the set unchanged). */
int marks_add(struct mark_set *s, size_t offset, size_t size);
/* Sort and coalesce (plan_compute() and marks_remove() need it). */
void marks_normalize(struct mark_set *s);
/* Forget marks inside [offset, offset + size) (a freed sub-allocation).
 * Never fails: when splitting a mark needs memory it cannot get, the whole
 * mark goes (a lost mark only means more is copied). */
void marks_remove(struct mark_set *s, size_t offset, size_t size);
void marks_clear(struct mark_set *s);
void marks_finish(struct mark_set *s);

/* A piece of a chunk a sleep copies, and where it lies in the host copy. */
struct copy_run {
	size_t offset;      /* from the chunk's start */
	size_t size;
	size_t host_offset; /* in the chunk's host copy */
};

/* What a chunk's host copy holds. */
struct copy_plan {
	struct copy_run *runs;
	size_t count, capacity;
	size_t span;    /* the chunk's data bytes when planned: runs lie in [0, span) */
	size_t kept;    /* bytes in runs: the host copy's size */
	size_t skipped; /* marked bytes of [0, span) not copied (holes not counted) */
};

/*
 * Plan the copy of the chunk [chunk_offset, chunk_offset + data_bytes) of an
 * owner: minus the holes (sorted free extents of a slab, offsets from the
 * owner's start; NULL for a dedicated allocation) and the marks. -ENOMEM,
 * the plan then empty (nothing copied would lose data: callers fail).
 */
int plan_compute(struct copy_plan *p, size_t chunk_offset, size_t data_bytes,
		 const struct extent *holes, size_t hole_count, const struct mark_set *marks);
/* A plan that copies [0, data_bytes) whole. */
int plan_whole(struct copy_plan *p, size_t data_bytes);
/* Lay the runs out at multiples of align instead of packed (a disk copy,
 * diskfile.h); returns the bytes the copy then takes. */
size_t plan_align(struct copy_plan *p, size_t align);
void plan_finish(struct copy_plan *p);

/* Call fn for each range of [0, span) that the plan does not copy: what a
 * wake zero-fills. Stops at and returns the first error. */
int plan_for_each_gap(const struct copy_plan *p, int (*fn)(void *ctx, size_t offset, size_t size),
		      void *ctx);

#endif
