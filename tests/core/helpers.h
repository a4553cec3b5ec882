/* SPDX-License-Identifier: MIT */
/* What the core test programs share: options set before a test, patterns
 * written to and checked in managed memory, stats. Public API only, so the
 * programs run on either backend. Failures abort the Criterion test. */
#ifndef DORMANT_TESTS_CORE_HELPERS_H
#define DORMANT_TESTS_CORE_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dormant.h"

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

/* Criterion .init functions: host copies pinned in 1 MiB pieces (a chunk
 * takes several copies), or, unpinned, through the staging ring. */
void pin_pieces_small(void);
void unpinned(void);

bool on_host(struct dormant *m);

/* The pattern of seed for the bytes [offset, offset + size) of a buffer
 * filled from its start: a slice of a filled buffer checks alone. */
void pattern_make(uint8_t *buf, size_t offset, size_t size, uint64_t seed);
/* Write the pattern of seed to [dev, dev + size). */
void fill(struct dormant *m, void *dev, size_t size, uint64_t seed);
/* True if [dev + offset, dev + offset + size) holds its slice of the pattern
 * of seed (seed 0: zeros). */
bool holds_at(struct dormant *m, const void *dev, size_t offset, size_t size, uint64_t seed);
bool holds(struct dormant *m, const void *dev, size_t size, uint64_t seed);

/* A snapshot of m's stats, in storage of the calling thread's own. */
struct dormant_stats *stats(struct dormant *m);
const struct dormant_tag_stats *tag_stats(const struct dormant_stats *s, const char *tag);

#endif
