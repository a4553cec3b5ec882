/* SPDX-License-Identifier: MIT */
/*
 * Entry points for PyTorch's CUDAPluggableAllocator. PyTorch calls them with
 * no context argument, so the manager is process-wide and the tag is the
 * calling thread's (set by the Python package around a region). The manager
 * they use is the one dormant_torch_set_manager() attached (manager.c, which
 * detaches it when it is destroyed).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "manager.h"

static _Thread_local char thread_tag[DORMANT_TAG_MAX + 1];
static _Thread_local int thread_policy = DORMANT_POLICY_TAG;

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

DORMANT_EXPORT int dormant_set_thread_policy(int policy)
{
	if (policy != DORMANT_KEEP && policy != DORMANT_DISCARD && policy != DORMANT_DISK &&
	    policy != DORMANT_POLICY_TAG)
		return error_set(-EINVAL,
				 "a thread's policy must be keep (%d), discard (%d), disk (%d) or "
				 "the tag's (%d), not %d",
				 DORMANT_KEEP, DORMANT_DISCARD, DORMANT_DISK, DORMANT_POLICY_TAG,
				 policy);
	thread_policy = policy;
	return 0;
}

DORMANT_EXPORT int dormant_get_thread_policy(void)
{
	return thread_policy;
}

DORMANT_EXPORT void *dormant_torch_malloc(size_t size, int device, void *stream)
{
	struct dormant *m = dormant_torch_get_manager();
	void *ptr = NULL;

	(void)stream;
	if (!m) {
		error_set(-ENODEV, "no dormant manager is attached to the PyTorch allocator");
		return NULL;
	}
	if (dormant_alloc_policy(m, thread_tag[0] ? thread_tag : "default", thread_policy, size,
				 device, &ptr) < 0)
		return NULL;
	return ptr;
}

DORMANT_EXPORT void dormant_torch_free(void *ptr, size_t size, int device, void *stream)
{
	struct dormant *m = dormant_torch_get_manager();
	struct backend *b;

	(void)size;
	(void)stream;
	if (!m || !ptr)
		return;
	/*
	 * PyTorch's caching allocator gives a segment back once its blocks are
	 * free in its own books, relying on cudaFree() to wait until the device
	 * is idle. cuMemUnmap() does not wait, and kernels queued on any stream
	 * may still use the segment: wait for the device here, as cudaFree()
	 * would. (Segments go back rarely: on an out-of-memory retry, on
	 * emptying a pool, when a pool is destroyed.)
	 *
	 * Not while the process is checkpointed (residue mode): nothing can be
	 * queued then, and a driver call would crash in the driver, as
	 * PyTorch's pools destroyed at interpreter exit did (issue 34). The
	 * free itself waits for the restore (dormant_free()).
	 */
	b = m->backend;
	if (residue_device_enter(&m->residue)) {
		if (device >= 0 && device < b->ops->device_count(b) &&
		    b->ops->synchronize(b, device) < 0)
			log_write(&m->log, DORMANT_LOG_WARNING,
				  "PyTorch free of %p: synchronizing device %d: %s", ptr, device,
				  dormant_last_error());
		residue_device_leave(&m->residue);
	}
	if (dormant_free(m, ptr) < 0)
		log_write(&m->log, DORMANT_LOG_WARNING, "PyTorch free: %s", dormant_last_error());
}
