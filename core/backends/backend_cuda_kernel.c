/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend's kernels (checksum, copy): each embedded as PTX, loaded
 * into a device's context on first use, once; a load that failed keeps its
 * error and every later use gets it.
 */
#include "backend.h"

#ifdef HAVE_CUDA_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend_cuda_kernel.h"

/* The PTX file an environment variable names (a test tool: the GPU suite runs
 * a fresh nvcc build this way), or NULL. */
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

/* Called with k->lock, the device's context current. */
static int kernel_load(struct cuda_backend *c, struct cuda_kernel *k,
		       const struct cuda_kernel_source *src)
{
	const char *path = src->ptx_env ? getenv(src->ptx_env) : NULL;
	char *text = NULL;
	int r;

	k->tried = true;
	if (path && *path) {
		text = ptx_read(path);
		if (!text) {
			r = error_set(-ENOTSUP, "cannot read $%s (%s)", src->ptx_env, path);
			goto fail;
		}
	}
	r = CALL(c, cuModuleLoadData, &k->module, text ? text : src->ptx);
	free(text);
	if (r == 0)
		r = CALL(c, cuModuleGetFunction, &k->function, k->module, src->name);
	if (r == 0)
		return 0;
	error_prefix(r, "loading the %s", src->what);
	r = -ENOTSUP;
	if (k->module)
		c->api.cuModuleUnload(k->module);
	k->module = NULL;
fail:
	k->error = r;
	snprintf(k->message, sizeof(k->message), "%s", dormant_last_error());
	return r;
}

int cuda_kernel_get(struct cuda_backend *c, struct cuda_kernel *k,
		    const struct cuda_kernel_source *src, CUfunction *ret)
{
	int r = 0;

	pthread_mutex_lock(&k->lock);
	if (!k->tried)
		r = kernel_load(c, k, src);
	else if (k->error)
		r = error_set(k->error, "%s", k->message);
	*ret = k->function;
	pthread_mutex_unlock(&k->lock);
	return r;
}

void cuda_kernel_init(struct cuda_kernel *k)
{
	pthread_mutex_init(&k->lock, NULL);
}

void cuda_kernel_unload(struct cuda_backend *c, int device, struct cuda_kernel *k)
{
	CUcontext saved;

	if (k->module && context_enter(c, device, &saved) == 0) {
		c->api.cuModuleUnload(k->module);
		context_leave(c, saved);
	}
	k->module = NULL;
	pthread_mutex_destroy(&k->lock);
}

#endif /* HAVE_CUDA_H */
