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
 * dormant_last_error(), never exits or prints. The access log (a line per
 * request, unless quiet is set) and the warnings at start (faults armed, a
 * server beyond loopback without a token) go to the log callback given with
 * dormant_server_options_set_log(), and nowhere without one.
 */
#ifndef DORMANT_SERVER_H
#define DORMANT_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "dormant-json.h" /* dormant_stats_extra_fn, dormant_metrics_extra_fn */
#include "dormant.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dormant_server;

/*
 * The server's options: an object the library allocates and the caller fills
 * by name, so that options are added without breaking programs built before
 * (docs/design.md, "ABI"). Every option has a default, some an environment
 * variable read when the caller did not set the option; the table in
 * server/server_options.c lists them, and so do dormant_server_option_name()
 * and friends below, `dormantd --help` and docs/http.md:
 *
 *   listen                  HOST:PORT, default 127.0.0.1:8787; IPv6 as [::1]:PORT;
 *                           port 0 picks a free port (dormant_server_port()); a host
 *                           name: the first address it resolves to
 *   unix_path               listen on this Unix socket instead (at most 107 bytes;
 *                           mode 0600; a stale socket at the path, which nothing
 *                           accepts on, is replaced, any other file is an error);
 *                           not with listen
 *   token                   bearer token, 1 to 1024 visible ASCII characters
 *   token_file              a file holding it (surrounding white space trimmed);
 *                           token, else token_file; when neither is set,
 *                           $DORMANT_TOKEN, else the contents of $DORMANT_TOKEN_FILE;
 *                           none of them: no authentication, allowed on loopback
 *                           and Unix sockets only (else start fails with -EINVAL)
 *                           unless insecure_no_auth. A token starting with
 *                           REPLACE-ME (deploy's placeholder) is refused
 *   insecure_no_auth        bool, default $DORMANT_INSECURE_NO_AUTH, else false:
 *                           serve without a token on any address (a warning to
 *                           the log callback at start)
 *   open_probes             bool: /healthz, /readyz, /metrics open when a token is set
 *   threads                 1 to 256, default 4: threads that answer requests (a
 *                           sleep or wake runs on a thread of its own meanwhile)
 *   max_connections         threads to 65536, default 64. When a new connection
 *                           would go over it, an idle connection (no byte of a
 *                           request for 1 s, or closed by its client) is closed to
 *                           make room, idle keep-alive ones first; one on which a
 *                           request has begun to arrive never is. With none idle
 *                           the new one takes one of 8 spare slots: a probe is
 *                           answered there, anything else gets 503 overloaded
 *                           with Retry-After, then it is closed.
 *   max_connections_per_ip  1 to max_connections, default 32 (or max_connections if
 *                           smaller): connections of one remote client address
 *                           (loopback and Unix socket clients are not counted per
 *                           address); over it one of that client's idle ones is
 *                           closed, or it takes at most one spare slot
 *   connection_timeout_s    1 to 86400, default 30: idle seconds before a
 *                           connection is closed (also while an answer is sent)
 *   request_timeout_s       1 to 86400, default 10: seconds a connection has, from
 *                           its opening or its previous answer, to deliver a whole
 *                           request (line, headers, body)
 *   quiet                   bool: no access log (no line per request to the log
 *                           callback)
 *   faults                  the fault switch, a test tool: rules
 *                           "WHEN:OP[:NTH[:ERROR[:TIMES]]]" separated by commas
 *                           (docs/testing.md), e.g. "wake:create" or
 *                           "sleep:copy:2:EIO:0"; default none, never from the
 *                           environment ($DORMANT_FAULTS is ignored, with a warning
 *                           to the log callback). Rules that could never fire
 *                           (sleep:create, sleep:map, wake:host-alloc) are refused.
 *                           Armed: a warning to the log callback at start,
 *                           "faults" in /stats,
 *                           dormant_faults_armed in /metrics
 *   publish                 0 (default), 1 or an absolute directory: publish a
 *                           discovery record at start (dormant_server_publish());
 *                           default $DORMANT_PUBLISH
 *
 * Bools take true/false, 1/0, yes/no, on/off.
 */
struct dormant_server_options;

/* A fresh object: every option at its default (or its environment variable,
 * read at start). Free it with dormant_server_options_destroy(). */
DORMANT_EXPORT int dormant_server_options_new(struct dormant_server_options **ret);
DORMANT_EXPORT void dormant_server_options_destroy(struct dormant_server_options *o);

/* Set option name from text (the object keeps a copy); value NULL returns it
 * to its default. An unknown name or a bad value: -EINVAL with a message
 * naming both, and the option is unchanged. Values are checked here as far
 * as they can be alone; across options, and token files, at start. */
DORMANT_EXPORT int dormant_server_options_set(struct dormant_server_options *o,
					      const char *name, const char *value);
/* The same for a number (bool options: 0 false, else true). */
DORMANT_EXPORT int dormant_server_options_set_int(struct dormant_server_options *o,
						  const char *name, long long value);
/* Apply "name=value,name=value..." (white space around pairs ignored; a
 * piece without '=' continues the value before it, as in
 * "faults=wake:create,sleep:copy,threads=2"). All or nothing: one bad pair
 * and no option changes. */
DORMANT_EXPORT int dormant_server_options_parse(struct dormant_server_options *o,
						const char *text);
/* Write the value option name would start with (set, else its environment
 * variable, else its default; "" for a text option with none) into buf.
 * o may be NULL (defaults). Returns its length, -EINVAL (unknown name, bad
 * environment variable), -ENOSPC. */
DORMANT_EXPORT int dormant_server_options_get(const struct dormant_server_options *o,
					      const char *name, char *buf, size_t size);

/* The callbacks: GET /stats's "extra" member, lines appended to /metrics. */
DORMANT_EXPORT int dormant_server_options_set_stats_extra(struct dormant_server_options *o,
							  dormant_stats_extra_fn fn,
							  void *userdata);
DORMANT_EXPORT int dormant_server_options_set_metrics_extra(struct dormant_server_options *o,
							    dormant_metrics_extra_fn fn,
							    void *userdata);

/* Where the server's lines go: the access log, one line per completed
 * request at DORMANT_LOG_INFO ("POST /sleep 200 312.418 ms", method and path
 * with control bytes escaped; none when quiet), the warnings at start at
 * DORMANT_LOG_WARNING, and libmicrohttpd's complaints about clients once
 * started (a connection reset while answering, ...) at DORMANT_LOG_DEBUG.
 * fn is called on a thread of the server's own, one line at a time, in
 * order, never on a thread answering requests: a slow fn (one that waits for
 * Python's GIL) holds no request up. Up to 256 lines wait for it; beyond,
 * lines are dropped and counted, and fn gets "N log lines dropped: ..."
 * where they went missing, at the level of the most severe of them.
 * dormant_server_stop() hands fn every line before it returns. fn must not
 * call into this server.
 * fn NULL (the default): the lines are dropped. -EINVAL for NULL options. */
DORMANT_EXPORT int dormant_server_options_set_log(struct dormant_server_options *o,
						  dormant_log_fn fn, void *userdata);

/* The options this library knows, for i from 0 until the name is NULL: the
 * name, the type ("text", "int" or "bool"), the default (as text, or how it
 * is computed), the environment variable (NULL: none), one doc line. */
DORMANT_EXPORT const char *dormant_server_option_name(size_t i);
DORMANT_EXPORT const char *dormant_server_option_type(size_t i);
DORMANT_EXPORT const char *dormant_server_option_default(size_t i);
DORMANT_EXPORT const char *dormant_server_option_env(size_t i);
DORMANT_EXPORT const char *dormant_server_option_doc(size_t i);

/*
 * Check options as dormant_server_start() would, without a manager and
 * without listening: values, the listen address (resolved), the token (file
 * read), the fault rules. opts may be NULL. 0 or -EINVAL with a message.
 */
DORMANT_EXPORT int dormant_server_options_check(const struct dormant_server_options *opts);

/*
 * Start serving m. opts may be NULL (defaults); it is only read, and may be
 * destroyed once this returns. m must outlive the server.
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
 * The other name is new (path.XXXXXX, created exclusively): a link planted
 * there is never written through.
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
 * the publish option ($DORMANT_PUBLISH) is 1 (default directory) or an
 * absolute directory path.
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
