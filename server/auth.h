/* SPDX-License-Identifier: MIT */
/* Bearer tokens: where the token comes from, and checking a request's. */
#ifndef DORMANT_SERVER_AUTH_H
#define DORMANT_SERVER_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "dormant-server.h"

/* Longest token accepted. */
#define AUTH_TOKEN_MAX 1024

/*
 * Find the token as dormant-server.h describes (option, token file,
 * $DORMANT_TOKEN, $DORMANT_TOKEN_FILE). *ret_token is a malloc()ed copy, or
 * NULL when no token is configured. Returns -EINVAL (bad token, unreadable
 * or empty file), -ENOMEM.
 */
int auth_token_load(const struct dormant_server_options *opts, char **ret_token);

/* Whether an Authorization header value carries token, as "Bearer TOKEN".
 * The comparison takes the same time whatever the header holds. */
bool auth_check(const char *token, const char *authorization);

#endif
