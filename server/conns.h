/* SPDX-License-Identifier: MIT */
/*
 * The connection table: what keeps the server reachable. Every open
 * connection is tracked. A client that holds max_per_ip connections, or a
 * new connection over max_connections, makes the connection that has waited
 * longest for a request close (shutdown() of its socket: libmicrohttpd then
 * sees the end of the stream and closes it itself). A connection that has
 * not delivered a whole request request_timeout_s after it opened or was
 * last answered is closed the same way by the table's watchdog thread.
 * Connections whose request is being answered are never closed so.
 *
 * Knows nothing of libmicrohttpd: the server hands it socket numbers and
 * client addresses. Every function is thread-safe.
 */
#ifndef DORMANT_SERVER_CONNS_H
#define DORMANT_SERVER_CONNS_H

#include <pthread.h>
#include <stdbool.h>
#include <sys/socket.h>

/* A client's address without its port: what max_per_ip counts. Every Unix
 * socket client is the same one. */
struct client_key {
	int family;
	unsigned char addr[16];
};

/* An open connection. */
struct conn {
	struct conn *prev, *next;
	int fd;
	struct client_key client;
	double waiting_since_s; /* opened, or its last answer completed */
	bool busy;              /* its request is being answered */
	bool closing;           /* shut down by us, libmicrohttpd closes it */
};

struct conn_table {
	/* guards the list, the fields of each conn, and the stop flag */
	pthread_mutex_t lock;
	pthread_cond_t watchdog_cond;
	struct conn *conns;
	unsigned count; /* in the list and not closing */
	unsigned max_connections;
	unsigned max_per_ip;
	double request_timeout_s;
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

/* A new connection on socket fd from addr (NULL: unknown): count it and
 * make room under the limits, maybe by closing it. Returns the connection
 * to hand back to conn_closed(), or NULL (out of memory: untracked). */
struct conn *conn_opened(struct conn_table *t, int fd, const struct sockaddr *addr);
/* The connection is gone (c may be NULL). Frees c. */
void conn_closed(struct conn_table *t, struct conn *c);

/* Its whole request is in: from now on it is being answered, and neither
 * the limits nor the watchdog close it. Returns false (nothing changed) if
 * they closed it already. */
bool conn_answering(struct conn_table *t, struct conn *c);
/* Its answer is done: it waits for the next request from now. */
void conn_waiting(struct conn_table *t, struct conn *c);

#endif
