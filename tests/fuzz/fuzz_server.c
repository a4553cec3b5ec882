/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness: the whole embedded server (libmicrohttpd, routing,
 * authentication, the handlers, the manager on the host backend) through its
 * public API. Two servers listen on Unix sockets, one open and one with the
 * token "s3cret"; the first byte of the input picks one, the rest is sent as
 * is over a fresh connection, whose write side is then shut. What comes back
 * (if anything) must be an HTTP/1.x answer. After each input every tag is
 * woken and the weights must hold their pattern.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "dormant-server.h"
#include "dormant.h"

/* How long one input may keep its connection: a request the server waits
 * to complete is cut here (the server's own timeout, 1 s, frees its slot). */
#define EXCHANGE_MS 100

static struct dormant *manager;
static struct dormant_server *servers[2];
static struct sockaddr_un addrs[2];
static char folder[] = "/tmp/fuzz-server.XXXXXX";

static void cleanup(void)
{
	for (int i = 0; i < 2; i++)
		dormant_server_stop(servers[i]);
	dormant_destroy(manager);
	rmdir(folder);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	CHECK(mkdtemp(folder));
	manager = fuzz_scene_new();
	for (int i = 0; i < 2; i++) {
		char path[64];
		struct dormant_server_options *so = NULL;
		int r;

		snprintf(path, sizeof(path), "%s/%d.sock", folder, i);
		r = dormant_server_options_new(&so);
		if (r == 0)
			r = dormant_server_options_set(so, "unix_path", path);
		if (r == 0 && i)
			r = dormant_server_options_set(so, "token", "s3cret");
		if (r == 0)
			r = dormant_server_options_set_int(so, "open_probes", i == 1);
		if (r == 0)
			r = dormant_server_options_parse(so, "threads=2,max_connections=256,"
						       "connection_timeout_s=1,quiet=true");
		if (r == 0)
			r = dormant_server_start(manager, so, &servers[i]);
		dormant_server_options_destroy(so);
		if (r < 0) {
			fprintf(stderr, "fuzz_server: server: %s\n", dormant_last_error());
			abort();
		}
		addrs[i].sun_family = AF_UNIX;
		snprintf(addrs[i].sun_path, sizeof(addrs[i].sun_path), "%s", path);
	}
	atexit(cleanup);
	return 0;
}

static long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* Send the bytes, shut the write side, read the answer until the server
 * closes or the time is up. Returns the bytes read into buf (a prefix). */
static size_t exchange(int which, const unsigned char *data, size_t size, char *buf,
		       size_t buf_size)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	long deadline = now_ms() + EXCHANGE_MS;
	size_t sent = 0, got = 0;
	bool shut = false;

	CHECK(fd >= 0);
	/* blocking: waits, rather than fails, while the backlog is full */
	CHECK(connect(fd, (struct sockaddr *)&addrs[which], sizeof(addrs[which])) == 0);
	CHECK(fcntl(fd, F_SETFL, O_NONBLOCK) == 0);
	for (;;) {
		struct pollfd pfd = { .fd = fd, .events = POLLIN | (shut ? 0 : POLLOUT) };
		long left = deadline - now_ms();
		char scratch[4096];
		ssize_t n;

		if (!shut && sent == size) {
			shutdown(fd, SHUT_WR);
			shut = true;
		}
		if (left <= 0 || poll(&pfd, 1, (int)left) <= 0)
			break;
		if (pfd.revents & POLLOUT && !shut) {
			n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
			if (n < 0 && errno != EAGAIN)
				shut = true; /* the server closed: read what it said */
			else if (n > 0)
				sent += (size_t)n;
		}
		if (pfd.revents & (POLLIN | POLLHUP | POLLERR)) {
			n = recv(fd, scratch, sizeof(scratch), 0);
			if (n <= 0 && !(n < 0 && errno == EAGAIN))
				break;
			if (n > 0) {
				size_t keep = got < buf_size ? buf_size - got : 0;

				memcpy(buf + got, scratch, (size_t)n < keep ? (size_t)n : keep);
				got += (size_t)n < keep ? (size_t)n : keep;
			}
		}
	}
	close(fd);
	return got;
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
	char answer[16];
	size_t got;

	if (size == 0)
		return 0;
	got = exchange(data[0] & 1, data + 1, size - 1, answer, sizeof(answer));
	if (got >= 7 && memcmp(answer, "HTTP/1.", 7) != 0) {
		fprintf(stderr, "fuzz_server: answer is not HTTP/1.x: %.*s\n", (int)got, answer);
		abort();
	}
	fuzz_scene_check(manager);
	return 0;
}
