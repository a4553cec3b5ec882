/* SPDX-License-Identifier: MIT */
/* The server's log queue alone (server/logq.c): lines reach the callback in
 * order on a thread of their own, a stuck callback never holds a put up,
 * what overflows is counted where it went missing, and stop hands over
 * every line. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "logq.h"

/* The same timeout as the other suites of this program: with a shorter one,
 * Criterion 2.4's runner leaked 48 bytes under --jobs=2 (LeakSanitizer in the
 * ASan build of .ci/run) whenever this suite ran beside another. */
TestSuite(logq, .timeout = 60);

#define SEEN_MAX (2 * LOGQ_LINES)

struct seen {
	pthread_mutex_t lock;
	pthread_cond_t changed;
	bool hold;      /* the callback waits while set */
	bool holding;   /* it is waiting now */
	pthread_t caller;
	size_t count;
	enum dormant_log_level level[SEEN_MAX];
	char text[SEEN_MAX][LOGQ_LINE_MAX];
};

static void seen_init(struct seen *s)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->changed, NULL);
}

static void on_line(enum dormant_log_level level, const char *message, void *userdata)
{
	struct seen *s = userdata;

	pthread_mutex_lock(&s->lock);
	s->caller = pthread_self();
	while (s->hold) {
		s->holding = true;
		pthread_cond_broadcast(&s->changed);
		pthread_cond_wait(&s->changed, &s->lock);
	}
	s->holding = false;
	if (s->count < SEEN_MAX) {
		s->level[s->count] = level;
		snprintf(s->text[s->count], LOGQ_LINE_MAX, "%s", message);
		s->count++;
	}
	pthread_cond_broadcast(&s->changed);
	pthread_mutex_unlock(&s->lock);
}

/* A queue whose callback is stuck on the line "first": the ring is empty
 * and every line put now waits, until release_locked(). */
static void start_held(struct log_queue *q, struct seen *s)
{
	seen_init(s);
	s->hold = true;
	cr_assert_eq(logq_start(q, on_line, s), 0);
	logq_put(q, DORMANT_LOG_INFO, "first");
	pthread_mutex_lock(&s->lock);
	while (!s->holding)
		pthread_cond_wait(&s->changed, &s->lock);
	pthread_mutex_unlock(&s->lock);
}

/* Let the callback go on; returns with s->lock held. */
static void release_locked(struct seen *s)
{
	pthread_mutex_lock(&s->lock);
	s->hold = false;
	pthread_cond_broadcast(&s->changed);
}

Test(logq, lines_in_order_on_another_thread)
{
	struct log_queue q;
	struct seen s;

	seen_init(&s);
	cr_assert_eq(logq_start(&q, on_line, &s), 0);
	for (int i = 0; i < 100; i++)
		logq_put(&q, i % 2 ? DORMANT_LOG_INFO : DORMANT_LOG_WARNING, "line %d", i);
	logq_stop(&q); /* hands over every line */
	cr_assert_eq(s.count, 100);
	for (int i = 0; i < 100; i++) {
		char want[32];

		snprintf(want, sizeof(want), "line %d", i);
		cr_expect_str_eq(s.text[i], want);
		cr_expect_eq(s.level[i], i % 2 ? DORMANT_LOG_INFO : DORMANT_LOG_WARNING);
	}
	cr_expect_eq(pthread_equal(s.caller, pthread_self()), 0,
		     "the callback ran on the thread that put the lines");
}

/* The callback stuck on the first line: every put still returns at once;
 * the ring keeps LOGQ_LINES, the rest are counted, and the count comes where
 * they went missing, at the level of the most severe dropped. */
Test(logq, a_stuck_callback_never_holds_a_put_up)
{
	const int extra = 40;
	struct log_queue q;
	struct seen s;
	size_t i;

	start_held(&q, &s);
	/* "first" is out of the ring: it holds LOGQ_LINES more */
	for (i = 0; i < LOGQ_LINES; i++)
		logq_put(&q, DORMANT_LOG_INFO, "queued %zu", i);
	for (i = 0; i < (size_t)extra; i++)
		logq_put(&q, i == 7 ? DORMANT_LOG_WARNING : DORMANT_LOG_DEBUG, "lost %zu", i);
	release_locked(&s); /* the callback needs the lock to go on: nothing is in yet */
	cr_assert_eq(s.count, 0, "a line reached the callback while it was held");
	/* room for one more once a queued line is out */
	while (s.count < 2)
		pthread_cond_wait(&s.changed, &s.lock);
	pthread_mutex_unlock(&s.lock);
	logq_put(&q, DORMANT_LOG_INFO, "after");
	logq_stop(&q);

	cr_assert_eq(s.count, 1 + LOGQ_LINES + 2, "%zu lines", s.count);
	cr_expect_str_eq(s.text[0], "first");
	for (i = 0; i < LOGQ_LINES; i++) {
		char want[32];

		snprintf(want, sizeof(want), "queued %zu", i);
		cr_expect_str_eq(s.text[1 + i], want);
	}
	cr_expect_str_eq(s.text[1 + LOGQ_LINES],
			 "40 log lines dropped: the log callback was slower than the requests");
	cr_expect_eq(s.level[1 + LOGQ_LINES], DORMANT_LOG_WARNING);
	cr_expect_str_eq(s.text[2 + LOGQ_LINES], "after");
	for (i = 0; i < s.count; i++)
		cr_expect_null(strstr(s.text[i], "lost"), "%s", s.text[i]);
}

/* Lines dropped after the last one queued are still said, at stop. */
Test(logq, drops_at_the_end_are_said_at_stop)
{
	struct log_queue q;
	struct seen s;

	start_held(&q, &s);
	for (size_t i = 0; i < LOGQ_LINES + 1; i++)
		logq_put(&q, DORMANT_LOG_INFO, "line %zu", i);
	release_locked(&s);
	pthread_mutex_unlock(&s.lock);
	logq_stop(&q);
	cr_assert_eq(s.count, 1 + LOGQ_LINES + 1);
	cr_expect_str_eq(s.text[s.count - 1],
			 "1 log line dropped: the log callback was slower than the requests");
	cr_expect_eq(s.level[s.count - 1], DORMANT_LOG_INFO);
}

Test(logq, no_callback_no_thread)
{
	struct log_queue q;

	cr_assert_eq(logq_start(&q, NULL, NULL), 0);
	cr_expect_null(q.fn, "no callback, yet a queue");
	logq_put(&q, DORMANT_LOG_WARNING, "nowhere");
	logq_stop(&q);
	logq_stop(&q); /* twice: still fine */
	{
		struct log_queue zeroed = { 0 };

		logq_stop(&zeroed);
	}
}

Test(logq, a_long_line_is_cut)
{
	struct log_queue q;
	struct seen s;
	char *big = malloc(4 * LOGQ_LINE_MAX);

	cr_assert(big);
	memset(big, 'x', 4 * LOGQ_LINE_MAX - 1);
	big[4 * LOGQ_LINE_MAX - 1] = '\0';
	seen_init(&s);
	cr_assert_eq(logq_start(&q, on_line, &s), 0);
	logq_put(&q, DORMANT_LOG_INFO, "%s", big);
	logq_stop(&q);
	cr_assert_eq(s.count, 1);
	cr_expect_eq(strlen(s.text[0]), LOGQ_LINE_MAX - 1);
	free(big);
}
