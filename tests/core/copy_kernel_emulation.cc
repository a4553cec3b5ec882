// SPDX-License-Identifier: MIT
//
// The copy kernel's source (core/kernels/copy.cu) run on the CPU, so that CI,
// which has no GPU, checks its logic: the head and tail bytes around the
// aligned words, the word width two addresses allow together, grid-stride
// over any grid. Its threads never wait for each other, so running them one
// after another is one of the schedules a device may pick. Every size up to
// 100 and some large odd ones, at every pair of offsets modulo 16, for grids
// smaller and larger than the work; the bytes around the destination must
// stay untouched. The GPU suite runs the real PTX (tests/core/test_wake_copy.c,
// wake-copy-cuda). Exit status 0 when every copy is exact.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)

namespace {
struct dim3 {
	unsigned x, y, z;
};
struct uint4 {
	unsigned x, y, z, w;
};
dim3 threadIdx, blockIdx, blockDim, gridDim;
} // namespace

#include "copy.cu"

namespace {
// One launch, every thread of every block in turn.
void launch(unsigned char *dst, const unsigned char *src, u64 size, unsigned blocks,
	    unsigned threads)
{
	gridDim = { blocks, 1, 1 };
	blockDim = { threads, 1, 1 };
	for (unsigned b = 0; b < blocks; b++)
		for (unsigned t = 0; t < threads; t++) {
			blockIdx = { b, 0, 0 };
			threadIdx = { t, 0, 0 };
			dormant_copy_kernel(dst, src, size);
		}
}

int check(size_t size, unsigned dst_off, unsigned src_off, unsigned blocks, unsigned threads)
{
	const size_t pad = 64;
	// 16-byte aligned storage, so that the offsets are the addresses' modulo 16
	std::vector<uint4> src_words((size + 2 * pad) / 16 + 2), dst_words((size + 2 * pad) / 16 + 2);
	unsigned char *src = (unsigned char *)src_words.data() + src_off;
	unsigned char *dst = (unsigned char *)dst_words.data() + pad + dst_off;
	unsigned char *dst_all = (unsigned char *)dst_words.data();
	size_t all = dst_words.size() * 16;

	for (size_t i = 0; i < size; i++)
		src[i] = (unsigned char)(i * 131 + 7 + (i >> 8));
	memset(dst_all, 0xee, all);
	launch(dst, src, size, blocks, threads);
	if (memcmp(dst, src, size) != 0) {
		fprintf(stderr, "copy of %zu bytes (dst +%u, src +%u, %u x %u) differs\n", size,
			dst_off, src_off, blocks, threads);
		return 1;
	}
	for (size_t i = 0; i < all; i++) {
		unsigned char *p = dst_all + i;

		if ((p < dst || p >= dst + size) && *p != 0xee) {
			fprintf(stderr, "copy of %zu bytes (dst +%u, src +%u, %u x %u) wrote byte %td "
					"outside it\n",
				size, dst_off, src_off, blocks, threads, p - dst);
			return 1;
		}
	}
	return 0;
}
} // namespace

int main()
{
	static const struct {
		unsigned blocks, threads;
	} grids[] = { { 1, 32 }, { 3, 64 }, { 2, 1024 } };
	static const size_t large[] = { 4096, 65536 + 3, 300007 };
	int failed = 0, copies = 0;

	for (const auto &g : grids)
		for (unsigned d = 0; d < 16; d++)
			for (unsigned s = 0; s < 16; s++) {
				for (size_t size = 0; size <= 100; size++, copies++)
					failed += check(size, d, s, g.blocks, g.threads);
				if (d == 0 || s == 0 || d == s) /* every distance */
					for (size_t size : large) {
						failed += check(size, d, s, g.blocks, g.threads);
						copies++;
					}
			}
	printf("%d of %d copies exact\n", copies - failed, copies);
	return failed ? 1 : 0;
}
