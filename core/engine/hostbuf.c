/* SPDX-License-Identifier: MIT */
#include "hostbuf.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define HOSTBUF_ALIGN (2 * MiB)

int hostbuf_pin_upto(struct backend *b, struct hostbuf *hb, size_t pin_piece, size_t *pinned,
		     size_t end)
{
	end = MIN(end, hb->size);
	while (*pinned < end) {
		size_t len = MIN(pin_piece, hb->size - *pinned);
		int r = b->ops->host_pin(b, (char *)hb->ptr + *pinned, len);

		if (r < 0)
			return r;
		*pinned += len;
	}
	return 0;
}

void hostbuf_unpin_first(struct backend *b, struct hostbuf *hb, size_t pin_piece, size_t pinned)
{
	for (size_t off = 0; off < pinned; off += pin_piece)
		b->ops->host_unpin(b, (char *)hb->ptr + off);
}

int hostbuf_alloc(struct backend *b, size_t size, struct hostbuf *ret)
{
	size_t mapped = round_up(size, 4096);
	void *ptr;
	int r;

	r = backend_fault_check(b, DORMANT_FAULT_HOST_ALLOC);
	if (r < 0)
		return r;
	/* 2 MiB aligned, so that huge pages can back the whole buffer */
	ptr = mmap_aligned(mapped, HOSTBUF_ALIGN, PROT_READ | PROT_WRITE, 0);
	if (ptr == MAP_FAILED)
		return error_set(-ENOMEM, "allocating %zu bytes of host memory: %s", size,
				 strerror(errno));
	madvise(ptr, mapped, MADV_HUGEPAGE);
	ret->ptr = ptr;
	ret->size = mapped;
	ret->pin_piece = 0;
	ret->reclaimable = false;
	ret->reclaim = NULL;
	return 0;
}

void hostbuf_touch(struct workers *w, struct hostbuf *hb)
{
	workers_touch(w, hb->ptr, hb->size);
}

/* One buffer's pieces, pinned by several threads at once: each takes the
 * next piece until none is left or one failed. */
struct pin_run {
	struct backend *b;
	char *ptr;
	size_t size, piece, count;
	bool *pinned; /* per piece; each written by the one thread that took it */
	atomic_size_t next;
	atomic_bool failed;
	pthread_mutex_t lock; /* error, message */
	int error;
	char message[DORMANT_ERROR_MAX];
};

static void pin_run_work(struct pin_run *run)
{
	while (!atomic_load(&run->failed)) {
		size_t i = atomic_fetch_add(&run->next, 1);
		int r;

		if (i >= run->count)
			break;
		r = run->b->ops->host_pin(run->b, run->ptr + i * run->piece,
					  MIN(run->piece, run->size - i * run->piece));
		if (r < 0) {
			pthread_mutex_lock(&run->lock);
			if (!run->error) { /* the first failure's message */
				run->error = r;
				snprintf(run->message, sizeof(run->message), "%s",
					 dormant_last_error());
			}
			pthread_mutex_unlock(&run->lock);
			atomic_store(&run->failed, true);
			break;
		}
		run->pinned[i] = true;
	}
}

static void *pin_run_main(void *arg)
{
	pin_run_work(arg);
	return NULL;
}

/* The pieces on up to threads threads; on failure every pinned one is
 * unpinned again. 1 (nothing pinned) when the run cannot be set up: the
 * caller pins them one after another instead. */
static int pin_parallel(struct backend *b, struct hostbuf *hb, size_t piece, unsigned threads)
{
	struct pin_run run = { .b = b, .ptr = hb->ptr, .size = hb->size, .piece = piece };
	pthread_t ids[HOSTBUF_PIN_THREADS_MAX];
	unsigned started = 0;

	run.count = (hb->size + piece - 1) / piece;
	threads = (unsigned)MIN((size_t)MIN(threads, HOSTBUF_PIN_THREADS_MAX), run.count);
	run.pinned = calloc(run.count, sizeof(*run.pinned));
	if (!run.pinned)
		return 1;
	pthread_mutex_init(&run.lock, NULL);
	/* the calling thread is one of them; fewer start if some cannot */
	while (started + 1 < threads &&
	       pthread_create(&ids[started], NULL, pin_run_main, &run) == 0)
		started++;
	pin_run_work(&run);
	for (unsigned t = 0; t < started; t++)
		pthread_join(ids[t], NULL);
	pthread_mutex_destroy(&run.lock);
	if (run.error)
		for (size_t i = 0; i < run.count; i++)
			if (run.pinned[i])
				b->ops->host_unpin(b, run.ptr + i * piece);
	free(run.pinned);
	if (run.error)
		return error_set(run.error, "%s", run.message);
	return 0;
}

int hostbuf_pin(struct backend *b, struct hostbuf *hb, size_t pin_piece, unsigned threads)
{
	size_t pinned = 0;
	int r;

	if (threads > 1 && hb->size > pin_piece) {
		r = pin_parallel(b, hb, pin_piece, threads);
		if (r < 0)
			return error_prefix(r, "pinning %zu bytes of host memory", hb->size);
		if (r == 0) {
			hb->pin_piece = pin_piece;
			return 0;
		}
	}
	r = hostbuf_pin_upto(b, hb, pin_piece, &pinned, hb->size);
	if (r < 0) {
		hostbuf_unpin_first(b, hb, pin_piece, pinned);
		return error_prefix(r, "pinning %zu bytes of host memory", hb->size);
	}
	hb->pin_piece = pin_piece;
	return 0;
}

int hostbuf_make_reclaimable(struct backend *b, struct hostbuf *hb)
{
	int free_errno;

	if (hb->pin_piece)
		hostbuf_unpin_first(b, hb, hb->pin_piece, hb->size);
	hb->pin_piece = 0;
	hb->reclaimable = true;
	if (madvise(hb->ptr, hb->size, MADV_FREE) == 0)
		return 0;
	free_errno = errno;
	/* the contents are not needed: drop the pages now instead */
	if (madvise(hb->ptr, hb->size, MADV_DONTNEED) == 0) {
		error_set(-free_errno,
			  "MADV_FREE of %zu bytes of host memory failed (%s): dropped them "
			  "with MADV_DONTNEED instead",
			  hb->size, strerror(free_errno));
		return 1;
	}
	return error_set(-errno,
			 "handing %zu bytes of host memory to the kernel: MADV_FREE failed (%s), "
			 "MADV_DONTNEED too (%s)",
			 hb->size, strerror(free_errno), strerror(errno));
}

void hostbuf_reuse(struct workers *w, struct hostbuf *hb)
{
	hostbuf_touch(w, hb);
	hb->reclaimable = false;
}

void hostbuf_free(struct backend *b, struct hostbuf *hb)
{
	if (!hb->ptr)
		return;
	if (hb->pin_piece)
		hostbuf_unpin_first(b, hb, hb->pin_piece, hb->size);
	munmap(hb->ptr, hb->size);
	memset(hb, 0, sizeof(*hb));
}
