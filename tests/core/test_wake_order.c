/* SPDX-License-Identifier: MIT */
/*
 * The order of a wake (issue 16): by default a thread maps the chunks ahead
 * of the copies (core/mapper.c), so the copies of the first chunks run while
 * later ones are still being mapped; DORMANT_WAKE_OVERLAP=0 maps every chunk
 * first. Both keep the wake's guarantees: a wake short of memory fails with
 * -ENOMEM, gives back what it mapped, keeps the host copies, and a retry
 * restores every byte. And every transition says where its time went
 * (struct dormant_transition_times). Host backend; nothing is timed.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dormant.h"
#include "helpers.h"

static const size_t W_SIZE = 9 * MiB + 100, O_SIZE = 3 * MiB, G_SIZE = 4 * MiB;

struct scene {
	struct dormant *m;
	void *w, *o, *g;
};

static void *alloc_tag(struct dormant *m, const char *tag, size_t size)
{
	void *p = NULL;

	cr_assert_eq(dormant_alloc(m, tag, size, &p), 0, "alloc %zu under %s: %s", size, tag,
		     dormant_last_error());
	return p;
}

/* 4 MiB chunks: weights 3, optimizer 1, grads 1 (discarded), in that order.
 * threads: DORMANT_WAKE_MAP_THREADS (NULL: unset). */
static struct scene scene_with(bool overlap, const char *threads)
{
	struct scene s;

	if (overlap)
		unsetenv("DORMANT_WAKE_OVERLAP");
	else
		setenv("DORMANT_WAKE_OVERLAP", "0", 1);
	if (threads)
		setenv("DORMANT_WAKE_MAP_THREADS", threads, 1);
	s.m = manager_with(DORMANT_HOST_RELEASE, 4 * MiB);
	unsetenv("DORMANT_WAKE_OVERLAP");
	unsetenv("DORMANT_WAKE_MAP_THREADS");
	cr_assert_eq(dormant_set_policy(s.m, "grads", DORMANT_DISCARD), 0);
	s.w = alloc_tag(s.m, "weights", W_SIZE);
	s.o = alloc_tag(s.m, "optimizer", O_SIZE);
	s.g = alloc_tag(s.m, "grads", G_SIZE);
	fill(s.m, s.w, W_SIZE, 21);
	fill(s.m, s.o, O_SIZE, 22);
	fill(s.m, s.g, G_SIZE, 23);
	return s;
}

static struct scene scene_new(bool overlap)
{
	return scene_with(overlap, NULL);
}

static void expect_intact(struct scene *s)
{
	cr_expect(holds(s->m, s->w, W_SIZE, 21), "weights lost");
	cr_expect(holds(s->m, s->o, O_SIZE, 22), "optimizer state lost");
	cr_expect(holds(s->m, s->g, G_SIZE, 0), "grads not zero-filled");
}

/* Fail the nth creation of physical memory in a wake, for every n it
 * reaches: asleep after, nothing mapped, host copies whole, the retry
 * restores every byte. Returns how many chunks the wake copied before it
 * failed, per n. */
static void fail_each_mapping(bool overlap, uint64_t copied_before[8], int *ret_failures)
{
	int failures = 0;

	for (unsigned n = 1; n < 8; n++) {
		struct scene s = scene_new(overlap);
		struct dormant_report rep;
		int r;

		cr_assert_eq(dormant_sleep(s.m, NULL, NULL), 0, "%s", dormant_last_error());
		cr_assert_eq(dormant_debug_inject_fault(s.m, DORMANT_FAULT_CREATE, n, -ENOMEM, false), 0);
		r = dormant_wake(s.m, NULL, &rep);
		dormant_debug_inject_fault(s.m, DORMANT_FAULT_CREATE, 0, 0, false);
		if (r == 0) {
			expect_intact(&s);
			dormant_destroy(s.m);
			break;
		}
		failures++;
		copied_before[n] = rep.bytes_copied;
		cr_expect_eq(r, -ENOMEM, "n %u: %s", n, rep.error);
		cr_expect(strstr(rep.error, "mapping") != NULL, "n %u: %s", n, rep.error);
		cr_expect_eq(stats(s.m)->device_bytes, 0, "n %u: a failed wake gives back its maps", n);
		cr_expect_eq(tag_stats(stats(s.m), "weights")->state, DORMANT_ASLEEP);
		cr_expect_geq(tag_stats(stats(s.m), "weights")->host_bytes, W_SIZE);
		cr_expect_geq(tag_stats(stats(s.m), "optimizer")->host_bytes, O_SIZE);
		cr_assert_eq(dormant_wake(s.m, NULL, &rep), 0, "retry: %s", rep.error);
		expect_intact(&s);
		dormant_destroy(s.m);
	}
	*ret_failures = failures;
}

Test(wake_order, mapping_ahead_copies_while_later_chunks_map)
{
	uint64_t copied[8] = { 0 };
	int failures;

	fail_each_mapping(true, copied, &failures);
	cr_expect_eq(failures, 5, "five chunks to map");
	cr_expect_eq(copied[1], 0, "nothing copied before the first mapping");
	/* the weights' chunks were being copied when the optimizer's or the
	 * grads' mapping failed */
	cr_expect_gt(copied[4], 0, "copies wait for every mapping: no overlap");
	cr_expect_gt(copied[5], copied[4]);
}

Test(wake_order, mapping_first_fails_before_any_copy)
{
	uint64_t copied[8] = { 0 };
	int failures;

	fail_each_mapping(false, copied, &failures);
	cr_expect_eq(failures, 5, "five chunks to map");
	for (int n = 1; n <= 5; n++)
		cr_expect_eq(copied[n], 0, "n %d: DORMANT_WAKE_OVERLAP=0 copied before mapping all", n);
}

Test(wake_order, a_full_device_refuses_the_wake_in_both_orders)
{
	for (int overlap = 0; overlap < 2; overlap++) {
		struct scene s = scene_new(overlap);
		struct dormant_report rep;
		struct dormant_stats *st;

		cr_assert_eq(dormant_sleep(s.m, NULL, NULL), 0);
		st = stats(s.m);
		/* another process holds all but 6 MiB: the first chunk maps */
		cr_assert_eq(dormant_debug_occupy(s.m, 0, st->devices[0].free_bytes - 6 * MiB), 0,
			     "%s", dormant_last_error());
		cr_expect_eq(dormant_wake(s.m, NULL, &rep), -ENOMEM, "overlap %d", overlap);
		cr_expect_eq(stats(s.m)->device_bytes, 0);
		/* the map-first order fails at a mapping; mapping ahead at the
		 * check of free memory: neither copied a byte */
		cr_expect_eq(rep.bytes_copied, 0, "overlap %d: copied %llu before failing", overlap,
			     (unsigned long long)rep.bytes_copied);
		cr_expect(strstr(rep.error, overlap ? "bytes free" : "mapping") != NULL, "%s",
			  rep.error);
		cr_assert_eq(dormant_debug_occupy(s.m, 0, 0), 0);
		cr_assert_eq(dormant_wake(s.m, NULL, &rep), 0, "%s", rep.error);
		expect_intact(&s);
		dormant_destroy(s.m);
	}
}

Test(times, transitions_say_where_their_time_went)
{
	for (int overlap = 0; overlap < 2; overlap++) {
		struct scene s = scene_new(overlap);
		struct dormant_report sleep, wake;
		struct dormant_stats *st;

		cr_assert_eq(dormant_sleep(s.m, NULL, &sleep), 0);
		cr_expect_gt(sleep.times.copy_s, 0);
		cr_expect_gt(sleep.times.release_s, 0, "unmapping and releasing");
		cr_expect_gt(sleep.times.host_prep_s, 0, "fresh host copies in release mode");
		cr_expect_eq(sleep.times.map_s, 0, "a sleep maps nothing");
		cr_expect_eq(sleep.times.map_wait_s, 0);
		cr_assert_eq(dormant_wake(s.m, NULL, &wake), 0);
		cr_expect_gt(wake.times.map_s, 0, "creating and mapping");
		cr_expect_gt(wake.times.copy_s, 0);
		cr_expect_eq(wake.times.release_s, 0, "a wake releases nothing");
		cr_expect_eq(wake.times.host_wait_s, 0);
		if (!overlap)
			cr_expect_eq(wake.times.map_wait_s, 0, "all mapped before the first copy");
		else
			cr_expect_gt(wake.times.map_wait_s, 0, "the copies waited for the mapper");
		st = stats(s.m);
		cr_expect_eq(memcmp(&st->last_sleep.times, &sleep.times, sizeof(sleep.times)), 0);
		cr_expect_eq(memcmp(&st->last_wake.times, &wake.times, sizeof(wake.times)), 0);
		expect_intact(&s);
		dormant_destroy(s.m);
	}
}

/* Every part of struct dormant_transition_times, by name: what
 * dormant_stats' sleep_times_total and wake_times_total sum. */
#define EACH_PART(X)                                                            \
	X(sync_s) X(host_prep_s) X(host_pin_s) X(host_wait_s) X(copy_s) X(release_s) \
	X(map_s) X(map_wait_s) X(zero_wait_s) X(comms_s) X(setup_s) X(checksum_s)     \
	X(rebuild_s) X(warmup_wait_s)

static void times_add_expected(struct dormant_transition_times *sum,
			       const struct dormant_transition_times *t)
{
#define ADD(part) sum->part += t->part;
	EACH_PART(ADD)
#undef ADD
}

static void expect_times_eq(const struct dormant_transition_times *got,
			    const struct dormant_transition_times *want, const char *kind)
{
#define EQ(part)                                                               \
	cr_expect_eq(got->part, want->part, "%s " #part ": %.17g, the reports sum to %.17g", \
		     kind, got->part, want->part);
	EACH_PART(EQ)
#undef EQ
}

/* The stats sum every part of the times of every sleep and wake that ran, a
 * failed one too, and nothing for those that changed nothing (the sums
 * /metrics exports as dormant_transition_phase_seconds_total). */
Test(times, the_stats_sum_each_part_over_every_transition)
{
	struct scene s = scene_new(true);
	struct dormant_transition_times sleeps = { 0 }, wakes = { 0 };
	struct dormant_report rep;
	struct dormant_stats *st;

	st = stats(s.m);
	expect_times_eq(&st->sleep_times_total, &sleeps, "sleep");
	expect_times_eq(&st->wake_times_total, &wakes, "wake");
	for (int round = 0; round < 2; round++) {
		cr_assert_eq(dormant_sleep(s.m, NULL, &rep), 0, "%s", rep.error);
		times_add_expected(&sleeps, &rep.times);
		cr_assert_eq(dormant_sleep(s.m, NULL, &rep), 0, "a sleep that changes nothing");
		if (round == 1) {
			cr_assert_eq(dormant_debug_inject_fault(s.m, DORMANT_FAULT_CREATE, 2, -ENOMEM,
								false), 0);
			cr_assert_eq(dormant_wake(s.m, NULL, &rep), -ENOMEM, "%s", rep.error);
			dormant_debug_inject_fault(s.m, DORMANT_FAULT_CREATE, 0, 0, false);
			cr_expect_gt(rep.times.map_s, 0, "the failed wake mapped a chunk");
			times_add_expected(&wakes, &rep.times);
		}
		cr_assert_eq(dormant_wake(s.m, NULL, &rep), 0, "%s", rep.error);
		times_add_expected(&wakes, &rep.times);
		cr_assert_eq(dormant_wake(s.m, NULL, &rep), 0, "a wake that changes nothing");
	}
	st = stats(s.m);
	expect_times_eq(&st->sleep_times_total, &sleeps, "sleep");
	expect_times_eq(&st->wake_times_total, &wakes, "wake");
	/* the parts a host backend's transitions always spend time in */
	cr_expect_gt(st->sleep_times_total.copy_s, st->last_sleep.times.copy_s);
	cr_expect_gt(st->sleep_times_total.release_s, st->last_sleep.times.release_s);
	cr_expect_gt(st->sleep_times_total.host_prep_s, st->last_sleep.times.host_prep_s);
	cr_expect_gt(st->wake_times_total.map_s, st->last_wake.times.map_s);
	cr_expect_gt(st->wake_times_total.copy_s, st->last_wake.times.copy_s);
	cr_expect_gt(st->wake_times_total.release_s, 0, "the failed wake gave back its maps");
	expect_intact(&s);
	dormant_destroy(s.m);
}

/* Several mapper threads (DORMANT_WAKE_MAP_THREADS): whichever chunk's
 * creation or mapping fails, the wake fails cleanly and the retry works. */
Test(wake_order, several_mapper_threads_fail_cleanly_and_restore_everything)
{
	static const enum dormant_fault_op ops[] = { DORMANT_FAULT_CREATE, DORMANT_FAULT_MAP };

	for (size_t o = 0; o < 2; o++)
		for (unsigned n = 1; n <= 6; n++) {
			struct scene s = scene_with(true, "4");
			uint64_t awake = stats(s.m)->device_bytes;
			struct dormant_report rep;
			int r;

			cr_assert_eq(dormant_sleep(s.m, NULL, NULL), 0, "%s", dormant_last_error());
			dormant_debug_inject_fault(s.m, ops[o], n, -ENOMEM, false);
			r = dormant_wake(s.m, NULL, &rep);
			dormant_debug_inject_fault(s.m, ops[o], 0, 0, false);
			cr_expect_eq(r, n <= 5 ? -ENOMEM : 0, "op %zu, n %u: %s", o, n, rep.error);
			if (r < 0) {
				cr_expect_eq(stats(s.m)->device_bytes, 0, "op %zu, n %u", o, n);
				cr_expect_eq(tag_stats(stats(s.m), "weights")->state, DORMANT_ASLEEP);
				cr_assert_eq(dormant_wake(s.m, NULL, &rep), 0, "retry: %s", rep.error);
			}
			cr_expect_eq(stats(s.m)->device_bytes, awake,
				     "op %zu, n %u: every chunk mapped once", o, n);
			expect_intact(&s);
			dormant_destroy(s.m);
		}
}

Test(wake_order, bad_map_thread_counts_are_refused)
{
	static const char *bad[] = { "0", "9", "two", "" };

	for (size_t i = 0; i < 3; i++) {
		struct dormant_options *o = NULL;
		struct dormant *m = NULL;

		cr_assert_eq(dormant_options_new(&o), 0);
		cr_assert_eq(dormant_options_set(o, "backend", "host"), 0);
		setenv("DORMANT_WAKE_MAP_THREADS", bad[i], 1);
		cr_expect_eq(dormant_new(o, &m), -EINVAL, "\"%s\"", bad[i]);
		dormant_options_destroy(o);
		cr_expect_null(m);
		cr_expect(strstr(dormant_last_error(), "DORMANT_WAKE_MAP_THREADS") != NULL);
	}
	unsetenv("DORMANT_WAKE_MAP_THREADS");
}
