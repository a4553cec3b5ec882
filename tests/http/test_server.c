/* SPDX-License-Identifier: MIT */
/* The server itself: options, authentication, Unix sockets, limits, the
 * access log. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <criterion/redirect.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "conns.h"

TestSuite(server, .timeout = 60);

/* ---- options ------------------------------------------------------------- */

static int start_with(struct fixture *f, const struct test_server_options *opts)
{
	struct fixture_config config = { .no_server = true };
	struct dormant_server *s = NULL;
	int r;

	fixture_start(f, &config);
	r = test_server_start(f->m, opts, &s);
	if (r == 0)
		dormant_server_stop(s);
	return r;
}

Test(server, bad_options)
{
	static const char *const bad_listen[] = {
		"nonsense", "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999", "127.0.0.1:-1",
		"127.0.0.1:80x", ":8787", "[::1]8787", "[::1", "::1:8787", "no-such-host.invalid:0",
	};
	struct fixture f;

	for (size_t i = 0; i < sizeof(bad_listen) / sizeof(bad_listen[0]); i++) {
		struct test_server_options o = { .listen = bad_listen[i], .quiet = true };

		cr_expect_eq(start_with(&f, &o), -EINVAL, "%s: %s", bad_listen[i],
			     dormant_last_error());
		fixture_stop(&f);
	}
	{
		struct test_server_options o = { .listen = "127.0.0.1:0", .threads = 100000 };

		cr_expect_eq(start_with(&f, &o), -EINVAL);
		fixture_stop(&f);
	}
	{
		struct test_server_options o = { .listen = "127.0.0.1:0", .threads = 8,
						    .max_connections = 4 };

		cr_expect_eq(start_with(&f, &o), -EINVAL);
		fixture_stop(&f);
	}
	{
		struct test_server_options o = { .listen = "127.0.0.1:0",
						    .connection_timeout_s = 1000000 };

		cr_expect_eq(start_with(&f, &o), -EINVAL);
		fixture_stop(&f);
	}
	{
		struct test_server_options o = { .listen = "127.0.0.1:0",
						    .unix_path = "/tmp/x.sock" };

		cr_expect_eq(start_with(&f, &o), -EINVAL);
		fixture_stop(&f);
	}
	{
		struct test_server_options o = { .listen = "127.0.0.1:0", .token = "" };

		cr_expect_eq(start_with(&f, &o), -EINVAL);
		fixture_stop(&f);
	}
	{
		struct test_server_options o = { .listen = "127.0.0.1:0",
						    .token = "has space" };

		cr_expect_eq(start_with(&f, &o), -EINVAL);
		fixture_stop(&f);
	}
	{
		struct test_server_options o = { .listen = "127.0.0.1:0",
						    .token_file = "/nonexistent/token" };

		cr_expect_eq(start_with(&f, &o), -EINVAL);
		fixture_stop(&f);
	}
	cr_expect_eq(dormant_server_start(NULL, NULL, NULL), -EINVAL);
	dormant_server_stop(NULL);
}

Test(server, port_zero_and_address_in_use)
{
	struct fixture f;
	struct test_server_options o = { .quiet = true };
	struct dormant_server *second = NULL;
	char listen[64];
	int port;

	fixture_start(&f, NULL);
	port = dormant_server_port(f.server);
	cr_assert_gt(port, 0);
	snprintf(listen, sizeof(listen), "http://127.0.0.1:%d", port);
	cr_assert_str_eq(dormant_server_url(f.server), listen);

	snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
	o.listen = listen;
	cr_assert_eq(test_server_start(f.m, &o, &second), -EADDRINUSE, "%s",
		     dormant_last_error());
	cr_assert_null(second);
	fixture_stop(&f);
}

Test(server, port_file_holds_the_port_whole)
{
	struct fixture f;
	char dir[] = "/tmp/dormant-port-XXXXXX", path[128], tmp[140], victim[140], text[32] = "";
	struct dirent *entry;
	FILE *file;
	DIR *d;

	fixture_start(&f, NULL);
	cr_assert_not_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/port", dir);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	/* a link planted at the name the writer once used as its temporary:
	 * never written through (issue 25) */
	snprintf(victim, sizeof(victim), "%s/victim", dir);
	file = fopen(victim, "w");
	cr_assert_not_null(file);
	fputs("untouched\n", file);
	fclose(file);
	cr_assert_eq(symlink(victim, tmp), 0);
	cr_assert_eq(dormant_server_write_port_file(f.server, path), 0);
	file = fopen(victim, "r");
	cr_assert_not_null(fgets(text, sizeof(text), file));
	fclose(file);
	cr_expect_str_eq(text, "untouched\n");
	unlink(tmp);
	/* and the file itself a link: replaced, not followed */
	unlink(path);
	cr_assert_eq(symlink(victim, path), 0);
	cr_assert_eq(dormant_server_write_port_file(f.server, path), 0);
	file = fopen(victim, "r");
	cr_assert_not_null(fgets(text, sizeof(text), file));
	fclose(file);
	cr_expect_str_eq(text, "untouched\n");
	file = fopen(path, "r");
	cr_assert_not_null(file);
	cr_assert_not_null(fgets(text, sizeof(text), file));
	fclose(file);
	cr_expect_eq(atoi(text), dormant_server_port(f.server));
	cr_expect_eq(text[strlen(text) - 1], '\n');
	/* no temporary file is left behind */
	d = opendir(dir);
	cr_assert_not_null(d);
	while ((entry = readdir(d)))
		cr_expect(entry->d_name[0] == '.' || strcmp(entry->d_name, "port") == 0 ||
				  strcmp(entry->d_name, "victim") == 0,
			  "left behind: %s", entry->d_name);
	closedir(d);
	cr_expect_eq(dormant_server_write_port_file(NULL, path), -EINVAL);
	cr_expect_eq(dormant_server_write_port_file(f.server, NULL), -EINVAL);
	snprintf(path, sizeof(path), "%s/missing/port", dir);
	cr_expect_eq(dormant_server_write_port_file(f.server, path), -ENOENT);
	snprintf(path, sizeof(path), "%s/port", dir);
	unlink(path);
	unlink(victim);
	rmdir(dir);
	fixture_stop(&f);
}

Test(server, host_names_resolve)
{
	struct fixture_config config = { .server = { .listen = "localhost:0" } };
	struct fixture f;
	struct http_response r;
	char url[64];

	fixture_start(&f, &config);
	snprintf(url, sizeof(url), "http://localhost:%d", dormant_server_port(f.server));
	cr_assert_str_eq(dormant_server_url(f.server), url);
	http_get(&f, "/healthz", &r);
	cr_assert_eq(r.status, 200);
	http_response_free(&r);
	fixture_stop(&f);
}

Test(server, ipv6_loopback)
{
	struct fixture_config config = { .server = { .listen = "[::1]:0" } };
	struct fixture f;
	struct http_response r;
	int fd = socket(AF_INET6, SOCK_STREAM, 0);
	struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };

	/* skip where the machine has no IPv6 loopback */
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		if (fd >= 0)
			close(fd);
		cr_skip_test("no IPv6 loopback here");
	}
	close(fd);
	fixture_start(&f, &config);
	cr_assert(strncmp(dormant_server_url(f.server), "http://[::1]:", 13) == 0, "%s",
		  dormant_server_url(f.server));
	http_get(&f, "/healthz", &r);
	cr_assert_eq(r.status, 200);
	http_response_free(&r);
	fixture_stop(&f);
}

/* ---- authentication ------------------------------------------------------ */

static void expect_status(struct fixture *f, const char *method, const char *path,
			  const char *authorization, long status)
{
	const char *headers[] = { authorization, NULL };
	struct http_request req = { .method = method, .path = path,
				    .headers = authorization ? headers : NULL };
	struct http_response r;
	char value[128];

	http_do(f, &req, &r);
	cr_assert_eq(r.status, status, "%s %s with '%s': %ld %s", method, path,
		     authorization ? authorization : "", r.status, r.body);
	if (status == 401) {
		assert_problem(&r, 401, "unauthorized");
		cr_assert(http_header(&r, "WWW-Authenticate", value, sizeof(value)));
		cr_assert(strncmp(value, "Bearer", 6) == 0, "%s", value);
	}
	http_response_free(&r);
}

Test(server, token_required)
{
	struct fixture_config config = { .server = { .token = "s3cret-token" } };
	struct fixture f;

	fixture_start(&f, &config);
	expect_status(&f, "GET", "/stats", NULL, 401);
	expect_status(&f, "POST", "/sleep", NULL, 401);
	expect_status(&f, "GET", "/healthz", NULL, 401);
	expect_status(&f, "GET", "/metrics", NULL, 401);
	expect_status(&f, "GET", "/openapi.yaml", NULL, 401);
	/* unknown paths reveal nothing to strangers */
	expect_status(&f, "GET", "/nope", NULL, 401);
	expect_status(&f, "GET", "/stats", "Authorization: Bearer wrong", 401);
	expect_status(&f, "GET", "/stats", "Authorization: Bearer s3cret-toke", 401);
	expect_status(&f, "GET", "/stats", "Authorization: Bearer s3cret-tokenX", 401);
	expect_status(&f, "GET", "/stats", "Authorization: Basic czNjcmV0LXRva2Vu", 401);
	expect_status(&f, "GET", "/stats", "Authorization: Bearer", 401);
	expect_status(&f, "GET", "/stats", "Authorization: s3cret-token", 401);
	expect_status(&f, "GET", "/stats", "Authorization: Bearer s3cret-token", 200);
	expect_status(&f, "GET", "/stats", "Authorization: bearer   s3cret-token", 200);
	expect_status(&f, "GET", "/nope", "Authorization: Bearer s3cret-token", 404);
	expect_status(&f, "POST", "/sleep", "Authorization: Bearer s3cret-token", 200);
	cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
	fixture_stop(&f);
}

Test(server, wrong_token_says_invalid_token)
{
	struct fixture_config config = { .server = { .token = "abc" } };
	const char *headers[] = { "Authorization: Bearer abd", NULL };
	struct http_request req = { .path = "/stats", .headers = headers };
	struct fixture f;
	struct http_response r;
	char value[128];

	fixture_start(&f, &config);
	http_do(&f, &req, &r);
	cr_assert(http_header(&r, "WWW-Authenticate", value, sizeof(value)));
	cr_assert(strstr(value, "invalid_token"), "%s", value);
	http_response_free(&r);
	fixture_stop(&f);
}

Test(server, open_probes)
{
	struct fixture_config config = { .server = { .token = "t0k", .open_probes = true } };
	struct fixture f;

	fixture_start(&f, &config);
	expect_status(&f, "GET", "/healthz", NULL, 200);
	expect_status(&f, "GET", "/readyz", NULL, 200);
	expect_status(&f, "GET", "/metrics", NULL, 200);
	expect_status(&f, "GET", "/stats", NULL, 401);
	expect_status(&f, "GET", "/is_sleeping", NULL, 401);
	expect_status(&f, "POST", "/wake", NULL, 401);
	expect_status(&f, "GET", "/openapi.yaml", NULL, 401);
	expect_status(&f, "GET", "/stats", "Authorization: Bearer t0k", 200);
	fixture_stop(&f);
}

Test(server, token_from_environment)
{
	struct fixture f;

	setenv("DORMANT_TOKEN", "from-env", 1);
	fixture_start(&f, NULL);
	expect_status(&f, "GET", "/stats", NULL, 401);
	expect_status(&f, "GET", "/stats", "Authorization: Bearer from-env", 200);
	fixture_stop(&f);
	unsetenv("DORMANT_TOKEN");
}

Test(server, token_from_files)
{
	char path[] = "/tmp/dormant-token-XXXXXX";
	int fd = mkstemp(path);
	struct fixture f;

	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, "  file-token\n\n", 14), 14);
	close(fd);
	{
		struct fixture_config config = { .server = { .token_file = path } };

		fixture_start(&f, &config);
		expect_status(&f, "GET", "/stats", NULL, 401);
		expect_status(&f, "GET", "/stats", "Authorization: Bearer file-token", 200);
		fixture_stop(&f);
	}
	setenv("DORMANT_TOKEN_FILE", path, 1);
	fixture_start(&f, NULL);
	expect_status(&f, "GET", "/stats", "Authorization: Bearer file-token", 200);
	expect_status(&f, "GET", "/stats", NULL, 401);
	fixture_stop(&f);
	unsetenv("DORMANT_TOKEN_FILE");
	/* an option beats the environment */
	setenv("DORMANT_TOKEN", "from-env", 1);
	{
		struct fixture_config config = { .server = { .token = "opt" } };

		fixture_start(&f, &config);
		expect_status(&f, "GET", "/stats", "Authorization: Bearer from-env", 401);
		expect_status(&f, "GET", "/stats", "Authorization: Bearer opt", 200);
		fixture_stop(&f);
	}
	unsetenv("DORMANT_TOKEN");
	unlink(path);
}

Test(server, no_token_no_auth)
{
	struct fixture f;

	unsetenv("DORMANT_TOKEN");
	unsetenv("DORMANT_TOKEN_FILE");
	fixture_start(&f, NULL);
	expect_status(&f, "GET", "/stats", NULL, 200);
	expect_status(&f, "GET", "/stats", "Authorization: Bearer anything", 200);
	fixture_stop(&f);
}

/* ---- Unix socket --------------------------------------------------------- */

Test(server, unix_socket)
{
	struct fixture_config config = { 0 };
	struct fixture f;
	struct http_response r;
	char path[108], url[128];
	struct stat st;

	snprintf(path, sizeof(path), "/tmp/dormant-test-%d.sock", (int)getpid());
	unlink(path);
	config.server.unix_path = path;
	fixture_start(&f, &config);
	snprintf(url, sizeof(url), "unix:%s", path);
	cr_assert_str_eq(dormant_server_url(f.server), url);
	cr_assert_eq(dormant_server_port(f.server), 0);
	cr_assert_eq(stat(path, &st), 0);
	cr_assert(S_ISSOCK(st.st_mode));
	cr_assert_eq(st.st_mode & 0777, 0600, "mode %o", st.st_mode & 0777);
	http_get(&f, "/healthz", &r);
	cr_assert_eq(r.status, 200);
	http_response_free(&r);
	http_post(&f, "/sleep", NULL, &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_response_free(&r);
	http_post(&f, "/wake", "{\"tags\": null}", &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	http_response_free(&r);
	cr_assert(weights_intact(&f));

	/* a second server cannot take a live socket */
	{
		struct test_server_options o = { .unix_path = path, .quiet = true };
		struct dormant_server *second = NULL;

		cr_assert_eq(test_server_start(f.m, &o, &second), -EADDRINUSE);
	}
	fixture_stop(&f);
	cr_assert_neq(stat(path, &st), 0, "the socket file stays after stop");
}

Test(server, unix_socket_stale_and_bad_paths)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct test_server_options o = { .quiet = true };
	struct dormant_server *s = NULL;
	struct fixture f;
	char path[108], file[108], longpath[200];
	int fd;

	snprintf(path, sizeof(path), "/tmp/dormant-stale-%d.sock", (int)getpid());
	snprintf(file, sizeof(file), "/tmp/dormant-file-%d", (int)getpid());
	unlink(path);
	/* a socket whose server is gone */
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	memcpy(addr.sun_path, path, strlen(path));
	cr_assert_eq(bind(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
	close(fd);

	fixture_start(&f, &(struct fixture_config){ .no_server = true });
	o.unix_path = path;
	cr_assert_eq(test_server_start(f.m, &o, &s), 0, "%s", dormant_last_error());
	dormant_server_stop(s);

	/* a file that is not a socket is never removed */
	fd = open(file, O_CREAT | O_WRONLY, 0600);
	cr_assert_geq(fd, 0);
	close(fd);
	o.unix_path = file;
	cr_assert_eq(test_server_start(f.m, &o, &s), -EADDRINUSE);
	cr_assert_eq(access(file, F_OK), 0);
	unlink(file);

	memset(longpath, 'x', sizeof(longpath) - 1);
	longpath[0] = '/';
	longpath[sizeof(longpath) - 1] = '\0';
	o.unix_path = longpath;
	cr_assert_eq(test_server_start(f.m, &o, &s), -EINVAL);
	o.unix_path = "";
	cr_assert_eq(test_server_start(f.m, &o, &s), -EINVAL);
	fixture_stop(&f);
}

/* ---- limits -------------------------------------------------------------- */

Test(server, body_over_64KiB_is_413)
{
	struct fixture f;
	struct http_response r;
	size_t size = 64 * 1024 + 1;
	char *body = malloc(size + 1);
	const char *chunked[] = { "Transfer-Encoding: chunked", NULL };

	cr_assert(body);
	fixture_start(&f, NULL);
	/* a valid JSON document, only too long: spaces after {} */
	memset(body, ' ', size);
	body[0] = '{';
	body[1] = '}';
	body[size] = '\0';
	{
		struct http_request req = { .method = "POST", .path = "/sleep", .body = body };

		http_do(&f, &req, &r);
		assert_problem(&r, 413, "payload-too-large");
		http_response_free(&r);
		/* the same without Content-Length */
		req.headers = chunked;
		http_do(&f, &req, &r);
		assert_problem(&r, 413, "payload-too-large");
		http_response_free(&r);
		/* a GET route too */
		req.method = "GET";
		req.path = "/stats";
		req.headers = NULL;
		http_do(&f, &req, &r);
		assert_problem(&r, 413, "payload-too-large");
		http_response_free(&r);
		/* exactly 64 KiB is fine */
		req.method = "POST";
		req.path = "/sleep";
		req.body_size = size - 1;
		http_do(&f, &req, &r);
		cr_assert_eq(r.status, 200, "%s", r.body);
		http_response_free(&r);
	}
	cr_assert_str_eq(tag_state(&f, "weights"), "asleep");
	free(body);
	fixture_stop(&f);
}

Test(server, huge_url_and_headers_are_refused)
{
	struct fixture f;
	struct http_response r;
	size_t size = 200 * 1024;
	char *path = malloc(size + 16);
	char *header = malloc(size + 16);
	const char *headers[] = { header, NULL };

	cr_assert(path && header);
	fixture_start(&f, NULL);
	strcpy(path, "/stats?pretty=");
	memset(path + 14, 'a', size);
	path[14 + size] = '\0';
	{
		struct http_request req = { .path = path };

		http_do(&f, &req, &r);
		cr_assert(r.status >= 400 || r.curl_error != CURLE_OK, "%ld", r.status);
		http_response_free(&r);
	}
	strcpy(header, "X-Big: ");
	memset(header + 7, 'b', size);
	header[7 + size] = '\0';
	{
		struct http_request req = { .path = "/healthz", .headers = headers };

		http_do(&f, &req, &r);
		cr_assert(r.status >= 400 || r.curl_error != CURLE_OK, "%ld", r.status);
		http_response_free(&r);
	}
	/* and the server is fine */
	http_get(&f, "/healthz", &r);
	cr_assert_eq(r.status, 200);
	http_response_free(&r);
	free(path);
	free(header);
	fixture_stop(&f);
}

Test(server, too_many_query_parameters)
{
	struct fixture f;
	struct http_response r;
	char path[2048] = "/wake?";
	size_t len = strlen(path);

	fixture_start(&f, NULL);
	for (int i = 0; i < 120; i++)
		len += (size_t)snprintf(path + len, sizeof(path) - len, "%stags=weights",
					i ? "&" : "");
	http_post(&f, path, NULL, &r);
	assert_problem(&r, 400, "bad-request");
	http_response_free(&r);
	fixture_stop(&f);
}

static int connect_tcp(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct timeval tv = { .tv_sec = 20 };
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	cr_assert_geq(fd, 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

/* Send request as it is and read what comes back in one read (an answer
 * this small comes whole) into buf, NUL-terminated. */
static void raw_exchange(int fd, const char *request, char *buf, size_t size)
{
	size_t len = strlen(request);
	ssize_t n;

	cr_assert_eq(write(fd, request, len), (ssize_t)len);
	n = read(fd, buf, size - 1);
	cr_assert_gt(n, 0);
	buf[n] = '\0';
}

/* Send a keep-alive request and read its whole answer: afterwards the
 * server surely holds the connection. */
static void raw_request(int fd)
{
	char buf[1024];

	raw_exchange(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", buf, sizeof(buf));
	cr_assert(strstr(buf, "200 OK"), "%s", buf);
}

/* Over max_connections the connection idle longest makes room: the new one
 * is served within the limits (a request other than a probe gets 200, not a
 * spare slot's 503), the oldest idle one closed. */
Test(server, connection_limit_makes_room)
{
	struct fixture_config config = {
		.server = { .threads = 1, .max_connections = 2, .connection_timeout_s = 60,
			    .request_timeout_s = 60 },
	};
	struct fixture f;
	struct http_response r;
	char buf[64];
	ssize_t n;
	int a, b;

	fixture_start(&f, &config);
	a = connect_tcp(dormant_server_port(f.server));
	raw_request(a);
	b = connect_tcp(dormant_server_port(f.server));
	raw_request(b);
	/* idle past the grace in which a connection is never closed */
	nanosleep(&(struct timespec){ .tv_sec = (time_t)CONN_IDLE_GRACE_S + 1 }, NULL);
	{
		struct http_request req = { .path = "/is_sleeping", .timeout_ms = 20000 };

		http_do(&f, &req, &r);
		cr_assert_eq(r.status, 200, "a third connection was not served: %ld", r.status);
		http_response_free(&r);
	}
	/* a, the oldest, was closed for it (read 0 or a reset, not a timeout) */
	n = read(a, buf, sizeof(buf));
	cr_assert(n == 0 || (n < 0 && errno == ECONNRESET),
		  "the oldest idle connection was not closed (%zd, %s)", n, strerror(errno));
	close(a);
	/* the third connection is gone now too: b had room and still works */
	raw_request(b);
	close(b);
	fixture_stop(&f);
}

Test(server, idle_connections_time_out)
{
	struct fixture_config config = { .server = { .connection_timeout_s = 1 } };
	struct fixture f;
	char buf[256];
	ssize_t n;
	int fd;

	fixture_start(&f, &config);
	fd = connect_tcp(dormant_server_port(f.server));
	/* half a request, then nothing */
	cr_assert_eq(write(fd, "GET /healthz HTTP/1.1\r\nHo", 25), 25);
	n = read(fd, buf, sizeof(buf));
	cr_assert(n >= 0 || errno == ECONNRESET, "the server did not close the connection (%s)",
		  strerror(errno));
	close(fd);
	fixture_stop(&f);
}

Test(server, garbage_does_not_hurt)
{
	static const char *const inputs[] = {
		"\r\n\r\n",
		"GARBAGE\r\n\r\n",
		"POST /sleep HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
		"POST /sleep HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
		"POST /sleep HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{\"ta",
		"POST /sleep HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"GET /stats?pretty=%zz&%00=1 HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /%00 HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /stats HTTP/9.9\r\n\r\n",
	};
	struct fixture_config config = { .server = { .connection_timeout_s = 1 } };
	struct fixture f;
	struct http_response r;

	fixture_start(&f, &config);
	for (size_t i = 0; i < sizeof(inputs) / sizeof(inputs[0]); i++) {
		int fd = connect_tcp(dormant_server_port(f.server));
		char buf[2048];

		cr_assert_eq(write(fd, inputs[i], strlen(inputs[i])), (ssize_t)strlen(inputs[i]));
		shutdown(fd, SHUT_WR);
		while (read(fd, buf, sizeof(buf)) > 0)
			;
		close(fd);
	}
	http_get(&f, "/healthz", &r);
	cr_assert_eq(r.status, 200);
	http_response_free(&r);
	cr_assert_str_eq(tag_state(&f, "weights"), "awake");
	fixture_stop(&f);
}

/* ---- access log ---------------------------------------------------------- */

static char *read_all(FILE *f)
{
	size_t size = 0, cap = 4096;
	char *buf = malloc(cap);
	size_t n;

	cr_assert(buf);
	while ((n = fread(buf + size, 1, cap - size - 1, f)) > 0) {
		size += n;
		if (cap - size < 2) {
			cap *= 2;
			buf = realloc(buf, cap);
			cr_assert(buf);
		}
	}
	buf[size] = '\0';
	return buf;
}

/* The server's lines as its log callback got them, "I:" (info) or "W:"
 * (warning) before each; the server calls it from several threads. */
struct collected {
	pthread_mutex_t lock;
	pthread_cond_t released; /* held_log() waits for release */
	bool release;
	char text[16384];
	size_t size;
};

static int count_lines(const char *text, const char *what)
{
	int n = 0;

	for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
		n++;
	return n;
}

static void collect(enum dormant_log_level level, const char *message, void *userdata)
{
	struct collected *c = userdata;
	int n;

	pthread_mutex_lock(&c->lock);
	n = snprintf(c->text + c->size, sizeof(c->text) - c->size, "%s:%s\n",
		     level == DORMANT_LOG_INFO ? "I" : level == DORMANT_LOG_WARNING ? "W" : "?",
		     message);
	if (n > 0 && (size_t)n < sizeof(c->text) - c->size)
		c->size += (size_t)n;
	pthread_mutex_unlock(&c->lock);
}

/* What the library wrote on the redirected stderr: it must never print. */
static void expect_nothing_printed(void)
{
	char *printed;

	fflush(stderr);
	printed = read_all(cr_get_redirected_stderr());
	cr_expect_str_empty(printed, "the library printed: %s", printed);
	free(printed);
}

Test(server, access_log_one_line_per_request, .init = cr_redirect_stderr)
{
	struct collected c = { .lock = PTHREAD_MUTEX_INITIALIZER };
	struct fixture_config config = {
		.access_log = true,
		.server = { .log = collect, .log_userdata = &c },
	};
	struct fixture f;
	struct http_response r;

	fixture_start(&f, &config);
	http_get(&f, "/healthz", &r);
	http_response_free(&r);
	http_post(&f, "/sleep", NULL, &r);
	http_response_free(&r);
	http_get(&f, "/no%01such%1b", &r);
	http_response_free(&r);
	/* control characters in the method never reach the log raw */
	http_do(&f, &(struct http_request){ .method = "G\033T\177\\", .path = "/x%0d%0a" }, &r);
	http_response_free(&r);
	fixture_stop(&f); /* every request has completed */
	cr_assert(strstr(c.text, "I:GET /healthz 200 "), "%s", c.text);
	cr_assert(strstr(c.text, "I:POST /sleep 200 "), "%s", c.text);
	cr_assert(strstr(c.text, "I:GET /no\\x01such\\x1b 404 "), "%s", c.text);
	cr_assert(strstr(c.text, "I:G\\x1bT\\x7f\\x5c /x\\x0d\\x0a "), "%s", c.text);
	cr_assert(strstr(c.text, " ms\n"), "%s", c.text);
	cr_assert_null(strstr(c.text, "W:"), "%s", c.text);
	for (const char *p = c.text; *p; p++)
		cr_assert(*p == '\n' || ((unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f),
			  "a raw byte 0x%02x in the log: %s", (unsigned char)*p, c.text);
	expect_nothing_printed();
}

Test(server, quiet_means_no_log, .init = cr_redirect_stderr)
{
	struct collected c = { .lock = PTHREAD_MUTEX_INITIALIZER };
	struct fixture_config config = { .server = { .log = collect, .log_userdata = &c } };
	struct fixture f;
	struct http_response r;

	fixture_start(&f, &config);
	http_get(&f, "/healthz", &r);
	http_response_free(&r);
	fixture_stop(&f);
	cr_assert_eq(c.size, 0, "%s", c.text);
	expect_nothing_printed();
}

/* The warnings at start go to the callback, quiet or not; without a
 * callback, no line goes anywhere. */
Test(server, start_warnings_go_to_the_log, .init = cr_redirect_stderr)
{
	struct collected c = { .lock = PTHREAD_MUTEX_INITIALIZER };
	struct fixture_config config = {
		.server = { .faults = "wake:create", .log = collect, .log_userdata = &c },
	};
	struct fixture f;

	fixture_start(&f, &config);
	fixture_stop(&f);
	cr_assert(strstr(c.text, "W:fault injection armed (a test tool): wake:create\n"), "%s",
		  c.text);

	c.size = 0;
	c.text[0] = '\0';
	config.server.faults = NULL;
	cr_assert_eq(setenv("DORMANT_FAULTS", "sleep:copy", 1), 0);
	fixture_start(&f, &config);
	fixture_stop(&f);
	cr_assert(strstr(c.text, "W:$DORMANT_FAULTS is ignored"), "%s", c.text);

	/* the same server without a callback: faults armed, the access log on */
	config = (struct fixture_config){ .access_log = true, .server = { .faults = "wake:create" } };
	fixture_start(&f, &config);
	{
		struct http_response r;

		http_get(&f, "/healthz", &r);
		http_response_free(&r);
	}
	fixture_stop(&f);
	unsetenv("DORMANT_FAULTS");
	expect_nothing_printed();
}

/* Once started, libmicrohttpd's complaints about a client reach the log
 * callback at debug level (here: a header line without a colon, which it
 * answers 400 itself), one line each, and are never printed. */
Test(server, libmicrohttpd_complaints_go_to_the_log, .init = cr_redirect_stderr)
{
	struct collected c = { .lock = PTHREAD_MUTEX_INITIALIZER };
	struct fixture_config config = { .server = { .log = collect, .log_userdata = &c } };
	struct fixture f;
	char buf[1024];
	int fd;

	fixture_start(&f, &config);
	fd = connect_tcp(dormant_server_port(f.server));
	raw_exchange(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", buf,
		     sizeof(buf));
	cr_assert(strstr(buf, " 400 "), "%s", buf);
	close(fd);
	fixture_stop(&f);
	cr_assert(strstr(c.text, "?:libmicrohttpd: "), "%s", c.text);
	cr_assert_null(strstr(c.text, "\n\n"), "a message's own newline kept: %s", c.text);
	expect_nothing_printed();
}

/* A log callback that does not return (Python's, waiting for the GIL) holds
 * no request up: with one thread answering, requests are still answered
 * while the first access line waits in the callback. */
static void held_log(enum dormant_log_level level, const char *message, void *userdata)
{
	struct collected *c = userdata;

	pthread_mutex_lock(&c->lock);
	while (!c->release)
		pthread_cond_wait(&c->released, &c->lock);
	pthread_mutex_unlock(&c->lock);
	collect(level, message, userdata);
}

Test(server, a_held_log_callback_holds_no_request_up)
{
	struct collected c = { .lock = PTHREAD_MUTEX_INITIALIZER,
			       .released = PTHREAD_COND_INITIALIZER };
	struct fixture_config config = {
		.access_log = true,
		.server = { .threads = 1, .log = held_log, .log_userdata = &c },
	};
	struct fixture f;
	struct http_response r;

	fixture_start(&f, &config);
	for (int i = 0; i < 5; i++) {
		http_do(&f, &(struct http_request){ .path = "/healthz", .timeout_ms = 10000 }, &r);
		cr_assert_eq(r.status, 200, "request %d: %ld (curl %d)", i, r.status, (int)r.curl_error);
		http_response_free(&r);
	}
	pthread_mutex_lock(&c.lock);
	cr_assert_eq(c.size, 0, "a line got through a held callback: %s", c.text);
	c.release = true;
	pthread_cond_broadcast(&c.released);
	pthread_mutex_unlock(&c.lock);
	fixture_stop(&f); /* every line handed over */
	cr_assert_eq(count_lines(c.text, "I:GET /healthz 200 "), 5, "%s", c.text);
}
