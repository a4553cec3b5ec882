/* SPDX-License-Identifier: MIT */
/*
 * The manager's guarantees, through the public API only, so that the same
 * executable runs on the host backend (suite unit, in CI) and on the CUDA
 * backend (suite gpu, DORMANT_BACKEND=cuda on the GPU machine).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "dormant.h"
#include "helpers.h"


/* ---- helpers ------------------------------------------------------------- */

static void *alloc_tag(struct dormant *m, const char *tag, size_t size)
{
	void *p = NULL;
	int r = dormant_alloc(m, tag, size, &p);

	cr_assert_eq(r, 0, "alloc %zu under %s: %s", size, tag, dormant_last_error());
	cr_assert_not_null(p);
	return p;
}

static enum dormant_state state_of(struct dormant *m, const char *tag)
{
	return tag_stats(stats(m), tag)->state;
}

static const struct dormant_tag_change *change_of(const struct dormant_report *r, const char *tag)
{
	for (size_t i = 0; i < r->tag_count; i++)
		if (strcmp(r->tags[i].tag, tag) == 0)
			return &r->tags[i];
	cr_assert_fail("no tag %s in report", tag);
	return NULL;
}

static const char *const weights_only[] = { "weights", NULL };

/* ---- basics -------------------------------------------------------------- */

Test(basics, keep_is_restored_discard_is_zeroed)
{
	struct dormant *m = manager();
	size_t wsize = 9 * MiB + 100, gsize = 3 * MiB + 8;
	struct dormant_report rep;
	void *w, *g;

	cr_assert_eq(dormant_set_policy(m, "grads", DORMANT_DISCARD), 0);
	w = alloc_tag(m, "weights", wsize);
	g = alloc_tag(m, "grads", gsize);
	fill(m, w, wsize, 1);
	fill(m, g, gsize, 2);

	cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "%s", rep.error);
	cr_expect_eq(rep.result, 0);
	/* small allocations share slabs, 512-byte aligned: the copy ends at the
	 * last live byte, rounded up */
	cr_expect(rep.bytes_copied >= wsize && rep.bytes_copied < wsize + 512,
		  "only the kept bytes cross: %llu", (unsigned long long)rep.bytes_copied);
	cr_expect_eq(change_of(&rep, "grads")->bytes_copied, 0);
	cr_expect_eq(rep.bytes_released, 10 * MiB + 4 * MiB);
	cr_expect_eq(state_of(m, "weights"), DORMANT_ASLEEP);
	cr_expect_eq(stats(m)->device_bytes, 0);
	cr_expect_eq(tag_stats(stats(m), "grads")->host_bytes, 0, "discard costs no host memory");
	cr_expect_geq(tag_stats(stats(m), "weights")->host_bytes, wsize);

	cr_assert_eq(dormant_wake(m, NULL, &rep), 0, "%s", rep.error);
	cr_expect(rep.bytes_copied >= wsize && rep.bytes_copied < wsize + 512);
	cr_expect_eq(rep.bytes_zeroed, 4 * MiB);
	cr_expect_eq(rep.bytes_mapped, 14 * MiB);
	cr_expect(holds(m, w, wsize, 1), "kept bytes differ after wake");
	cr_expect(holds(m, g, gsize, 0), "discarded bytes are not zero after wake");
	cr_expect_eq(stats(m)->device_bytes, 14 * MiB);
	cr_expect_eq(host_bytes_settled(m, 0), 0, "release mode holds no host memory awake");
	expect_no_device_leak(m);
	dormant_destroy(m);
}

Test(basics, pointers_and_contents_survive_many_cycles)
{
	static const size_t sizes[] = { 1, 4096, 2 * MiB, 2 * MiB + 1, 5 * MiB + 333, 12 * MiB };
	struct dormant *m = manager_with(DORMANT_HOST_RETAIN, 4 * MiB);
	void *ptrs[6];

	for (size_t i = 0; i < 6; i++) {
		ptrs[i] = alloc_tag(m, i % 2 ? "optimizer" : "weights", sizes[i]);
		fill(m, ptrs[i], sizes[i], 100 + i);
	}
	for (int cycle = 0; cycle < 20; cycle++) {
		cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "cycle %d: %s", cycle,
			     dormant_last_error());
		cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "cycle %d: %s", cycle,
			     dormant_last_error());
		for (size_t i = 0; i < 6; i++)
			cr_assert(holds(m, ptrs[i], sizes[i], 100 + i), "cycle %d, allocation %zu",
				  cycle, i);
		/* change the contents so each cycle proves a fresh copy */
		fill(m, ptrs[cycle % 6], sizes[cycle % 6], 100 + cycle % 6);
	}
	cr_expect_eq(tag_stats(stats(m), "weights")->sleeps, 20);
	cr_expect_eq(tag_stats(stats(m), "weights")->wakes, 20);
	dormant_destroy(m);
}

Test(basics, unpinned_copies_go_through_the_staging_ring, .init = unpinned)
{
	struct dormant *m = manager();
	size_t size = 11 * MiB + 3;
	void *w = alloc_tag(m, "weights", size);

	fill(m, w, size, 31);
	for (int cycle = 0; cycle < 3; cycle++) {
		cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
		cr_expect_gt(stats(m)->staging_bytes, 0, "the staging ring is in use");
		cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
		cr_assert(holds(m, w, size, 31), "cycle %d", cycle);
	}
	dormant_destroy(m);
}

Test(basics, pinned_copies_need_no_staging_ring, .init = pin_pieces_small)
{
	struct dormant *m = manager();
	size_t size = 11 * MiB + 3;
	void *w = alloc_tag(m, "weights", size);

	fill(m, w, size, 32);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_expect_eq(stats(m)->staging_bytes, 0);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_expect(holds(m, w, size, 32));
	dormant_destroy(m);
}

Test(basics, retain_keeps_host_buffers_release_gives_them_back)
{
	for (int mode = DORMANT_HOST_RETAIN; mode <= DORMANT_HOST_RELEASE; mode++) {
		struct dormant *m = manager_with(mode, 4 * MiB);
		void *w = alloc_tag(m, "weights", 6 * MiB);

		fill(m, w, 6 * MiB, 7);
		cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
		cr_expect_geq(stats(m)->host_bytes, 6 * MiB);
		cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
		if (mode == DORMANT_HOST_RETAIN)
			cr_expect_geq(stats(m)->host_bytes, 6 * MiB, "retain keeps its buffers");
		else
			cr_expect_eq(host_bytes_settled(m, 0), 0, "release gives them back");
		cr_expect(holds(m, w, 6 * MiB, 7));
		cr_expect_eq((int)dormant_host_mode(m), mode);
		dormant_destroy(m);
	}
}

/* Host mode reclaimable: the host buffers stay mapped but not held while
 * awake, the next sleep reuses them, and pages the kernel took in between
 * (here: dropped by hand, as MADV_FREE lets it) cost nothing but a fault. */
Test(basics, reclaimable_reuses_its_buffers_and_survives_reclamation)
{
	struct dormant *m = manager_with(DORMANT_HOST_RECLAIMABLE, 4 * MiB);
	void *w = alloc_tag(m, "weights", 6 * MiB);
	void *first = NULL, *again = NULL;

	cr_expect_eq(dormant_host_mode(m), DORMANT_HOST_RECLAIMABLE);
	fill(m, w, 6 * MiB, 11);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_expect_geq(stats(m)->host_bytes, 6 * MiB);
	cr_assert_eq(dormant_host_backup(m, w, MiB, &first), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_expect(holds(m, w, 6 * MiB, 11));
	cr_expect_eq(host_bytes_settled(m, 0), 0, "a reclaimable buffer is not held");

	fill(m, w, 6 * MiB, 12);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_expect_geq(stats(m)->host_bytes, 6 * MiB, "counted again once reused");
	cr_assert_eq(dormant_host_backup(m, w, MiB, &again), 0, "%s", dormant_last_error());
	cr_expect_eq(again, first, "the next sleep reuses the buffer");
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_expect(holds(m, w, 6 * MiB, 12));

	/* the kernel takes the first chunk's buffer: its pages read zero */
	cr_assert_eq((uintptr_t)first % 4096, 0);
	cr_assert_eq(madvise(first, 4 * MiB, MADV_DONTNEED), 0);
	fill(m, w, 6 * MiB, 13);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_expect(holds(m, w, 6 * MiB, 13));
	dormant_destroy(m);
	cr_expect_str_eq(dormant_host_mode_name(DORMANT_HOST_RECLAIMABLE), "reclaimable");
}

/* reclaimable_pinned_bytes: a wake leaves host copies pinned (held, as in
 * retain mode) while their bytes fit, the rest reclaimable; the next sleep
 * copies into the same buffers; a freed allocation's room goes to others. */
Test(basics, reclaimable_keeps_copies_pinned_up_to_its_budget)
{
	struct dormant *m = manager_from("host_mode=reclaimable,chunk_bytes=4MiB,staging_bytes=8MiB,"
					 "copy_threads=2,reclaimable_pinned_bytes=9MiB");
	void *a = alloc_tag(m, "weights", 12 * MiB), *b, *first = NULL, *again = NULL;

	fill(m, a, 12 * MiB, 21);
	for (int cycle = 0; cycle < 2; cycle++) {
		cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
		cr_assert_eq(dormant_host_backup(m, a, MiB, cycle ? &again : &first), 0, "%s",
			     dormant_last_error());
		cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
		cr_expect(holds(m, a, 12 * MiB, 21 + cycle));
		/* two of the three 4 MiB copies fit in 9 MiB */
		cr_expect_eq(host_bytes_unpinned(m), 8 * MiB, "cycle %d: pinned while awake", cycle);
		fill(m, a, 12 * MiB, 22 + cycle);
	}
	cr_expect_eq(again, first, "the next sleep copies into the same buffer");

	/* freed: its room goes to the next allocation's copies */
	cr_assert_eq(dormant_free(m, a), 0, "%s", dormant_last_error());
	b = alloc_tag(m, "weights", 8 * MiB);
	fill(m, b, 8 * MiB, 31);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_expect(holds(m, b, 8 * MiB, 31));
	cr_expect_eq(host_bytes_unpinned(m), 8 * MiB, "the freed copies' room was given back");
	dormant_destroy(m);
}

Test(basics, memory_is_really_released)
{
	struct dormant *m = manager();
	size_t size = 64 * MiB;
	struct dormant_stats *s;
	uint64_t free_awake, free_asleep, managed;
	void *w, *g;

	dormant_set_policy(m, "grads", DORMANT_DISCARD);
	w = alloc_tag(m, "weights", size);
	g = alloc_tag(m, "grads", size);
	fill(m, w, size, 3);
	fill(m, g, size, 4);
	/* a first cycle sets up the manager's own streams and events */
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	fill(m, w, size, 3);
	s = stats(m);
	cr_assert_geq(s->device_count, 1);
	free_awake = s->devices[0].free_bytes;
	managed = s->devices[0].managed_bytes;
	cr_expect_eq(managed, 2 * size);

	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	s = stats(m);
	free_asleep = s->devices[0].free_bytes;
	cr_expect_eq(s->devices[0].managed_bytes, 0);
	/* At least 99.9% of the managed bytes show as free on the device. */
	cr_expect_geq((double)(free_asleep - free_awake), 0.999 * (double)managed,
		      "free went from %llu to %llu, managed %llu", (unsigned long long)free_awake,
		      (unsigned long long)free_asleep, (unsigned long long)managed);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_expect(holds(m, w, size, 3));
	dormant_destroy(m);
}

Test(basics, host_backend_returns_pages_to_the_os)
{
	struct dormant *m = manager();
	size_t size = 128 * MiB;
	long awake, asleep;
	void *w;

	if (!on_host(m)) {
		dormant_destroy(m);
		cr_skip_test("the RSS check is for the host backend");
	}

	dormant_set_policy(m, "grads", DORMANT_DISCARD);
	w = alloc_tag(m, "grads", size);
	fill(m, w, size, 8); /* every page in use */
	awake = rss_bytes();
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	asleep = rss_bytes();
	cr_expect_geq(awake - asleep, (long)(size * 9 / 10), "RSS %ld -> %ld", awake, asleep);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	/* Wake maps the pages again: counted as device memory at once, and
	 * resident once used (a zero-filled page costs nothing until then). */
	cr_expect_eq(stats(m)->devices[0].managed_bytes, size);
	fill(m, w, size, 9);
	cr_expect_geq(rss_bytes() - asleep, (long)(size * 9 / 10), "wake maps the pages again");
	dormant_destroy(m);
}

/* The simulated device keeps the pages a sleep unmapped, as LazyFree, and
 * the wake maps them again instead of fresh ones (on a VM whose balloon
 * takes freed pages, fresh ones cost seconds per GiB). */
Test(basics, host_backend_keeps_unmapped_pages_for_the_next_map)
{
	struct dormant *m = manager();
	size_t size = 64 * MiB;
	long before, asleep;
	void *w;

	if (!on_host(m)) {
		dormant_destroy(m);
		cr_skip_test("the simulated device's spare memory is the host backend's");
	}
	w = alloc_tag(m, "weights", size);
	fill(m, w, size, 5);
	before = lazyfree_bytes();
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	asleep = lazyfree_bytes();
	cr_expect_geq(asleep - before, (long)(size * 9 / 10), "LazyFree %ld -> %ld asleep", before,
		      asleep);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_expect_geq(asleep - lazyfree_bytes(), (long)(size * 9 / 10),
		      "LazyFree %ld asleep, %ld awake: the wake took the spare pages", asleep,
		      lazyfree_bytes());
	cr_expect(holds(m, w, size, 5));
	dormant_destroy(m);
}

/* A size the device cannot hold fails at once (not one chunk created),
 * naming the size asked for, whether the device is too small or has too
 * little free (another process holds some of it). */
Test(basics, an_allocation_that_cannot_fit_fails_at_once)
{
	struct dormant *m = manager();
	uint64_t creates = dormant_debug_op_count(m, DORMANT_FAULT_CREATE), free_bytes;
	void *p = NULL;

	cr_expect_eq(dormant_alloc(m, "weights", 1ull << 50, &p), -ENOMEM);
	cr_expect(strstr(dormant_last_error(), "allocating 1125899906842624 bytes") &&
			  strstr(dormant_last_error(), "1 PiB is more than device 0 holds"),
		  "%s", dormant_last_error());
	cr_assert_eq(dormant_debug_occupy(m, 0, 256 * MiB), 0, "%s", dormant_last_error());
	free_bytes = stats(m)->devices[0].free_bytes;
	cr_expect_eq(dormant_alloc(m, "weights", free_bytes + 64 * MiB, &p), -ENOMEM);
	cr_expect(strstr(dormant_last_error(), "is more than device 0 has free"), "%s",
		  dormant_last_error());
	cr_expect_null(p);
	cr_expect_eq(dormant_debug_op_count(m, DORMANT_FAULT_CREATE), creates,
		     "chunks were created for allocations that could not fit");
	cr_expect_eq(stats(m)->device_bytes, 0);
	cr_assert_eq(dormant_debug_occupy(m, 0, 0), 0);
	dormant_destroy(m);
}

Test(basics, some_tags_only)
{
	struct dormant *m = manager();
	struct dormant_report rep;
	void *w = alloc_tag(m, "weights", 3 * MiB);
	void *k = alloc_tag(m, "kv", 3 * MiB);

	fill(m, w, 3 * MiB, 5);
	fill(m, k, 3 * MiB, 6);
	cr_assert_eq(dormant_sleep(m, weights_only, &rep), 0, "%s", rep.error);
	cr_expect_eq(rep.tag_count, 1);
	cr_expect_eq(state_of(m, "weights"), DORMANT_ASLEEP);
	cr_expect_eq(state_of(m, "kv"), DORMANT_AWAKE);
	cr_expect(holds(m, k, 3 * MiB, 6), "the other tag stays usable");
	cr_expect_eq(dormant_copy_to_host(m, &(char[16]){ 0 }, w, 16), -EBUSY,
		     "asleep memory cannot be read");
	cr_assert_eq(dormant_wake(m, weights_only, &rep), 0, "%s", rep.error);
	cr_expect(holds(m, w, 3 * MiB, 5));
	dormant_destroy(m);
}

Test(basics, asking_for_the_current_state_changes_nothing)
{
	struct dormant *m = manager();
	struct dormant_report rep;

	alloc_tag(m, "weights", 2 * MiB);
	cr_assert_eq(dormant_wake(m, NULL, &rep), 0);
	cr_expect_eq(rep.tag_count, 1);
	cr_expect_not(rep.tags[0].changed);
	cr_expect_eq(rep.bytes_copied, 0);
	cr_assert_eq(dormant_sleep(m, NULL, &rep), 0);
	cr_expect(rep.tags[0].changed);
	cr_assert_eq(dormant_sleep(m, weights_only, &rep), 0);
	cr_expect_not(rep.tags[0].changed);
	cr_expect_eq(rep.tags[0].before, DORMANT_ASLEEP);
	cr_expect_eq(rep.tags[0].after, DORMANT_ASLEEP);
	cr_expect_eq(stats(m)->noops, 2);
	cr_expect_eq(stats(m)->wakes_noop, 1);
	cr_expect_eq(stats(m)->sleeps_noop, 1);
	cr_expect_eq(stats(m)->sleeps_ok, 1);
	dormant_destroy(m);
}

Test(basics, free_works_in_every_state)
{
	struct dormant *m = manager();
	void *a = alloc_tag(m, "weights", 40 * MiB); /* large: chunks of its own */
	void *b = alloc_tag(m, "weights", 1 * MiB);  /* small: in a 2 MiB slab */

	fill(m, b, 1 * MiB, 9);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	cr_assert_eq(dormant_free(m, a), 0, "%s", dormant_last_error());
	cr_expect_eq(tag_stats(stats(m), "weights")->allocations, 1);
	cr_expect_eq(dormant_free(m, a), -EINVAL, "double free is refused");
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	cr_expect(holds(m, b, 1 * MiB, 9));
	cr_expect_eq(stats(m)->device_bytes, 2 * MiB);
	cr_assert_eq(dormant_free(m, b), 0);
	cr_expect_eq(stats(m)->device_bytes, 0);
	cr_expect_eq(host_bytes_settled(m, 0), 0);
	cr_expect_eq(dormant_free(m, NULL), 0);
	expect_no_device_leak(m);
	dormant_destroy(m);
}

Test(basics, small_allocations_share_slabs)
{
	struct dormant *m = manager_with(DORMANT_HOST_RETAIN, 64 * MiB);
	enum { N = 600 };
	void **p = calloc(N, sizeof(*p));
	size_t *size = calloc(N, sizeof(*size)), total = 0;
	uint64_t device;

	srand(5);
	for (int i = 0; i < N; i++) {
		size[i] = 1 + (size_t)rand() % (96 * KiB);
		p[i] = alloc_tag(m, i % 3 ? "weights" : "optimizer", size[i]);
		cr_assert_eq((uintptr_t)p[i] % 512, 0, "512-byte aligned");
		fill(m, p[i], size[i], 1000 + i);
		total += size[i];
	}
	device = stats(m)->device_bytes;
	/* one chunk per allocation would be 600 * 2 MiB */
	cr_expect_lt(device, 2 * total + 8 * MiB, "%llu device bytes for %zu asked",
		     (unsigned long long)device, total);
	cr_expect_eq(stats(m)->allocations, N);
	for (int cycle = 0; cycle < 3; cycle++) {
		/* free every third one, asleep and awake, and reuse the holes */
		cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
		for (int i = cycle; i < N; i += 7) {
			cr_assert_eq(dormant_free(m, p[i]), 0);
			p[i] = NULL;
		}
		cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
		for (int i = 0; i < N; i++) {
			if (p[i]) {
				cr_assert(holds(m, p[i], size[i], 1000 + i), "cycle %d, allocation %d",
					  cycle, i);
				continue;
			}
			p[i] = alloc_tag(m, "weights", size[i]);
			fill(m, p[i], size[i], 1000 + i);
		}
	}
	for (int i = 0; i < N; i++)
		cr_assert_eq(dormant_free(m, p[i]), 0);
	cr_expect_eq(stats(m)->device_bytes, 0, "empty slabs give their memory back");
	cr_expect_eq(stats(m)->allocations, 0);
	expect_no_device_leak(m);
	free(p);
	free(size);
	dormant_destroy(m);
}

Test(errors, bad_input_is_refused_with_a_message)
{
	static const char *const unknown[] = { "nope", NULL };
	static const char *const bad_name[] = { "a b", NULL };
	struct dormant_options *bad = NULL;
	struct dormant *m = manager(), *other = NULL;
	char long_tag[80];
	void *p = NULL;

	memset(long_tag, 'x', sizeof(long_tag) - 1);
	long_tag[sizeof(long_tag) - 1] = '\0';
	cr_assert_eq(dormant_options_new(&bad), 0);
	cr_expect_eq(dormant_options_set(bad, "backend", "tpu"), -EINVAL);
	cr_expect_neq(strstr(dormant_last_error(), "tpu"), NULL, "message: %s",
		      dormant_last_error());
	setenv("DORMANT_BACKEND", "tpu", 1);
	cr_expect_eq(dormant_new(bad, &other), -EINVAL);
	unsetenv("DORMANT_BACKEND");
	dormant_options_destroy(bad);
	cr_expect_null(other);
	cr_expect_neq(strstr(dormant_last_error(), "tpu"), NULL, "message: %s",
		      dormant_last_error());
	cr_expect_eq(dormant_alloc(m, "weights", 0, &p), -EINVAL);
	cr_expect_eq(dormant_alloc(m, long_tag, 16, &p), -EINVAL);
	cr_expect_eq(dormant_alloc(m, "a/b", 16, &p), -EINVAL);
	cr_expect_eq(dormant_alloc(m, NULL, 16, &p), -EINVAL);
	cr_expect_eq(dormant_alloc_on(m, "weights", 16, 99, &p), -ENODEV);
	cr_expect_null(p, "ret_ptr untouched on failure");
	cr_expect_eq(dormant_set_policy(m, "weights", 7), -EINVAL);
	cr_expect_eq(dormant_sleep(m, unknown, NULL), -ENOENT);
	cr_expect_neq(strstr(dormant_last_error(), "nope"), NULL);
	cr_expect_eq(dormant_wake(m, bad_name, NULL), -EINVAL);
	cr_expect_eq(dormant_free(m, (void *)0x1000), -EINVAL);
	cr_expect_eq(dormant_step_leave(m), -EINVAL);
	cr_expect_eq(dormant_stats_get(m, NULL), -EINVAL);
	cr_expect_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_OPS, 1, -EIO, false), -EINVAL);
	cr_expect_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_MAP, 1, 5, false), -EINVAL);
	cr_expect_eq(dormant_sleep(NULL, NULL, NULL), -EINVAL);
	dormant_destroy(m);
	dormant_destroy(NULL);
}

Test(errors, asleep_tags_refuse_allocation_and_policy_changes)
{
	struct dormant *m = manager();
	void *p = NULL;

	alloc_tag(m, "weights", MiB);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	cr_expect_eq(dormant_alloc(m, "weights", MiB, &p), -EBUSY);
	cr_expect_eq(dormant_set_policy(m, "weights", DORMANT_DISCARD), -EBUSY);
	cr_expect_eq(dormant_set_policy(m, "weights", DORMANT_KEEP), 0, "no change is fine");
	cr_expect_eq(dormant_alloc(m, "other", MiB, &p), 0, "other tags are awake");
	dormant_destroy(m);
}

Test(errors, too_many_tags)
{
	struct dormant *m = manager();
	char name[16];

	for (int i = 0; i < DORMANT_TAGS_MAX; i++) {
		snprintf(name, sizeof(name), "t%d", i);
		cr_assert_eq(dormant_set_policy(m, name, DORMANT_KEEP), 0);
	}
	cr_expect_eq(dormant_set_policy(m, "onemore", DORMANT_KEEP), -ENOSPC);
	dormant_destroy(m);
}

/* ---- failure safety ------------------------------------------------------ */

struct scene {
	struct dormant *m;
	void *w, *w2, *g;
};

static const size_t W_SIZE = 9 * MiB + 100, W2_SIZE = 3 * MiB, G_SIZE = 4 * MiB;

static struct scene scene_new(enum dormant_host_mode mode)
{
	struct scene s;

	s.m = manager_with(mode, 4 * MiB);
	dormant_set_policy(s.m, "grads", DORMANT_DISCARD);
	s.w = alloc_tag(s.m, "weights", W_SIZE);
	s.w2 = alloc_tag(s.m, "optimizer", W2_SIZE);
	s.g = alloc_tag(s.m, "grads", G_SIZE);
	fill(s.m, s.w, W_SIZE, 11);
	fill(s.m, s.w2, W2_SIZE, 12);
	fill(s.m, s.g, G_SIZE, 13);
	return s;
}

static void scene_expect_intact(struct scene *s)
{
	cr_expect(holds(s->m, s->w, W_SIZE, 11), "weights lost");
	cr_expect(holds(s->m, s->w2, W2_SIZE, 12), "optimizer state lost");
}

static const enum dormant_fault_op chaos_ops[] = {
	DORMANT_FAULT_CREATE, DORMANT_FAULT_MAP, DORMANT_FAULT_COPY, DORMANT_FAULT_HOST_ALLOC,
};

/* Make the nth create / map / copy / host allocation of a sleep fail, for
 * every n that the sleep reaches: it must roll back to awake with every kept
 * byte intact, leak nothing, and the next cycle must work. */
static void chaos_sleep(enum dormant_host_mode mode)
{
	/* holds the CUDA primary context, so each scene does not recreate it */
	struct dormant *anchor = manager();

	for (size_t o = 0; o < sizeof(chaos_ops) / sizeof(chaos_ops[0]); o++) {
		int failures = 0;

		for (unsigned n = 1; n < 200; n++) {
			struct scene s = scene_new(mode);
			struct dormant_report rep;
			int r;

			cr_assert_eq(dormant_debug_inject_fault(s.m, chaos_ops[o], n, -EIO, false), 0);
			r = dormant_sleep(s.m, NULL, &rep);
			dormant_debug_inject_fault(s.m, chaos_ops[o], 0, 0, false);
			if (r == 0) {
				dormant_destroy(s.m);
				break; /* the sleep needs fewer than n such calls */
			}
			failures++;
			cr_expect_eq(r, -EIO, "op %d, n %u: %s", chaos_ops[o], n, rep.error);
			cr_expect_neq(rep.error[0], '\0');
			expect_all(s.m, DORMANT_AWAKE);
			cr_expect(stats(s.m)->healthy, "a rolled-back sleep leaves it healthy");
			cr_expect_eq(stats(s.m)->sleeps_failed, 1);
			scene_expect_intact(&s);
			expect_no_device_leak(s.m);
			cr_expect_eq(stats(s.m)->device_bytes, 10 * MiB + 4 * MiB + 4 * MiB);
			/* and it still works */
			cr_assert_eq(dormant_sleep(s.m, NULL, NULL), 0, "op %d, n %u: %s",
				     chaos_ops[o], n, dormant_last_error());
			cr_assert_eq(dormant_wake(s.m, NULL, NULL), 0, "%s", dormant_last_error());
			scene_expect_intact(&s);
			cr_expect(holds(s.m, s.g, G_SIZE, 0));
			if (mode == DORMANT_HOST_RELEASE)
				cr_expect_eq(host_bytes_settled(s.m, 0), 0, "host memory leaked");
			dormant_destroy(s.m);
		}
		/* the copy and host paths exist in both modes; create and map
		 * are reached by the rollback's re-mapping */
		if (chaos_ops[o] != DORMANT_FAULT_CREATE && chaos_ops[o] != DORMANT_FAULT_MAP)
			cr_expect_gt(failures, 0, "op %d was never reached by a sleep", chaos_ops[o]);
	}
	dormant_destroy(anchor);
}

Test(chaos, sleep_rolls_back_at_every_fault_point_release, .timeout = 120,
     .init = pin_pieces_small)
{
	chaos_sleep(DORMANT_HOST_RELEASE);
}

Test(chaos, sleep_rolls_back_at_every_fault_point_retain, .timeout = 120,
     .init = pin_pieces_small)
{
	chaos_sleep(DORMANT_HOST_RETAIN);
}

Test(chaos, sleep_rolls_back_at_every_fault_point_reclaimable, .timeout = 120,
     .init = pin_pieces_small)
{
	chaos_sleep(DORMANT_HOST_RECLAIMABLE);
}

Test(chaos, sleep_rolls_back_at_every_fault_point_unpinned, .timeout = 120, .init = unpinned)
{
	chaos_sleep(DORMANT_HOST_RELEASE);
}

/* Make the nth call of each op fail during wake, with ENOMEM and EIO: the
 * tags stay asleep with their host copies, and the same wake then works. */
static void chaos_wake(enum dormant_host_mode mode, int error)
{
	struct dormant *anchor = manager(); /* see chaos_sleep() */

	for (size_t o = 0; o < sizeof(chaos_ops) / sizeof(chaos_ops[0]); o++) {
		int failures = 0;

		for (unsigned n = 1; n < 200; n++) {
			struct scene s = scene_new(mode);
			struct dormant_report rep;
			int r;

			cr_assert_eq(dormant_sleep(s.m, NULL, NULL), 0, "%s", dormant_last_error());
			dormant_debug_inject_fault(s.m, chaos_ops[o], n, error, false);
			r = dormant_wake(s.m, NULL, &rep);
			dormant_debug_inject_fault(s.m, chaos_ops[o], 0, 0, false);
			if (r == 0) {
				scene_expect_intact(&s);
				dormant_destroy(s.m);
				break;
			}
			failures++;
			cr_expect_eq(r, error, "op %d, n %u: %s", chaos_ops[o], n, rep.error);
			expect_all(s.m, DORMANT_ASLEEP);
			cr_expect_eq(stats(s.m)->device_bytes, 0, "a failed wake gives back its maps");
			cr_expect_geq(tag_stats(stats(s.m), "weights")->host_bytes, W_SIZE);
			cr_expect_eq(tag_stats(stats(s.m), "grads")->host_bytes, 0);
			expect_no_device_leak(s.m);
			cr_assert_eq(dormant_wake(s.m, NULL, &rep), 0, "retry: %s", rep.error);
			scene_expect_intact(&s);
			cr_expect(holds(s.m, s.g, G_SIZE, 0));
			dormant_destroy(s.m);
		}
		/* host copies (and the staging ring) exist by the time of a wake */
		if (chaos_ops[o] != DORMANT_FAULT_HOST_ALLOC)
			cr_expect_gt(failures, 0, "op %d was never reached by a wake", chaos_ops[o]);
	}
	dormant_destroy(anchor);
}

Test(chaos, wake_fails_cleanly_at_every_fault_point_release, .timeout = 120,
     .init = pin_pieces_small)
{
	chaos_wake(DORMANT_HOST_RELEASE, -ENOMEM);
}

Test(chaos, wake_fails_cleanly_at_every_fault_point_retain, .timeout = 120,
     .init = pin_pieces_small)
{
	chaos_wake(DORMANT_HOST_RETAIN, -EIO);
}

Test(chaos, wake_fails_cleanly_at_every_fault_point_unpinned, .timeout = 120, .init = unpinned)
{
	chaos_wake(DORMANT_HOST_RELEASE, -ENOMEM);
}

Test(chaos, wake_without_device_memory_then_retry)
{
	struct scene s = scene_new(DORMANT_HOST_RELEASE);
	struct dormant_report rep;
	struct dormant_stats *st;

	cr_assert_eq(dormant_sleep(s.m, NULL, NULL), 0);
	st = stats(s.m);
	cr_assert_geq(st->device_count, 1);
	/* another process takes the memory back */
	cr_assert_eq(dormant_debug_occupy(s.m, 0, st->devices[0].free_bytes - 8 * MiB), 0, "%s",
		     dormant_last_error());
	cr_expect_eq(dormant_wake(s.m, NULL, &rep), -ENOMEM);
	cr_expect_neq(rep.error[0], '\0');
	expect_all(s.m, DORMANT_ASLEEP);
	cr_expect_eq(stats(s.m)->wakes_failed, 1);
	cr_expect(stats(s.m)->healthy, "a wake that can be retried is not a failure of health");
	cr_expect_eq(dormant_wake(s.m, NULL, &rep), -ENOMEM, "still taken");
	cr_assert_eq(dormant_debug_occupy(s.m, 0, 0), 0);
	cr_assert_eq(dormant_wake(s.m, NULL, &rep), 0, "%s", rep.error);
	scene_expect_intact(&s);
	dormant_destroy(s.m);
}

Test(chaos, a_failed_rollback_keeps_the_data_on_the_host, .init = unpinned)
{
	struct scene s = scene_new(DORMANT_HOST_RELEASE);
	struct dormant_report rep;
	uint64_t copies = dormant_debug_op_count(s.m, DORMANT_FAULT_COPY);

	/* count the copies of a whole sleep */
	cr_assert_eq(dormant_sleep(s.m, NULL, NULL), 0);
	cr_assert_eq(dormant_wake(s.m, NULL, NULL), 0);
	copies = (dormant_debug_op_count(s.m, DORMANT_FAULT_COPY) - copies) / 2;
	cr_assert_gt(copies, 2);

	/* the last copy fails (earlier chunks are released by then), and every
	 * create after that fails too, so the rollback cannot restore them */
	dormant_debug_inject_fault(s.m, DORMANT_FAULT_COPY, (unsigned)copies, -EIO, false);
	dormant_debug_inject_fault(s.m, DORMANT_FAULT_CREATE, 1, -ENOMEM, true);
	cr_expect_eq(dormant_sleep(s.m, NULL, &rep), -EIO);
	cr_expect_neq(strstr(rep.error, "rollback"), NULL, "%s", rep.error);
	cr_expect_not(stats(s.m)->healthy);
	cr_expect_eq(state_of(s.m, "weights"), DORMANT_ASLEEP, "not fully on the device");
	dormant_debug_inject_fault(s.m, DORMANT_FAULT_CREATE, 0, 0, false);
	cr_assert_eq(dormant_wake(s.m, NULL, &rep), 0, "%s", rep.error);
	expect_all(s.m, DORMANT_AWAKE);
	scene_expect_intact(&s);
	cr_expect(stats(s.m)->healthy, "a complete wake restores health");
	expect_no_device_leak(s.m);
	dormant_destroy(s.m);
}

/* ---- threads ------------------------------------------------------------- */

struct crowd {
	struct dormant *m;
	atomic_bool stop;
	atomic_int errors;
	void *victims[32];
	atomic_int victim_next;
};

static void *crowd_allocator(void *arg)
{
	struct crowd *c = arg;

	while (!atomic_load(&c->stop)) {
		void *p = NULL;
		int r = dormant_alloc(c->m, "scratch", 3 * MiB, &p);

		if (r == 0) {
			fill(c->m, p, 4096, 77);
			if (!holds(c->m, p, 4096, 77))
				atomic_fetch_add(&c->errors, 1);
			r = dormant_free(c->m, p);
		}
		if (r != 0)
			atomic_fetch_add(&c->errors, 1);
	}
	return NULL;
}

static void *crowd_reader(void *arg)
{
	struct crowd *c = arg;
	struct dormant_stats *s = malloc(sizeof(*s));

	while (!atomic_load(&c->stop)) {
		if (dormant_stats_get(c->m, s) != 0 || s->tag_count < 2)
			atomic_fetch_add(&c->errors, 1);
		usleep(100);
	}
	free(s);
	return NULL;
}

static void *crowd_freer(void *arg)
{
	struct crowd *c = arg;
	int i;

	/* frees the sleeping tag's allocations while transitions run */
	while ((i = atomic_fetch_add(&c->victim_next, 1)) < 32) {
		if (dormant_free(c->m, c->victims[i]) != 0)
			atomic_fetch_add(&c->errors, 1);
		usleep(2000);
	}
	return NULL;
}

static void *crowd_rival(void *arg)
{
	struct crowd *c = arg;

	/* a second orchestrator: gets 0 or -EBUSY, never anything else */
	while (!atomic_load(&c->stop)) {
		int r = dormant_wake(c->m, weights_only, NULL);

		if (r != 0 && r != -EBUSY)
			atomic_fetch_add(&c->errors, 1);
		usleep(1000);
	}
	return NULL;
}

Test(threads, alloc_free_and_stats_during_transitions, .timeout = 120)
{
	struct crowd c = { .m = manager() };
	/* valgrind runs one thread at a time: fewer cycles there */
	int cycles = getenv("DORMANT_VALGRIND") ? 4 : 30;
	pthread_t t[5];
	void *w;

	dormant_set_policy(c.m, "grads", DORMANT_DISCARD);
	w = alloc_tag(c.m, "weights", 6 * MiB);
	alloc_tag(c.m, "grads", 6 * MiB);
	fill(c.m, w, 6 * MiB, 21);
	for (int i = 0; i < 32; i++)
		c.victims[i] = alloc_tag(c.m, "grads", 2 * MiB);
	alloc_tag(c.m, "scratch", MiB);
	pthread_create(&t[0], NULL, crowd_allocator, &c);
	pthread_create(&t[1], NULL, crowd_reader, &c);
	pthread_create(&t[2], NULL, crowd_reader, &c);
	pthread_create(&t[3], NULL, crowd_freer, &c);
	pthread_create(&t[4], NULL, crowd_rival, &c);
	for (int cycle = 0; cycle < cycles; cycle++) {
		static const char *const both[] = { "weights", "grads", NULL };
		int r;

		while ((r = dormant_sleep(c.m, both, NULL)) == -EBUSY)
			usleep(100);
		cr_assert_eq(r, 0, "cycle %d: %s", cycle, dormant_last_error());
		while ((r = dormant_wake(c.m, both, NULL)) == -EBUSY)
			usleep(100);
		cr_assert_eq(r, 0, "cycle %d: %s", cycle, dormant_last_error());
		cr_assert(holds(c.m, w, 6 * MiB, 21), "cycle %d", cycle);
	}
	atomic_store(&c.stop, true);
	for (int i = 0; i < 5; i++)
		pthread_join(t[i], NULL);
	cr_expect_eq(atomic_load(&c.errors), 0);
	cr_expect_eq(tag_stats(stats(c.m), "grads")->allocations, 1);
	cr_expect_eq(tag_stats(stats(c.m), "scratch")->allocations, 1);
	cr_expect_eq(stats(c.m)->device_bytes, 6 * MiB + 6 * MiB + 2 * MiB);
	expect_no_device_leak(c.m);
	dormant_destroy(c.m);
}

/* ---- guard and hooks ----------------------------------------------------- */

struct stepper {
	struct dormant *m;
	int timeout_ms;
	int result;
	atomic_bool inside;
};

static void *step_once(void *arg)
{
	struct stepper *s = arg;

	s->result = dormant_step_enter(s->m, s->timeout_ms);
	if (s->result == 0) {
		atomic_store(&s->inside, true);
		dormant_step_leave(s->m);
	}
	return NULL;
}

static double monotonic_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct leaver {
	struct dormant *m;
	double held_s; /* how long the step went on after the sleep started */
};

/* Leave the step 40 ms after the sleep has started. */
static void *leave_later(void *arg)
{
	struct leaver *l = arg;
	struct dormant_stats *s = malloc(sizeof(*s));
	double start;

	do {
		usleep(1000);
		dormant_stats_get(l->m, s);
	} while (!s->transition_running);
	free(s);
	start = monotonic_s();
	usleep(40000);
	l->held_s = monotonic_s() - start;
	dormant_step_leave(l->m);
	return NULL;
}

Test(guard, sleep_waits_for_steps_and_steps_wait_for_wake)
{
	struct stepper s = { .timeout_ms = -1 };
	struct leaver leaver = { 0 };
	struct dormant_report rep;
	struct dormant *m = manager_from("guard_timeout_ms=100,host_mode=release");
	pthread_t t;

	alloc_tag(m, "weights", MiB);

	/* a step holds the guard past the timeout: the sleep is refused */
	cr_assert_eq(dormant_step_enter(m, 0), 0);
	cr_expect_eq(stats(m)->steps_running, 1);
	cr_expect_eq(dormant_sleep(m, NULL, &rep), -EBUSY);
	cr_expect_neq(strstr(rep.error, "step"), NULL, "%s", rep.error);
	cr_expect_eq(state_of(m, "weights"), DORMANT_AWAKE);
	cr_expect_eq(stats(m)->busy_rejections, 1);
	cr_expect_eq(stats(m)->sleeps_busy, 1);
	cr_expect_eq(stats(m)->wakes_busy, 0);
	dormant_step_leave(m);
	dormant_destroy(m);

	/* a step that leaves in time: the sleep waits for it (a timeout far
	 * beyond the step's 40 ms, so that a loaded machine's late wake-up of
	 * the leaving thread cannot turn the wait into a refusal) */
	m = manager_from("guard_timeout_ms=30000,host_mode=release");
	alloc_tag(m, "weights", MiB);
	s.m = m;
	cr_assert_eq(dormant_step_enter(m, 0), 0);
	leaver.m = m;
	pthread_create(&t, NULL, leave_later, &leaver);
	cr_expect_eq(dormant_sleep(m, NULL, &rep), 0, "%s", rep.error);
	pthread_join(t, NULL);
	/* any sleep reports some wait; this one waited for the step (half of
	 * it: the sleep may reach the guard a little after it starts) */
	cr_expect_geq(rep.guard_wait_s, leaver.held_s / 2, "waited %.3f s, the step held %.3f s",
		      rep.guard_wait_s, leaver.held_s);
	cr_expect_eq(stats(m)->steps_running, 0);

	/* asleep: a step cannot enter now, and waits for the wake */
	cr_expect_eq(dormant_step_enter(m, 0), -ETIMEDOUT);
	cr_expect_eq(dormant_step_enter(m, 20), -ETIMEDOUT);
	pthread_create(&t, NULL, step_once, &s);
	usleep(20000);
	cr_expect_not(atomic_load(&s.inside), "a step got in while asleep");
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	pthread_join(t, NULL);
	cr_expect_eq(s.result, 0);
	cr_expect(atomic_load(&s.inside));
	dormant_destroy(m);
}

struct hook_log {
	char events[16][24];
	int count;
	int cancel_point; /* -1: none */
};

static int record_hook(struct dormant *m, enum dormant_hook_point point, void *userdata)
{
	static const char *const names[] = { "before-sleep", "after-sleep", "before-wake",
					     "after-wake" };
	struct hook_log *log = userdata;

	/* hooks run while the tags are transitioning: stats must answer */
	struct dormant_stats *s = malloc(sizeof(*s));
	cr_assert_eq(dormant_stats_get(m, s), 0);
	free(s);
	snprintf(log->events[log->count++], sizeof(log->events[0]), "%s", names[point]);
	return (int)point == log->cancel_point ? 1 : 0;
}

Test(hooks, run_in_order_and_can_cancel)
{
	struct dormant *m = manager();
	struct hook_log log = { .cancel_point = -1 };
	int ids[4];

	alloc_tag(m, "weights", MiB);
	for (int p = 0; p < 4; p++) {
		ids[p] = dormant_hook_add(m, p, record_hook, &log);
		cr_assert_gt(ids[p], 0);
	}
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	cr_assert_eq(log.count, 4);
	cr_expect_str_eq(log.events[0], "before-sleep");
	cr_expect_str_eq(log.events[1], "after-sleep");
	cr_expect_str_eq(log.events[2], "before-wake");
	cr_expect_str_eq(log.events[3], "after-wake");

	/* no transition, no hooks */
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	cr_expect_eq(log.count, 4);

	log.cancel_point = DORMANT_HOOK_BEFORE_SLEEP;
	cr_expect_eq(dormant_sleep(m, NULL, NULL), -ECANCELED);
	cr_expect_eq(state_of(m, "weights"), DORMANT_AWAKE);
	cr_expect_eq(log.count, 5, "after-sleep does not run for a cancelled sleep");

	cr_expect_eq(dormant_hook_remove(m, ids[0]), 0);
	cr_expect_eq(dormant_hook_remove(m, ids[0]), -ENOENT);
	cr_expect_eq(dormant_sleep(m, NULL, NULL), 0);
	cr_expect_eq(log.count, 6, "only after-sleep is left for sleep");
	dormant_destroy(m);
}

static int refuse_hook(struct dormant *m, enum dormant_hook_point point, void *userdata)
{
	(void)m;
	(void)userdata;
	dormant_hook_set_error(point == DORMANT_HOOK_BEFORE_SLEEP ? "not now" : "not yet");
	return 3;
}

/* A before-hook that refuses says why, as the other hook points do. */
Test(hooks, a_refusing_before_hook_gives_its_reason)
{
	struct dormant *m = manager();
	struct dormant_report rep;
	int id;

	alloc_tag(m, "weights", MiB);
	id = dormant_hook_add(m, DORMANT_HOOK_BEFORE_SLEEP, refuse_hook, NULL);
	cr_assert_gt(id, 0);
	cr_expect_eq(dormant_sleep(m, NULL, &rep), -ECANCELED);
	cr_expect_str_eq(rep.error, "a before-sleep hook cancelled the sleep (it returned 3): not now");
	cr_expect_eq(state_of(m, "weights"), DORMANT_AWAKE);
	cr_assert_eq(dormant_hook_remove(m, id), 0);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	cr_assert_gt(dormant_hook_add(m, DORMANT_HOOK_BEFORE_WAKE, refuse_hook, NULL), 0);
	cr_expect_eq(dormant_wake(m, NULL, &rep), -ECANCELED);
	cr_expect_str_eq(rep.error, "a before-wake hook cancelled the wake (it returned 3): not yet");
	cr_expect_eq(state_of(m, "weights"), DORMANT_ASLEEP);
	dormant_destroy(m);
}

/* ---- devices ------------------------------------------------------------- */

/*
 * Two devices in one process: the host backend's simulated ones, or two
 * GPUs (DORMANT_BACKEND=cuda on a two-GPU machine); skipped with one. Both
 * devices are driven at once (transfer.h); these check what that must keep.
 */
static struct dormant *two_devices(void)
{
	struct dormant *m = manager_from("host_devices=2,chunk_bytes=4MiB,staging_bytes=8MiB,"
					 "copy_threads=2,guard_timeout_ms=5000");

	if (dormant_device_count(m) < 2) {
		dormant_destroy(m);
		cr_skip_test("one device only");
	}
	return m;
}

static uint64_t managed_on(struct dormant *m, int device)
{
	struct dormant_stats *s = stats(m);

	for (size_t i = 0; i < s->device_count; i++)
		if (s->devices[i].ordinal == device)
			return s->devices[i].managed_bytes;
	return 0;
}

Test(devices, every_device_sleeps_and_wakes)
{
	struct dormant *m = two_devices();
	const size_t size = 12 * MiB; /* 3 chunks on each device */
	struct dormant_report rep;
	void *w[2], *g[2];

	cr_assert_eq(dormant_set_policy(m, "grads", DORMANT_DISCARD), 0);
	for (int d = 0; d < 2; d++) {
		cr_assert_eq(dormant_alloc_on(m, "weights", size, d, &w[d]), 0, "%s",
			     dormant_last_error());
		cr_assert_eq(dormant_alloc_on(m, "grads", size, d, &g[d]), 0, "%s",
			     dormant_last_error());
		fill(m, w[d], size, 40 + d);
		fill(m, g[d], size, 60 + d);
	}
	cr_expect_geq(stats(m)->device_count, 2);
	for (int cycle = 0; cycle < 3; cycle++) {
		cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "%s", dormant_last_error());
		for (int d = 0; d < 2; d++)
			cr_expect_eq(managed_on(m, d), 0, "device %d still holds memory", d);
		/* the devices' counters add up, in the totals and per tag */
		cr_expect_eq(rep.bytes_copied, 2 * size, "copied %llu",
			     (unsigned long long)rep.bytes_copied);
		cr_expect_eq(change_of(&rep, "weights")->bytes_copied, 2 * size);
		cr_expect_eq(change_of(&rep, "grads")->bytes_copied, 0);
		cr_expect_eq(rep.bytes_released, 4 * size, "released %llu",
			     (unsigned long long)rep.bytes_released);
		cr_expect_eq(change_of(&rep, "weights")->bytes_released, 2 * size);
		cr_expect_eq(change_of(&rep, "grads")->bytes_released, 2 * size);
		cr_assert_eq(dormant_wake(m, NULL, &rep), 0, "%s", dormant_last_error());
		cr_expect_eq(rep.bytes_copied, 2 * size);
		cr_expect_eq(rep.bytes_mapped, 4 * size);
		cr_expect_eq(change_of(&rep, "grads")->bytes_zeroed, 2 * size);
		cr_expect_eq(change_of(&rep, "weights")->bytes_mapped, 2 * size);
		/* the same pointers, holding the same bytes, writable again */
		for (int d = 0; d < 2; d++) {
			cr_expect_eq(managed_on(m, d), 2 * size, "device %d", d);
			cr_expect(holds(m, w[d], size, 40 + d + cycle), "device %d cycle %d", d,
				  cycle);
			cr_expect(holds(m, g[d], size, 0), "device %d: grads not zeroed", d);
			fill(m, w[d], size, 40 + d + cycle + 1);
			cr_expect(dormant_owns(m, w[d]));
		}
	}
	expect_no_device_leak(m);
	dormant_destroy(m);
}

/* A tag whose memory is all on one device sleeps alone: the other device's
 * memory stays mapped and usable meanwhile. */
Test(devices, one_devices_tags_sleep_alone)
{
	static const char *const second[] = { "second", NULL };
	struct dormant *m = two_devices();
	const size_t size = 6 * MiB;
	struct dormant_report rep;
	void *a, *b;

	cr_assert_eq(dormant_alloc_on(m, "first", size, 0, &a), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_alloc_on(m, "second", size, 1, &b), 0, "%s", dormant_last_error());
	fill(m, a, size, 71);
	fill(m, b, size, 72);
	cr_assert_eq(dormant_sleep(m, second, &rep), 0, "%s", dormant_last_error());
	cr_expect_eq(rep.bytes_copied, size);
	cr_expect_eq(state_of(m, "second"), DORMANT_ASLEEP);
	cr_expect_eq(state_of(m, "first"), DORMANT_AWAKE);
	cr_expect_eq(managed_on(m, 1), 0);
	cr_expect_eq(managed_on(m, 0), size);
	cr_expect(holds(m, a, size, 71), "device 0's memory while device 1 sleeps");
	fill(m, a, size, 73);
	cr_assert_eq(dormant_wake(m, second, NULL), 0, "%s", dormant_last_error());
	cr_expect(holds(m, a, size, 73));
	cr_expect(holds(m, b, size, 72));
	cr_expect_eq(managed_on(m, 1), size);
	expect_no_device_leak(m);
	dormant_destroy(m);
}

/*
 * A sleep failing on device 1 (at each of its copies in turn) rolls back
 * every device, whatever device 0 got done meanwhile: all awake, every byte
 * back, nothing leaked, and the error names the device.
 */
Test(devices, a_sleep_failing_on_one_device_rolls_back_every_device, .timeout = 120)
{
	const size_t size = 12 * MiB; /* 3 chunks on each device */
	int failures = 0;

	for (unsigned n = 1; n < 20; n++) {
		struct dormant *m = two_devices();
		void *w[2], *g[2];
		int r;

		cr_assert_eq(dormant_set_policy(m, "grads", DORMANT_DISCARD), 0);
		for (int d = 0; d < 2; d++) {
			cr_assert_eq(dormant_alloc_on(m, "weights", size, d, &w[d]), 0);
			cr_assert_eq(dormant_alloc_on(m, "grads", size, d, &g[d]), 0);
			fill(m, w[d], size, 80 + d);
			fill(m, g[d], size, 90 + d);
		}
		cr_assert_eq(dormant_debug_inject_device_fault(m, 1, DORMANT_FAULT_COPY, n, -EIO,
							       false),
			     0, "%s", dormant_last_error());
		r = dormant_sleep(m, NULL, NULL);
		dormant_debug_inject_device_fault(m, 1, DORMANT_FAULT_COPY, 0, 0, false);
		if (r == 0) {
			dormant_destroy(m);
			break;
		}
		failures++;
		cr_expect_eq(r, -EIO, "n %u: %s", n, dormant_last_error());
		cr_expect(strncmp(dormant_last_error(), "sleep: device 1: ", 17) == 0, "n %u: %s", n,
			  dormant_last_error());
		expect_all(m, DORMANT_AWAKE);
		for (int d = 0; d < 2; d++) {
			cr_expect_eq(managed_on(m, d), 2 * size, "n %u: device %d not rolled back", n,
				     d);
			cr_expect(holds(m, w[d], size, 80 + d), "n %u: weights of device %d lost", n,
				  d);
		}
		expect_no_device_leak(m);
		cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "n %u: %s", n, dormant_last_error());
		cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "n %u: %s", n, dormant_last_error());
		for (int d = 0; d < 2; d++)
			cr_expect(holds(m, w[d], size, 80 + d), "n %u: device %d", n, d);
		dormant_destroy(m);
	}
	/* device 1 copies its 3 chunks in one piece each */
	cr_expect_eq(failures, 3, "%d failing sleeps", failures);
}

/*
 * A wake failing on device 1 (mapping, at each of its chunks in turn, as
 * when a rollout engine still holds that GPU) leaves every device asleep and
 * unmapped, the host copies intact; the retry wakes both.
 */
Test(devices, a_wake_failing_on_one_device_leaves_every_device_asleep, .timeout = 120)
{
	static const enum dormant_fault_op ops[] = { DORMANT_FAULT_CREATE, DORMANT_FAULT_MAP };
	const size_t size = 12 * MiB;

	for (size_t o = 0; o < 2; o++)
		for (unsigned n = 1; n <= 3; n++) {
			struct dormant *m = two_devices();
			void *w[2];

			for (int d = 0; d < 2; d++) {
				cr_assert_eq(dormant_alloc_on(m, "weights", size, d, &w[d]), 0);
				fill(m, w[d], size, 100 + d);
			}
			cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
			cr_assert_eq(dormant_debug_inject_device_fault(m, 1, ops[o], n, -ENOMEM,
								       false),
				     0);
			cr_expect_eq(dormant_wake(m, NULL, NULL), -ENOMEM, "op %zu n %u", o, n);
			cr_expect(strncmp(dormant_last_error(), "wake: device 1: ", 16) == 0, "%s",
				  dormant_last_error());
			expect_all(m, DORMANT_ASLEEP);
			for (int d = 0; d < 2; d++)
				cr_expect_eq(managed_on(m, d), 0, "op %zu n %u: device %d mapped", o,
					     n, d);
			expect_no_device_leak(m);
			cr_expect_geq(stats(m)->host_bytes, 2 * size);
			cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
			for (int d = 0; d < 2; d++)
				cr_expect(holds(m, w[d], size, 100 + d), "op %zu n %u: device %d", o,
					  n, d);
			dormant_destroy(m);
		}
}

/* Device faults are checked like the others. */
Test(devices, device_faults_refuse_bad_arguments)
{
	struct dormant *m = manager();

	cr_expect_eq(dormant_debug_inject_device_fault(m, -1, DORMANT_FAULT_COPY, 1, -EIO, false),
		     -EINVAL);
	cr_expect_eq(dormant_debug_inject_device_fault(m, DORMANT_DEVICES_MAX, DORMANT_FAULT_COPY,
						       1, -EIO, false),
		     -EINVAL);
	cr_expect_eq(dormant_debug_inject_device_fault(m, 0, DORMANT_FAULT_HOST_ALLOC, 1, -EIO,
						       false),
		     -EINVAL);
	cr_expect_eq(dormant_debug_inject_device_fault(m, 0, DORMANT_FAULT_OPS, 1, -EIO, false),
		     -EINVAL);
	cr_expect_eq(dormant_debug_inject_device_fault(m, 0, DORMANT_FAULT_COPY, 1, 5, false),
		     -EINVAL);
	cr_expect_eq(dormant_debug_inject_device_fault(NULL, 0, DORMANT_FAULT_COPY, 1, -EIO,
						       false),
		     -EINVAL);
	dormant_destroy(m);
}

/* ---- statistics and the PyTorch entry points ----------------------------- */

Test(stats, counters_and_histograms)
{
	struct dormant *m = manager();
	struct dormant_stats *s;
	uint64_t in_buckets = 0;

	alloc_tag(m, "weights", 3 * MiB);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
		cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	}
	s = stats(m);
	cr_expect_eq(s->sleeps_ok, 3);
	cr_expect_eq(s->wakes_ok, 3);
	cr_expect_eq(s->bytes_to_host_total, 9 * MiB);
	cr_expect_eq(s->bytes_to_device_total, 9 * MiB);
	cr_expect(s->last_sleep.valid);
	cr_expect_eq(s->last_sleep.bytes_copied, 3 * MiB);
	cr_expect_gt(s->last_wake.duration_s, 0.0);
	cr_expect_eq(s->sleep_seconds.count, 3);
	for (int i = 0; i <= DORMANT_HISTOGRAM_BUCKETS; i++)
		in_buckets += s->sleep_seconds.counts[i];
	cr_expect_eq(in_buckets, 3);
	cr_expect_str_eq(s->backend, dormant_backend_name(m));
	cr_expect_not(s->transition_running);
	dormant_destroy(m);
}

Test(torch, allocator_entry_points_use_the_thread_tag)
{
	struct dormant *m = manager();
	char tag[DORMANT_TAG_MAX + 1];
	void *p;

	cr_expect_null(dormant_torch_malloc(4096, 0, NULL), "no manager attached yet");
	cr_assert_eq(dormant_torch_set_manager(m), 0);
	cr_assert_eq(dormant_get_thread_tag(tag, sizeof(tag)), 0);
	cr_expect_str_eq(tag, "default");
	cr_assert_eq(dormant_set_thread_tag("weights"), 0);
	cr_expect_eq(dormant_set_thread_tag("bad tag"), -EINVAL);
	p = dormant_torch_malloc(5 * MiB, 0, NULL);
	cr_assert_not_null(p, "%s", dormant_last_error());
	cr_expect_eq(tag_stats(stats(m), "weights")->allocations, 1);
	dormant_torch_free(p, 5 * MiB, 0, NULL);
	cr_expect_eq(tag_stats(stats(m), "weights")->allocations, 0);
	dormant_set_thread_tag(NULL);
	dormant_destroy(m);
	cr_expect_null(dormant_torch_malloc(4096, 0, NULL), "destroy detaches the manager");
}
