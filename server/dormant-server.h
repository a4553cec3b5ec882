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

struct dormant_server_options {
	/* "host:port" to listen on; port 0 picks a free port (read it back with
	 * dormant_server_port()). NULL: "127.0.0.1:8787". IPv6 as "[::1]:8787". */
	const char *listen;
	/* Listen on this Unix socket path instead of TCP. */
	const char *unix_path;
	/* Bearer token. NULL: $DORMANT_TOKEN, else the contents of token_file
	 * or $DORMANT_TOKEN_FILE, else no authentication. */
	const char *token;
	const char *token_file;
	/* Leave /healthz, /readyz and /metrics open when a token is set. */
	bool open_probes;
	/* Worker threads. 0: 4. */
	unsigned threads;
	/* Concurrent connections. 0: 64. */
	unsigned max_connections;
	/* Idle seconds before a connection is closed. 0: 30. */
	unsigned connection_timeout_s;
	/* No access log on stderr. */
	bool quiet;
	dormant_stats_extra_fn stats_extra;
	void *stats_extra_userdata;
};

/*
 * Start serving m. opts may be NULL (defaults). m must outlive the server.
 * Returns -EINVAL (bad options), -EADDRINUSE, -EACCES, -ENOMEM, -EIO.
 */
DORMANT_EXPORT int dormant_server_start(struct dormant *m, const struct dormant_server_options *opts,
					struct dormant_server **ret);

/* The TCP port listened on (0 for a Unix socket). */
DORMANT_EXPORT int dormant_server_port(const struct dormant_server *s);

/* "http://127.0.0.1:PORT" or "unix:PATH"; owned by the server. */
DORMANT_EXPORT const char *dormant_server_url(const struct dormant_server *s);

/* Stop listening, wait for requests in flight (a sleep or wake among them
 * runs to its end), free the server. Accepts NULL. */
DORMANT_EXPORT void dormant_server_stop(struct dormant_server *s);

#ifdef __cplusplus
}
#endif

#endif
