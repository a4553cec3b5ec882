/* SPDX-License-Identifier: MIT */
/* dormant-bench's one door into the static core's internals besides the
 * ceiling (bench_ceiling.c): its worker pool, pinned host memory, the
 * backend's device figures and the manager's resolved settings. The rest of
 * the program uses the public API and these calls only. */
#include <errno.h>
#include <stdlib.h>

#include "backend.h"
#include "dormant-bench.h"
#include "hostbuf.h"
#include "manager.h"
#include "pinned.h"
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
	return b->m->backend->ops->current_device(b->m->backend);
}

int core_granularity(struct bench *b, int device, size_t *ret)
{
	return b->m->backend->ops->granularity(b->m->backend, device, ret);
}

int core_device_memory(struct bench *b, int device, uint64_t *ret_free, uint64_t *ret_total)
{
	return b->m->backend->ops->mem_info(b->m->backend, device, ret_free, ret_total);
}

int core_pattern_alloc(struct bench *b, size_t bytes)
{
	struct hostbuf *hb = calloc(1, sizeof(*hb));
	int r;

	if (!hb)
		return error_set(-ENOMEM, "out of host memory");
	/* one piece at most: a copy stays inside one */
	r = pinned_alloc(b->m->backend, b->workers, MIN(bytes, (size_t)HOSTBUF_PIN_PIECE),
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
	hostbuf_free(b->m->backend, b->pattern);
	free(b->pattern);
	b->pattern = NULL;
	b->pattern_ptr = NULL;
	b->pattern_size = 0;
}

void core_settle(struct bench *b)
{
	workers_drain(b->m->workers);
}

void core_settings_read(const struct bench *b, struct core_settings *ret)
{
	*ret = (struct core_settings){
		.chunk_bytes = b->m->chunk_bytes,
		.staging_bytes = b->m->engine.staging_bytes,
		.pin_piece_bytes = b->m->engine.pin_piece,
		.reclaimable_pinned_bytes = b->m->engine.reclaim_pinned_max,
		.copy_threads = workers_threads(b->m->workers),
		.serial_devices = b->m->engine.serial_devices,
	};
}
