/* SPDX-License-Identifier: MIT */
/*
 * The connection table (server/conns.c) alone: connections are socket pairs
 * (or a loopback TCP pair where the kernel's byte count matters) with
 * made-up client addresses, so that per-address counting is tested with
 * remote addresses without a network. No watchdog runs; the idle grace is
 * set to 0 unless a test is about it.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "conns.h"

/* a hang guard only (a broken table could loop) */
TestSuite(conns, .timeout = 60);

#define MAX_CONNS 32

struct table_fixture {
	struct conn_table t;
	struct conn *conns[MAX_CONNS];
	int fds[MAX_CONNS];   /* the server's end of each connection */
	int peers[MAX_CONNS]; /* the client's end */
	unsigned count;
};

static void table_start(struct table_fixture *f, unsigned max_connections, unsigned max_per_ip)
{
	memset(f, 0, sizeof(*f));
	conn_table_init(&f->t, max_connections, max_per_ip, 3600);
	f->t.idle_grace_s = 0;
}

static void table_stop(struct table_fixture *f)
{
	for (unsigned i = 0; i < f->count; i++) {
		if (!f->conns[i])
			continue; /* closed by the test */
		conn_closed(&f->t, f->conns[i]);
		close(f->fds[i]);
		close(f->peers[i]);
	}
	conn_table_finish(&f->t);
}

/* A client address: "unix", an IPv6 or an IPv4 address. */
static socklen_t address_of(const char *client, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (strcmp(client, "unix") == 0) {
		ss->ss_family = AF_UNIX;
		return sizeof(struct sockaddr_un);
	}
	if (strchr(client, ':')) {
		struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;

		a6->sin6_family = AF_INET6;
		cr_assert_eq(inet_pton(AF_INET6, client, &a6->sin6_addr), 1, "%s", client);
		return sizeof(*a6);
	}
	struct sockaddr_in *a4 = (struct sockaddr_in *)ss;

	a4->sin_family = AF_INET;
	cr_assert_eq(inet_pton(AF_INET, client, &a4->sin_addr), 1, "%s", client);
	return sizeof(*a4);
}

/* A new connection from client over a socket pair; returns its index. */
static unsigned open_from(struct table_fixture *f, const char *client)
{
	struct sockaddr_storage ss;
	int sv[2];
	unsigned i = f->count;

	cr_assert_lt(i, MAX_CONNS);
	address_of(client, &ss);
	cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	f->conns[i] = conn_opened(&f->t, sv[0], (struct sockaddr *)&ss);
	cr_assert_not_null(f->conns[i]);
	f->fds[i] = sv[0];
	f->peers[i] = sv[1];
	f->count++;
	return i;
}

/* Its request came and was answered: an idle keep-alive connection. */
static void serve_once(struct table_fixture *f, unsigned i)
{
	cr_assert_eq(conn_receiving(&f->t, f->conns[i]), false);
	cr_assert(conn_answering(&f->t, f->conns[i]));
	conn_waiting(&f->t, f->conns[i]);
}

static bool closed(struct table_fixture *f, unsigned i)
{
	bool closing;

	pthread_mutex_lock(&f->t.lock);
	closing = f->conns[i]->closing;
	pthread_mutex_unlock(&f->t.lock);
	if (closing) {
		char byte;

		/* and the socket was shut: its client reads the end */
		cr_assert_eq(recv(f->peers[i], &byte, 1, MSG_DONTWAIT), 0);
	}
	return closing;
}

static bool spare(struct table_fixture *f, unsigned i)
{
	return f->conns[i]->spare;
}

/* ---- requests in flight -------------------------------------------------- */

/* A full table of connections that each carry a request, in every stage:
 * begun (request line in), bytes sent but not read yet, being answered.
 * A newcomer closes none of them: it gets a spare slot. */
Test(conns, in_flight_request_is_never_closed)
{
	struct table_fixture f;
	unsigned begun, unread, answering, late;

	table_start(&f, 3, 3);
	begun = open_from(&f, "10.0.0.1");
	unread = open_from(&f, "10.0.0.2");
	answering = open_from(&f, "10.0.0.3");
	cr_assert_eq(conn_receiving(&f.t, f.conns[begun]), false);
	cr_assert_eq(send(f.peers[unread], "GET / HTTP/1.1\r\n", 16, 0), 16);
	conn_receiving(&f.t, f.conns[answering]);
	cr_assert(conn_answering(&f.t, f.conns[answering]));

	late = open_from(&f, "10.0.0.4");
	cr_assert_not(closed(&f, begun), "a request that had begun was closed to make room");
	cr_assert_not(closed(&f, unread), "a request waiting in the socket was closed");
	cr_assert_not(closed(&f, answering), "a request being answered was closed");
	cr_assert(spare(&f, late));
	cr_assert_not(closed(&f, late));
	cr_assert(conn_receiving(&f.t, f.conns[late]), "the newcomer is not told it is spare");
	table_stop(&f);
}

/* Bytes of a request libmicrohttpd has read already (nothing waits in the
 * socket) while its request line is not whole: the kernel's count of
 * received bytes says a request is arriving. A real loopback TCP pair. */
Test(conns, request_read_in_part_is_never_closed)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	struct table_fixture f;
	char buf[64];
	int listener, client, server;
	unsigned late;

	table_start(&f, 1, 1);
	listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(listener, 0);
	cr_assert_eq(bind(listener, (struct sockaddr *)&a, sizeof(a)), 0);
	cr_assert_eq(listen(listener, 4), 0);
	cr_assert_eq(getsockname(listener, (struct sockaddr *)&a, &len), 0);
	client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_eq(connect(client, (struct sockaddr *)&a, sizeof(a)), 0);
	server = accept(listener, NULL, NULL);
	cr_assert_geq(server, 0);
	close(listener);
	{
		struct sockaddr_storage ss;

		address_of("10.0.0.1", &ss);
		f.conns[0] = conn_opened(&f.t, server, (struct sockaddr *)&ss);
		cr_assert_not_null(f.conns[0]);
		f.fds[0] = server;
		f.peers[0] = client;
		f.count = 1;
	}
	/* half a request line, read by "libmicrohttpd" */
	cr_assert_eq(send(client, "GET /hea", 8, 0), 8);
	cr_assert_eq(recv(server, buf, 8, MSG_WAITALL), 8);

	late = open_from(&f, "10.0.0.2");
	cr_assert_not(closed(&f, 0), "a request read in part was closed to make room");
	cr_assert(spare(&f, late));
	table_stop(&f);
}

/* A connection that has just opened (or just been answered) and sent
 * nothing yet is about to send: within the idle grace it is not closed. */
Test(conns, just_opened_connection_is_not_closed)
{
	struct table_fixture f;
	unsigned fresh, late;

	table_start(&f, 1, 1);
	f.t.idle_grace_s = 3600; /* longer than any pause of this test */
	fresh = open_from(&f, "10.0.0.1");
	late = open_from(&f, "10.0.0.2");
	cr_assert_not(closed(&f, fresh), "a connection within its grace was closed");
	cr_assert(spare(&f, late));
	table_stop(&f);
}

/* ---- what makes room ----------------------------------------------------- */

/* Idle keep-alive connections are closed first, the longest idle first;
 * one that never sent anything only when no keep-alive one is left. */
Test(conns, idle_keepalive_is_closed_first)
{
	struct table_fixture f;
	unsigned silent, kept1, kept2, d, e, g;

	table_start(&f, 3, 3);
	silent = open_from(&f, "10.0.0.1"); /* the longest waiting */
	kept1 = open_from(&f, "10.0.0.2");
	serve_once(&f, kept1);
	kept2 = open_from(&f, "10.0.0.3");
	serve_once(&f, kept2);

	d = open_from(&f, "10.0.0.4");
	cr_assert(closed(&f, kept1), "the oldest idle keep-alive connection was not closed");
	cr_assert_not(closed(&f, silent), "a silent connection went before a keep-alive one");
	cr_assert_not(closed(&f, kept2));
	cr_assert_not(spare(&f, d));
	serve_once(&f, d);

	e = open_from(&f, "10.0.0.5");
	cr_assert(closed(&f, kept2), "the next idle keep-alive connection was not closed");
	cr_assert_not(closed(&f, silent));
	conn_receiving(&f.t, f.conns[e]);
	cr_assert(conn_answering(&f.t, f.conns[e]));

	g = open_from(&f, "10.0.0.6");
	cr_assert(closed(&f, d), "the keep-alive connection did not go first");
	cr_assert_not(closed(&f, silent));
	cr_assert_not(spare(&f, g));
	table_stop(&f);
}

/* With no keep-alive connection idle, the silent one makes room. */
Test(conns, silent_connection_makes_room_after_keepalives)
{
	struct table_fixture f;
	unsigned silent, busy, late;

	table_start(&f, 2, 2);
	silent = open_from(&f, "10.0.0.1");
	busy = open_from(&f, "10.0.0.2");
	conn_receiving(&f.t, f.conns[busy]);
	late = open_from(&f, "10.0.0.3");
	cr_assert(closed(&f, silent));
	cr_assert_not(closed(&f, busy));
	cr_assert_not(spare(&f, late));
	table_stop(&f);
}

/* A connection whose client has closed it (libmicrohttpd has not seen the
 * end yet) makes room first, within the idle grace too: nothing on it can
 * be answered. A client's flood of short connections leaves such ones
 * behind. */
Test(conns, connection_its_client_closed_makes_room_first)
{
	struct table_fixture f;
	unsigned kept, gone, late;

	table_start(&f, 2, 2);
	f.t.idle_grace_s = 3600; /* nothing is idle long enough */
	kept = open_from(&f, "10.0.0.1");
	serve_once(&f, kept);
	gone = open_from(&f, "10.0.0.2");
	serve_once(&f, gone);
	cr_assert_eq(shutdown(f.peers[gone], SHUT_WR), 0); /* its client closes */
	late = open_from(&f, "10.0.0.3");
	cr_assert(f.conns[gone]->closing, "a connection its client closed held its slot");
	cr_assert_not(closed(&f, kept));
	cr_assert_not(spare(&f, late));
	table_stop(&f);
}

/* ---- spare slots --------------------------------------------------------- */

/* With every slot carrying a request, newcomers take the spare slots (where
 * a probe is answered) until those are full, then are closed at once; a
 * closed spare slot is free again. */
Test(conns, spare_slots_then_refusal)
{
	struct table_fixture f;
	unsigned busy, first = 0, over;

	table_start(&f, 1, 1);
	busy = open_from(&f, "127.0.0.1");
	conn_receiving(&f.t, f.conns[busy]);
	for (unsigned i = 0; i < CONN_SPARE_SLOTS; i++) {
		unsigned c = open_from(&f, "127.0.0.1");

		if (i == 0)
			first = c;
		cr_assert(spare(&f, c), "newcomer %u has no spare slot", i);
		cr_assert_not(closed(&f, c));
		conn_receiving(&f.t, f.conns[c]); /* its request arrives */
	}
	over = open_from(&f, "127.0.0.1");
	cr_assert(closed(&f, over), "a newcomer beyond the spare slots was kept");
	cr_assert_not(closed(&f, busy));

	/* a spare connection answered and gone frees its slot */
	conn_closed(&f.t, f.conns[first]);
	f.conns[first] = NULL;
	close(f.fds[first]);
	close(f.peers[first]);
	over = open_from(&f, "127.0.0.1");
	cr_assert(spare(&f, over));
	cr_assert_not(closed(&f, over));
	table_stop(&f);
}

/* Spare slots held by connections that send nothing (past the idle grace)
 * do not keep a probe out: a newcomer closes one and takes its slot. */
Test(conns, silent_spare_slot_makes_room)
{
	struct table_fixture f;
	unsigned busy, silent[CONN_SPARE_SLOTS], late;

	table_start(&f, 1, 1);
	busy = open_from(&f, "127.0.0.1");
	conn_receiving(&f.t, f.conns[busy]);
	for (unsigned i = 0; i < CONN_SPARE_SLOTS; i++) {
		silent[i] = open_from(&f, "127.0.0.1");
		cr_assert(spare(&f, silent[i]));
	}
	late = open_from(&f, "127.0.0.1");
	cr_assert(spare(&f, late), "a silent spare connection kept a newcomer out");
	cr_assert_not(closed(&f, late));
	cr_assert(closed(&f, silent[0]), "the longest silent spare connection was kept");
	cr_assert_not(closed(&f, busy));
	table_stop(&f);
}

/* ---- per address --------------------------------------------------------- */

/* Loopback and Unix socket clients are the trainer's own node: not counted
 * per address. Remote addresses are. */
Test(conns, per_address_counting_skips_loopback)
{
	static const char *const local[] = { "127.0.0.1", "127.0.0.2", "::1",
					     "::ffff:127.0.0.9", "unix" };
	struct table_fixture f;

	table_start(&f, 30, 2);
	for (size_t k = 0; k < sizeof(local) / sizeof(local[0]); k++) {
		for (int n = 0; n < 4; n++) {
			unsigned c = open_from(&f, local[k]);

			conn_receiving(&f.t, f.conns[c]);
			cr_assert_not(spare(&f, c), "%s connection %d counted per address",
				      local[k], n);
			cr_assert_not(closed(&f, c));
		}
	}
	table_stop(&f);
}

/* A remote client over its share closes its own idle connection, not
 * another client's, though that one waited longer. */
Test(conns, per_address_limit_closes_that_clients_own)
{
	struct table_fixture f;
	unsigned other, a, b, c;

	table_start(&f, 8, 2);
	other = open_from(&f, "10.0.0.1");
	serve_once(&f, other); /* the oldest of all */
	a = open_from(&f, "10.0.0.2");
	serve_once(&f, a);
	b = open_from(&f, "::ffff:10.0.0.2"); /* the same client */
	serve_once(&f, b);
	c = open_from(&f, "10.0.0.2");
	cr_assert(closed(&f, a), "the client's oldest connection was not closed");
	cr_assert_not(closed(&f, other), "another client's connection made room");
	cr_assert_not(closed(&f, b));
	cr_assert_not(spare(&f, c));
	table_stop(&f);
}

/* A remote client over its share with nothing idle gets one spare slot at
 * most; other clients are not held back by it. */
Test(conns, remote_client_over_its_share_gets_one_spare_slot)
{
	struct table_fixture f;
	unsigned c1, c2, s1, s2, other;

	table_start(&f, 8, 2);
	c1 = open_from(&f, "10.0.0.2");
	conn_receiving(&f.t, f.conns[c1]);
	c2 = open_from(&f, "10.0.0.2");
	conn_receiving(&f.t, f.conns[c2]);
	s1 = open_from(&f, "10.0.0.2");
	cr_assert(spare(&f, s1));
	cr_assert_not(closed(&f, s1));
	s2 = open_from(&f, "10.0.0.2");
	cr_assert(closed(&f, s2), "a second spare slot for one remote client");
	other = open_from(&f, "10.0.0.3");
	cr_assert_not(spare(&f, other));
	cr_assert_not(closed(&f, other));
	cr_assert_not(closed(&f, c1));
	cr_assert_not(closed(&f, c2));
	table_stop(&f);
}
