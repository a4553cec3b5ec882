/* SPDX-License-Identifier: MIT */
/* The options of dormant_server_start() (server_options.c): the opaque
 * object the caller fills by name, and the values a start resolves from it. */
#ifndef DORMANT_SERVER_SERVER_OPTIONS_H
#define DORMANT_SERVER_SERVER_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dormant-server.h"

#define SERVER_DEFAULT_LISTEN "127.0.0.1:8787"

/* The caller's object (strings its own copies, bits of set say which rows
 * the caller set), and the same struct as server_options_resolve() fills it
 * for a start (strings borrowed from the object, the environment or the
 * table; every row has its value). */
struct dormant_server_options {
	const char *listen;
	const char *unix_path;
	const char *token;
	const char *token_file;
	const char *faults;
	const char *publish;
	bool open_probes;
	bool insecure_no_auth;
	bool quiet;
	unsigned threads;
	unsigned max_connections;
	unsigned connection_timeout_s;
	unsigned max_connections_per_ip;
	unsigned request_timeout_s;
	dormant_stats_extra_fn stats_extra;
	void *stats_extra_userdata;
	dormant_metrics_extra_fn metrics_extra;
	void *metrics_extra_userdata;
	dormant_log_fn log;
	void *log_userdata;
	uint64_t set;      /* rows the caller set */
	uint64_t from_env; /* resolved only: rows read from their environment variable */
};

/* The values a start uses: set rows, else the environment, else defaults;
 * then the checks across rows (max_connections >= threads, ...). o may be
 * NULL. *ret borrows strings from o: use it while o lives. listen is NULL
 * when unix_path is given. 0 or -EINVAL with a message. */
int server_options_resolve(const struct dormant_server_options *o,
			   struct dormant_server_options *ret);

/* Whether resolved row name came from its environment variable. */
bool server_option_from_env(const struct dormant_server_options *resolved, const char *name);

/* The token of resolved options (auth_token_load(), each source named as
 * the option or its environment variable). */
int server_options_token(const struct dormant_server_options *resolved, char **ret_token);

#endif
