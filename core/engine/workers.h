/* SPDX-License-Identifier: MIT */
/*
 * A small pool of host threads for the host side of transfers: copies
 * between pinned staging memory and ordinary host memory, and faulting in
 * fresh host buffers, both of which need several cores to keep up with PCIe.
 * Threads start on first use.
 */
#ifndef DORMANT_WORKERS_H
#define DORMANT_WORKERS_H

#include <stddef.h>

struct workers;

int workers_new(unsigned threads, struct workers **ret);
/* Waits for queued background jobs, then stops the threads. Accepts NULL. */
void workers_destroy(struct workers *w);

/* Run fn(ctx, i) for i in [0, count) on the pool and the calling thread;
 * returns when all are done. Falls back to the calling thread alone if the
 * threads cannot start. */
void workers_parallel(struct workers *w, void (*fn)(void *ctx, size_t i), void *ctx, size_t count);

/* Run fn(arg) later on a pool thread; runs it at once on the calling thread
 * if the pool cannot take it. */
void workers_submit(struct workers *w, void (*fn)(void *arg), void *arg);

/* Wait until every submitted background job has finished. */
void workers_drain(struct workers *w);

/* memcpy / fault-in over the pool, in slices of at least min_slice bytes.
 * Large slices are copied with stores that bypass the cache (x86-64; off
 * with DORMANT_STREAM_STORES=0, for measuring). */
void workers_memcpy(struct workers *w, void *dst, const void *src, size_t size);
void workers_touch(struct workers *w, void *ptr, size_t size);

unsigned workers_threads(const struct workers *w);

#endif
