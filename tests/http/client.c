/* SPDX-License-Identifier: MIT */
#include <stddef.h>
#include "client.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static unsigned char pattern_byte(size_t i)
{
	return (unsigned char)((i * 131u + (i >> 12) * 7u + 17u) & 0xff);
}

static void weights_fill(struct fixture *f)
{
	unsigned char *buf = malloc(TEST_TAG_BYTES);

	cr_assert(buf);
	for (size_t i = 0; i < TEST_TAG_BYTES; i++)
		buf[i] = pattern_byte(i);
	cr_assert_eq(dormant_copy_to_device(f->m, f->weights, buf, TEST_TAG_BYTES), 0, "%s",
		     dormant_last_error());
	free(buf);
}

bool weights_intact(struct fixture *f)
{
	unsigned char *buf = malloc(TEST_TAG_BYTES);
	bool ok = true;

	cr_assert(buf);
	cr_assert_eq(dormant_copy_to_host(f->m, buf, f->weights, TEST_TAG_BYTES), 0, "%s",
		     dormant_last_error());
	for (size_t i = 0; i < TEST_TAG_BYTES && ok; i++)
		ok = buf[i] == pattern_byte(i);
	free(buf);
	return ok;
}

bool grads_zero(struct fixture *f)
{
	unsigned char *buf = malloc(TEST_TAG_BYTES);
	bool ok = true;

	cr_assert(buf);
	cr_assert_eq(dormant_copy_to_host(f->m, buf, f->grads, TEST_TAG_BYTES), 0, "%s",
		     dormant_last_error());
	for (size_t i = 0; i < TEST_TAG_BYTES && ok; i++)
		ok = buf[i] == 0;
	free(buf);
	return ok;
}

int test_server_options_make(const struct test_server_options *t,
			     struct dormant_server_options **ret)
{
	static const struct {
		const char *name;
		size_t offset;
	} texts[] = {
		{ "listen", offsetof(struct test_server_options, listen) },
		{ "unix_path", offsetof(struct test_server_options, unix_path) },
		{ "token", offsetof(struct test_server_options, token) },
		{ "token_file", offsetof(struct test_server_options, token_file) },
		{ "faults", offsetof(struct test_server_options, faults) },
	}, numbers[] = {
		{ "threads", offsetof(struct test_server_options, threads) },
		{ "max_connections", offsetof(struct test_server_options, max_connections) },
		{ "connection_timeout_s",
		  offsetof(struct test_server_options, connection_timeout_s) },
		{ "max_connections_per_ip",
		  offsetof(struct test_server_options, max_connections_per_ip) },
		{ "request_timeout_s", offsetof(struct test_server_options, request_timeout_s) },
	};
	struct dormant_server_options *o;
	int r = dormant_server_options_new(&o);

	for (size_t i = 0; r == 0 && i < sizeof(texts) / sizeof(texts[0]); i++) {
		const char *v = *(const char *const *)((const char *)t + texts[i].offset);

		if (v)
			r = dormant_server_options_set(o, texts[i].name, v);
	}
	for (size_t i = 0; r == 0 && i < sizeof(numbers) / sizeof(numbers[0]); i++) {
		unsigned v = *(const unsigned *)((const char *)t + numbers[i].offset);

		if (v)
			r = dormant_server_options_set_int(o, numbers[i].name, v);
	}
	if (r == 0 && t->open_probes)
		r = dormant_server_options_set_int(o, "open_probes", 1);
	if (r == 0 && t->quiet)
		r = dormant_server_options_set_int(o, "quiet", 1);
	if (r == 0)
		r = dormant_server_options_set_stats_extra(o, t->stats_extra,
							   t->stats_extra_userdata);
	if (r == 0)
		r = dormant_server_options_set_metrics_extra(o, t->metrics_extra,
							     t->metrics_extra_userdata);
	if (r == 0 && t->log)
		r = dormant_server_options_set_log(o, t->log, t->log_userdata);
	if (r < 0) {
		dormant_server_options_destroy(o);
		return r;
	}
	*ret = o;
	return 0;
}

int test_server_start(struct dormant *m, const struct test_server_options *t,
		      struct dormant_server **ret)
{
	struct dormant_server_options *o = NULL;
	int r = t ? test_server_options_make(t, &o) : 0;

	if (r < 0)
		return r;
	r = dormant_server_start(m, o, ret);
	dormant_server_options_destroy(o);
	return r;
}

int test_server_check(const struct test_server_options *t)
{
	struct dormant_server_options *o = NULL;
	int r = t ? test_server_options_make(t, &o) : 0;

	if (r < 0)
		return r;
	r = dormant_server_options_check(o);
	dormant_server_options_destroy(o);
	return r;
}

void fixture_start(struct fixture *f, const struct fixture_config *config)
{
	static const struct fixture_config defaults = { 0 };
	struct dormant_options *options = NULL;
	struct test_server_options server;
	unsigned char *dirty;

	if (!config)
		config = &defaults;
	memset(f, 0, sizeof(*f));
	curl_global_init(CURL_GLOBAL_ALL);
	cr_assert_eq(dormant_options_new(&options), 0);
	cr_assert_eq(dormant_options_parse(options, "backend=host,host_mode=release,"
					   "staging_bytes=8MiB,host_device_bytes=128MiB"), 0,
		     "%s", dormant_last_error());
	/* 0: the defaults */
	if (config->guard_timeout_ms)
		cr_assert_eq(dormant_options_set_int(options, "guard_timeout_ms",
						     config->guard_timeout_ms), 0);
	if (config->chunk_bytes)
		cr_assert_eq(dormant_options_set_int(options, "chunk_bytes",
						     (long long)config->chunk_bytes), 0);
	cr_assert_eq(dormant_new(options, &f->m), 0, "%s", dormant_last_error());
	dormant_options_destroy(options);
	if (!config->no_tags) {
		cr_assert_eq(dormant_set_policy(f->m, "grads", DORMANT_DISCARD), 0);
		cr_assert_eq(dormant_alloc(f->m, "weights", TEST_TAG_BYTES, &f->weights), 0, "%s",
			     dormant_last_error());
		cr_assert_eq(dormant_alloc(f->m, "grads", TEST_TAG_BYTES, &f->grads), 0, "%s",
			     dormant_last_error());
		weights_fill(f);
		/* dirty gradients: a wake must give them back as zeros */
		dirty = malloc(TEST_TAG_BYTES);
		cr_assert(dirty);
		memset(dirty, 0x5a, TEST_TAG_BYTES);
		cr_assert_eq(dormant_copy_to_device(f->m, f->grads, dirty, TEST_TAG_BYTES), 0);
		free(dirty);
	}
	if (config->no_server)
		return;
	server = config->server;
	if (!server.listen && !server.unix_path)
		server.listen = "127.0.0.1:0";
	server.quiet = !config->access_log; /* the access log has its own test */
	cr_assert_eq(test_server_start(f->m, &server, &f->server), 0, "%s",
		     dormant_last_error());
	if (server.unix_path) {
		snprintf(f->base, sizeof(f->base), "http://localhost");
		snprintf(f->unix_path, sizeof(f->unix_path), "%s", server.unix_path);
	} else {
		snprintf(f->base, sizeof(f->base), "%s", dormant_server_url(f->server));
	}
}

void fixture_stop(struct fixture *f)
{
	dormant_server_stop(f->server);
	f->server = NULL;
	if (f->m) {
		dormant_free(f->m, f->weights);
		dormant_free(f->m, f->grads);
		dormant_destroy(f->m);
	}
	f->m = NULL;
	curl_global_cleanup();
}

/* ---- client -------------------------------------------------------------- */

struct buffer {
	char *data;
	size_t size;
};

static size_t buffer_write(char *ptr, size_t size, size_t nmemb, void *userdata)
{
	struct buffer *b = userdata;
	size_t n = size * nmemb;
	char *grown = realloc(b->data, b->size + n + 1);

	if (!grown)
		return 0;
	memcpy(grown + b->size, ptr, n);
	b->data = grown;
	b->size += n;
	b->data[b->size] = '\0';
	return n;
}

void http_do(const struct fixture *f, const struct http_request *req, struct http_response *ret)
{
	struct buffer body = { 0 }, headers = { 0 };
	struct curl_slist *list = NULL;
	const char *method = req->method ? req->method : "GET";
	char url[4096 + 256], line[512];
	CURL *curl = req->handle ? req->handle : curl_easy_init();

	cr_assert(curl);
	memset(ret, 0, sizeof(*ret));
	if (req->handle)
		curl_easy_reset(curl);
	snprintf(url, sizeof(url), "%s%s", f->base, req->path);
	curl_easy_setopt(curl, CURLOPT_URL, url);
	curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, req->timeout_ms ? req->timeout_ms : 30000L);
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, buffer_write);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
	curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, buffer_write);
	curl_easy_setopt(curl, CURLOPT_HEADERDATA, &headers);
	if (req->unix_path || f->unix_path[0])
		curl_easy_setopt(curl, CURLOPT_UNIX_SOCKET_PATH,
				 req->unix_path ? req->unix_path : f->unix_path);
	if (strcmp(method, "HEAD") == 0)
		curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
	else if (strcmp(method, "GET") != 0 || req->body)
		curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
	if (req->body) {
		curl_easy_setopt(curl, CURLOPT_POSTFIELDS, req->body);
		curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
				 (curl_off_t)(req->body_size ? req->body_size : strlen(req->body)));
		snprintf(line, sizeof(line), "Content-Type: %s",
			 req->content_type ? req->content_type : "application/json");
		list = curl_slist_append(list, line);
	} else if (strcmp(method, "POST") == 0) {
		/* a POST with no body at all */
		curl_easy_setopt(curl, CURLOPT_POSTFIELDS, "");
		curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)0);
		if (req->content_type) {
			snprintf(line, sizeof(line), "Content-Type: %s", req->content_type);
			list = curl_slist_append(list, line);
		}
	}
	/* no "Expect: 100-continue" round trip */
	list = curl_slist_append(list, "Expect:");
	for (size_t i = 0; req->headers && req->headers[i]; i++)
		list = curl_slist_append(list, req->headers[i]);
	curl_easy_setopt(curl, CURLOPT_HTTPHEADER, list);

	ret->curl_error = curl_easy_perform(curl);
	if (ret->curl_error == CURLE_OK)
		curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &ret->status);
	ret->body = body.data ? body.data : calloc(1, 1);
	ret->size = body.size;
	ret->headers = headers.data ? headers.data : calloc(1, 1);
	ret->headers_size = headers.size;
	curl_slist_free_all(list);
	if (!req->handle)
		curl_easy_cleanup(curl);
}

void http_response_free(struct http_response *r)
{
	free(r->body);
	free(r->headers);
	memset(r, 0, sizeof(*r));
}

void http_get(const struct fixture *f, const char *path, struct http_response *ret)
{
	struct http_request req = { .path = path };

	http_do(f, &req, ret);
	cr_assert_eq(ret->curl_error, CURLE_OK, "GET %s: %s", path,
		     curl_easy_strerror(ret->curl_error));
}

void http_post(const struct fixture *f, const char *path, const char *json,
	       struct http_response *ret)
{
	struct http_request req = { .method = "POST", .path = path, .body = json };

	http_do(f, &req, ret);
	cr_assert_eq(ret->curl_error, CURLE_OK, "POST %s: %s", path,
		     curl_easy_strerror(ret->curl_error));
}

bool http_header(const struct http_response *r, const char *name, char *buf, size_t size)
{
	size_t len = strlen(name);

	for (const char *line = r->headers; line && *line;) {
		const char *end = strstr(line, "\r\n");
		size_t line_len = end ? (size_t)(end - line) : strlen(line);

		if (line_len > len && strncasecmp(line, name, len) == 0 && line[len] == ':') {
			const char *v = line + len + 1;
			size_t n;

			while (*v == ' ')
				v++;
			n = (size_t)(line + line_len - v);
			if (n >= size)
				n = size - 1;
			memcpy(buf, v, n);
			buf[n] = '\0';
			return true;
		}
		line = end ? end + 2 : line + line_len;
	}
	return false;
}

json_t *http_json(const struct http_response *r)
{
	json_error_t error;
	json_t *doc = json_loadb(r->body, r->size, 0, &error);

	cr_assert(doc, "not JSON (%s): %.300s", error.text, r->body);
	return doc;
}

void assert_problem(const struct http_response *r, long status, const char *slug)
{
	char type[128], content_type[128];
	json_t *doc;

	cr_assert_eq(r->status, status, "status %ld, not %ld: %.400s", r->status, status, r->body);
	cr_assert(http_header(r, "Content-Type", content_type, sizeof(content_type)));
	cr_assert_str_eq(content_type, "application/problem+json");
	doc = http_json(r);
	snprintf(type, sizeof(type), "urn:dormant:problem:%s", slug);
	cr_assert_str_eq(json_string_value(json_object_get(doc, "type")), type, "%s", r->body);
	cr_assert_eq(json_integer_value(json_object_get(doc, "status")), status);
	cr_assert(json_is_string(json_object_get(doc, "title")));
	cr_assert(json_is_string(json_object_get(doc, "detail")));
	json_decref(doc);
}

const char *tag_state(struct fixture *f, const char *tag)
{
	static struct dormant_stats stats;

	cr_assert_eq(dormant_stats_get(f->m, &stats), 0);
	for (size_t i = 0; i < stats.tag_count; i++)
		if (strcmp(stats.tags[i].tag, tag) == 0)
			return dormant_state_name(stats.tags[i].state);
	return "none";
}
