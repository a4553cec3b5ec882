/* SPDX-License-Identifier: MIT */
/* Pinned host memory as the engine makes it, for the benchmarks that copy
 * through the backend themselves (dormant-bench's ceiling and pattern,
 * probe-vmm): it reaches into the static core's host buffers. */
#ifndef DORMANT_BENCH_PINNED_H
#define DORMANT_BENCH_PINNED_H

#include <stddef.h>

#include "backend.h"
#include "hostbuf.h"
#include "workers.h"

/* Pinned host memory, as the engine makes it (core/engine/hostbuf.c): allocated,
 * faulted in over the worker threads, registered in pieces of piece_bytes.
 * A copy must stay inside one piece. Free it with hostbuf_free(). Returns 0
 * or a negative errno with dormant_last_error() set. */
int pinned_alloc(struct backend *b, struct workers *w, size_t size, size_t piece_bytes,
		 struct hostbuf *ret);

#endif
