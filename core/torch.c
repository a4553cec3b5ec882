/* SPDX-License-Identifier: MIT */
/*
 * Entry points for PyTorch's CUDAPluggableAllocator. PyTorch calls them with
 * no context argument, so the manager is process-wide and the tag is the
 * calling thread's (set by the Python package around a region).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "manager.h"

static _Atomic(struct dormant *) torch_manager;
static _Thread_local char thread_tag[DORMANT_TAG_MAX + 1];

DORMANT_EXPORT int dormant_torch_set_manager(struct dormant *m)
{
	atomic_store(&torch_manager, m);
	return 0;
}

void torch_forget(struct dormant *m)
{
	struct dormant *expected = m;

	atomic_compare_exchange_strong(&torch_manager, &expected, NULL);
}

DORMANT_EXPORT int dormant_set_thread_tag(const char *tag)
{
	int r;

	if (!tag) {
		thread_tag[0] = '\0';
		return 0;
	}
	r = tag_name_check(tag);
	if (r < 0)
		return r;
	snprintf(thread_tag, sizeof(thread_tag), "%s", tag);
	return 0;
}

DORMANT_EXPORT int dormant_get_thread_tag(char *buf, size_t size)
{
	if (!buf || size < DORMANT_TAG_MAX + 1)
		return error_set(-EINVAL, "buffer must hold %d bytes", DORMANT_TAG_MAX + 1);
	snprintf(buf, size, "%s", thread_tag[0] ? thread_tag : "default");
	return 0;
}

DORMANT_EXPORT void *dormant_torch_malloc(size_t size, int device, void *stream)
{
	struct dormant *m = atomic_load(&torch_manager);
	void *ptr = NULL;

	(void)stream;
	if (!m) {
		error_set(-ENODEV, "no dormant manager is attached to the PyTorch allocator");
		return NULL;
	}
	if (dormant_alloc_on(m, thread_tag[0] ? thread_tag : "default", size, device, &ptr) < 0)
		return NULL;
	return ptr;
}

DORMANT_EXPORT void dormant_torch_free(void *ptr, size_t size, int device, void *stream)
{
	struct dormant *m = atomic_load(&torch_manager);

	(void)size;
	(void)device;
	(void)stream;
	if (m)
		dormant_free(m, ptr);
}
