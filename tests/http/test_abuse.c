/* SPDX-License-Identifier: MIT */
/*
 * Abusive clients on real loopback sockets: after each, the
 * server must still answer /healthz and a well-behaved sleep and wake. No
 * test measures speed: waits are bounded (a socket read times out after
 * READ_TIMEOUT_S, a poll gives up after POLL_TRIES) and only fail the test
 * when the server stops answering.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "conns.h"

/* 60 s: with 120 here, Criterion 2.4.1's runner (not a test) leaked 48 bytes
 * in every ASan run of this executable with --jobs=2, which fails the run;
 * at 60 s it did not, in repeated runs. */
TestSuite(abuse, .timeout = 60);

/* Longer than any timeout a test's server is given, shorter than the test. */
#define READ_TIMEOUT_S 20
#define POLL_TRIES 400 /* of POLL_PAUSE_MS each */
#define POLL_PAUSE_MS 25
#define CLIENTS 64

static void pause_ms(long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static int connect_unix(const struct fixture *f)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct timeval tv = { .tv_sec = READ_TIMEOUT_S };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	cr_assert_geq(fd, 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", f->unix_path);
	cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0, "%s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	return fd;
}

/* A connection to the server: over its Unix socket if it has one, else
 * TCP from source address src (NULL: any). */
static int connect_from(const struct fixture *f, const char *src)
{
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_port = htons((uint16_t)dormant_server_port(f->server)) };
	struct timeval tv = { .tv_sec = READ_TIMEOUT_S };
	int fd;

	if (f->unix_path[0])
		return connect_unix(f);
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	cr_assert_geq(fd, 0);
	if (src) {
		struct sockaddr_in b = { .sin_family = AF_INET };

		cr_assert_eq(inet_pton(AF_INET, src, &b.sin_addr), 1);
		cr_assert_eq(bind(fd, (struct sockaddr *)&b, sizeof(b)), 0, "bind %s: %s", src,
			     strerror(errno));
	}
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0, "%s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	return fd;
}

static void send_all(int fd, const void *data, size_t size)
{
	const char *p = data;

	while (size) {
		ssize_t n = send(fd, p, size, MSG_NOSIGNAL);

		cr_assert_gt(n, 0, "send: %s", strerror(errno));
		p += n;
		size -= (size_t)n;
	}
}

/* Read until the server closes (or READ_TIMEOUT_S passes: -1 with errno
 * EAGAIN). Returns the bytes read, 0 if none; buf is NUL-terminated. */
static ssize_t read_until_close(int fd, char *buf, size_t size)
{
	size_t got = 0;

	for (;;) {
		ssize_t n = recv(fd, buf + got, size - 1 - got, 0);

		if (n == 0 || (n < 0 && errno == ECONNRESET))
			break;
		if (n < 0) {
			buf[got] = '\0';
			return -1;
		}
		got += (size_t)n;
		if (got == size - 1)
			break;
	}
	buf[got] = '\0';
	return (ssize_t)got;
}

/* Whether the server closed fd: a read gives the end of the stream or a
 * reset, not a timeout. */
static bool closed_by_server(int fd)
{
	char buf[4096];

	return read_until_close(fd, buf, sizeof(buf)) >= 0;
}

/* Send a keep-alive GET of path and read its answer (up to buf's size);
 * returns its HTTP status. */
static int keepalive_get(int fd, const char *path, char *buf, size_t size)
{
	char request[128];
	int len = snprintf(request, sizeof(request), "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
	int status = 0;
	ssize_t n;

	send_all(fd, request, (size_t)len);
	n = recv(fd, buf, size - 1, 0);
	cr_assert_gt(n, 0, "no answer to GET %s: %s", path, n == 0 ? "closed" : strerror(errno));
	buf[n] = '\0';
	sscanf(buf, "HTTP/1.1 %d", &status);
	return status;
}

/* Send a keep-alive request (not a probe: only a connection within the
 * limits answers it 200) and read its answer. */
static void keepalive_request(int fd)
{
	char buf[4096];

	/* a small answer: one recv() has it whole */
	cr_assert_eq(keepalive_get(fd, "/is_sleeping", buf, sizeof(buf)), 200, "%s", buf);
}

/* Longer than the table's idle grace (conns.h): connections idle this long
 * may be closed to make room. */
static void pause_past_idle_grace(void)
{
	pause_ms((long)(CONN_IDLE_GRACE_S * 1000) + 300);
}

/* A raw request on its own connection; returns the HTTP status of the
 * answer, or 0 if the server closed the connection without one. */
static int raw_status(const struct fixture *f, const char *request, size_t size)
{
	char buf[8192];
	int fd = connect_from(f, NULL), status = 0;
	ssize_t n;

	send_all(fd, request, size);
	n = read_until_close(fd, buf, sizeof(buf));
	cr_assert_geq(n, 0, "the server neither answered nor closed: a hung connection");
	if (n > 0)
		sscanf(buf, "HTTP/1.1 %d", &status);
	close(fd);
	return status;
}

/* /healthz answers, and a sleep and a wake from a well-behaved client work
 * with the weights intact. A bounded poll: the server may need a moment to
 * close what it closes. */
static void still_serves(struct fixture *f)
{
	struct http_request req = { .path = "/healthz", .timeout_ms = 2000 };
	struct http_response r;
	bool healthy = false;

	for (int i = 0; i < POLL_TRIES && !healthy; i++) {
		http_do(f, &req, &r);
		healthy = r.status == 200;
		http_response_free(&r);
		if (!healthy)
			pause_ms(POLL_PAUSE_MS);
	}
	cr_assert(healthy, "/healthz is not answering");
	http_post(f, "/sleep", NULL, &r);
	cr_assert_eq(r.status, 200, "sleep: %ld %s", r.status, r.body);
	http_response_free(&r);
	cr_assert_str_eq(tag_state(f, "weights"), "asleep");
	http_post(f, "/wake", NULL, &r);
	cr_assert_eq(r.status, 200, "wake: %ld %s", r.status, r.body);
	http_response_free(&r);
	cr_assert(weights_intact(f));
}

/* ---- partial requests closed at once ------------------------------------- */

/* The bytes of a partial request and the FIN in one segment (TCP_CORK holds
 * the bytes until the shutdown sends both). Under libmicrohttpd's epoll mode
 * each such connection stayed in CLOSE-WAIT until the idle timeout; the
 * server must now close every one of them itself, long before its timeouts
 * (60 s here, beyond READ_TIMEOUT_S) would. */
Test(abuse, partial_request_with_fin_frees_the_slot)
{
	static const char partial[] = "GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Agent: a";
	struct fixture_config config = {
		.server = { .max_connections = CLIENTS, .max_connections_per_ip = CLIENTS,
			    .connection_timeout_s = 60, .request_timeout_s = 60 },
	};
	struct fixture f;
	int fds[CLIENTS];

	fixture_start(&f, &config);
	for (int i = 0; i < CLIENTS; i++) {
		int one = 1;

		fds[i] = connect_from(&f, NULL);
		cr_assert_eq(setsockopt(fds[i], IPPROTO_TCP, TCP_CORK, &one, sizeof(one)), 0);
		send_all(fds[i], partial, sizeof(partial) - 1);
		cr_assert_eq(shutdown(fds[i], SHUT_WR), 0);
	}
	for (int i = 0; i < CLIENTS; i++) {
		cr_assert(closed_by_server(fds[i]),
			  "connection %d still held after its client closed", i);
		close(fds[i]);
	}
	still_serves(&f);
	fixture_stop(&f);
}

/* ---- slow and idle clients ----------------------------------------------- */

/* 64 clients each holding a request half sent (one header line given, more
 * to come) fill max_connections: those requests are in flight, and none is
 * closed to make room. /healthz is still answered (a spare slot), other
 * requests get 503 with Retry-After, not a closed connection; once the slow
 * clients go, sleep and wake work. */
Test(abuse, slow_clients_leave_room)
{
	static const char head[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
	static const char stats[] = "GET /stats HTTP/1.1\r\nHost: x\r\n\r\n";
	struct http_request req = { .path = "/healthz", .timeout_ms = 10000 };
	struct fixture_config config = {
		.server = { .connection_timeout_s = 60, .request_timeout_s = 60 },
	};
	struct http_response r;
	struct fixture f;
	char buf[4096];
	int fds[CLIENTS], fd;

	fixture_start(&f, &config); /* max_connections: the default, 64 */
	for (int i = 0; i < CLIENTS; i++) {
		fds[i] = connect_from(&f, NULL);
		send_all(fds[i], head, sizeof(head) - 1);
	}
	pause_past_idle_grace();
	http_do(&f, &req, &r);
	cr_assert_eq(r.status, 200, "/healthz over the limit: %ld", r.status);
	http_response_free(&r);
	fd = connect_from(&f, NULL);
	send_all(fd, stats, sizeof(stats) - 1);
	cr_assert_geq(read_until_close(fd, buf, sizeof(buf)), 0, "a hung connection");
	cr_assert(strstr(buf, "HTTP/1.1 503 "), "over the limit: %s", buf);
	cr_assert(strstr(buf, "Retry-After: 1\r\n"), "%s", buf);
	cr_assert(strstr(buf, "urn:dormant:problem:overloaded"), "%s", buf);
	close(fd);
	/* every half-sent request is still open: finish one, it is answered */
	send_all(fds[0], "\r\n", 2);
	{
		ssize_t n = recv(fds[0], buf, sizeof(buf) - 1, 0);

		cr_assert_gt(n, 0, "a request in flight was closed to make room");
		buf[n] = '\0';
		cr_assert(strstr(buf, "HTTP/1.1 200 "), "%s", buf);
	}
	for (int i = 0; i < CLIENTS; i++)
		close(fds[i]);
	still_serves(&f);
	fixture_stop(&f);
}

/* A client that trickles one header line at a time, each well inside the
 * idle timeout, is closed once request_timeout_s is over. */
Test(abuse, trickling_client_is_closed_at_the_deadline)
{
	struct fixture_config config = {
		.server = { .connection_timeout_s = 60, .request_timeout_s = 1 },
	};
	struct fixture f;
	bool closed = false;
	int fd;

	fixture_start(&f, &config);
	fd = connect_from(&f, NULL);
	send_all(fd, "GET /healthz HTTP/1.1\r\n", 23);
	/* a line every 100 ms, for at most READ_TIMEOUT_S */
	for (int i = 0; i < READ_TIMEOUT_S * 10 && !closed; i++) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		char line[32];
		int len = snprintf(line, sizeof(line), "X-Slow-%d: y\r\n", i);

		if (send(fd, line, (size_t)len, MSG_NOSIGNAL) < 0) {
			closed = true;
			break;
		}
		if (poll(&p, 1, 100) > 0) {
			char buf[256];
			ssize_t n = recv(fd, buf, sizeof(buf), 0);

			/* closed, never answered: the request was never whole */
			cr_assert(n <= 0, "the trickled request was answered");
			closed = true;
		}
	}
	cr_assert(closed, "a client trickling headers was never closed");
	close(fd);
	still_serves(&f);
	fixture_stop(&f);
}

/* Many idle keep-alive connections (more than max_connections over time):
 * idle ones make room, the longest idle first, and each newcomer is served
 * within the limits (not on a spare slot: it gets 200 for a request that is
 * not a probe). */
Test(abuse, idle_keepalive_connections_leave_room)
{
	struct fixture_config config = {
		.server = { .connection_timeout_s = 60, .request_timeout_s = 60 },
	};
	struct fixture f;
	int fds[2 * CLIENTS];

	fixture_start(&f, &config); /* max_connections: the default, 64 */
	for (int i = 0; i < CLIENTS; i++) {
		fds[i] = connect_from(&f, NULL);
		keepalive_request(fds[i]);
	}
	pause_past_idle_grace();
	for (int i = CLIENTS; i < 2 * CLIENTS; i++) {
		fds[i] = connect_from(&f, NULL);
		keepalive_request(fds[i]);
	}
	/* the idle ones made room, not the newer ones (the order among them
	 * is the server's: their answers completed on several threads) */
	for (int i = 0; i < CLIENTS; i++)
		cr_assert(closed_by_server(fds[i]), "idle connection %d was not closed", i);
	/* the newer ones, idle in their turn, make room for sleep and wake */
	pause_past_idle_grace();
	still_serves(&f);
	for (int i = 0; i < 2 * CLIENTS; i++)
		close(fds[i]);
	fixture_stop(&f);
}

/* Over max_connections, the connection that has been idle longest, whoever
 * its client, makes room. (Per-address limits are tested on the table
 * alone, test_conns.c: every address here is loopback, which is not
 * counted per address.) */
Test(abuse, connection_limit_closes_the_oldest_of_anyone)
{
	struct fixture_config config = {
		.server = { .threads = 1, .max_connections = 2, .max_connections_per_ip = 2,
			    .connection_timeout_s = 60, .request_timeout_s = 60 },
	};
	struct fixture f;
	int a, b, c;

	fixture_start(&f, &config);
	a = connect_from(&f, "127.0.0.2");
	keepalive_request(a);
	b = connect_from(&f, "127.0.0.3");
	keepalive_request(b);
	pause_past_idle_grace();
	c = connect_from(&f, "127.0.0.4");
	keepalive_request(c);
	cr_assert(closed_by_server(a), "the oldest connection was not closed");
	keepalive_request(b);
	close(a);
	close(b);
	close(c);
	fixture_stop(&f);
}

/* A connection whose request is being answered is never closed to make
 * room: with every slot answering, a newcomer gets a spare slot, where a
 * probe is answered and anything else 503, and is closed after that. */
struct held_sleep {
	atomic_bool entered;
	atomic_bool release;
};

static int hold_sleep(struct dormant *m, enum dormant_hook_point point, void *userdata)
{
	struct held_sleep *h = userdata;

	atomic_store(&h->entered, true);
	for (int i = 0; i < READ_TIMEOUT_S * 100 && !atomic_load(&h->release); i++)
		pause_ms(10);
	return 0;
}

/* A GET of path on a new connection: its whole answer, read until the
 * server closes. */
static void get_until_close(struct fixture *f, const char *path, char *buf, size_t size)
{
	char request[128];
	int len = snprintf(request, sizeof(request), "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path);
	int fd = connect_from(f, NULL);

	send_all(fd, request, (size_t)len);
	cr_assert_gt(read_until_close(fd, buf, size), 0, "GET %s: closed unanswered or hung",
		     path);
	close(fd);
}

Test(abuse, connections_being_answered_are_not_closed)
{
	static const char sleep_request[] =
		"POST /sleep HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
	static const char *const probes[] = { "/healthz", "/readyz", "/metrics" };
	struct fixture_config config = {
		.server = { .threads = 1, .max_connections = 1, .connection_timeout_s = 60,
			    .request_timeout_s = 60 },
	};
	struct held_sleep held = { 0 };
	struct fixture f;
	char buf[16384];
	int busy;

	fixture_start(&f, &config);
	cr_assert_gt(dormant_hook_add(f.m, DORMANT_HOOK_BEFORE_SLEEP, hold_sleep, &held), 0);
	busy = connect_from(&f, NULL);
	send_all(busy, sleep_request, sizeof(sleep_request) - 1);
	for (int i = 0; i < POLL_TRIES && !atomic_load(&held.entered); i++)
		pause_ms(POLL_PAUSE_MS);
	cr_assert(atomic_load(&held.entered));
	pause_past_idle_grace();
	/* the probes are answered on spare slots, each then closed */
	for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
		get_until_close(&f, probes[i], buf, sizeof(buf));
		cr_assert(strstr(buf, "HTTP/1.1 200 "), "%s: %s", probes[i], buf);
		cr_assert(strstr(buf, "Connection: close\r\n"), "%s: %s", probes[i], buf);
	}
	/* anything else: 503 with Retry-After, not a closed connection */
	get_until_close(&f, "/stats", buf, sizeof(buf));
	cr_assert(strstr(buf, "HTTP/1.1 503 "), "%s", buf);
	cr_assert(strstr(buf, "Retry-After: 1\r\n"), "%s", buf);
	atomic_store(&held.release, true);
	cr_assert_gt(recv(busy, buf, sizeof(buf) - 1, 0), 0, "the sleep got no answer");
	cr_assert(strstr(buf, " 200 "), "%s", buf);
	close(busy);
	fixture_stop(&f);
}

/* A request that has begun to arrive (its head not whole yet, read by the
 * server already) fills the only slot, longer than the idle grace: a
 * newcomer does not close it. Over TCP and over a Unix socket (where the
 * kernel keeps no count of bytes received: only the server's own mark of a
 * request begun protects it). */
static void request_arriving(const char *unix_path)
{
	static const char head[] = "GET /is_sleeping HTTP/1.1\r\nHost: x\r\nX-Slow: ";
	struct fixture_config config = {
		.server = { .threads = 1, .max_connections = 1, .connection_timeout_s = 60,
			    .request_timeout_s = 60, .unix_path = unix_path },
	};
	struct fixture f;
	char buf[4096];
	ssize_t n;
	int slow;

	fixture_start(&f, &config);
	slow = connect_from(&f, NULL);
	send_all(slow, head, sizeof(head) - 1);
	pause_past_idle_grace();
	get_until_close(&f, "/healthz", buf, sizeof(buf));
	cr_assert(strstr(buf, "HTTP/1.1 200 "), "%s", buf);
	/* the slow request, finished, is answered */
	send_all(slow, "y\r\n\r\n", 5);
	n = recv(slow, buf, sizeof(buf) - 1, 0);
	cr_assert_gt(n, 0, "the arriving request was closed to make room");
	buf[n] = '\0';
	cr_assert(strstr(buf, "HTTP/1.1 200 "), "%s", buf);
	close(slow);
	fixture_stop(&f);
}

Test(abuse, request_arriving_is_not_closed_to_make_room)
{
	request_arriving(NULL);
}

Test(abuse, request_arriving_on_unix_socket_is_not_closed_to_make_room)
{
	char path[64];

	snprintf(path, sizeof(path), "/tmp/dormant-abuse-%d.sock", (int)getpid());
	request_arriving(path);
	unlink(path);
}

/* ---- half-closed clients ------------------------------------------------- */

/* POST /sleep, then shutdown of the client's write side (apart, or with the
 * request in one segment). The sleep runs either way; the answer may come,
 * or else the report is in /stats. */
static void half_close_sleep(bool corked)
{
	static const char request[] = "POST /sleep HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
	struct fixture f;
	struct http_response r;
	char buf[4096];
	bool reported = false;
	ssize_t n;
	int fd, one = 1;

	fixture_start(&f, NULL);
	fd = connect_from(&f, NULL);
	if (corked)
		cr_assert_eq(setsockopt(fd, IPPROTO_TCP, TCP_CORK, &one, sizeof(one)), 0);
	send_all(fd, request, sizeof(request) - 1);
	cr_assert_eq(shutdown(fd, SHUT_WR), 0);
	n = read_until_close(fd, buf, sizeof(buf));
	cr_assert_geq(n, 0, "a half-closed connection hung");
	close(fd);
	if (n > 0)
		cr_assert(strstr(buf, " 200 "), "%s", buf);
	for (int i = 0; i < POLL_TRIES && !reported; i++) {
		json_t *stats, *last;

		http_get(&f, "/stats", &r);
		stats = http_json(&r);
		last = json_object_get(stats, "last_sleep");
		reported = json_is_object(last) &&
			   json_is_string(json_object_get(last, "result")) &&
			   strcmp(json_string_value(json_object_get(last, "result")), "ok") == 0;
		json_decref(stats);
		http_response_free(&r);
		if (!reported)
			pause_ms(POLL_PAUSE_MS);
	}
	cr_assert(reported, "the half-closed sleep never ran");
	cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
	http_post(&f, "/wake", NULL, &r);
	cr_assert_eq(r.status, 200);
	http_response_free(&r);
	cr_assert(weights_intact(&f));
	still_serves(&f);
	fixture_stop(&f);
}

Test(abuse, half_closed_sleep_runs)
{
	half_close_sleep(false);
}

Test(abuse, half_closed_sleep_in_one_segment_runs)
{
	half_close_sleep(true);
}

/* ---- many query parameters ----------------------------------------------- */

static void many_params(const char *path, const char *param, int count)
{
	size_t cap = strlen(path) + (size_t)count * (strlen(param) + 16) + 64;
	char *request = malloc(cap);
	struct fixture f;
	size_t len;
	int status;

	cr_assert(request);
	len = (size_t)snprintf(request, cap, "GET %s?", path);
	for (int i = 0; i < count; i++)
		len += (size_t)snprintf(request + len, cap - len, "%s%s%d=1", i ? "&" : "", param,
					i);
	len += (size_t)snprintf(request + len, cap - len,
				" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
	fixture_start(&f, NULL);
	status = raw_status(&f, request, len);
	cr_assert(status == 400 || status == 414 || status == 431,
		  "%d parameters: answered %d (0: closed without an answer)", count, status);
	still_serves(&f);
	fixture_stop(&f);
	free(request);
}

Test(abuse, five_hundred_query_parameters)
{
	many_params("/stats", "p", 500);
}

Test(abuse, five_hundred_long_query_parameters)
{
	many_params("/stats", "parameter", 500);
}

Test(abuse, five_thousand_query_parameters)
{
	many_params("/stats", "p", 5000);
}

Test(abuse, five_thousand_short_query_parameters)
{
	many_params("/stats", "", 5000);
}

/* ---- requests a proxy could frame differently ---------------------------- */

/* 400, the connection closed, and the sleep never ran. */
static void refused(struct fixture *f, const char *request, size_t size)
{
	char buf[8192];
	int fd = connect_from(f, NULL), status = 0;
	ssize_t n;

	send_all(fd, request, size);
	n = read_until_close(fd, buf, sizeof(buf));
	cr_assert_geq(n, 0, "the connection was neither answered nor closed");
	sscanf(buf, "HTTP/1.1 %d", &status);
	cr_assert_eq(status, 400, "answered %d: %s", status, buf);
	cr_assert(strstr(buf, "bad-request"), "%s", buf);
	close(fd);
	cr_assert_str_eq(tag_state(f, "weights"), "awake", "the refused sleep ran");
}

Test(abuse, two_different_content_lengths)
{
	static const char request[] = "POST /sleep HTTP/1.1\r\nHost: x\r\n"
				      "Content-Type: application/json\r\n"
				      "Content-Length: 2\r\nContent-Length: 30\r\n\r\n{}";
	struct fixture f;

	fixture_start(&f, NULL);
	refused(&f, request, sizeof(request) - 1);
	still_serves(&f);
	fixture_stop(&f);
}

Test(abuse, content_length_with_transfer_encoding)
{
	static const char request[] = "POST /sleep HTTP/1.1\r\nHost: x\r\n"
				      "Content-Type: application/json\r\n"
				      "Content-Length: 7\r\nTransfer-Encoding: chunked\r\n\r\n"
				      "2\r\n{}\r\n0\r\n\r\n";
	struct fixture f;

	fixture_start(&f, NULL);
	refused(&f, request, sizeof(request) - 1);
	still_serves(&f);
	fixture_stop(&f);
}

/* The token is "ab": the value cut at the NUL would match it. */
Test(abuse, nul_in_authorization)
{
	static const char request[] = "POST /sleep HTTP/1.1\r\nHost: x\r\n"
				      "Authorization: Bearer ab\0cd\r\nContent-Length: 0\r\n\r\n";
	static const char open_request[] = "GET /stats HTTP/1.1\r\nHost: x\r\n"
					   "Authorization: Bearer x\0y\r\n\r\n";
	struct fixture_config config = { .server = { .token = "ab" } };
	struct fixture f;

	fixture_start(&f, &config);
	refused(&f, request, sizeof(request) - 1);
	fixture_stop(&f);
	/* without a token too */
	fixture_start(&f, NULL);
	refused(&f, open_request, sizeof(open_request) - 1);
	still_serves(&f);
	fixture_stop(&f);
}

/* The same Content-Length twice is one length (RFC 9112 6.3): served. */
Test(abuse, repeated_equal_content_length_is_served)
{
	static const char request[] = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
				      "Content-Length: 0\r\nContent-Length: 0\r\n\r\n";
	struct fixture f;

	fixture_start(&f, NULL);
	cr_assert_eq(raw_status(&f, request, sizeof(request) - 1), 200);
	fixture_stop(&f);
}
