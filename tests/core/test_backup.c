/* SPDX-License-Identifier: MIT */
/*
 * The host copy as callers see it (dormant.h, "Host copies"):
 * dormant_host_backup() and dormant_host_backup_read() while asleep and, in
 * retain mode, awake; live-bytes packing (marks, chunk boundaries, slabs);
 * dormant_set_host_mode() between transitions. Public API only: the same
 * executable runs on the host backend (suite unit) and the CUDA backend
 * (suite gpu).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dormant.h"
#include "helpers.h"

#define CHUNK (2 * MiB)

static void *alloc_keep(struct dormant *m, const char *tag, size_t size)
{
	void *p = NULL;

	cr_assert_eq(dormant_alloc(m, tag, size, &p), 0, "%s", dormant_last_error());
	return p;
}

static void sleep_ok(struct dormant *m)
{
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "sleep: %s", dormant_last_error());
}

static void wake_ok(struct dormant *m)
{
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "wake: %s", dormant_last_error());
}

/* host[0, size) is the pattern of seed at [offset, offset + size) */
static bool host_holds(const void *host, size_t offset, size_t size, uint64_t seed)
{
	uint8_t *want = malloc(offset + size);
	bool same;

	cr_assert(want);
	pattern_make(want, 0, offset + size, seed);
	same = memcmp(host, want + offset, size) == 0;
	free(want);
	return same;
}

/* The copy of [dev + offset, +size) read back equals the pattern there. */
static bool read_holds(struct dormant *m, const char *dev, size_t offset, size_t size,
		       uint64_t seed)
{
	uint8_t *buf = malloc(size);
	bool same;
	int r;

	cr_assert(buf);
	r = dormant_host_backup_read(m, dev + offset, size, buf);
	cr_assert_eq(r, 0, "read: %s", dormant_last_error());
	same = host_holds(buf, offset, size, seed);
	free(buf);
	return same;
}

Test(backup, asleep_the_copy_is_where_it_says_and_gone_after_the_wake)
{
	struct dormant *m = manager_with(DORMANT_HOST_RELEASE, CHUNK);
	char *w = alloc_keep(m, "w", CHUNK);
	void *host = NULL;

	fill(m, w, CHUNK, 21);
	cr_expect_eq(dormant_host_backup(m, w, 16, &host), -ENOENT, "awake, release mode");
	cr_expect_null(host);
	sleep_ok(m);
	cr_assert_eq(dormant_host_backup(m, w + 4096 + 3, 100000, &host), 0, "%s",
		     dormant_last_error());
	cr_expect(host_holds(host, 4096 + 3, 100000, 21));
	cr_expect(read_holds(m, w, 4096 + 3, 100000, 21));
	cr_expect(read_holds(m, w, 0, CHUNK, 21));
	wake_ok(m);
	cr_expect(holds(m, w, CHUNK, 21));
	cr_expect_eq(dormant_host_backup(m, w, 16, &host), -ENOENT, "woken: given back");
	cr_expect_eq(dormant_host_backup_read(m, w, 16, &host), -ENOENT);
	dormant_destroy(m);
}

Test(backup, bad_arguments_and_memory_without_a_copy)
{
	struct dormant *m = manager_with(DORMANT_HOST_RELEASE, CHUNK);
	char *w = alloc_keep(m, "w", CHUNK);
	void *g = NULL, *host = (void *)&host;
	char buf[16];
	int x;

	cr_assert_eq(dormant_alloc_policy(m, "w", DORMANT_DISCARD, CHUNK, 0, &g), 0);
	sleep_ok(m);
	cr_expect_eq(dormant_host_backup(m, g, 16, &host), -ENOENT, "discarded memory");
	cr_expect_eq(dormant_host_backup_read(m, g, 16, buf), -ENOENT);
	cr_expect_eq(dormant_host_backup(m, &x, 1, &host), -EINVAL, "not managed");
	cr_expect_eq(dormant_host_backup(m, w, 0, &host), -EINVAL, "no bytes");
	cr_expect_eq(dormant_host_backup(m, w + CHUNK - 8, 16, &host), -EINVAL, "past the end");
	cr_expect_eq(dormant_host_backup(NULL, w, 1, &host), -EINVAL);
	cr_expect_eq(dormant_host_backup(m, w, 1, NULL), -EINVAL);
	cr_expect_eq(dormant_host_backup_read(m, w, 16, NULL), -EINVAL);
	cr_expect_eq(host, (void *)&host, "untouched on failure");
	wake_ok(m);
	dormant_destroy(m);
}

Test(backup, packing_is_said_and_read_fills_what_was_left_out)
{
	struct dormant *m = manager_with(DORMANT_HOST_RELEASE, CHUNK);
	char *w = alloc_keep(m, "w", 2 * CHUNK);
	uint8_t *buf = malloc(2 * CHUNK);
	void *host = NULL;

	cr_assert(buf);
	fill(m, w, 2 * CHUNK, 5);
	cr_assert_eq(dormant_mark_unused(m, w + MiB, 256 * KiB), 0);
	sleep_ok(m);
	/* inside one run: one piece */
	cr_assert_eq(dormant_host_backup(m, w + MiB + 256 * KiB, 4096, &host), 0);
	cr_expect(host_holds(host, MiB + 256 * KiB, 4096, 5));
	cr_expect_eq(dormant_host_backup(m, w + MiB - 8, 64, &host), -ERANGE, "across a mark");
	cr_expect_eq(dormant_host_backup(m, w + CHUNK - 8, 64, &host), -ERANGE, "across chunks");
	cr_assert_eq(dormant_host_backup_read(m, w, 2 * CHUNK, buf), 0, "%s",
		     dormant_last_error());
	cr_expect(host_holds(buf, 0, MiB, 5));
	for (size_t i = 0; i < 256 * KiB; i++)
		if (buf[MiB + i] != 0) {
			cr_expect_eq(buf[MiB + i], 0, "marked byte %zu is not zero", i);
			break;
		}
	cr_expect(host_holds(buf + MiB + 256 * KiB, MiB + 256 * KiB, 2 * CHUNK - MiB - 256 * KiB,
			     5));
	cr_expect(read_holds(m, w, CHUNK - 8, 64, 5), "across chunks, read");
	wake_ok(m);
	cr_expect(holds_at(m, w, 0, MiB, 5) && holds_at(m, w, MiB, 256 * KiB, 0));
	free(buf);
	dormant_destroy(m);
}

Test(backup, sub_allocations_of_a_slab)
{
	struct dormant *m = manager_with(DORMANT_HOST_RELEASE, CHUNK);
	char *a = alloc_keep(m, "w", 5000), *b = alloc_keep(m, "w", 7000);
	void *host = NULL;

	fill(m, a, 5000, 12);
	fill(m, b, 7000, 13);
	sleep_ok(m);
	cr_assert_eq(dormant_host_backup(m, b, 7000, &host), 0, "%s", dormant_last_error());
	cr_expect(host_holds(host, 0, 7000, 13));
	cr_expect(read_holds(m, a, 0, 5000, 12));
	wake_ok(m);
	dormant_destroy(m);
}

Test(backup, retain_mode_keeps_the_copy_awake_and_a_switch_gives_it_back)
{
	struct dormant *m = manager_with(DORMANT_HOST_RETAIN, CHUNK);
	char *w = alloc_keep(m, "w", CHUNK);
	void *first = NULL, *host = NULL;

	fill(m, w, CHUNK, 31);
	sleep_ok(m);
	cr_assert_eq(dormant_host_backup(m, w, CHUNK, &first), 0, "%s", dormant_last_error());
	wake_ok(m);
	cr_assert_eq(dormant_host_backup(m, w, CHUNK, &host), 0, "awake, retained: %s",
		     dormant_last_error());
	cr_expect_eq(host, first, "the same buffer");
	cr_expect(host_holds(host, 0, CHUNK, 31));

	/* new data: the next sleep refreshes the same buffer */
	fill(m, w, CHUNK, 32);
	sleep_ok(m);
	cr_assert_eq(dormant_host_backup(m, w, CHUNK, &host), 0);
	cr_expect_eq(host, first);
	cr_expect(host_holds(host, 0, CHUNK, 32));
	wake_ok(m);

	/* switched to release: the kept copy serves until the next wake */
	cr_assert_eq(dormant_set_host_mode(m, DORMANT_HOST_RELEASE), 0);
	cr_expect_eq(dormant_host_mode(m), DORMANT_HOST_RELEASE);
	cr_assert_eq(dormant_host_backup(m, w, CHUNK, &host), 0);
	fill(m, w, CHUNK, 33);
	sleep_ok(m);
	cr_assert_eq(dormant_host_backup(m, w, CHUNK, &host), 0);
	cr_expect(host_holds(host, 0, CHUNK, 33));
	wake_ok(m);
	cr_expect(holds(m, w, CHUNK, 33));
	cr_expect_eq(dormant_host_backup(m, w, CHUNK, &host), -ENOENT);
	cr_expect_eq(host_bytes_settled(m, 0), 0, "given back after the release-mode wake");

	/* and back to retain */
	cr_assert_eq(dormant_set_host_mode(m, DORMANT_HOST_RETAIN), 0);
	sleep_ok(m);
	wake_ok(m);
	cr_expect_eq(dormant_host_backup(m, w, CHUNK, &host), 0, "retained again");
	cr_expect_eq(dormant_set_host_mode(m, DORMANT_HOST_DEFAULT), -EINVAL);
	cr_expect_eq(dormant_set_host_mode(m, (enum dormant_host_mode)7), -EINVAL);
	cr_expect_eq(dormant_host_mode(m), DORMANT_HOST_RETAIN);
	dormant_destroy(m);
}
