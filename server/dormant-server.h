/* SPDX-License-Identifier: MIT */
/*
 * Embedding the dormant HTTP control plane in a process.
 *
 * dormant_server_start() runs a libmicrohttpd daemon on its own threads that
 * serves /sleep, /wake, /stats, /healthz, /readyz, /metrics, /openapi.yaml
 * and the vLLM / SGLang compatible routes over a manager the caller owns.
 * See openapi.yaml for the contract.
 *
 * Conventions as in dormant.h: 0 or a negative errno, message in
 * dormant_last_error(), never exits or prints (except the access log, which
 * goes to stderr unless quiet is set).
 */
#ifndef DORMANT_SERVER_H
#define DORMANT_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "dormant.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dormant_server;

/* Writes a JSON object (text) describing extra state into buf, for the
 * "extra" member of GET /stats (dormantd reports its verifications there).
 * Returns the length written, or a negative errno. Called on server threads. */
typedef int (*dormant_stats_extra_fn)(void *userdata, char *buf, size_t size);

/* Writes lines of Prometheus text exposition format 0.0.4 (complete
 * families, "# TYPE" lines included, each line ending in a newline) into
 * buf, appended to GET /metrics (dormantd reports its verifications there).
 * Returns the length written, or a negative errno. Called on server threads. */
typedef int (*dormant_metrics_extra_fn)(void *userdata, char *buf, size_t size);

struct dormant_server_options {
	/* "host:port" to listen on; port 0 picks a free port (read it back with
	 * dormant_server_port()). NULL: "127.0.0.1:8787". IPv6 as "[::1]:8787".
	 * The host may be a name; the first address it resolves to is used. */
	const char *listen;
	/* Listen on this Unix socket path instead of TCP (at most 107 bytes).
	 * The socket is created with mode 0600; a stale socket left at the path
	 * (nothing accepts on it) is replaced, any other file is an error. */
	const char *unix_path;
	/* Bearer token (1 to 1024 visible ASCII characters), looked for in this
	 * order: token, the contents of token_file (surrounding white space
	 * trimmed), $DORMANT_TOKEN, the contents of $DORMANT_TOKEN_FILE. None of
	 * them: no authentication. */
	const char *token;
	const char *token_file;
	/* Leave /healthz, /readyz and /metrics open when a token is set. */
	bool open_probes;
	/* Threads that answer requests. 0: 4. At most 256. A sleep or wake runs
	 * on a thread of its own meanwhile, so it holds none of them up. */
	unsigned threads;
	/* Concurrent connections, at least threads. 0: 64. At most 65536.
	 * When a new connection would go over it, the connection that has
	 * waited longest for a request (idle keep-alive, or a request still
	 * arriving) is closed to make room; connections whose request is being
	 * answered are never closed so. Only when every connection is being
	 * answered is the new one closed instead. A probe therefore always
	 * gets in, however many stalled connections are open. */
	unsigned max_connections;
	/* Idle seconds before a connection is closed (also while an answer is
	 * being sent). 0: 30. At most 86400. */
	unsigned connection_timeout_s;
	/* No access log on stderr. */
	bool quiet;
	dormant_stats_extra_fn stats_extra;
	void *stats_extra_userdata;
	/* Added after the first release: appended to /metrics. */
	dormant_metrics_extra_fn metrics_extra;
	void *metrics_extra_userdata;
	/* Added later. Connections of one client address (all of loopback is
	 * one address, as are all clients of a Unix socket) at once. 0: 32. At most max_connections. Over it, the
	 * connection of that client that has waited longest for a request is
	 * closed to make room, as for max_connections, so a client flooding
	 * the server closes its own connections first and leaves the rest of
	 * max_connections to the others. */
	unsigned max_connections_per_ip;
	/* Seconds a connection has, from its opening or from its previous
	 * answer, to deliver a whole request (line, headers, body); then it is
	 * closed. Bounds slow clients and idle keep-alive connections. 0: 10.
	 * At most 86400. */
	unsigned request_timeout_s;
	/* The fault switch, a test tool for rehearsing device failures over
	 * HTTP: rules "WHEN:OP[:NTH[:ERROR[:TIMES]]]" separated by commas (see
	 * docs/testing.md), e.g. "wake:create" (the next wake's first memory
	 * creation fails with ENOMEM) or "sleep:copy:2:EIO:0" (every sleep's
	 * second copy fails). NULL: $DORMANT_FAULTS if set; "" or no variable:
	 * none (the default). */
	const char *faults;
};

/*
 * Check options as dormant_server_start() would, without a manager and
 * without listening: values, the listen address (resolved), the token (file
 * read), the fault rules. opts may be NULL. 0 or -EINVAL with a message.
 */
DORMANT_EXPORT int dormant_server_options_check(const struct dormant_server_options *opts);

/*
 * Start serving m. opts may be NULL (defaults). m must outlive the server.
 * The caller owns *ret and frees it with dormant_server_stop().
 * Returns -EINVAL (bad options, unreadable token file), -EADDRINUSE,
 * -EACCES, -ENOMEM, -EIO.
 */
DORMANT_EXPORT int dormant_server_start(struct dormant *m, const struct dormant_server_options *opts,
					struct dormant_server **ret);

/* The TCP port listened on (0 for a Unix socket). */
DORMANT_EXPORT int dormant_server_port(const struct dormant_server *s);

/* Write the TCP port and a newline to path, under another name first and
 * then renamed, so that a reader polling for the file never sees half a
 * number (how a launcher learns the port of a server started on port 0).
 * Returns -EINVAL (NULL arguments, a Unix-socket server), -ENAMETOOLONG, or
 * the errno of the failed file operation. Thread-safe. */
DORMANT_EXPORT int dormant_server_write_port_file(const struct dormant_server *s,
						  const char *path);

/*
 * Publish where the server listens, for dormantctl --discover and
 * dormant.client.Client.discover(): a discovery record, one small JSON file
 * (pid, process start time, url, port, host, start time, $RANK, $LOCAL_RANK,
 * $WORLD_SIZE and a role, format in docs/orchestrators.md), written under a
 * temporary name and renamed, so that readers never see half of one. It is
 * how colocated processes started on port 0 are found. dir NULL:
 * $DORMANT_RUNTIME_DIR, else $XDG_RUNTIME_DIR/dormant, else
 * /tmp/dormant-UID (created with mode 0700; the /tmp one must be this
 * user's). role NULL: $DORMANT_ROLE, else none; 1 to 63 of
 * [A-Za-z0-9_.:-]. Publishing again replaces the record; dormant_server_stop()
 * removes it first thing. dormant_server_start() publishes by itself when
 * $DORMANT_PUBLISH is 1 (default directory) or an absolute directory path.
 * Returns -EINVAL (bad role), -EPERM (a /tmp directory of another user),
 * -ENOTDIR, -ENAMETOOLONG, -ENOMEM, or the errno of the failed file operation.
 * Thread-safe.
 */
DORMANT_EXPORT int dormant_server_publish(struct dormant_server *s, const char *dir,
					  const char *role);

/* "http://127.0.0.1:PORT" or "unix:PATH"; owned by the server. */
DORMANT_EXPORT const char *dormant_server_url(const struct dormant_server *s);

/* Stop listening, wait for requests in flight (a sleep or wake among them
 * runs to its end and its response is sent), free the server. Requests that
 * arrive meanwhile on open connections get 503. Accepts NULL. Must not be
 * called from a hook or a callback of this server. */
DORMANT_EXPORT void dormant_server_stop(struct dormant_server *s);

#ifdef __cplusplus
}
#endif

#endif
