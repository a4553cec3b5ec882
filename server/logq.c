/* SPDX-License-Identifier: MIT */
#include "logq.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* "N log lines dropped" to the callback. */
static void report_dropped(struct log_queue *q, unsigned long long dropped,
			   enum dormant_log_level level)
{
	char note[128];

	snprintf(note, sizeof(note),
		 "%llu log line%s dropped: the log callback was slower than the requests", dropped,
		 dropped == 1 ? "" : "s");
	q->fn(level, note, q->userdata);
}

static void *logq_main(void *arg)
{
	struct log_queue *q = arg;
	struct logq_line line;
	unsigned long long dropped;
	enum dormant_log_level dropped_level;

	pthread_mutex_lock(&q->lock);
	for (;;) {
		while (q->count == 0 && !q->stopping)
			pthread_cond_wait(&q->more, &q->lock);
		if (q->count == 0)
			break; /* stopping, and every line handed over */
		line = q->ring[q->head];
		q->head = (q->head + 1) % LOGQ_LINES;
		q->count--;
		pthread_mutex_unlock(&q->lock);
		/* the callback runs unlocked: lines are put meanwhile */
		if (line.dropped_before)
			report_dropped(q, line.dropped_before, line.dropped_level);
		q->fn(line.level, line.text, q->userdata);
		pthread_mutex_lock(&q->lock);
	}
	dropped = q->dropped; /* after the last line queued */
	dropped_level = q->dropped_level;
	pthread_mutex_unlock(&q->lock);
	if (dropped)
		report_dropped(q, dropped, dropped_level);
	return NULL;
}

int logq_start(struct log_queue *q, dormant_log_fn fn, void *userdata)
{
	int r;

	memset(q, 0, sizeof(*q));
	if (!fn)
		return 0;
	q->ring = calloc(LOGQ_LINES, sizeof(*q->ring));
	if (!q->ring)
		return error_set(-ENOMEM, "out of host memory");
	q->fn = fn;
	q->userdata = userdata;
	pthread_mutex_init(&q->lock, NULL);
	pthread_cond_init(&q->more, NULL);
	r = pthread_create(&q->thread, NULL, logq_main, q);
	if (r != 0) {
		pthread_cond_destroy(&q->more);
		pthread_mutex_destroy(&q->lock);
		free(q->ring);
		memset(q, 0, sizeof(*q));
		return error_set(-r, "starting the server's log thread: %s", strerror(r));
	}
	return 0;
}

void logq_put(struct log_queue *q, enum dormant_log_level level, const char *fmt, ...)
{
	struct logq_line *line;
	va_list ap;

	if (!q->fn)
		return;
	pthread_mutex_lock(&q->lock);
	if (q->count == LOGQ_LINES) {
		if (!q->dropped || level < q->dropped_level)
			q->dropped_level = level;
		q->dropped++;
	} else {
		line = &q->ring[(q->head + q->count) % LOGQ_LINES];
		line->level = level;
		line->dropped_before = q->dropped;
		line->dropped_level = q->dropped_level;
		q->dropped = 0;
		va_start(ap, fmt);
		vsnprintf(line->text, sizeof(line->text), fmt, ap);
		va_end(ap);
		q->count++;
	}
	pthread_cond_signal(&q->more);
	pthread_mutex_unlock(&q->lock);
}

void logq_stop(struct log_queue *q)
{
	if (!q->fn)
		return;
	pthread_mutex_lock(&q->lock);
	q->stopping = true;
	pthread_cond_signal(&q->more);
	pthread_mutex_unlock(&q->lock);
	pthread_join(q->thread, NULL);
	pthread_cond_destroy(&q->more);
	pthread_mutex_destroy(&q->lock);
	free(q->ring);
	memset(q, 0, sizeof(*q));
}
