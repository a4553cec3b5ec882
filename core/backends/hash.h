/* SPDX-License-Identifier: MIT */
/*
 * Chunk checksums: a 128-bit hash (two 64-bit lanes) of what a sleep copies
 * of a chunk, computed on the device by our own kernel (kernels/checksum.cu,
 * loaded as PTX through the driver API) and by the CPU (checksum_cpu(), the
 * host backend and the engine), bit for bit the same: both take each word's
 * terms from hash_mix.h.
 *
 * The hash of a range of bytes that starts at byte `offset` of its chunk:
 * the range is read as 8-byte little-endian words, word j holding bytes
 * [8j, 8j + 8) of the range (a short last word padded with zero bytes); word
 * j sits at position o = offset + 8j, and each lane is the sum, modulo 2^64,
 * of mix_l(w ^ (o * P_l + S_l)) over the words, where mix_l is a bijective
 * 64-bit finalizer (lane 0: MurmurHash3's fmix64; lane 1: SplitMix64's).
 * A sum does not depend on the order its terms are added in, so the device
 * adds them in any order its threads and atomics finish and still gets the
 * CPU's bits. A chunk's hash is the lane-wise sum of the hashes of its plan's
 * runs (engine/extent.h), each run one range.
 *
 * What it guarantees (docs/design.md, "Checksums"): a change confined to one
 * 8-byte word always changes both lanes (mix_l is a bijection); any other
 * accidental change goes unnoticed with a probability of about 2^-128. It is
 * not a cryptographic hash: it catches corruption, not an adversary.
 */
#ifndef DORMANT_HASH_H
#define DORMANT_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "hash_mix.h"

#define CHECKSUM_LANES 2

struct checksum {
	uint64_t lane[CHECKSUM_LANES];
};

/* One range for a backend's checksum op. */
struct checksum_range {
	uintptr_t ptr;   /* device address of its first byte */
	uint64_t size;
	uint64_t offset; /* from its chunk's start: positions the words */
};

/* The hash of size bytes at p, the range starting at byte offset of its
 * chunk (on the CPU). */
struct checksum checksum_cpu(const void *p, size_t size, uint64_t offset);

/* Lane-wise sum: a chunk's hash from its runs' hashes. */
static inline void checksum_add(struct checksum *sum, const struct checksum *x)
{
	for (int l = 0; l < CHECKSUM_LANES; l++)
		sum->lane[l] += x->lane[l];
}

static inline int checksum_equal(const struct checksum *a, const struct checksum *b)
{
	return a->lane[0] == b->lane[0] && a->lane[1] == b->lane[1];
}

/* The embedded PTX of kernels/checksum.cu (NUL-terminated), and the name of
 * its kernel. */
extern const char dormant_checksum_ptx[];
#define CHECKSUM_KERNEL "dormant_checksum_kernel"
/* Threads per block and bytes per tile the kernel is written for. */
#define CHECKSUM_THREADS 256
#define CHECKSUM_TILE_BYTES (64 * 1024)

#endif
