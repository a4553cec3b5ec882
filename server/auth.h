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
 * listener (loopback, a Unix socket) or when insecure_no_auth (the option)
 * says so. where names the listener. 0 or -EINVAL with a message. */
int auth_exposure_check(bool insecure_no_auth, bool has_token, bool local, const char *where);

/*
 * Find the token: token, else the contents of token_file (either may be
 * NULL); token_source and file_source name where each came from in a
 * message (server_options_token() gives the resolved options' and their
 * names). *ret_token is a malloc()ed copy, or NULL when neither is given.
 * Returns -EINVAL (bad token, unreadable or empty file), -ENOMEM.
 */
int auth_token_load(const char *token, const char *token_source, const char *token_file,
		    const char *file_source, char **ret_token);

/* Whether an Authorization header value carries token, as "Bearer TOKEN".
 * The comparison takes the same time whatever the header holds. */
bool auth_check(const char *token, const char *authorization);

#endif
