/* SPDX-License-Identifier: MIT */
/* Helpers of the HTTP tests: a server on the host backend started in the
 * test process, and a small libcurl client. */
#ifndef DORMANT_TESTS_HTTP_CLIENT_H
#define DORMANT_TESTS_HTTP_CLIENT_H

#include <curl/curl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "dormant-server.h"
#include "dormant.h"

#define TEST_TAG_BYTES ((size_t)8 << 20)

struct fixture {
	struct dormant *m;
	struct dormant_server *server;
	void *weights; /* tag "weights", keep, filled with a pattern */
	void *grads;   /* tag "grads", discard */
	char base[256]; /* "http://127.0.0.1:PORT" */
	char unix_path[108];
};

/* The server's options as the tests write them (designated initializers;
 * NULL, 0 and false: not set), turned into the library's options object by
 * test_server_options_make(). */
struct test_server_options {
	const char *listen;
	const char *unix_path;
	const char *token;
	const char *token_file;
	bool open_probes;
	unsigned threads;
	unsigned max_connections;
	unsigned connection_timeout_s;
	bool quiet;
	dormant_stats_extra_fn stats_extra;
	void *stats_extra_userdata;
	dormant_metrics_extra_fn metrics_extra;
	void *metrics_extra_userdata;
	unsigned max_connections_per_ip;
	unsigned request_timeout_s;
	const char *faults;
	dormant_log_fn log; /* dormant_server_options_set_log() */
	void *log_userdata;
};

/* Set what t sets on a fresh object, in the order above; the first
 * setter's error is returned (nothing made). */
int test_server_options_make(const struct test_server_options *t,
			     struct dormant_server_options **ret);
/* dormant_server_start() / dormant_server_options_check() with t (NULL:
 * NULL), or the first setter's error. */
int test_server_start(struct dormant *m, const struct test_server_options *t,
		      struct dormant_server **ret);
int test_server_check(const struct test_server_options *t);

struct fixture_config {
	int guard_timeout_ms;  /* 0: the library's default */
	size_t chunk_bytes;    /* 0: default */
	struct test_server_options server; /* listen defaults to 127.0.0.1:0 */
	bool no_server;
	bool no_tags;
	bool access_log; /* else the server is quiet */
};

/* Start a manager on the host backend with the two tags, and a server.
 * Fails the test on any error. */
void fixture_start(struct fixture *f, const struct fixture_config *config);
void fixture_stop(struct fixture *f);

/* Whether the weights still hold the pattern fixture_start wrote. */
bool weights_intact(struct fixture *f);
/* Whether the grads are all zero. */
bool grads_zero(struct fixture *f);

struct http_response {
	long status;      /* 0: no HTTP answer (see curl_error) */
	CURLcode curl_error;
	char *body;       /* NUL-terminated */
	size_t size;
	char *headers;    /* raw header lines */
	size_t headers_size;
};

struct http_request {
	const char *method;        /* default GET */
	const char *path;          /* appended to the fixture's base */
	const char *body;          /* NULL: none */
	size_t body_size;          /* 0 with body: strlen(body) */
	const char *content_type;  /* NULL with a body: application/json */
	const char *const *headers; /* extra, NULL-terminated */
	const char *unix_path;     /* connect through this socket */
	long timeout_ms;           /* 0: 30000 */
	CURL *handle;              /* reuse (keep-alive); NULL: a fresh one */
};

/* Send a request; returns the response (status 0 on a transport error). */
void http_do(const struct fixture *f, const struct http_request *req, struct http_response *ret);
void http_response_free(struct http_response *r);

/* Shorthands; fail the test on a transport error. */
void http_get(const struct fixture *f, const char *path, struct http_response *ret);
void http_post(const struct fixture *f, const char *path, const char *json,
	       struct http_response *ret);

/* A header's value (case-insensitive name) copied into buf; false if absent. */
bool http_header(const struct http_response *r, const char *name, char *buf, size_t size);

/* The body as JSON; fails the test if it is not. Caller decrefs. */
json_t *http_json(const struct http_response *r);

/* Assert a problem document with this status and slug. */
void assert_problem(const struct http_response *r, long status, const char *slug);

/* Read a tag's state from /stats-equivalent data of the manager. */
const char *tag_state(struct fixture *f, const char *tag);

#endif
