/* SPDX-License-Identifier: MIT */
/*
 * The wake's copy kernel: host-to-device copies done by the SMs instead of
 * the copy engines. Right after another process frees device memory the
 * driver scrubs the freed frames on the copy engines, and a cuMemcpy shares
 * them (about half its rate for a second); the SMs and PCIe are idle, and
 * this kernel, reading the pinned host copy through its mapping, moves the
 * bytes at nearly the copy engines' full rate (docs/design.md, "A wake").
 *
 * Compiled to PTX (nvcc -ptx), shipped as core/kernels/copy.ptx and embedded
 * into libdormant like the checksum kernel: no CUDA runtime, no includes,
 * built-in device functions only.
 *
 * One launch copies size bytes from src to dst, any size and alignment: the
 * bytes before dst's first aligned word and after its last are copied one
 * byte per thread; the rest in words as wide as the two addresses allow
 * together (16 bytes when they agree modulo 16: the vectorized path every
 * chunk copy of ours takes; 8, 4, 2 or 1 otherwise), grid-stride, so that a
 * warp's loads are consecutive and any grid covers any size.
 */

#define COPY_THREADS 1024

typedef unsigned long long u64;

template <typename T>
__device__ __forceinline__ void copy_words(unsigned char *dst,
					   const unsigned char *src, u64 words,
					   u64 thread, u64 threads)
{
	T *d = (T *)dst;
	const T *s = (const T *)src;

	for (u64 i = thread; i < words; i += threads)
		d[i] = s[i];
}

extern "C" __global__ void __launch_bounds__(COPY_THREADS, 2)
dormant_copy_kernel(unsigned char *dst, const unsigned char *src,
		    u64 size)
{
	const u64 thread = (u64)blockIdx.x * blockDim.x + threadIdx.x;
	const u64 threads = (u64)gridDim.x * blockDim.x;
	/* the widest word both addresses can be aligned to at once */
	const unsigned apart = (unsigned)(((u64)dst ^ (u64)src) & 15);
	const unsigned width = apart == 0 ? 16 : apart & (0u - apart);
	u64 head = (width - ((u64)dst & (width - 1))) & (width - 1);

	if (head > size)
		head = size;
	const u64 words = (size - head) / width;
	const u64 tail = head + words * width;

	for (u64 i = thread; i < head; i += threads)
		dst[i] = src[i];
	for (u64 i = tail + thread; i < size; i += threads)
		dst[i] = src[i];
	switch (width) {
	case 16:
		copy_words<uint4>(dst + head, src + head, words, thread, threads);
		break;
	case 8:
		copy_words<u64>(dst + head, src + head, words, thread, threads);
		break;
	case 4:
		copy_words<unsigned>(dst + head, src + head, words, thread, threads);
		break;
	case 2:
		copy_words<unsigned short>(dst + head, src + head, words, thread, threads);
		break;
	default:
		copy_words<unsigned char>(dst + head, src + head, words, thread, threads);
		break;
	}
}
