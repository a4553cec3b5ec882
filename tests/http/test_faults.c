/* SPDX-License-Identifier: MIT */
/* The fault switch (the faults option; never $DORMANT_FAULTS): device
 * faults rehearsed over HTTP, nothing lost, never hidden. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

TestSuite(faults, .timeout = 60);

static void post_expect(struct fixture *f, const char *path, long status, const char *slug)
{
	struct http_response r;

	http_post(f, path, NULL, &r);
	if (slug)
		assert_problem(&r, status, slug);
	else
		cr_assert_eq(r.status, status, "%s: %ld %s", path, r.status, r.body);
	http_response_free(&r);
}

/* The next wake's first memory creation fails as if the memory were taken:
 * 503, the tags stay asleep, and the wake after it works (one firing). */
Test(faults, wake_create_fails_once)
{
	struct fixture_config config = { .server = { .faults = "wake:create" } };
	struct fixture f;

	fixture_start(&f, &config);
	post_expect(&f, "/sleep", 200, NULL);
	post_expect(&f, "/wake", 503, "out-of-memory");
	cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
	post_expect(&f, "/wake", 200, NULL);
	cr_assert(weights_intact(&f));
	cr_assert(grads_zero(&f));
	/* fired once: later cycles work */
	post_expect(&f, "/sleep", 200, NULL);
	post_expect(&f, "/wake", 200, NULL);
	fixture_stop(&f);
}

/* Every sleep's first copy fails with EIO: 500, rolled back, weights kept. */
Test(faults, sleep_copy_fails_every_time)
{
	struct fixture_config config = { .server = { .faults = "sleep:copy:1:EIO:0" } };
	struct fixture f;

	fixture_start(&f, &config);
	for (int i = 0; i < 3; i++) {
		post_expect(&f, "/sleep", 500, "device-error");
		cr_assert_str_eq(tag_state(&f, "weights"), "awake");
		cr_assert(weights_intact(&f));
	}
	fixture_stop(&f);
}

/* A map fault for "any" transition fires at the wake (a sleep maps
 * nothing), twice, then stops. */
Test(faults, any_map_fires_where_maps_happen)
{
	struct fixture_config config = { .server = { .faults = "any:map:1:ENOMEM:2" } };
	struct fixture f;

	fixture_start(&f, &config);
	post_expect(&f, "/sleep", 200, NULL);
	post_expect(&f, "/wake", 503, "out-of-memory");
	post_expect(&f, "/wake", 503, "out-of-memory");
	post_expect(&f, "/wake", 200, NULL);
	cr_assert(weights_intact(&f));
	fixture_stop(&f);
}

/* A wake rule leaves sleeps alone: the sleep's copies work, the wake's
 * first copy back fails (500, the tags stay asleep, the host copy kept). */
Test(faults, wake_copy_leaves_sleeps_alone)
{
	struct fixture_config config = { .server = { .faults = "wake:copy" } };
	struct fixture f;

	fixture_start(&f, &config);
	post_expect(&f, "/sleep", 200, NULL);
	post_expect(&f, "/wake", 500, "device-error");
	cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
	post_expect(&f, "/wake", 200, NULL);
	cr_assert(weights_intact(&f));
	fixture_stop(&f);
}

/* Faults stay inside transitions: a rule whose call did not come in its
 * wake does not hit the trainer's own allocations afterwards. */
Test(faults, unfired_rule_does_not_outlive_its_transition)
{
	struct fixture_config config = { .server = { .faults = "wake:create:100" } };
	struct fixture f;
	uint64_t start;

	fixture_start(&f, &config);
	post_expect(&f, "/sleep", 200, NULL);
	post_expect(&f, "/wake", 200, NULL);
	start = dormant_debug_op_count(f.m, DORMANT_FAULT_CREATE);
	cr_assert_lt(start, 100, "the wake made the call the rule waits for: the test proves "
				 "nothing");
	/* past the 100th creation since the wake began, with allocations of the
	 * trainer's own */
	for (int i = 0; i < 1000 && dormant_debug_op_count(f.m, DORMANT_FAULT_CREATE) - start <= 100;
	     i++) {
		void *p = NULL;

		cr_assert_eq(dormant_alloc(f.m, "extra", 4096, &p), 0, "allocation %d: %s", i,
			     dormant_last_error());
		cr_assert_eq(dormant_free(f.m, p), 0);
	}
	cr_assert_gt(dormant_debug_op_count(f.m, DORMANT_FAULT_CREATE) - start, 100);
	fixture_stop(&f);
}

/* $DORMANT_FAULTS arms nothing: an inherited variable must not make a
 * trainer's sleeps fail (issue 25); only the faults option does. */
Test(faults, never_from_the_environment)
{
	struct fixture_config on = { .server = { .faults = "wake:create" } };
	struct fixture f;

	cr_assert_eq(setenv("DORMANT_FAULTS", "wake:create", 1), 0);
	fixture_start(&f, NULL);
	post_expect(&f, "/sleep", 200, NULL);
	post_expect(&f, "/wake", 200, NULL);
	fixture_stop(&f);
	unsetenv("DORMANT_FAULTS");
	/* the option does */
	fixture_start(&f, &on);
	post_expect(&f, "/sleep", 200, NULL);
	post_expect(&f, "/wake", 503, "out-of-memory");
	fixture_stop(&f);
}

/* Armed faults are never hidden: /stats and /metrics say so. */
Test(faults, armed_shows_in_stats_and_metrics)
{
	struct fixture_config on = { .server = { .faults = "any:copy:2:EIO:0" } };
	struct fixture f;
	struct http_response r;
	json_t *doc, *faults;

	fixture_start(&f, &on);
	http_get(&f, "/stats", &r);
	doc = http_json(&r);
	http_response_free(&r);
	faults = json_object_get(doc, "faults");
	cr_assert(json_is_true(json_object_get(faults, "armed")));
	cr_expect_str_eq(json_string_value(json_object_get(faults, "rules")), "any:copy:2:EIO:0");
	json_decref(doc);
	http_get(&f, "/metrics", &r);
	cr_expect(strstr(r.body, "\ndormant_faults_armed 1\n"), "%s", r.body);
	http_response_free(&r);
	fixture_stop(&f);

	fixture_start(&f, NULL);
	http_get(&f, "/stats", &r);
	doc = http_json(&r);
	http_response_free(&r);
	faults = json_object_get(doc, "faults");
	cr_assert(json_is_false(json_object_get(faults, "armed")));
	cr_expect(json_is_null(json_object_get(faults, "rules")));
	json_decref(doc);
	http_get(&f, "/metrics", &r);
	cr_expect(strstr(r.body, "\ndormant_faults_armed 0\n"), "%s", r.body);
	http_response_free(&r);
	fixture_stop(&f);
}

Test(faults, bad_rules_are_refused)
{
	static const char *const bad[] = {
		"wake", "wake:bogus", "later:copy", "wake:create:0", "wake:create:x",
		"wake:create:1:EWHAT", "wake:create:1:EIO:-1", "wake:create:1:EIO:1:extra",
		"wake:create,wake:create", ",", "sleep:copy:1:0",
		/* never called there: such a rule would never fire */
		"sleep:create", "sleep:map", "wake:host-alloc", "sleep:map:2:EIO:0",
	};
	struct fixture_config config = { .no_server = true };
	struct fixture f;

	fixture_start(&f, &config);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct test_server_options opts = { .listen = "127.0.0.1:0", .faults = bad[i],
						       .quiet = true };
		struct dormant_server *s = NULL;

		cr_assert_eq(test_server_check(&opts), -EINVAL, "'%s' checked", bad[i]);
		cr_assert_eq(test_server_start(f.m, &opts, &s), -EINVAL, "'%s' started", bad[i]);
		cr_assert_null(s);
		cr_assert(strstr(dormant_last_error(), "fault"), "%s", dormant_last_error());
	}
	fixture_stop(&f);
}

/* Disk copies are created and written by sleeps and read by wakes: a disk
 * rule is taken for both kinds (its op_calls entry; a missing one refuses). */
Test(faults, disk_rules_are_taken_for_sleeps_and_wakes)
{
	static const char *const good[] = { "sleep:disk", "wake:disk", "any:disk:2:ENOSPC:0" };
	struct fixture_config config = { .no_server = true };
	struct fixture f;

	fixture_start(&f, &config);
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		struct test_server_options opts = { .listen = "127.0.0.1:0", .faults = good[i],
						       .quiet = true };

		cr_expect_eq(test_server_check(&opts), 0, "'%s': %s", good[i], dormant_last_error());
	}
	fixture_stop(&f);
}
