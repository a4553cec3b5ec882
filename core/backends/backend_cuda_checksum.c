/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend's checksum ops (backend.h): the kernel of
 * kernels/checksum.cu, embedded as PTX, loaded per device on first use and
 * launched through the driver API.
 */
#include "backend.h"

#ifdef HAVE_CUDA_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda_kernel.h"

/* $DORMANT_CHECKSUM_PTX names a PTX file to load instead of the embedded one
 * (a test tool: the GPU suite runs a fresh nvcc build this way). */
static const struct cuda_kernel_source checksum_source = {
	.ptx = dormant_checksum_ptx,
	.name = CHECKSUM_KERNEL,
	.what = "checksum kernel",
	.ptx_env = "DORMANT_CHECKSUM_PTX",
};

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
	return cuda_kernel_get(c, &c->checksum[device], &checksum_source, ret);
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

int cuda_checksum_start(struct backend *b, int device, const struct checksum_range *ranges,
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

int cuda_checksum_queue(struct backend *b, int device, void *job, size_t g, void *event)
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

int cuda_checksum_finish(struct backend *b, int device, void *job, struct checksum *out)
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

/* Load the device's kernel now (cuModuleLoadData compiles the PTX): the
 * engine's device setup, ahead of the first hash. */
int cuda_checksum_prepare(struct backend *b, int device)
{
	struct cuda_backend *c = cuda(b);
	CUfunction kernel;
	CUcontext saved;
	int r;

	r = context_enter(c, device, &saved);
	if (r < 0)
		return r;
	r = kernel_get(c, device, &kernel);
	context_leave(c, saved);
	return r;
}

/* One job of one group on the caller's stream, after its queued work. */
int cuda_checksum(struct backend *b, int device, const struct checksum_range *ranges,
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

#endif /* HAVE_CUDA_H */
