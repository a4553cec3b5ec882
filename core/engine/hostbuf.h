/* SPDX-License-Identifier: MIT */
/*
 * Host buffers: where KEEP chunks live while asleep, and the pinned staging
 * ring. Memory comes from mmap (2 MiB aligned, transparent huge pages
 * advised), is faulted in by the worker threads, and, when pinned, is
 * registered with the device in pieces: registering touched memory in
 * pieces is far faster than allocating pinned memory, and a copy must not
 * cross a piece boundary.
 */
#ifndef DORMANT_HOSTBUF_H
#define DORMANT_HOSTBUF_H

#include <stdbool.h>
#include <stddef.h>

#include "backend.h"
#include "workers.h"

/* Default size of the pieces registered at once ($DORMANT_PIN_PIECE_BYTES).
 * On the H200 machine 256 MiB pinned fresh memory faster than 64 MiB or
 * 1 GiB (docs/benchmarks.md, "pinning sweep"). */
#define HOSTBUF_PIN_PIECE (256 * MiB)
/* Most threads that pin one buffer's pieces at once (option pin_threads). */
#define HOSTBUF_PIN_THREADS_MAX 32
/* A kept host copy (retain mode) larger than needed by more than this and a
 * quarter is given back and allocated anew at the right size. */
#define HOSTBUF_SLACK_BYTES (2 * MiB)

struct reclaim_job;

struct hostbuf {
	void *ptr;         /* NULL: no buffer */
	size_t size;       /* bytes mapped */
	size_t pin_piece;  /* 0: not pinned; else registered in pieces this big */
	bool reclaimable;  /* unpinned and MADV_FREE: the kernel may have taken pages */
	/* reclaimable: the worker job that unpins it and hands its pages to the
	 * kernel, pending or done, until the owner waits for it (transfer.c:
	 * engine_host_settle()); nothing else may touch the buffer before */
	struct reclaim_job *reclaim;
};

/* Allocate at least size bytes of ordinary host memory, not faulted in.
 * A fault-injection point (DORMANT_FAULT_HOST_ALLOC). */
int hostbuf_alloc(struct backend *b, size_t size, struct hostbuf *ret);

/* Fault the buffer in, spread over the workers: registering touched memory
 * is ten times faster than untouched. */
void hostbuf_touch(struct workers *w, struct hostbuf *hb);

/* Register a (touched) buffer in pieces of pin_piece bytes, a multiple of
 * the page size, on up to threads threads at once (the caller's and
 * threads - 1 of its own; 1: one piece after another on the caller's). On
 * failure the buffer stays allocated and unpinned, every piece that was
 * pinned unpinned again. */
int hostbuf_pin(struct backend *b, struct hostbuf *hb, size_t pin_piece, unsigned threads);
/* Register hb's pieces of pin_piece bytes one after another, from *pinned
 * (the bytes registered so far, from the start) until [0, end) is covered;
 * *pinned grows with each piece. On failure the pieces registered stay so
 * (hostbuf_unpin_first() undoes them) and hb->pin_piece is not touched: a
 * sleep registers its host copy this way just ahead of its copies
 * (pipeline.c), hostbuf_pin() all at once. */
int hostbuf_pin_upto(struct backend *b, struct hostbuf *hb, size_t pin_piece, size_t *pinned,
		     size_t end);
/* Unregister the first pinned bytes of hb, registered in pieces of
 * pin_piece bytes. */
void hostbuf_unpin_first(struct backend *b, struct hostbuf *hb, size_t pin_piece, size_t pinned);
/* Unpin and unmap; accepts an empty buffer, leaves it empty. Not with a
 * reclaim job pending (wait for it first). */
void hostbuf_free(struct backend *b, struct hostbuf *hb);

/* Unpin hb and hand its pages to the kernel as reclaimable (MADV_FREE): a
 * page it takes reads as zero afterwards, one it leaves keeps its bytes
 * until written. The buffer stays mapped for reuse (hostbuf_reuse()) and is
 * marked reclaimable. Where the kernel has no MADV_FREE, its pages are
 * dropped at once (MADV_DONTNEED: they read as zero, as if all were taken)
 * and 1 is returned, the reason in dormant_last_error(); -errno where
 * neither works (the pages stay resident). */
int hostbuf_make_reclaimable(struct backend *b, struct hostbuf *hb);

/* Take a reclaimable buffer back (its reclaim job waited for): writing
 * every page (hostbuf_touch()) cancels the kernel's claim on those it left
 * and faults in the others. */
void hostbuf_reuse(struct workers *w, struct hostbuf *hb);

#endif
