/* SPDX-License-Identifier: MIT */
/*
 * The connection table: what keeps the server reachable without dropping a
 * request. Every open connection is tracked, and the limits make room only
 * by closing connections that carry no request:
 *
 * - A connection is *idle* when no byte of a request has come since it
 *   opened or was last answered (nothing read by libmicrohttpd, nothing
 *   waiting in the socket, the kernel's count of received bytes unchanged)
 *   and it has been so for idle_grace_s (a client that just connected, or
 *   just got an answer, is about to send: closing it then races its
 *   request). Only idle connections are closed to make room: idle
 *   keep-alive connections (answered before) first, then those that never
 *   sent anything, the longest idle first.
 * - A connection whose request has begun to arrive, or is being answered,
 *   is never closed to make room. (The watchdog still closes one that has
 *   not delivered a whole request request_timeout_s after it opened or was
 *   last answered: a trickling client.)
 * - A new connection over a limit with nothing idle to close takes one of
 *   CONN_SPARE_SLOTS spare slots: its request is read; a probe is answered,
 *   anything else gets 503 with Retry-After; either way it is closed after
 *   that one answer. With the spare slots full it is closed at once.
 * - max_per_ip counts the connections of one client address. Loopback and
 *   Unix socket clients are the trainer's own node (its probes, its
 *   orchestrator, Prometheus through a local agent): they are not counted
 *   per address, only in max_connections. A remote client over its share
 *   closes its own idle connection, or takes at most one spare slot.
 *
 * Closing is shutdown() of the socket: libmicrohttpd then sees the end of
 * the stream and closes the connection itself.
 *
 * Knows nothing of libmicrohttpd: the server hands it socket numbers and
 * client addresses. Every function is thread-safe.
 */
#ifndef DORMANT_SERVER_CONNS_H
#define DORMANT_SERVER_CONNS_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

/* Connections beyond the limits whose one request is read (a probe answered,
 * anything else 503): so that probes get in when every slot carries a
 * request. */
#define CONN_SPARE_SLOTS 8
/* How long a connection must have carried no request before it may be
 * closed to make room. */
#define CONN_IDLE_GRACE_S 1.0
/* Retry-After of the 503 answered on a spare slot. */
#define CONN_RETRY_AFTER_S 1

/* A client's address without its port: what max_per_ip counts. */
struct client_key {
	int family;
	unsigned char addr[16];
};

/* An open connection. */
struct conn {
	struct conn *prev, *next;
	int fd;
	struct client_key client;
	bool local;             /* loopback or Unix socket: not counted per address */
	double waiting_since_s; /* opened, or its last answer completed */
	uint64_t bytes_at_wait; /* bytes the kernel had received then (TCP) */
	bool answered;          /* one answer completed: a keep-alive connection */
	bool receiving;         /* a request has begun to arrive */
	bool busy;              /* its request is being answered */
	bool spare;             /* in a spare slot: one answer, then closed */
	bool closing;           /* shut down by us, libmicrohttpd closes it */
};

struct conn_table {
	/* guards the list, the fields of each conn, and the stop flag */
	pthread_mutex_t lock;
	pthread_cond_t watchdog_cond;
	struct conn *conns;
	unsigned count;       /* in the list, within the limits, not closing */
	unsigned spare_count; /* in the list, in spare slots, not closing */
	unsigned max_connections;
	unsigned max_per_ip;
	double request_timeout_s;
	double idle_grace_s; /* CONN_IDLE_GRACE_S; tests of the table set 0 */
	pthread_t watchdog;
	bool watchdog_running;
	bool watchdog_stop;
};

void conn_table_init(struct conn_table *t, unsigned max_connections, unsigned max_per_ip,
		     double request_timeout_s);
/* Start the watchdog; returns 0 or a positive error number (pthread_create). */
int conn_table_watch(struct conn_table *t);
/* Stop the watchdog, if it runs. */
void conn_table_unwatch(struct conn_table *t);
/* Stop the watchdog (if it runs) and free the table's resources; the
 * connections themselves are freed by conn_closed(). */
void conn_table_finish(struct conn_table *t);

/* A new connection on socket fd from addr (NULL: unknown, counted as one
 * remote client): count it and make room under the limits, by closing an
 * idle connection, or give it a spare slot, or close it. Returns the
 * connection to hand back to conn_closed(), or NULL (out of memory:
 * untracked). */
struct conn *conn_opened(struct conn_table *t, int fd, const struct sockaddr *addr);
/* The connection is gone (c may be NULL). Frees c. */
void conn_closed(struct conn_table *t, struct conn *c);

/* A request has begun to arrive on c (its request line is in): from now on
 * the limits never close c. Returns whether c is in a spare slot (then only
 * a probe is answered on it, and it is closed after its answer). */
bool conn_receiving(struct conn_table *t, struct conn *c);
/* Its whole request is in: from now on it is being answered, and neither
 * the limits nor the watchdog close it. Returns false (nothing changed) if
 * they closed it already. */
bool conn_answering(struct conn_table *t, struct conn *c);
/* Its answer is done: it waits for the next request from now. */
void conn_waiting(struct conn_table *t, struct conn *c);

#endif
