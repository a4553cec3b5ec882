/* SPDX-License-Identifier: MIT */
#include "conns.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
	/* AF_UNIX: every client is the same one */
}

/* Close c from outside libmicrohttpd: it sees the end of the stream at its
 * next poll and closes the connection itself. t->lock held. */
static void conn_shut(struct conn_table *t, struct conn *c)
{
	if (c->closing)
		return;
	c->closing = true;
	t->count--;
	shutdown(c->fd, SHUT_RDWR);
}

/* The connection that has waited longest for a request, among those of
 * client (NULL: any), other than skip; NULL if all are busy. t->lock held. */
static struct conn *conn_oldest_waiting(struct conn_table *t, const struct client_key *client,
					const struct conn *skip)
{
	struct conn *oldest = NULL;

	for (struct conn *c = t->conns; c; c = c->next) {
		if (c == skip || c->busy || c->closing)
			continue;
		if (client && memcmp(&c->client, client, sizeof(*client)) != 0)
			continue;
		if (!oldest || c->waiting_since_s < oldest->waiting_since_s)
			oldest = c;
	}
	return oldest;
}

struct conn *conn_opened(struct conn_table *t, int fd, const struct sockaddr *addr)
{
	struct conn *c = calloc(1, sizeof(*c));
	unsigned same_client = 0;

	if (!c)
		return NULL; /* untracked: libmicrohttpd's own limit still holds */
	c->fd = fd;
	client_key_of(addr, &c->client);
	c->waiting_since_s = monotonic_s();

	pthread_mutex_lock(&t->lock);
	for (struct conn *o = t->conns; o; o = o->next)
		if (!o->closing && memcmp(&o->client, &c->client, sizeof(c->client)) == 0)
			same_client++;
	c->next = t->conns;
	if (t->conns)
		t->conns->prev = c;
	t->conns = c;
	t->count++;
	/* This client over its share: one of its own connections makes room
	 * (the new one itself when all the others are being answered). */
	if (same_client + 1 > t->max_per_ip) {
		struct conn *victim = conn_oldest_waiting(t, &c->client, c);

		conn_shut(t, victim ? victim : c);
	}
	/* Over the limit of all: anyone's, oldest first. */
	if (!c->closing && t->count > t->max_connections) {
		struct conn *victim = conn_oldest_waiting(t, NULL, c);

		conn_shut(t, victim ? victim : c);
	}
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
		if (!c->closing)
			t->count--;
	}
	pthread_mutex_unlock(&t->lock);
	free(c);
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
	pthread_mutex_lock(&t->lock);
	c->busy = false;
	c->waiting_since_s = monotonic_s();
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

