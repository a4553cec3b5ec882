/* SPDX-License-Identifier: MIT */
/* Transitions that fail, collide or run long: 503 and retry, 500 after
 * rollback, 409, readiness, stopping during a transition, and many clients
 * reading while sleep and wake cycle. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client.h"

/* A hook that holds a transition until the test lets it go. */
struct gate {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool entered;
	bool released;
};

static struct gate gate = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false };

static int gate_hook(struct dormant *m, enum dormant_hook_point point, void *userdata)
{
	struct gate *g = userdata;

	pthread_mutex_lock(&g->lock);
	g->entered = true;
	pthread_cond_broadcast(&g->cond);
	while (!g->released)
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
	return 0;
}

static void gate_wait_entered(struct gate *g)
{
	pthread_mutex_lock(&g->lock);
	while (!g->entered)
		pthread_cond_wait(&g->cond, &g->lock);
	pthread_mutex_unlock(&g->lock);
}

static void gate_release(struct gate *g)
{
	pthread_mutex_lock(&g->lock);
	g->released = true;
	pthread_cond_broadcast(&g->cond);
	pthread_mutex_unlock(&g->lock);
}

struct async_post {
	struct fixture *f;
	const char *path;
	pthread_t thread;
	struct http_response response;
};

static void *async_post_main(void *arg)
{
	struct async_post *a = arg;
	struct http_request req = { .method = "POST", .path = a->path, .timeout_ms = 120000 };

	http_do(a->f, &req, &a->response);
	return NULL;
}

static void async_post_start(struct async_post *a, struct fixture *f, const char *path)
{
	a->f = f;
	a->path = path;
	cr_assert_eq(pthread_create(&a->thread, NULL, async_post_main, a), 0);
}

static int occupy_all_free(struct fixture *f)
{
	struct dormant_stats *stats = malloc(sizeof(*stats));
	int r;

	cr_assert(stats);
	cr_assert_eq(dormant_stats_get(f->m, stats), 0);
	cr_assert_geq(stats->device_count, 1);
	r = dormant_debug_occupy(f->m, stats->devices[0].ordinal, stats->devices[0].free_bytes);
	free(stats);
	return r;
}

TestSuite(transitions, .timeout = 120);

Test(transitions, wake_without_device_memory_is_503_then_retry_works)
{
	struct fixture f;
	struct http_response r;
	char retry[16];
	json_t *doc;

	fixture_start(&f, NULL);
	http_post(&f, "/sleep", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_response_free(&r);

	/* a rollout engine takes the device memory */
	cr_assert_eq(occupy_all_free(&f), 0, "%s", dormant_last_error());
	for (int attempt = 0; attempt < 2; attempt++) {
		http_post(&f, "/wake", NULL, &r);
		assert_problem(&r, 503, "out-of-memory");
		cr_assert(http_header(&r, "Retry-After", retry, sizeof(retry)));
		cr_assert_gt(atoi(retry), 0);
		doc = http_json(&r);
		cr_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "report"),
								   "result")),
				 "ENOMEM");
		cr_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "report"),
								   "state")),
				 "asleep");
		json_decref(doc);
		http_response_free(&r);
		cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
		cr_assert_str_eq(tag_state(&f, "grads"), "asleep");
	}
	http_get(&f, "/is_sleeping", &r);
	cr_assert_str_eq(r.body, "{\"is_sleeping\":true}\n");
	http_response_free(&r);

	/* it gives the memory back: the same request now works */
	cr_assert_eq(dormant_debug_occupy(f.m, 0, 0), 0);
	http_post(&f, "/wake", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_response_free(&r);
	cr_assert(weights_intact(&f));
	cr_assert(grads_zero(&f));
	fixture_stop(&f);
}

Test(transitions, injected_enomem_on_wake_is_503)
{
	struct fixture f;
	struct http_response r;

	fixture_start(&f, NULL);
	http_post(&f, "/sleep", NULL, &r);
	http_response_free(&r);
	cr_assert_eq(dormant_debug_inject_fault(f.m, DORMANT_FAULT_CREATE, 1, -ENOMEM, false), 0);
	http_post(&f, "/wake_up", NULL, &r);
	assert_problem(&r, 503, "out-of-memory");
	http_response_free(&r);
	http_post(&f, "/wake_up", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_response_free(&r);
	cr_assert(weights_intact(&f));
	fixture_stop(&f);
}

Test(transitions, device_error_on_sleep_is_500_after_rollback)
{
	struct fixture f;
	struct http_response r;
	json_t *doc;

	fixture_start(&f, NULL);
	cr_assert_eq(dormant_debug_inject_fault(f.m, DORMANT_FAULT_COPY, 1, -EIO, false), 0);
	http_post(&f, "/sleep", NULL, &r);
	assert_problem(&r, 500, "device-error");
	doc = http_json(&r);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "report"),
							   "result")),
			 "EIO");
	json_decref(doc);
	http_response_free(&r);
	/* rolled back: awake, bytes intact, and the server still serves */
	cr_assert_str_eq(tag_state(&f, "weights"), "awake");
	cr_assert(weights_intact(&f));
	http_post(&f, "/sleep", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_response_free(&r);
	http_post(&f, "/wake", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_response_free(&r);
	cr_assert(weights_intact(&f));
	fixture_stop(&f);
}

Test(transitions, device_error_on_wake_is_500_and_stays_asleep)
{
	struct fixture f;
	struct http_response r;

	fixture_start(&f, NULL);
	http_post(&f, "/sleep", NULL, &r);
	http_response_free(&r);
	cr_assert_eq(dormant_debug_inject_fault(f.m, DORMANT_FAULT_MAP, 2, -EIO, false), 0);
	http_post(&f, "/wake", NULL, &r);
	assert_problem(&r, 500, "device-error");
	http_response_free(&r);
	cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
	http_post(&f, "/wake", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_response_free(&r);
	cr_assert(weights_intact(&f));
	fixture_stop(&f);
}

Test(transitions, busy_while_another_transition_runs)
{
	struct fixture f;
	struct async_post sleeper = { 0 };
	struct http_response r;
	json_t *doc;

	fixture_start(&f, NULL);
	cr_assert_gt(dormant_hook_add(f.m, DORMANT_HOOK_BEFORE_SLEEP, gate_hook, &gate), 0);
	async_post_start(&sleeper, &f, "/sleep");
	gate_wait_entered(&gate);

	http_post(&f, "/wake", NULL, &r);
	assert_problem(&r, 409, "busy");
	doc = http_json(&r);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(doc, "report"),
							   "result")),
			 "EBUSY");
	json_decref(doc);
	http_response_free(&r);
	http_post(&f, "/sleep", "{\"tags\": [\"weights\"]}", &r);
	assert_problem(&r, 409, "busy");
	http_response_free(&r);

	/* probes and reads still answer while it runs */
	http_get(&f, "/healthz", &r);
	cr_assert_eq(r.status, 200);
	http_response_free(&r);
	http_get(&f, "/stats", &r);
	cr_assert_eq(r.status, 200);
	doc = http_json(&r);
	cr_assert(json_is_true(json_object_get(doc, "transition_running")));
	cr_assert_str_eq(json_string_value(json_object_get(doc, "state")), "awake");
	json_decref(doc);
	http_response_free(&r);
	http_get(&f, "/metrics", &r);
	cr_assert_eq(r.status, 200);
	cr_assert(strstr(r.body, "\ndormant_transition_running 1\n"));
	cr_assert(strstr(r.body, "dormant_transitions_total{kind=\"wake\",result=\"busy\"} 1\n"));
	cr_assert(strstr(r.body, "dormant_transitions_total{kind=\"sleep\",result=\"busy\"} 1\n"));
	http_response_free(&r);

	gate_release(&gate);
	pthread_join(sleeper.thread, NULL);
	cr_assert_eq(sleeper.response.status, 200, "%s", sleeper.response.body);
	http_response_free(&sleeper.response);
	cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
	fixture_stop(&f);
}

Test(transitions, busy_when_the_guard_is_held)
{
	struct fixture_config config = { .guard_timeout_ms = 100 };
	struct fixture f;
	struct http_response r;
	json_t *doc;

	fixture_start(&f, &config);
	cr_assert_eq(dormant_step_enter(f.m, 0), 0);
	http_post(&f, "/sleep", NULL, &r);
	assert_problem(&r, 409, "busy");
	doc = http_json(&r);
	cr_assert(strstr(json_string_value(json_object_get(doc, "detail")), "guard"), "%s", r.body);
	json_decref(doc);
	http_response_free(&r);
	cr_assert_str_eq(tag_state(&f, "weights"), "awake");

	http_get(&f, "/stats", &r);
	doc = http_json(&r);
	cr_assert_eq(json_integer_value(json_object_get(doc, "steps_running")), 1);
	json_decref(doc);
	http_response_free(&r);

	cr_assert_eq(dormant_step_leave(f.m), 0);
	http_post(&f, "/sleep", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_response_free(&r);
	fixture_stop(&f);
}

Test(transitions, a_long_transition_does_not_hold_up_other_requests)
{
	/* one server thread: the transition must run off it */
	struct fixture_config config = { .server = { .threads = 1, .max_connections = 8 } };
	struct async_post sleeper = { 0 };
	CURL *kept = curl_easy_init();
	struct fixture f;
	struct http_response r;

	cr_assert(kept);
	fixture_start(&f, &config);
	{
		/* a connection kept alive from before the transition */
		struct http_request req = { .path = "/healthz", .handle = kept };

		http_do(&f, &req, &r);
		cr_assert_eq(r.status, 200);
		http_response_free(&r);
	}
	cr_assert_gt(dormant_hook_add(f.m, DORMANT_HOOK_BEFORE_SLEEP, gate_hook, &gate), 0);
	async_post_start(&sleeper, &f, "/sleep");
	gate_wait_entered(&gate);
	for (int i = 0; i < 3; i++) {
		struct http_request req = { .path = i == 1 ? "/metrics" : "/stats", .handle = kept,
					    .timeout_ms = 20000 };

		http_do(&f, &req, &r);
		cr_assert_eq(r.status, 200, "%s", curl_easy_strerror(r.curl_error));
		http_response_free(&r);
	}
	{
		struct http_request req = { .path = "/healthz", .timeout_ms = 20000 };

		http_do(&f, &req, &r);
		cr_assert_eq(r.status, 200, "%s", curl_easy_strerror(r.curl_error));
		http_response_free(&r);
	}
	{
		struct http_request req = { .method = "POST", .path = "/wake", .handle = kept,
					    .timeout_ms = 20000 };

		http_do(&f, &req, &r);
		assert_problem(&r, 409, "busy");
		http_response_free(&r);
	}
	gate_release(&gate);
	pthread_join(sleeper.thread, NULL);
	cr_assert_eq(sleeper.response.status, 200, "%s", sleeper.response.body);
	http_response_free(&sleeper.response);
	curl_easy_cleanup(kept);
	fixture_stop(&f);
}

static int refuse_hook(struct dormant *m, enum dormant_hook_point point, void *userdata)
{
	return 7;
}

Test(transitions, a_hook_that_refuses_is_409_cancelled)
{
	struct fixture f;
	struct http_response r;

	fixture_start(&f, NULL);
	cr_assert_gt(dormant_hook_add(f.m, DORMANT_HOOK_BEFORE_SLEEP, refuse_hook, NULL), 0);
	http_post(&f, "/sleep", NULL, &r);
	assert_problem(&r, 409, "cancelled");
	http_response_free(&r);
	cr_assert_str_eq(tag_state(&f, "weights"), "awake");
	fixture_stop(&f);
}

Test(transitions, readyz_fails_after_a_failed_rollback_and_a_wake_recovers)
{
	/* small chunks: some are released before the failing copy, and the
	 * rollback cannot map them again */
	struct fixture_config config = { .chunk_bytes = (size_t)2 << 20 };
	struct fixture f;
	struct http_response r;
	json_t *doc;

	fixture_start(&f, &config);
	cr_assert_eq(dormant_debug_inject_fault(f.m, DORMANT_FAULT_COPY, 3, -EIO, false), 0);
	cr_assert_eq(dormant_debug_inject_fault(f.m, DORMANT_FAULT_CREATE, 1, -EIO, true), 0);
	http_post(&f, "/sleep", NULL, &r);
	assert_problem(&r, 500, "device-error");
	http_response_free(&r);

	http_get(&f, "/readyz", &r);
	assert_problem(&r, 503, "not-ready");
	http_response_free(&r);
	http_get(&f, "/healthz", &r);
	cr_assert_eq(r.status, 200);
	http_response_free(&r);
	http_get(&f, "/stats", &r);
	doc = http_json(&r);
	cr_assert(json_is_false(json_object_get(doc, "healthy")));
	cr_assert_gt(strlen(json_string_value(json_object_get(doc, "health_error"))), 0);
	json_decref(doc);
	http_response_free(&r);
	http_get(&f, "/metrics", &r);
	cr_assert(strstr(r.body, "\ndormant_healthy 0\n"));
	http_response_free(&r);

	cr_assert_eq(dormant_debug_inject_fault(f.m, DORMANT_FAULT_CREATE, 0, 0, false), 0);
	http_post(&f, "/wake", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_response_free(&r);
	http_get(&f, "/readyz", &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_response_free(&r);
	cr_assert(weights_intact(&f));
	fixture_stop(&f);
}

struct stopper {
	struct dormant_server *server;
	pthread_t thread;
	atomic_bool done;
};

static void *stopper_main(void *arg)
{
	struct stopper *s = arg;

	dormant_server_stop(s->server);
	atomic_store(&s->done, true);
	return NULL;
}

Test(transitions, stop_waits_for_a_transition_in_flight)
{
	struct fixture f;
	struct async_post sleeper = { 0 };
	struct stopper stopper = { 0 };
	struct http_response r;
	struct timespec pause = { 0, 20 * 1000 * 1000 };
	bool refused = false;

	fixture_start(&f, NULL);
	cr_assert_gt(dormant_hook_add(f.m, DORMANT_HOOK_BEFORE_SLEEP, gate_hook, &gate), 0);
	async_post_start(&sleeper, &f, "/sleep");
	gate_wait_entered(&gate);

	stopper.server = f.server;
	f.server = NULL;
	cr_assert_eq(pthread_create(&stopper.thread, NULL, stopper_main, &stopper), 0);

	/* new connections are refused soon after stop begins */
	for (int i = 0; i < 500 && !refused; i++) {
		struct http_request req = { .path = "/healthz", .timeout_ms = 2000 };

		http_do(&f, &req, &r);
		refused = r.curl_error == CURLE_COULDNT_CONNECT;
		http_response_free(&r);
		if (!refused)
			nanosleep(&pause, NULL);
	}
	cr_assert(refused, "stop kept accepting connections");
	/* however long the transition takes, stop waits for it */
	for (int i = 0; i < 10; i++)
		nanosleep(&pause, NULL);
	cr_assert_not(atomic_load(&stopper.done), "stop returned during a transition");

	gate_release(&gate);
	pthread_join(stopper.thread, NULL);
	pthread_join(sleeper.thread, NULL);
	cr_assert(atomic_load(&stopper.done));
	/* the transition ran to its end and its answer was sent */
	cr_assert_eq(sleeper.response.status, 200, "curl: %s; %s",
		     curl_easy_strerror(sleeper.response.curl_error), sleeper.response.body);
	http_response_free(&sleeper.response);
	cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
	cr_assert_str_eq(tag_state(&f, "grads"), "asleep");
	cr_assert_eq(dormant_wake(f.m, NULL, NULL), 0);
	cr_assert(weights_intact(&f));
	fixture_stop(&f);
}

struct reader {
	struct fixture *f;
	pthread_t thread;
	atomic_bool *stop;
	_Atomic unsigned ok;
	_Atomic unsigned failed;
	char failure[256];
};

static void *reader_main(void *arg)
{
	struct reader *rd = arg;
	CURL *handle = curl_easy_init();

	for (unsigned i = 0; handle && !atomic_load(rd->stop); i++) {
		struct http_request req = { .path = i % 2 ? "/metrics" : "/stats",
					    .handle = handle };
		struct http_response r;
		json_error_t error;
		json_t *doc = NULL;

		http_do(rd->f, &req, &r);
		if (r.status == 200 && i % 2 == 0)
			doc = json_loadb(r.body, r.size, 0, &error);
		if (r.status == 200 && (i % 2 || doc) &&
		    (i % 2 == 0 || strstr(r.body, "dormant_tag_state{"))) {
			atomic_fetch_add(&rd->ok, 1);
		} else {
			atomic_fetch_add(&rd->failed, 1);
			snprintf(rd->failure, sizeof(rd->failure), "%s: %ld %s: %.100s", req.path,
				 r.status, curl_easy_strerror(r.curl_error), r.body);
		}
		json_decref(doc);
		http_response_free(&r);
	}
	curl_easy_cleanup(handle);
	return NULL;
}

Test(transitions, many_readers_while_sleep_and_wake_cycle)
{
	enum { READERS = 8, CYCLES = 25 };
	struct fixture_config config = { .server = { .threads = 4, .max_connections = 64 } };
	struct reader readers[READERS] = { 0 };
	atomic_bool stop = false;
	struct fixture f;
	unsigned reads = 0;

	fixture_start(&f, &config);
	for (int i = 0; i < READERS; i++) {
		readers[i].f = &f;
		readers[i].stop = &stop;
		cr_assert_eq(pthread_create(&readers[i].thread, NULL, reader_main, &readers[i]), 0);
	}
	/* every reader is going before the cycles start */
	for (int i = 0; i < READERS; i++) {
		struct timespec pause = { 0, 1000 * 1000 };

		while (atomic_load(&readers[i].ok) + atomic_load(&readers[i].failed) == 0)
			nanosleep(&pause, NULL);
	}
	for (int c = 0; c < CYCLES; c++) {
		struct http_response r;

		http_post(&f, "/sleep", NULL, &r);
		cr_assert_eq(r.status, 200, "cycle %d: %s", c, r.body);
		http_response_free(&r);
		http_post(&f, "/wake", NULL, &r);
		cr_assert_eq(r.status, 200, "cycle %d: %s", c, r.body);
		http_response_free(&r);
	}
	atomic_store(&stop, true);
	for (int i = 0; i < READERS; i++) {
		pthread_join(readers[i].thread, NULL);
		cr_expect_eq(atomic_load(&readers[i].failed), 0, "reader %d: %u failed, e.g. %s", i,
			     atomic_load(&readers[i].failed), readers[i].failure);
		reads += atomic_load(&readers[i].ok);
	}
	cr_assert_gt(reads, 0);
	cr_assert(weights_intact(&f));
	cr_assert(grads_zero(&f));
	fixture_stop(&f);
}
