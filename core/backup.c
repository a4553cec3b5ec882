/* SPDX-License-Identifier: MIT */
/*
 * The host copy as the caller may see it (dormant.h, "Host copies"): where
 * the bytes of a kept range live while its tag is asleep (or while retain
 * mode keeps the copy of an awake tag), a copy of them, and the host mode
 * switched at run time. Read only: nothing here changes a chunk; the
 * manager lock keeps the tag's state, and so its chunks, still while a
 * lookup runs.
 */
#include <errno.h>
#include <string.h>

#include "manager.h"

/* Whether chunk c of a tag in state holds its host copy now, and so its plan
 * describes the copy: asleep, its sleep's copy (none needed when the plan
 * kept nothing: every byte comes back zero); awake, the copy retain mode
 * kept from the last wake. */
static bool chunk_has_copy(enum dormant_state state, const struct chunk *c)
{
	if (state == DORMANT_ASLEEP)
		return c->host_valid || c->plan.kept == 0;
	return state == DORMANT_AWAKE && c->retained && c->host.ptr;
}

/* The allocation holding [p, p + size) whose host copy exists; under m->lock.
 * Its owner (the allocation that holds the chunks) in *ret_owner. */
static int backup_find(struct dormant *m, uintptr_t p, size_t size, struct alloc **ret_owner)
{
	struct alloc *a, *owner;

	if (size == 0)
		return error_set(-EINVAL, "size is 0");
	a = alloc_containing(m, p, size);
	if (!a)
		return error_set(-EINVAL, "[%#lx, +%zu) is not inside one allocation of this manager",
				 (unsigned long)p, size);
	if (alloc_policy(a) != DORMANT_KEEP)
		return error_set(-ENOENT, "[%#lx, +%zu) is %s memory of tag '%s': it has no host copy",
				 (unsigned long)p, size, dormant_policy_name(alloc_policy(a)),
				 a->tag->name);
	if (a->tag->state != DORMANT_ASLEEP && a->tag->state != DORMANT_AWAKE)
		return error_set(-ENOENT, "tag '%s' is %s: its host copy is changing",
				 a->tag->name, dormant_state_name(a->tag->state));
	owner = a->slab ? a->slab : a;
	for (size_t i = 0; i < owner->chunk_count; i++) {
		const struct chunk *c = &owner->chunks[i];

		if (c->va >= p + size || c->va + c->size <= p)
			continue;
		if (!chunk_has_copy(a->tag->state, c))
			return error_set(-ENOENT, "tag '%s' is %s and no host copy holds [%#lx, +%zu)%s",
					 a->tag->name, dormant_state_name(a->tag->state),
					 (unsigned long)p, size,
					 a->tag->state == DORMANT_AWAKE
						 ? " (an awake tag keeps one only in retain mode)"
						 : "");
	}
	*ret_owner = owner;
	return 0;
}

DORMANT_EXPORT int dormant_host_backup(struct dormant *m, const void *ptr, size_t size,
				       void **ret_host)
{
	uintptr_t p = (uintptr_t)ptr;
	struct alloc *owner;
	void *host = NULL;
	int r;

	if (!m || !ptr || !ret_host)
		return error_set(-EINVAL, "NULL argument");
	pthread_mutex_lock(&m->lock);
	r = backup_find(m, p, size, &owner);
	for (size_t i = 0; r == 0 && i < owner->chunk_count; i++) {
		const struct chunk *c = &owner->chunks[i];
		size_t off = p - c->va;

		if (p < c->va || p >= c->va + c->size)
			continue;
		if (off + size > c->size) {
			r = error_set(-ERANGE, "[%p, +%zu) spans two chunks: their host copies are "
					       "apart", ptr, size);
			break;
		}
		r = error_set(-ERANGE, "the host copy of [%p, +%zu) is not in one piece: bytes "
				       "inside it were not live (marked unused, slab free space)",
			      ptr, size);
		for (size_t k = 0; k < c->plan.count; k++) {
			const struct copy_run *run = &c->plan.runs[k];

			if (off >= run->offset && off + size <= run->offset + run->size) {
				host = (char *)c->host.ptr + run->host_offset + (off - run->offset);
				r = 0;
				break;
			}
		}
		break;
	}
	pthread_mutex_unlock(&m->lock);
	if (r == 0)
		*ret_host = host;
	return r;
}

DORMANT_EXPORT int dormant_host_backup_read(struct dormant *m, const void *ptr, size_t size,
					    void *dst)
{
	uintptr_t p = (uintptr_t)ptr, end = p + size;
	struct alloc *owner;
	int r;

	if (!m || !ptr || !dst)
		return error_set(-EINVAL, "NULL argument");
	pthread_mutex_lock(&m->lock);
	r = backup_find(m, p, size, &owner);
	if (r == 0)
		memset(dst, 0, size); /* what the copy does not hold comes back zero */
	for (size_t i = 0; r == 0 && i < owner->chunk_count; i++) {
		const struct chunk *c = &owner->chunks[i];
		uintptr_t lo = MAX(p, c->va), hi = MIN(end, c->va + c->size);

		if (lo >= hi)
			continue;
		for (size_t k = 0; k < c->plan.count; k++) {
			const struct copy_run *run = &c->plan.runs[k];
			uintptr_t rlo = MAX(lo, c->va + run->offset);
			uintptr_t rhi = MIN(hi, c->va + run->offset + run->size);

			if (rlo >= rhi)
				continue;
			memcpy((char *)dst + (rlo - p),
			       (const char *)c->host.ptr + run->host_offset +
				       (rlo - c->va - run->offset),
			       rhi - rlo);
		}
	}
	pthread_mutex_unlock(&m->lock);
	return r;
}

DORMANT_EXPORT enum dormant_host_mode dormant_host_mode(const struct dormant *m)
{
	return m->host_mode;
}

DORMANT_EXPORT int dormant_set_host_mode(struct dormant *m, enum dormant_host_mode mode)
{
	int r = 0;

	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	if (mode != DORMANT_HOST_RETAIN && mode != DORMANT_HOST_RELEASE &&
	    mode != DORMANT_HOST_RECLAIMABLE)
		return error_set(-EINVAL, "host mode %d is not retain, release or reclaimable",
				 (int)mode);
	pthread_mutex_lock(&m->lock);
	if (m->transition_running)
		r = error_set(-EBUSY, "a transition is running");
	else {
		/* the engine reads it only while a transition runs, which the
		 * lock keeps from starting now; the last wake's unpins finish
		 * first, so that the new mode starts from settled buffers */
		engine_reclaims_wait(&m->engine);
		atomic_store(&m->host_mode, mode);
		m->engine.mode = mode;
	}
	pthread_mutex_unlock(&m->lock);
	return r;
}
