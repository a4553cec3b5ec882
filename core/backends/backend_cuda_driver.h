/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend's bottom floor (backend_cuda_driver.c): the driver's
 * functions as loaded, struct cuda_backend, the one place a CUresult becomes
 * an errno, and the primary context made current around a call. Everything
 * else of the backend (backend_cuda.c, the kernels' loader and code) stands
 * on it. Only with cuda.h.
 */
#ifndef DORMANT_BACKEND_CUDA_DRIVER_H
#define DORMANT_BACKEND_CUDA_DRIVER_H

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

#endif
