/* SPDX-License-Identifier: MIT */
#include "conns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "listen.h"

/* How often the watchdog looks for connections past request_timeout_s. */
#define WATCHDOG_PERIOD_S 0.25

static double monotonic_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void client_key_of(const struct sockaddr *addr, struct client_key *key)
{
	memset(key, 0, sizeof(*key));
	if (!addr)
		return;
	key->family = addr->sa_family;
	if (addr->sa_family == AF_INET) {
		memcpy(key->addr, &((const struct sockaddr_in *)addr)->sin_addr, 4);
	} else if (addr->sa_family == AF_INET6) {
		const struct in6_addr *a6 = &((const struct sockaddr_in6 *)addr)->sin6_addr;

		/* ::ffff:a.b.c.d is the IPv4 client a.b.c.d */
		if (IN6_IS_ADDR_V4MAPPED(a6)) {
			key->family = AF_INET;
			memcpy(key->addr, &a6->s6_addr[12], 4);
		} else {
			memcpy(key->addr, a6, 16);
		}
	}
}

static bool same_client(const struct conn *a, const struct conn *b)
{
	return memcmp(&a->client, &b->client, sizeof(a->client)) == 0;
}

/* Bytes the kernel has received on a TCP socket since it was accepted
 * (also those libmicrohttpd has read already); -1 for other sockets. */
static int64_t tcp_bytes_received(int fd)
{
	struct tcp_info info;
	socklen_t len = sizeof(info);

	memset(&info, 0, sizeof(info));
	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) < 0 ||
	    len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received))
		return -1;
	return (int64_t)info.tcpi_bytes_received;
}

/* Whether bytes have come on c that libmicrohttpd has read already (the
 * kernel's count moved since c began to wait) though no request line is
 * whole yet. TCP only. */
static bool conn_bytes_read(const struct conn *c)
{
	int64_t received = tcp_bytes_received(c->fd);

	return received >= 0 && (uint64_t)received != c->bytes_at_wait;
}

enum peek {
	PEEK_NOTHING, /* open, nothing waiting */
	PEEK_DATA,    /* bytes of a request wait in the socket */
	PEEK_END,     /* the client has closed (or reset) it */
};

static enum peek conn_peek(const struct conn *c)
{
	char byte;
	ssize_t n = recv(c->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);

	if (n > 0)
		return PEEK_DATA;
	if (n == 0)
		return PEEK_END;
	return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? PEEK_NOTHING
									 : PEEK_END;
}

/* Close c from outside libmicrohttpd: it sees the end of the stream at its
 * next poll and closes the connection itself. t->lock held. */
static void conn_shut(struct conn_table *t, struct conn *c)
{
	if (c->closing)
		return;
	c->closing = true;
	if (c->spare)
		t->spare_count--;
	else
		t->count--;
	shutdown(c->fd, SHUT_RDWR);
}

/* The connection to close to make room, among those of client's client
 * (NULL: anyone's), in spare slots or not: one whose client has closed it
 * already (libmicrohttpd has not seen it yet), else an idle keep-alive
 * connection, else one that never sent anything, the longest idle first;
 * NULL if none. A connection found with bytes of a request waiting is marked
 * receiving on the way. Every connection not yet marked is looked at (a
 * recv(MSG_PEEK) each): only when a new connection goes over a limit.
 * t->lock held. */
static struct conn *conn_idle_victim(struct conn_table *t, const struct conn *client, bool spare,
				     double now)
{
	for (;;) {
		struct conn *best = NULL;

		for (struct conn *o = t->conns; o; o = o->next) {
			if (o->closing || o->spare != spare || o->busy || o->receiving)
				continue;
			if (client && !same_client(o, client))
				continue;
			switch (conn_peek(o)) {
			case PEEK_END:
				return o; /* nothing of it can be answered */
			case PEEK_DATA:
				/* from now on it is never closed to make room
				 * (conn_waiting() clears this after its answer) */
				o->receiving = true;
				continue;
			case PEEK_NOTHING:
				break;
			}
			if (now - o->waiting_since_s < t->idle_grace_s)
				continue;
			if (!best || (o->answered && !best->answered) ||
			    (o->answered == best->answered && o->waiting_since_s < best->waiting_since_s))
				best = o;
		}
		if (!best || !conn_bytes_read(best))
			return best;
		best->receiving = true;
	}
}

/* Connections of c's client counted against max_per_ip (spare: in spare
 * slots instead). t->lock held. */
static unsigned client_count(struct conn_table *t, const struct conn *c, bool spare)
{
	unsigned n = 0;

	for (struct conn *o = t->conns; o; o = o->next)
		if (!o->closing && o->spare == spare && same_client(o, c))
			n++;
	return n;
}

struct conn *conn_opened(struct conn_table *t, int fd, const struct sockaddr *addr)
{
	struct conn *c = calloc(1, sizeof(*c));
	bool over = false;
	double now;

	if (!c)
		return NULL; /* untracked: libmicrohttpd's own limit still holds */
	c->fd = fd;
	client_key_of(addr, &c->client);
	c->local = sockaddr_is_local(addr);
	now = monotonic_s();
	c->waiting_since_s = now;
	c->bytes_at_wait = 0; /* every byte of a fresh connection is a request */

	pthread_mutex_lock(&t->lock);
	/* A remote client over its share makes room among its own. */
	if (!c->local && client_count(t, c, false) + 1 > t->max_per_ip) {
		struct conn *victim = conn_idle_victim(t, c, false, now);

		if (victim)
			conn_shut(t, victim);
		else
			over = true;
	}
	/* Over the limit of all: anyone's idle connection makes room. */
	if (!over && t->count + 1 > t->max_connections) {
		struct conn *victim = conn_idle_victim(t, NULL, false, now);

		if (victim)
			conn_shut(t, victim);
		else
			over = true;
	}
	/* Spare slots full: one whose client is gone or that stays silent
	 * makes room. */
	if (over && t->spare_count >= CONN_SPARE_SLOTS) {
		struct conn *victim = conn_idle_victim(t, NULL, true, now);

		if (victim)
			conn_shut(t, victim);
	}
	if (!over) {
		t->count++;
	} else if (t->spare_count < CONN_SPARE_SLOTS &&
		   (c->local || client_count(t, c, true) == 0)) {
		c->spare = true;
		t->spare_count++;
	} else {
		c->closing = true;
		shutdown(fd, SHUT_RDWR);
	}
	c->next = t->conns;
	if (t->conns)
		t->conns->prev = c;
	t->conns = c;
	pthread_mutex_unlock(&t->lock);
	return c;
}

void conn_closed(struct conn_table *t, struct conn *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&t->lock);
	if (c->prev || t->conns == c) {
		if (c->prev)
			c->prev->next = c->next;
		else
			t->conns = c->next;
		if (c->next)
			c->next->prev = c->prev;
		if (!c->closing) {
			if (c->spare)
				t->spare_count--;
			else
				t->count--;
		}
	}
	pthread_mutex_unlock(&t->lock);
	free(c);
}

bool conn_receiving(struct conn_table *t, struct conn *c)
{
	bool spare;

	pthread_mutex_lock(&t->lock);
	if (!c->closing)
		c->receiving = true;
	spare = c->spare;
	pthread_mutex_unlock(&t->lock);
	return spare;
}

bool conn_answering(struct conn_table *t, struct conn *c)
{
	bool closing;

	pthread_mutex_lock(&t->lock);
	closing = c->closing;
	c->busy = !closing;
	pthread_mutex_unlock(&t->lock);
	return !closing;
}

void conn_waiting(struct conn_table *t, struct conn *c)
{
	int64_t received = tcp_bytes_received(c->fd);

	pthread_mutex_lock(&t->lock);
	c->busy = false;
	c->receiving = false;
	c->answered = true;
	c->waiting_since_s = monotonic_s();
	c->bytes_at_wait = received >= 0 ? (uint64_t)received : 0;
	pthread_mutex_unlock(&t->lock);
}

/* The watchdog: close connections that have waited past request_timeout_s
 * for a whole request. */
static void *watchdog_main(void *arg)
{
	struct conn_table *t = arg;
	struct timespec deadline;

	pthread_mutex_lock(&t->lock);
	while (!t->watchdog_stop) {
		double now = monotonic_s();

		for (struct conn *c = t->conns; c; c = c->next)
			if (!c->busy && !c->closing &&
			    now - c->waiting_since_s > t->request_timeout_s)
				conn_shut(t, c);
		clock_gettime(CLOCK_MONOTONIC, &deadline);
		deadline.tv_nsec += (long)(WATCHDOG_PERIOD_S * 1e9);
		if (deadline.tv_nsec >= 1000000000L) {
			deadline.tv_sec++;
			deadline.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&t->watchdog_cond, &t->lock, &deadline);
	}
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

void conn_table_init(struct conn_table *t, unsigned max_connections, unsigned max_per_ip,
		     double request_timeout_s)
{
	pthread_condattr_t attr;

	memset(t, 0, sizeof(*t));
	t->max_connections = max_connections;
	t->max_per_ip = max_per_ip;
	t->request_timeout_s = request_timeout_s;
	t->idle_grace_s = CONN_IDLE_GRACE_S;
	pthread_mutex_init(&t->lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&t->watchdog_cond, &attr);
	pthread_condattr_destroy(&attr);
}

int conn_table_watch(struct conn_table *t)
{
	int r = pthread_create(&t->watchdog, NULL, watchdog_main, t);

	t->watchdog_running = r == 0;
	return r;
}

void conn_table_unwatch(struct conn_table *t)
{
	if (!t->watchdog_running)
		return;
	pthread_mutex_lock(&t->lock);
	t->watchdog_stop = true;
	pthread_cond_broadcast(&t->watchdog_cond);
	pthread_mutex_unlock(&t->lock);
	pthread_join(t->watchdog, NULL);
	t->watchdog_running = false;
}

void conn_table_finish(struct conn_table *t)
{
	conn_table_unwatch(t);
	pthread_cond_destroy(&t->watchdog_cond);
	pthread_mutex_destroy(&t->lock);
}

