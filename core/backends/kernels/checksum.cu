/* SPDX-License-Identifier: MIT */
/*
 * The chunk checksum on the device (core/backends/hash.h defines it;
 * checksum_cpu() computes the same bits on the CPU, each word's terms from
 * the same hash_mix.h). Compiled to PTX (nvcc -ptx), shipped as
 * core/backends/kernels/checksum.ptx and embedded into libdormant, which
 * loads it through the driver API (cuModuleLoadData): no CUDA runtime is
 * involved, so this file includes only hash_mix.h (which includes nothing)
 * and uses only built-in device functions.
 *
 * The work is a list of ranges, each cut into tiles of TILE bytes; one block
 * hashes one tile at a time (grid-stride), its threads reading consecutive
 * words (coalesced), and adds its two lane sums into the range's two output
 * words with atomicAdd. Addition modulo 2^64 is commutative, so the order in
 * which blocks finish does not change a bit of the result.
 */

#define THREADS 256
#define TILE (64 * 1024)
#define WORDS (TILE / 8 / THREADS) /* per thread in a whole tile */

/* each word's terms: the one definition the CPU's checksum_cpu() uses too */
#define HASH_MIX_FN __device__ __forceinline__
#include "../hash_mix.h"

typedef unsigned long long u64;

struct range {
	u64 ptr;        /* device address of the range's first byte */
	u64 size;       /* bytes */
	u64 offset;     /* of its first byte in its chunk: positions the words */
	u64 first_tile; /* tiles of the ranges before it */
};

/* Bytes [at, at + n) of the range (n < 8 or unaligned), little-endian,
 * zero-padded. */
__device__ u64 load_bytes(const unsigned char *at, unsigned n)
{
	u64 w = 0;

	for (unsigned i = 0; i < n; i++)
		w |= (u64)at[i] << (8 * i);
	return w;
}

extern "C" __global__ void __launch_bounds__(THREADS)
dormant_checksum_kernel(const struct range *ranges, unsigned count, u64 tiles, u64 *out)
{
	__shared__ u64 part[2][THREADS / 32];

	for (u64 tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
		unsigned lo = 0, hi = count - 1;

		/* the last range whose first tile is at most this one */
		while (lo < hi) {
			unsigned mid = (lo + hi + 1) / 2;

			if (ranges[mid].first_tile <= tile)
				lo = mid;
			else
				hi = mid - 1;
		}
		const struct range r = ranges[lo];
		const u64 start = (tile - r.first_tile) * TILE;
		const u64 end = start + TILE < r.size ? start + TILE : r.size;
		const unsigned char *base = (const unsigned char *)r.ptr;
		const bool aligned = (r.ptr & 7) == 0;
		u64 a0 = 0, a1 = 0;

		if (aligned && end - start == TILE) {
			/* a whole aligned tile: WORDS loads per thread, unrolled so
			 * that many are in flight at once */
			const u64 *words = (const u64 *)(base + start);
			const u64 o0 = r.offset + start + 8 * (u64)threadIdx.x;

#pragma unroll 8
			for (unsigned i = 0; i < WORDS; i++) {
				const u64 w = words[threadIdx.x + i * THREADS];
				const u64 o = o0 + 8 * (u64)(i * THREADS);

				a0 += checksum_term0(w, o);
				a1 += checksum_term1(w, o);
			}
		} else {
			for (u64 at = start + 8 * (u64)threadIdx.x; at < end; at += 8 * THREADS) {
				const u64 o = r.offset + at;
				u64 w;

				if (aligned && at + 8 <= end)
					w = *(const u64 *)(base + at);
				else
					w = load_bytes(base + at,
						       end - at < 8 ? (unsigned)(end - at) : 8);
				a0 += checksum_term0(w, o);
				a1 += checksum_term1(w, o);
			}
		}
		for (int d = 16; d > 0; d /= 2) {
			a0 += __shfl_down_sync(0xffffffffu, a0, d);
			a1 += __shfl_down_sync(0xffffffffu, a1, d);
		}
		if ((threadIdx.x & 31) == 0) {
			part[0][threadIdx.x / 32] = a0;
			part[1][threadIdx.x / 32] = a1;
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			for (int i = 1; i < THREADS / 32; i++) {
				a0 += part[0][i];
				a1 += part[1][i];
			}
			atomicAdd(&out[2 * lo], a0);
			atomicAdd(&out[2 * lo + 1], a1);
		}
		__syncthreads();
	}
}
