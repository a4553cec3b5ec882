/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend's kernels: their loader (backend_cuda_kernel.c) and the
 * ops they run (backend_cuda_checksum.c, backend_cuda_copy.c), above the
 * driver floor (backend_cuda_driver.h), below backend_cuda.c's table. Only
 * with cuda.h.
 */
#ifndef DORMANT_BACKEND_CUDA_KERNEL_H
#define DORMANT_BACKEND_CUDA_KERNEL_H

#include "backend_cuda_driver.h"

/* Where a kernel comes from. */
struct cuda_kernel_source {
	const char *ptx;     /* embedded PTX */
	const char *name;    /* the function */
	const char *what;    /* for messages: "checksum kernel" */
	const char *ptx_env; /* an environment variable naming a PTX file to load instead, or NULL */
};

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
