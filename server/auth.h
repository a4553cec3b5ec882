/* SPDX-License-Identifier: MIT */
/* Bearer tokens: where the token comes from, and checking a request's. */
#ifndef DORMANT_SERVER_AUTH_H
#define DORMANT_SERVER_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "dormant-server.h"

/* Longest token accepted. */
#define AUTH_TOKEN_MAX 1024

/* The start of deploy/kubernetes/secret.yaml's placeholder token: refused
 * (any case), since everyone who can read the repository knows it. */
#define AUTH_PLACEHOLDER "REPLACE-ME"

/* Whether text[0..len) is a token we take (1 to AUTH_TOKEN_MAX visible ASCII
 * characters, not the placeholder); what names its source for the message.
 * 0 or -EINVAL. */
int auth_token_check(const char *text, size_t len, const char *what);

/* Safe by default: serving without a token is allowed only on a local
 * listener (loopback, a Unix socket) or when resolved->insecure_no_auth
 * says so. where names the listener. 0 or -EINVAL with a message. */
int auth_exposure_check(const struct dormant_server_options *resolved, bool has_token,
			bool local, const char *where);

/*
 * Find the token of resolved options (server_options_resolve(): the token
 * option, else the token file's contents, each from $DORMANT_TOKEN /
 * $DORMANT_TOKEN_FILE when the caller set neither). *ret_token is a
 * malloc()ed copy, or NULL when no token is configured. Returns -EINVAL (bad
 * token, unreadable or empty file), -ENOMEM.
 */
int auth_token_load(const struct dormant_server_options *resolved, char **ret_token);

/* Whether an Authorization header value carries token, as "Bearer TOKEN".
 * The comparison takes the same time whatever the header holds. */
bool auth_check(const char *token, const char *authorization);

#endif
