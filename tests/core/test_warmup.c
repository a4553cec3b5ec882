/* SPDX-License-Identifier: MIT */
/*
 * The warm-up (issue 24, item 3: cold start): what the first sleep would set
 * up, done ahead of it, in the background once allocations settle or by
 * dormant_warm_up(). A later sleep uses what it prepared (no device setup, no
 * host allocation of its own), a sleep that arrives while it runs stops it
 * and waits (bytes intact), warmup=off keeps it from running, and a warm-up
 * that fails leaves the sleep to do the work. Host backend; nothing is timed.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

#define SIZE (40 * MiB) /* dedicated: 10 chunks of 4 MiB */
#define SMALL (64 * KiB)  /* in a slab */

struct scene {
	struct dormant *m;
	void *big, *small, *grads;
};

/* The scene in manager m: weights (a slab piece and a dedicated
 * allocation) kept, grads discarded, all filled. */
static struct scene scene_of(struct dormant *m)
{
	struct scene s = { .m = m };

	cr_assert_eq(dormant_set_policy(s.m, "weights", DORMANT_KEEP), 0);
	cr_assert_eq(dormant_set_policy(s.m, "grads", DORMANT_DISCARD), 0);
	/* the slab first: the big allocation's chunks are the first prepared */
	cr_assert_eq(dormant_alloc(s.m, "weights", SMALL, &s.small), 0);
	cr_assert_eq(dormant_alloc(s.m, "weights", SIZE, &s.big), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_alloc(s.m, "grads", 8 * MiB, &s.grads), 0);
	fill(s.m, s.big, SIZE, 1);
	fill(s.m, s.small, SMALL, 2);
	fill(s.m, s.grads, 8 * MiB, 3);
	return s;
}

static struct scene scene_from(const char *options)
{
	return scene_of(manager_from("%s", options));
}

static void expect_intact(struct scene *s)
{
	cr_expect(holds(s->m, s->big, SIZE, 1), "the big allocation's bytes");
	cr_expect(holds(s->m, s->small, SMALL, 2), "the small allocation's bytes");
	cr_expect(holds(s->m, s->grads, 8 * MiB, 0), "discarded memory comes back zero");
}

static void cycle(struct scene *s, struct dormant_report *ret_sleep)
{
	struct dormant_report rep;

	cr_assert_eq(dormant_sleep(s->m, NULL, ret_sleep), 0, "%s", ret_sleep->error);
	cr_assert_eq(dormant_wake(s->m, NULL, &rep), 0, "%s", rep.error);
	expect_intact(s);
}

/* Wait (up to 60 s) until the background warm-up has finished a run and
 * has nothing left to do. */
static const struct dormant_warmup_stats *warmup_settled(struct dormant *m)
{
	for (int i = 0; i < 6000; i++) {
		const struct dormant_warmup_stats *w = &stats(m)->warmup;

		if (w->runs >= 1 && w->state == DORMANT_WARMUP_IDLE)
			return w;
		usleep(10000);
	}
	cr_assert_fail("the background warm-up did not run within 60 s");
	return NULL;
}

Test(warmup, in_the_background_once_allocations_settle_and_the_sleep_uses_it)
{
	struct scene s = scene_from("host_mode=retain,chunk_bytes=4MiB,staging_bytes=8MiB,"
				    "copy_threads=2,warmup=auto,warmup_settle_ms=20");
	const struct dormant_warmup_stats *w = warmup_settled(s.m);
	uint64_t allocs, host;
	struct dormant_report rep;

	cr_expect_eq(w->failures, 0, "%s", w->last_error);
	cr_expect_eq(w->device_setups, 1, "the device was set up before any sleep");
	host = tag_stats(stats(s.m), "weights")->host_bytes;
	cr_expect_eq(host, SIZE + SMALL, "the kept tag's host copies (live bytes) are held awake");
	cr_expect_eq(stats(s.m)->warmup.host_bytes, host, "what the warm-up prepared");
	cr_expect_eq(tag_stats(stats(s.m), "grads")->host_bytes, 0, "no copy of discarded memory");
	allocs = dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC);

	cycle(&s, &rep);
	cr_expect_eq(dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC), allocs,
		     "the sleep allocated no host copy of its own");
	cr_expect_eq(rep.times.setup_s, 0, "the sleep set up no device");
	cr_expect_eq(rep.times.host_prep_s, 0);
	cr_expect_eq(rep.times.host_pin_s, 0);
	cr_expect_eq(rep.bytes_copied, SIZE + SMALL);
	cr_expect_eq(stats(s.m)->warmup.device_setups, 1);
	cr_expect_eq(tag_stats(stats(s.m), "weights")->host_bytes, host);
	dormant_destroy(s.m);
}

/* The first sleep without a warm-up sets the device up itself and allocates
 * every host copy: what the warm-up takes off it. */
Test(warmup, off_leaves_the_work_to_the_first_sleep)
{
	struct scene s = scene_from("host_mode=retain,chunk_bytes=4MiB,staging_bytes=8MiB,"
				    "copy_threads=2,warmup=off,warmup_settle_ms=0");
	struct dormant_report rep;
	uint64_t allocs;

	usleep(200000); /* time enough for a run that should not happen */
	cr_expect_eq(stats(s.m)->warmup.state, DORMANT_WARMUP_OFF);
	cr_expect_eq(stats(s.m)->warmup.runs, 0);
	cr_expect_eq(stats(s.m)->warmup.device_setups, 0);
	cr_expect_eq(tag_stats(stats(s.m), "weights")->host_bytes, 0);
	allocs = dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC);
	cycle(&s, &rep);
	cr_expect_eq(stats(s.m)->warmup.device_setups, 1, "the sleep set the device up");
	cr_expect_gt(rep.times.setup_s, 0);
	cr_expect_eq(dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC) - allocs, 11,
		     "one host copy per chunk: 10 of the big allocation, 1 of the slab");
	dormant_destroy(s.m);
}

/* dormant_warm_up() works with warmup=off too, and warmup=device never
 * prepares host copies; in release mode neither does auto (it holds none
 * awake). */
Test(warmup, device_mode_and_release_mode_hold_no_host_copies)
{
	static const char *const options[] = {
		"host_mode=retain,chunk_bytes=4MiB,copy_threads=2,warmup=device",
		"host_mode=release,chunk_bytes=4MiB,copy_threads=2,warmup=auto,"
		"warmup_settle_ms=3600000",
	};

	for (size_t i = 0; i < sizeof(options) / sizeof(options[0]); i++) {
		struct scene s = scene_from(options[i]);
		struct dormant_report rep;
		uint64_t allocs = dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC);

		cr_assert_eq(dormant_warm_up(s.m), 0, "%s: %s", options[i], dormant_last_error());
		cr_expect_eq(stats(s.m)->warmup.device_setups, 1, "%s", options[i]);
		cr_expect_eq(stats(s.m)->host_bytes, 0, "%s: no host copy awake", options[i]);
		cr_expect_eq(dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC), allocs);
		cycle(&s, &rep);
		cr_expect_eq(rep.times.setup_s, 0, "%s", options[i]);
		cr_expect_eq(stats(s.m)->warmup.device_setups, 1, "%s", options[i]);
		dormant_destroy(s.m);
	}
}

/* In reclaimable mode the warm-up prepares the host copies as a wake leaves
 * them: faulted in, unpinned and handed to the kernel (MADV_FREE), not held
 * (host_bytes 0), so that the first sleep reuses them instead of allocating
 * and faulting in fresh memory. */
Test(warmup, reclaimable_mode_prepares_reclaimable_copies_the_sleep_reuses)
{
	struct scene s = scene_from("host_mode=reclaimable,chunk_bytes=4MiB,staging_bytes=8MiB,"
				    "copy_threads=2,warmup=off");
	struct dormant_report rep;
	uint64_t allocs = dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC);

	cr_assert_eq(dormant_warm_up(s.m), 0, "%s", dormant_last_error());
	cr_expect_eq(stats(s.m)->warmup.failures, 0, "%s", stats(s.m)->warmup.last_error);
	cr_expect_eq(dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC) - allocs, 11,
		     "one host copy per chunk: 10 of the big allocation, 1 of the slab");
	cr_expect_geq(stats(s.m)->warmup.host_bytes, SIZE + SMALL, "what the warm-up prepared");
	cr_expect_eq(stats(s.m)->host_bytes, 0, "reclaimable copies are not held awake");
	allocs = dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC);
	cycle(&s, &rep);
	cr_expect_eq(dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC), allocs,
		     "the sleep reused them: no host copy of its own");
	cr_expect_eq(rep.bytes_copied, SIZE + SMALL);
	cr_expect_eq(stats(s.m)->warmup.failures, 0);
	/* and again: the wake left them reclaimable, as the warm-up did */
	cycle(&s, &rep);
	cr_expect_eq(dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC), allocs);
	dormant_destroy(s.m);
}

/* With reclaimable_pinned_bytes the warm-up leaves the copies as a wake
 * would: pinned and held while they fit, the others reclaimable. */
Test(warmup, reclaimable_mode_pins_what_its_budget_holds)
{
	struct scene s = scene_from("host_mode=reclaimable,chunk_bytes=4MiB,staging_bytes=8MiB,"
				    "copy_threads=2,warmup=off,reclaimable_pinned_bytes=10MiB");
	struct dormant_report rep;
	uint64_t allocs = dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC);

	cr_assert_eq(dormant_warm_up(s.m), 0, "%s", dormant_last_error());
	cr_expect_eq(stats(s.m)->warmup.failures, 0, "%s", stats(s.m)->warmup.last_error);
	cr_expect_eq(dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC) - allocs, 11);
	/* the slab's copy (allocated first) and two of the big allocation's */
	cr_expect_eq(stats(s.m)->host_bytes, 8 * MiB + SMALL, "pinned, held: %llu",
		     (unsigned long long)stats(s.m)->host_bytes);
	allocs = dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC);
	cycle(&s, &rep);
	cr_expect_eq(dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC), allocs,
		     "the sleep used them all");
	cr_expect_eq(rep.bytes_copied, SIZE + SMALL);
	cr_expect_eq(host_bytes_unpinned(s.m), 8 * MiB + SMALL,
		     "the wake kept the same copies pinned");
	dormant_destroy(s.m);
}

/* A warm-up whose host allocation fails: counted and said, what it did not
 * prepare is left to the sleep, which works. */
Test(warmup, a_failed_warmup_leaves_the_sleep_working)
{
	for (unsigned nth = 1; nth <= 3; nth++) {
		struct scene s = scene_from("host_mode=retain,chunk_bytes=4MiB,copy_threads=2,"
					    "warmup=off");
		const struct dormant_warmup_stats *w;
		struct dormant_report rep;
		uint64_t before;

		cr_assert_eq(dormant_debug_inject_fault(s.m, DORMANT_FAULT_HOST_ALLOC, nth, -ENOMEM,
							false), 0);
		cr_expect_eq(dormant_warm_up(s.m), -ENOMEM, "host allocation %u fails", nth);
		cr_expect(strstr(dormant_last_error(), "injected"), "%s", dormant_last_error());
		w = &stats(s.m)->warmup;
		cr_expect_eq(w->failures, 1);
		cr_expect_eq(w->last_result, -ENOMEM);
		cr_expect(strstr(w->last_error, "warm-up"), "%s", w->last_error);
		cr_expect_eq(stats(s.m)->host_bytes, (nth - 1) * 4 * MiB,
			     "the copies made before the failure are held");
		before = dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC);
		cycle(&s, &rep);
		cr_expect_eq(dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC) - before,
			     11 - (nth - 1), "the sleep made the copies the warm-up did not");
		cr_expect_eq(rep.bytes_copied, SIZE + SMALL);
		dormant_destroy(s.m);
	}
}

/* ---- a sleep while the warm-up runs ------------------------------------- */

/* The log holds the warm-up at its first chunk until the sleep says that it
 * waits for it: the sleep arrives while the warm-up runs, every time. */
struct hold {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool in_warmup, sleep_waits, released_by_sleep;
	bool release;
	int warmup_result;
	struct dormant *m;
};

static struct hold hold = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.cond = PTHREAD_COND_INITIALIZER,
};

static void hold_log(enum dormant_log_level level, const char *message, void *userdata)
{
	struct hold *h = userdata;

	(void)level;
	pthread_mutex_lock(&h->lock);
	if (strstr(message, "warm-up: preparing") && !h->in_warmup) {
		struct timespec until;

		h->in_warmup = true;
		pthread_cond_broadcast(&h->cond);
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += 60; /* never forever: a sleep that does not wait */
		while (!h->release)
			if (pthread_cond_timedwait(&h->cond, &h->lock, &until) == ETIMEDOUT)
				break;
	}
	if (strstr(message, "waiting for the warm-up")) {
		h->sleep_waits = true;
		h->released_by_sleep = !h->release;
		h->release = true;
		pthread_cond_broadcast(&h->cond);
	}
	pthread_mutex_unlock(&h->lock);
}

/* A retain-mode manager whose log holds the warm-up (hold_log), its
 * background run off: the tests start it themselves. */
static struct dormant *held_manager(void)
{
	struct dormant_options *o;
	struct dormant *m;

	cr_assert_eq(dormant_options_new(&o), 0);
	cr_assert_eq(dormant_options_parse(o, "host_mode=retain,chunk_bytes=4MiB,copy_threads=2,"
					      "warmup=off"), 0);
	cr_assert_eq(dormant_options_set_log(o, hold_log, &hold), 0);
	cr_assert_eq(dormant_new(o, &m), 0, "%s", dormant_last_error());
	dormant_options_destroy(o);
	return m;
}

static void *warm_up_thread(void *arg)
{
	struct hold *h = arg;

	h->warmup_result = dormant_warm_up(h->m);
	return NULL;
}

Test(warmup, a_sleep_while_it_runs_stops_it_and_waits)
{
	struct dormant_report rep;
	struct scene s = scene_of(held_manager());
	pthread_t thread;
	uint64_t before;

	hold.m = s.m;

	cr_assert_eq(pthread_create(&thread, NULL, warm_up_thread, &hold), 0);
	pthread_mutex_lock(&hold.lock);
	while (!hold.in_warmup)
		pthread_cond_wait(&hold.cond, &hold.lock);
	pthread_mutex_unlock(&hold.lock);
	cr_expect_eq(stats(s.m)->warmup.state, DORMANT_WARMUP_RUNNING);
	before = dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC);

	/* the warm-up is inside its first chunk: this sleep must wait for it */
	cr_assert_eq(dormant_sleep(s.m, NULL, &rep), 0, "%s", rep.error);
	pthread_join(thread, NULL);
	cr_expect(hold.sleep_waits, "the sleep waited for the warm-up");
	cr_expect(hold.released_by_sleep, "the warm-up was still held when the sleep came");
	cr_expect_eq(hold.warmup_result, -ECANCELED, "the sleep stopped the warm-up");
	cr_expect_eq(stats(s.m)->warmup.cancelled, 1);
	cr_expect_eq(stats(s.m)->warmup.host_bytes, 4 * MiB,
		     "it finished the chunk it was on, and no other");
	cr_expect_geq(rep.times.warmup_wait_s, 0);
	cr_expect_eq(dormant_debug_op_count(s.m, DORMANT_FAULT_HOST_ALLOC) - before, 1 + 10,
		     "the warm-up's one copy (held before it allocated), then the sleep's "
		     "other ten: it used the finished one");
	cr_expect_eq(rep.bytes_copied, SIZE + SMALL);
	cr_assert_eq(dormant_wake(s.m, NULL, &rep), 0, "%s", rep.error);
	expect_intact(&s);
	/* and a later warm-up finds nothing left to do */
	cr_expect_eq(dormant_warm_up(s.m), 0, "%s", dormant_last_error());
	cr_expect_eq(stats(s.m)->warmup.host_bytes, 4 * MiB);
	dormant_destroy(s.m);
}

/* An allocation freed while the warm-up prepares its host copy goes when
 * the warm-up is done with it: nothing leaks, nothing is used after free. */
static void *free_thread(void *arg)
{
	struct scene *s = arg;

	cr_expect_eq(dormant_free(s->m, s->big), 0);
	pthread_mutex_lock(&hold.lock);
	hold.release = true;
	pthread_cond_broadcast(&hold.cond);
	pthread_mutex_unlock(&hold.lock);
	return NULL;
}

Test(warmup, a_free_while_it_prepares_waits_for_the_chunk)
{
	struct scene s = { .m = held_manager() };
	pthread_t warm, freer;

	cr_assert_eq(dormant_set_policy(s.m, "weights", DORMANT_KEEP), 0);
	cr_assert_eq(dormant_alloc(s.m, "weights", SMALL, &s.small), 0);
	cr_assert_eq(dormant_alloc(s.m, "weights", SIZE, &s.big), 0);
	fill(s.m, s.small, SMALL, 2);
	hold.m = s.m;

	cr_assert_eq(pthread_create(&warm, NULL, warm_up_thread, &hold), 0);
	pthread_mutex_lock(&hold.lock);
	while (!hold.in_warmup)
		pthread_cond_wait(&hold.cond, &hold.lock);
	pthread_mutex_unlock(&hold.lock);
	/* the free returns at once (deferred), then lets the warm-up go on */
	cr_assert_eq(pthread_create(&freer, NULL, free_thread, &s), 0);
	pthread_join(freer, NULL);
	pthread_join(warm, NULL);
	cr_expect_eq(hold.warmup_result, 0, "%s", dormant_last_error());
	cr_expect_eq(tag_stats(stats(s.m), "weights")->allocations, 1);
	cr_expect_eq(stats(s.m)->host_bytes, SMALL, "only the slab's host copy is held");
	expect_no_device_leak(s.m);
	cr_expect(holds(s.m, s.small, SMALL, 2));
	dormant_destroy(s.m);
}
