/* SPDX-License-Identifier: MIT */
/*
 * The public entries of chunk checksums (dormant.h, "Checksums"): the
 * verification setting, the hash on the CPU and on the backend, and the test
 * hook that corrupts a host copy. The engine's side is core/engine/checksum.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "checksum.h"
#include "manager.h"

DORMANT_EXPORT int dormant_set_verify(struct dormant *m, bool on)
{
	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	atomic_store(&m->engine.verify, on);
	return 0;
}

DORMANT_EXPORT int dormant_checksum(const void *p, size_t size, uint64_t offset, uint64_t out[2])
{
	struct checksum sum;

	if ((!p && size) || !out)
		return error_set(-EINVAL, "NULL argument");
	sum = checksum_cpu(p, size, offset);
	out[0] = sum.lane[0];
	out[1] = sum.lane[1];
	return 0;
}

DORMANT_EXPORT int dormant_debug_checksum(struct dormant *m, const void *device_ptr, size_t size,
					  uint64_t offset, uint64_t out[2])
{
	struct backend *b;
	struct checksum sum = { { 0, 0 } };
	struct alloc *a;
	void *stream = NULL;
	int r;

	if (!m || !device_ptr || !out)
		return error_set(-EINVAL, "NULL argument");
	b = m->backend;
	if (!b->ops->checksum)
		return error_set(-ENOTSUP, "the %s backend cannot hash", b->ops->name);
	pthread_mutex_lock(&m->lock);
	a = alloc_containing(m, (uintptr_t)device_ptr, size);
	if (!a)
		r = error_set(-EINVAL, "[%p, +%zu) is not inside one allocation of this manager",
			      device_ptr, size);
	else if (a->tag->state != DORMANT_AWAKE)
		r = error_set(-EBUSY, "tag '%s' is %s", a->tag->name,
			      dormant_state_name(a->tag->state));
	else
		r = b->ops->stream_create(b, a->device, &stream);
	if (r == 0 && size) {
		struct checksum_range range = { .ptr = (uintptr_t)device_ptr, .size = size,
						.offset = offset };

		r = b->ops->checksum(b, a->device, &range, 1, stream, &sum);
	}
	if (stream)
		b->ops->stream_destroy(b, a->device, stream);
	pthread_mutex_unlock(&m->lock);
	if (r == 0) {
		out[0] = sum.lane[0];
		out[1] = sum.lane[1];
	}
	return r;
}

DORMANT_EXPORT int dormant_debug_corrupt_host(struct dormant *m, const void *device_ptr,
					      unsigned char mask)
{
	uintptr_t p = (uintptr_t)device_ptr;
	struct alloc *a, *owner;
	int r = -ENOENT;

	if (!m || !device_ptr || !mask)
		return error_set(-EINVAL, "NULL argument or zero mask");
	pthread_mutex_lock(&m->lock);
	a = alloc_containing(m, p, 1);
	if (!a) {
		r = error_set(-EINVAL, "%p is not inside an allocation of this manager", device_ptr);
		goto out;
	}
	if (a->tag->state != DORMANT_ASLEEP) {
		r = error_set(-EBUSY, "tag '%s' is %s", a->tag->name,
			      dormant_state_name(a->tag->state));
		goto out;
	}
	owner = a->slab ? a->slab : a;
	for (size_t i = 0; i < owner->chunk_count && r == -ENOENT; i++) {
		struct chunk *c = &owner->chunks[i];

		if (p < c->va || p >= c->va + c->size || !c->host_valid)
			continue;
		for (size_t k = 0; k < c->plan.count; k++) {
			const struct copy_run *run = &c->plan.runs[k];
			size_t off = p - c->va;

			size_t pos = run->host_offset + off - run->offset;

			if (off < run->offset || off >= run->offset + run->size)
				continue;
			if (c->disk.open) { /* DORMANT_DISK: a file corrupted while asleep */
				r = diskfile_xor_byte(&c->disk, pos, mask);
			} else {
				((unsigned char *)c->host.ptr)[pos] ^= mask;
				r = 0;
			}
			break;
		}
	}
	if (r == -ENOENT)
		error_set(r, "no host copy holds the byte at %p", device_ptr);
out:
	pthread_mutex_unlock(&m->lock);
	return r;
}
