/* SPDX-License-Identifier: MIT */
/*
 * The chunk hash's one definition, word by word (hash.h says what it is):
 * the lane constants and each lane's term for a word, shared by the CPU
 * (hash.c's checksum_cpu()) and the device kernel (kernels/checksum.cu,
 * which also runs on the CPU in tests/core/kernel_emulation.cc). Includes
 * nothing, so that the kernel can include it: a file that defines
 * HASH_MIX_FN first (the kernel: __device__ __forceinline__) gets its
 * functions with those qualifiers and 64-bit words as unsigned long long.
 */
#ifndef DORMANT_HASH_MIX_H
#define DORMANT_HASH_MIX_H

#ifdef HASH_MIX_FN
typedef unsigned long long hash_u64;
#else
#include <stdint.h>
#define HASH_MIX_FN static inline
typedef uint64_t hash_u64;
#endif

/* Lane l's term of the word w at position o: mix_l(w ^ (o * P_l + S_l)). */
#define CHECKSUM_P0 0x9e3779b97f4a7c15ull
#define CHECKSUM_S0 0x243f6a8885a308d3ull
#define CHECKSUM_P1 0xc2b2ae3d27d4eb4full
#define CHECKSUM_S1 0x13198a2e03707344ull

/* Lane 0's finalizer: MurmurHash3's fmix64 (a bijection). */
HASH_MIX_FN hash_u64 checksum_mix0(hash_u64 x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return x;
}

/* Lane 1's finalizer: SplitMix64's (a bijection). */
HASH_MIX_FN hash_u64 checksum_mix1(hash_u64 x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 31;
	return x;
}

HASH_MIX_FN hash_u64 checksum_term0(hash_u64 w, hash_u64 o)
{
	return checksum_mix0(w ^ (o * CHECKSUM_P0 + CHECKSUM_S0));
}

HASH_MIX_FN hash_u64 checksum_term1(hash_u64 w, hash_u64 o)
{
	return checksum_mix1(w ^ (o * CHECKSUM_P1 + CHECKSUM_S1));
}

#endif
