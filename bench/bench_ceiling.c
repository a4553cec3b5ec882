/* SPDX-License-Identifier: MIT */
/* dormant-bench's ceiling: plain pinned copies of the kept bytes each way on
 * device memory mapped outside the manager, in the pieces the engine pins,
 * straight through the backend's table (the one place where the bench
 * drives the backend itself). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend.h"
#include "benchutil.h"
#include "dormant-bench.h"
#include "hostbuf.h"
#include "pinned.h"
#include "support.h"

/* One direction over the whole buffer, as one stream of piece-sized copies
 * (a copy must not cross a pinned piece), timed to the last one's event. */
static int ceiling_copy(struct backend *be, int d, const struct hostbuf *host, uintptr_t va,
			size_t bytes, bool to_host, void *stream, void *event, double *ret_s)
{
	double start = now_monotonic_s();
	int r;

	for (size_t off = 0; off < bytes; off += HOSTBUF_PIN_PIECE) {
		size_t len = MIN((size_t)HOSTBUF_PIN_PIECE, bytes - off);
		char *h = (char *)host->ptr + off;

		r = to_host ? backend_copy_to_host(be, d, h, va + off, len, stream)
			    : backend_copy_to_device(be, d, va + off, h, len, stream);
		if (r < 0)
			return r;
	}
	r = be->ops->event_record(be, d, event, stream);
	if (r == 0)
		r = be->ops->event_wait(be, d, event);
	if (r == 0)
		*ret_s = now_monotonic_s() - start;
	return r;
}

int ceiling_measure(struct bench *b)
{
	struct ceiling *c = &b->ceiling;
	struct backend *be = support_backend(b->m);
	const struct backend_ops *ops = be->ops;
	int d = b->device;
	size_t bytes = b->opt.keep_bytes;
	size_t size = round_up(bytes, b->granularity);
	size_t chunk = MAX(MIN(round_up(GiB, b->granularity), size), (size_t)1);
	size_t count = (size + chunk - 1) / chunk, mapped = 0;
	struct hostbuf host = { 0 };
	uint64_t *handles;
	void *stream = NULL, *event = NULL;
	double start, ignored;
	uintptr_t va;
	int r = -1;

	c->bytes = bytes;
	c->piece_bytes = HOSTBUF_PIN_PIECE;
	c->reps = b->opt.ceiling_reps;
	if (bytes == 0 || c->reps == 0)
		return 0;
	handles = calloc(count, sizeof(*handles));
	if (!handles)
		return bench_fail("out of host memory");
	if (ops->va_reserve(be, d, size, b->granularity, &va) < 0) {
		bench_fail_lib("ceiling: reserving %zu bytes of device addresses", size);
		goto err_handles;
	}
	for (; mapped < count; mapped++) {
		size_t len = MIN(chunk, size - mapped * chunk);

		if (backend_mem_create_map(be, d, va + mapped * chunk, len, &handles[mapped]) < 0) {
			bench_fail_lib("ceiling: mapping %zu bytes of device memory", len);
			goto err_unmap;
		}
	}
	start = now_monotonic_s();
	if (pinned_alloc(be, b->workers, bytes, HOSTBUF_PIN_PIECE, &host) < 0) {
		bench_fail_lib("ceiling: allocating %zu bytes of pinned host memory", bytes);
		goto err_unmap;
	}
	c->pin_s = now_monotonic_s() - start;
	if (ops->stream_create(be, d, &stream) < 0 || ops->event_create(be, d, &event) < 0) {
		bench_fail_lib("ceiling: creating a stream and an event");
		goto err_host;
	}
	/* One piece each way first, so that nothing is paid for the first time
	 * inside the measurement. */
	if (ceiling_copy(be, d, &host, va, MIN(bytes, (size_t)HOSTBUF_PIN_PIECE), true, stream,
			 event, &ignored) < 0 ||
	    ceiling_copy(be, d, &host, va, MIN(bytes, (size_t)HOSTBUF_PIN_PIECE), false, stream,
			 event, &ignored) < 0) {
		bench_fail_lib("ceiling: copying");
		goto err_host;
	}
	for (unsigned rep = 0; rep < c->reps; rep++) {
		if (ceiling_copy(be, d, &host, va, bytes, true, stream, event, &c->d2h_s[rep]) < 0 ||
		    ceiling_copy(be, d, &host, va, bytes, false, stream, event, &c->h2d_s[rep]) < 0) {
			bench_fail_lib("ceiling: copying %zu bytes", bytes);
			goto err_host;
		}
	}
	c->d2h_median_s = median(c->d2h_s, c->reps);
	c->h2d_median_s = median(c->h2d_s, c->reps);
	c->measured = true;
	r = 0;

err_host:
	if (event)
		ops->event_destroy(be, d, event);
	if (stream)
		ops->stream_destroy(be, d, stream);
	start = now_monotonic_s();
	hostbuf_free(be, &host);
	c->unpin_s = now_monotonic_s() - start;
err_unmap:
	while (mapped--) {
		size_t len = MIN(chunk, size - mapped * chunk);

		backend_mem_unmap_release(be, d, va + mapped * chunk, len, handles[mapped]);
	}
	ops->va_free(be, va, size);
err_handles:
	free(handles);
	return r;
}

double ceiling_gbps(const struct bench *b, bool to_host)
{
	const struct ceiling *c = &b->ceiling;

	if (!c->measured)
		return NAN;
	return (double)c->bytes / (to_host ? c->d2h_median_s : c->h2d_median_s) / 1e9;
}
