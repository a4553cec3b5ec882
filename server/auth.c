/* SPDX-License-Identifier: MIT */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common.h"

static bool is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

int auth_token_check(const char *text, size_t len, const char *what)
{
	if (len == 0)
		return error_set(-EINVAL, "the token from %s is empty", what);
	if (len > AUTH_TOKEN_MAX)
		return error_set(-EINVAL, "the token from %s is longer than %d characters", what,
				 AUTH_TOKEN_MAX);
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)text[i] <= 0x20 || (unsigned char)text[i] >= 0x7f)
			return error_set(-EINVAL,
					 "the token from %s has a character that is not visible ASCII",
					 what);
	/* deploy/kubernetes/secret.yaml's placeholder: a token anyone can read */
	if (len >= strlen(AUTH_PLACEHOLDER) &&
	    strncasecmp(text, AUTH_PLACEHOLDER, strlen(AUTH_PLACEHOLDER)) == 0)
		return error_set(-EINVAL,
				 "the token from %s is a placeholder (%s...): put a secret "
				 "there, e.g. openssl rand -hex 32",
				 what, AUTH_PLACEHOLDER);
	return 0;
}

int auth_exposure_check(bool insecure_no_auth, bool has_token, bool local, const char *where)
{
	if (has_token || local || insecure_no_auth)
		return 0;
	/* kept within DORMANT_ERROR_MAX with a long address */
	return error_set(-EINVAL,
			 "refusing to listen on %.64s without a token (anyone reaching it could "
			 "drive this trainer): give a token or token_file, listen on loopback or "
			 "a Unix socket, or set insecure_no_auth (--insecure-no-auth)",
			 where);
}

/* Check a token and keep a copy. what names its source for messages. */
static int token_take(const char *text, size_t len, const char *what, char **ret)
{
	char *copy;
	int r = auth_token_check(text, len, what);

	if (r < 0)
		return r;
	copy = strndup(text, len);
	if (!copy)
		return error_set(-ENOMEM, "out of host memory");
	*ret = copy;
	return 0;
}

static int token_from_file(const char *path, const char *what, char **ret)
{
	char buf[AUTH_TOKEN_MAX + 64];
	size_t len = 0, start = 0;
	ssize_t n;
	int fd, r;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return error_set(-EINVAL, "cannot open the token file %s (%s): %s", path, what,
				 strerror(errno));
	/* a bounded read: a token file is small, and a huge one is a mistake */
	while (len < sizeof(buf) && (n = read(fd, buf + len, sizeof(buf) - len)) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = error_set(-EINVAL, "cannot read the token file %s: %s", path,
				      strerror(errno));
			close(fd);
			return r;
		}
		len += (size_t)n;
	}
	close(fd);
	if (len == sizeof(buf))
		return error_set(-EINVAL, "the token file %s is longer than %d characters", path,
				 AUTH_TOKEN_MAX);
	while (start < len && is_space(buf[start]))
		start++;
	while (len > start && is_space(buf[len - 1]))
		len--;
	r = token_take(buf + start, len - start, path, ret);
	explicit_bzero(buf, sizeof(buf));
	return r;
}

int auth_token_load(const char *token, const char *token_source, const char *token_file,
		    const char *file_source, char **ret_token)
{
	char *copy = NULL;
	int r = 0;

	if (token)
		r = token_take(token, strlen(token), token_source, &copy);
	else if (token_file)
		r = token_from_file(token_file, file_source, &copy);
	if (r < 0)
		return r;
	*ret_token = copy;
	return 0;
}

bool auth_check(const char *token, const char *authorization)
{
	static const char scheme[] = "Bearer";
	size_t token_len = strlen(token), given_len;
	const char *given;
	volatile unsigned char diff = 0;

	if (!authorization || strncasecmp(authorization, scheme, strlen(scheme)) != 0 ||
	    (authorization[strlen(scheme)] != ' ' && authorization[strlen(scheme)] != '\t'))
		return false;
	given = authorization + strlen(scheme);
	while (*given == ' ' || *given == '\t')
		given++;
	given_len = strlen(given);
	while (given_len > 0 && (given[given_len - 1] == ' ' || given[given_len - 1] == '\t'))
		given_len--;
	/* Walk the whole configured token whatever was given: the time taken
	 * depends on the token's length only, never on where they differ. */
	diff |= (unsigned char)(given_len != token_len);
	for (size_t i = 0; i < token_len; i++) {
		unsigned char g = i < given_len ? (unsigned char)given[i] : 0;

		diff |= (unsigned char)(g ^ (unsigned char)token[i]);
	}
	return diff == 0;
}
