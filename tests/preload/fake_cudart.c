/* SPDX-License-Identifier: MIT */
/*
 * A stand-in for libcudart in CI: the few runtime functions the capture shim
 * interposes or calls, on malloc'd host memory, each counting its calls so
 * that tests can see which calls reached the "real" runtime. Built as
 * libcudart.so.13 in the build folder only (never installed).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cudart.h"

#define EXPORT __attribute__((visibility("default")))

EXPORT int cudaMalloc(void **ptr, size_t size);
EXPORT int cudaFree(void *ptr);
EXPORT int cudaMallocAsync(void **ptr, size_t size, void *stream);
EXPORT int cudaMallocFromPoolAsync(void **ptr, size_t size, void *pool, void *stream);
EXPORT int cudaFreeAsync(void *ptr, void *stream);
EXPORT int cudaMallocManaged(void **ptr, size_t size, unsigned flags);
EXPORT int cudaMallocHost(void **ptr, size_t size);
EXPORT int cudaFreeHost(void *ptr);
EXPORT int cudaGetDevice(int *device);
EXPORT int cudaDeviceSynchronize(void);
EXPORT int cudaStreamSynchronize(void *stream);

static _Atomic uint64_t counts[FAKE_OPS];

/* The live blocks, so that a free of anything else fails as the runtime's
 * would (cudaErrorInvalidValue). */
#define BLOCKS_MAX 4096
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static void *blocks[BLOCKS_MAX];

static int take(void **ptr, size_t size, enum fake_op op)
{
	void *p;

	atomic_fetch_add(&counts[op], 1);
	if (!ptr)
		return 1;
	p = malloc(size ? size : 1);
	if (!p)
		return 2; /* cudaErrorMemoryAllocation */
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < BLOCKS_MAX; i++) {
		if (!blocks[i]) {
			blocks[i] = p;
			pthread_mutex_unlock(&lock);
			*ptr = p;
			return 0;
		}
	}
	pthread_mutex_unlock(&lock);
	free(p);
	return 2;
}

static int give(void *ptr, enum fake_op op)
{
	atomic_fetch_add(&counts[op], 1);
	if (!ptr)
		return 0;
	pthread_mutex_lock(&lock);
	for (size_t i = 0; i < BLOCKS_MAX; i++) {
		if (blocks[i] == ptr) {
			blocks[i] = NULL;
			pthread_mutex_unlock(&lock);
			free(ptr);
			return 0;
		}
	}
	pthread_mutex_unlock(&lock);
	return 1; /* cudaErrorInvalidValue */
}

EXPORT int cudaMalloc(void **ptr, size_t size) { return take(ptr, size, FAKE_MALLOC); }
EXPORT int cudaFree(void *ptr) { return give(ptr, FAKE_FREE); }
EXPORT int cudaMallocAsync(void **ptr, size_t size, void *stream)
{
	(void)stream;
	return take(ptr, size, FAKE_MALLOC_ASYNC);
}
EXPORT int cudaMallocFromPoolAsync(void **ptr, size_t size, void *pool, void *stream)
{
	(void)pool;
	(void)stream;
	return take(ptr, size, FAKE_MALLOC_ASYNC);
}
EXPORT int cudaFreeAsync(void *ptr, void *stream)
{
	(void)stream;
	return give(ptr, FAKE_FREE_ASYNC);
}
EXPORT int cudaMallocManaged(void **ptr, size_t size, unsigned flags)
{
	(void)flags;
	return take(ptr, size, FAKE_MALLOC_MANAGED);
}
EXPORT int cudaMallocHost(void **ptr, size_t size) { return take(ptr, size, FAKE_MALLOC_HOST); }
EXPORT int cudaFreeHost(void *ptr) { return give(ptr, FAKE_FREE_HOST); }
EXPORT int cudaGetDevice(int *device)
{
	atomic_fetch_add(&counts[FAKE_GET_DEVICE], 1);
	*device = 0;
	return 0;
}
EXPORT int cudaDeviceSynchronize(void)
{
	atomic_fetch_add(&counts[FAKE_DEVICE_SYNCHRONIZE], 1);
	return 0;
}
EXPORT int cudaStreamSynchronize(void *stream)
{
	(void)stream;
	atomic_fetch_add(&counts[FAKE_STREAM_SYNCHRONIZE], 1);
	return 0;
}

/* Not CUDA API: for the tests. */
EXPORT uint64_t fake_cuda_count(enum fake_op op)
{
	return op < FAKE_OPS ? atomic_load(&counts[op]) : 0;
}

EXPORT int fake_cuda_foreign_malloc(void **ptr, size_t size)
{
	return take(ptr, size, FAKE_FOREIGN_MALLOC);
}
