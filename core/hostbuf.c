/* SPDX-License-Identifier: MIT */
#include "hostbuf.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HOSTBUF_ALIGN (2 * MiB)

/* Fault in and pin pieces in parallel: faulting is per-core work, and a
 * piece is registered by the thread that touched it, while it is hot. */
struct pin_job {
	struct backend *backend;
	char *ptr;
	size_t size;
	size_t piece;
	bool *pinned;          /* per piece */
	atomic_bool failed;
	int error;
	char message[DORMANT_ERROR_MAX];
};

static void pin_piece_run(void *arg, size_t i)
{
	struct pin_job *job = arg;
	size_t offset = i * job->piece;
	size_t len = MIN(job->piece, job->size - offset);
	long page = sysconf(_SC_PAGESIZE);
	int r;

	if (atomic_load(&job->failed))
		return;
	for (size_t p = 0; p < len; p += (size_t)page)
		((volatile char *)job->ptr)[offset + p] = 0;
	r = job->backend->ops->host_pin(job->backend, job->ptr + offset, len);
	if (r == 0) {
		job->pinned[i] = true;
		return;
	}
	if (!atomic_exchange(&job->failed, true)) {
		job->error = r;
		snprintf(job->message, sizeof(job->message), "%s", dormant_last_error());
	}
}

static void unpin_pieces(struct backend *b, char *ptr, size_t size, size_t piece,
			 const bool *pinned)
{
	for (size_t i = 0, off = 0; off < size; i++, off += piece)
		if (!pinned || pinned[i])
			b->ops->host_unpin(b, ptr + off);
}

int hostbuf_alloc(struct backend *b, size_t size, struct hostbuf *ret)
{
	size_t mapped = round_up(size, 4096);
	size_t span = mapped + HOSTBUF_ALIGN;
	uintptr_t base, aligned;
	char *ptr;
	int r;

	r = backend_fault_check(b, DORMANT_FAULT_HOST_ALLOC);
	if (r < 0)
		return r;
	ptr = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (ptr == MAP_FAILED)
		return error_set(-ENOMEM, "allocating %zu bytes of host memory: %s", size,
				 strerror(errno));
	/* Align to 2 MiB so that huge pages can back the whole buffer. */
	base = (uintptr_t)ptr;
	aligned = round_up(base, HOSTBUF_ALIGN);
	if (aligned > base)
		munmap(ptr, aligned - base);
	if (base + span > aligned + mapped)
		munmap((void *)(aligned + mapped), base + span - aligned - mapped);
	ptr = (char *)aligned;
	madvise(ptr, mapped, MADV_HUGEPAGE);
	ret->ptr = ptr;
	ret->size = mapped;
	ret->pin_piece = 0;
	return 0;
}

int hostbuf_pin(struct backend *b, struct workers *w, struct hostbuf *hb, size_t pin_piece)
{
	size_t pieces = (hb->size + pin_piece - 1) / pin_piece;
	struct pin_job job = { .backend = b, .ptr = hb->ptr, .size = hb->size, .piece = pin_piece };

	job.pinned = calloc(pieces, sizeof(*job.pinned));
	if (!job.pinned)
		return error_set(-ENOMEM, "out of host memory");
	/* Registering touched memory is ten times faster than untouched. */
	workers_parallel(w, pin_piece_run, &job, pieces);
	if (atomic_load(&job.failed)) {
		unpin_pieces(b, hb->ptr, hb->size, pin_piece, job.pinned);
		free(job.pinned);
		return error_set(job.error, "pinning %zu bytes of host memory: %s", hb->size,
				 job.message);
	}
	free(job.pinned);
	hb->pin_piece = pin_piece;
	return 0;
}

void hostbuf_free(struct backend *b, struct hostbuf *hb)
{
	if (!hb->ptr)
		return;
	if (hb->pin_piece)
		unpin_pieces(b, hb->ptr, hb->size, hb->pin_piece, NULL);
	munmap(hb->ptr, hb->size);
	memset(hb, 0, sizeof(*hb));
}
