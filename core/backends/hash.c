/* SPDX-License-Identifier: MIT */
/* The chunk hash on the CPU (hash.h). */
#include "hash.h"

#include <string.h>

static inline uint64_t load_le(const unsigned char *p, size_t n)
{
	uint64_t w = 0;

	for (size_t i = 0; i < n; i++)
		w |= (uint64_t)p[i] << (8 * i);
	return w;
}

struct checksum checksum_cpu(const void *p, size_t size, uint64_t offset)
{
	const unsigned char *bytes = p;
	uint64_t a0 = 0, a1 = 0, o = offset;
	size_t at = 0;

	for (; at + 8 <= size; at += 8, o += 8) {
		uint64_t w;

		memcpy(&w, bytes + at, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
		w = __builtin_bswap64(w);
#endif
		a0 += checksum_term0(w, o);
		a1 += checksum_term1(w, o);
	}
	if (at < size) {
		uint64_t w = load_le(bytes + at, size - at);

		a0 += checksum_term0(w, o);
		a1 += checksum_term1(w, o);
	}
	return (struct checksum){ .lane = { a0, a1 } };
}
