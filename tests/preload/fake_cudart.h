/* SPDX-License-Identifier: MIT */
/* The test-only entry points of the fake libcudart (fake_cudart.c). */
#ifndef FAKE_CUDART_H
#define FAKE_CUDART_H

#include <stddef.h>
#include <stdint.h>

enum fake_op {
	FAKE_MALLOC = 0,
	FAKE_FREE,
	FAKE_MALLOC_ASYNC,
	FAKE_FREE_ASYNC,
	FAKE_MALLOC_MANAGED,
	FAKE_MALLOC_HOST,
	FAKE_FREE_HOST,
	FAKE_GET_DEVICE,
	FAKE_DEVICE_SYNCHRONIZE,
	FAKE_STREAM_SYNCHRONIZE,
	FAKE_FOREIGN_MALLOC,
	FAKE_OPS,
};

/* How many calls of op reached the fake runtime. */
uint64_t fake_cuda_count(enum fake_op op);
/* A block of the fake runtime that the shim never saw (under a name it does
 * not interpose): a pointer "not ours". */
int fake_cuda_foreign_malloc(void **ptr, size_t size);

int cudaMalloc(void **ptr, size_t size);
int cudaFree(void *ptr);
int cudaMallocAsync(void **ptr, size_t size, void *stream);
int cudaFreeAsync(void *ptr, void *stream);
int cudaMallocManaged(void **ptr, size_t size, unsigned flags);
int cudaMallocHost(void **ptr, size_t size);
int cudaFreeHost(void *ptr);

#endif
