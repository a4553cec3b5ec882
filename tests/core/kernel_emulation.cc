// SPDX-License-Identifier: MIT
//
// The checksum kernel's source (core/backends/kernels/checksum.cu) run on the CPU, so
// that CI, which has no GPU, checks its logic (tiles, the range search, tails
// and unaligned starts, the block reduction) against dormant_checksum(): the
// CUDA built-ins it uses are emulated below, a block's threads as std::threads
// (one block at a time, its __shared__ arrays then the block's), __syncthreads
// and warp shuffles as barriers. The GPU suite runs the real PTX
// (tests/core/test_verify.c, verify-cuda). Exit status 0 when every range
// agrees for every grid size tried.
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "dormant.h"

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static

namespace {
struct dim3 {
	unsigned x, y, z;
};
thread_local dim3 threadIdx;
dim3 blockIdx, gridDim;
std::barrier<> *block_barrier;
unsigned long long lanes[1024];

void __syncthreads()
{
	block_barrier->arrive_and_wait();
}

unsigned long long __shfl_down_sync(unsigned, unsigned long long v, int d)
{
	unsigned t = threadIdx.x;

	block_barrier->arrive_and_wait();
	lanes[t] = v;
	block_barrier->arrive_and_wait();
	unsigned long long r = (t & 31) + d < 32 ? lanes[t + d] : v;
	block_barrier->arrive_and_wait();
	return r;
}

unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
	return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
} // namespace

#include "checksum.cu"

namespace {
struct piece {
	size_t start, size, offset;
};

// Launch the kernel over ranges of buf, grid blocks, as cuLaunchKernel would.
void launch(const std::vector<range> &ranges, u64 tiles, unsigned grid,
	    std::vector<unsigned long long> &out)
{
	gridDim = { grid, 1, 1 };
	for (unsigned b = 0; b < grid; b++) {
		std::barrier<> barrier(THREADS);
		std::vector<std::thread> threads;

		blockIdx = { b, 0, 0 };
		block_barrier = &barrier;
		for (unsigned t = 0; t < THREADS; t++)
			threads.emplace_back([&, t] {
				threadIdx = { t, 0, 0 };
				dormant_checksum_kernel(ranges.data(), (unsigned)ranges.size(), tiles,
						 out.data());
			});
		for (auto &th : threads)
			th.join();
	}
}
} // namespace

int main()
{
	const size_t size = 3 << 20;
	std::vector<uint8_t> buf(size + 64);
	uint8_t *base = buf.data() + (64 - (uintptr_t)buf.data() % 64) % 64;
	// around words and tiles, unaligned starts, an empty range between two
	const piece pieces[] = {
		{ 0, TILE, 0 },	      { 0, TILE + 1, 3 },	 { 5, 200000, 5 },
		{ 8, 3 * TILE + 13, 99 }, { 0, 1, 0 },		 { 1, 7, 1 },
		{ 16, 2 * TILE, 16 },   { TILE + 5, (1 << 20) + 1, 7 }, { 0, 0, 0 },
		{ 3, 2 * TILE, 3 },
	};
	const size_t count = sizeof(pieces) / sizeof(pieces[0]);
	std::vector<range> ranges;
	u64 tiles = 0;
	int bad = 0;

	for (size_t i = 0; i < size; i++)
		base[i] = (uint8_t)((i * 2654435761u) >> 13);
	for (const piece &p : pieces) {
		ranges.push_back({ (u64)(uintptr_t)(base + p.start), p.size, p.offset, tiles });
		tiles += (p.size + TILE - 1) / TILE;
	}
	for (unsigned grid : { 1u, 3u, (unsigned)tiles }) {
		std::vector<unsigned long long> out(2 * count, 0);

		launch(ranges, tiles, grid, out);
		for (size_t i = 0; i < count; i++) {
			uint64_t want[2];

			dormant_checksum(base + pieces[i].start, pieces[i].size, pieces[i].offset, want);
			if (want[0] != out[2 * i] || want[1] != out[2 * i + 1]) {
				std::printf("grid %u: range %zu (%zu bytes at +%zu) differs\n", grid, i,
					    pieces[i].size, pieces[i].start);
				bad++;
			}
		}
	}
	std::printf("%s: %zu ranges, %llu tiles, grids 1, 3 and %llu\n",
		    bad ? "FAIL" : "ok", count, (unsigned long long)tiles, (unsigned long long)tiles);
	return bad ? 1 : 0;
}
