/* SPDX-License-Identifier: MIT */
/*
 * Chunk checksums (issue 15): the hash itself (against a reference written
 * from its definition, and the backend's against the CPU's), verification
 * after wake with a corrupted host copy, and the unchanged chunks that
 * retain mode releases without a copy. Public API only: the same executable
 * runs on the host backend (suite unit) and on the CUDA backend (suite gpu,
 * DORMANT_BACKEND=cuda), where the hashes come from the PTX kernel.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dormant.h"
#include "helpers.h"

#define CHUNK (2 * MiB)

/* ---- the hash, from its definition (docs/design.md, "Checksums") ---------- */

static uint64_t ref_mix0(uint64_t x)
{
	x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdull;
	x = (x ^ (x >> 33)) * 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

static uint64_t ref_mix1(uint64_t x)
{
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* Byte by byte: word j is bytes [8j, 8j + 8) little-endian, zero-padded, at
 * position offset + 8j. */
static void ref_checksum(const uint8_t *p, size_t size, uint64_t offset, uint64_t out[2])
{
	out[0] = out[1] = 0;
	for (size_t j = 0; j * 8 < size; j++) {
		uint64_t w = 0, o = offset + 8 * j;

		for (size_t i = 0; i < 8 && 8 * j + i < size; i++)
			w |= (uint64_t)p[8 * j + i] << (8 * i);
		out[0] += ref_mix0(w ^ (o * 0x9e3779b97f4a7c15ull + 0x243f6a8885a308d3ull));
		out[1] += ref_mix1(w ^ (o * 0xc2b2ae3d27d4eb4full + 0x13198a2e03707344ull));
	}
}

Test(checksum, matches_its_definition_at_any_length_and_alignment)
{
	uint8_t buf[512 + 16];
	uint64_t got[2], want[2];

	pattern_make(buf, 0, sizeof(buf), 7);
	for (size_t misalign = 0; misalign < 9; misalign++)
		for (size_t len = 0; len <= 140; len++) {
			uint64_t offset = misalign * 4099 + len;

			ref_checksum(buf + misalign, len, offset, want);
			cr_assert_eq(dormant_checksum(buf + misalign, len, offset, got), 0);
			cr_assert(got[0] == want[0] && got[1] == want[1],
				  "length %zu at +%zu: %016llx%016llx, want %016llx%016llx", len,
				  misalign, (unsigned long long)got[0], (unsigned long long)got[1],
				  (unsigned long long)want[0], (unsigned long long)want[1]);
		}
	/* a fixed answer: the definition may not drift from the shipped PTX */
	cr_assert_eq(dormant_checksum("dormant", 7, 0, got), 0);
	ref_checksum((const uint8_t *)"dormant", 7, 0, want);
	cr_expect(got[0] == want[0] && got[1] == want[1]);
	cr_expect_eq(got[0], 0xd4fa3197e1830fb7ull, "lane 0 %016llx", (unsigned long long)got[0]);
	cr_expect_eq(got[1], 0xac0fa0613c8211bcull, "lane 1 %016llx", (unsigned long long)got[1]);
	cr_expect_eq(dormant_checksum(NULL, 1, 0, got), -EINVAL, "NULL with bytes");
}

Test(checksum, one_changed_byte_changes_both_lanes)
{
	uint8_t buf[4096];
	uint64_t a[2], b[2];

	pattern_make(buf, 0, sizeof(buf), 3);
	dormant_checksum(buf, sizeof(buf), 0, a);
	for (size_t at = 0; at < sizeof(buf); at += 97) {
		buf[at] ^= 0x10;
		dormant_checksum(buf, sizeof(buf), 0, b);
		buf[at] ^= 0x10;
		cr_expect(a[0] != b[0] && a[1] != b[1], "byte %zu", at);
	}
	/* the same bytes elsewhere in a chunk hash differently: words swapped */
	dormant_checksum(buf, sizeof(buf), 8, b);
	cr_expect(a[0] != b[0] && a[1] != b[1]);
}

/* The backend's hash of size bytes of device memory (filled with seed) at
 * each start and of each length, against the CPU's of the same bytes; the
 * range's offset in its chunk is start * mul + length. */
static void expect_device_matches_cpu(size_t size, uint64_t seed, const size_t *starts,
				      size_t nstarts, const size_t *lens, size_t nlens, size_t mul)
{
	struct dormant *m = manager();
	uint8_t *host = malloc(size);
	void *dev = NULL;

	cr_assert_not_null(host);
	cr_assert_eq(dormant_alloc(m, "w", size, &dev), 0, "%s", dormant_last_error());
	fill(m, dev, size, seed);
	pattern_make(host, 0, size, seed);
	for (size_t s = 0; s < nstarts; s++)
		for (size_t l = 0; l < nlens; l++) {
			uint64_t got[2], want[2], offset = starts[s] * mul + lens[l];

			cr_assert_eq(dormant_debug_checksum(m, (char *)dev + starts[s], lens[l],
							    offset, got),
				     0, "%s", dormant_last_error());
			dormant_checksum(host + starts[s], lens[l], offset, want);
			cr_expect(got[0] == want[0] && got[1] == want[1],
				  "%zu bytes at +%zu: device %016llx%016llx, cpu %016llx%016llx",
				  lens[l], starts[s], (unsigned long long)got[0],
				  (unsigned long long)got[1], (unsigned long long)want[0],
				  (unsigned long long)want[1]);
		}
	free(host);
	dormant_destroy(m);
}

/* The backend's hash (the PTX kernel on CUDA) of device memory against the
 * CPU's of the same bytes: lengths around words and tiles (64 KiB), starts
 * not aligned, several tiles. */
Test(checksum, device_matches_cpu)
{
	static const size_t starts[] = { 0, 1, 3, 8, 4096, 65535, 65536 + 5 };
	static const size_t lens[] = { 0, 1, 7, 8, 9, 63, 4096, 65535, 65536, 65537,
				       3 * 65536 + 13, MiB, 2 * MiB + 1 };

	expect_device_matches_cpu(3 * MiB, 11, starts, sizeof(starts) / sizeof(starts[0]), lens,
				  sizeof(lens) / sizeof(lens[0]), 3);
}

/* Large ranges: the simulated device hashes them in slices on several
 * threads (4 MiB and up); the sum of the slices is the CPU's hash of the
 * whole, whatever the start and the length. */
Test(checksum, device_matches_cpu_on_large_ranges)
{
	static const size_t starts[] = { 0, 3, 8, 4 * MiB + 1 };
	static const size_t lens[] = { 8 * MiB, 8 * MiB + 13, 12 * MiB + 5, 16 * MiB + 7 };

	expect_device_matches_cpu(21 * MiB, 12, starts, sizeof(starts) / sizeof(starts[0]), lens,
				  sizeof(lens) / sizeof(lens[0]), 5);
}

/* ---- verification after wake ------------------------------------------- */

static void *alloc_keep(struct dormant *m, const char *tag, size_t size)
{
	void *p = NULL;

	cr_assert_eq(dormant_alloc(m, tag, size, &p), 0, "%s", dormant_last_error());
	return p;
}

static void sleep_ok(struct dormant *m, struct dormant_report *rep)
{
	cr_assert_eq(dormant_sleep(m, NULL, rep), 0, "sleep: %s", dormant_last_error());
}

static void wake_ok(struct dormant *m, struct dormant_report *rep)
{
	cr_assert_eq(dormant_wake(m, NULL, rep), 0, "wake: %s", dormant_last_error());
}

Test(verify, every_restored_chunk_is_counted)
{
	struct dormant *m = manager_with(DORMANT_HOST_RELEASE, CHUNK);
	void *w = alloc_keep(m, "w", 3 * CHUNK);
	void *d = NULL;
	struct dormant_report srep, wrep;

	cr_assert_eq(dormant_alloc_policy(m, "g", DORMANT_DISCARD, CHUNK, 0, &d), 0);
	cr_expect(stats(m)->verify, "on by default");
	fill(m, w, 3 * CHUNK, 1);
	sleep_ok(m, &srep);
	wake_ok(m, &wrep);
	cr_expect_eq(wrep.chunks_verified, 3, "three kept chunks, the discarded one not");
	cr_expect_eq(wrep.chunk_mismatches, 0);
	for (size_t i = 0; i < wrep.tag_count; i++)
		cr_expect_eq(wrep.tags[i].chunks_verified,
			     strcmp(wrep.tags[i].tag, "w") == 0 ? 3 : 0, "%s", wrep.tags[i].tag);
	cr_expect_eq(stats(m)->chunks_verified_total, 3);
	cr_expect_eq(stats(m)->last_wake.chunks_verified, 3);
	cr_expect(holds(m, w, 3 * CHUNK, 1));
	dormant_destroy(m);
}

Test(verify, off_verifies_nothing)
{
	struct dormant *m = manager_with(DORMANT_HOST_RELEASE, CHUNK);
	void *w = alloc_keep(m, "w", 2 * CHUNK);
	struct dormant_report rep;

	cr_assert_eq(dormant_set_verify(m, false), 0);
	cr_expect(!stats(m)->verify);
	fill(m, w, 2 * CHUNK, 1);
	sleep_ok(m, &rep);
	cr_assert_eq(dormant_debug_corrupt_host(m, (char *)w + 5, 0x40), 0, "%s",
		     dormant_last_error());
	wake_ok(m, &rep);
	cr_expect_eq(rep.chunks_verified, 0);
	cr_expect_eq(stats(m)->chunks_verified_total, 0);
	cr_expect_eq(dormant_set_verify(NULL, true), -EINVAL);
	dormant_destroy(m);
}

static void verify_env_off(void)
{
	setenv("DORMANT_VERIFY", "0", 1);
}

Test(verify, env_turns_it_off, .init = verify_env_off)
{
	struct dormant *m = manager();

	cr_expect(!stats(m)->verify);
	dormant_destroy(m);
}

/* A flipped byte in a host copy between sleep and wake: the wake fails and
 * names the chunk, the tag stays asleep with its host copy, the retry after
 * fixing the byte restores everything exactly. */
static void corrupted_then_fixed(enum dormant_host_mode mode)
{
	struct dormant *m = manager_with(mode, CHUNK);
	void *w = alloc_keep(m, "w", 3 * CHUNK);
	char *bad = (char *)w + CHUNK + 12345; /* the second chunk */
	struct dormant_report rep;
	uint64_t host;

	fill(m, w, 3 * CHUNK, 2);
	sleep_ok(m, &rep);
	host = tag_stats(stats(m), "w")->host_bytes;
	cr_assert_eq(dormant_debug_corrupt_host(m, bad, 0x01), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_wake(m, NULL, &rep), -EIO, "wake: %s", dormant_last_error());
	cr_expect(strstr(rep.error, "checksum mismatch") && strstr(rep.error, "tag 'w'") &&
			  strstr(rep.error, "offset 2097152") &&
			  strstr(rep.error, "host copy changed"),
		  "%s", rep.error);
	cr_expect_eq(rep.chunk_mismatches, 1);
	cr_expect_eq(rep.chunks_verified, 2, "the other two chunks matched");
	cr_expect_eq(stats(m)->chunk_mismatches_total, 1);
	cr_expect_eq(stats(m)->last_wake.chunk_mismatches, 1);
	cr_expect_eq(stats(m)->wakes_failed, 1);
	expect_all(m, DORMANT_ASLEEP);
	cr_expect_eq(tag_stats(stats(m), "w")->host_bytes, host, "the host copy stays");
	cr_expect_eq(stats(m)->device_bytes, 0, "the failed wake gave its memory back");
	expect_no_device_leak(m);

	/* fixed: the same flip again */
	cr_assert_eq(dormant_debug_corrupt_host(m, bad, 0x01), 0);
	wake_ok(m, &rep);
	cr_expect_eq(rep.chunks_verified, 3);
	cr_expect_eq(rep.chunk_mismatches, 0);
	cr_expect(holds(m, w, 3 * CHUNK, 2), "the retry restores every byte");
	dormant_destroy(m);
}

Test(verify, corrupted_host_copy_fails_the_wake_and_the_fixed_retry_works)
{
	corrupted_then_fixed(DORMANT_HOST_RELEASE);
}

Test(verify, corrupted_host_copy_is_found_in_retain_mode_too)
{
	corrupted_then_fixed(DORMANT_HOST_RETAIN);
}

/* Discarding the check: a retry with verification off takes the host copy as
 * it is (one flipped byte), and the next sleep copies that chunk again. */
Test(verify, a_retry_without_verification_accepts_the_host_copy)
{
	struct dormant *m = manager_with(DORMANT_HOST_RETAIN, CHUNK);
	void *w = alloc_keep(m, "w", 2 * CHUNK);
	uint8_t *want = malloc(2 * CHUNK);
	struct dormant_report rep;
	size_t at = CHUNK - 1;

	cr_assert_not_null(want);
	pattern_make(want, 0, 2 * CHUNK, 4);
	fill(m, w, 2 * CHUNK, 4);
	sleep_ok(m, &rep);
	cr_assert_eq(dormant_debug_corrupt_host(m, (char *)w + at, 0xff), 0);
	cr_assert_eq(dormant_wake(m, NULL, &rep), -EIO);
	dormant_set_verify(m, false);
	wake_ok(m, &rep);
	want[at] ^= 0xff;
	cr_expect(holds_at(m, w, 0, at, 4) && holds_at(m, w, at + 1, 2 * CHUNK - at - 1, 4));
	{
		uint8_t got;

		cr_assert_eq(dormant_copy_to_host(m, &got, (char *)w + at, 1), 0);
		cr_expect_eq(got, want[at], "the flipped byte came back as the host copy had it");
	}
	dormant_set_verify(m, true);
	sleep_ok(m, &rep);
	cr_expect_eq(rep.bytes_copied, CHUNK, "the first chunk is not what was slept: copied");
	cr_expect_eq(rep.bytes_unchanged, CHUNK);
	wake_ok(m, &rep);
	cr_expect_eq(rep.chunks_verified, 2);
	free(want);
	dormant_destroy(m);
}

Test(verify, corrupt_host_refuses_bad_arguments)
{
	struct dormant *m = manager_with(DORMANT_HOST_RELEASE, CHUNK);
	void *w = alloc_keep(m, "w", CHUNK);
	struct dormant_report rep;
	int x;

	cr_expect_eq(dormant_debug_corrupt_host(m, w, 1), -EBUSY, "awake");
	cr_expect_eq(dormant_debug_corrupt_host(m, &x, 1), -EINVAL, "not managed");
	cr_expect_eq(dormant_debug_corrupt_host(m, w, 0), -EINVAL, "no bits");
	cr_assert_eq(dormant_mark_unused(m, (char *)w + MiB, MiB), 0);
	sleep_ok(m, &rep);
	cr_expect_eq(dormant_debug_corrupt_host(m, (char *)w + MiB + 5, 1), -ENOENT,
		     "marked bytes have no host copy");
	cr_expect_eq(dormant_debug_corrupt_host(m, w, 1), 0);
	cr_expect_eq(dormant_debug_corrupt_host(m, w, 1), 0);
	wake_ok(m, &rep);
	cr_expect_eq(rep.chunks_verified, 1);
	dormant_destroy(m);
}

/* ---- skip what did not change (retain mode) ------------------------------ */

Test(unchanged, chunks_that_did_not_change_are_not_copied)
{
	struct dormant *m = manager_with(DORMANT_HOST_RETAIN, CHUNK);
	void *w = alloc_keep(m, "w", 4 * CHUNK);
	char *third = (char *)w + 2 * CHUNK + 777;
	struct dormant_report rep;
	uint8_t byte;

	fill(m, w, 4 * CHUNK, 5);
	sleep_ok(m, &rep);
	cr_expect_eq(rep.bytes_copied, 4 * CHUNK, "the first sleep copies everything");
	cr_expect_eq(rep.bytes_unchanged, 0);
	wake_ok(m, &rep);

	sleep_ok(m, &rep);
	cr_expect_eq(rep.bytes_copied, 0, "nothing changed: nothing copied");
	cr_expect_eq(rep.bytes_unchanged, 4 * CHUNK);
	cr_expect_eq(rep.bytes_released, 4 * CHUNK);
	cr_expect_eq(rep.tags[0].bytes_unchanged, 4 * CHUNK);
	cr_expect_eq(stats(m)->device_bytes, 0);
	wake_ok(m, &rep);
	cr_expect_eq(rep.chunks_verified, 4);
	cr_expect(holds(m, w, 4 * CHUNK, 5));

	/* one byte of the third chunk changes: that chunk alone is copied */
	cr_assert_eq(dormant_copy_to_host(m, &byte, third, 1), 0);
	byte ^= 0x80;
	cr_assert_eq(dormant_copy_to_device(m, third, &byte, 1), 0);
	sleep_ok(m, &rep);
	cr_expect_eq(rep.bytes_copied, CHUNK, "copied %llu", (unsigned long long)rep.bytes_copied);
	cr_expect_eq(rep.bytes_unchanged, 3 * CHUNK);
	cr_expect_eq(stats(m)->bytes_unchanged_total, 7 * CHUNK);
	cr_expect_eq(stats(m)->last_sleep.bytes_unchanged, 3 * CHUNK);
	wake_ok(m, &rep);
	cr_expect_eq(rep.chunks_verified, 4);
	cr_expect(holds_at(m, w, 0, 2 * CHUNK + 777, 5));
	cr_expect(holds_at(m, w, 2 * CHUNK + 778, 2 * CHUNK - 778, 5));
	{
		uint8_t got;

		cr_assert_eq(dormant_copy_to_host(m, &got, third, 1), 0);
		cr_expect_eq(got, byte, "the changed byte came back");
	}
	dormant_destroy(m);
}

static void verify_off_env(void)
{
	setenv("DORMANT_VERIFY", "0", 1);
}

Test(unchanged, are_skipped_without_verification_too, .init = verify_off_env)
{
	struct dormant *m = manager_with(DORMANT_HOST_RETAIN, CHUNK);
	void *w = alloc_keep(m, "w", 2 * CHUNK);
	struct dormant_report rep;

	fill(m, w, 2 * CHUNK, 6);
	sleep_ok(m, &rep);
	wake_ok(m, &rep);
	cr_expect_eq(rep.chunks_verified, 0);
	sleep_ok(m, &rep);
	cr_expect_eq(rep.bytes_copied, 0);
	cr_expect_eq(rep.bytes_unchanged, 2 * CHUNK);
	wake_ok(m, &rep);
	cr_expect(holds(m, w, 2 * CHUNK, 6));
	dormant_destroy(m);
}

Test(unchanged, release_mode_copies_every_time)
{
	struct dormant *m = manager_with(DORMANT_HOST_RELEASE, CHUNK);
	void *w = alloc_keep(m, "w", 2 * CHUNK);
	struct dormant_report rep;

	fill(m, w, 2 * CHUNK, 6);
	for (int i = 0; i < 2; i++) {
		sleep_ok(m, &rep);
		cr_expect_eq(rep.bytes_copied, 2 * CHUNK);
		cr_expect_eq(rep.bytes_unchanged, 0);
		wake_ok(m, &rep);
	}
	dormant_destroy(m);
}

/* A chunk whose plan changed (a range marked unused) is copied again, even
 * when its bytes did not change; the marked range comes back zero. The next
 * sleep, unmarked, copies it whole again. */
Test(unchanged, a_changed_layout_is_copied)
{
	struct dormant *m = manager_with(DORMANT_HOST_RETAIN, CHUNK);
	void *w = alloc_keep(m, "w", 2 * CHUNK);
	struct dormant_report rep;

	fill(m, w, 2 * CHUNK, 8);
	sleep_ok(m, &rep);
	wake_ok(m, &rep);
	cr_assert_eq(dormant_mark_unused(m, (char *)w + CHUNK, MiB), 0);
	sleep_ok(m, &rep);
	cr_expect_eq(rep.bytes_copied, MiB, "the marked chunk's live half");
	cr_expect_eq(rep.bytes_unchanged, CHUNK);
	cr_expect_eq(rep.bytes_skipped, MiB);
	wake_ok(m, &rep);
	cr_expect(holds_at(m, w, 0, CHUNK, 8));
	cr_expect(holds_at(m, w, CHUNK, MiB, 0), "marked bytes come back zero");
	cr_expect(holds_at(m, w, CHUNK + MiB, MiB, 8));
	sleep_ok(m, &rep);
	cr_expect_eq(rep.bytes_copied, CHUNK, "unmarked again: a new layout");
	cr_expect_eq(rep.bytes_unchanged, CHUNK);
	wake_ok(m, &rep);
	cr_expect(holds_at(m, w, CHUNK, MiB, 0));
	dormant_destroy(m);
}

/* A chunk whose memory was discarded in between (policy discard for one
 * cycle) comes back zero: its old host copy must not count as current. */
Test(unchanged, a_discarded_cycle_forgets_the_host_copy)
{
	struct dormant *m = manager_with(DORMANT_HOST_RETAIN, CHUNK);
	void *w = alloc_keep(m, "w", CHUNK);
	struct dormant_report rep;

	fill(m, w, CHUNK, 9);
	sleep_ok(m, &rep);
	wake_ok(m, &rep);
	cr_assert_eq(dormant_set_policy(m, "w", DORMANT_DISCARD), 0);
	sleep_ok(m, &rep);
	wake_ok(m, &rep);
	cr_expect(holds(m, w, CHUNK, 0));
	cr_assert_eq(dormant_set_policy(m, "w", DORMANT_KEEP), 0);
	sleep_ok(m, &rep);
	cr_expect_eq(rep.bytes_copied, CHUNK, "zeros now: not the retained bytes");
	wake_ok(m, &rep);
	cr_expect(holds(m, w, CHUNK, 0));
	dormant_destroy(m);
}

/* A sleep that fails after unchanged chunks were released rolls back: they
 * come back from their retained host copies, exact. */
Test(unchanged, a_failed_sleep_restores_released_unchanged_chunks)
{
	struct dormant *m = manager_with(DORMANT_HOST_RETAIN, CHUNK);
	void *w = alloc_keep(m, "w", 3 * CHUNK);
	struct dormant_report rep;
	uint8_t byte = 0x5a;

	fill(m, w, 3 * CHUNK, 10);
	sleep_ok(m, &rep);
	wake_ok(m, &rep);
	cr_assert_eq(dormant_copy_to_device(m, (char *)w + 2 * CHUNK, &byte, 1), 0);
	cr_assert_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_COPY, 1, -EIO, false), 0);
	cr_assert_eq(dormant_sleep(m, NULL, &rep), -EIO, "%s", dormant_last_error());
	cr_assert_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_COPY, 0, 0, false), 0);
	expect_all(m, DORMANT_AWAKE);
	cr_expect(holds_at(m, w, 0, 2 * CHUNK, 10), "released unchanged chunks are back");
	cr_expect(holds_at(m, w, 2 * CHUNK + 1, CHUNK - 1, 10));
	sleep_ok(m, &rep);
	cr_expect_eq(rep.bytes_copied, CHUNK, "the retry copies the changed chunk");
	wake_ok(m, &rep);
	cr_expect(holds_at(m, w, 2 * CHUNK + 1, CHUNK - 1, 10));
	dormant_destroy(m);
}

static void skip_off_env(void)
{
	setenv("DORMANT_SKIP_UNCHANGED", "0", 1);
}

Test(unchanged, the_skip_can_be_turned_off, .init = skip_off_env)
{
	struct dormant *m = manager_with(DORMANT_HOST_RETAIN, CHUNK);
	void *w = alloc_keep(m, "w", 2 * CHUNK);
	struct dormant_report rep;

	fill(m, w, 2 * CHUNK, 6);
	for (int i = 0; i < 2; i++) {
		sleep_ok(m, &rep);
		cr_expect_eq(rep.bytes_copied, 2 * CHUNK);
		cr_expect_eq(rep.bytes_unchanged, 0);
		wake_ok(m, &rep);
		cr_expect_eq(rep.chunks_verified, 2, "still verified");
	}
	dormant_destroy(m);
}

/* Small allocations share a slab's chunks: a byte of one of them, corrupted
 * in the slab's host copy, fails the wake and names the slab's chunk. */
Test(verify, a_corrupted_sub_allocation_is_found)
{
	struct dormant *m = manager_with(DORMANT_HOST_RELEASE, CHUNK);
	char *a = alloc_keep(m, "w", 5000), *b = alloc_keep(m, "w", 7000);
	struct dormant_report rep;

	fill(m, a, 5000, 12);
	fill(m, b, 7000, 13);
	sleep_ok(m, &rep);
	cr_assert_eq(dormant_debug_corrupt_host(m, b + 6999, 0x02), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_wake(m, NULL, &rep), -EIO);
	cr_expect_eq(rep.chunk_mismatches, 1);
	cr_assert_eq(dormant_debug_corrupt_host(m, b + 6999, 0x02), 0);
	wake_ok(m, &rep);
	cr_expect(holds(m, a, 5000, 12) && holds(m, b, 7000, 13));
	dormant_destroy(m);
}

/* ---- the hash of a chunk runs after its copy ------------------------------ */

/* Chunks copied in several pieces (256 KiB pinned pieces, or the staging
 * ring), 40 of them: the wake hashes them in groups (64 MiB) while later
 * chunks still copy. With deferred streams (suite unit, verify-deferred) a
 * copy runs only once it is waited for, and a queued hash the moment the
 * work it waits for has run: a hash queued before its chunk's last piece,
 * or behind the wrong event, hashes stale bytes and fails the wake. */
static void small_pieces_env(void)
{
	setenv("DORMANT_PIN_PIECE_BYTES", "256KiB", 1);
}

static void staged_env(void)
{
	setenv("DORMANT_PIN_HOST", "0", 1);
}

static void many_chunks_verified(enum dormant_host_mode mode)
{
	struct dormant *m = manager_with(mode, CHUNK);
	size_t n = 40;
	char *w = alloc_keep(m, "w", n * CHUNK);
	struct dormant_report rep;

	cr_assert_eq(dormant_mark_unused(m, w + 5 * CHUNK + 4096, 8192), 0);
	fill(m, w, 5 * CHUNK + 4096, 14);
	fill(m, w + 5 * CHUNK + 4096 + 8192, n * CHUNK - 5 * CHUNK - 4096 - 8192, 15);
	for (int cycle = 0; cycle < 2; cycle++) {
		sleep_ok(m, &rep);
		wake_ok(m, &rep);
		cr_expect_eq(rep.chunk_mismatches, 0, "%s", rep.error);
		cr_expect_eq(rep.chunks_verified, n);
		cr_expect(holds(m, w, 5 * CHUNK + 4096, 14));
		cr_expect(holds_at(m, w, 5 * CHUNK + 4096, 8192, 0), "marked: zero");
		cr_expect(holds(m, w + 5 * CHUNK + 4096 + 8192,
				n * CHUNK - 5 * CHUNK - 4096 - 8192, 15));
	}
	/* a flipped byte in the last group, in its chunk's last piece */
	sleep_ok(m, &rep);
	cr_assert_eq(dormant_debug_corrupt_host(m, w + (n - 1) * CHUNK + CHUNK - 3, 0x04), 0);
	cr_assert_eq(dormant_wake(m, NULL, &rep), -EIO);
	cr_expect(strstr(rep.error, "offset 81788928"), "%s", rep.error);
	cr_expect_eq(rep.chunk_mismatches, 1);
	cr_expect_eq(rep.chunks_verified, n - 1);
	expect_all(m, DORMANT_ASLEEP);
	cr_assert_eq(dormant_debug_corrupt_host(m, w + (n - 1) * CHUNK + CHUNK - 3, 0x04), 0);
	wake_ok(m, &rep);
	cr_expect_eq(rep.chunks_verified, n);
	dormant_destroy(m);
}

Test(overlap, chunks_in_pieces_are_hashed_after_their_last_piece, .init = small_pieces_env)
{
	many_chunks_verified(DORMANT_HOST_RELEASE);
}

Test(overlap, staged_chunks_are_hashed_after_their_copy, .init = staged_env)
{
	many_chunks_verified(DORMANT_HOST_RETAIN);
}

/* ---- a device that cannot run the kernel ---------------------------------- */

static int kernel_warnings;

static void count_warning(enum dormant_log_level level, const char *message, void *userdata)
{
	(void)userdata;
	if (level == DORMANT_LOG_WARNING && strstr(message, "neither verified nor skipped"))
		__atomic_fetch_add(&kernel_warnings, 1, __ATOMIC_RELAXED);
}

static void no_kernel_env(void)
{
	setenv("DORMANT_HOST_CHECKSUM", "0", 1);
}

/* Sleeps and wakes go on unverified (and nothing is skipped), said once. */
Test(no_kernel, wakes_unverified_with_one_warning, .init = no_kernel_env)
{
	struct dormant_options *o = NULL;
	struct dormant *m = NULL;
	struct dormant_report rep;
	uint64_t sum[2];
	void *w;

	cr_assert_eq(dormant_options_new(&o), 0);
	cr_assert_eq(dormant_options_parse(o, "host_mode=retain,chunk_bytes=2MiB"), 0, "%s",
		     dormant_last_error());
	cr_assert_eq(dormant_options_set_log(o, count_warning, NULL), 0);
	cr_assert_eq(dormant_new(o, &m), 0, "%s", dormant_last_error());
	dormant_options_destroy(o);
	if (strcmp(dormant_backend_name(m), "host") != 0) {
		dormant_destroy(m);
		cr_skip_test("DORMANT_HOST_CHECKSUM is the host backend's");
	}
	w = alloc_keep(m, "w", 3 * CHUNK);
	fill(m, w, 3 * CHUNK, 16);
	cr_expect_eq(dormant_debug_checksum(m, w, 64, 0, sum), -ENOTSUP);
	for (int cycle = 0; cycle < 2; cycle++) {
		sleep_ok(m, &rep);
		cr_expect_eq(rep.bytes_unchanged, 0, "nothing vouches for unchanged bytes");
		cr_expect_eq(rep.bytes_copied, 3 * CHUNK);
		wake_ok(m, &rep);
		cr_expect_eq(rep.chunks_verified, 0);
		cr_expect(holds(m, w, 3 * CHUNK, 16));
	}
	cr_expect_eq(kernel_warnings, 1, "said once, not per transition: %d", kernel_warnings);
	dormant_destroy(m);
}
