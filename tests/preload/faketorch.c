/* SPDX-License-Identifier: MIT */
/*
 * Plays libtorch_cuda for the capture test: a library that links the CUDA
 * runtime and calls cudaMalloc/cudaFree through it. The test program opens it
 * RTLD_LOCAL, as Python opens extension modules, so that the runtime is not
 * in the global scope and the shim must find it another way.
 */
#include <stddef.h>

#include "fake_cudart.h"

__attribute__((visibility("default"))) int faketorch_malloc(void **ptr, size_t size);
__attribute__((visibility("default"))) int faketorch_free(void *ptr);

int faketorch_malloc(void **ptr, size_t size)
{
	return cudaMalloc(ptr, size);
}

int faketorch_free(void *ptr)
{
	return cudaFree(ptr);
}
