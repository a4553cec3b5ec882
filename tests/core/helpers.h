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

/* A manager for tests: mode, chunks of chunk_bytes, an 8 MiB staging ring
 * (2 MiB slots), 2 copy threads, a 5 s guard timeout. manager(): release
 * mode, 4 MiB chunks. */
struct dormant *manager_with(enum dormant_host_mode mode, size_t chunk_bytes);
/* A manager with options "name=value,..." (printf format; dormant_options_parse());
 * warmup=off unless they name a warmup option. */
struct dormant *manager_from(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
struct dormant *manager(void);

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
/* Every tag of m is in state (one expectation per tag). */
void expect_all(struct dormant *m, enum dormant_state state);
/* The process's resident set less its LazyFree pages (MADV_FREE, the
 * kernel's to take: the host backend's spare device memory), in bytes, from
 * /proc/self/smaps_rollup. */
long rss_bytes(void);
/* The process's LazyFree pages, in bytes (/proc/self/smaps_rollup). */
long lazyfree_bytes(void);
/* Host backend: each simulated device's used bytes are what the manager has
 * mapped (nothing leaked). CUDA: other users share the device; no check. */
void expect_no_device_leak(struct dormant *m);
/* Host copies in release mode are given back on a worker thread: wait up to
 * 10 s for stats' host_bytes to be want; returns the last value read (a copy
 * never given back then fails the caller's check). */
uint64_t host_bytes_settled(struct dormant *m, uint64_t want);
/* host_bytes once the last wake's unpins (host mode reclaimable) are done:
 * a host-mode switch to the same mode waits for them. */
uint64_t host_bytes_unpinned(struct dormant *m);

#endif
