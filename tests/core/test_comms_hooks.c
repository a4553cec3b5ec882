/* SPDX-License-Identifier: MIT */
/*
 * The communicators' hook points (issue 21): DORMANT_HOOK_AFTER_COPIES runs
 * once a sleep's copies and releases are done, DORMANT_HOOK_BEFORE_REBUILD
 * once a wake's memory is restored and before any rebuild callback (which
 * may gather over the communicators those hooks resume). Their time is the
 * report's times.comms_s, and a failing one fails the transition with its
 * reason, the tags asleep and intact. Host backend; public API only.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dormant.h"
#include "helpers.h"

static const size_t W_SIZE = 5 * MiB + 17, B_SIZE = 2 * MiB;

struct probe {
	struct dormant *m;
	void *w, *b;
	char events[16][32];
	int count;
	int fail_point;    /* -1: none */
	const char *reason; /* what the failing hook says, or NULL */
	bool sleep_ms;     /* each comms hook sleeps 2 ms */
};

static void note(struct probe *p, const char *what)
{
	cr_assert_lt(p->count, 16);
	snprintf(p->events[p->count++], sizeof(p->events[0]), "%s", what);
}

static const struct dormant_tag_stats *weights_now(struct probe *p)
{
	return tag_stats(stats(p->m), "weights");
}

static int hook(struct dormant *m, enum dormant_hook_point point, void *userdata)
{
	static const char *const names[] = { "before-sleep", "after-sleep", "before-wake",
					     "after-wake", "after-copies", "before-rebuild" };
	struct probe *p = userdata;

	cr_assert_eq(m, p->m);
	note(p, names[point]);
	if (point == DORMANT_HOOK_AFTER_COPIES) {
		/* the copies are done: nothing of the tag is on the device */
		cr_expect_eq(weights_now(p)->device_bytes, 0);
		cr_expect_geq(weights_now(p)->host_bytes, W_SIZE);
	}
	if (point == DORMANT_HOOK_BEFORE_REBUILD) {
		/* the memory is mapped again (the rebuild comes after) */
		cr_expect_geq(weights_now(p)->device_bytes, W_SIZE);
	}
	if (p->sleep_ms && (point == DORMANT_HOOK_AFTER_COPIES ||
			    point == DORMANT_HOOK_BEFORE_REBUILD))
		nanosleep(&(struct timespec){ .tv_nsec = 2000000 }, NULL);
	if ((int)point == p->fail_point) {
		if (p->reason)
			dormant_hook_set_error(p->reason);
		return 1;
	}
	return 0;
}

static int rebuild(struct dormant *m, const char *tag, void *userdata)
{
	struct probe *p = userdata;

	note(p, "rebuild");
	fill(m, p->b, B_SIZE, 32);
	(void)tag;
	return 0;
}

static struct probe *probe_new(void)
{
	static struct probe p;

	memset(&p, 0, sizeof(p));
	p.fail_point = -1;
	p.reason = "communicator 'dp' timed out";
	p.m = manager();
	cr_assert_eq(dormant_set_rebuild(p.m, "bf16", rebuild, &p), 0);
	cr_assert_eq(dormant_set_policy(p.m, "bf16", DORMANT_REBUILD), 0);
	cr_assert_eq(dormant_alloc(p.m, "weights", W_SIZE, &p.w), 0);
	cr_assert_eq(dormant_alloc(p.m, "bf16", B_SIZE, &p.b), 0);
	fill(p.m, p.w, W_SIZE, 31);
	fill(p.m, p.b, B_SIZE, 32);
	for (int point = 0; point <= DORMANT_HOOK_BEFORE_REBUILD; point++)
		cr_assert_gt(dormant_hook_add(p.m, point, hook, &p), 0);
	return &p;
}

static void expect_events(struct probe *p, const char *const *want, int count)
{
	cr_expect_eq(p->count, count, "%d events, want %d", p->count, count);
	for (int i = 0; i < count && i < p->count; i++)
		cr_expect_str_eq(p->events[i], want[i], "event %d", i);
}

Test(comms_hooks, after_the_copies_and_before_the_rebuilds)
{
	struct probe *p = probe_new();
	static const char *const want[] = {
		"before-sleep", "after-copies", "after-sleep",
		"before-wake", "before-rebuild", "rebuild", "after-wake",
	};

	cr_assert_eq(dormant_sleep(p->m, NULL, NULL), 0);
	cr_assert_eq(dormant_wake(p->m, NULL, NULL), 0);
	expect_events(p, want, 7);
	cr_expect(holds(p->m, p->w, W_SIZE, 31));
	cr_expect(holds(p->m, p->b, B_SIZE, 32));
	dormant_destroy(p->m);
}

Test(comms_hooks, their_time_is_comms_s)
{
	struct probe *p = probe_new();
	struct dormant_report rep;

	p->sleep_ms = true;
	cr_assert_eq(dormant_sleep(p->m, NULL, &rep), 0);
	cr_expect_geq(rep.times.comms_s, 0.002);
	cr_expect_geq(stats(p->m)->last_sleep.times.comms_s, 0.002);
	cr_assert_eq(dormant_wake(p->m, NULL, &rep), 0);
	cr_expect_geq(rep.times.comms_s, 0.002);
	cr_expect_geq(stats(p->m)->wake_times_total.comms_s, 0.002);
	dormant_destroy(p->m);
}

Test(comms_hooks, a_failing_after_copies_hook_fails_the_sleep_and_keeps_it_asleep)
{
	struct probe *p = probe_new();
	struct dormant_report rep;

	p->fail_point = DORMANT_HOOK_AFTER_COPIES;
	cr_assert_eq(dormant_sleep(p->m, NULL, &rep), -ECANCELED);
	cr_expect(strstr(rep.error, "after-copies hook failed") != NULL, "%s", rep.error);
	cr_expect(strstr(rep.error, "communicator 'dp' timed out") != NULL, "%s", rep.error);
	cr_expect(strstr(dormant_last_error(), "communicator 'dp'") != NULL);
	expect_all(p->m, DORMANT_ASLEEP);
	cr_expect_eq(p->count, 2, "after-sleep does not run for a failed sleep");
	cr_expect_eq(stats(p->m)->last_sleep.result, -ECANCELED);

	/* a wake completes it, every kept byte there */
	p->fail_point = -1;
	cr_assert_eq(dormant_wake(p->m, NULL, NULL), 0);
	expect_all(p->m, DORMANT_AWAKE);
	cr_expect(holds(p->m, p->w, W_SIZE, 31));
	cr_expect(holds(p->m, p->b, B_SIZE, 32));
	dormant_destroy(p->m);
}

Test(comms_hooks, a_failing_before_rebuild_hook_fails_the_wake_and_a_retry_works)
{
	struct probe *p = probe_new();
	struct dormant_report rep;
	static const char *const want[] = {
		"before-sleep", "after-copies", "after-sleep", "before-wake", "before-rebuild",
		"before-wake", "before-rebuild", "rebuild", "after-wake",
	};

	cr_assert_eq(dormant_sleep(p->m, NULL, NULL), 0);
	p->fail_point = DORMANT_HOOK_BEFORE_REBUILD;
	cr_assert_eq(dormant_wake(p->m, NULL, &rep), -ECANCELED);
	cr_expect(strstr(rep.error, "before-rebuild hook failed") != NULL, "%s", rep.error);
	cr_expect(strstr(rep.error, "communicator 'dp' timed out") != NULL, "%s", rep.error);
	expect_all(p->m, DORMANT_ASLEEP);
	cr_expect_eq(weights_now(p)->device_bytes, 0, "what the wake mapped is given back");
	expect_no_device_leak(p->m);

	p->fail_point = -1;
	cr_assert_eq(dormant_wake(p->m, NULL, NULL), 0);
	expect_events(p, want, 9);
	cr_expect(holds(p->m, p->w, W_SIZE, 31));
	cr_expect(holds(p->m, p->b, B_SIZE, 32));
	dormant_destroy(p->m);
}

Test(comms_hooks, a_failed_hook_without_a_reason_says_so)
{
	struct probe *p = probe_new();
	struct dormant_report rep;

	p->fail_point = DORMANT_HOOK_AFTER_COPIES;
	p->reason = NULL;
	/* a failed sleep before this one must not lend it its message */
	cr_assert_eq(dormant_hook_set_error("stale"), 0);
	cr_assert_eq(dormant_hook_set_error(NULL), -EINVAL);
	cr_assert_eq(dormant_sleep(p->m, NULL, &rep), -ECANCELED);
	cr_expect(strstr(rep.error, "(it returned 1)") != NULL, "%s", rep.error);
	cr_expect(strstr(rep.error, "stale") == NULL, "%s", rep.error);
	dormant_destroy(p->m);
}

Test(comms_hooks, unknown_points_are_refused)
{
	struct dormant *m = manager();
	struct probe p = { .m = m };

	cr_expect_eq(dormant_hook_add(m, DORMANT_HOOK_BEFORE_REBUILD + 1, hook, &p), -EINVAL);
	dormant_destroy(m);
}
