/* SPDX-License-Identifier: MIT */
/*
 * The server's log lines, handed to the caller's log callback on a thread of
 * their own. A thread answering requests only copies a line into a ring and
 * goes on: a slow callback (Python's, which waits for the GIL while the
 * trainer's loop holds it) never holds a request or a connection up. One
 * line at a time reaches the callback, in the order they were put.
 *
 * When the ring is full a line is dropped and counted; the count reaches
 * the callback as one line where the lines went missing (before the next
 * line queued, or last), at the level of the most severe line dropped: a
 * burst of requests costs access lines, said at the access log's level.
 * Every function is thread-safe.
 */
#ifndef DORMANT_SERVER_LOGQ_H
#define DORMANT_SERVER_LOGQ_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "dormant.h"

/* Lines waiting at most; a longer line is cut. */
#define LOGQ_LINES 256
#define LOGQ_LINE_MAX 512

struct logq_line {
	enum dormant_log_level level;
	unsigned long long dropped_before; /* lines dropped just before this one */
	enum dormant_log_level dropped_level; /* the most severe of them */
	char text[LOGQ_LINE_MAX];
};

struct log_queue {
	dormant_log_fn fn; /* NULL: every line dropped, no thread */
	void *userdata;
	pthread_mutex_t lock;
	pthread_cond_t more; /* a line was put, or stopping */
	pthread_t thread;
	bool stopping;
	struct logq_line *ring;	    /* LOGQ_LINES */
	size_t head;		    /* the oldest waiting line */
	size_t count;		    /* lines waiting */
	unsigned long long dropped; /* since the last line queued */
	enum dormant_log_level dropped_level; /* the most severe of them */
};

/* Start the thread that calls fn (nothing to start when fn is NULL).
 * 0, -ENOMEM, or -EAGAIN (no thread), with a message. */
int logq_start(struct log_queue *q, dormant_log_fn fn, void *userdata);

/* Queue one line; never waits for the callback. */
__attribute__((format(printf, 3, 4))) void
logq_put(struct log_queue *q, enum dormant_log_level level, const char *fmt, ...);

/* Hand every waiting line to the callback, then end the thread. Safe on a
 * queue never started, or zeroed. */
void logq_stop(struct log_queue *q);

#endif
