/* SPDX-License-Identifier: MIT */
/* The CUDA backend's bottom floor (backend_cuda_driver.h). */
#include "backend.h"

#ifdef HAVE_CUDA_H

#include "backend_cuda_driver.h"

#include <errno.h>

/* The one place where a CUresult becomes an errno; keeps the driver's words. */
int cuda_result(struct cuda_backend *c, CUresult result, const char *call)
{
	const char *name = NULL, *text = NULL;

	backend_note_call(&c->base);
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
int context_enter(struct cuda_backend *c, int device, CUcontext *saved)
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

void context_leave(struct cuda_backend *c, CUcontext saved)
{
	CUcontext current = NULL;

	c->api.cuCtxGetCurrent(&current);
	if (current != saved)
		c->api.cuCtxSetCurrent(saved);
}

#endif
