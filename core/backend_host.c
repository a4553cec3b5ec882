/* SPDX-License-Identifier: MIT */
/*
 * The host backend: a simulated device on host memory, with the semantics of
 * the CUDA VMM path. Address ranges are reserved with mmap(PROT_NONE);
 * "physical memory" is a handle counted against a simulated capacity; mapping
 * puts fresh anonymous pages at the reserved address (poisoned, since fresh
 * device memory is not zeroed either), and unmapping puts
 * the PROT_NONE reservation back, which returns the pages to the operating
 * system at once. Copies are memcpy, executed when issued.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "backend.h"

#define HOST_GRANULARITY (2 * MiB)
#define POISON_BYTE 0xa5
/* Poison a line in every stride: enough for a missing zero-fill or restore
 * to show, without faulting in every page of every mapping. */
#define POISON_STRIDE (64 * KiB)
#define POISON_LINE 64

struct host_handle {
	int device;
	size_t size;
};

struct pinned_range {
	uintptr_t start, end;
};

struct host_backend {
	struct backend base;
	int devices;
	uint64_t capacity;
	_Atomic uint64_t used[DORMANT_DEVICES_MAX];
	_Atomic bool active[DORMANT_DEVICES_MAX];
	/* Pinned host ranges, as the driver would know them: a copy must not
	 * span two of them (cuMemcpy cannot), which the copies check. */
	pthread_mutex_t pin_lock;
	struct pinned_range *pinned;
	size_t pinned_count, pinned_capacity;
};

static struct host_backend *host(struct backend *b)
{
	return (struct host_backend *)b;
}

static int check_device(struct backend *b, int device)
{
	if (device < 0 || device >= host(b)->devices)
		return error_set(-ENODEV, "no device %d (the host backend simulates %d)", device,
				 host(b)->devices);
	return 0;
}

static void host_destroy(struct backend *b)
{
	pthread_mutex_destroy(&host(b)->pin_lock);
	free(host(b)->pinned);
	free(b);
}

static int host_device_count(struct backend *b)
{
	return host(b)->devices;
}

static int host_current_device(struct backend *b)
{
	(void)b;
	return 0;
}

static int host_granularity(struct backend *b, int device, size_t *ret)
{
	int r = check_device(b, device);

	if (r < 0)
		return r;
	*ret = HOST_GRANULARITY;
	return 0;
}

static int host_va_reserve(struct backend *b, int device, size_t size, size_t align,
			   uintptr_t *ret)
{
	void *p;
	int r = check_device(b, device);

	if (r < 0)
		return r;
	p = mmap_aligned(size, align, PROT_NONE, MAP_NORESERVE);
	if (p == MAP_FAILED)
		return error_set(-ENOMEM, "reserving %zu bytes of address space: %s", size,
				 strerror(errno));
	atomic_store(&host(b)->active[device], true);
	*ret = (uintptr_t)p;
	return 0;
}

static int host_va_free(struct backend *b, uintptr_t va, size_t size)
{
	(void)b;
	if (munmap((void *)va, size) < 0)
		return error_set(-EINVAL, "freeing address range %#lx: %s", (unsigned long)va,
				 strerror(errno));
	return 0;
}

static int host_mem_create(struct backend *b, int device, size_t size, uint64_t *ret_handle)
{
	struct host_backend *h = host(b);
	struct host_handle *handle;
	uint64_t used;
	int r = check_device(b, device);

	if (r < 0)
		return r;
	if (size == 0 || size % HOST_GRANULARITY)
		return error_set(-EINVAL, "physical size %zu is not a multiple of the granularity",
				 size);
	used = atomic_fetch_add(&h->used[device], size) + size;
	if (used > h->capacity) {
		atomic_fetch_sub(&h->used[device], size);
		return error_set(-ENOMEM,
				 "device %d is out of memory: %zu bytes asked, %llu of %llu free",
				 device, size, (unsigned long long)(h->capacity - (used - size)),
				 (unsigned long long)h->capacity);
	}
	handle = malloc(sizeof(*handle));
	if (!handle) {
		atomic_fetch_sub(&h->used[device], size);
		return error_set(-ENOMEM, "out of host memory");
	}
	handle->device = device;
	handle->size = size;
	*ret_handle = (uint64_t)(uintptr_t)handle;
	return 0;
}

static int host_mem_release(struct backend *b, int device, uint64_t handle)
{
	struct host_handle *h = (struct host_handle *)(uintptr_t)handle;

	(void)device;
	atomic_fetch_sub(&host(b)->used[h->device], h->size);
	free(h);
	return 0;
}

static int host_mem_map(struct backend *b, int device, uintptr_t va, size_t size, uint64_t handle)
{
	struct host_handle *h = (struct host_handle *)(uintptr_t)handle;
	void *p;

	(void)b;
	if (h->device != device || h->size != size)
		return error_set(-EINVAL, "mapping %zu bytes of a %zu-byte handle of device %d on %d",
				 size, h->size, h->device, device);
	p = mmap((void *)va, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
		 -1, 0);
	if (p == MAP_FAILED)
		return error_set(-ENOMEM, "mapping %zu bytes at %#lx: %s", size, (unsigned long)va,
				 strerror(errno));
	for (size_t off = 0; off < size; off += POISON_STRIDE)
		memset((char *)p + off, POISON_BYTE, POISON_LINE);
	memset((char *)p + size - POISON_LINE, POISON_BYTE, POISON_LINE);
	return 0;
}

static int host_mem_unmap(struct backend *b, int device, uintptr_t va, size_t size)
{
	void *p;

	(void)b;
	(void)device;
	p = mmap((void *)va, size, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return error_set(-EIO, "unmapping %zu bytes at %#lx: %s", size, (unsigned long)va,
				 strerror(errno));
	return 0;
}

static int host_host_pin(struct backend *b, void *ptr, size_t size)
{
	struct host_backend *h = host(b);
	int r = 0;

	pthread_mutex_lock(&h->pin_lock);
	if (h->pinned_count == h->pinned_capacity) {
		size_t capacity = h->pinned_capacity ? h->pinned_capacity * 2 : 64;
		struct pinned_range *grown = realloc(h->pinned, capacity * sizeof(*grown));

		if (!grown)
			r = error_set(-ENOMEM, "out of host memory");
		else {
			h->pinned = grown;
			h->pinned_capacity = capacity;
		}
	}
	if (r == 0)
		h->pinned[h->pinned_count++] = (struct pinned_range){
			.start = (uintptr_t)ptr, .end = (uintptr_t)ptr + size };
	pthread_mutex_unlock(&h->pin_lock);
	return r;
}

static int host_host_unpin(struct backend *b, void *ptr)
{
	struct host_backend *h = host(b);

	pthread_mutex_lock(&h->pin_lock);
	for (size_t i = 0; i < h->pinned_count; i++)
		if (h->pinned[i].start == (uintptr_t)ptr) {
			h->pinned[i] = h->pinned[--h->pinned_count];
			break;
		}
	pthread_mutex_unlock(&h->pin_lock);
	return 0;
}

/* A copy from or to pinned memory stays inside one pinned range. */
static int check_pinned_span(struct backend *b, const void *ptr, size_t size)
{
	struct host_backend *h = host(b);
	uintptr_t p = (uintptr_t)ptr;
	int r = 0;

	pthread_mutex_lock(&h->pin_lock);
	for (size_t i = 0; i < h->pinned_count; i++)
		if (p >= h->pinned[i].start && p < h->pinned[i].end && p + size > h->pinned[i].end)
			r = error_set(-EINVAL,
				      "a copy of %zu bytes at %p spans two pinned ranges "
				      "(one cuMemcpy cannot)",
				      size, ptr);
	pthread_mutex_unlock(&h->pin_lock);
	return r;
}

/* Work runs when issued, so streams and events carry no state; they still
 * are real objects so that leaks and double frees show under sanitizers. */
static int host_object_create(struct backend *b, int device, void **ret)
{
	void *object;
	int r = check_device(b, device);

	if (r < 0)
		return r;
	object = malloc(1);
	if (!object)
		return error_set(-ENOMEM, "out of host memory");
	*ret = object;
	return 0;
}

static void host_object_destroy(struct backend *b, int device, void *object)
{
	(void)b;
	(void)device;
	free(object);
}

static int host_event_record(struct backend *b, int device, void *event, void *stream)
{
	(void)b;
	(void)device;
	(void)event;
	(void)stream;
	return 0;
}

static int host_event_wait(struct backend *b, int device, void *event)
{
	(void)b;
	(void)device;
	(void)event;
	return 0;
}

static int host_copy_to_host(struct backend *b, int device, void *dst, uintptr_t src, size_t size,
			     void *stream)
{
	int r = check_pinned_span(b, dst, size);

	(void)device;
	(void)stream;
	if (r < 0)
		return r;
	memcpy(dst, (const void *)src, size);
	return 0;
}

static int host_copy_to_device(struct backend *b, int device, uintptr_t dst, const void *src,
			       size_t size, void *stream)
{
	int r = check_pinned_span(b, src, size);

	(void)device;
	(void)stream;
	if (r < 0)
		return r;
	memcpy((void *)dst, src, size);
	return 0;
}

static int host_zero(struct backend *b, int device, uintptr_t dst, size_t size, void *stream)
{
	(void)b;
	(void)device;
	(void)stream;
	memset((void *)dst, 0, size);
	return 0;
}

static int host_synchronize(struct backend *b, int device)
{
	return check_device(b, device);
}

static int host_mem_info(struct backend *b, int device, uint64_t *ret_free, uint64_t *ret_total)
{
	struct host_backend *h = host(b);
	uint64_t used;
	int r = check_device(b, device);

	if (r < 0)
		return r;
	used = atomic_load(&h->used[device]);
	*ret_free = used < h->capacity ? h->capacity - used : 0;
	*ret_total = h->capacity;
	return 0;
}

static bool host_device_active(struct backend *b, int device)
{
	return device >= 0 && device < host(b)->devices && atomic_load(&host(b)->active[device]);
}

static const struct backend_ops host_ops = {
	.name = "host",
	.destroy = host_destroy,
	.device_count = host_device_count,
	.current_device = host_current_device,
	.granularity = host_granularity,
	.va_reserve = host_va_reserve,
	.va_free = host_va_free,
	.mem_create = host_mem_create,
	.mem_release = host_mem_release,
	.mem_map = host_mem_map,
	.mem_unmap = host_mem_unmap,
	.host_pin = host_host_pin,
	.host_unpin = host_host_unpin,
	.stream_create = host_object_create,
	.stream_destroy = host_object_destroy,
	.event_create = host_object_create,
	.event_destroy = host_object_destroy,
	.event_record = host_event_record,
	.event_wait = host_event_wait,
	.copy_to_host = host_copy_to_host,
	.copy_to_device = host_copy_to_device,
	.zero = host_zero,
	.synchronize = host_synchronize,
	.mem_info = host_mem_info,
	.device_active = host_device_active,
};

int backend_host_new(const struct backend_config *config, struct backend **ret)
{
	struct host_backend *h;
	int devices = config->host_devices;
	size_t capacity = config->host_device_bytes;
	const char *env;

	if (devices == 0 && (env = getenv("DORMANT_HOST_DEVICES")) && *env)
		devices = atoi(env);
	if (devices == 0)
		devices = 1;
	if (devices < 0 || devices > DORMANT_DEVICES_MAX)
		return error_set(-EINVAL, "the host backend simulates 1 to %d devices, not %d",
				 DORMANT_DEVICES_MAX, devices);
	if (capacity == 0 && (env = getenv("DORMANT_HOST_DEVICE_BYTES")) && *env) {
		int r = size_parse(env, &capacity);
		if (r < 0)
			return error_prefix(r, "DORMANT_HOST_DEVICE_BYTES");
	}
	if (capacity == 0)
		capacity = 64 * GiB;

	h = calloc(1, sizeof(*h));
	if (!h)
		return error_set(-ENOMEM, "out of host memory");
	h->base.ops = &host_ops;
	h->base.log = config->log;
	h->devices = devices;
	h->capacity = capacity;
	pthread_mutex_init(&h->pin_lock, NULL);
	atomic_store(&h->active[0], true);
	*ret = &h->base;
	return 0;
}
