/* SPDX-License-Identifier: MIT */
/*
 * The embedded HTTP server: a libmicrohttpd daemon with its own pool of
 * threads, in front of the handlers of api/.
 *
 * Per request, libmicrohttpd calls on_request() several times: first with the
 * headers (authentication, routing, a Content-Length over the limit are
 * answered there, before any body is read), then with pieces of the body
 * (kept up to API_BODY_MAX), then once more to answer. A sleep or wake is
 * answered on a thread of its own while the connection is suspended, and
 * on_request() is called once more to send the answer when it resumes.
 * on_completed() writes the access log line and frees the request.
 *
 * Staying reachable: every connection is in the connection table
 * (conns.c: the limits that make room by closing idle connections only, the
 * spare slots where probes are answered over the limits, the request
 * deadline, the watchdog); a connection on which a request has begun to
 * arrive is never closed to make room.
 * Query strings with more parameters than the api takes are cut before
 * libmicrohttpd parses them (see on_uri()).
 *
 * Stopping: the listening socket is closed first, new requests on open
 * connections get 503, requests inside a handler (a sleep or wake) run to
 * their end and their responses are given a moment to be sent; then the
 * daemon stops.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "api.h"
#include "auth.h"
#include "conns.h"
#include "discovery.h"
#include "dormant-server.h"
#include "faults.h"
#include "listen.h"
#include "logq.h"
#include "server_options.h"
#include "routes.h"
#include "common.h"

/* libmicrohttpd's own connection limit is at most this */
#define MAX_CONNECTIONS 65536
/* How long stop waits for responses already answered to be sent. */
#define STOP_FLUSH_S 2.0
/* Longest path kept for the access log. */
#define LOG_PATH_MAX 160
/* Most slow handlers (sleep, wake) running on threads of their own at once;
 * beyond, they run on the server thread that received them. Only one
 * transition runs at a time anyway: the others answer 409 at once. */
#define OFFLOAD_MAX 8

struct dormant_server {
	struct dormant *manager;
	struct MHD_Daemon *daemon;
	struct api_context api;
	char *token;
	bool open_probes;
	bool quiet;
	struct log_queue logq; /* the access log, the start's warnings: logq.h */
	struct listener listener; /* listen.c: the socket, port, url */
	struct fault_switch faults;
	char *faults_text; /* its rules when armed: /stats, /metrics */

	struct conn_table conns; /* every open connection, the limits, the watchdog */
	bool unix_listener;      /* listening on a Unix socket */

	/* messages libmicrohttpd logs while starting; later ones are dropped */
	atomic_bool starting;
	char start_error[256];

	pthread_mutex_t lock; /* the fields below */
	pthread_cond_t idle;
	unsigned requests_active;  /* between their first call and completion */
	unsigned handlers_running; /* inside an api handler */
	/* connections resumed by a slow handler's thread that libmicrohttpd has
	 * not taken back yet (it does on its own thread, a moment later): it
	 * aborts the process when stopped with a connection still suspended */
	unsigned resumes_pending;
	unsigned offloaded;        /* handlers running on threads of their own */
	bool stopping;
	char *record_path;         /* discovery record (discovery.c), removed at stop */
};

struct params {
	struct api_param items[API_PARAMS_MAX];
	size_t count;
	bool overflow;
};

struct request {
	struct dormant_server *server;
	struct conn *conn;      /* NULL if it could not be found */
	bool spare;             /* conn is in a spare slot: a probe or 503 */
	bool begun;             /* request_begin() ran */
	bool too_many_params;   /* the query was cut by on_uri() */
	double start_s;
	char method[64]; /* escaped for the log (log_copy()) */
	char path[LOG_PATH_MAX];
	const struct route *route;
	char *body;
	size_t body_size;
	bool too_large;
	bool answered; /* a response is queued: ignore the rest */
	bool close;    /* close the connection after the answer */
	int status;

	/* A slow route (sleep, wake) runs on a thread of its own while the
	 * connection is suspended; its answer waits here until it resumes. */
	struct MHD_Connection *connection;
	struct params *params;
	struct api_request req;
	struct api_response deferred;
	bool deferred_ready;
	bool resume_pending; /* counted in resumes_pending; under s->lock */
};

/* ---- responses ----------------------------------------------------------- */

static enum MHD_Result send_response(struct MHD_Connection *connection, struct request *rq,
				     struct api_response *resp)
{
	struct MHD_Response *response;
	enum MHD_Result ret;
	char retry[16];

	if (resp->body_static || !resp->body) {
		response = MHD_create_response_from_buffer(resp->body_size, resp->body,
							   MHD_RESPMEM_PERSISTENT);
	} else {
		response = MHD_create_response_from_buffer(resp->body_size, resp->body,
							   MHD_RESPMEM_MUST_FREE);
		if (response)
			resp->body = NULL; /* the response frees it */
	}
	if (!response) {
		api_response_finish(resp);
		return MHD_NO;
	}
	api_response_finish(resp);
	if (resp->content_type)
		MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, resp->content_type);
	MHD_add_response_header(response, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	MHD_add_response_header(response, "X-Content-Type-Options", "nosniff");
	if (resp->allow)
		MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, resp->allow);
	if (resp->www_authenticate)
		MHD_add_response_header(response, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
					resp->www_authenticate);
	if (rq->close)
		MHD_add_response_header(response, MHD_HTTP_HEADER_CONNECTION, "close");
	if (resp->retry_after_s) {
		snprintf(retry, sizeof(retry), "%u", resp->retry_after_s);
		MHD_add_response_header(response, MHD_HTTP_HEADER_RETRY_AFTER, retry);
	}
	ret = MHD_queue_response(connection, (unsigned)resp->status, response);
	MHD_destroy_response(response);
	rq->status = resp->status;
	rq->answered = true;
	return ret;
}

/* Answer at once with a problem document. */
static enum MHD_Result send_problem(struct MHD_Connection *connection, struct request *rq,
				    int status, const char *slug, const char *detail)
{
	struct api_response resp = { 0 };

	api_problem(&resp, status, slug, NULL, "%s", detail);
	if (status == 401)
		resp.www_authenticate = rq->server->token &&
						MHD_lookup_connection_value(connection,
									    MHD_HEADER_KIND,
									    MHD_HTTP_HEADER_AUTHORIZATION)
					? "Bearer realm=\"dormant\", error=\"invalid_token\""
					: "Bearer realm=\"dormant\"";
	if (status == 405)
		resp.allow = route_allow_header(rq->route);
	return send_response(connection, rq, &resp);
}

/* 503 with Retry-After: over the connection limits, on a spare slot. */
static enum MHD_Result send_overloaded(struct MHD_Connection *connection, struct request *rq)
{
	struct api_response resp = { 0 };

	api_problem(&resp, 503, "overloaded", NULL,
		    "too many connections: only probes are answered now; retry after %u s",
		    CONN_RETRY_AFTER_S);
	resp.retry_after_s = CONN_RETRY_AFTER_S;
	return send_response(connection, rq, &resp);
}

/* ---- connections --------------------------------------------------------- */

static void on_connection(void *cls, struct MHD_Connection *connection, void **socket_context,
			  enum MHD_ConnectionNotificationCode code)
{
	struct dormant_server *s = cls;

	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		const union MHD_ConnectionInfo *fd_info =
			MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
		const union MHD_ConnectionInfo *addr_info =
			MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);

		/* every client of a Unix socket is of this node, whatever
		 * address libmicrohttpd has for it */
		static const struct sockaddr unix_client = { .sa_family = AF_UNIX };
		const struct sockaddr *addr = s->unix_listener ? &unix_client
					      : addr_info ? addr_info->client_addr
							  : NULL;

		/* untracked without its socket: libmicrohttpd's own limit holds */
		*socket_context = fd_info ? conn_opened(&s->conns, fd_info->connect_fd, addr)
					  : NULL;
	} else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
		conn_closed(&s->conns, *socket_context);
		*socket_context = NULL;
	}
}

static struct conn *conn_of(struct MHD_Connection *connection)
{
	const union MHD_ConnectionInfo *info =
		MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return info ? info->socket_context : NULL;
}

/* ---- requests ------------------------------------------------------------ */

static enum MHD_Result param_collect(void *cls, enum MHD_ValueKind kind, const char *key,
				     const char *value)
{
	struct params *params = cls;

	if (params->count == API_PARAMS_MAX) {
		params->overflow = true;
		return MHD_NO;
	}
	params->items[params->count++] = (struct api_param){ .key = key ? key : "", .value = value };
	return MHD_YES;
}

/* Keep a copy of a request's method or path for the access log, bytes
 * outside printable ASCII (ESC, CR, LF, DEL, ...) and the backslash written
 * as \xNN: a client never writes into the log, on a 401 or otherwise. */
static void log_copy(char *dst, size_t size, const char *src)
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;

	for (const unsigned char *p = (const unsigned char *)src; *p; p++) {
		bool plain = *p > 0x20 && *p < 0x7f && *p != '\\';

		if (o + (plain ? 1 : 4) >= size)
			break;
		if (plain) {
			dst[o++] = (char)*p;
			continue;
		}
		dst[o++] = '\\';
		dst[o++] = 'x';
		dst[o++] = hex[*p >> 4];
		dst[o++] = hex[*p & 15];
	}
	dst[o] = '\0';
}

static void request_counts(struct dormant_server *s, int active, int handlers)
{
	pthread_mutex_lock(&s->lock);
	s->requests_active += (unsigned)active;
	s->handlers_running += (unsigned)handlers;
	pthread_cond_broadcast(&s->idle);
	pthread_mutex_unlock(&s->lock);
}

struct header_scan {
	unsigned content_lengths;
	const char *content_length; /* the first */
	size_t content_length_size;
	bool differing_lengths;
	bool transfer_encoding;
	bool nul;
};

static enum MHD_Result header_scan_one(void *cls, enum MHD_ValueKind kind, const char *key,
				       size_t key_size, const char *value, size_t value_size)
{
	struct header_scan *scan = cls;

	/* libmicrohttpd 0.9.75 reads header values as C strings, so a value
	 * with a NUL arrives cut short. It parses in place, replacing the
	 * line's CR LF with two NULs: right after a whole value come two NULs,
	 * after a cut one the rest of the line. (A bare LF as line end leaves
	 * one NUL and is refused the same way: proxies differ on it too.) The
	 * bytes read lie inside the request's head, which ends with an empty
	 * line. */
	if (value && value[value_size] == '\0' && value[value_size + 1] != '\0')
		scan->nul = true;
	if (!key)
		return MHD_YES;
	if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
		if (scan->content_lengths++ == 0) {
			scan->content_length = value;
			scan->content_length_size = value_size;
		} else if (!value || !scan->content_length || value_size != scan->content_length_size ||
			   memcmp(value, scan->content_length, value_size) != 0) {
			scan->differing_lengths = true;
		}
	}
	if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0)
		scan->transfer_encoding = true;
	return MHD_YES;
}

/* Why a request's framing or headers are ambiguous (RFC 9112 6.3, RFC 9110
 * 5.5), or NULL: Content-Length headers that differ, Content-Length with
 * Transfer-Encoding, a NUL byte in a header (libmicrohttpd would hand the
 * value on cut at the NUL: less than a proxy in front saw). */
static const char *request_ambiguous(struct MHD_Connection *connection)
{
	struct header_scan scan = { 0 };

	MHD_get_connection_values_n(connection, MHD_HEADER_KIND, header_scan_one, &scan);
	if (scan.nul)
		return "a header holds a NUL byte (or a line ends in a bare LF)";
	if (scan.differing_lengths)
		return "the request has Content-Length headers that differ";
	if (scan.content_lengths && scan.transfer_encoding)
		return "the request has both Content-Length and Transfer-Encoding";
	return NULL;
}

/*
 * The request line is in, its query not yet parsed. libmicrohttpd 0.9.75
 * keeps every query parameter in the connection's memory pool (about 56
 * bytes each) and, when the pool runs out, closes the connection without an
 * answer. A query with more parameters than the api takes (API_PARAMS_MAX)
 * is therefore cut here, in the buffer libmicrohttpd is about to parse
 * (it is ours to change: the request's own bytes, parsed after this call),
 * and the request answered 400 by request_answer(). The request object made
 * here is the one the handler gets.
 */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *connection)
{
	struct dormant_server *s = cls;
	struct request *rq = calloc(1, sizeof(*rq));
	char *query = strchr(uri, '?');
	size_t params = 0;

	if (!rq)
		return NULL; /* request_begin() tries again */
	rq->server = s;
	rq->start_s = now_monotonic_s();
	/* a request is arriving: the limits never close this connection now */
	rq->conn = conn_of(connection);
	if (rq->conn)
		rq->spare = conn_receiving(&s->conns, rq->conn);
	if (query) {
		for (const char *p = query + 1; *p; p++)
			if (*p == '&' || p == query + 1)
				params++;
		if (params > API_PARAMS_MAX) {
			rq->too_many_params = true;
			query[1] = '\0';
		}
	}
	return rq;
}

/* The first call: headers are in, no body read yet. */
static enum MHD_Result request_begin(struct dormant_server *s, struct MHD_Connection *connection,
				     const char *url, const char *method, void **con_cls)
{
	struct request *rq = *con_cls ? *con_cls : calloc(1, sizeof(*rq));
	const char *length;
	const char *refusal;
	bool stopping;

	if (!rq)
		return MHD_NO;
	if (!rq->server) {
		rq->server = s;
		rq->start_s = now_monotonic_s();
	}
	rq->begun = true;
	if (!rq->conn) {
		rq->conn = conn_of(connection);
		if (rq->conn)
			rq->spare = conn_receiving(&s->conns, rq->conn);
	}
	log_copy(rq->method, sizeof(rq->method), method);
	log_copy(rq->path, sizeof(rq->path), url);
	rq->route = route_find(url);
	*con_cls = rq;
	pthread_mutex_lock(&s->lock);
	s->requests_active++;
	stopping = s->stopping;
	pthread_mutex_unlock(&s->lock);

	if (stopping)
		return send_problem(connection, rq, 503, "not-ready", "the server is stopping");
	/* Before anything reads a header: a request a proxy in front could
	 * frame differently is refused, and its connection closed. */
	refusal = request_ambiguous(connection);
	if (refusal) {
		rq->close = true;
		return send_problem(connection, rq, 400, "bad-request", refusal);
	}
	/* Over the connection limits (conns.c): this connection is in a spare
	 * slot, answered once and closed; only a probe is served on it. */
	if (rq->spare) {
		rq->close = true;
		if (!(rq->route && rq->route->probe))
			return send_overloaded(connection, rq);
	}
	/* Unknown paths need the token too: they reveal nothing to strangers. */
	if (s->token && !(rq->route && rq->route->probe && s->open_probes) &&
	    !auth_check(s->token, MHD_lookup_connection_value(connection, MHD_HEADER_KIND,
							      MHD_HTTP_HEADER_AUTHORIZATION)))
		return send_problem(connection, rq, 401, "unauthorized",
				    "this server needs an Authorization: Bearer token");
	if (!rq->route)
		return send_problem(connection, rq, 404, "not-found", "no such path");
	if (!route_allows(rq->route, method)) {
		char detail[128];

		snprintf(detail, sizeof(detail), "%s takes %s only", rq->route->path,
			 route_allow_header(rq->route));
		return send_problem(connection, rq, 405, "method-not-allowed", detail);
	}
	length = MHD_lookup_connection_value(connection, MHD_HEADER_KIND,
					     MHD_HTTP_HEADER_CONTENT_LENGTH);
	if (length) {
		char *end;
		unsigned long long value;

		errno = 0;
		value = strtoull(length, &end, 10);
		if (errno || end == length || value > API_BODY_MAX)
			return send_problem(connection, rq, 413, "payload-too-large",
					    "the body is larger than 65536 bytes");
	}
	return MHD_YES;
}

/* A piece of the body: keep it while it fits. */
static void request_body(struct request *rq, const char *data, size_t size)
{
	char *grown;

	if (rq->too_large)
		return;
	if (size > API_BODY_MAX - rq->body_size) {
		rq->too_large = true;
		free(rq->body);
		rq->body = NULL;
		rq->body_size = 0;
		return;
	}
	grown = realloc(rq->body, rq->body_size + size);
	if (!grown) {
		/* answered as too large: the server cannot hold it */
		rq->too_large = true;
		free(rq->body);
		rq->body = NULL;
		rq->body_size = 0;
		return;
	}
	memcpy(grown + rq->body_size, data, size);
	rq->body = grown;
	rq->body_size += size;
}

/* The last call: the whole body is in. */
/* The thread of a slow handler: run it, keep the answer, wake the
 * connection up (on_request() then sends the answer). */
static void *offload_main(void *arg)
{
	struct request *rq = arg;
	struct dormant_server *s = rq->server;

	rq->route->handle(&s->api, &rq->req, &rq->deferred);
	rq->deferred_ready = true;
	/* counted before the resume, resumed before the handler count drops:
	 * stop waits for both, so it never stops the daemon with this
	 * connection still suspended */
	pthread_mutex_lock(&s->lock);
	rq->resume_pending = true;
	s->resumes_pending++;
	pthread_mutex_unlock(&s->lock);
	MHD_resume_connection(rq->connection);
	pthread_mutex_lock(&s->lock);
	s->offloaded--;
	s->handlers_running--;
	pthread_cond_broadcast(&s->idle);
	/* the last touch of s: stop may free it once this unlocks */
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/* Start a slow handler on a thread of its own. Returns false (nothing
 * started) when no thread can be had; the caller then runs it itself. */
static bool offload(struct dormant_server *s, struct MHD_Connection *connection,
		    struct request *rq)
{
	pthread_attr_t attr;
	pthread_t thread;
	bool started;

	pthread_mutex_lock(&s->lock);
	started = s->offloaded < OFFLOAD_MAX;
	if (started)
		s->offloaded++;
	pthread_mutex_unlock(&s->lock);
	if (!started)
		return false;
	rq->connection = connection;
	MHD_suspend_connection(connection);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	started = pthread_create(&thread, &attr, offload_main, rq) == 0;
	pthread_attr_destroy(&attr);
	if (!started) {
		MHD_resume_connection(connection);
		pthread_mutex_lock(&s->lock);
		s->offloaded--;
		pthread_mutex_unlock(&s->lock);
	}
	return started;
}

/* libmicrohttpd has taken back a connection a slow handler resumed (it
 * calls us for it again, or ends it). */
static void resume_taken(struct dormant_server *s, struct request *rq)
{
	pthread_mutex_lock(&s->lock);
	if (rq->resume_pending) {
		rq->resume_pending = false;
		s->resumes_pending--;
		pthread_cond_broadcast(&s->idle);
	}
	pthread_mutex_unlock(&s->lock);
}

/* The last call: the whole body is in. */
static enum MHD_Result request_answer(struct dormant_server *s, struct MHD_Connection *connection,
				      struct request *rq, const char *method)
{
	struct api_response resp = { 0 };
	bool stopping;

	if (rq->deferred_ready) { /* resumed: the slow handler has answered */
		resume_taken(s, rq);
		return send_response(connection, rq, &rq->deferred);
	}
	if (rq->too_large)
		return send_problem(connection, rq, 413, "payload-too-large",
				    "the body is larger than 65536 bytes");
	/* The whole request is in: from here the connection is being answered
	 * and neither the limits nor the watchdog close it. One they already
	 * closed runs nothing. */
	if (rq->conn && !conn_answering(&s->conns, rq->conn))
		return MHD_NO;
	if (rq->too_many_params)
		return send_problem(connection, rq, 400, "bad-request",
				    "too many query parameters");
	rq->params = calloc(1, sizeof(*rq->params));
	if (!rq->params)
		return MHD_NO;
	MHD_get_connection_values(connection, MHD_GET_ARGUMENT_KIND, param_collect, rq->params);
	if (rq->params->overflow)
		return send_problem(connection, rq, 400, "bad-request",
				    "too many query parameters");
	/* the strings stay in the connection's memory until the request ends,
	 * suspended or not */
	rq->req.method = strcmp(method, "HEAD") == 0 ? "GET" : method;
	rq->req.params = rq->params->items;
	rq->req.param_count = rq->params->count;
	rq->req.content_type = MHD_lookup_connection_value(connection, MHD_HEADER_KIND,
							   MHD_HTTP_HEADER_CONTENT_TYPE);
	rq->req.body = rq->body;
	rq->req.body_size = rq->body_size;

	/* Once stop has begun no handler starts: stop waits for the running
	 * ones only. */
	pthread_mutex_lock(&s->lock);
	stopping = s->stopping;
	if (!stopping)
		s->handlers_running++;
	pthread_mutex_unlock(&s->lock);
	if (stopping)
		return send_problem(connection, rq, 503, "not-ready", "the server is stopping");
	/* A sleep or wake can take seconds: off this thread, so that the
	 * other connections it serves (a Prometheus scrape kept alive, a
	 * probe) do not wait for it. */
	if (rq->route->slow && offload(s, connection, rq))
		return MHD_YES;
	rq->route->handle(&s->api, &rq->req, &resp);
	request_counts(s, 0, -1);
	return send_response(connection, rq, &resp);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *connection, const char *url,
				  const char *method, const char *version,
				  const char *upload_data, size_t *upload_data_size, void **con_cls)
{
	struct dormant_server *s = cls;
	struct request *rq = *con_cls;

	if (!rq || !rq->begun)
		return request_begin(s, connection, url, method, con_cls);
	if (*upload_data_size) {
		if (!rq->answered)
			request_body(rq, upload_data, *upload_data_size);
		*upload_data_size = 0;
		return MHD_YES;
	}
	if (rq->answered)
		return MHD_YES;
	return request_answer(s, connection, rq, method);
}

static void on_completed(void *cls, struct MHD_Connection *connection, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	struct dormant_server *s = cls;
	struct request *rq = *con_cls;

	if (!rq)
		return;
	*con_cls = NULL;
	if (rq->conn) {
		/* waiting for the next request from now */
		conn_waiting(&s->conns, rq->conn);
	}
	resume_taken(s, rq);
	if (!rq->begun) {
		/* libmicrohttpd refused it before any handler call (431, 414) */
		free(rq);
		return;
	}
	if (!s->quiet) /* queued: a slow log callback never holds this thread */
		logq_put(&s->logq, DORMANT_LOG_INFO, "%s %s %d %.3f ms%s", rq->method, rq->path,
			 rq->status ? rq->status : 0, (now_monotonic_s() - rq->start_s) * 1e3,
			 toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? "" : " (connection closed)");
	api_response_finish(&rq->deferred);
	free(rq->params);
	free(rq->body);
	free(rq);
	request_counts(s, -1, 0);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	struct dormant_server *s = cls;

	/* Messages from starting are kept for the error message; afterwards
	 * libmicrohttpd's complaints about clients (a connection reset while
	 * answering, ...) go to the log callback at debug level. */
	if (!atomic_load(&s->starting)) {
		char line[256];

		vsnprintf(line, sizeof(line), fmt, ap);
		line[strcspn(line, "\n")] = '\0';
		logq_put(&s->logq, DORMANT_LOG_DEBUG, "libmicrohttpd: %s", line);
		return;
	}
	vsnprintf(s->start_error, sizeof(s->start_error), fmt, ap);
	s->start_error[strcspn(s->start_error, "\n")] = '\0';
}

/* ---- lifecycle ----------------------------------------------------------- */

/* Remove the discovery record, if any. */
static void record_remove(struct dormant_server *s)
{
	char *path;

	pthread_mutex_lock(&s->lock);
	path = s->record_path;
	s->record_path = NULL;
	pthread_mutex_unlock(&s->lock);
	if (path)
		unlink(path);
	free(path);
}

/* The publish option: "1" publishes a record in the default directory, an
 * absolute path in that directory, "0" none. */
static int record_publish(struct dormant_server *s, const char *publish)
{
	if (!publish || strcmp(publish, "0") == 0)
		return 0;
	return dormant_server_publish(s, strcmp(publish, "1") == 0 ? NULL : publish, NULL);
}

static void server_free(struct dormant_server *s)
{
	record_remove(s);
	faults_remove(&s->faults);
	free(s->faults_text);
	if (s->listener.fd >= 0)
		close(s->listener.fd);
	listener_unix_remove(&s->listener);
	if (s->token) {
		explicit_bzero(s->token, strlen(s->token));
		free(s->token);
	}
	pthread_cond_destroy(&s->idle);
	pthread_mutex_destroy(&s->lock);
	conn_table_finish(&s->conns);
	logq_stop(&s->logq); /* every line handed over first */
	free(s);
}

DORMANT_EXPORT int dormant_server_start(struct dormant *m, const struct dormant_server_options *opts,
					struct dormant_server **ret)
{
	struct dormant_server_options o;
	unsigned mhd_limit;
	struct stat st, listen_st;
	struct dormant_server *s;
	pthread_condattr_t attr;
	int r;

	if (!m || !ret)
		return error_set(-EINVAL, "manager or ret is NULL");
	/* every value checked, from the caller, the environment or the table */
	r = server_options_resolve(opts, &o);
	if (r < 0)
		return r;
	s = calloc(1, sizeof(*s));
	if (!s)
		return error_set(-ENOMEM, "out of host memory");
	r = faults_parse(o.faults, &s->faults);
	if (r < 0) {
		free(s);
		return r;
	}
	conn_table_init(&s->conns, o.max_connections, o.max_connections_per_ip,
			o.request_timeout_s);
	s->manager = m;
	s->listener.fd = -1;
	s->open_probes = o.open_probes;
	s->quiet = o.quiet;
	s->api.manager = m;
	s->api.stats_extra = o.stats_extra;
	s->api.stats_extra_userdata = o.stats_extra_userdata;
	s->api.metrics_extra = o.metrics_extra;
	s->api.metrics_extra_userdata = o.metrics_extra_userdata;
	pthread_mutex_init(&s->lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&s->idle, &attr);
	pthread_condattr_destroy(&attr);

	r = logq_start(&s->logq, o.log, o.log_userdata);
	if (r < 0)
		goto err;
	r = server_options_token(&o, &s->token);
	if (r < 0)
		goto err;
	s->unix_listener = o.unix_path != NULL;
	if (o.unix_path)
		r = listen_unix(&s->listener, o.unix_path);
	else
		r = listen_tcp(&s->listener, o.listen);
	if (r < 0)
		goto err;
	r = auth_exposure_check(o.insecure_no_auth, s->token != NULL, s->listener.local, s->listener.url);
	if (r < 0)
		goto err;
	if (!s->token && !s->listener.local)
		logq_put(&s->logq, DORMANT_LOG_WARNING,
			 "no authentication on %s (insecure_no_auth): anyone who reaches it can "
			 "sleep and wake this trainer",
			 s->listener.url);

	r = faults_install(&s->faults, m);
	if (r < 0)
		goto err;
	if (s->faults.count) {
		s->faults_text = strdup(o.faults);
		if (!s->faults_text) {
			r = error_set(-ENOMEM, "out of host memory");
			goto err;
		}
		s->api.faults = s->faults_text;
		/* never silent, quiet or not: sleeps and wakes will fail */
		logq_put(&s->logq, DORMANT_LOG_WARNING, "fault injection armed (a test tool): %s",
			 s->faults_text);
	} else if (getenv("DORMANT_FAULTS") && *getenv("DORMANT_FAULTS")) {
		logq_put(&s->logq, DORMANT_LOG_WARNING,
			 "$DORMANT_FAULTS is ignored: faults are armed only by the faults option "
			 "(dormantd --fault)");
	}
	if (fstat(s->listener.fd, &listen_st) < 0) {
		r = socket_errno(errno, "checking the socket of", s->listener.url);
		goto err;
	}
	/* The limits are ours (conn_opened()): libmicrohttpd's own limit, which
	 * it shares out among its threads and enforces by refusing, is set
	 * above them and the spare slots, so that a connection we close to
	 * make room never keeps a newer one out while it closes. */
	mhd_limit = o.max_connections > MAX_CONNECTIONS / 2
			    ? MAX_CONNECTIONS
			    : 2 * o.max_connections + o.threads + CONN_SPARE_SLOTS;
	atomic_store(&s->starting, true);
	/*
	 * poll(), not the epoll that MHD_USE_AUTO picks on Linux. libmicrohttpd
	 * 0.9.75 watches its sockets edge-triggered under epoll: when the
	 * last bytes of a partial request and the client's FIN arrive
	 * together, it reads the bytes, waits for the rest of the request, and
	 * is never told again that the socket is readable, so it does not see
	 * the end of the stream; the connection sits in CLOSE-WAIT, holding a
	 * slot, until connection_timeout_s. Sixty-four such connections took
	 * every slot for 30 s. poll() is level-triggered: the next round reads
	 * the end of the stream and closes the connection at once. A control
	 * plane has tens of connections, where poll() costs nothing.
	 */
	s->daemon = MHD_start_daemon(
		MHD_USE_POLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG,
		0, NULL, NULL, on_request, s,
		/* first, so that no message of the options below gets printed */
		MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
		MHD_OPTION_LISTEN_SOCKET, (MHD_socket)s->listener.fd,
		MHD_OPTION_CONNECTION_LIMIT, mhd_limit,
		MHD_OPTION_CONNECTION_TIMEOUT, o.connection_timeout_s,
		MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
		MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
		MHD_OPTION_URI_LOG_CALLBACK, on_uri, s,
		/* one thread is the polling thread itself, not a pool */
		o.threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, o.threads,
		MHD_OPTION_END);
	atomic_store(&s->starting, false);
	if (!s->daemon) {
		r = error_set(-EIO, "starting the HTTP daemon on %s failed%s%s", s->listener.url,
			      s->start_error[0] ? ": " : "", s->start_error);
		/* Whether libmicrohttpd closed the socket depends on where it
		 * failed: close it only if the number is still that socket. */
		if (fstat(s->listener.fd, &st) < 0 || st.st_dev != listen_st.st_dev ||
		    st.st_ino != listen_st.st_ino)
			s->listener.fd = -1;
		goto err;
	}
	s->listener.fd = -1; /* the daemon's now */
	r = conn_table_watch(&s->conns);
	if (r != 0) {
		MHD_stop_daemon(s->daemon);
		r = error_set(-ENOMEM, "starting the watchdog thread: %s", strerror(r));
		goto err;
	}
	/* published once it answers, so that a reader never finds a record
	 * of a server that refuses connections */
	r = record_publish(s, o.publish);
	if (r < 0) {
		conn_table_unwatch(&s->conns);
		MHD_stop_daemon(s->daemon);
		goto err;
	}
	*ret = s;
	return 0;

err:
	server_free(s);
	return r;
}

DORMANT_EXPORT int dormant_server_port(const struct dormant_server *s)
{
	return s ? s->listener.port : 0;
}

DORMANT_EXPORT int dormant_server_write_port_file(const struct dormant_server *s,
						  const char *path)
{
	char tmp[PATH_MAX], text[16];
	int fd, len, r;

	if (!s || !path || s->listener.port <= 0)
		return -EINVAL;
	r = snprintf(tmp, sizeof(tmp), "%s.XXXXXX", path);
	if (r < 0 || (size_t)r >= sizeof(tmp))
		return -ENAMETOOLONG;
	/* a new file of a fresh name (O_CREAT | O_EXCL: never through a link
	 * someone planted at a name we would have used), renamed over path */
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0)
		return -errno;
	len = snprintf(text, sizeof(text), "%d\n", s->listener.port);
	r = 0;
	if (fchmod(fd, 0644) < 0 || write(fd, text, (size_t)len) != len)
		r = -(errno ? errno : EIO);
	if (close(fd) < 0 && r == 0)
		r = -errno;
	if (r == 0 && rename(tmp, path) < 0)
		r = -errno;
	if (r < 0)
		unlink(tmp);
	return r;
}

DORMANT_EXPORT int dormant_server_publish(struct dormant_server *s, const char *dir,
					  const char *role)
{
	char path[PATH_MAX];
	char *copy, *old;
	int r;

	if (!s)
		return error_set(-EINVAL, "no server");
	r = discovery_publish(dir, role, s->listener.url, s->listener.port, path, sizeof(path));
	if (r < 0)
		return r;
	copy = strdup(path);
	if (!copy) {
		unlink(path);
		return error_set(-ENOMEM, "out of host memory");
	}
	pthread_mutex_lock(&s->lock);
	old = s->record_path;
	s->record_path = copy;
	pthread_mutex_unlock(&s->lock);
	if (old) /* published again: the new record replaces the old */
		unlink(old);
	free(old);
	return 0;
}

DORMANT_EXPORT const char *dormant_server_url(const struct dormant_server *s)
{
	return s ? s->listener.url : "";
}

DORMANT_EXPORT void dormant_server_stop(struct dormant_server *s)
{
	struct timespec deadline;
	MHD_socket fd;

	if (!s)
		return;
	/* No new connections. The socket comes back to us and is closed after
	 * the daemon stops, as libmicrohttpd asks; if it cannot be had back,
	 * the daemon closes it. */
	fd = MHD_quiesce_daemon(s->daemon);
	if (fd != MHD_INVALID_SOCKET) {
		s->listener.fd = fd;
		/* refuse new connections now rather than leave them waiting in
		 * the backlog of a socket nobody accepts on */
		shutdown(fd, SHUT_RDWR);
	}
	listener_unix_remove(&s->listener);
	record_remove(s); /* no reader finds it from now on */

	pthread_mutex_lock(&s->lock);
	s->stopping = true;
	/* A sleep or wake in flight runs to its end, however long; then
	 * libmicrohttpd takes its connection back (a moment, on its thread). */
	while (s->handlers_running > 0 || s->resumes_pending > 0)
		pthread_cond_wait(&s->idle, &s->lock);
	/* Answered requests get a moment to be sent. */
	clock_gettime(CLOCK_MONOTONIC, &deadline);
	deadline.tv_sec += (time_t)STOP_FLUSH_S;
	while (s->requests_active > 0 &&
	       pthread_cond_timedwait(&s->idle, &s->lock, &deadline) != ETIMEDOUT)
		;
	pthread_mutex_unlock(&s->lock);

	conn_table_unwatch(&s->conns); /* before the daemon stops */
	MHD_stop_daemon(s->daemon);
	server_free(s);
}
