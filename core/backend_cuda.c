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

#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUDA_FN(name) __typeof__(&name) name

struct cuda_api {
	void *library;
	CUDA_FN(cuInit);
	CUDA_FN(cuGetErrorName);
	CUDA_FN(cuGetErrorString);
	CUDA_FN(cuDeviceGetCount);
	CUDA_FN(cuDeviceGet);
	CUDA_FN(cuDevicePrimaryCtxRetain);
	CUDA_FN(cuDevicePrimaryCtxRelease);
	CUDA_FN(cuCtxGetCurrent);
	CUDA_FN(cuCtxSetCurrent);
	CUDA_FN(cuCtxGetDevice);
	CUDA_FN(cuCtxSynchronize);
	CUDA_FN(cuMemGetAllocationGranularity);
	CUDA_FN(cuMemAddressReserve);
	CUDA_FN(cuMemAddressFree);
	CUDA_FN(cuMemCreate);
	CUDA_FN(cuMemRelease);
	CUDA_FN(cuMemMap);
	CUDA_FN(cuMemUnmap);
	CUDA_FN(cuMemSetAccess);
	CUDA_FN(cuMemHostRegister);
	CUDA_FN(cuMemHostUnregister);
	CUDA_FN(cuStreamCreate);
	CUDA_FN(cuStreamDestroy);
	CUDA_FN(cuEventCreate);
	CUDA_FN(cuEventDestroy);
	CUDA_FN(cuEventRecord);
	CUDA_FN(cuEventSynchronize);
	CUDA_FN(cuMemcpyDtoHAsync);
	CUDA_FN(cuMemcpyHtoDAsync);
	CUDA_FN(cuMemsetD8Async);
	CUDA_FN(cuMemGetInfo);
	/* the checksum kernel (checksum.h) */
	CUDA_FN(cuModuleLoadData);
	CUDA_FN(cuModuleGetFunction);
	CUDA_FN(cuModuleUnload);
	CUDA_FN(cuLaunchKernel);
	CUDA_FN(cuMemAlloc);
	CUDA_FN(cuMemFree);
	CUDA_FN(cuStreamSynchronize);
	CUDA_FN(cuStreamWaitEvent);
};

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
};

/* A device's checksum kernel, loaded on first use. */
struct cuda_checksum {
	pthread_mutex_t lock;
	bool tried;
	int error; /* loading failed: -ENOTSUP, message kept */
	char message[DORMANT_ERROR_MAX];
	CUmodule module;
	CUfunction kernel;
};

struct cuda_backend {
	struct backend base;
	struct cuda_api api;
	int device_count;
	pthread_mutex_t lock; /* guards contexts[] creation */
	CUdevice devices[DORMANT_DEVICES_MAX];
	_Atomic(CUcontext) contexts[DORMANT_DEVICES_MAX];
	struct cuda_checksum checksum[DORMANT_DEVICES_MAX];
};

static struct cuda_backend *cuda(struct backend *b)
{
	return (struct cuda_backend *)b;
}

/* The one place where a CUresult becomes an errno; keeps the driver's words. */
static int cuda_result(struct cuda_backend *c, CUresult result, const char *call)
{
	const char *name = NULL, *text = NULL;

	if (result == CUDA_SUCCESS)
		return 0;
	if (c->api.cuGetErrorName)
		c->api.cuGetErrorName(result, &name);
	if (c->api.cuGetErrorString)
		c->api.cuGetErrorString(result, &text);
	error_set(0, "%s: %s (%s)", call, text ? text : "unknown error",
		  name ? name : "CUDA_ERROR_UNKNOWN");
	switch (result) {
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_INVALID_VALUE:
		return -EINVAL;
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_INVALID_DEVICE:
	case CUDA_ERROR_NOT_INITIALIZED:
		return -ENODEV;
	default:
		return -EIO;
	}
}

#define CALL(c, fn, ...) cuda_result((c), (c)->api.fn(__VA_ARGS__), #fn)

static int context_get(struct cuda_backend *c, int device, CUcontext *ret)
{
	CUcontext ctx = NULL;
	int r = 0;

	if (device < 0 || device >= c->device_count)
		return error_set(-ENODEV, "no CUDA device %d (%d visible)", device, c->device_count);
	ctx = atomic_load(&c->contexts[device]);
	if (ctx) {
		*ret = ctx;
		return 0;
	}
	pthread_mutex_lock(&c->lock);
	ctx = atomic_load(&c->contexts[device]);
	if (!ctx) {
		r = CALL(c, cuDevicePrimaryCtxRetain, &ctx, c->devices[device]);
		if (r == 0)
			atomic_store(&c->contexts[device], ctx);
	}
	pthread_mutex_unlock(&c->lock);
	if (r == 0)
		*ret = ctx;
	return r;
}

/* Make device's primary context current; *saved receives the caller's. */
static int context_enter(struct cuda_backend *c, int device, CUcontext *saved)
{
	CUcontext ctx = NULL, current = NULL;
	int r = context_get(c, device, &ctx);

	if (r < 0)
		return r;
	c->api.cuCtxGetCurrent(&current);
	*saved = current;
	if (current != ctx)
		return CALL(c, cuCtxSetCurrent, ctx);
	return 0;
}

static void context_leave(struct cuda_backend *c, CUcontext saved)
{
	CUcontext current = NULL;

	c->api.cuCtxGetCurrent(&current);
	if (current != saved)
		c->api.cuCtxSetCurrent(saved);
}

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
		struct cuda_checksum *ck = &c->checksum[d];
		CUcontext saved;

		if (ck->module && context_enter(c, d, &saved) == 0) {
			c->api.cuModuleUnload(ck->module);
			context_leave(c, saved);
		}
		pthread_mutex_destroy(&ck->lock);
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
	r = CALL(c, cuMemHostRegister, ptr, size, CU_MEMHOSTREGISTER_PORTABLE);
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

/* ---- the checksum kernel (checksum.h, kernels/checksum.cu) --------------- */

/* $DORMANT_CHECKSUM_PTX names a PTX file to load instead of the embedded one
 * (a test tool: the GPU suite runs a fresh nvcc build this way). */
static char *ptx_read(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *text = NULL;
	long size;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
	    (text = malloc((size_t)size + 1)) && fread(text, 1, (size_t)size, f) == (size_t)size)
		text[size] = '\0';
	else {
		free(text);
		text = NULL;
	}
	fclose(f);
	return text;
}

/* Load the kernel into the device's context (current). Called with ck->lock. */
static int checksum_load(struct cuda_backend *c, struct cuda_checksum *ck)
{
	const char *path = getenv("DORMANT_CHECKSUM_PTX");
	char *text = NULL;
	int r;

	ck->tried = true;
	if (path && *path) {
		text = ptx_read(path);
		if (!text) {
			r = error_set(-ENOTSUP, "cannot read $DORMANT_CHECKSUM_PTX (%s)", path);
			goto fail;
		}
	}
	r = CALL(c, cuModuleLoadData, &ck->module, text ? text : dormant_checksum_ptx);
	free(text);
	if (r == 0)
		r = CALL(c, cuModuleGetFunction, &ck->kernel, ck->module, CHECKSUM_KERNEL);
	if (r == 0)
		return 0;
	error_prefix(r, "loading the checksum kernel");
	r = -ENOTSUP;
fail:
	if (ck->module)
		c->api.cuModuleUnload(ck->module);
	ck->module = NULL;
	ck->error = r;
	snprintf(ck->message, sizeof(ck->message), "%s", dormant_last_error());
	return r;
}

/* As the kernel reads it: struct range of kernels/checksum.cu. */
struct kernel_range {
	uint64_t ptr, size, offset, first_tile;
};

/*
 * A hashing job: its range table (first_tile counted from its group's first
 * range: one launch hashes one group) and two lanes per range, in one work
 * buffer on the device, uploaded and zeroed once at the start; each group is
 * one launch on the job's stream; the lanes come back once, at the finish.
 * The buffer lives only for the job: a sleep hashes before it releases, and
 * no device memory of ours stays behind while asleep (cuMemAlloc rounds up to
 * 2 MiB).
 */
struct cuda_job {
	CUstream stream;
	CUfunction kernel;
	CUdeviceptr buffer;
	size_t count, table_bytes, group_count;
	size_t *group_first;             /* group_count + 1 */
	unsigned long long *group_tiles; /* group_count */
	struct kernel_range *table;      /* the host side, kept until the finish */
};

static void job_free(struct cuda_backend *c, struct cuda_job *job)
{
	if (job->buffer)
		c->api.cuMemFree(job->buffer);
	free(job->group_first);
	free(job->group_tiles);
	free(job->table);
	free(job);
}

/* The device's kernel, loaded on first use (context current). */
static int kernel_get(struct cuda_backend *c, int device, CUfunction *ret)
{
	struct cuda_checksum *ck = &c->checksum[device];
	int r = 0;

	pthread_mutex_lock(&ck->lock);
	if (!ck->tried)
		r = checksum_load(c, ck);
	else if (ck->error)
		r = error_set(ck->error, "%s", ck->message);
	*ret = ck->kernel;
	pthread_mutex_unlock(&ck->lock);
	return r;
}

/* With the device's context current. */
static int job_start(struct cuda_backend *c, int device, const struct checksum_range *ranges,
		     size_t count, const size_t *groups, size_t group_count, CUstream stream,
		     struct cuda_job **ret)
{
	struct cuda_job *job = calloc(1, sizeof(*job));
	size_t at = 0, sums = count * 2 * sizeof(uint64_t);
	int r;

	if (!job)
		return error_set(-ENOMEM, "out of host memory");
	job->stream = stream;
	job->count = count;
	job->group_count = group_count;
	job->table_bytes = count * sizeof(struct kernel_range);
	job->group_first = malloc((group_count + 1) * sizeof(*job->group_first));
	job->group_tiles = calloc(MAX(group_count, (size_t)1), sizeof(*job->group_tiles));
	job->table = malloc(MAX(job->table_bytes, (size_t)1));
	if (!job->group_first || !job->group_tiles || !job->table) {
		r = error_set(-ENOMEM, "out of host memory");
		goto err;
	}
	for (size_t g = 0; g < group_count; g++) {
		unsigned long long tiles = 0;

		if (groups[g] > UINT32_MAX || groups[g] > count - at) {
			r = error_set(-EINVAL, "bad checksum groups");
			goto err;
		}
		job->group_first[g] = at;
		for (size_t i = at; i < at + groups[g]; i++) {
			job->table[i] = (struct kernel_range){ .ptr = ranges[i].ptr,
							       .size = ranges[i].size,
							       .offset = ranges[i].offset,
							       .first_tile = tiles };
			tiles += (ranges[i].size + CHECKSUM_TILE_BYTES - 1) / CHECKSUM_TILE_BYTES;
		}
		job->group_tiles[g] = tiles;
		at += groups[g];
	}
	job->group_first[group_count] = at;
	if (at != count) {
		r = error_set(-EINVAL, "checksum groups cover %zu of %zu ranges", at, count);
		goto err;
	}
	r = kernel_get(c, device, &job->kernel);
	if (r < 0)
		goto err;
	if (count == 0) {
		*ret = job;
		return 0;
	}
	r = CALL(c, cuMemAlloc, &job->buffer, job->table_bytes + sums);
	if (r == 0)
		r = CALL(c, cuMemcpyHtoDAsync, job->buffer, job->table, job->table_bytes, stream);
	if (r == 0)
		r = CALL(c, cuMemsetD8Async, job->buffer + job->table_bytes, 0, sums, stream);
	if (r < 0) {
		if (job->buffer)
			(void)c->api.cuStreamSynchronize(stream); /* before the buffer goes */
		goto err;
	}
	*ret = job;
	return 0;

err:
	job_free(c, job);
	return r;
}

static int job_queue(struct cuda_backend *c, struct cuda_job *job, size_t g, CUevent event)
{
	size_t first = job->group_first[g];
	unsigned n = (unsigned)(job->group_first[g + 1] - first);
	unsigned long long tiles = job->group_tiles[g];
	CUdeviceptr dev_ranges = job->buffer + first * sizeof(struct kernel_range),
		    dev_out = job->buffer + job->table_bytes + first * 2 * sizeof(uint64_t);
	void *params[] = { &dev_ranges, &n, &tiles, &dev_out };
	int r;

	if (tiles == 0)
		return 0;
	if (event) {
		r = CALL(c, cuStreamWaitEvent, job->stream, event, 0);
		if (r < 0)
			return r;
	}
	return CALL(c, cuLaunchKernel, job->kernel, (unsigned)MIN(tiles, 8192ull), 1, 1,
		    CHECKSUM_THREADS, 1, 1, 0, job->stream, params, NULL);
}

/* Wait, read back, free (always). */
static int job_finish(struct cuda_backend *c, struct cuda_job *job, struct checksum *out)
{
	uint64_t *lanes = NULL;
	int r = 0;

	if (job->count && out) {
		lanes = malloc(job->count * 2 * sizeof(uint64_t));
		if (!lanes)
			r = error_set(-ENOMEM, "out of host memory");
		else
			r = CALL(c, cuMemcpyDtoHAsync, lanes, job->buffer + job->table_bytes,
				 job->count * 2 * sizeof(uint64_t), job->stream);
	}
	if (job->count) {
		int rs = CALL(c, cuStreamSynchronize, job->stream);

		if (r == 0)
			r = rs;
	}
	for (size_t i = 0; r == 0 && out && i < job->count; i++)
		out[i] = (struct checksum){ { lanes[2 * i], lanes[2 * i + 1] } };
	free(lanes);
	job_free(c, job);
	return r;
}

static int cuda_checksum_start(struct backend *b, int device, const struct checksum_range *ranges,
			       size_t count, const size_t *groups, size_t group_count,
			       void *stream, void **ret_job)
{
	struct cuda_backend *c = cuda(b);
	struct cuda_job *job = NULL;
	CUcontext saved;
	int r;

	r = context_enter(c, device, &saved);
	if (r < 0)
		return r;
	r = job_start(c, device, ranges, count, groups, group_count, (CUstream)stream, &job);
	context_leave(c, saved);
	if (r == 0)
		*ret_job = job;
	return r;
}

static int cuda_checksum_queue(struct backend *b, int device, void *job, size_t g, void *event)
{
	struct cuda_backend *c = cuda(b);
	struct cuda_job *j = job;
	CUcontext saved;
	int r;

	if (g >= j->group_count)
		return error_set(-EINVAL, "no checksum group %zu", g);
	r = context_enter(c, device, &saved);
	if (r < 0)
		return r;
	r = job_queue(c, j, g, (CUevent)event);
	context_leave(c, saved);
	return r;
}

static int cuda_checksum_finish(struct backend *b, int device, void *job, struct checksum *out)
{
	struct cuda_backend *c = cuda(b);
	CUcontext saved;
	int r;

	r = context_enter(c, device, &saved);
	if (r < 0) {
		/* cannot wait: leak the job rather than free memory in use */
		return r;
	}
	r = job_finish(c, job, out);
	context_leave(c, saved);
	return r;
}

/* One job of one group on the caller's stream, after its queued work. */
static int cuda_checksum(struct backend *b, int device, const struct checksum_range *ranges,
			 size_t count, void *stream, struct checksum *out)
{
	struct cuda_backend *c = cuda(b);
	struct cuda_job *job = NULL;
	CUcontext saved;
	int r;

	if (count == 0)
		return 0;
	if (count > UINT32_MAX)
		return error_set(-EINVAL, "too many ranges to hash at once");
	r = context_enter(c, device, &saved);
	if (r < 0)
		return r;
	r = job_start(c, device, ranges, count, &count, 1, (CUstream)stream, &job);
	if (r == 0) {
		r = job_queue(c, job, 0, NULL);
		if (r < 0)
			(void)job_finish(c, job, NULL);
		else
			r = job_finish(c, job, out);
	}
	context_leave(c, saved);
	return r;
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
	}
	pthread_mutex_init(&c->lock, NULL);
	for (int d = 0; d < c->device_count; d++)
		pthread_mutex_init(&c->checksum[d].lock, NULL);
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
