/* SPDX-License-Identifier: MIT */
/* The options of dormant_server_start(), a table like core/options.c's (the
 * rows' types and their parser: common/option_table.h): one table says each
 * option's name, type, default, environment variable, bounds and doc line,
 * and the setters, the environment, the listing (for dormantd --help and
 * bindings) and the checks all read it. */
#include "server_options.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "auth.h"
#include "common.h"
#include "faults.h"
#include "listen.h"
#include "option_table.h"

static int listen_check(const char *text);
static int unix_path_check(const char *text);
static int token_check(const char *text);
static int path_check(const char *text);
static int faults_check(const char *text);
static int publish_check(const char *text);

#define FIELD(f) offsetof(struct dormant_server_options, f)
#define MAX_TIMEOUT_S 86400

/* Adding an option: a row here, its field in server_options.h, and its use in
 * server.c. Keep the environment variables and defaults documented in
 * dormant-server.h, docs/http.md and docs/operations.md. */
static const struct option_row options[] = {
	{
		.name = "listen", .type = OPTION_TEXT, .offset = FIELD(listen),
		.default_value = SERVER_DEFAULT_LISTEN, .check = listen_check,
		.doc = "HOST:PORT to listen on (IPv6 as [::1]:PORT; port 0 picks a free port; "
		       "a host name: its first address)",
	},
	{
		.name = "unix_path", .type = OPTION_TEXT, .offset = FIELD(unix_path),
		.default_doc = "none (TCP)", .check = unix_path_check,
		.doc = "listen on this Unix socket instead of TCP (mode 0600; a stale socket "
		       "there is replaced)",
	},
	{
		.name = "token", .type = OPTION_TEXT, .offset = FIELD(token),
		.default_doc = "none (no authentication; only on loopback or a Unix socket "
			       "unless insecure_no_auth)",
		.env = "DORMANT_TOKEN", .env_group = 1, .check = token_check, .secret = true,
		.doc = "bearer token requests must carry (1 to 1024 visible ASCII characters, "
		       "not the placeholder REPLACE-ME...); before token_file",
	},
	{
		.name = "token_file", .type = OPTION_TEXT, .offset = FIELD(token_file),
		.default_doc = "none", .env = "DORMANT_TOKEN_FILE", .env_group = 1,
		.check = path_check,
		.doc = "file holding the bearer token (surrounding white space trimmed), read "
		       "at start",
	},
	{
		.name = "open_probes", .type = OPTION_BOOL, .offset = FIELD(open_probes),
		.default_value = "false",
		.doc = "leave /healthz, /readyz and /metrics open when a token is set",
	},
	{
		.name = "insecure_no_auth", .type = OPTION_BOOL, .offset = FIELD(insecure_no_auth),
		.default_value = "false", .env = "DORMANT_INSECURE_NO_AUTH",
		.doc = "serve without a token on an address other than loopback (anyone who "
		       "reaches it drives the trainer); without it such a start is refused",
	},
	{
		.name = "threads", .type = OPTION_UINT, .offset = FIELD(threads),
		.default_value = "4", .min = 1, .max = 256,
		.doc = "threads that answer requests (a sleep or wake runs on a thread of its own)",
	},
	{
		.name = "max_connections", .type = OPTION_UINT, .offset = FIELD(max_connections),
		.default_value = "64", .min = 1, .max = 65536,
		.doc = "concurrent connections, at least threads; over it an idle connection "
		       "is closed (never one carrying a request), else the newcomer gets a "
		       "spare slot: probes answered, others 503 with Retry-After",
	},
	{
		.name = "max_connections_per_ip", .type = OPTION_UINT,
		.offset = FIELD(max_connections_per_ip), .default_value = "32",
		.default_doc = "32, or max_connections if smaller", .min = 1, .max = 65536,
		.doc = "connections of one remote client address at once (loopback and Unix "
		       "socket clients are not counted per address), at most max_connections",
	},
	{
		.name = "connection_timeout_s", .type = OPTION_UINT,
		.offset = FIELD(connection_timeout_s), .default_value = "30", .min = 1,
		.max = MAX_TIMEOUT_S,
		.doc = "idle seconds before a connection is closed",
	},
	{
		.name = "request_timeout_s", .type = OPTION_UINT, .offset = FIELD(request_timeout_s),
		.default_value = "10", .min = 1, .max = MAX_TIMEOUT_S,
		.doc = "seconds a connection has, from its opening or its last answer, to "
		       "deliver a whole request",
	},
	{
		.name = "quiet", .type = OPTION_BOOL, .offset = FIELD(quiet),
		.default_value = "false",
		.doc = "no access log (a line per request)",
	},
	{
		/* no environment variable: one inherited by a pod would make its
		 * sleeps fail (issue 25); only the embedder arms faults */
		.name = "faults", .type = OPTION_TEXT, .offset = FIELD(faults),
		.default_doc = "none", .check = faults_check,
		.doc = "test tool: device faults armed at sleeps and wakes, "
		       "WHEN:OP[:NTH[:ERROR[:TIMES]]] rules separated by commas (docs/testing.md); "
		       "never read from the environment; logged at start, shown in /stats and "
		       "/metrics",
	},
	{
		.name = "publish", .type = OPTION_TEXT, .offset = FIELD(publish),
		.default_value = "0", .env = "DORMANT_PUBLISH", .check = publish_check,
		.doc = "discovery record at start: 1 (default directory), an absolute directory, "
		       "or 0 (none) (docs/orchestrators.md)",
	},
};

_Static_assert(ARRAY_SIZE(options) <= 64, "struct dormant_server_options.set has 64 bits");

/* ---- the checks of text rows ------------------------------------------ */

static int listen_check(const char *text)
{
	char host[NI_MAXHOST], port[8];

	return listen_parse(text, host, sizeof(host), port, sizeof(port));
}

static int unix_path_check(const char *text)
{
	size_t unix_max = sizeof(((struct sockaddr_un *)0)->sun_path) - 1;

	if (!*text || strlen(text) > unix_max)
		return error_set(-EINVAL, "a unix socket path must be 1 to %zu bytes", unix_max);
	return 0;
}

static int token_check(const char *text)
{
	return auth_token_check(text, strlen(text), "this value");
}

static int path_check(const char *text)
{
	return *text ? 0 : error_set(-EINVAL, "the path is empty");
}

static int faults_check(const char *text)
{
	struct fault_switch fs;

	return faults_parse(text, &fs);
}

static int publish_check(const char *text)
{
	if (strcmp(text, "0") == 0 || strcmp(text, "1") == 0 || text[0] == '/')
		return 0;
	return error_set(-EINVAL, "'%.64s' is not 1, 0, or the absolute path of a directory",
			 text);
}

/* ---- the table ----------------------------------------------------------- */

static const struct option_row *option_find(const char *name, size_t *ret_index)
{
	return option_row_find(options, ARRAY_SIZE(options), name, ret_index);
}

/* ---- the public calls ---------------------------------------------------- */

DORMANT_EXPORT int dormant_server_options_new(struct dormant_server_options **ret)
{
	struct dormant_server_options *o;

	if (!ret)
		return error_set(-EINVAL, "ret is NULL");
	o = calloc(1, sizeof(*o));
	if (!o)
		return error_set(-ENOMEM, "out of host memory");
	*ret = o;
	return 0;
}

/* Free the object's own copy of text row i, if it has one. */
static void text_free(struct dormant_server_options *o, size_t i)
{
	char **field = (char **)((char *)o + options[i].offset);

	if (options[i].type != OPTION_TEXT || !*field)
		return;
	explicit_bzero(*field, strlen(*field)); /* the token among them */
	free(*field);
	*field = NULL;
}

DORMANT_EXPORT void dormant_server_options_destroy(struct dormant_server_options *o)
{
	if (!o)
		return;
	for (size_t i = 0; i < ARRAY_SIZE(options); i++)
		text_free(o, i);
	free(o);
}

DORMANT_EXPORT int dormant_server_options_set(struct dormant_server_options *o, const char *name,
					      const char *value)
{
	struct dormant_server_options parsed;
	const struct option_row *opt;
	char *copy = NULL;
	size_t i;
	int r;

	if (!o || !name)
		return error_set(-EINVAL, "%s is NULL", o ? "the option name" : "the options");
	opt = option_find(name, &i);
	if (!opt)
		return error_set(-EINVAL, "unknown server option '%.64s'", name);
	if (!value) {
		text_free(o, i);
		o->set &= ~(1ull << i);
		return 0;
	}
	/* parse into a copy: a bad value leaves the option unchanged */
	parsed = *o;
	r = option_parse(opt, value, &parsed);
	if (r < 0 && opt->type == OPTION_TEXT && !opt->secret)
		return error_prefix(r, "server option %s '%.64s'", name, value);
	if (r < 0)
		return error_prefix(r, "server option %s", name);
	if (opt->type == OPTION_TEXT) {
		copy = strdup(value);
		if (!copy)
			return error_set(-ENOMEM, "out of host memory");
		text_free(o, i);
		*(const char **)((char *)o + opt->offset) = copy;
	} else {
		memcpy((char *)o + opt->offset, (char *)&parsed + opt->offset,
		       option_field_size(opt->type));
	}
	o->set |= 1ull << i;
	return 0;
}

DORMANT_EXPORT int dormant_server_options_set_int(struct dormant_server_options *o,
						  const char *name, long long value)
{
	const struct option_row *opt;
	char text[32];
	size_t i;
	int r;

	if (!o || !name)
		return error_set(-EINVAL, "%s is NULL", o ? "the option name" : "the options");
	opt = option_find(name, &i);
	if (!opt)
		return error_set(-EINVAL, "unknown server option '%.64s'", name);
	r = option_number_text(opt, value, text, sizeof(text), "server option");
	if (r < 0)
		return r;
	return dormant_server_options_set(o, name, text);
}

DORMANT_EXPORT int dormant_server_options_set_stats_extra(struct dormant_server_options *o,
							  dormant_stats_extra_fn fn,
							  void *userdata)
{
	if (!o)
		return error_set(-EINVAL, "the options are NULL");
	o->stats_extra = fn;
	o->stats_extra_userdata = userdata;
	return 0;
}

DORMANT_EXPORT int dormant_server_options_set_metrics_extra(struct dormant_server_options *o,
							    dormant_metrics_extra_fn fn,
							    void *userdata)
{
	if (!o)
		return error_set(-EINVAL, "the options are NULL");
	o->metrics_extra = fn;
	o->metrics_extra_userdata = userdata;
	return 0;
}

DORMANT_EXPORT int dormant_server_options_set_log(struct dormant_server_options *o,
						  dormant_log_fn fn, void *userdata)
{
	if (!o)
		return error_set(-EINVAL, "the options are NULL");
	o->log = fn;
	o->log_userdata = userdata;
	return 0;
}

static int options_set_pair(void *o, const char *name, const char *value)
{
	return dormant_server_options_set(o, name, value);
}

/* Apply "name=value[,name=value...]" to o, in order, up to the first bad
 * one. A piece without '=' continues the value before it, comma and all
 * (faults=wake:create,sleep:copy). */
static int options_apply(struct dormant_server_options *o, const char *text)
{
	return option_text_apply(text, true, "server option", options_set_pair, o);
}

DORMANT_EXPORT int dormant_server_options_parse(struct dormant_server_options *o,
						const char *text)
{
	struct dormant_server_options *scratch;
	int r;

	if (!o || !text)
		return error_set(-EINVAL, "%s is NULL", o ? "the text" : "the options");
	/* all or nothing: try every pair on a scratch object first */
	r = dormant_server_options_new(&scratch);
	if (r < 0)
		return r;
	r = options_apply(scratch, text);
	dormant_server_options_destroy(scratch);
	if (r < 0)
		return r;
	return options_apply(o, text);
}

DORMANT_EXPORT const char *dormant_server_option_name(size_t i)
{
	return i < ARRAY_SIZE(options) ? options[i].name : NULL;
}

DORMANT_EXPORT const char *dormant_server_option_type(size_t i)
{
	return i < ARRAY_SIZE(options) ? option_type_name(options[i].type) : NULL;
}

DORMANT_EXPORT const char *dormant_server_option_default(size_t i)
{
	return i < ARRAY_SIZE(options) ? option_row_default_text(&options[i]) : NULL;
}

DORMANT_EXPORT const char *dormant_server_option_env(size_t i)
{
	return i < ARRAY_SIZE(options) ? options[i].env : NULL;
}

DORMANT_EXPORT const char *dormant_server_option_doc(size_t i)
{
	return i < ARRAY_SIZE(options) ? options[i].doc : NULL;
}

/* ---- for dormant_server_start() ------------------------------------------ */

static bool group_set(const struct dormant_server_options *o, int group)
{
	for (size_t i = 0; o && group && i < ARRAY_SIZE(options); i++)
		if (options[i].env_group == group && (o->set & (1ull << i)))
			return true;
	return false;
}

/* The values of every row, before the checks across rows: a row of an
 * env_group the caller set any of reads no variable. */
static int rows_resolve(const struct dormant_server_options *o, struct dormant_server_options *ret)
{
	struct dormant_server_options r = { 0 };
	unsigned long long env_skip = 0, from_env;
	int err;

	for (size_t i = 0; i < ARRAY_SIZE(options); i++)
		if (group_set(o, options[i].env_group))
			env_skip |= 1ull << i;
	err = option_rows_resolve(options, ARRAY_SIZE(options), o, o ? o->set : 0, env_skip, &r,
				  &from_env, "server option");
	if (err < 0)
		return err;
	r.from_env = from_env;
	if (o) {
		r.stats_extra = o->stats_extra;
		r.stats_extra_userdata = o->stats_extra_userdata;
		r.metrics_extra = o->metrics_extra;
		r.metrics_extra_userdata = o->metrics_extra_userdata;
		r.log = o->log;
		r.log_userdata = o->log_userdata;
		r.set = o->set;
	}
	*ret = r;
	return 0;
}

static bool row_set(const struct dormant_server_options *o, const char *name)
{
	size_t i;

	return option_find(name, &i) && (o->set & (1ull << i));
}

int server_options_resolve(const struct dormant_server_options *o,
			   struct dormant_server_options *ret)
{
	struct dormant_server_options r;
	int err = rows_resolve(o, &r);

	if (err < 0)
		return err;
	if (r.unix_path) {
		if (row_set(&r, "listen"))
			return error_set(-EINVAL, "give listen or unix_path, not both");
		r.listen = NULL;
	}
	/* libmicrohttpd shares the limit out among its threads */
	if (r.max_connections < r.threads)
		return error_set(-EINVAL, "max_connections (%u) must be at least threads (%u)",
				 r.max_connections, r.threads);
	/* the default share follows a smaller limit of all */
	if (!row_set(&r, "max_connections_per_ip") && r.max_connections_per_ip > r.max_connections)
		r.max_connections_per_ip = r.max_connections;
	if (r.max_connections_per_ip > r.max_connections)
		return error_set(-EINVAL,
				 "max_connections_per_ip (%u) must be at most max_connections (%u)",
				 r.max_connections_per_ip, r.max_connections);
	*ret = r;
	return 0;
}

bool server_option_from_env(const struct dormant_server_options *resolved, const char *name)
{
	size_t i;

	return option_find(name, &i) && (resolved->from_env & (1ull << i));
}

int server_options_token(const struct dormant_server_options *resolved, char **ret_token)
{
	return auth_token_load(resolved->token,
			       server_option_from_env(resolved, "token") ? "$DORMANT_TOKEN"
									 : "the token option",
			       resolved->token_file,
			       server_option_from_env(resolved, "token_file")
				       ? "$DORMANT_TOKEN_FILE"
				       : "the token_file option",
			       ret_token);
}

DORMANT_EXPORT int dormant_server_options_get(const struct dormant_server_options *o,
					      const char *name, char *buf, size_t size)
{
	struct dormant_server_options r;
	const struct option_row *opt;
	size_t i;
	int n, err;

	if (!name || !buf)
		return error_set(-EINVAL, "%s is NULL", name ? "the buffer" : "the option name");
	opt = option_find(name, &i);
	if (!opt)
		return error_set(-EINVAL, "unknown server option '%.64s'", name);
	err = rows_resolve(o, &r);
	if (err < 0)
		return err;
	n = option_format(opt, &r, buf, size);
	if (n < 0 || (size_t)n >= size)
		return error_set(-ENOSPC, "the value of server option %s needs %d bytes", name,
				 n + 1);
	return n;
}

DORMANT_EXPORT int dormant_server_options_check(const struct dormant_server_options *opts)
{
	struct addrinfo hints = { .ai_flags = AI_PASSIVE | AI_NUMERICSERV,
				  .ai_socktype = SOCK_STREAM };
	struct dormant_server_options r;
	char host[NI_MAXHOST], port[8];
	struct addrinfo *ai;
	char *token = NULL;
	int err;

	err = server_options_resolve(opts, &r);
	if (err < 0)
		return err;
	err = server_options_token(&r, &token);
	if (err < 0)
		return err;
	if (token) {
		explicit_bzero(token, strlen(token));
		free(token);
	}
	if (r.unix_path)
		return 0;
	err = listen_parse(r.listen, host, sizeof(host), port, sizeof(port));
	if (err < 0)
		return err;
	err = getaddrinfo(host, port, &hints, &ai);
	if (err != 0)
		return error_set(-EINVAL, "cannot resolve '%s': %s", host, gai_strerror(err));
	/* the address listen_tcp() binds: the first */
	err = auth_exposure_check(r.insecure_no_auth, token != NULL, sockaddr_is_local(ai->ai_addr),
				  r.listen);
	freeaddrinfo(ai);
	return err;
}
