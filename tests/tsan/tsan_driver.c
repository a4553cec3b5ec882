/* SPDX-License-Identifier: MIT */
/*
 * The concurrency scenarios of the unit and http suites, as a plain C
 * program (no Criterion: it cannot start under ThreadSanitizer), so that CI
 * runs them in a -fsanitize=thread build with TSAN_OPTIONS=halt_on_error=1.
 * It runs in the other builds too, as one more stress test.
 *
 *   test-tsan [SCENARIO...]     (none: all of them)
 *
 * Output is TAP, one line per scenario; .ci/count.py counts them. Each
 * scenario also checks what it did (contents intact, only the answers the
 * contract allows), so a scenario can fail without a race report too.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "dormant-server.h"
#include "dormant.h"

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

/* The first failure of a scenario, reported on its TAP line. */
static char failure[512];
static pthread_mutex_t failure_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((format(printf, 1, 2))) static void fail(const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&failure_lock);
	if (!failure[0]) {
		va_start(ap, fmt);
		vsnprintf(failure, sizeof(failure), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&failure_lock);
}

static bool failed(void)
{
	bool f;

	pthread_mutex_lock(&failure_lock);
	f = failure[0] != '\0';
	pthread_mutex_unlock(&failure_lock);
	return f;
}

static void pause_us(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };

	nanosleep(&ts, NULL);
}

/* A manager with options "name=value,..." (dormant_options_parse()), or NULL
 * after fail(). */
static int manager_from(const char *text, struct dormant **ret)
{
	struct dormant_options *o = NULL;
	int r = dormant_options_new(&o);

	if (r == 0)
		r = dormant_options_parse(o, text);
	if (r == 0)
		r = dormant_new(o, ret);
	dormant_options_destroy(o);
	if (r < 0)
		fail("dormant_new (%s): %s", text, dormant_last_error());
	return r;
}

static struct dormant *manager_new(size_t device_bytes)
{
	struct dormant *m = NULL;
	char text[256];

	snprintf(text, sizeof(text),
		 "backend=host,host_mode=release,chunk_bytes=4MiB,staging_bytes=8MiB,"
		 "guard_timeout_ms=5000,copy_threads=2,host_devices=1,host_device_bytes=%zu",
		 device_bytes);
	return manager_from(text, &m) < 0 ? NULL : m;
}

static unsigned char pattern_byte(size_t i, unsigned seed)
{
	return (unsigned char)(i * 131u + seed);
}

static void *alloc_filled(struct dormant *m, const char *tag, size_t size, unsigned seed)
{
	unsigned char *buf = malloc(size);
	void *p = NULL;

	if (!buf || dormant_alloc(m, tag, size, &p) < 0) {
		fail("alloc %s: %s", tag, dormant_last_error());
		free(buf);
		return NULL;
	}
	for (size_t i = 0; i < size; i++)
		buf[i] = pattern_byte(i, seed);
	if (dormant_copy_to_device(m, p, buf, size) < 0)
		fail("fill %s: %s", tag, dormant_last_error());
	free(buf);
	return p;
}

static bool holds(struct dormant *m, const void *p, size_t size, unsigned seed)
{
	unsigned char *buf = malloc(size);
	bool ok = buf && dormant_copy_to_host(m, buf, p, size) == 0;

	for (size_t i = 0; ok && i < size; i++)
		ok = buf[i] == pattern_byte(i, seed);
	free(buf);
	return ok;
}

/* Sleep and wake these tags, retrying while another transition runs. */
static void cycle(struct dormant *m, const char *const *tags, int n)
{
	for (int c = 0; c < n && !failed(); c++) {
		int r;

		while ((r = dormant_sleep(m, tags, NULL)) == -EBUSY)
			pause_us(100);
		if (r < 0)
			fail("cycle %d: sleep: %s", c, dormant_last_error());
		while ((r = dormant_wake(m, tags, NULL)) == -EBUSY)
			pause_us(100);
		if (r < 0)
			fail("cycle %d: wake: %s", c, dormant_last_error());
	}
}

/* ---- crowd: alloc, free, stats and a rival orchestrator during cycles ---- */

struct crowd {
	struct dormant *m;
	atomic_bool stop;
	void *victims[16];
	atomic_int victim_next;
};

static void *crowd_allocator(void *arg)
{
	struct crowd *c = arg;

	for (unsigned i = 0; !atomic_load(&c->stop); i++) {
		/* slab-sized and chunk-sized, on a tag that never sleeps */
		size_t size = i % 2 ? 3 * MiB : 48 * KiB;
		void *p = alloc_filled(c->m, "scratch", size, i);

		if (p && !holds(c->m, p, size, i))
			fail("scratch allocation lost its contents");
		if (p && dormant_free(c->m, p) < 0)
			fail("free scratch: %s", dormant_last_error());
	}
	return NULL;
}

static void *crowd_reader(void *arg)
{
	struct crowd *c = arg;
	struct dormant_stats *s = malloc(sizeof(*s));

	while (s && !atomic_load(&c->stop)) {
		if (dormant_stats_get(c->m, s) < 0 || s->tag_count < 3)
			fail("stats: %s", dormant_last_error());
		pause_us(100);
	}
	free(s);
	return NULL;
}

static void *crowd_freer(void *arg)
{
	struct crowd *c = arg;
	int i;

	/* frees the cycling tags' allocations while they sleep and wake */
	while ((i = atomic_fetch_add(&c->victim_next, 1)) < 16) {
		if (dormant_free(c->m, c->victims[i]) < 0)
			fail("free victim %d: %s", i, dormant_last_error());
		pause_us(2000);
	}
	return NULL;
}

static void *crowd_rival(void *arg)
{
	static const char *const weights[] = { "weights", NULL };
	struct crowd *c = arg;

	while (!atomic_load(&c->stop)) {
		int r = dormant_wake(c->m, weights, NULL);

		if (r != 0 && r != -EBUSY)
			fail("rival wake: %d %s", r, dormant_last_error());
		pause_us(1000);
	}
	return NULL;
}

static void *crowd_policy(void *arg)
{
	struct crowd *c = arg;

	/* the grads' policy flips while they may be sleeping: 0 or -EBUSY */
	for (unsigned i = 0; !atomic_load(&c->stop); i++) {
		int r = dormant_set_policy(c->m, "grads", i % 2 ? DORMANT_KEEP : DORMANT_DISCARD);

		if (r != 0 && r != -EBUSY)
			fail("set_policy: %d %s", r, dormant_last_error());
		pause_us(500);
	}
	return NULL;
}

static void scenario_crowd(void)
{
	static const char *const both[] = { "weights", "grads", NULL };
	void *(*const mains[])(void *) = { crowd_allocator, crowd_reader, crowd_reader,
					   crowd_freer, crowd_rival, crowd_policy };
	struct crowd c = { .m = manager_new(256 * MiB) };
	pthread_t t[6];
	void *w;

	if (!c.m)
		return;
	dormant_set_policy(c.m, "grads", DORMANT_DISCARD);
	w = alloc_filled(c.m, "weights", 6 * MiB, 21);
	alloc_filled(c.m, "grads", 6 * MiB, 1);
	for (int i = 0; i < 16; i++)
		c.victims[i] = alloc_filled(c.m, i % 2 ? "grads" : "weights", i % 4 ? 64 * KiB : 2 * MiB,
					    (unsigned)i);
	alloc_filled(c.m, "scratch", MiB, 5);
	for (int i = 0; i < 6; i++)
		pthread_create(&t[i], NULL, mains[i], &c);
	cycle(c.m, both, 12);
	atomic_store(&c.stop, true);
	for (int i = 0; i < 6; i++)
		pthread_join(t[i], NULL);
	if (w && !holds(c.m, w, 6 * MiB, 21))
		fail("weights changed over the cycles");
	dormant_destroy(c.m);
}

/* ---- guard: steps enter and leave while sleeps and wakes run ------------- */

struct steps {
	struct dormant *m;
	void *weights;
	atomic_bool stop;
	atomic_uint entered;
};

static void *stepper(void *arg)
{
	struct steps *s = arg;

	while (!atomic_load(&s->stop)) {
		int r = dormant_step_enter(s->m, 50);

		if (r == -ETIMEDOUT)
			continue;
		if (r < 0) {
			fail("step enter: %d", r);
			return NULL;
		}
		atomic_fetch_add(&s->entered, 1);
		/* inside a step the memory is awake and holds its contents */
		if (!holds(s->m, s->weights, 64 * KiB, 9))
			fail("a step saw the weights asleep or changed");
		if (dormant_step_leave(s->m) < 0)
			fail("step leave: %s", dormant_last_error());
		pause_us(200);
	}
	return NULL;
}

static int stats_hook(struct dormant *m, enum dormant_hook_point point, void *userdata)
{
	struct dormant_stats *s = malloc(sizeof(*s));

	atomic_fetch_add((atomic_uint *)userdata, 1);
	if (!s || dormant_stats_get(m, s) < 0)
		fail("stats in a hook: %s", dormant_last_error());
	free(s);
	return 0;
}

static void scenario_guard(void)
{
	struct steps s = { .m = manager_new(64 * MiB) };
	atomic_uint hooks = 0;
	pthread_t t[3];

	if (!s.m)
		return;
	s.weights = alloc_filled(s.m, "weights", 64 * KiB, 9);
	for (int p = 0; p < 4; p++)
		dormant_hook_add(s.m, (enum dormant_hook_point)p, stats_hook, &hooks);
	for (int i = 0; i < 3; i++)
		pthread_create(&t[i], NULL, stepper, &s);
	while (atomic_load(&s.entered) == 0 && !failed())
		pause_us(100);
	cycle(s.m, NULL, 20);
	atomic_store(&s.stop, true);
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	if (atomic_load(&hooks) < 4 * 20)
		fail("hooks ran %u times for 20 cycles", atomic_load(&hooks));
	dormant_destroy(s.m);
}

/* ---- policy: changed in the window between picking the tags and moving
 * them (the guard wait and the before-sleep hooks run without the lock) --- */

static int flip_to_keep(struct dormant *m, enum dormant_hook_point point, void *userdata)
{
	if (dormant_set_policy(m, "grads", DORMANT_KEEP) < 0)
		fail("set_policy in a hook: %s", dormant_last_error());
	return 0;
}

static void scenario_policy(void)
{
	struct dormant *m = manager_new(64 * MiB);
	struct dormant_report rep;
	void *g;

	if (!m)
		return;
	dormant_set_policy(m, "grads", DORMANT_DISCARD);
	g = alloc_filled(m, "grads", 2 * MiB, 7);
	dormant_hook_add(m, DORMANT_HOOK_BEFORE_SLEEP, flip_to_keep, NULL);
	if (dormant_sleep(m, NULL, &rep) < 0 || dormant_wake(m, NULL, NULL) < 0) {
		fail("cycle: %s", dormant_last_error());
	} else {
		/* the copies followed the new policy, and the report says so */
		if (!g || !holds(m, g, 2 * MiB, 7))
			fail("grads not kept after their policy became keep");
		if (rep.tag_count != 1 || rep.tags[0].policy != DORMANT_KEEP)
			fail("the report says policy %s, the copies followed keep",
			     dormant_policy_name(rep.tags[0].policy));
	}
	dormant_destroy(m);
}

/* ---- torch: the allocator entry points on threads of their own ---------- */

struct torch_thread {
	pthread_t thread;
	const char *tag;
	atomic_bool *stop;
};

static void *torch_main(void *arg)
{
	struct torch_thread *tt = arg;

	dormant_set_thread_tag(tt->tag);
	while (!atomic_load(tt->stop)) {
		void *p = dormant_torch_malloc(256 * KiB, 0, NULL);

		if (!p) {
			/* the tag sleeps now and then: allocation refused */
			pause_us(200);
			continue;
		}
		dormant_torch_free(p, 256 * KiB, 0, NULL);
	}
	return NULL;
}

static void scenario_torch(void)
{
	static const char *const cycled[] = { "kv", NULL };
	struct dormant *m = manager_new(64 * MiB);
	struct torch_thread tt[3] = { { .tag = "acts" }, { .tag = "kv" }, { .tag = "acts" } };
	atomic_bool stop = false;

	if (!m)
		return;
	alloc_filled(m, "kv", MiB, 3);
	dormant_torch_set_manager(m);
	for (int i = 0; i < 3; i++) {
		tt[i].stop = &stop;
		pthread_create(&tt[i].thread, NULL, torch_main, &tt[i]);
	}
	cycle(m, cycled, 15);
	atomic_store(&stop, true);
	for (int i = 0; i < 3; i++)
		pthread_join(tt[i].thread, NULL);
	dormant_torch_set_manager(NULL);
	dormant_destroy(m);
}

/* Reads stats and tries a step (never waiting) while transitions run. */
static void *fault_reader(void *arg)
{
	struct crowd *c = arg;
	struct dormant_stats *s = malloc(sizeof(*s));

	while (s && !atomic_load(&c->stop)) {
		int r = dormant_stats_get(c->m, s);

		if (r < 0)
			fail("stats: %s", dormant_last_error());
		r = dormant_step_enter(c->m, 0);
		if (r == 0)
			dormant_step_leave(c->m);
		pause_us(50);
	}
	free(s);
	return NULL;
}

/* ---- modes: staging ring, retain, two devices, small pin pieces ---------- */

static void scenario_modes(void)
{
	/* unpinned copies through the staging ring, on the copy threads */
	static const char *const weights[] = { "weights", NULL };
	static const char *const envs[][2] = {
		{ "DORMANT_PIN_HOST", "0" },
		{ "DORMANT_PIN_PIECE_BYTES", "1MiB" },
	};

	for (size_t e = 0; e < sizeof(envs) / sizeof(envs[0]) && !failed(); e++) {
		const char *options = e ? "backend=host,host_mode=retain,chunk_bytes=4MiB,"
					  "staging_bytes=8MiB,copy_threads=3,host_devices=2,"
					  "host_device_bytes=64MiB"
					: "backend=host,host_mode=release,chunk_bytes=4MiB,"
					  "staging_bytes=8MiB,copy_threads=3,host_devices=2,"
					  "host_device_bytes=64MiB";
		struct crowd c = { 0 };
		pthread_t t[2];
		void *w[2] = { 0 };

		setenv(envs[e][0], envs[e][1], 1);
		if (manager_from(options, &c.m) < 0) {
			unsetenv(envs[e][0]);
			return;
		}
		unsetenv(envs[e][0]);
		alloc_filled(c.m, "scratch", MiB, 1);
		for (int d = 0; d < 2; d++) {
			if (dormant_alloc_on(c.m, "weights", 12 * MiB, d, &w[d]) < 0) {
				fail("alloc on %d: %s", d, dormant_last_error());
				break;
			}
		}
		c.victim_next = 16; /* no freer here */
		pthread_create(&t[0], NULL, fault_reader, &c);
		pthread_create(&t[1], NULL, crowd_allocator, &c);
		cycle(c.m, weights, 8);
		atomic_store(&c.stop, true);
		pthread_join(t[0], NULL);
		pthread_join(t[1], NULL);
		dormant_destroy(c.m);
	}
}

/* ---- reclaim: unpins on the workers against sleeps, frees, mode switches - */

static void *mode_switcher(void *arg)
{
	struct crowd *c = arg;

	/* retain and back while the last wake's unpins may still run */
	for (unsigned i = 0; !atomic_load(&c->stop); i++) {
		int r = dormant_set_host_mode(c->m, i % 3 ? DORMANT_HOST_RECLAIMABLE
							  : DORMANT_HOST_RETAIN);

		if (r != 0 && r != -EBUSY)
			fail("set_host_mode: %d %s", r, dormant_last_error());
		pause_us(3000);
	}
	return NULL;
}

static void scenario_reclaim(void)
{
	static const char *const both[] = { "weights", "grads", NULL };
	void *(*const mains[])(void *) = { crowd_reader, crowd_freer, mode_switcher };
	struct crowd c = { 0 };
	pthread_t t[3];
	void *w;

	if (manager_from("backend=host,host_mode=reclaimable,chunk_bytes=4MiB,staging_bytes=8MiB,"
			 "pin_piece_bytes=1MiB,pin_threads=4,copy_threads=2,guard_timeout_ms=5000,"
			 "host_devices=1,host_device_bytes=256MiB",
			 &c.m) < 0)
		return;
	w = alloc_filled(c.m, "weights", 12 * MiB, 31);
	alloc_filled(c.m, "grads", 6 * MiB, 2);
	alloc_filled(c.m, "scratch", MiB, 5);
	for (int i = 0; i < 16; i++)
		c.victims[i] = alloc_filled(c.m, i % 2 ? "grads" : "weights", i % 4 ? 64 * KiB : 5 * MiB,
					    (unsigned)i);
	for (int i = 0; i < 3; i++)
		pthread_create(&t[i], NULL, mains[i], &c);
	cycle(c.m, both, 10);
	atomic_store(&c.stop, true);
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	if (w && !holds(c.m, w, 12 * MiB, 31))
		fail("weights changed over the cycles");
	dormant_destroy(c.m);
}

/* ---- warmup: the background warm-up against cycles, allocs, frees ------- */

static void *warmup_caller(void *arg)
{
	struct crowd *c = arg;

	while (!atomic_load(&c->stop)) {
		int r = dormant_warm_up(c->m);

		/* a transition running or stopping it is the contract's */
		if (r < 0 && r != -EBUSY && r != -ECANCELED)
			fail("dormant_warm_up: %s", dormant_last_error());
		pause_us(200);
	}
	return NULL;
}

static void scenario_warmup(void)
{
	static const char *const weights[] = { "weights", NULL };
	struct crowd c = { 0 };
	pthread_t t[3];
	void *w;

	/* retain mode: host copies are prepared (a chunk at a time) while
	 * "scratch" (kept) allocations come and go and "weights" cycles */
	if (manager_from("backend=host,host_mode=retain,chunk_bytes=4MiB,staging_bytes=8MiB,"
			 "copy_threads=2,host_devices=1,host_device_bytes=128MiB,warmup=auto,"
			 "warmup_settle_ms=0", &c.m) < 0)
		return;
	w = alloc_filled(c.m, "weights", 12 * MiB, 7);
	alloc_filled(c.m, "scratch", MiB, 1);
	alloc_filled(c.m, "grads", MiB, 2); /* the reader wants 3 tags */
	c.victim_next = 16; /* no freer here */
	pthread_create(&t[0], NULL, crowd_allocator, &c);
	pthread_create(&t[1], NULL, warmup_caller, &c);
	pthread_create(&t[2], NULL, crowd_reader, &c);
	cycle(c.m, weights, 12);
	atomic_store(&c.stop, true);
	for (int i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	if (w && !holds(c.m, w, 12 * MiB, 7))
		fail("weights lost their contents");
	dormant_destroy(c.m);
}

/* ---- faults: failed sleeps and wakes roll back while others read -------- */

static void scenario_faults(void)
{
	struct crowd c = { .m = manager_new(64 * MiB) };
	pthread_t t[2];
	void *w;

	if (!c.m)
		return;
	w = alloc_filled(c.m, "weights", 9 * MiB, 44);
	alloc_filled(c.m, "scratch", MiB, 1);
	pthread_create(&t[0], NULL, fault_reader, &c);
	pthread_create(&t[1], NULL, fault_reader, &c);
	for (unsigned nth = 1; nth <= 6 && !failed(); nth++) {
		for (int op = 0; op < DORMANT_FAULT_OPS && !failed(); op++) {
			int r;

			/* a sleep that fails at this point rolls back: awake, intact */
			dormant_debug_inject_fault(c.m, (enum dormant_fault_op)op, nth, -EIO, false);
			r = dormant_sleep(c.m, NULL, NULL);
			dormant_debug_inject_fault(c.m, (enum dormant_fault_op)op, 0, 0, false);
			if (r < 0 && w && !holds(c.m, w, 9 * MiB, 44))
				fail("a sleep failed at op %d call %u and lost the weights", op, nth);
			if (r == 0) {
				/* a wake that fails stays asleep; the next one works */
				dormant_debug_inject_fault(c.m, (enum dormant_fault_op)op, nth, -EIO,
							   false);
				dormant_wake(c.m, NULL, NULL);
				dormant_debug_inject_fault(c.m, (enum dormant_fault_op)op, 0, 0, false);
				if (dormant_wake(c.m, NULL, NULL) < 0)
					fail("wake after a fault at op %d call %u: %s", op, nth,
					     dormant_last_error());
			}
			if (w && !holds(c.m, w, 9 * MiB, 44))
				fail("the weights changed after a fault at op %d call %u", op, nth);
		}
	}
	atomic_store(&c.stop, true);
	pthread_join(t[0], NULL);
	pthread_join(t[1], NULL);
	dormant_destroy(c.m);
}

/* ---- devices: three devices driven at once, one failing now and then ---- */

static void scenario_devices(void)
{
	static const char *const cycling[] = { "weights", "grads", NULL };
	static const char *const second[] = { "weights", NULL };
	struct crowd c = { 0 };
	pthread_t t[2];
	void *w[3] = { 0 };
	unsigned char *buf = malloc(10 * MiB);

	if (!buf || manager_from("backend=host,host_mode=retain,chunk_bytes=4MiB,staging_bytes=8MiB,"
				 "copy_threads=2,host_devices=3,host_device_bytes=64MiB",
				 &c.m) < 0) {
		if (!buf)
			fail("out of memory");
		free(buf);
		return;
	}
	dormant_set_policy(c.m, "grads", DORMANT_DISCARD);
	alloc_filled(c.m, "scratch", MiB, 1);
	for (int d = 0; d < 3 && !failed(); d++) {
		void *g;

		for (size_t i = 0; i < 10 * MiB; i++)
			buf[i] = pattern_byte(i, 60 + (unsigned)d);
		if (dormant_alloc_on(c.m, "weights", 10 * MiB, d, &w[d]) < 0 ||
		    dormant_alloc_on(c.m, "grads", 6 * MiB, d, &g) < 0 ||
		    dormant_copy_to_device(c.m, w[d], buf, 10 * MiB) < 0)
			fail("device %d: %s", d, dormant_last_error());
	}
	free(buf);
	c.victim_next = 16; /* no freer here */
	pthread_create(&t[0], NULL, fault_reader, &c);
	pthread_create(&t[1], NULL, crowd_allocator, &c);
	for (unsigned round = 0; round < 4 && !failed(); round++) {
		int r;

		cycle(c.m, round % 2 ? second : cycling, 2);
		/* device 2 fails a copy: every device rolls back or stays asleep */
		dormant_debug_inject_device_fault(c.m, 2, DORMANT_FAULT_COPY, 1 + round % 4, -EIO,
						  false);
		r = dormant_sleep(c.m, cycling, NULL);
		dormant_debug_inject_device_fault(c.m, 2, DORMANT_FAULT_COPY, 0, 0, false);
		if (r == 0) {
			dormant_debug_inject_device_fault(c.m, 2, DORMANT_FAULT_MAP, 1, -ENOMEM,
							  false);
			if (dormant_wake(c.m, NULL, NULL) != -ENOMEM)
				fail("a wake failing on device 2 did not fail");
			dormant_debug_inject_device_fault(c.m, 2, DORMANT_FAULT_MAP, 0, 0, false);
			if (dormant_wake(c.m, NULL, NULL) < 0)
				fail("wake after a fault on device 2: %s", dormant_last_error());
		}
		for (int d = 0; d < 3; d++)
			if (w[d] && !holds(c.m, w[d], 10 * MiB, 60 + (unsigned)d))
				fail("round %u: the weights of device %d changed", round, d);
	}
	atomic_store(&c.stop, true);
	pthread_join(t[0], NULL);
	pthread_join(t[1], NULL);
	dormant_destroy(c.m);
}

/* ---- http: many clients racing transitions, then a stop ------------------ */

/* One request over a fresh connection; returns the status, 0 on no answer. */
static int http(int port, const char *method, const char *path)
{
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct timeval tv = { 10, 0 };
	char request[256], answer[512];
	size_t got = 0;
	ssize_t n;
	int fd, status = 0;

	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		close(fd);
		return 0;
	}
	snprintf(request, sizeof(request),
		 "%s %s HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
		 method, path);
	if (send(fd, request, strlen(request), MSG_NOSIGNAL) < 0) {
		close(fd);
		return 0;
	}
	while (got + 1 < sizeof(answer) && (n = recv(fd, answer + got, sizeof(answer) - 1 - got, 0)) > 0)
		got += (size_t)n;
	/* the rest of the body, unread */
	while ((n = recv(fd, request, sizeof(request), 0)) > 0)
		;
	answer[got] = '\0';
	close(fd);
	if (sscanf(answer, "HTTP/1.%*d %d", &status) != 1)
		return 0;
	return status;
}

struct client {
	pthread_t thread;
	int port;
	bool orchestrator; /* posts /sleep and /wake; else reads */
	atomic_bool *stop;
	atomic_uint *done;
};

static void *client_main(void *arg)
{
	static const char *const reads[] = { "/stats", "/metrics", "/healthz", "/readyz",
					     "/is_sleeping", "/stats?pretty" };
	struct client *c = arg;

	for (unsigned i = 0; !atomic_load(c->stop); i++) {
		const char *path = c->orchestrator ? (i % 2 ? "/wake" : "/sleep")
						   : reads[i % (sizeof(reads) / sizeof(reads[0]))];
		int status = http(c->port, c->orchestrator ? "POST" : "GET", path);

		/* 409: the other orchestrator's transition runs */
		if (status != 200 && !(c->orchestrator && status == 409)) {
			fail("%s answered %d", path, status);
			return NULL;
		}
		atomic_fetch_add(c->done, 1);
	}
	return NULL;
}

static int stats_extra(void *userdata, char *buf, size_t size)
{
	return snprintf(buf, size, "{\"calls\": %u}", atomic_fetch_add((atomic_uint *)userdata, 1));
}

static int metrics_extra(void *userdata, char *buf, size_t size)
{
	return snprintf(buf, size, "# TYPE t_calls counter\nt_calls %u\n",
			atomic_fetch_add((atomic_uint *)userdata, 1));
}

struct sleeper {
	int port;
	int status;
};

static void *sleeper_main(void *arg)
{
	struct sleeper *s = arg;

	s->status = http(s->port, "POST", "/sleep");
	return NULL;
}

/* The server's log callback: counts lines, a little slowly, so that its
 * queue (server/logq.c) fills and drains while clients race. */
static void log_line(enum dormant_log_level level, const char *message, void *userdata)
{
	atomic_uint *lines = userdata;

	(void)level;
	(void)message;
	pause_us(20);
	atomic_fetch_add(lines, 1);
}

static void scenario_http(void)
{
	enum { CLIENTS = 10, REQUESTS = 400 };
	struct dormant *m = manager_new(128 * MiB);
	atomic_uint extra_calls = 0, done = 0, hooks = 0, log_lines = 0;
	struct client clients[CLIENTS];
	struct dormant_server *server = NULL;
	struct sleeper last;
	atomic_bool stop = false;
	pthread_t last_thread;
	void *w;

	if (!m)
		return;
	dormant_set_policy(m, "grads", DORMANT_DISCARD);
	w = alloc_filled(m, "weights", 4 * MiB, 33);
	alloc_filled(m, "grads", 4 * MiB, 0);
	dormant_hook_add(m, DORMANT_HOOK_BEFORE_SLEEP, stats_hook, &hooks);
	dormant_hook_add(m, DORMANT_HOOK_AFTER_WAKE, stats_hook, &hooks);
	struct dormant_server_options *so = NULL;
	int r = dormant_server_options_new(&so);

	if (r == 0)
		r = dormant_server_options_parse(so, "listen=127.0.0.1:0,threads=4,"
					       "max_connections=64");
	if (r == 0)
		r = dormant_server_options_set_stats_extra(so, stats_extra, &extra_calls);
	if (r == 0)
		r = dormant_server_options_set_metrics_extra(so, metrics_extra, &extra_calls);
	if (r == 0)
		r = dormant_server_options_set_log(so, log_line, &log_lines);
	if (r == 0)
		r = dormant_server_start(m, so, &server);
	dormant_server_options_destroy(so);
	if (r < 0) {
		fail("server: %s", dormant_last_error());
		dormant_destroy(m);
		return;
	}
	for (int i = 0; i < CLIENTS; i++) {
		clients[i] = (struct client){ .port = dormant_server_port(server),
					      .orchestrator = i < 4, .stop = &stop, .done = &done };
		pthread_create(&clients[i].thread, NULL, client_main, &clients[i]);
	}
	while (atomic_load(&done) < REQUESTS && !failed())
		pause_us(1000);
	atomic_store(&stop, true);
	for (int i = 0; i < CLIENTS; i++)
		pthread_join(clients[i].thread, NULL);

	/* stop while a sleep is in flight: it runs to its end and is answered */
	while (dormant_wake(m, NULL, NULL) == -EBUSY)
		pause_us(1000);
	last = (struct sleeper){ .port = dormant_server_port(server) };
	pthread_create(&last_thread, NULL, sleeper_main, &last);
	pause_us(2000);
	dormant_server_stop(server);
	pthread_join(last_thread, NULL);
	/* the sleep may have come too late for the stopping server */
	if (last.status != 200 && last.status != 503 && last.status != 0)
		fail("a sleep during stop answered %d", last.status);
	/* every request logged a line, or was counted in a dropped-lines line */
	if (atomic_load(&log_lines) == 0)
		fail("the log callback got no line of %u requests", atomic_load(&done));
	while (dormant_wake(m, NULL, NULL) == -EBUSY)
		pause_us(1000);
	if (w && !holds(m, w, 4 * MiB, 33))
		fail("weights changed over the HTTP cycles");
	dormant_destroy(m);
}

/* ---- disk: a wake's reads streamed on the workers, on two devices at once - */

static void scenario_disk(void)
{
	static const char *const cold[] = { "cold", NULL };
	char dir[256], options[512];
	struct crowd c = { 0 };
	pthread_t reader;
	void *w[2] = { 0 };

	snprintf(dir, sizeof(dir), "%s/dormant-tsan-XXXXXX",
		 getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(dir)) {
		fail("mkdtemp: %s", strerror(errno));
		return;
	}
	/* 1 MiB pieces through 2 MiB slots: each chunk's wake keeps several
	 * reads in flight, and both devices read at once */
	snprintf(options, sizeof(options),
		 "backend=host,host_mode=release,chunk_bytes=4MiB,staging_bytes=8MiB,"
		 "copy_threads=3,host_devices=2,host_device_bytes=64MiB,disk_chunk_bytes=1MiB,"
		 "disk_dir=%s",
		 dir);
	if (manager_from(options, &c.m) < 0) {
		rmdir(dir);
		return;
	}
	dormant_set_policy(c.m, "cold", DORMANT_DISK);
	for (int d = 0; d < 2 && !failed(); d++) {
		unsigned char *buf = malloc(9 * MiB);

		if (!buf) {
			fail("out of memory");
			break;
		}
		for (size_t i = 0; i < 9 * MiB; i++)
			buf[i] = pattern_byte(i, 70 + (unsigned)d);
		if (dormant_alloc_on(c.m, "cold", 9 * MiB, d, &w[d]) < 0 ||
		    dormant_copy_to_device(c.m, w[d], buf, 9 * MiB) < 0)
			fail("device %d: %s", d, dormant_last_error());
		free(buf);
	}
	c.victim_next = 16; /* no freer here */
	pthread_create(&reader, NULL, fault_reader, &c);
	cycle(c.m, cold, 6);
	/* a read that fails mid-stream: the wake fails, the copies stay */
	for (unsigned n = 1; n <= 6 && !failed(); n++) {
		int r;

		while ((r = dormant_sleep(c.m, cold, NULL)) == -EBUSY)
			pause_us(100);
		if (r < 0)
			fail("sleep: %s", dormant_last_error());
		dormant_debug_inject_fault(c.m, DORMANT_FAULT_DISK, n, -EIO, false);
		r = dormant_wake(c.m, cold, NULL);
		dormant_debug_inject_fault(c.m, DORMANT_FAULT_DISK, 0, 0, false);
		if (r < 0 && dormant_wake(c.m, cold, NULL) < 0)
			fail("wake after a failed read %u: %s", n, dormant_last_error());
	}
	atomic_store(&c.stop, true);
	pthread_join(reader, NULL);
	for (int d = 0; d < 2; d++)
		if (w[d] && !holds(c.m, w[d], 9 * MiB, 70 + (unsigned)d))
			fail("device %d's disk copy came back changed", d);
	dormant_destroy(c.m);
	rmdir(dir);
}

/* ---- main ---------------------------------------------------------------- */

static const struct {
	const char *name;
	void (*run)(void);
} scenarios[] = {
	{ "crowd", scenario_crowd },
	{ "guard", scenario_guard },
	{ "policy", scenario_policy },
	{ "torch", scenario_torch },
	{ "modes", scenario_modes },
	{ "reclaim", scenario_reclaim },
	{ "warmup", scenario_warmup },
	{ "faults", scenario_faults },
	{ "devices", scenario_devices },
	{ "disk", scenario_disk },
	{ "http", scenario_http },
};

int main(int argc, char **argv)
{
	size_t count = sizeof(scenarios) / sizeof(scenarios[0]);
	int bad = 0, n = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	for (int a = 1; a < argc; a++) {
		bool known = false;

		for (size_t i = 0; i < count; i++)
			known |= strcmp(argv[a], scenarios[i].name) == 0;
		if (!known) {
			fprintf(stderr, "test-tsan: no scenario '%s'\n", argv[a]);
			return 2;
		}
	}
	printf("1..%d\n", argc > 1 ? argc - 1 : (int)count);
	for (size_t i = 0; i < count; i++) {
		bool wanted = argc == 1;

		for (int a = 1; a < argc; a++)
			wanted |= strcmp(argv[a], scenarios[i].name) == 0;
		if (!wanted)
			continue;
		failure[0] = '\0';
		scenarios[i].run();
		n++;
		if (failure[0]) {
			printf("not ok %d - %s # %s\n", n, scenarios[i].name, failure);
			bad++;
		} else {
			printf("ok %d - %s\n", n, scenarios[i].name);
		}
	}
	return bad ? 1 : 0;
}
