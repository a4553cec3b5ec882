/* SPDX-License-Identifier: MIT */
/* dormant-bench's one door into the static core's internals besides the
 * ceiling (bench_ceiling.c): its worker pool, pinned host memory, the
 * backend's device figures and the manager's resolved settings, through the
 * core's test-support header (support.h) and the lower rooms' interfaces.
 * The rest of the program uses the public API and these calls only. */
#include <errno.h>
#include <stdlib.h>

#include "backend.h"
#include "dormant-bench.h"
#include "hostbuf.h"
#include "pinned.h"
#include "support.h"
#include "workers.h"

int core_workers_start(struct bench *b, unsigned threads)
{
	return workers_new(threads, &b->workers);
}

void core_workers_stop(struct bench *b)
{
	workers_destroy(b->workers);
	b->workers = NULL;
}

void core_parallel(struct bench *b, void (*fn)(void *ctx, size_t i), void *ctx, size_t count)
{
	workers_parallel(b->workers, fn, ctx, count);
}

int core_current_device(struct bench *b)
{
	struct backend *be = support_backend(b->m);

	return be->ops->current_device(be);
}

int core_granularity(struct bench *b, int device, size_t *ret)
{
	struct backend *be = support_backend(b->m);

	return be->ops->granularity(be, device, ret);
}

int core_device_memory(struct bench *b, int device, uint64_t *ret_free, uint64_t *ret_total)
{
	struct backend *be = support_backend(b->m);

	return be->ops->mem_info(be, device, ret_free, ret_total);
}

int core_pattern_alloc(struct bench *b, size_t bytes)
{
	struct hostbuf *hb = calloc(1, sizeof(*hb));
	int r;

	if (!hb)
		return error_set(-ENOMEM, "out of host memory");
	/* one piece at most: a copy stays inside one */
	r = pinned_alloc(support_backend(b->m), b->workers, MIN(bytes, (size_t)HOSTBUF_PIN_PIECE),
			 HOSTBUF_PIN_PIECE, hb);
	if (r < 0) {
		free(hb);
		return r;
	}
	b->pattern = hb;
	b->pattern_ptr = hb->ptr;
	b->pattern_size = hb->size;
	return 0;
}

void core_pattern_free(struct bench *b)
{
	if (!b->pattern)
		return;
	hostbuf_free(support_backend(b->m), b->pattern);
	free(b->pattern);
	b->pattern = NULL;
	b->pattern_ptr = NULL;
	b->pattern_size = 0;
}

void core_settle(struct bench *b)
{
	workers_drain(support_workers(b->m));
}

void core_settings_read(const struct bench *b, struct core_settings *ret)
{
	support_settings_get(b->m, &ret->chunk_bytes, &ret->staging_bytes, &ret->pin_piece_bytes,
			     &ret->reclaimable_pinned_bytes, &ret->copy_threads, &ret->serial_devices);
}
