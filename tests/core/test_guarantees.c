/* SPDX-License-Identifier: MIT */
/*
 * Guarantees that a mutation run found unprotected, each
 * with a test that fails when the guarantee is broken (docs/testing.md lists
 * the mutations tried). Host backend only: these look at the process's real
 * memory and at the host backend's deferred streams.
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

static struct dormant *manager_on_devices(enum dormant_host_mode mode, int devices)
{
	return manager_from("backend=host,host_mode=%s,chunk_bytes=4MiB,staging_bytes=8MiB,"
			    "guard_timeout_ms=5000,copy_threads=2,host_devices=%d,"
			    "host_device_bytes=512MiB",
			    mode == DORMANT_HOST_RETAIN ? "retain" : "release", devices);
}

static void *alloc_on(struct dormant *m, const char *tag, size_t size, int device)
{
	void *p = NULL;

	cr_assert_eq(dormant_alloc_on(m, tag, size, device, &p), 0, "alloc %zu under %s: %s", size,
		     tag, dormant_last_error());
	return p;
}

/* ---- release mode gives host memory back --------------------------------- */

/*
 * A sleep that fails at a copy (or a host allocation) and rolls back must give
 * its host copies back then, in release mode: the accounting drops to zero
 * and the pages leave the process, before any further cycle.
 */
Test(release, a_rolled_back_sleep_gives_its_host_copies_back_at_once, .timeout = 120)
{
	static const enum dormant_fault_op ops[] = { DORMANT_FAULT_COPY,
						     DORMANT_FAULT_HOST_ALLOC };
	const size_t size = 32 * MiB; /* 8 chunks */

	for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
		int failures = 0;

		for (unsigned n = 2; n < 100; n++) {
			struct dormant *m = manager_on_devices(DORMANT_HOST_RELEASE, 1);
			void *w = alloc_on(m, "weights", size, 0);
			long awake;
			int r;

			fill(m, w, size, 7);
			awake = rss_bytes();
			cr_assert_eq(dormant_debug_inject_fault(m, ops[o], n, -EIO, false), 0);
			r = dormant_sleep(m, NULL, NULL);
			dormant_debug_inject_fault(m, ops[o], 0, 0, false);
			if (r == 0) {
				dormant_destroy(m);
				break;
			}
			failures++;
			cr_expect_eq(r, -EIO, "op %d, n %u: %s", ops[o], n, dormant_last_error());
			expect_all(m, DORMANT_AWAKE);
			cr_expect_eq(host_bytes_settled(m, 0), 0,
				     "op %d, n %u: host copies kept after the rollback", ops[o], n);
			cr_expect_lt(rss_bytes() - awake, (long)size / 4,
				     "op %d, n %u: RSS %ld awake, %ld after the rollback", ops[o], n,
				     awake, rss_bytes());
			cr_expect(holds(m, w, size, 7), "op %d, n %u: weights lost", ops[o], n);
			dormant_destroy(m);
		}
		cr_expect_geq(failures, 3, "op %d: only %d failing sleeps", ops[o], failures);
	}
}

/*
 * After a wake, release mode holds no host copy: not in its accounting and
 * not in the process's resident memory either. Retain mode, measured the same
 * way, keeps its copy resident (so the measurement can see one).
 */
Test(release, host_copies_leave_the_process_after_wake)
{
	const size_t size = 64 * MiB;

	for (int retain = 0; retain < 2; retain++) {
		struct dormant *m =
			manager_on_devices(retain ? DORMANT_HOST_RETAIN : DORMANT_HOST_RELEASE, 1);
		void *w = alloc_on(m, "weights", size, 0);
		long awake, woken;

		fill(m, w, size, 9);
		awake = rss_bytes();
		for (int cycle = 0; cycle < 2; cycle++) {
			cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
			cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
		}
		if (retain) {
			woken = rss_bytes();
			cr_expect_geq(stats(m)->host_bytes, size);
			cr_expect_geq(woken - awake, (long)size * 9 / 10,
				      "retain: RSS %ld awake, %ld after two cycles", awake, woken);
		} else {
			cr_expect_eq(host_bytes_settled(m, 0), 0);
			woken = rss_bytes();
			cr_expect_lt(woken - awake, (long)size / 4,
				     "release: RSS %ld awake, %ld after two cycles: the host copy "
				     "is still mapped",
				     awake, woken);
		}
		cr_expect(holds(m, w, size, 9));
		dormant_destroy(m);
	}
}

/* ---- several devices ----------------------------------------------------- */

/*
 * With two devices, a copy fault on either (swept over every copy of the
 * sleep) fails the whole sleep and rolls both back: a success on the other
 * device must not hide it.
 */
Test(devices, a_failure_on_one_device_rolls_back_both, .timeout = 120)
{
	const size_t size = 8 * MiB; /* 2 chunks on each device */
	int failures = 0;

	for (unsigned n = 1; n < 100; n++) {
		struct dormant *m = manager_on_devices(DORMANT_HOST_RELEASE, 2);
		void *w[2], *g[2];
		int r;

		dormant_set_policy(m, "grads", DORMANT_DISCARD);
		for (int d = 0; d < 2; d++) {
			w[d] = alloc_on(m, "weights", size, d);
			g[d] = alloc_on(m, "grads", size, d);
			fill(m, w[d], size, 20 + d);
			fill(m, g[d], size, 30 + d);
		}
		cr_assert_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_COPY, n, -EIO, false), 0);
		r = dormant_sleep(m, NULL, NULL);
		dormant_debug_inject_fault(m, DORMANT_FAULT_COPY, 0, 0, false);
		if (r == 0) {
			dormant_destroy(m);
			break;
		}
		failures++;
		cr_expect_eq(r, -EIO, "n %u: %s", n, dormant_last_error());
		expect_all(m, DORMANT_AWAKE);
		cr_expect_eq(stats(m)->device_count, 2);
		for (size_t i = 0; i < stats(m)->device_count; i++)
			cr_expect_eq(stats(m)->devices[i].managed_bytes, 2 * size,
				     "n %u: device %zu not rolled back", n, i);
		expect_no_device_leak(m);
		cr_expect_eq(host_bytes_settled(m, 0), 0, "n %u", n);
		for (int d = 0; d < 2; d++)
			cr_expect(holds(m, w[d], size, 20 + d), "n %u: weights on device %d lost", n,
				  d);
		cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "n %u: %s", n, dormant_last_error());
		cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "n %u: %s", n, dormant_last_error());
		for (int d = 0; d < 2; d++) {
			cr_expect(holds(m, w[d], size, 20 + d), "n %u: device %d", n, d);
			cr_expect(holds(m, g[d], size, 0), "n %u: device %d", n, d);
		}
		dormant_destroy(m);
	}
	/* 2 chunks each: 4 copies in all, on either device (they run at once) */
	cr_expect_eq(failures, 4, "%d failing sleeps", failures);
}

/* A wake that fails on the second device leaves both asleep and unmapped. */
Test(devices, a_wake_failing_on_one_device_leaves_both_asleep)
{
	const size_t size = 8 * MiB;
	struct dormant *m = manager_on_devices(DORMANT_HOST_RELEASE, 2);
	void *w[2];

	for (int d = 0; d < 2; d++) {
		w[d] = alloc_on(m, "weights", size, d);
		fill(m, w[d], size, 50 + d);
	}
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	/* 4 creates in all, 2 on each device (in any order: they run at once) */
	cr_assert_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_CREATE, 3, -ENOMEM, false), 0);
	cr_expect_eq(dormant_wake(m, NULL, NULL), -ENOMEM);
	expect_all(m, DORMANT_ASLEEP);
	for (size_t i = 0; i < stats(m)->device_count; i++)
		cr_expect_eq(stats(m)->devices[i].managed_bytes, 0, "device %zu still mapped", i);
	expect_no_device_leak(m);
	cr_expect_geq(stats(m)->host_bytes, 2 * size);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	for (int d = 0; d < 2; d++)
		cr_expect(holds(m, w[d], size, 50 + d), "device %d", d);
	dormant_destroy(m);
}

/*
 * Devices are driven at once, not one after another: with
 * DORMANT_HOST_RENDEZVOUS each device's first copy (to the host, or to the
 * device) waits until the other device has issued its own, which devices
 * taken one after another never do (the third test shows it failing so).
 */
static void meet_to_host(void)
{
	setenv("DORMANT_HOST_RENDEZVOUS", "to_host:30000", 1);
}

static void meet_to_device(void)
{
	setenv("DORMANT_HOST_RENDEZVOUS", "to_device:30000", 1);
}

static void serial_meet_to_host(void)
{
	setenv("DORMANT_HOST_RENDEZVOUS", "to_host:200", 1);
	setenv("DORMANT_PARALLEL_DEVICES", "0", 1);
}

static void two_filled(struct dormant *m, void **w, size_t size, uint64_t seed)
{
	for (int d = 0; d < 2; d++) {
		w[d] = alloc_on(m, "weights", size, d);
		fill(m, w[d], size, seed + d);
	}
}

Test(devices, a_sleep_copies_on_every_device_at_once, .init = meet_to_host, .timeout = 120)
{
	const size_t size = 16 * MiB;
	struct dormant *m = manager_on_devices(DORMANT_HOST_RELEASE, 2);
	void *w[2];

	two_filled(m, w, size, 110);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	for (int d = 0; d < 2; d++)
		cr_expect(holds(m, w[d], size, 110 + d), "device %d", d);
	dormant_destroy(m);
}

Test(devices, a_wake_copies_on_every_device_at_once, .init = meet_to_device, .timeout = 120)
{
	const size_t size = 16 * MiB;
	struct dormant *m = manager_on_devices(DORMANT_HOST_RETAIN, 2);
	void *w[2];

	/* fill() copies to the device on device 0 alone: the meeting would
	 * time out there, so fill through a sleep and a wake first */
	for (int d = 0; d < 2; d++)
		w[d] = alloc_on(m, "weights", size, d);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	for (int d = 0; d < 2; d++)
		fill(m, w[d], size, 120 + d);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	for (int d = 0; d < 2; d++)
		cr_expect(holds(m, w[d], size, 120 + d), "device %d", d);
	dormant_destroy(m);
}

/* The check above can fail: devices one after another never meet, and the
 * sleep fails at device 0's first copy and rolls back, naming the device. */
Test(devices, devices_one_after_another_do_not_meet, .init = serial_meet_to_host,
     .timeout = 120)
{
	const size_t size = 16 * MiB;
	struct dormant *m = manager_on_devices(DORMANT_HOST_RELEASE, 2);
	void *w[2];

	two_filled(m, w, size, 130);
	cr_expect_eq(dormant_sleep(m, NULL, NULL), -ETIMEDOUT);
	cr_expect(strncmp(dormant_last_error(), "sleep: device 0: ", 17) == 0, "%s",
		  dormant_last_error());
	expect_all(m, DORMANT_AWAKE);
	for (int d = 0; d < 2; d++)
		cr_expect(holds(m, w[d], size, 130 + d), "device %d", d);
	/* the one meeting is over: the next sleep runs */
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	for (int d = 0; d < 2; d++)
		cr_expect(holds(m, w[d], size, 130 + d), "device %d", d);
	dormant_destroy(m);
}

/*
 * Device 0 holds only discarded memory, released whatever device 1 does;
 * device 1 fails its first copy. The released memory of device 0 comes back
 * (zero-filled, as a wake gives it) and device 1's weights stay intact.
 */
Test(devices, a_device_already_released_comes_back)
{
	const size_t size = 16 * MiB;
	struct dormant *m = manager_on_devices(DORMANT_HOST_RELEASE, 2);
	struct dormant_report rep;
	void *g, *w;

	dormant_set_policy(m, "grads", DORMANT_DISCARD);
	g = alloc_on(m, "grads", size, 0);
	w = alloc_on(m, "weights", size, 1);
	fill(m, g, size, 140);
	fill(m, w, size, 141);
	cr_assert_eq(dormant_debug_inject_device_fault(m, 1, DORMANT_FAULT_COPY, 1, -EIO, false),
		     0);
	cr_expect_eq(dormant_sleep(m, NULL, &rep), -EIO);
	cr_expect(strncmp(rep.error, "sleep: device 1: ", 17) == 0, "%s", rep.error);
	cr_expect(strstr(rep.error, "on device 1 failed"), "%s", rep.error);
	cr_expect_eq(rep.bytes_released, size, "device 0's grads were released first");
	expect_all(m, DORMANT_AWAKE);
	cr_expect_eq(stats(m)->devices[0].managed_bytes, size);
	cr_expect_eq(stats(m)->devices[1].managed_bytes, size);
	cr_expect(holds(m, g, size, 0), "device 0 back zero-filled");
	cr_expect(holds(m, w, size, 141));
	expect_no_device_leak(m);
	cr_expect_eq(host_bytes_settled(m, 0), 0);
	dormant_destroy(m);
}

/*
 * When device 1 fails, device 0 stops at its next chunk instead of copying
 * all of its own first (how far it got depends on timing, so that is not
 * checked), and the failure reported is device 1's, not device 0's stop.
 */
Test(devices, the_failing_device_is_the_one_reported, .timeout = 120)
{
	struct dormant *m = manager_on_devices(DORMANT_HOST_RELEASE, 2);
	struct dormant_report rep;
	void *w0, *w1;

	w0 = alloc_on(m, "weights", 256 * MiB, 0); /* 64 chunks */
	w1 = alloc_on(m, "weights", 4 * MiB, 1);
	fill(m, w0, 256 * MiB, 150);
	fill(m, w1, 4 * MiB, 151);
	cr_assert_eq(dormant_debug_inject_device_fault(m, 1, DORMANT_FAULT_COPY, 1, -EIO, false),
		     0);
	cr_expect_eq(dormant_sleep(m, NULL, &rep), -EIO);
	cr_expect(strncmp(rep.error, "sleep: device 1: ", 17) == 0, "%s", rep.error);
	cr_expect(!strstr(rep.error, "stopped"), "the stopped device is not the error: %s",
		  rep.error);
	expect_all(m, DORMANT_AWAKE);
	cr_expect(holds(m, w0, 256 * MiB, 150));
	cr_expect(holds(m, w1, 4 * MiB, 151));
	expect_no_device_leak(m);
	cr_expect_eq(host_bytes_settled(m, 0), 0);
	dormant_destroy(m);
}

/* ---- deferred device work ------------------------------------------------ */

static void deferred(void)
{
	setenv("DORMANT_HOST_DEFER_STREAMS", "1", 1);
}

/*
 * A write still queued on the device (a trainer's kernel not finished when
 * its step ended) must be in the copy: a sleep synchronizes the device before
 * it copies. The host backend's deferred streams run such a write only at a
 * synchronize.
 */
Test(deferred, sleep_synchronizes_the_device_before_copying, .init = deferred)
{
	const size_t size = 8 * MiB;
	struct dormant *m = manager_on_devices(DORMANT_HOST_RELEASE, 1);
	void *w = alloc_on(m, "weights", size, 0);
	uint8_t *late = malloc(size);

	cr_assert_not_null(late);
	fill(m, w, size, 60);
	pattern_make(late, 0, size, 61);
	cr_assert_eq(dormant_debug_defer_write(m, w, late, size), 0, "%s", dormant_last_error());
	free(late);
	cr_expect(holds(m, w, size, 60), "the deferred write landed before any synchronize");
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_expect(holds(m, w, size, 61), "the sleep copied before the device's work was done");
	dormant_destroy(m);
}

/* With deferred streams a whole cycle still restores and zero-fills: the
 * engine waits for each piece of its own work before it relies on it. */
Test(deferred, a_cycle_waits_for_its_own_copies_and_zero_fills, .init = deferred)
{
	const size_t size = 9 * MiB + 100;
	struct dormant *m = manager_on_devices(DORMANT_HOST_RELEASE, 1);
	void *w, *g;

	dormant_set_policy(m, "grads", DORMANT_DISCARD);
	w = alloc_on(m, "weights", size, 0);
	g = alloc_on(m, "grads", size, 0);
	for (int cycle = 0; cycle < 3; cycle++) {
		fill(m, w, size, 70 + cycle);
		fill(m, g, size, 80 + cycle);
		cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
		cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
		cr_expect(holds(m, w, size, 70 + cycle), "cycle %d: weights", cycle);
		cr_expect(holds(m, g, size, 0), "cycle %d: grads not zero-filled", cycle);
	}
	dormant_destroy(m);
}

Test(deferred, deferred_writes_need_deferred_streams)
{
	struct dormant *m;
	void *w;
	char byte = 1;

	unsetenv("DORMANT_HOST_DEFER_STREAMS");
	m = manager_on_devices(DORMANT_HOST_RELEASE, 1);
	w = alloc_on(m, "weights", 4 * MiB, 0);
	cr_expect_eq(dormant_debug_defer_write(m, w, &byte, 1), -ENOTSUP);
	cr_expect_eq(dormant_debug_defer_write(m, &byte, &byte, 1), -EINVAL);
	dormant_destroy(m);
}
