/* SPDX-License-Identifier: MIT */
#include "hostbuf.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#define HOSTBUF_ALIGN (2 * MiB)

static void unpin_pieces(struct backend *b, char *ptr, size_t size, size_t piece)
{
	for (size_t off = 0; off < size; off += piece)
		b->ops->host_unpin(b, ptr + off);
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
	return 0;
}

void hostbuf_touch(struct workers *w, struct hostbuf *hb)
{
	workers_touch(w, hb->ptr, hb->size);
}

int hostbuf_pin(struct backend *b, struct hostbuf *hb, size_t pin_piece)
{
	size_t pinned = 0;
	int r;

	for (; pinned < hb->size; pinned += pin_piece) {
		r = b->ops->host_pin(b, (char *)hb->ptr + pinned, MIN(pin_piece, hb->size - pinned));
		if (r < 0) {
			for (size_t off = 0; off < pinned; off += pin_piece)
				b->ops->host_unpin(b, (char *)hb->ptr + off);
			return error_prefix(r, "pinning %zu bytes of host memory", hb->size);
		}
	}
	hb->pin_piece = pin_piece;
	return 0;
}

int hostbuf_make_reclaimable(struct backend *b, struct hostbuf *hb)
{
	if (hb->pin_piece)
		unpin_pieces(b, hb->ptr, hb->size, hb->pin_piece);
	hb->pin_piece = 0;
	if (madvise(hb->ptr, hb->size, MADV_FREE) < 0)
		return error_set(-errno, "handing %zu bytes of host memory to the kernel: %s",
				 hb->size, strerror(errno));
	hb->reclaimable = true;
	return 0;
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
		unpin_pieces(b, hb->ptr, hb->size, hb->pin_piece);
	munmap(hb->ptr, hb->size);
	memset(hb, 0, sizeof(*hb));
}
