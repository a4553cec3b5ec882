/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend's copy kernel (backend.h, copy_to_device_kernel): the
 * kernel of kernels/copy.cu, embedded as PTX, loaded per device on first
 * use and launched through the driver API on the caller's stream. It reads
 * the pinned host copy through its device mapping (host_pin registers with
 * CU_MEMHOSTREGISTER_DEVICEMAP), so the copy engines, busy scrubbing memory
 * another process freed, take no part (wakecopy.h).
 */
#include "backend.h"

#ifdef HAVE_CUDA_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend_cuda_kernel.h"

#define COPY_KERNEL "dormant_copy_kernel"
#define COPY_THREADS 1024 /* kernels/copy.cu: __launch_bounds__(1024, 2) */
#define COPY_BYTES_PER_THREAD 16

extern const char dormant_copy_ptx[];

static const struct cuda_kernel_source copy_source = {
	.ptx = dormant_copy_ptx,
	.name = COPY_KERNEL,
	.what = "copy kernel",
};

/* The device's kernel, loaded on first use (context current), and the most
 * blocks a launch takes: two per SM (two blocks of 1024 threads fill one). */
static int kernel_get(struct cuda_backend *c, int device, CUfunction *ret_kernel,
		      unsigned *ret_blocks)
{
	int sms = 0;
	int r = cuda_kernel_get(c, &c->copy[device], &copy_source, ret_kernel);

	if (r == 0)
		r = CALL(c, cuDeviceGetAttribute, &sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
			 c->devices[device]);
	*ret_blocks = (unsigned)(sms > 0 ? 2 * sms : 2);
	return r;
}

static int launch(struct cuda_backend *c, CUfunction kernel, unsigned max_blocks,
		  CUdeviceptr dst, CUdeviceptr src, size_t size, CUstream stream)
{
	unsigned long long bytes = size;
	const unsigned long long per_block = (unsigned long long)COPY_THREADS * COPY_BYTES_PER_THREAD;
	unsigned blocks = (unsigned)MIN((bytes + per_block - 1) / per_block, (unsigned long long)max_blocks);
	void *params[] = { &dst, &src, &bytes };

	return CALL(c, cuLaunchKernel, kernel, MAX(blocks, 1u), 1, 1, COPY_THREADS, 1, 1, 0,
		    stream, params, NULL);
}

int cuda_copy_to_device_kernel(struct backend *b, int device, uintptr_t dst, const void *src,
			       size_t size, void *stream)
{
	struct cuda_backend *c = cuda(b);
	CUdeviceptr mapped = 0;
	CUfunction kernel;
	unsigned blocks;
	CUcontext saved;
	int r;

	r = context_enter(c, device, &saved);
	if (r < 0)
		return r;
	r = kernel_get(c, device, &kernel, &blocks);
	if (r < 0)
		goto out;
	if (size == 0) {
		/* a load: run it once, empty, so that its first launch is done */
		if (stream)
			r = launch(c, kernel, 1, 0, 0, 0, (CUstream)stream);
		goto out;
	}
	r = CALL(c, cuMemHostGetDevicePointer, &mapped, (void *)src, 0);
	if (r < 0) {
		error_prefix(r, "the copy kernel's host copy at %p", src);
		goto out;
	}
	r = launch(c, kernel, blocks, (CUdeviceptr)dst, mapped, size, (CUstream)stream);
out:
	context_leave(c, saved);
	return r;
}

#endif /* HAVE_CUDA_H */
