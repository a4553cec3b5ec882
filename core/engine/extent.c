/* SPDX-License-Identifier: MIT */
#include "extent.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- marks --------------------------------------------------------------- */

static int marks_reserve(struct mark_set *s, size_t count)
{
	size_t capacity;
	struct extent *grown;

	if (count <= s->capacity)
		return 0;
	capacity = s->capacity ? s->capacity * 2 : 8;
	while (capacity < count)
		capacity *= 2;
	grown = realloc(s->v, capacity * sizeof(*grown));
	if (!grown)
		return error_set(-ENOMEM, "out of host memory");
	s->v = grown;
	s->capacity = capacity;
	return 0;
}

/* Index of the first mark that ends at or after offset. */
static size_t marks_first_reaching(const struct mark_set *s, size_t offset)
{
	size_t lo = 0, hi = s->count;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (s->v[mid].offset + s->v[mid].size < offset)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int extent_compare(const void *a, const void *b)
{
	const struct extent *x = a, *y = b;

	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

void marks_normalize(struct mark_set *s)
{
	size_t out = 0;

	if (!s->unsorted)
		return;
	qsort(s->v, s->count, sizeof(*s->v), extent_compare);
	for (size_t i = 0; i < s->count; i++) {
		struct extent *last = out ? &s->v[out - 1] : NULL;

		if (last && s->v[i].offset <= last->offset + last->size)
			last->size = MAX(last->offset + last->size, s->v[i].offset + s->v[i].size) -
				     last->offset;
		else
			s->v[out++] = s->v[i];
	}
	s->count = out;
	s->unsorted = false;
}

int marks_add(struct mark_set *s, size_t offset, size_t size)
{
	size_t end = offset + size, i, j;
	struct extent *last;
	int r;

	if (size == 0)
		return 0;
	if (s->unsorted && s->count == s->capacity)
		marks_normalize(s); /* may make room without growing */
	r = marks_reserve(s, s->count + 1);
	if (r < 0)
		return r;
	last = s->count ? &s->v[s->count - 1] : NULL;
	if (s->unsorted || (last && offset < last->offset)) {
		/* out of order: sorted when next read */
		s->v[s->count++] = (struct extent){ .offset = offset, .size = size };
		s->unsorted = true;
		return 0;
	}
	/* marks [i, j) touch or overlap the new one: they merge into it */
	i = marks_first_reaching(s, offset);
	for (j = i; j < s->count && s->v[j].offset <= end; j++) {
		offset = MIN(offset, s->v[j].offset);
		end = MAX(end, s->v[j].offset + s->v[j].size);
	}
	if (j == i) {
		memmove(&s->v[i + 1], &s->v[i], (s->count - i) * sizeof(*s->v));
		s->count++;
	} else if (j > i + 1) {
		memmove(&s->v[i + 1], &s->v[j], (s->count - j) * sizeof(*s->v));
		s->count -= j - i - 1;
	}
	s->v[i] = (struct extent){ .offset = offset, .size = end - offset };
	return 0;
}

void marks_remove(struct mark_set *s, size_t offset, size_t size)
{
	size_t end = offset + size;

	marks_normalize(s);
	for (size_t i = marks_first_reaching(s, offset); i < s->count && s->v[i].offset < end;) {
		struct extent *e = &s->v[i];
		size_t e_end = e->offset + e->size;

		if (e_end <= offset) {
			i++;
			continue;
		}
		if (e->offset < offset && e_end > end) {
			/* the freed range is inside the mark: split it */
			if (marks_reserve(s, s->count + 1) == 0) {
				e = &s->v[i];
				memmove(&s->v[i + 1], &s->v[i], (s->count - i) * sizeof(*s->v));
				s->count++;
				s->v[i].size = offset - s->v[i].offset;
				s->v[i + 1] = (struct extent){ .offset = end, .size = e_end - end };
				return;
			}
			/* no memory: drop the whole mark, copying more is safe */
		} else if (e->offset < offset) {
			e->size = offset - e->offset;
			i++;
			continue;
		} else if (e_end > end) {
			e->size = e_end - end;
			e->offset = end;
			i++;
			continue;
		}
		memmove(&s->v[i], &s->v[i + 1], (s->count - i - 1) * sizeof(*s->v));
		s->count--;
	}
}

void marks_clear(struct mark_set *s)
{
	s->count = 0;
	s->unsorted = false;
}

void marks_finish(struct mark_set *s)
{
	free(s->v);
	memset(s, 0, sizeof(*s));
}

/* ---- plans --------------------------------------------------------------- */

static int plan_push(struct copy_plan *p, size_t offset, size_t size)
{
	if (size == 0)
		return 0;
	if (p->count && p->runs[p->count - 1].offset + p->runs[p->count - 1].size == offset) {
		p->runs[p->count - 1].size += size;
		p->kept += size;
		return 0;
	}
	if (p->count == p->capacity) {
		size_t capacity = p->capacity ? p->capacity * 2 : 4;
		struct copy_run *grown = realloc(p->runs, capacity * sizeof(*grown));

		if (!grown)
			return error_set(-ENOMEM, "out of host memory");
		p->runs = grown;
		p->capacity = capacity;
	}
	p->runs[p->count++] = (struct copy_run){ .offset = offset, .size = size,
						 .host_offset = p->kept };
	p->kept += size;
	return 0;
}

/* One sorted list of extents, walked forward, clipped to a window. */
struct cursor {
	const struct extent *v;
	size_t count, i;
	size_t min_size; /* shorter extents are skipped (copied) */
};

static bool cursor_next(struct cursor *c, size_t lo, size_t hi, size_t *ret_start,
			size_t *ret_end)
{
	for (; c->i < c->count; c->i++) {
		const struct extent *e = &c->v[c->i];
		size_t start = MAX(e->offset, lo), end = MIN(e->offset + e->size, hi);

		if (e->offset >= hi)
			return false;
		if (end <= start || e->size < c->min_size)
			continue;
		*ret_start = start;
		*ret_end = end;
		return true;
	}
	return false;
}

int plan_compute(struct copy_plan *p, size_t chunk_offset, size_t data_bytes,
		 const struct extent *holes, size_t hole_count, const struct mark_set *marks)
{
	size_t lo = chunk_offset, hi = chunk_offset + data_bytes, pos = lo, hole_bytes = 0;
	struct cursor hc = { .v = holes, .count = holes ? hole_count : 0,
			     .min_size = EXTENT_MIN_HOLE };
	struct cursor mc = { .v = marks ? marks->v : NULL, .count = marks ? marks->count : 0 };
	size_t hs = 0, he = 0, ms = 0, me = 0;
	bool h, mk;
	int r;

	assert(!marks || !marks->unsorted); /* marks_normalize() first */
	p->count = 0;
	p->kept = 0;
	p->skipped = 0;
	p->span = data_bytes;
	/* skip to the first extents that can reach the window */
	while (hc.i < hc.count && hc.v[hc.i].offset + hc.v[hc.i].size <= lo)
		hc.i++;
	mc.i = marks ? marks_first_reaching(marks, lo) : 0;
	h = cursor_next(&hc, lo, hi, &hs, &he);
	mk = cursor_next(&mc, lo, hi, &ms, &me);
	while (h || mk) {
		/* the excluded extent that starts first */
		bool take_hole = h && (!mk || hs <= ms);
		size_t start = take_hole ? hs : ms, end = take_hole ? he : me;

		if (take_hole) {
			hole_bytes += he - hs;
			hc.i++;
			h = cursor_next(&hc, lo, hi, &hs, &he);
		} else {
			mc.i++;
			mk = cursor_next(&mc, lo, hi, &ms, &me);
		}
		if (start > pos) {
			r = plan_push(p, pos - lo, start - pos);
			if (r < 0)
				goto err;
		}
		pos = MAX(pos, end);
	}
	if (pos < hi) {
		r = plan_push(p, pos - lo, hi - pos);
		if (r < 0)
			goto err;
	}
	/* holes and marks may overlap: skipped is what the marks add */
	p->skipped = data_bytes - p->kept - hole_bytes;
	return 0;

err:
	p->count = p->kept = p->skipped = 0;
	return r;
}

int plan_whole(struct copy_plan *p, size_t data_bytes)
{
	return plan_compute(p, 0, data_bytes, NULL, 0, NULL);
}

size_t plan_align(struct copy_plan *p, size_t align)
{
	size_t end = 0;

	for (size_t i = 0; i < p->count; i++) {
		p->runs[i].host_offset = end;
		end += round_up(p->runs[i].size, align);
	}
	return end;
}

void plan_finish(struct copy_plan *p)
{
	free(p->runs);
	memset(p, 0, sizeof(*p));
}

int plan_for_each_gap(const struct copy_plan *p, int (*fn)(void *ctx, size_t offset, size_t size),
		      void *ctx)
{
	size_t pos = 0;
	int r;

	for (size_t i = 0; i < p->count; i++) {
		if (p->runs[i].offset > pos) {
			r = fn(ctx, pos, p->runs[i].offset - pos);
			if (r < 0)
				return r;
		}
		pos = p->runs[i].offset + p->runs[i].size;
	}
	if (pos < p->span)
		return fn(ctx, pos, p->span - pos);
	return 0;
}
