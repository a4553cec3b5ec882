/* SPDX-License-Identifier: MIT */
/*
 * Host copies off the wake's and the sleep's critical paths (issue 24):
 *  - reclaimable mode unpins a wake's host copies on a worker, after the
 *    wake returned; whatever touches such a buffer next (the next sleep, a
 *    free, the manager's end, a host-mode switch) waits for its unpin;
 *  - a sleep registers each host copy piece by piece, just ahead of its
 *    copies; a pin that fails part way sends the copy through the staging
 *    ring, from its start, and loses nothing;
 *  - the warm-up's pin_threads threads pin the pieces of one host copy at
 *    once; a pin that fails on one of them leaves nothing pinned.
 * The log holds an unpin (its first debug line) until something says that
 * it waits for it: the unpin is pending at that moment, every time. Host
 * backend only (DORMANT_HOST_PIN_FAIL, its check of memory pinned twice and
 * of ranges left pinned at the end).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

#define CHUNK (4 * MiB)
#define SIZE (3 * CHUNK) /* three chunks: three unpins, three host copies */
#define HOLD_S 20        /* an unpin nobody waits for goes on after this */

struct hold {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool hold_next;   /* hold the next unpin that starts */
	bool held;        /* one is held now */
	bool timed_out;   /* nobody came for the held one */
	bool waited;      /* something said that it waits for an unpin */
	bool released_by_wait; /* ... while one was held */
	bool closing_waited;   /* something said that it waits for disk closings */
	bool release;
	unsigned warnings;
	char warning[512];
};

static struct hold hold = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.cond = PTHREAD_COND_INITIALIZER,
};

static void hold_log(enum dormant_log_level level, const char *message, void *userdata)
{
	struct hold *h = userdata;
	bool waiting = strstr(message, "waiting for");
	bool closing = waiting && strstr(message, "closing");

	pthread_mutex_lock(&h->lock);
	if (level <= DORMANT_LOG_WARNING) {
		h->warnings++;
		snprintf(h->warning, sizeof(h->warning), "%s", message);
	}
	h->closing_waited |= closing;
	if (closing || (waiting && strstr(message, "unpin"))) {
		h->waited = true;
		/* the held one, or (later) another still running */
		h->released_by_wait |= h->held;
		h->release = true;
		pthread_cond_broadcast(&h->cond);
	}
	if (strstr(message, "unpinning a") && h->hold_next) {
		struct timespec until;

		h->hold_next = false;
		h->held = true;
		h->release = false;
		pthread_cond_broadcast(&h->cond);
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += HOLD_S; /* never forever: a caller that does not wait */
		while (!h->release)
			if (pthread_cond_timedwait(&h->cond, &h->lock, &until) == ETIMEDOUT) {
				h->timed_out = true;
				break;
			}
		h->held = false;
		pthread_cond_broadcast(&h->cond);
	}
	pthread_mutex_unlock(&h->lock);
}

/* Hold the next unpin; the flags of the last one cleared. */
static void hold_arm(void)
{
	pthread_mutex_lock(&hold.lock);
	hold.hold_next = true;
	hold.waited = hold.released_by_wait = hold.timed_out = hold.closing_waited = false;
	pthread_mutex_unlock(&hold.lock);
}

/* Wait until an unpin is held (or was, and timed out). */
static bool hold_reached(void)
{
	bool held;

	pthread_mutex_lock(&hold.lock);
	while (hold.hold_next)
		pthread_cond_wait(&hold.cond, &hold.lock);
	held = hold.held;
	pthread_mutex_unlock(&hold.lock);
	return held;
}

static unsigned warnings(void)
{
	unsigned n;

	pthread_mutex_lock(&hold.lock);
	n = hold.warnings;
	pthread_mutex_unlock(&hold.lock);
	return n;
}

/* A manager with options text, its log hold_log; no warm-up. */
static struct dormant *held_manager(const char *text)
{
	struct dormant_options *o;
	struct dormant *m;

	cr_assert_eq(dormant_options_new(&o), 0);
	cr_assert_eq(dormant_options_parse(o, "chunk_bytes=4MiB,staging_bytes=8MiB,copy_threads=2,"
					      "pin_piece_bytes=1MiB,warmup=off"), 0);
	cr_assert_eq(dormant_options_parse(o, text), 0, "%s: %s", text, dormant_last_error());
	cr_assert_eq(dormant_options_set_log(o, hold_log, &hold), 0);
	cr_assert_eq(dormant_new(o, &m), 0, "%s", dormant_last_error());
	dormant_options_destroy(o);
	return m;
}

static void *kept_alloc(struct dormant *m, size_t size, uint64_t seed)
{
	void *p;

	cr_assert_eq(dormant_set_policy(m, "weights", DORMANT_KEEP), 0);
	cr_assert_eq(dormant_alloc(m, "weights", size, &p), 0, "%s", dormant_last_error());
	fill(m, p, size, seed);
	return p;
}

/* Sleep, then wake with the next unpin held; returns once it is held. */
static void cycle_held(struct dormant *m)
{
	struct dormant_report rep;

	cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "%s", rep.error);
	hold_arm();
	cr_assert_eq(dormant_wake(m, NULL, &rep), 0, "%s", rep.error);
	cr_assert(hold_reached(), "an unpin started after the wake");
}

static void expect_clean_end(struct dormant *m)
{
	expect_no_device_leak(m);
	dormant_destroy(m);
	/* the host backend says what stays pinned at the end */
	cr_expect_eq(warnings(), 0, "last warning: %s", hold.warning);
}

/* ---- reclaimable: the unpin after the wake ------------------------------ */

Test(reclaim, the_wake_returns_before_the_unpin_and_the_next_sleep_waits_for_it)
{
	struct dormant *m = held_manager("host_mode=reclaimable,pin_threads=4");
	void *p = kept_alloc(m, SIZE, 1);

	for (uint64_t cycle = 0; cycle < 3; cycle++) {
		struct dormant_report rep;

		cycle_held(m);
		/* the wake is back while an unpin waits in the log */
		pthread_mutex_lock(&hold.lock);
		cr_expect(hold.held && !hold.timed_out,
			  "cycle %llu: the wake returned before its unpin ran",
			  (unsigned long long)cycle);
		pthread_mutex_unlock(&hold.lock);
		cr_expect(holds(m, p, SIZE, 1 + cycle), "cycle %llu", (unsigned long long)cycle);
		/* pinned until unpinned: still counted */
		cr_expect_geq(stats(m)->host_bytes, CHUNK, "the held unpin's copy is still held");
		fill(m, p, SIZE, 2 + cycle);
		/* the sleep reuses the buffers: it must wait for the held unpin */
		cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "%s", rep.error);
		pthread_mutex_lock(&hold.lock);
		cr_expect(hold.waited && hold.released_by_wait,
			  "cycle %llu: the sleep waited for the unpin", (unsigned long long)cycle);
		cr_expect(!hold.timed_out);
		pthread_mutex_unlock(&hold.lock);
		cr_assert_eq(dormant_wake(m, NULL, &rep), 0, "%s", rep.error);
		cr_expect(holds(m, p, SIZE, 2 + cycle), "cycle %llu: the data came back",
			  (unsigned long long)cycle);
		cr_expect_eq(host_bytes_settled(m, 0), 0, "cycle %llu: unpinned, not held",
			     (unsigned long long)cycle);
	}
	expect_clean_end(m);
}

Test(reclaim, a_free_while_the_unpin_is_pending_waits_for_it)
{
	struct dormant *m = held_manager("host_mode=reclaimable,pin_threads=4");
	void *p = kept_alloc(m, SIZE, 3);
	void *other = NULL;

	cycle_held(m);
	cr_assert_eq(dormant_free(m, p), 0, "%s", dormant_last_error());
	pthread_mutex_lock(&hold.lock);
	cr_expect(hold.waited && hold.released_by_wait, "the free waited for the unpin");
	pthread_mutex_unlock(&hold.lock);
	cr_expect_eq(host_bytes_settled(m, 0), 0);
	/* the memory goes on being used as before */
	cr_assert_eq(dormant_alloc(m, "weights", SIZE, &other), 0);
	fill(m, other, SIZE, 4);
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
		cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	}
	cr_expect(holds(m, other, SIZE, 4));
	expect_clean_end(m);
}

Test(reclaim, the_end_of_the_manager_waits_for_a_pending_unpin)
{
	struct dormant *m = held_manager("host_mode=reclaimable");

	kept_alloc(m, SIZE, 5);
	cycle_held(m);
	dormant_destroy(m);
	pthread_mutex_lock(&hold.lock);
	cr_expect(hold.waited && hold.released_by_wait, "the end waited for the unpin");
	pthread_mutex_unlock(&hold.lock);
	cr_expect_eq(warnings(), 0, "last warning: %s", hold.warning);
}

/* A wake removes its disk copies at once and a worker closes their files:
 * the next sleep that makes disk copies waits for those closings first (a
 * full disk would refuse it for space still being freed). One worker, held
 * in the wake's unpin, keeps the closing queued behind it. */
Test(reclaim, a_sleep_that_makes_disk_copies_waits_for_the_last_wakes_closings)
{
	static const char *const cold[] = { "cold", NULL };
	char dir[] = "/tmp/dormant-reclaim-XXXXXX", options[256];
	struct dormant_report rep;
	struct dormant *m;
	void *p;

	cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
	snprintf(options, sizeof(options), "host_mode=reclaimable,copy_threads=1,disk_dir=%s",
		 dir);
	m = held_manager(options);
	kept_alloc(m, SIZE, 9);
	cr_assert_eq(dormant_set_policy(m, "cold", DORMANT_DISK), 0);
	cr_assert_eq(dormant_alloc(m, "cold", CHUNK, &p), 0, "%s", dormant_last_error());
	fill(m, p, CHUNK, 10);

	cycle_held(m); /* the one worker holds an unpin; the closing waits behind it */
	cr_expect_eq(tag_stats(stats(m), "cold")->disk_bytes, 0, "the copy is gone at the wake");
	fill(m, p, CHUNK, 11);
	cr_assert_eq(dormant_sleep(m, cold, &rep), 0, "%s", rep.error);
	pthread_mutex_lock(&hold.lock);
	cr_expect(hold.closing_waited && hold.released_by_wait,
		  "the sleep waited for the last wake's closing, the worker still held");
	cr_expect(!hold.timed_out);
	pthread_mutex_unlock(&hold.lock);
	cr_expect_eq(tag_stats(stats(m), "cold")->disk_bytes, CHUNK);
	cr_assert_eq(dormant_wake(m, cold, &rep), 0, "%s", rep.error);
	cr_expect(holds(m, p, CHUNK, 11));
	expect_clean_end(m);
	rmdir(dir);
}

Test(reclaim, a_host_mode_switch_waits_for_pending_unpins)
{
	struct dormant *m = held_manager("host_mode=reclaimable");
	void *p = kept_alloc(m, SIZE, 6);

	cycle_held(m);
	cr_assert_eq(dormant_set_host_mode(m, DORMANT_HOST_RETAIN), 0, "%s",
		     dormant_last_error());
	pthread_mutex_lock(&hold.lock);
	cr_expect(hold.waited && hold.released_by_wait, "the switch waited for the unpin");
	pthread_mutex_unlock(&hold.lock);
	cr_expect_eq(host_bytes_settled(m, 0), 0, "the unpinned copies are not held");
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
		cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
		cr_expect(holds(m, p, SIZE, 6));
		cr_expect_geq(stats(m)->host_bytes, SIZE, "retain keeps them again");
	}
	expect_clean_end(m);
}

/* ---- pin_threads -------------------------------------------------------- */

/* A kept allocation of three chunks and an odd one (its last piece short),
 * cycled in mode on pin_threads threads. A sleep registers its host copies
 * piece by piece on its own thread; pin_threads serves the warm-up, which
 * prepares retain mode's copies ahead (dormant_warm_up(), called here).
 * wake_copy=kernel: the simulated copy kernel reads only memory pinned in
 * one range, so a wake of a piece left unpinned fails. The copies never
 * went through the staging ring. */
static void pin_cycles(const char *mode, int threads, uint64_t *ret_copied)
{
	struct dormant *m;
	struct dormant_report rep;
	char text[128];
	void *p, *odd;

	snprintf(text, sizeof(text), "host_mode=%s,pin_threads=%d,wake_copy=kernel", mode, threads);
	m = held_manager(text);
	p = kept_alloc(m, SIZE, 7);
	cr_assert_eq(dormant_alloc(m, "weights", 3 * MiB + 4096, &odd), 0);
	fill(m, odd, 3 * MiB + 4096, 8);
	if (strcmp(mode, "retain") == 0) {
		cr_assert_eq(dormant_warm_up(m), 0, "%s", dormant_last_error());
		cr_expect_geq(stats(m)->host_bytes, SIZE + 3 * MiB + 4096, "the warm-up's copies");
	}
	*ret_copied = 0;
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "%s %d: %s", mode, threads, rep.error);
		*ret_copied += rep.bytes_copied;
		cr_assert_eq(dormant_wake(m, NULL, &rep), 0, "%s %d: %s", mode, threads, rep.error);
		cr_expect(holds(m, p, SIZE, 7), "%s, %d threads", mode, threads);
		cr_expect(holds(m, odd, 3 * MiB + 4096, 8), "%s, %d threads", mode, threads);
		fill(m, p, SIZE, 7); /* retain mode copies it again */
	}
	cr_expect_eq(stats(m)->staging_bytes, 0, "%s, %d threads: every copy pinned", mode,
		     threads);
	expect_clean_end(m);
}

Test(reclaim, one_and_four_pin_threads_move_the_same_bytes)
{
	static const char *const modes[] = { "release", "retain", "reclaimable" };

	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		uint64_t one, four;

		pin_cycles(modes[i], 1, &one);
		pin_cycles(modes[i], 4, &four);
		cr_expect_eq(one, four, "%s: %llu bytes copied on one thread, %llu on four", modes[i],
			     (unsigned long long)one, (unsigned long long)four);
		/* retain mode copies unchanged chunks once */
		cr_expect_geq(one, SIZE + 3 * MiB, "%s", modes[i]);
	}
}

/* The nth pin fails (repeat: and every later one). The sleep registers each
 * host copy piece by piece just ahead of its copies (pipeline.c), so a pin
 * fails part way through a copy: a single failure sends that copy, from its
 * start, through the staging ring; a lasting one fails the sleep (the ring
 * cannot be pinned either), which rolls back. Either way nothing stays
 * pinned and nothing is lost. Returns whether a pin failed (false: the
 * sleep pins fewer than nth times). */
static bool pin_fails_at(unsigned nth, bool repeat)
{
	struct dormant_report rep;
	char value[16];
	struct dormant *m;
	bool failed;
	void *p, *odd;
	int r;

	snprintf(value, sizeof(value), "%u%s", nth, repeat ? "+" : "");
	setenv("DORMANT_HOST_PIN_FAIL", value, 1);
	m = held_manager("host_mode=release,pin_threads=4");
	unsetenv("DORMANT_HOST_PIN_FAIL");
	p = kept_alloc(m, SIZE, 9);
	cr_assert_eq(dormant_alloc(m, "weights", 3 * MiB + 4096, &odd), 0);
	fill(m, odd, 3 * MiB + 4096, 10);
	r = dormant_sleep(m, NULL, &rep);
	failed = warnings() > 0;
	if (repeat && failed) {
		cr_expect_lt(r, 0, "pin %s: the ring could not be pinned either", value);
		expect_all(m, DORMANT_AWAKE);
	} else {
		cr_expect_eq(r, 0, "pin %s: %s", value, rep.error);
		/* a copy begun pinned and redone through the ring counts once */
		cr_expect_eq(rep.bytes_copied, SIZE + 3 * MiB + 4096, "pin %s: %llu bytes copied",
			     value, (unsigned long long)rep.bytes_copied);
		cr_expect_eq(stats(m)->staging_bytes > 0, failed,
			     "pin %s: a copy went unpinned, through the ring", value);
		cr_assert_eq(dormant_wake(m, NULL, &rep), 0, "%s", rep.error);
		pthread_mutex_lock(&hold.lock);
		cr_expect_eq(hold.warnings, failed, "pin %s: said once", value);
		cr_expect(!failed || strstr(hold.warning, "DORMANT_HOST_PIN_FAIL") != NULL, "%s",
			  hold.warning);
		pthread_mutex_unlock(&hold.lock);
	}
	cr_expect(holds(m, p, SIZE, 9), "pin %s", value);
	cr_expect(holds(m, odd, 3 * MiB + 4096, 10), "pin %s", value);
	cr_expect_eq(host_bytes_settled(m, 0), 0, "pin %s", value);
	pthread_mutex_lock(&hold.lock);
	hold.warnings = 0; /* the failure's own: only the end's count now */
	pthread_mutex_unlock(&hold.lock);
	expect_clean_end(m);
	return failed;
}

/* The warm-up pins retain mode's host copies on four threads; its nth pin
 * fails. That copy's other pieces are unpinned again (the host backend says
 * what stays pinned at the end, and a piece pinned twice fails), the sleep
 * makes its own copy, and nothing is lost. Returns whether a pin failed. */
static bool warm_up_pin_fails_at(unsigned nth)
{
	struct dormant *m;
	char value[16];
	bool failed;
	void *p;
	int r;

	snprintf(value, sizeof(value), "%u", nth);
	setenv("DORMANT_HOST_PIN_FAIL", value, 1);
	m = held_manager("host_mode=retain,pin_threads=4");
	unsetenv("DORMANT_HOST_PIN_FAIL");
	p = kept_alloc(m, SIZE, 11);
	r = dormant_warm_up(m);
	failed = r < 0 || warnings() > 0;
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "pin %s: %s", value, dormant_last_error());
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "pin %s: %s", value, dormant_last_error());
	cr_expect(holds(m, p, SIZE, 11), "pin %s", value);
	pthread_mutex_lock(&hold.lock);
	hold.warnings = 0; /* the failure's own: only the end's count now */
	pthread_mutex_unlock(&hold.lock);
	expect_clean_end(m);
	return failed;
}

Test(reclaim, a_pin_failing_in_the_warm_up_on_one_of_four_threads_loses_nothing)
{
	unsigned nth;

	for (nth = 1; nth < 64 && warm_up_pin_fails_at(nth); nth++)
		;
	/* three chunks of four 1 MiB pieces: each failed once */
	cr_expect_gt(nth, 12, "the warm-up pins more than %u pieces", nth - 1);
}

Test(reclaim, a_pin_failing_on_one_of_several_threads_loses_nothing)
{
	unsigned nth;

	for (nth = 1; nth < 64 && pin_fails_at(nth, false); nth++)
		pin_fails_at(nth, true);
	/* three chunks of four 1 MiB pieces and the odd one's: every one failed once */
	cr_expect_gt(nth, 12, "a sleep pins more than %u pieces", nth - 1);
}
