/* SPDX-License-Identifier: MIT */
#include "slab.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int slab_space_init(struct slab_space *s, size_t size)
{
	memset(s, 0, sizeof(*s));
	s->free = malloc(4 * sizeof(*s->free));
	if (!s->free)
		return error_set(-ENOMEM, "out of host memory");
	s->size = size;
	s->free_capacity = 4;
	s->free[0] = (struct extent){ .offset = 0, .size = size };
	s->free_count = 1;
	return 0;
}

void slab_space_finish(struct slab_space *s)
{
	free(s->free);
	memset(s, 0, sizeof(*s));
}

int slab_space_take(struct slab_space *s, size_t size, size_t *ret_offset)
{
	size = round_up(size, SLAB_ALIGN);
	/* Free extents lie between ranges in use, so there are at most live + 1
	 * of them: make room for that now, while failing is still allowed. */
	if (s->live + 2 > s->free_capacity) {
		size_t capacity = s->free_capacity * 2;
		struct extent *grown = realloc(s->free, capacity * sizeof(*grown));

		if (!grown)
			return error_set(-ENOMEM, "out of host memory");
		s->free = grown;
		s->free_capacity = capacity;
	}
	for (size_t i = 0; i < s->free_count; i++) {
		struct extent *e = &s->free[i];

		if (e->size < size)
			continue;
		*ret_offset = e->offset;
		e->offset += size;
		e->size -= size;
		if (e->size == 0) {
			memmove(e, e + 1, (s->free_count - i - 1) * sizeof(*e));
			s->free_count--;
		}
		s->live++;
		return 0;
	}
	return -ENOSPC;
}

void slab_space_give(struct slab_space *s, size_t offset, size_t size)
{
	size_t lo = 0, hi = s->free_count;
	struct extent *prev, *next;

	size = round_up(size, SLAB_ALIGN);
	s->live--;
	while (lo < hi) { /* first extent after offset */
		size_t mid = lo + (hi - lo) / 2;

		if (s->free[mid].offset < offset)
			lo = mid + 1;
		else
			hi = mid;
	}
	prev = lo > 0 ? &s->free[lo - 1] : NULL;
	next = lo < s->free_count ? &s->free[lo] : NULL;
	if (prev && prev->offset + prev->size == offset) {
		prev->size += size;
		if (next && prev->offset + prev->size == next->offset) {
			prev->size += next->size;
			memmove(next, next + 1, (s->free_count - lo - 1) * sizeof(*next));
			s->free_count--;
		}
		return;
	}
	if (next && offset + size == next->offset) {
		next->offset = offset;
		next->size += size;
		return;
	}
	memmove(&s->free[lo + 1], &s->free[lo], (s->free_count - lo) * sizeof(*s->free));
	s->free[lo] = (struct extent){ .offset = offset, .size = size };
	s->free_count++;
}

size_t slab_space_used_end(const struct slab_space *s)
{
	const struct extent *last;

	if (s->free_count == 0)
		return s->size;
	last = &s->free[s->free_count - 1];
	return last->offset + last->size == s->size ? last->offset : s->size;
}
