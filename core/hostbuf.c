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

void hostbuf_free(struct backend *b, struct hostbuf *hb)
{
	if (!hb->ptr)
		return;
	if (hb->pin_piece)
		unpin_pieces(b, hb->ptr, hb->size, hb->pin_piece);
	munmap(hb->ptr, hb->size);
	memset(hb, 0, sizeof(*hb));
}
