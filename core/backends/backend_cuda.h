/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend's private parts (backend_cuda.c), shared with its
 * kernels' code (backend_cuda_checksum.c, backend_cuda_copy.c). Only with
 * cuda.h.
 */
#ifndef DORMANT_BACKEND_CUDA_H
#define DORMANT_BACKEND_CUDA_H

#include <cuda.h>
#include <pthread.h>

#include "backend.h"

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
	/* the checksum kernel (hash.h) */
	CUDA_FN(cuModuleLoadData);
	CUDA_FN(cuModuleGetFunction);
	CUDA_FN(cuModuleUnload);
	CUDA_FN(cuLaunchKernel);
	CUDA_FN(cuMemAlloc);
	CUDA_FN(cuMemFree);
	CUDA_FN(cuStreamSynchronize);
	CUDA_FN(cuStreamWaitEvent);
	/* the copy kernel (kernels/copy.cu) */
	CUDA_FN(cuMemHostGetDevicePointer);
	CUDA_FN(cuDeviceGetAttribute);
	/* residue mode: which NVML device each one is (free_outside) */
	CUDA_FN(cuDeviceGetPCIBusId);
};

/* NVML, loaded at the first free_outside (residue mode): a device's memory
 * as the driver sees it, read without this process's CUDA state. */
struct cuda_nvml {
	bool loaded;
	int error; /* 0, or why it cannot be used (-ENOTSUP) */
	char why[128];
	void *library;
	int (*init)(void);
	int (*by_bus_id)(const char *bus_id, void **ret_device);
	int (*memory_info)(void *device, void *ret_memory);
};

/* One of our kernels in one device's context, loaded on first use
 * (backend_cuda_kernel.c). */
struct cuda_kernel {
	pthread_mutex_t lock;
	bool tried;
	int error; /* loading failed: -ENOTSUP, message kept */
	char message[DORMANT_ERROR_MAX];
	CUmodule module;
	CUfunction function;
};

/* Where a kernel comes from. */
struct cuda_kernel_source {
	const char *ptx;     /* embedded PTX */
	const char *name;    /* the function */
	const char *what;    /* for messages: "checksum kernel" */
	const char *ptx_env; /* an environment variable naming a PTX file to load instead, or NULL */
};

struct cuda_backend {
	struct backend base;
	struct cuda_api api;
	int device_count;
	pthread_mutex_t lock; /* guards contexts[] creation */
	CUdevice devices[DORMANT_DEVICES_MAX];
	_Atomic(CUcontext) contexts[DORMANT_DEVICES_MAX];
	struct cuda_kernel checksum[DORMANT_DEVICES_MAX];
	struct cuda_kernel copy[DORMANT_DEVICES_MAX];
	char bus_ids[DORMANT_DEVICES_MAX][32]; /* "0000:19:00.0" */
	struct cuda_nvml nvml;
};

static inline struct cuda_backend *cuda(struct backend *b)
{
	return (struct cuda_backend *)b;
}

/* The one place where a CUresult becomes an errno (and a message). */
int cuda_result(struct cuda_backend *c, CUresult result, const char *call);
#define CALL(c, fn, ...) cuda_result((c), (c)->api.fn(__VA_ARGS__), #fn)

/* Make device's primary context current; *saved receives the caller's. */
int context_enter(struct cuda_backend *c, int device, CUcontext *saved);
void context_leave(struct cuda_backend *c, CUcontext saved);

/* k's function, loaded from src into the current context (device's) on the
 * first call; -ENOTSUP (the first failure's message) when that failed. */
int cuda_kernel_get(struct cuda_backend *c, struct cuda_kernel *k,
		    const struct cuda_kernel_source *src, CUfunction *ret);
void cuda_kernel_init(struct cuda_kernel *k);
/* Unload it from device's context; k is done with. */
void cuda_kernel_unload(struct cuda_backend *c, int device, struct cuda_kernel *k);

/* The checksum ops (backend.h), in backend_cuda_checksum.c. */
int cuda_checksum(struct backend *b, int device, const struct checksum_range *ranges,
		  size_t count, void *stream, struct checksum *out);
int cuda_checksum_start(struct backend *b, int device, const struct checksum_range *ranges,
			size_t count, const size_t *groups, size_t group_count, void *stream,
			void **ret_job);
int cuda_checksum_queue(struct backend *b, int device, void *job, size_t g, void *event);
int cuda_checksum_finish(struct backend *b, int device, void *job, struct checksum *out);
int cuda_checksum_prepare(struct backend *b, int device);

/* The copy kernel's op (backend.h), in backend_cuda_copy.c. */
int cuda_copy_to_device_kernel(struct backend *b, int device, uintptr_t dst, const void *src,
			       size_t size, void *stream);

#endif
