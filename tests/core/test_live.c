/* SPDX-License-Identifier: MIT */
/*
 * Host memory down to the live state (issue 10): per-allocation policies,
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

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

/* ---- helpers ------------------------------------------------------------- */

static struct dormant *manager_with(enum dormant_host_mode mode, size_t chunk_bytes)
{
	struct dormant_options o = {
		.host_mode = mode,
		.chunk_bytes = chunk_bytes,
		.staging_bytes = 8 * MiB, /* 2 MiB slots: several pieces per chunk */
		.guard_timeout_ms = 5000,
		.copy_threads = 2,
	};
	struct dormant *m = NULL;
	int r = dormant_new(&o, &m);

	cr_assert_eq(r, 0, "dormant_new: %s", dormant_last_error());
	return m;
}

static struct dormant *manager(void)
{
	return manager_with(DORMANT_HOST_RELEASE, 4 * MiB);
}

/* Host copies pinned in 1 MiB pieces (a chunk takes several copies), or,
 * with DORMANT_PIN_HOST=0, through the staging ring in 2 MiB slots. */
static void pin_pieces_small(void)
{
	setenv("DORMANT_PIN_PIECE_BYTES", "1MiB", 1);
}

static void unpinned(void)
{
	setenv("DORMANT_PIN_HOST", "0", 1);
}

static bool on_host(struct dormant *m)
{
	return strcmp(dormant_backend_name(m), "host") == 0;
}

static void *alloc_as(struct dormant *m, const char *tag, int policy, size_t size)
{
	void *p = NULL;
	int r = dormant_alloc_policy(m, tag, policy, size, 0, &p);

	cr_assert_eq(r, 0, "alloc %zu under %s (policy %d): %s", size, tag, policy,
		     dormant_last_error());
	cr_assert_not_null(p);
	return p;
}

static uint64_t pattern_word(uint64_t seed, size_t i)
{
	uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 1;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The pattern of seed for the bytes [offset, offset + size) of a buffer
 * filled from its start: a slice of a filled buffer checks alone. */
static void pattern_make(uint8_t *buf, size_t offset, size_t size, uint64_t seed)
{
	for (size_t i = 0; i < size; i++) {
		size_t at = offset + i;
		uint64_t w = pattern_word(seed, at / 8);

		buf[i] = (uint8_t)(w >> (8 * (at % 8)));
	}
}

static void fill(struct dormant *m, void *dev, size_t size, uint64_t seed)
{
	uint8_t *buf = malloc(size);

	cr_assert_not_null(buf);
	pattern_make(buf, 0, size, seed);
	cr_assert_eq(dormant_copy_to_device(m, dev, buf, size), 0, "%s", dormant_last_error());
	free(buf);
}

/* True if [dev + offset, dev + offset + size) holds its slice of the pattern
 * of seed (seed 0: zeros). */
static bool holds_at(struct dormant *m, const void *dev, size_t offset, size_t size,
		     uint64_t seed)
{
	uint8_t *want = malloc(size), *got = malloc(size);
	bool same;

	cr_assert(want && got);
	if (seed)
		pattern_make(want, offset, size, seed);
	else
		memset(want, 0, size);
	cr_assert_eq(dormant_copy_to_host(m, got, (const char *)dev + offset, size), 0, "%s",
		     dormant_last_error());
	same = memcmp(want, got, size) == 0;
	free(want);
	free(got);
	return same;
}

static bool holds(struct dormant *m, const void *dev, size_t size, uint64_t seed)
{
	return holds_at(m, dev, 0, size, seed);
}

static struct dormant_stats *stats(struct dormant *m)
{
	static _Thread_local struct dormant_stats s;

	cr_assert_eq(dormant_stats_get(m, &s), 0, "%s", dormant_last_error());
	return &s;
}

static const struct dormant_tag_stats *tag_stats(const struct dormant_stats *s, const char *tag)
{
	for (size_t i = 0; i < s->tag_count; i++)
		if (strcmp(s->tags[i].tag, tag) == 0)
			return &s->tags[i];
	cr_assert_fail("no tag %s in stats", tag);
	return NULL;
}

static const struct dormant_tag_change *change_of(const struct dormant_report *r, const char *tag)
{
	for (size_t i = 0; i < r->tag_count; i++)
		if (strcmp(r->tags[i].tag, tag) == 0)
			return &r->tags[i];
	cr_assert_fail("no tag %s in report", tag);
	return NULL;
}

/* Host backend: the simulated device's used bytes equal what the manager
 * has mapped (nothing leaked). CUDA: other users share the device. */
static void expect_no_device_leak(struct dormant *m)
{
	struct dormant_stats *s = stats(m);

	if (!on_host(m))
		return;
	for (size_t i = 0; i < s->device_count; i++)
		cr_expect_eq(s->devices[i].total_bytes - s->devices[i].free_bytes,
			     s->devices[i].managed_bytes, "device %d leaks", s->devices[i].ordinal);
}

/* Host copies in release mode are given back on a worker thread. */
static uint64_t host_bytes_settled(struct dormant *m, uint64_t want)
{
	uint64_t got = 0;

	for (int i = 0; i < 1000; i++) {
		got = stats(m)->host_bytes;
		if (got == want)
			break;
		usleep(10000);
	}
	return got;
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
