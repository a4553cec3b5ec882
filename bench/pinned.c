/* SPDX-License-Identifier: MIT */
/* Pinned host memory as the engine makes it (pinned.h). */
#include "pinned.h"

#include <errno.h>

#include "common.h"

int pinned_alloc(struct backend *b, struct workers *w, size_t size, size_t piece_bytes,
		 struct hostbuf *ret)
{
	struct hostbuf hb;
	int r;

	if (piece_bytes == 0 || piece_bytes % 4096)
		return error_set(-EINVAL, "pinned pieces must be a multiple of 4096 bytes");
	r = hostbuf_alloc(b, MAX(size, (size_t)1), &hb);
	if (r < 0)
		return r;
	hostbuf_touch(w, &hb);
	r = hostbuf_pin(b, &hb, piece_bytes, 1);
	if (r < 0) {
		hostbuf_free(b, &hb);
		return r;
	}
	*ret = hb;
	return 0;
}
