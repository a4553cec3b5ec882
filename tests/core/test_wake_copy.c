/* SPDX-License-Identifier: MIT */
/*
 * What copies a wake to the device (option wake_copy, core/engine/wakecopy.h; issue
 * 24): the copy engines, the copy kernel, or auto's choice between them. The
 * kernel path restores every byte for odd sizes, offsets and marks, with
 * verification on; auto's decision runs on rates the simulated device
 * supplies ($DORMANT_HOST_COPY_GBPS), so nothing is timed; the report and
 * the stats say what copied. On the GPU (wake-copy-cuda) the restores run
 * through the real kernel (the tests of auto's choice need the simulated
 * device and skip there).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dormant.h"
#include "helpers.h"

static void *alloc_tag(struct dormant *m, const char *tag, size_t size)
{
	void *p = NULL;

	cr_assert_eq(dormant_alloc(m, tag, size, &p), 0, "alloc %zu under %s: %s", size, tag,
		     dormant_last_error());
	return p;
}

static void cycle(struct dormant *m, struct dormant_report *wake)
{
	struct dormant_report rep;

	cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "sleep: %s", rep.error);
	cr_assert_eq(dormant_wake(m, NULL, wake), 0, "wake: %s", wake->error);
}

/* Odd sizes in slabs and dedicated chunks, marks at odd offsets (runs whose
 * host copies start at odd offsets), pinned in 1 MiB pieces (copies split
 * at them): every byte back, each chunk verified, copied by what mode says. */
static void odd_layouts(const char *mode, const char *method)
{
	static const size_t sizes[] = { 1, 3, 4097, 65536 + 7, MiB + 13, 9 * MiB + 100 };
	struct dormant *m = manager_from("host_mode=release,chunk_bytes=4MiB,staging_bytes=8MiB,"
					 "copy_threads=2,guard_timeout_ms=5000,wake_copy=%s",
					 mode);
	struct dormant_report rep;
	char *p[sizeof(sizes) / sizeof(sizes[0])];
	char *big;
	size_t n = sizeof(sizes) / sizeof(sizes[0]);

	for (size_t i = 0; i < n; i++) {
		p[i] = alloc_tag(m, "weights", sizes[i]);
		fill(m, p[i], sizes[i], 40 + i);
	}
	big = p[n - 1];
	/* two marks at odd places: the runs between them start anywhere */
	cr_assert_eq(dormant_mark_unused(m, big + 333, 70001), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_mark_unused(m, big + 5 * MiB + 1, 3 * MiB + 5), 0);
	cycle(m, &rep);
	for (size_t i = 0; i + 1 < n; i++)
		cr_expect(holds(m, p[i], sizes[i], 40 + i), "allocation of %zu bytes lost",
			  sizes[i]);
	cr_expect(holds_at(m, big, 0, 333, 40 + n - 1));
	cr_expect(holds_at(m, big, 333 + 70001, 5 * MiB + 1 - 333 - 70001, 40 + n - 1));
	cr_expect(holds_at(m, big, 8 * MiB + 6, 9 * MiB + 100 - 8 * MiB - 6, 40 + n - 1));
	cr_expect_eq(rep.chunk_mismatches, 0);
	cr_expect_gt(rep.chunks_verified, 0, "verification must stay on");
	cr_expect_str_eq(rep.wake_copy.method, method);
	cr_expect_eq(rep.wake_copy.bytes_engine + rep.wake_copy.bytes_kernel, rep.bytes_copied);
	if (strcmp(method, "kernel") == 0)
		cr_expect_eq(rep.wake_copy.bytes_kernel, rep.bytes_copied);
	else
		cr_expect_eq(rep.wake_copy.bytes_kernel, 0);
	cr_expect_str_eq(stats(m)->last_wake.wake_copy.method, method);
	expect_no_device_leak(m);
	dormant_destroy(m);
}

Test(wake_copy, kernel_restores_odd_layouts, .init = pin_pieces_small)
{
	odd_layouts("kernel", "kernel");
}

Test(wake_copy, engine_restores_odd_layouts, .init = pin_pieces_small)
{
	odd_layouts("engine", "engine");
}

/* Kept memory the wake must restore exactly, in chunks of 4 MiB, filled;
 * probes as probes says (the options wake_copy_probe_bytes and
 * wake_copy_reprobe_bytes). */
static struct dormant *auto_manager_probing(const char *rates, const char *probes, void **ret,
					    size_t size)
{
	struct dormant *m;

	if (rates)
		setenv("DORMANT_HOST_COPY_GBPS", rates, 1);
	m = manager_from("host_mode=retain,skip_unchanged=false,chunk_bytes=4MiB,copy_threads=2,"
			 "pin_piece_bytes=1MiB,wake_copy=auto,%s", probes);
	unsetenv("DORMANT_HOST_COPY_GBPS");
	if (!on_host(m)) {
		dormant_destroy(m);
		cr_skip_test("the probes' rates come from the simulated device");
	}
	*ret = alloc_tag(m, "weights", size);
	fill(m, *ret, size, 77);
	return m;
}

/* The same with probes of 2 MiB, the copy engines timed again after 3 MiB. */
static struct dormant *auto_manager(const char *rates, void **ret, size_t size)
{
	return auto_manager_probing(rates, "wake_copy_probe_bytes=2MiB,wake_copy_reprobe_bytes=3MiB",
				    ret, size);
}

/* auto's choice on given rates: the engine's and the kernel's. */
struct choice {
	const char *rates;
	const char *method;
};

Test(wake_copy, auto_chooses_by_rates)
{
	static const struct choice cases[] = {
		{ "55:50", "engine" },   /* copy engines free: they are faster */
		{ "50:50", "engine" },   /* a tie: the copy engines */
		{ "50:57", "engine" },   /* within the margin (1.15): noise */
		{ "50:58", "kernel" },   /* beyond it */
		{ "27.6:50", "kernel" }, /* the scrub after a cudaFree (issue 24) */
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct dormant_report rep;
		void *w;
		struct dormant *m = auto_manager(cases[i].rates, &w, 5 * MiB);
		double engine = atof(cases[i].rates), kernel = atof(strchr(cases[i].rates, ':') + 1);

		cycle(m, &rep);
		cr_expect(holds(m, w, 5 * MiB, 77), "%s: bytes lost", cases[i].rates);
		cr_expect_str_eq(rep.wake_copy.method, cases[i].method, "rates %s",
				 cases[i].rates);
		cr_expect_eq(rep.wake_copy.probes, 2, "rates %s", cases[i].rates);
		cr_expect_float_eq(rep.wake_copy.engine_gbps, engine, 1e-9);
		cr_expect_float_eq(rep.wake_copy.kernel_gbps, kernel, 1e-9);
		/* 2 MiB timed on each, then the rest (1 MiB) by the choice */
		cr_expect_eq(rep.wake_copy.bytes_engine,
			     strcmp(cases[i].method, "engine") == 0 ? 3 * MiB : 2 * MiB,
			     "rates %s", cases[i].rates);
		cr_expect_eq(rep.wake_copy.bytes_kernel,
			     strcmp(cases[i].method, "kernel") == 0 ? 3 * MiB : 2 * MiB,
			     "rates %s", cases[i].rates);
		cr_expect_eq(rep.chunk_mismatches, 0);
		dormant_destroy(m);
	}
}

/* The kernel chosen, the copy engines are timed again after 3 MiB of the
 * kernel: still slow, the kernel goes on; recovered, they take over. */
Test(wake_copy, auto_times_the_engines_again)
{
	struct dormant_report rep;
	void *w;
	/* 2 + 2 probed, 3 by the kernel, 2 probed again, the rest (3) */
	struct dormant *m = auto_manager("28,28:50", &w, 12 * MiB);

	cycle(m, &rep);
	cr_expect(holds(m, w, 12 * MiB, 77));
	cr_expect_str_eq(rep.wake_copy.method, "kernel");
	cr_expect_eq(rep.wake_copy.probes, 3);
	cr_expect_eq(rep.wake_copy.bytes_engine, 4 * MiB);
	cr_expect_eq(rep.wake_copy.bytes_kernel, 8 * MiB);
	dormant_destroy(m);

	m = auto_manager("28,55:50", &w, 12 * MiB);
	cycle(m, &rep);
	cr_expect(holds(m, w, 12 * MiB, 77));
	cr_expect_str_eq(rep.wake_copy.method, "mixed", "kernel, then the engines again");
	cr_expect_eq(rep.wake_copy.probes, 3);
	cr_expect_float_eq(rep.wake_copy.engine_gbps, 55, 1e-9);
	cr_expect_eq(rep.wake_copy.bytes_engine, 2 * MiB + 2 * MiB + 3 * MiB);
	cr_expect_eq(rep.wake_copy.bytes_kernel, 2 * MiB + 3 * MiB);
	cr_expect_eq(stats(m)->wakes_copy_mixed, 1);
	dormant_destroy(m);
}

/* The kernel chosen, the copy engines are timed again soon, then less
 * often while the kernel stays: after 8 probes' bytes, then 16 (here at
 * most 16 MiB, wake_copy_reprobe_bytes). */
Test(wake_copy, auto_times_the_engines_again_soon_then_less_often)
{
	struct dormant_report rep;
	struct dormant *m;
	void *w;

	m = auto_manager_probing("28,28,28:50",
				 "wake_copy_probe_bytes=1MiB,wake_copy_reprobe_bytes=16MiB", &w,
				 30 * MiB);
	cycle(m, &rep);
	cr_expect(holds(m, w, 30 * MiB, 77));
	cr_expect_str_eq(rep.wake_copy.method, "kernel");
	/* 1 + 1 probed (engines, kernel), 8 by the kernel, 1 probed, 16 by the kernel, 1 probed,
	 * the last 2 by the kernel */
	cr_expect_eq(rep.wake_copy.probes, 4, "%u probes, %llu + %llu", rep.wake_copy.probes, (unsigned long long)rep.wake_copy.bytes_engine, (unsigned long long)rep.wake_copy.bytes_kernel);
	cr_expect_eq(rep.wake_copy.bytes_engine, 3 * MiB);
	cr_expect_eq(rep.wake_copy.bytes_kernel, 27 * MiB);
	dormant_destroy(m);
}

/* The kernel's rate, measured by a device's first wake, is kept: later
 * wakes time only the copy engines (one probe) and choose by both rates. */
Test(wake_copy, later_wakes_time_only_the_engines)
{
	struct dormant_report rep;
	void *w;
	/* the engines' rate per probe: free on the first wake, scrubbing on the
	 * second, free again on the third */
	struct dormant *m = auto_manager("55,27,55:50", &w, 5 * MiB);

	cycle(m, &rep);
	cr_expect_str_eq(rep.wake_copy.method, "engine");
	cr_expect_eq(rep.wake_copy.probes, 2, "the first wake times both");
	cr_expect_float_eq(rep.wake_copy.kernel_gbps, 50, 1e-9);

	cycle(m, &rep);
	cr_expect(holds(m, w, 5 * MiB, 77));
	cr_expect_str_eq(rep.wake_copy.method, "kernel", "27 against the known 50");
	cr_expect_eq(rep.wake_copy.probes, 1, "the kernel's rate was known");
	cr_expect_float_eq(rep.wake_copy.kernel_gbps, 50, 1e-9);
	cr_expect_eq(rep.wake_copy.bytes_engine, 2 * MiB);
	cr_expect_eq(rep.wake_copy.bytes_kernel, 3 * MiB);

	cycle(m, &rep);
	cr_expect(holds(m, w, 5 * MiB, 77));
	cr_expect_str_eq(rep.wake_copy.method, "engine");
	cr_expect_eq(rep.wake_copy.probes, 1);
	cr_expect_eq(rep.wake_copy.bytes_kernel, 0, "no kernel probe on a later wake");
	dormant_destroy(m);
}

/* Counters by method across wakes; a wake that copies nothing names none. */
Test(wake_copy, stats_count_by_method)
{
	struct dormant_report rep;
	struct dormant_stats *st;
	void *w;
	struct dormant *m = auto_manager("28:50", &w, 5 * MiB);

	cycle(m, &rep);
	cr_assert_str_eq(rep.wake_copy.method, "kernel");
	cr_assert_eq(dormant_wake(m, NULL, &rep), 0);
	cr_expect_str_eq(rep.wake_copy.method, "", "an awake tag: nothing copied");
	st = stats(m);
	cr_expect_eq(st->wakes_copy_kernel, 1);
	cr_expect_eq(st->wakes_copy_engine, 0);
	cr_expect_eq(st->bytes_to_device_kernel_total, 3 * MiB);
	cr_expect_eq(st->bytes_to_device_engine_total, 2 * MiB);
	cr_expect_str_eq(st->last_wake.wake_copy.method, "kernel");
	dormant_destroy(m);
}

/* A device that cannot run the kernel copies with the copy engines, whatever
 * was asked, and says so. */
Test(wake_copy, no_kernel_falls_back_to_the_engines, .init = pin_pieces_small)
{
	/* the simulated device's switch: a real one has its kernel */
	if (getenv("DORMANT_BACKEND") && strcmp(getenv("DORMANT_BACKEND"), "host") != 0)
		cr_skip_test("a device without the kernel is simulated on the host backend");
	setenv("DORMANT_HOST_COPY_KERNEL", "0", 1);
	odd_layouts("kernel", "engine");
	unsetenv("DORMANT_HOST_COPY_KERNEL");
}

/* Host copies left unpinned go through the staging ring and the copy engines
 * (the kernel reads only pinned memory). */
Test(wake_copy, unpinned_copies_stay_on_the_engines, .init = unpinned)
{
	struct dormant *m = manager_from("host_mode=release,chunk_bytes=4MiB,staging_bytes=8MiB,"
					 "copy_threads=2,wake_copy=kernel");
	struct dormant_report rep;
	void *w = alloc_tag(m, "weights", 6 * MiB + 5);

	fill(m, w, 6 * MiB + 5, 3);
	cycle(m, &rep);
	cr_expect(holds(m, w, 6 * MiB + 5, 3));
	cr_expect_eq(rep.wake_copy.bytes_kernel, 0);
	cr_expect_eq(rep.wake_copy.bytes_engine, rep.bytes_copied);
	dormant_destroy(m);
}

/* pin_host false with pin_host_bytes: a sleep pins that many bytes of host
 * copies anyway, and a wake copies those straight from them (the simulated
 * kernel reads only pinned memory) and stages the rest. Six tags of one
 * 4 MiB chunk each, 8 MiB to pin: a third of them, the first and the fourth,
 * so that pinned pieces come between the staged ones. Each tag wakes alone,
 * and its report says how its chunk came back. The buffers it pins are
 * faulted in first (DORMANT_HOST_PIN_RESIDENT: the simulated driver refuses
 * untouched memory, which a GPU's registers five times slower). */
Test(wake_copy, pin_host_bytes_pins_a_spread_share, .init = unpinned)
{
	static const uint64_t pinned_mib[] = { 4, 0, 0, 4, 0, 0 };
	struct dormant *m;
	char names[6][8];
	void *p[6];

	setenv("DORMANT_HOST_PIN_RESIDENT", "1", 1);
	m = manager_from("host_mode=release,chunk_bytes=4MiB,staging_bytes=8MiB,copy_threads=2,"
			 "wake_copy=kernel,pin_host_bytes=8MiB");
	for (int i = 0; i < 6; i++) {
		snprintf(names[i], sizeof(names[i]), "t%d", i);
		p[i] = alloc_tag(m, names[i], 4 * MiB);
		fill(m, p[i], 4 * MiB, 40 + (uint64_t)i);
	}
	for (int cycle = 0; cycle < 2; cycle++) {
		cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
		for (int i = 0; i < 6; i++) {
			const char *one[] = { names[i], NULL };
			struct dormant_report rep;

			cr_assert_eq(dormant_wake(m, one, &rep), 0, "%s", rep.error);
			cr_expect_eq(rep.wake_copy.bytes_kernel, pinned_mib[i] * MiB,
				     "cycle %d, tag %s: %llu bytes came from a pinned copy", cycle,
				     names[i], (unsigned long long)rep.wake_copy.bytes_kernel);
			cr_expect_eq(rep.wake_copy.bytes_engine + rep.wake_copy.bytes_kernel,
				     rep.bytes_copied);
			cr_expect(holds(m, p[i], 4 * MiB, 40 + (uint64_t)i), "tag %s", names[i]);
		}
	}
	dormant_destroy(m);
}

/* What is pinned already counts against pin_host_bytes: in retain mode a
 * copy pinned by one sleep stays pinned, and the next sleeps pin no more;
 * with pin_host true every copy is pinned whatever it says. */
Test(wake_copy, pin_host_bytes_counts_what_stays_pinned, .init = unpinned)
{
	struct dormant *m = manager_from("host_mode=retain,chunk_bytes=4MiB,staging_bytes=8MiB,"
					 "copy_threads=2,wake_copy=kernel,pin_host_bytes=6MiB");
	struct dormant_report rep;
	void *w = alloc_tag(m, "weights", 16 * MiB);

	for (int cycle = 0; cycle < 3; cycle++) {
		fill(m, w, 16 * MiB, 60 + (uint64_t)cycle);
		cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "%s", rep.error);
		cr_assert_eq(dormant_wake(m, NULL, &rep), 0, "%s", rep.error);
		cr_expect(holds(m, w, 16 * MiB, 60 + (uint64_t)cycle));
		/* one 4 MiB copy fits in 6 MiB, and stays the only one */
		cr_expect_eq(rep.wake_copy.bytes_kernel, 4 * MiB, "cycle %d: %llu bytes pinned",
			     cycle, (unsigned long long)rep.wake_copy.bytes_kernel);
	}
	dormant_destroy(m);

	unsetenv("DORMANT_PIN_HOST");
	m = manager_from("host_mode=release,chunk_bytes=4MiB,copy_threads=2,wake_copy=kernel,"
			 "pin_host_bytes=4MiB");
	w = alloc_tag(m, "weights", 16 * MiB);
	fill(m, w, 16 * MiB, 70);
	cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "%s", rep.error);
	cr_assert_eq(dormant_wake(m, NULL, &rep), 0, "%s", rep.error);
	cr_expect(holds(m, w, 16 * MiB, 70));
	cr_expect_eq(rep.wake_copy.bytes_kernel, 16 * MiB, "pin_host=true pins them all");
	dormant_destroy(m);
}

/* Devices sleep at once and share pin_host_bytes: 6 MiB over two devices'
 * 4 MiB chunks pins one chunk, on whichever device comes first, never one
 * on each (8 MiB). */
Test(wake_copy, pin_host_bytes_is_shared_by_the_devices, .init = unpinned)
{
	struct dormant *m = manager_from("host_devices=2,host_mode=release,chunk_bytes=4MiB,"
					 "staging_bytes=8MiB,copy_threads=2,wake_copy=kernel,"
					 "pin_host_bytes=6MiB");
	struct dormant_report rep;
	void *w[2];

	if (dormant_device_count(m) < 2) {
		dormant_destroy(m);
		cr_skip_test("one device only");
	}
	for (int d = 0; d < 2; d++) {
		cr_assert_eq(dormant_alloc_on(m, "weights", 12 * MiB, d, &w[d]), 0, "%s",
			     dormant_last_error());
		fill(m, w[d], 12 * MiB, 80 + (uint64_t)d);
	}
	for (int cycle = 0; cycle < 3; cycle++) {
		cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "%s", rep.error);
		cr_assert_eq(dormant_wake(m, NULL, &rep), 0, "%s", rep.error);
		cr_expect_eq(rep.wake_copy.bytes_kernel, 4 * MiB, "cycle %d: %llu bytes pinned",
			     cycle, (unsigned long long)rep.wake_copy.bytes_kernel);
		for (int d = 0; d < 2; d++)
			cr_expect(holds(m, w[d], 12 * MiB, 80 + (uint64_t)d), "device %d", d);
	}
	dormant_destroy(m);
}

/* Every copy of a wake through the kernel fails in turn: the wake fails,
 * the tag stays asleep with its host copy, the retry restores every byte. */
Test(wake_copy, failed_kernel_copy_keeps_the_host_copy, .init = pin_pieces_small)
{
	struct dormant *m = manager_from("host_mode=release,chunk_bytes=4MiB,copy_threads=2,"
					 "wake_copy=kernel");
	void *w = alloc_tag(m, "weights", 5 * MiB + 3);
	struct dormant_report rep;
	int failures = 0, r;

	fill(m, w, 5 * MiB + 3, 9);
	for (unsigned n = 1; n < 16; n++) {
		cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "%s", rep.error);
		cr_assert_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_COPY, n, -5, false), 0);
		r = dormant_wake(m, NULL, &rep);
		cr_assert_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_COPY, 0, -5, false), 0);
		if (r < 0) {
			failures++;
			expect_all(m, DORMANT_ASLEEP);
			cr_assert_eq(dormant_wake(m, NULL, &rep), 0, "retry: %s", rep.error);
		}
		cr_expect(holds(m, w, 5 * MiB + 3, 9), "fault at copy %u: bytes lost", n);
		cr_expect_str_eq(rep.wake_copy.method, "kernel");
	}
	cr_expect_gt(failures, 4, "the kernel's copies were counted and failed");
	dormant_destroy(m);
}

/* Bad values get an error that names the option and its values. */
Test(wake_copy, option_rejects_bad_values)
{
	struct dormant_options *o = NULL;
	struct dormant *m = NULL;
	char value[64];

	cr_assert_eq(dormant_options_new(&o), 0);
	cr_expect_eq(dormant_options_set(o, "wake_copy", "dma"), -22);
	cr_expect(strstr(dormant_last_error(), "wake_copy"), "%s", dormant_last_error());
	cr_expect(strstr(dormant_last_error(), "auto|engine|kernel"), "%s", dormant_last_error());
	cr_expect_eq(dormant_options_set(o, "wake_copy", "Kernel"), -22);
	cr_expect_eq(dormant_options_set(o, "wake_copy_probe_bytes", "0"), -22);
	cr_expect_eq(dormant_options_set(o, "wake_copy", "engine"), 0);
	cr_assert_eq(dormant_new(o, &m), 0, "%s", dormant_last_error());
	dormant_options_destroy(o);
	cr_expect_gt(dormant_option_value(m, "wake_copy", value, sizeof(value)), 0);
	cr_expect_str_eq(value, "engine");
	dormant_destroy(m);
	m = NULL;

	setenv("DORMANT_WAKE_COPY", "sometimes", 1);
	cr_expect_eq(dormant_new(NULL, &m), -22);
	cr_expect(strstr(dormant_last_error(), "DORMANT_WAKE_COPY"), "%s", dormant_last_error());
	unsetenv("DORMANT_WAKE_COPY");
	cr_expect_null(m);

	setenv("DORMANT_HOST_COPY_GBPS", "fast", 1);
	setenv("DORMANT_BACKEND", "host", 1);
	cr_expect_eq(dormant_new(NULL, &m), -22);
	cr_expect(strstr(dormant_last_error(), "DORMANT_HOST_COPY_GBPS"), "%s",
		  dormant_last_error());
	unsetenv("DORMANT_HOST_COPY_GBPS");
}
