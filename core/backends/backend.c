/* SPDX-License-Identifier: MIT */
/* The wrappers every backend shares: fault injection, call counting. */
#include "backend.h"

#include <errno.h>
#include <string.h>

void backend_destroy(struct backend *b)
{
	if (!b)
		return;
	for (int d = 0; d < DORMANT_DEVICES_MAX; d++)
		if (b->occupy_count[d])
			backend_occupy(b, d, 0);
	b->ops->destroy(b);
}

int backend_fault_arm_on(struct backend *b, enum dormant_fault_op op, int device, unsigned nth,
			 int error, bool repeat)
{
	struct fault *f;

	if ((unsigned)op >= DORMANT_FAULT_OPS)
		return error_set(-EINVAL, "unknown fault operation %d", (int)op);
	if (nth && error >= 0)
		return error_set(-EINVAL, "an injected error must be a negative errno");
	if (device >= 0 && (device >= DORMANT_DEVICES_MAX || device >= b->ops->device_count(b)))
		return error_set(-EINVAL, "no device %d to inject a fault on", device);
	if (device >= 0 && (op == DORMANT_FAULT_HOST_ALLOC || op == DORMANT_FAULT_DISK ||
			    op == DORMANT_FAULT_CHECKPOINT || op == DORMANT_FAULT_RESTORE))
		return error_set(-EINVAL, "host allocations, disk I/O and the process checkpoint "
					  "belong to no device");
	f = &b->faults[op];
	atomic_store(&f->error, error);
	atomic_store(&f->repeat, repeat);
	atomic_store(&f->device_only, device < 0 ? 0 : device + 1);
	atomic_store(&f->armed_at, device < 0 ? atomic_load(&f->calls)
					       : atomic_load(&f->device_calls[device]));
	atomic_store(&f->target, !nth ? 0 : atomic_load(&f->armed_at) + nth);
	return 0;
}

int backend_fault_arm(struct backend *b, enum dormant_fault_op op, unsigned nth, int error,
		      bool repeat)
{
	return backend_fault_arm_on(b, op, -1, nth, error, repeat);
}

/* Count a call of op for device (-1: none); the armed error if this call is
 * to fail (its number since the fault was armed in *ret_call), else 0. */
static int fault_due(struct backend *b, enum dormant_fault_op op, int device,
		     uint64_t *ret_call)
{
	struct fault *f = &b->faults[op];
	uint64_t call = atomic_fetch_add(&f->calls, 1) + 1;
	uint64_t target = atomic_load(&f->target);
	int only = atomic_load(&f->device_only) - 1;

	if (device >= 0 && device < DORMANT_DEVICES_MAX) {
		uint64_t device_call = atomic_fetch_add(&f->device_calls[device], 1) + 1;

		if (only >= 0) {
			if (device != only)
				return 0;
			call = device_call;
		}
	}
	if (!target || call < target || (call > target && !atomic_load(&f->repeat)))
		return 0;
	/* counted as the rule counts: the Nth call since it was armed */
	*ret_call = call - atomic_load(&f->armed_at);
	return atomic_load(&f->error);
}

int backend_fault_due(struct backend *b, enum dormant_fault_op op)
{
	uint64_t call;

	return fault_due(b, op, -1, &call);
}

int backend_fault_check_on(struct backend *b, enum dormant_fault_op op, int device)
{
	static const char *const names[] = {
		[DORMANT_FAULT_CREATE] = "create",
		[DORMANT_FAULT_MAP] = "map",
		[DORMANT_FAULT_COPY] = "copy",
		[DORMANT_FAULT_HOST_ALLOC] = "host allocation",
		[DORMANT_FAULT_DISK] = "disk",
		[DORMANT_FAULT_CHECKPOINT] = "checkpoint",
		[DORMANT_FAULT_RESTORE] = "restore",
	};
	_Static_assert(ARRAY_SIZE(names) == DORMANT_FAULT_OPS, "a name for every fault op");
	uint64_t call = 0;
	int e = fault_due(b, op, device, &call);

	if (!e)
		return 0;
	if (atomic_load(&b->faults[op].device_only) > 0)
		return error_set(e, "injected fault: %s call %llu on device %d failed (%s)",
				 names[op], (unsigned long long)call, device, strerror(-e));
	return error_set(e, "injected fault: %s call %llu failed (%s)", names[op],
			 (unsigned long long)call, strerror(-e));
}

int backend_fault_check(struct backend *b, enum dormant_fault_op op)
{
	return backend_fault_check_on(b, op, -1);
}

int backend_mem_create(struct backend *b, int device, size_t size, uint64_t *ret_handle)
{
	int r = backend_fault_check_on(b, DORMANT_FAULT_CREATE, device);

	return r ? r : b->ops->mem_create(b, device, size, ret_handle);
}

int backend_mem_map(struct backend *b, int device, uintptr_t va, size_t size, uint64_t handle)
{
	int r = backend_fault_check_on(b, DORMANT_FAULT_MAP, device);

	return r ? r : b->ops->mem_map(b, device, va, size, handle);
}

int backend_copy_to_host(struct backend *b, int device, void *dst, uintptr_t src, size_t size,
			 void *stream)
{
	int r = backend_fault_check_on(b, DORMANT_FAULT_COPY, device);

	return r ? r : b->ops->copy_to_host(b, device, dst, src, size, stream);
}

int backend_copy_to_device(struct backend *b, int device, uintptr_t dst, const void *src,
			   size_t size, void *stream)
{
	int r = backend_fault_check_on(b, DORMANT_FAULT_COPY, device);

	return r ? r : b->ops->copy_to_device(b, device, dst, src, size, stream);
}

int backend_copy_to_device_kernel(struct backend *b, int device, uintptr_t dst, const void *src,
				  size_t size, void *stream)
{
	int r;

	if (!b->ops->copy_to_device_kernel)
		return error_set(-ENOTSUP, "the %s backend has no copy kernel", b->ops->name);
	r = backend_fault_check_on(b, DORMANT_FAULT_COPY, device);
	return r ? r : b->ops->copy_to_device_kernel(b, device, dst, src, size, stream);
}

int backend_mem_create_map(struct backend *b, int device, uintptr_t va, size_t size,
			   uint64_t *ret_handle)
{
	uint64_t handle;
	int r;

	r = backend_mem_create(b, device, size, &handle);
	if (r < 0)
		return r;
	r = backend_mem_map(b, device, va, size, handle);
	if (r < 0)
		goto err_release;
	*ret_handle = handle;
	return 0;

err_release:
	b->ops->mem_release(b, device, handle);
	return r;
}

int backend_mem_unmap_release(struct backend *b, int device, uintptr_t va, size_t size,
			      uint64_t handle)
{
	int r = b->ops->mem_unmap(b, device, va, size);
	int r2 = b->ops->mem_release(b, device, handle);

	return r < 0 ? r : r2;
}

int backend_occupy(struct backend *b, int device, size_t bytes)
{
	size_t slots = ARRAY_SIZE(b->occupy_handles[0]);
	size_t piece, granularity;
	int r;

	if (device < 0 || device >= DORMANT_DEVICES_MAX || device >= b->ops->device_count(b))
		return error_set(-ENODEV, "no device %d", device);
	while (b->occupy_count[device])
		b->ops->mem_release(b, device, b->occupy_handles[device][--b->occupy_count[device]]);
	if (bytes == 0)
		return 0;
	r = b->ops->granularity(b, device, &granularity);
	if (r < 0)
		return r;
	bytes = round_up(bytes, granularity);
	piece = round_up((bytes + slots - 1) / slots, granularity);
	while (bytes) {
		size_t size = MIN(piece, bytes);
		uint64_t handle;

		r = b->ops->mem_create(b, device, size, &handle);
		if (r < 0) {
			backend_occupy(b, device, 0);
			return r;
		}
		b->occupy_handles[device][b->occupy_count[device]++] = handle;
		bytes -= size;
	}
	return 0;
}

int backend_copy_sync(struct backend *b, int device, void *host, uintptr_t dev, size_t size,
		      bool to_host)
{
	void *stream, *event;
	int r;

	r = b->ops->stream_create(b, device, &stream);
	if (r < 0)
		return r;
	r = b->ops->event_create(b, device, &event);
	if (r < 0)
		goto err_stream;
	r = to_host ? b->ops->copy_to_host(b, device, host, dev, size, stream)
		    : b->ops->copy_to_device(b, device, dev, host, size, stream);
	if (r == 0)
		r = b->ops->event_record(b, device, event, stream);
	if (r == 0)
		r = b->ops->event_wait(b, device, event);
	b->ops->event_destroy(b, device, event);
err_stream:
	b->ops->stream_destroy(b, device, stream);
	return r;
}
