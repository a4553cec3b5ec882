/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend: the driver API's virtual memory management, loaded with
 * dlopen() at run time so that libdormant needs no CUDA library to load.
 * All memory lives in the primary context of each device, the one PyTorch
 * and the CUDA runtime use. Every call makes that context current for its
 * duration and restores the caller's afterwards.
 */
#include "backend.h"

#ifdef HAVE_CUDA_H

#include "backend_cuda_kernel.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The versioned names behind cuda.h's macros, in struct order. */
static const char *const symbol_names[] = {
	"cuInit",
	"cuGetErrorName",
	"cuGetErrorString",
	"cuDeviceGetCount",
	"cuDeviceGet",
	"cuDevicePrimaryCtxRetain",
	"cuDevicePrimaryCtxRelease_v2",
	"cuCtxGetCurrent",
	"cuCtxSetCurrent",
	"cuCtxGetDevice",
	"cuCtxSynchronize",
	"cuMemGetAllocationGranularity",
	"cuMemAddressReserve",
	"cuMemAddressFree",
	"cuMemCreate",
	"cuMemRelease",
	"cuMemMap",
	"cuMemUnmap",
	"cuMemSetAccess",
	"cuMemHostRegister_v2",
	"cuMemHostUnregister",
	"cuStreamCreate",
	"cuStreamDestroy_v2",
	"cuEventCreate",
	"cuEventDestroy_v2",
	"cuEventRecord",
	"cuEventSynchronize",
	"cuMemcpyDtoHAsync_v2",
	"cuMemcpyHtoDAsync_v2",
	"cuMemsetD8Async",
	"cuMemGetInfo_v2",
	"cuModuleLoadData",
	"cuModuleGetFunction",
	"cuModuleUnload",
	"cuLaunchKernel",
	"cuMemAlloc_v2",
	"cuMemFree_v2",
	"cuStreamSynchronize",
	"cuStreamWaitEvent",
	"cuMemHostGetDevicePointer_v2",
	"cuDeviceGetAttribute",
	"cuDeviceGetPCIBusId",
};

/* For calls that are not about one device: any context we hold will do. */
static int context_enter_any(struct cuda_backend *c, CUcontext *saved)
{
	for (int d = 0; d < c->device_count; d++)
		if (atomic_load(&c->contexts[d]))
			return context_enter(c, d, saved);
	return context_enter(c, 0, saved);
}

static void cuda_destroy(struct backend *b)
{
	struct cuda_backend *c = cuda(b);

	for (int d = 0; d < c->device_count; d++) {
		cuda_kernel_unload(c, d, &c->checksum[d]);
		cuda_kernel_unload(c, d, &c->copy[d]);
	}
	for (int d = 0; d < c->device_count; d++)
		if (atomic_load(&c->contexts[d]))
			c->api.cuDevicePrimaryCtxRelease(c->devices[d]);
	pthread_mutex_destroy(&c->lock);
	/* The driver stays loaded: other users in the process (PyTorch) share it. */
	free(c);
}

static int cuda_device_count(struct backend *b)
{
	return cuda(b)->device_count;
}

static int cuda_current_device(struct backend *b)
{
	struct cuda_backend *c = cuda(b);
	CUcontext current = NULL;
	CUdevice dev;

	if (c->api.cuCtxGetCurrent(&current) != CUDA_SUCCESS || !current)
		return 0;
	if (c->api.cuCtxGetDevice(&dev) != CUDA_SUCCESS)
		return 0;
	for (int d = 0; d < c->device_count; d++)
		if (c->devices[d] == dev)
			return d;
	return 0;
}

static void allocation_prop(int device, CUmemAllocationProp *prop)
{
	memset(prop, 0, sizeof(*prop));
	prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop->location.id = device;
}

static int cuda_granularity(struct backend *b, int device, size_t *ret)
{
	struct cuda_backend *c = cuda(b);
	CUmemAllocationProp prop;
	CUcontext saved;
	size_t granularity = 0;
	int r = context_enter(c, device, &saved);

	if (r < 0)
		return r;
	allocation_prop(c->devices[device], &prop);
	r = CALL(c, cuMemGetAllocationGranularity, &granularity, &prop,
		 CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	context_leave(c, saved);
	if (r == 0)
		*ret = granularity;
	return r;
}

static int cuda_va_reserve(struct backend *b, int device, size_t size, size_t align,
			   uintptr_t *ret)
{
	struct cuda_backend *c = cuda(b);
	CUdeviceptr va = 0;
	CUcontext saved;
	int r = context_enter(c, device, &saved);

	if (r < 0)
		return r;
	r = CALL(c, cuMemAddressReserve, &va, size, align, 0, 0);
	context_leave(c, saved);
	if (r == 0)
		*ret = (uintptr_t)va;
	return r;
}

static int cuda_va_free(struct backend *b, uintptr_t va, size_t size)
{
	struct cuda_backend *c = cuda(b);
	CUcontext saved;
	int r = context_enter_any(c, &saved);

	if (r < 0)
		return r;
	r = CALL(c, cuMemAddressFree, (CUdeviceptr)va, size);
	context_leave(c, saved);
	return r;
}

static int cuda_mem_create(struct backend *b, int device, size_t size, uint64_t *ret_handle)
{
	struct cuda_backend *c = cuda(b);
	CUmemGenericAllocationHandle handle;
	CUmemAllocationProp prop;
	CUcontext saved;
	int r = context_enter(c, device, &saved);

	if (r < 0)
		return r;
	allocation_prop(c->devices[device], &prop);
	r = CALL(c, cuMemCreate, &handle, size, &prop, 0);
	context_leave(c, saved);
	if (r == 0)
		*ret_handle = (uint64_t)handle;
	return r;
}

static int cuda_mem_release(struct backend *b, int device, uint64_t handle)
{
	struct cuda_backend *c = cuda(b);
	CUcontext saved;
	int r = context_enter(c, device, &saved);

	if (r < 0)
		return r;
	r = CALL(c, cuMemRelease, (CUmemGenericAllocationHandle)handle);
	context_leave(c, saved);
	return r;
}

static int cuda_mem_map(struct backend *b, int device, uintptr_t va, size_t size, uint64_t handle)
{
	struct cuda_backend *c = cuda(b);
	CUmemAccessDesc access;
	CUcontext saved;
	int r = context_enter(c, device, &saved);

	if (r < 0)
		return r;
	r = CALL(c, cuMemMap, (CUdeviceptr)va, size, 0, (CUmemGenericAllocationHandle)handle, 0);
	if (r < 0)
		goto out;
	memset(&access, 0, sizeof(access));
	access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	access.location.id = c->devices[device];
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	r = CALL(c, cuMemSetAccess, (CUdeviceptr)va, size, &access, 1);
	if (r < 0)
		c->api.cuMemUnmap((CUdeviceptr)va, size);
out:
	context_leave(c, saved);
	return r;
}

static int cuda_mem_unmap(struct backend *b, int device, uintptr_t va, size_t size)
{
	struct cuda_backend *c = cuda(b);
	CUcontext saved;
	int r = context_enter(c, device, &saved);

	if (r < 0)
		return r;
	r = CALL(c, cuMemUnmap, (CUdeviceptr)va, size);
	context_leave(c, saved);
	return r;
}

static int cuda_host_pin(struct backend *b, void *ptr, size_t size)
{
	struct cuda_backend *c = cuda(b);
	CUcontext saved;
	int r = context_enter_any(c, &saved);

	if (r < 0)
		return r;
	/* mapped too: the copy kernel reads host copies through the mapping
	 * (with unified addressing it is there anyway; the flag says so) */
	r = CALL(c, cuMemHostRegister, ptr, size,
		 CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
	context_leave(c, saved);
	return r;
}

static int cuda_host_unpin(struct backend *b, void *ptr)
{
	struct cuda_backend *c = cuda(b);
	CUcontext saved;
	int r = context_enter_any(c, &saved);

	if (r < 0)
		return r;
	r = CALL(c, cuMemHostUnregister, ptr);
	context_leave(c, saved);
	return r;
}

static int cuda_stream_create(struct backend *b, int device, void **ret)
{
	struct cuda_backend *c = cuda(b);
	CUstream stream;
	CUcontext saved;
	int r = context_enter(c, device, &saved);

	if (r < 0)
		return r;
	r = CALL(c, cuStreamCreate, &stream, CU_STREAM_NON_BLOCKING);
	context_leave(c, saved);
	if (r == 0)
		*ret = stream;
	return r;
}

static void cuda_stream_destroy(struct backend *b, int device, void *stream)
{
	struct cuda_backend *c = cuda(b);
	CUcontext saved;

	if (context_enter(c, device, &saved) < 0)
		return;
	c->api.cuStreamDestroy((CUstream)stream);
	context_leave(c, saved);
}

static int cuda_event_create(struct backend *b, int device, void **ret)
{
	struct cuda_backend *c = cuda(b);
	CUevent event;
	CUcontext saved;
	int r = context_enter(c, device, &saved);

	if (r < 0)
		return r;
	/* Blocking sync: a waiting thread sleeps instead of spinning. */
	r = CALL(c, cuEventCreate, &event, CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING);
	context_leave(c, saved);
	if (r == 0)
		*ret = event;
	return r;
}

static void cuda_event_destroy(struct backend *b, int device, void *event)
{
	struct cuda_backend *c = cuda(b);
	CUcontext saved;

	if (context_enter(c, device, &saved) < 0)
		return;
	c->api.cuEventDestroy((CUevent)event);
	context_leave(c, saved);
}

static int cuda_event_record(struct backend *b, int device, void *event, void *stream)
{
	struct cuda_backend *c = cuda(b);
	CUcontext saved;
	int r = context_enter(c, device, &saved);

	if (r < 0)
		return r;
	r = CALL(c, cuEventRecord, (CUevent)event, (CUstream)stream);
	context_leave(c, saved);
	return r;
}

static int cuda_event_wait(struct backend *b, int device, void *event)
{
	struct cuda_backend *c = cuda(b);
	CUcontext saved;
	int r = context_enter(c, device, &saved);

	if (r < 0)
		return r;
	r = CALL(c, cuEventSynchronize, (CUevent)event);
	context_leave(c, saved);
	return r;
}

static int cuda_copy_to_host(struct backend *b, int device, void *dst, uintptr_t src, size_t size,
			     void *stream)
{
	struct cuda_backend *c = cuda(b);
	CUcontext saved;
	int r = context_enter(c, device, &saved);

	if (r < 0)
		return r;
	r = CALL(c, cuMemcpyDtoHAsync, dst, (CUdeviceptr)src, size, (CUstream)stream);
	context_leave(c, saved);
	return r;
}

static int cuda_copy_to_device(struct backend *b, int device, uintptr_t dst, const void *src,
			       size_t size, void *stream)
{
	struct cuda_backend *c = cuda(b);
	CUcontext saved;
	int r = context_enter(c, device, &saved);

	if (r < 0)
		return r;
	r = CALL(c, cuMemcpyHtoDAsync, (CUdeviceptr)dst, src, size, (CUstream)stream);
	context_leave(c, saved);
	return r;
}

static int cuda_zero(struct backend *b, int device, uintptr_t dst, size_t size, void *stream)
{
	struct cuda_backend *c = cuda(b);
	CUcontext saved;
	int r = context_enter(c, device, &saved);

	if (r < 0)
		return r;
	r = CALL(c, cuMemsetD8Async, (CUdeviceptr)dst, 0, size, (CUstream)stream);
	context_leave(c, saved);
	return r;
}

static int cuda_synchronize(struct backend *b, int device)
{
	struct cuda_backend *c = cuda(b);
	CUcontext saved;
	int r = context_enter(c, device, &saved);

	if (r < 0)
		return r;
	r = cuda_result(c, c->api.cuCtxSynchronize(), "cuCtxSynchronize");
	context_leave(c, saved);
	return r;
}

static int cuda_mem_info(struct backend *b, int device, uint64_t *ret_free, uint64_t *ret_total)
{
	struct cuda_backend *c = cuda(b);
	size_t free_bytes = 0, total_bytes = 0;
	CUcontext saved;
	int r = context_enter(c, device, &saved);

	if (r < 0)
		return r;
	r = CALL(c, cuMemGetInfo, &free_bytes, &total_bytes);
	context_leave(c, saved);
	if (r == 0) {
		*ret_free = free_bytes;
		*ret_total = total_bytes;
	}
	return r;
}

static bool cuda_device_active(struct backend *b, int device)
{
	struct cuda_backend *c = cuda(b);

	return device >= 0 && device < c->device_count && atomic_load(&c->contexts[device]);
}

static void nvml_load(struct cuda_nvml *n)
{
	int r;

	n->library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!n->library) {
		snprintf(n->why, sizeof(n->why), "cannot load libnvidia-ml.so.1");
		n->error = -ENOTSUP;
		return;
	}
	*(void **)&n->init = dlsym(n->library, "nvmlInit_v2");
	*(void **)&n->by_bus_id = dlsym(n->library, "nvmlDeviceGetHandleByPciBusId_v2");
	*(void **)&n->memory_info = dlsym(n->library, "nvmlDeviceGetMemoryInfo");
	if (!n->init || !n->by_bus_id || !n->memory_info) {
		snprintf(n->why, sizeof(n->why), "libnvidia-ml.so.1 lacks a function it needs");
		n->error = -ENOTSUP;
		return;
	}
	r = n->init();
	if (r != 0) {
		snprintf(n->why, sizeof(n->why), "nvmlInit failed (%d)", r);
		n->error = -ENOTSUP;
	}
}

/* A device's memory through NVML, from this process: not while it is
 * checkpointed (the sleep that first used it from here in that window never
 * returned on the H100/H200, driver 580): residue.c then asks its helper,
 * which reads NVML from outside. */
static int cuda_free_outside(struct backend *b, int device, uint64_t *ret_free,
			     uint64_t *ret_total)
{
	static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
	struct cuda_backend *c = (struct cuda_backend *)b;
	/* nvmlMemory_t, nvml.h's layout: this file needs no nvml.h */
	struct {
		unsigned long long total, free, used;
	} memory;
	void *handle = NULL;
	int r;

	if (device < 0 || device >= c->device_count)
		return error_set(-ENODEV, "no device %d", device);
	pthread_mutex_lock(&load_lock);
	if (!c->nvml.loaded) {
		nvml_load(&c->nvml);
		c->nvml.loaded = true;
	}
	pthread_mutex_unlock(&load_lock);
	if (c->nvml.error)
		return error_set(c->nvml.error, "%s", c->nvml.why);
	if (!c->bus_ids[device][0])
		return error_set(-ENOTSUP, "device %d has no PCI bus id", device);
	r = c->nvml.by_bus_id(c->bus_ids[device], &handle);
	if (r == 0)
		r = c->nvml.memory_info(handle, &memory);
	if (r != 0)
		return error_set(-EIO, "NVML cannot read device %d's memory (%d)", device, r);
	*ret_free = memory.free;
	*ret_total = memory.total;
	return 0;
}

static const struct backend_ops cuda_ops = {
	.name = "cuda",
	.destroy = cuda_destroy,
	.device_count = cuda_device_count,
	.current_device = cuda_current_device,
	.granularity = cuda_granularity,
	.va_reserve = cuda_va_reserve,
	.va_free = cuda_va_free,
	.mem_create = cuda_mem_create,
	.mem_release = cuda_mem_release,
	.mem_map = cuda_mem_map,
	.mem_unmap = cuda_mem_unmap,
	.host_pin = cuda_host_pin,
	.host_unpin = cuda_host_unpin,
	.stream_create = cuda_stream_create,
	.stream_destroy = cuda_stream_destroy,
	.event_create = cuda_event_create,
	.event_destroy = cuda_event_destroy,
	.event_record = cuda_event_record,
	.event_wait = cuda_event_wait,
	.copy_to_host = cuda_copy_to_host,
	.copy_to_device = cuda_copy_to_device,
	.zero = cuda_zero,
	.synchronize = cuda_synchronize,
	.mem_info = cuda_mem_info,
	.device_active = cuda_device_active,
	.checksum = cuda_checksum,
	.checksum_start = cuda_checksum_start,
	.checksum_queue = cuda_checksum_queue,
	.checksum_finish = cuda_checksum_finish,
	.copy_to_device_kernel = cuda_copy_to_device_kernel,
	.checksum_prepare = cuda_checksum_prepare,
	.free_outside = cuda_free_outside,
};

static int api_load(struct cuda_api *api)
{
	void **slots = (void **)&api->cuInit;

	_Static_assert(sizeof(struct cuda_api) ==
			       sizeof(void *) * (1 + sizeof(symbol_names) / sizeof(symbol_names[0])),
		       "symbol_names must list every function of struct cuda_api");
	api->library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!api->library)
		return error_set(-ENODEV, "cannot load libcuda.so.1: %s", dlerror());
	for (size_t i = 0; i < ARRAY_SIZE(symbol_names); i++) {
		void *fn = dlsym(api->library, symbol_names[i]);
		if (!fn) {
			error_set(-ENODEV, "libcuda.so.1 lacks %s (driver too old)", symbol_names[i]);
			dlclose(api->library);
			return -ENODEV;
		}
		memcpy(&slots[i], &fn, sizeof(fn));
	}
	return 0;
}

int backend_cuda_new(const struct backend_config *config, struct backend **ret)
{
	struct cuda_backend *c;
	int r, count = 0;

	c = calloc(1, sizeof(*c));
	if (!c)
		return error_set(-ENOMEM, "out of host memory");
	r = api_load(&c->api);
	if (r < 0)
		goto err_free;
	r = CALL(c, cuInit, 0);
	if (r < 0)
		goto err_close;
	r = CALL(c, cuDeviceGetCount, &count);
	if (r < 0)
		goto err_close;
	if (count <= 0) {
		r = error_set(-ENODEV, "the CUDA driver sees no device");
		goto err_close;
	}
	c->device_count = MIN(count, DORMANT_DEVICES_MAX);
	for (int d = 0; d < c->device_count; d++) {
		r = CALL(c, cuDeviceGet, &c->devices[d], d);
		if (r < 0)
			goto err_close;
		/* only residue mode reads it (NVML); without it, no check */
		if (c->api.cuDeviceGetPCIBusId(c->bus_ids[d], sizeof(c->bus_ids[d]),
					       c->devices[d]) != CUDA_SUCCESS)
			c->bus_ids[d][0] = '\0';
	}
	pthread_mutex_init(&c->lock, NULL);
	for (int d = 0; d < c->device_count; d++) {
		cuda_kernel_init(&c->checksum[d]);
		cuda_kernel_init(&c->copy[d]);
	}
	c->base.ops = &cuda_ops;
	c->base.log = config->log;
	*ret = &c->base;
	return 0;

err_close:
	/* A failed cuInit leaves nothing to undo; keep the driver loaded only
	 * when it works. */
	dlclose(c->api.library);
err_free:
	free(c);
	return r < 0 ? r : -ENODEV;
}

#else /* !HAVE_CUDA_H */

#include <errno.h>

int backend_cuda_new(const struct backend_config *config, struct backend **ret)
{
	(void)config;
	(void)ret;
	return error_set(-ENODEV, "this libdormant was built without cuda.h");
}

#endif
