/* SPDX-License-Identifier: MIT */
/*
 * Slabs: small allocations share physical chunks.
 *
 * Physical memory costs per chunk, not per byte (creating and mapping a
 * chunk takes tens of microseconds, whatever its size up to gigabytes), and
 * every chunk is at least the granularity (2 MiB). A model of ten thousand
 * tensors would pay that ten thousand times on every wake and sleep. So
 * allocations up to SLAB_ALLOC_MAX are carved out of per-tag, per-device
 * slabs (an internal allocation of its own), first fit, 512-byte aligned;
 * a slab's memory goes back when its last allocation is freed. A sleep
 * copies a slab up to its highest live byte.
 */
#ifndef DORMANT_SLAB_H
#define DORMANT_SLAB_H

#include <stdbool.h>
#include <stddef.h>

#include "extent.h"
#include "util.h"

#define SLAB_ALLOC_MAX (32 * MiB) /* larger allocations get chunks of their own */
#define SLAB_MIN_BYTES (2 * MiB)
#define SLAB_MAX_BYTES (256 * MiB)
#define SLAB_ALIGN 512

/* The free space of one slab: sorted, coalesced extents. */
struct slab_space {
	size_t size;
	struct extent *free;
	size_t free_count;
	size_t free_capacity; /* >= live + 2: a give never needs memory */
	size_t live;          /* ranges in use */
};

/* The whole slab free. */
int slab_space_init(struct slab_space *s, size_t size);
void slab_space_finish(struct slab_space *s);

/* Take size bytes (rounded up to SLAB_ALIGN), first fit: -ENOSPC if no
 * extent is large enough, -ENOMEM. Reserves what slab_space_give() needs, so
 * giving back never fails. */
int slab_space_take(struct slab_space *s, size_t size, size_t *ret_offset);
void slab_space_give(struct slab_space *s, size_t offset, size_t size);

/* One past the highest byte in use (0 when empty). */
size_t slab_space_used_end(const struct slab_space *s);
/* True when nothing is in use. */
static inline bool slab_space_empty(const struct slab_space *s)
{
	return s->live == 0;
}

#endif
