/* SPDX-License-Identifier: MIT */
/*
 * Host memory down to the live state: per-allocation policies,
 * ranges marked unused, the rebuild policy. Public API only, so the same
 * executable runs on the host backend (suite unit) and on the CUDA backend
 * (suite gpu, DORMANT_BACKEND=cuda).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dormant.h"
#include "helpers.h"


/* ---- helpers ------------------------------------------------------------- */

static void *alloc_as(struct dormant *m, const char *tag, int policy, size_t size)
{
	void *p = NULL;
	int r = dormant_alloc_policy(m, tag, policy, size, 0, &p);

	cr_assert_eq(r, 0, "alloc %zu under %s (policy %d): %s", size, tag, policy,
		     dormant_last_error());
	cr_assert_not_null(p);
	return p;
}

static const struct dormant_tag_change *change_of(const struct dormant_report *r, const char *tag)
{
	for (size_t i = 0; i < r->tag_count; i++)
		if (strcmp(r->tags[i].tag, tag) == 0)
			return &r->tags[i];
	cr_assert_fail("no tag %s in report", tag);
	return NULL;
}

static void cycle(struct dormant *m, struct dormant_report *sleep_rep,
		  struct dormant_report *wake_rep)
{
	cr_assert_eq(dormant_sleep(m, NULL, sleep_rep), 0, "sleep: %s", dormant_last_error());
	cr_assert_eq(dormant_wake(m, NULL, wake_rep), 0, "wake: %s", dormant_last_error());
}

/* ---- per-allocation policies --------------------------------------------- */

Test(policy, one_tag_holds_kept_and_discarded_memory)
{
	struct dormant *m = manager();
	/* small ones share slabs; the 40 MiB ones have chunks of their own */
	size_t ks = 3 * MiB + 100, ds = 5 * MiB + 7, kb = 40 * MiB + 5, db = 36 * MiB;
	void *k = alloc_as(m, "mixed", DORMANT_POLICY_TAG, ks);
	void *d = alloc_as(m, "mixed", DORMANT_DISCARD, ds);
	void *K = alloc_as(m, "mixed", DORMANT_KEEP, kb);
	void *D = alloc_as(m, "mixed", DORMANT_DISCARD, db);
	struct dormant_report srep, wrep;
	const struct dormant_tag_change *c;

	fill(m, k, ks, 1);
	fill(m, d, ds, 2);
	fill(m, K, kb, 3);
	fill(m, D, db, 4);
	cr_assert_eq(dormant_sleep(m, NULL, &srep), 0, "%s", srep.error);
	c = change_of(&srep, "mixed");
	cr_expect_eq(c->policy, DORMANT_KEEP, "the tag's policy");
	cr_expect(c->bytes_copied >= ks + kb && c->bytes_copied < ks + kb + 512,
		  "only the kept allocations cross: %llu", (unsigned long long)c->bytes_copied);
	cr_expect_eq(srep.bytes_copied, c->bytes_copied);
	cr_expect_eq(stats(m)->device_bytes, 0, "both kinds are released");
	cr_expect_lt(tag_stats(stats(m), "mixed")->host_bytes, ks + kb + 2 * MiB,
		     "no host memory for the discarded ones");
	cr_assert_eq(dormant_wake(m, NULL, &wrep), 0, "%s", wrep.error);
	cr_expect_eq(change_of(&wrep, "mixed")->bytes_copied, c->bytes_copied);
	/* the discarded slab (6 MiB) and dedicated allocation (36 MiB) */
	cr_expect_eq(change_of(&wrep, "mixed")->bytes_zeroed, 6 * MiB + 36 * MiB);
	cr_expect(holds(m, k, ks, 1), "kept slab memory lost");
	cr_expect(holds(m, K, kb, 3), "kept dedicated memory lost");
	cr_expect(holds(m, d, ds, 0), "discarded slab memory not zero");
	cr_expect(holds(m, D, db, 0), "discarded dedicated memory not zero");
	cr_expect_eq(host_bytes_settled(m, 0), 0);
	expect_no_device_leak(m);
	dormant_destroy(m);
}

Test(policy, slabs_never_mix_policies)
{
	struct dormant *m = manager();
	enum { N = 30 };
	void *p[N];
	size_t size = 20 * KiB + 3;

	for (int i = 0; i < N; i++) {
		int policy = i % 3 == 0 ? DORMANT_DISCARD : i % 3 == 1 ? DORMANT_KEEP
								  : DORMANT_POLICY_TAG;

		p[i] = alloc_as(m, "t", policy, size);
		fill(m, p[i], size, 10 + i);
	}
	/* three slabs of 2 MiB: one per asked-for policy */
	cr_expect_eq(stats(m)->device_bytes, 3 * 2 * MiB);
	cr_assert_eq(dormant_set_policy(m, "t", DORMANT_DISCARD), 0);
	cycle(m, NULL, NULL);
	for (int i = 0; i < N; i++)
		cr_expect(holds(m, p[i], size, i % 3 == 1 ? 10 + i : 0), "allocation %d", i);
	dormant_destroy(m);
}

Test(policy, following_the_tag_follows_its_changes)
{
	struct dormant *m = manager();
	size_t size = 1 * MiB;
	void *follow = alloc_as(m, "t", DORMANT_POLICY_TAG, size);
	void *keep = alloc_as(m, "t", DORMANT_KEEP, size);
	void *discard = alloc_as(m, "t", DORMANT_DISCARD, size);
	void *big = alloc_as(m, "t", DORMANT_POLICY_TAG, 34 * MiB);
	void *plain = NULL;

	cr_assert_eq(dormant_alloc(m, "t", size, &plain), 0);
	for (int round = 0; round < 3; round++) {
		/* keep, discard, keep again */
		bool kept = round != 1;

		cr_assert_eq(dormant_set_policy(m, "t", kept ? DORMANT_KEEP : DORMANT_DISCARD), 0);
		fill(m, follow, size, 21);
		fill(m, keep, size, 22);
		fill(m, discard, size, 23);
		fill(m, big, 34 * MiB, 24);
		fill(m, plain, size, 25);
		cycle(m, NULL, NULL);
		cr_expect(holds(m, follow, size, kept ? 21 : 0), "round %d: follows the tag", round);
		cr_expect(holds(m, big, 34 * MiB, kept ? 24 : 0), "round %d: dedicated", round);
		cr_expect(holds(m, plain, size, kept ? 25 : 0), "round %d: dormant_alloc()", round);
		cr_expect(holds(m, keep, size, 22), "round %d: its own keep", round);
		cr_expect(holds(m, discard, size, 0), "round %d: its own discard", round);
	}
	expect_no_device_leak(m);
	dormant_destroy(m);
}

Test(policy, bad_policies_are_refused)
{
	struct dormant *m = manager();
	void *p = (void *)0x1;

	cr_expect_eq(dormant_alloc_policy(m, "t", 7, MiB, 0, &p), -EINVAL);
	cr_expect_neq(dormant_last_error()[0], '\0');
	cr_expect_eq(dormant_alloc_policy(m, "t", -2, MiB, 0, &p), -EINVAL);
	cr_expect_eq(p, (void *)0x1, "ret_ptr untouched on failure");
	cr_expect_eq(stats(m)->allocations, 0);
	cr_expect_eq(dormant_get_thread_policy(), DORMANT_POLICY_TAG, "the default");
	cr_expect_eq(dormant_set_thread_policy(9), -EINVAL);
	cr_expect_eq(dormant_get_thread_policy(), DORMANT_POLICY_TAG, "unchanged");
	cr_expect_eq(dormant_set_thread_policy(DORMANT_DISCARD), 0);
	cr_expect_eq(dormant_get_thread_policy(), DORMANT_DISCARD);
	dormant_destroy(m);
}

Test(policy, torch_allocations_take_the_thread_policy)
{
	struct dormant *m = manager();
	size_t size = 2 * MiB + 512;
	void *kept, *dropped;

	cr_assert_eq(dormant_torch_set_manager(m), 0);
	cr_assert_eq(dormant_set_thread_tag("model"), 0);
	kept = dormant_torch_malloc(size, 0, NULL);
	cr_assert_not_null(kept, "%s", dormant_last_error());
	cr_assert_eq(dormant_set_thread_policy(DORMANT_DISCARD), 0);
	dropped = dormant_torch_malloc(size, 0, NULL);
	cr_assert_not_null(dropped, "%s", dormant_last_error());
	cr_assert_eq(dormant_set_thread_policy(DORMANT_POLICY_TAG), 0);
	fill(m, kept, size, 31);
	fill(m, dropped, size, 32);
	cycle(m, NULL, NULL);
	cr_expect(holds(m, kept, size, 31));
	cr_expect(holds(m, dropped, size, 0), "the thread's discard policy");
	dormant_torch_free(kept, size, 0, NULL);
	dormant_torch_free(dropped, size, 0, NULL);
	cr_expect_eq(stats(m)->allocations, 0);
	dormant_torch_set_manager(NULL);
	dormant_destroy(m);
}

/* ---- ranges marked unused ------------------------------------------------ */

static void mark(struct dormant *m, void *base, size_t offset, size_t size)
{
	int r = dormant_mark_unused(m, (char *)base + offset, size);

	cr_assert_eq(r, 0, "mark [%zu, +%zu): %s", offset, size, dormant_last_error());
}

struct range {
	size_t offset, size;
};

/* [0, size) of dev holds the pattern of seed outside the sorted ranges,
 * zeros inside them. */
static void expect_marked_zero(struct dormant *m, void *dev, size_t size, uint64_t seed,
			       const struct range *marked, size_t count)
{
	size_t pos = 0;

	for (size_t i = 0; i <= count; i++) {
		size_t start = i < count ? marked[i].offset : size;

		if (start > pos)
			cr_expect(holds_at(m, dev, pos, start - pos, seed),
				  "kept bytes [%zu, %zu) lost", pos, start);
		if (i == count)
			break;
		cr_expect(holds_at(m, dev, marked[i].offset, marked[i].size, 0),
			  "marked bytes [%zu, +%zu) not zero after wake", marked[i].offset,
			  marked[i].size);
		pos = marked[i].offset + marked[i].size;
	}
}

/* A dedicated allocation of 11 chunks (4 MiB each, the last one 2 MiB):
 * marks inside one chunk, across two chunk boundaries, one whole chunk, a
 * single byte. */
static void marks_in_a_dedicated_allocation(enum dormant_host_mode mode)
{
	static const struct range marked[] = {
		{ 100, 4096 },                      /* inside chunk 0 */
		{ 3 * MiB + 100, 6 * MiB - 95 },    /* chunk 0 to 2 */
		{ 20 * MiB, 4 * MiB },              /* chunk 5, whole */
		{ 30 * MiB + 1, 1 },                /* one byte */
		{ 40 * MiB + 1, 4 },                /* the last chunk's data but one byte */
	};
	size_t size = 40 * MiB + 5, total = 0;
	struct dormant *m = manager_with(mode, 4 * MiB);
	void *w = alloc_as(m, "weights", DORMANT_POLICY_TAG, size);
	struct dormant_report srep, wrep;
	uint64_t host;

	fill(m, w, size, 41);
	for (size_t i = 0; i < sizeof(marked) / sizeof(marked[0]); i++) {
		mark(m, w, marked[i].offset, marked[i].size);
		total += marked[i].size;
	}
	/* marking again changes nothing */
	mark(m, w, marked[1].offset + 10, 20);
	cr_assert_eq(dormant_sleep(m, NULL, &srep), 0, "%s", srep.error);
	cr_expect_eq(srep.bytes_skipped, total, "skipped %llu, marked %zu",
		     (unsigned long long)srep.bytes_skipped, total);
	cr_expect_eq(change_of(&srep, "weights")->bytes_skipped, total);
	cr_expect_eq(srep.bytes_copied, size - total, "copied %llu",
		     (unsigned long long)srep.bytes_copied);
	cr_expect_eq(srep.bytes_released, 42 * MiB);
	host = tag_stats(stats(m), "weights")->host_bytes;
	/* exact-size host copies: the kept bytes, page-rounded per chunk */
	cr_expect(host >= size - total && host <= size - total + 11 * 4096,
		  "host bytes %llu for %zu kept", (unsigned long long)host, size - total);
	cr_expect_eq(stats(m)->last_sleep.bytes_skipped, total);
	cr_expect_eq(stats(m)->bytes_skipped_total, total);
	cr_assert_eq(dormant_wake(m, NULL, &wrep), 0, "%s", wrep.error);
	cr_expect_eq(wrep.bytes_copied, size - total);
	cr_expect_eq(wrep.bytes_zeroed, total, "the wake zero-fills what was skipped");
	cr_expect_eq(wrep.bytes_skipped, 0);
	expect_marked_zero(m, w, size, 41, marked, sizeof(marked) / sizeof(marked[0]));
	if (mode == DORMANT_HOST_RELEASE)
		cr_expect_eq(host_bytes_settled(m, 0), 0);
	expect_no_device_leak(m);
	dormant_destroy(m);
}

Test(marks, dedicated_allocation_pinned, .init = pin_pieces_small)
{
	marks_in_a_dedicated_allocation(DORMANT_HOST_RELEASE);
}

Test(marks, dedicated_allocation_retain, .init = pin_pieces_small)
{
	marks_in_a_dedicated_allocation(DORMANT_HOST_RETAIN);
}

Test(marks, dedicated_allocation_unpinned, .init = unpinned)
{
	marks_in_a_dedicated_allocation(DORMANT_HOST_RELEASE);
}

static size_t slab_round(size_t size)
{
	return (size + 511) / 512 * 512;
}

/* Sub-allocations in slabs of several 2 MiB chunks: marks inside one, at odd
 * offsets, across a chunk boundary, over a whole one; frees leave holes. */
static void marks_in_slabs(enum dormant_host_mode mode)
{
	enum { N = 40 };
	struct dormant *m = manager_with(mode, 2 * MiB);
	size_t size = 700 * KiB + 3, live = 0, marked_total = 0, crossings = 0;
	struct range marked[N][2];
	size_t marks[N] = { 0 };
	void *p[N];
	struct dormant_report srep, wrep;

	for (int i = 0; i < N; i++) {
		p[i] = alloc_as(m, "opt", DORMANT_POLICY_TAG, size);
		fill(m, p[i], size, 100 + i);
	}
	for (int i = 0; i < N; i++) {
		uintptr_t start = (uintptr_t)p[i], end = start + size;
		uintptr_t boundary = (end - 1) / (2 * MiB) * (2 * MiB);

		if (i % 5 == 4) { /* a hole of its own */
			cr_assert_eq(dormant_free(m, p[i]), 0);
			p[i] = NULL;
			continue;
		}
		live += slab_round(size);
		if (boundary > start) {
			/* across a chunk boundary */
			marked[i][0] = (struct range){ boundary - start - 1000, 3001 };
			crossings++;
		} else if (i % 3 == 0) {
			marked[i][0] = (struct range){ 0, size }; /* the whole of it */
		} else {
			marked[i][0] = (struct range){ 333, 70 * KiB + 1 };
		}
		marks[i] = 1;
		if (i % 2 && marked[i][0].offset + marked[i][0].size + 200 * KiB < size) {
			marked[i][1] = (struct range){ size - 100 * KiB - 7, 50 * KiB };
			marks[i] = 2;
		}
		for (size_t k = 0; k < marks[i]; k++) {
			mark(m, p[i], marked[i][k].offset, marked[i][k].size);
			marked_total += marked[i][k].size;
		}
	}
	cr_assert_gt(crossings, 3, "the test needs marks across chunk boundaries");
	cr_assert_eq(dormant_sleep(m, NULL, &srep), 0, "%s", srep.error);
	cr_expect_eq(srep.bytes_skipped, marked_total, "skipped %llu, marked %zu",
		     (unsigned long long)srep.bytes_skipped, marked_total);
	/* neither marked bytes nor the holes of freed ones are copied */
	cr_expect_eq(srep.bytes_copied, live - marked_total, "copied %llu, want %zu",
		     (unsigned long long)srep.bytes_copied, live - marked_total);
	cr_assert_eq(dormant_wake(m, NULL, &wrep), 0, "%s", wrep.error);
	for (int i = 0; i < N; i++)
		if (p[i])
			expect_marked_zero(m, p[i], size, 100 + i, marked[i], marks[i]);
	/* the marks are gone: the next cycle copies everything live */
	for (int i = 0; i < N; i++)
		if (p[i])
			fill(m, p[i], size, 200 + i);
	cycle(m, &srep, NULL);
	cr_expect_eq(srep.bytes_skipped, 0);
	cr_expect_eq(srep.bytes_copied, live);
	for (int i = 0; i < N; i++)
		if (p[i])
			cr_expect(holds(m, p[i], size, 200 + i), "allocation %d", i);
	expect_no_device_leak(m);
	dormant_destroy(m);
}

Test(marks, slabs_pinned, .init = pin_pieces_small)
{
	marks_in_slabs(DORMANT_HOST_RELEASE);
}

Test(marks, slabs_retain)
{
	marks_in_slabs(DORMANT_HOST_RETAIN);
}

Test(marks, slabs_unpinned, .init = unpinned)
{
	marks_in_slabs(DORMANT_HOST_RELEASE);
}

Test(marks, are_dropped_by_every_wake)
{
	struct dormant *m = manager();
	size_t size = 6 * MiB;
	void *a = alloc_as(m, "a", DORMANT_POLICY_TAG, size);
	void *b = alloc_as(m, "b", DORMANT_POLICY_TAG, size);
	const char *const only_b[] = { "b", NULL }, *const only_a[] = { "a", NULL };
	struct dormant_report rep;

	fill(m, a, size, 51);
	fill(m, b, size, 52);
	/* a wake that changes nothing drops them */
	mark(m, a, 0, MiB);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "%s", rep.error);
	cr_expect_eq(rep.bytes_skipped, 0, "a no-op wake drops the marks");
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	cr_expect(holds(m, a, size, 51));
	/* so does a wake of another tag */
	mark(m, a, 0, MiB);
	cr_assert_eq(dormant_sleep(m, only_b, NULL), 0);
	cr_assert_eq(dormant_wake(m, only_b, NULL), 0);
	cr_assert_eq(dormant_sleep(m, only_a, &rep), 0, "%s", rep.error);
	cr_expect_eq(rep.bytes_skipped, 0, "waking b drops the marks of awake a");
	cr_assert_eq(dormant_wake(m, only_a, NULL), 0);
	cr_expect(holds(m, a, size, 51));
	/* a sleep of another tag does not */
	mark(m, a, 0, MiB);
	cr_assert_eq(dormant_sleep(m, only_b, NULL), 0);
	cr_assert_eq(dormant_sleep(m, only_a, &rep), 0, "%s", rep.error);
	cr_expect_eq(rep.bytes_skipped, MiB);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	cr_expect(holds_at(m, a, 0, MiB, 0));
	cr_expect(holds_at(m, a, MiB, size - MiB, 51));
	cr_expect(holds(m, b, size, 52));
	/* and the cycle consumed them */
	fill(m, a, size, 53);
	cycle(m, &rep, NULL);
	cr_expect_eq(rep.bytes_skipped, 0);
	cr_expect(holds(m, a, size, 53));
	dormant_destroy(m);
}

Test(marks, a_failed_sleep_drops_them, .init = pin_pieces_small)
{
	struct dormant *m = manager();
	size_t size = 12 * MiB;
	void *w = alloc_as(m, "w", DORMANT_POLICY_TAG, size);
	static const struct range marked[] = { { 5 * MiB + 3, 2 * MiB } };
	struct dormant_report rep;

	fill(m, w, size, 61);
	mark(m, w, marked[0].offset, marked[0].size);
	cr_assert_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_COPY, 6, -EIO, false), 0);
	cr_assert_eq(dormant_sleep(m, NULL, &rep), -EIO);
	cr_expect(holds_at(m, w, 0, marked[0].offset, 61), "rolled back");
	cr_expect(holds_at(m, w, 7 * MiB + 3, 5 * MiB - 3, 61), "rolled back");
	/* training goes on after the failure and refills the marked bytes */
	fill(m, w, size, 62);
	cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "%s", rep.error);
	cr_expect_eq(rep.bytes_skipped, 0, "the retry copies what the failed sleep skipped");
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	cr_expect(holds(m, w, size, 62), "nothing refilled after the failure is lost");
	dormant_destroy(m);
}

Test(marks, a_free_drops_them)
{
	struct dormant *m = manager();
	size_t size = 300 * KiB;
	void *a = alloc_as(m, "t", DORMANT_POLICY_TAG, size), *b;
	void *keep = alloc_as(m, "t", DORMANT_POLICY_TAG, size);

	fill(m, keep, size, 71);
	mark(m, a, 0, size);
	cr_assert_eq(dormant_free(m, a), 0);
	b = alloc_as(m, "t", DORMANT_POLICY_TAG, size);
	cr_expect_eq(b, a, "first fit hands out the same range");
	fill(m, b, size, 72);
	cycle(m, NULL, NULL);
	cr_expect(holds(m, b, size, 72), "a new allocation does not inherit old marks");
	cr_expect(holds(m, keep, size, 71));
	dormant_destroy(m);
}

Test(marks, only_keep_memory_has_bytes_to_skip)
{
	struct dormant *m = manager();
	void *d = alloc_as(m, "t", DORMANT_DISCARD, 3 * MiB);
	struct dormant_report rep;

	mark(m, d, 0, MiB);
	cr_assert_eq(dormant_sleep(m, NULL, &rep), 0);
	cr_expect_eq(rep.bytes_skipped, 0);
	cr_expect_eq(rep.bytes_copied, 0);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	cr_expect(holds(m, d, 3 * MiB, 0));
	dormant_destroy(m);
}

Test(marks, host_memory_follows_the_kept_bytes_in_retain_mode)
{
	struct dormant *m = manager_with(DORMANT_HOST_RETAIN, 4 * MiB);
	size_t size = 40 * MiB;
	void *w = alloc_as(m, "w", DORMANT_POLICY_TAG, size);

	fill(m, w, size, 81);
	cycle(m, NULL, NULL);
	cr_expect_eq(stats(m)->host_bytes, size, "retained whole");
	for (size_t off = 0; off < size; off += 4 * MiB)
		mark(m, w, off + MiB, 3 * MiB); /* three quarters of each chunk */
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	cr_expect_eq(stats(m)->host_bytes, size / 4, "host copies shrink to the kept bytes");
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	for (size_t off = 0; off < size; off += 4 * MiB) {
		cr_expect(holds_at(m, w, off, MiB, 81));
		cr_expect(holds_at(m, w, off + MiB, 3 * MiB, 0));
	}
	/* the wake dropped the marks; a chunk marked whole now keeps no host
	 * copy at all, the others grow back */
	mark(m, w, 0, 4 * MiB);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	cr_expect_eq(host_bytes_settled(m, size - 4 * MiB), size - 4 * MiB);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	cr_expect(holds_at(m, w, 0, 4 * MiB, 0));
	cr_expect(holds_at(m, w, 4 * MiB, MiB, 81));
	dormant_destroy(m);
}

Test(marks, bad_ranges_are_refused)
{
	struct dormant *m = manager();
	void *a = alloc_as(m, "t", DORMANT_POLICY_TAG, 3 * MiB);
	void *b = alloc_as(m, "t", DORMANT_POLICY_TAG, 40 * MiB);
	char local[16];

	cr_expect_eq(dormant_mark_unused(m, local, sizeof(local)), -EINVAL);
	cr_expect_neq(dormant_last_error()[0], '\0');
	cr_expect_eq(dormant_mark_unused(m, NULL, 1), -EINVAL);
	cr_expect_eq(dormant_mark_unused(NULL, a, 1), -EINVAL);
	cr_expect_eq(dormant_mark_unused(m, (char *)a + 1, 3 * MiB), -EINVAL, "past its end");
	cr_expect_eq(dormant_mark_unused(m, (char *)b + 40 * MiB - 1, 2), -EINVAL);
	cr_expect_eq(dormant_mark_unused(m, (char *)b + 40 * MiB, 0), -EINVAL);
	cr_expect_eq(dormant_mark_unused(m, (char *)b + 5, SIZE_MAX), -EINVAL, "wraps");
	/* a slab's space past its sub-allocations belongs to none */
	cr_expect_eq(dormant_mark_unused(m, (char *)a + 3 * MiB, 512), -EINVAL);
	cr_expect_eq(dormant_mark_unused(m, a, 0), 0, "an empty range inside is fine");
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	cr_expect_eq(dormant_mark_unused(m, a, 1), -EBUSY, "asleep");
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	dormant_destroy(m);
}

/* ---- the rebuild policy -------------------------------------------------- */

/* "weights" (rebuild) is a copy of "master" (keep), as bf16 weights are of
 * the fp32 master params; "grads" is discarded. */
struct rebuild_scene {
	struct dormant *m;
	void *master, *weights, *grads, *own_keep;
	size_t size;
	int calls;        /* callback runs */
	int fail_next;    /* the next callbacks return this (0: succeed) */
	bool saw_zeros;   /* the weights were zero when it ran */
	bool saw_master;  /* the master params were restored when it ran */
	bool saw_own_keep; /* a keep allocation of the rebuild tag was restored */
	int sleep_result, alloc_result;
	char tag[DORMANT_TAG_MAX + 1];
};

static int rebuild_weights(struct dormant *m, const char *tag, void *userdata)
{
	struct rebuild_scene *s = userdata;
	uint8_t *buf = malloc(s->size);
	void *p = NULL;

	cr_assert_not_null(buf);
	s->calls++;
	snprintf(s->tag, sizeof(s->tag), "%s", tag);
	s->saw_zeros = holds(m, s->weights, s->size, 0);
	s->saw_master = holds(m, s->master, s->size, 91);
	s->saw_own_keep = !s->own_keep || holds(m, s->own_keep, MiB, 93);
	s->sleep_result = dormant_sleep(m, NULL, NULL);
	s->alloc_result = dormant_alloc(m, "weights", 4096, &p);
	if (s->fail_next) {
		free(buf);
		return s->fail_next;
	}
	cr_assert_eq(dormant_copy_to_host(m, buf, s->master, s->size), 0, "%s",
		     dormant_last_error());
	cr_assert_eq(dormant_copy_to_device(m, s->weights, buf, s->size), 0, "%s",
		     dormant_last_error());
	free(buf);
	return 0;
}

static void rebuild_scene_init(struct rebuild_scene *s, enum dormant_host_mode mode)
{
	memset(s, 0, sizeof(*s));
	s->m = manager_with(mode, 4 * MiB);
	s->size = 9 * MiB + 512;
	cr_assert_eq(dormant_set_policy(s->m, "weights", DORMANT_REBUILD), 0);
	cr_assert_eq(dormant_set_rebuild(s->m, "weights", rebuild_weights, s), 0);
	cr_assert_eq(dormant_set_policy(s->m, "grads", DORMANT_DISCARD), 0);
	s->master = alloc_as(s->m, "master", DORMANT_POLICY_TAG, s->size);
	s->weights = alloc_as(s->m, "weights", DORMANT_POLICY_TAG, s->size);
	s->grads = alloc_as(s->m, "grads", DORMANT_POLICY_TAG, 3 * MiB);
	fill(s->m, s->master, s->size, 91);
	fill(s->m, s->weights, s->size, 91);
	fill(s->m, s->grads, 3 * MiB, 92);
}

static void rebuild_scene_expect_intact(struct rebuild_scene *s)
{
	cr_expect(holds(s->m, s->master, s->size, 91), "master params lost");
	cr_expect(holds(s->m, s->weights, s->size, 91), "weights not rebuilt");
	cr_expect(holds(s->m, s->grads, 3 * MiB, 0), "grads not zero");
}

Test(rebuild, runs_once_after_the_kept_tags_are_back)
{
	static const char *const weights_first[] = { "weights", "grads", "master", NULL };
	struct rebuild_scene s;
	struct dormant_report srep, wrep;

	rebuild_scene_init(&s, DORMANT_HOST_RELEASE);
	cr_assert_eq(dormant_sleep(s.m, NULL, &srep), 0, "%s", srep.error);
	cr_expect_eq(change_of(&srep, "weights")->policy, DORMANT_REBUILD);
	cr_expect_eq(change_of(&srep, "weights")->bytes_copied, 0, "no host copy");
	cr_expect_eq(change_of(&srep, "weights")->bytes_released, 10 * MiB);
	cr_expect_eq(tag_stats(stats(s.m), "weights")->host_bytes, 0);
	cr_expect_eq(tag_stats(stats(s.m), "weights")->policy, DORMANT_REBUILD);
	cr_expect_eq(s.calls, 0, "a sleep runs no callback");
	/* named first: the callback still runs after master is restored */
	cr_assert_eq(dormant_wake(s.m, weights_first, &wrep), 0, "%s", wrep.error);
	cr_expect_eq(s.calls, 1);
	cr_expect_str_eq(s.tag, "weights");
	cr_expect(s.saw_zeros, "the rebuild tag is mapped and zero-filled for its callback");
	cr_expect(s.saw_master, "the kept tags are restored before the callback");
	cr_expect_eq(s.sleep_result, -EBUSY, "a callback cannot sleep");
	cr_expect_eq(s.alloc_result, -EBUSY, "nor allocate under a waking tag");
	cr_expect_eq(change_of(&wrep, "weights")->bytes_zeroed, 10 * MiB);
	rebuild_scene_expect_intact(&s);
	/* and again */
	cycle(s.m, NULL, NULL);
	cr_expect_eq(s.calls, 2);
	rebuild_scene_expect_intact(&s);
	cr_expect_eq(host_bytes_settled(s.m, 0), 0);
	expect_no_device_leak(s.m);
	dormant_destroy(s.m);
}

Test(rebuild, a_failing_callback_fails_the_wake_and_the_retry_works)
{
	static const struct range marked[] = { { 2 * MiB + 5, 3 * MiB } };
	struct rebuild_scene s;
	struct dormant_report rep;

	rebuild_scene_init(&s, DORMANT_HOST_RELEASE);
	mark(s.m, s.master, marked[0].offset, marked[0].size);
	cr_assert_eq(dormant_sleep(s.m, NULL, &rep), 0, "%s", rep.error);
	s.fail_next = -5;
	cr_assert_eq(dormant_wake(s.m, NULL, &rep), -ECANCELED);
	cr_expect(strstr(rep.error, "weights"), "the message names the tag: %s", rep.error);
	cr_expect(strstr(rep.error, "returned -5") &&
		  !strstr(strstr(rep.error, "returned -5") + 1, "returned -5"),
		  "the callback's failure said once: %s", rep.error);
	cr_expect_eq(s.calls, 1);
	for (size_t i = 0; i < 3; i++)
		cr_expect_eq(stats(s.m)->tags[i].state, DORMANT_ASLEEP, "tag %s",
			     stats(s.m)->tags[i].tag);
	cr_expect_eq(stats(s.m)->device_bytes, 0, "what the wake mapped is given back");
	cr_expect(tag_stats(stats(s.m), "master")->host_bytes >= s.size - marked[0].size &&
		  tag_stats(stats(s.m), "master")->host_bytes <= s.size - marked[0].size + 3 * 4096,
		  "the kept tag's host copy stays");
	cr_expect_eq(stats(s.m)->wakes_failed, 1);
	expect_no_device_leak(s.m);
	/* positive values fail it too */
	s.fail_next = 1;
	cr_assert_eq(dormant_wake(s.m, NULL, &rep), -ECANCELED);
	s.fail_next = 0;
	cr_assert_eq(dormant_wake(s.m, NULL, &rep), 0, "retry: %s", rep.error);
	cr_expect_eq(s.calls, 3);
	expect_marked_zero(s.m, s.master, s.size, 91, marked, 1);
	/* the callback copied the master with its zeroed range */
	expect_marked_zero(s.m, s.weights, s.size, 91, marked, 1);
	cr_expect(holds(s.m, s.grads, 3 * MiB, 0));
	cr_expect_eq(host_bytes_settled(s.m, 0), 0);
	expect_no_device_leak(s.m);
	dormant_destroy(s.m);
}

Test(rebuild, keep_allocations_of_a_rebuild_tag_are_restored_first)
{
	struct rebuild_scene s;

	rebuild_scene_init(&s, DORMANT_HOST_RETAIN);
	s.own_keep = alloc_as(s.m, "weights", DORMANT_KEEP, MiB);
	fill(s.m, s.own_keep, MiB, 93);
	cycle(s.m, NULL, NULL);
	cr_expect_eq(s.calls, 1);
	cr_expect(s.saw_own_keep, "restored before the callback");
	cr_expect(holds(s.m, s.own_keep, MiB, 93));
	rebuild_scene_expect_intact(&s);
	dormant_destroy(s.m);
}

Test(rebuild, without_a_callback_it_wakes_zero_filled)
{
	struct rebuild_scene s;

	rebuild_scene_init(&s, DORMANT_HOST_RELEASE);
	cr_assert_eq(dormant_set_rebuild(s.m, "weights", NULL, NULL), 0);
	cycle(s.m, NULL, NULL);
	cr_expect_eq(s.calls, 0);
	cr_expect(holds(s.m, s.weights, s.size, 0));
	cr_expect(holds(s.m, s.master, s.size, 91));
	dormant_destroy(s.m);
}

Test(rebuild, a_failed_sleep_rolls_back_with_the_rebuild_memory_intact,
     .init = pin_pieces_small)
{
	for (unsigned n = 1; n < 40; n++) {
		struct rebuild_scene s;
		int r;

		rebuild_scene_init(&s, DORMANT_HOST_RELEASE);
		dormant_debug_inject_fault(s.m, DORMANT_FAULT_COPY, n, -EIO, false);
		r = dormant_sleep(s.m, NULL, NULL);
		dormant_debug_inject_fault(s.m, DORMANT_FAULT_COPY, 0, 0, false);
		if (r == 0) {
			dormant_destroy(s.m);
			cr_expect_gt(n, 2, "the sleep made copies");
			break;
		}
		cr_expect_eq(r, -EIO);
		cr_expect_eq(s.calls, 0, "nothing to rebuild: never released");
		cr_expect(holds(s.m, s.weights, s.size, 91), "n %u: rebuild memory lost", n);
		cr_expect(holds(s.m, s.master, s.size, 91), "n %u: master lost", n);
		dormant_destroy(s.m);
	}
}

Test(rebuild, names_and_bad_input)
{
	struct dormant *m = manager();
	enum dormant_policy p = DORMANT_KEEP;
	void *ptr = NULL;

	cr_expect_str_eq(dormant_policy_name(DORMANT_REBUILD), "rebuild");
	cr_expect_eq(dormant_policy_from_name("rebuild", &p), 0);
	cr_expect_eq(p, DORMANT_REBUILD);
	cr_expect_eq(dormant_policy_from_name("rebuilt", &p), -EINVAL);
	cr_expect_null(dormant_policy_name((enum dormant_policy)(DORMANT_DISK + 1)));
	cr_expect_eq(dormant_set_policy(m, "w", DORMANT_REBUILD), 0);
	cr_expect_eq(dormant_alloc_policy(m, "w", DORMANT_REBUILD, MiB, 0, &ptr), -EINVAL,
		     "rebuild is a tag's policy only");
	cr_expect_eq(dormant_set_thread_policy(DORMANT_REBUILD), -EINVAL);
	cr_expect_eq(dormant_set_rebuild(m, "bad tag!", rebuild_weights, NULL), -EINVAL);
	cr_expect_eq(dormant_set_rebuild(NULL, "w", rebuild_weights, NULL), -EINVAL);
	cr_expect_eq(dormant_set_rebuild(m, "new", rebuild_weights, NULL), 0, "creates the tag");
	cr_expect_eq(tag_stats(stats(m), "new")->policy, DORMANT_KEEP, "not its policy");
	dormant_destroy(m);
}

/* ---- chaos, with marks, mixed policies and a rebuild tag ----------------- */

/*
 * "master" (keep) holds a slab allocation with a mark across a chunk
 * boundary and a discarded allocation of its own; "opt" (keep) a dedicated
 * allocation with two marks; "weights" (rebuild) is rebuilt from master;
 * "grads" is discarded.
 */
struct live_scene {
	struct dormant *m;
	void *master, *scratch, *opt, *weights, *grads;
	int calls;
};

static const size_t MASTER_SIZE = 5 * MiB + 512, OPT_SIZE = 34 * MiB + 100;
static const struct range master_marks[] = { { 3 * MiB + 1, 2 * MiB } };
/* the first covers chunks 1 to 4 whole (released with no copy), the second
 * crosses the boundary of chunks 6 and 7 */
static const struct range opt_marks[] = { { 3 * MiB, 18 * MiB }, { 24 * MiB + 11, 4 * MiB } };
static const size_t LIVE_MARKED = 2 * MiB + 18 * MiB + 4 * MiB;

static int rebuild_from_master(struct dormant *m, const char *tag, void *userdata)
{
	struct live_scene *s = userdata;
	uint8_t *buf = malloc(MASTER_SIZE);
	int r;

	(void)tag;
	s->calls++;
	if (!buf)
		return -ENOMEM;
	r = dormant_copy_to_host(m, buf, s->master, MASTER_SIZE);
	if (r == 0)
		r = dormant_copy_to_device(m, s->weights, buf, MASTER_SIZE);
	free(buf);
	return r;
}

static void live_scene_mark(struct live_scene *s)
{
	mark(s->m, s->master, master_marks[0].offset, master_marks[0].size);
	for (size_t i = 0; i < 2; i++)
		mark(s->m, s->opt, opt_marks[i].offset, opt_marks[i].size);
}

static void live_scene_init(struct live_scene *s, enum dormant_host_mode mode)
{
	memset(s, 0, sizeof(*s));
	s->m = manager_with(mode, 4 * MiB);
	cr_assert_eq(dormant_set_policy(s->m, "weights", DORMANT_REBUILD), 0);
	cr_assert_eq(dormant_set_rebuild(s->m, "weights", rebuild_from_master, s), 0);
	cr_assert_eq(dormant_set_policy(s->m, "grads", DORMANT_DISCARD), 0);
	s->master = alloc_as(s->m, "master", DORMANT_POLICY_TAG, MASTER_SIZE);
	s->scratch = alloc_as(s->m, "master", DORMANT_DISCARD, 2 * MiB);
	s->opt = alloc_as(s->m, "opt", DORMANT_KEEP, OPT_SIZE);
	s->weights = alloc_as(s->m, "weights", DORMANT_POLICY_TAG, MASTER_SIZE);
	s->grads = alloc_as(s->m, "grads", DORMANT_POLICY_TAG, 3 * MiB);
	fill(s->m, s->master, MASTER_SIZE, 301);
	fill(s->m, s->scratch, 2 * MiB, 302);
	fill(s->m, s->opt, OPT_SIZE, 303);
	fill(s->m, s->weights, MASTER_SIZE, 301);
	fill(s->m, s->grads, 3 * MiB, 304);
	live_scene_mark(s);
}

/* The bytes not marked hold their patterns (marked ones may be either). */
static void live_expect_unmarked_intact(struct live_scene *s)
{
	size_t pos = 0;

	cr_expect(holds_at(s->m, s->master, 0, master_marks[0].offset, 301), "master lost");
	pos = master_marks[0].offset + master_marks[0].size;
	cr_expect(holds_at(s->m, s->master, pos, MASTER_SIZE - pos, 301), "master lost");
	pos = 0;
	for (size_t i = 0; i < 2; i++) {
		cr_expect(holds_at(s->m, s->opt, pos, opt_marks[i].offset - pos, 303), "opt lost");
		pos = opt_marks[i].offset + opt_marks[i].size;
	}
	cr_expect(holds_at(s->m, s->opt, pos, OPT_SIZE - pos, 303), "opt lost");
}

/* After a complete cycle: marked bytes zero, the rest intact, weights
 * rebuilt from master, discarded memory zero. */
static void live_expect_cycled(struct live_scene *s)
{
	expect_marked_zero(s->m, s->master, MASTER_SIZE, 301, master_marks, 1);
	expect_marked_zero(s->m, s->opt, OPT_SIZE, 303, opt_marks, 2);
	expect_marked_zero(s->m, s->weights, MASTER_SIZE, 301, master_marks, 1);
	cr_expect(holds(s->m, s->scratch, 2 * MiB, 0), "discarded allocation of a kept tag");
	cr_expect(holds(s->m, s->grads, 3 * MiB, 0), "grads");
}

static const enum dormant_fault_op live_ops[] = {
	DORMANT_FAULT_CREATE, DORMANT_FAULT_MAP, DORMANT_FAULT_COPY, DORMANT_FAULT_HOST_ALLOC,
};

/* The nth create / map / copy / host allocation of a sleep fails, for every
 * n the sleep reaches: it rolls back with every kept byte and the rebuild
 * tag intact and its marks dropped, leaks nothing, and the next cycle
 * (marked anew) works. */
static void live_chaos_sleep(enum dormant_host_mode mode)
{
	struct dormant *anchor = manager(); /* keeps a CUDA context alive */

	for (size_t o = 0; o < sizeof(live_ops) / sizeof(live_ops[0]); o++) {
		int failures = 0;

		for (unsigned n = 1; n < 300; n++) {
			struct live_scene s;
			struct dormant_report rep;
			uint64_t device;
			int r;

			live_scene_init(&s, mode);
			device = stats(s.m)->device_bytes;
			cr_assert_eq(dormant_debug_inject_fault(s.m, live_ops[o], n, -EIO, false), 0);
			r = dormant_sleep(s.m, NULL, &rep);
			dormant_debug_inject_fault(s.m, live_ops[o], 0, 0, false);
			if (r == 0) {
				dormant_destroy(s.m);
				break;
			}
			failures++;
			cr_expect_eq(r, -EIO, "op %d, n %u: %s", live_ops[o], n, rep.error);
			expect_all(s.m, DORMANT_AWAKE);
			cr_expect(stats(s.m)->healthy);
			live_expect_unmarked_intact(&s);
			cr_expect(holds(s.m, s.weights, MASTER_SIZE, 301), "op %d, n %u: rebuild tag",
				  live_ops[o], n);
			cr_expect_eq(s.calls, 0);
			cr_expect_eq(stats(s.m)->device_bytes, device);
			expect_no_device_leak(s.m);
			/* the marks went with the failed sleep: mark anew */
			live_scene_mark(&s);
			cr_assert_eq(dormant_sleep(s.m, NULL, &rep), 0, "op %d, n %u: %s", live_ops[o],
				     n, rep.error);
			cr_expect_eq(rep.bytes_skipped, LIVE_MARKED, "op %d, n %u", live_ops[o], n);
			cr_assert_eq(dormant_wake(s.m, NULL, &rep), 0, "%s", rep.error);
			cr_expect_eq(s.calls, 1);
			live_expect_cycled(&s);
			if (mode == DORMANT_HOST_RELEASE)
				cr_expect_eq(host_bytes_settled(s.m, 0), 0, "host memory leaked");
			expect_no_device_leak(s.m);
			dormant_destroy(s.m);
		}
		if (live_ops[o] != DORMANT_FAULT_CREATE && live_ops[o] != DORMANT_FAULT_MAP)
			cr_expect_gt(failures, 0, "op %d never reached by a sleep", live_ops[o]);
	}
	dormant_destroy(anchor);
}

/* Pinned in 2 MiB pieces: the packed runs still cross pieces, with half
 * the copies (and fault points) of 1 MiB ones. */
static void pin_pieces_2mib(void)
{
	setenv("DORMANT_PIN_PIECE_BYTES", "2MiB", 1);
}

/* A first sleep is the same in both modes: release only. */
Test(chaos, live_sleep_release, .timeout = 600, .init = pin_pieces_2mib)
{
	live_chaos_sleep(DORMANT_HOST_RELEASE);
}

Test(chaos, live_sleep_unpinned, .timeout = 600, .init = unpinned)
{
	live_chaos_sleep(DORMANT_HOST_RELEASE);
}

/* The nth call of each op fails during a wake: every tag stays asleep with
 * the kept host copies, nothing stays mapped, the callback has not run, and
 * the same wake then works. */
static void live_chaos_wake(enum dormant_host_mode mode, int error)
{
	struct dormant *anchor = manager();

	for (size_t o = 0; o < sizeof(live_ops) / sizeof(live_ops[0]); o++) {
		int failures = 0;

		for (unsigned n = 1; n < 300; n++) {
			struct live_scene s;
			struct dormant_report rep;
			int r;

			live_scene_init(&s, mode);
			cr_assert_eq(dormant_sleep(s.m, NULL, &rep), 0, "%s", rep.error);
			dormant_debug_inject_fault(s.m, live_ops[o], n, error, false);
			r = dormant_wake(s.m, NULL, &rep);
			dormant_debug_inject_fault(s.m, live_ops[o], 0, 0, false);
			if (r == 0) {
				live_expect_cycled(&s);
				dormant_destroy(s.m);
				break;
			}
			failures++;
			cr_expect_eq(r, error, "op %d, n %u: %s", live_ops[o], n, rep.error);
			expect_all(s.m, DORMANT_ASLEEP);
			cr_expect_eq(s.calls, 0, "no callback before the kept tags are back");
			cr_expect_eq(stats(s.m)->device_bytes, 0, "a failed wake gives back its maps");
			cr_expect_geq(tag_stats(stats(s.m), "opt")->host_bytes, OPT_SIZE - 22 * MiB);
			cr_expect_geq(tag_stats(stats(s.m), "master")->host_bytes, MASTER_SIZE - 2 * MiB);
			cr_expect_eq(tag_stats(stats(s.m), "weights")->host_bytes, 0);
			expect_no_device_leak(s.m);
			cr_assert_eq(dormant_wake(s.m, NULL, &rep), 0, "retry: %s", rep.error);
			cr_expect_eq(s.calls, 1);
			live_expect_cycled(&s);
			dormant_destroy(s.m);
		}
		if (live_ops[o] != DORMANT_FAULT_HOST_ALLOC)
			cr_expect_gt(failures, 0, "op %d never reached by a wake", live_ops[o]);
	}
	dormant_destroy(anchor);
}

Test(chaos, live_wake_release, .timeout = 600, .init = pin_pieces_2mib)
{
	live_chaos_wake(DORMANT_HOST_RELEASE, -ENOMEM);
}

Test(chaos, live_wake_retain, .timeout = 600, .init = pin_pieces_2mib)
{
	live_chaos_wake(DORMANT_HOST_RETAIN, -EIO);
}

Test(chaos, live_wake_unpinned, .timeout = 600, .init = unpinned)
{
	live_chaos_wake(DORMANT_HOST_RELEASE, -ENOMEM);
}

/* Marks in reverse order, overlapping and repeated, add up to their union
 * (and cost no more than sorted ones: sorted once, when the sleep reads
 * them). */
Test(marks, in_any_order_add_up_to_their_union)
{
	enum { N = 2000 };
	struct dormant *m = manager();
	size_t size = 40 * MiB, stride = 20 * KiB, len = 8 * KiB;
	void *w = alloc_as(m, "w", DORMANT_POLICY_TAG, size);
	struct dormant_report rep;
	struct range *marked = calloc(N, sizeof(*marked));

	cr_assert_not_null(marked);
	fill(m, w, size, 401);
	for (int i = N - 1; i >= 0; i--) {
		marked[i] = (struct range){ (size_t)i * stride + 1, len };
		mark(m, w, marked[i].offset + len / 2, len / 2); /* the second half */
		mark(m, w, marked[i].offset, len / 4);           /* a first quarter */
		mark(m, w, marked[i].offset + len / 8, len / 2); /* overlapping both */
	}
	cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "%s", rep.error);
	cr_expect_eq(rep.bytes_skipped, (uint64_t)N * len);
	cr_expect_eq(rep.bytes_copied, size - (uint64_t)N * len);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	expect_marked_zero(m, w, size, 401, marked, N);
	free(marked);
	dormant_destroy(m);
}
