/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness: bearer tokens (server/auth.c), checked against a plain
 * reading of the rules. The input is "TOKEN\nAUTHORIZATION": the token is
 * taken as the token option and, the whole input, as a token file; a valid
 * token is then compared with the Authorization header value.
 *
 * Rules: a token is 1 to AUTH_TOKEN_MAX visible ASCII characters (a token
 * file is trimmed of blanks around it first); a header carries it as
 * "Bearer" (any case), one or more blanks, the token, optional blanks.
 */
#include <ctype.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "auth.h"

static char token_path[] = "/tmp/fuzz-auth.XXXXXX";

static void cleanup(void)
{
	unlink(token_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	int fd = mkstemp(token_path);

	CHECK(fd >= 0);
	close(fd);
	atexit(cleanup);
	unsetenv("DORMANT_TOKEN");
	unsetenv("DORMANT_TOKEN_FILE");
	return 0;
}

/* A token the server takes: 1 to AUTH_TOKEN_MAX visible ASCII characters, not
 * starting with the deploy placeholder "REPLACE-ME" (any case). */
static bool visible(const char *s, size_t len)
{
	static const char placeholder[] = "replace-me";

	if (len == 0 || len > AUTH_TOKEN_MAX)
		return false;
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f)
			return false;
	if (len >= sizeof(placeholder) - 1) {
		size_t i = 0;

		while (i < sizeof(placeholder) - 1 && tolower((unsigned char)s[i]) == placeholder[i])
			i++;
		if (i == sizeof(placeholder) - 1)
			return false;
	}
	return true;
}

static bool blank(char c)
{
	return c == ' ' || c == '\t';
}

static bool reference_check(const char *token, const char *header)
{
	size_t len;

	if (strncasecmp(header, "Bearer", 6) != 0 || !blank(header[6]))
		return false;
	header += 6;
	while (blank(*header))
		header++;
	len = strlen(header);
	while (len > 0 && blank(header[len - 1]))
		len--;
	return len == strlen(token) && memcmp(header, token, len) == 0;
}

static void check_file(const unsigned char *data, size_t size)
{
	size_t start = 0, end = size;
	char *token = NULL;
	bool valid;
	FILE *f = fopen(token_path, "w");
	int r;

	CHECK(f);
	CHECK(fwrite(data, 1, size, f) == size);
	CHECK(fclose(f) == 0);
	while (start < end && strchr(" \t\r\n", data[start]) && data[start])
		start++;
	while (end > start && strchr(" \t\r\n", data[end - 1]) && data[end - 1])
		end--;
	/* the file's whole size counts against the limit, blanks included */
	valid = size < AUTH_TOKEN_MAX + 64 && visible((const char *)data + start, end - start);
	r = auth_token_load(NULL, NULL, token_path, "the token file", &token);
	CHECK((r == 0) == valid);
	if (valid) {
		CHECK(token && strlen(token) == end - start);
		CHECK(memcmp(token, data + start, end - start) == 0);
	}
	free(token);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
	const unsigned char *nl = memchr(data, '\n', size);
	size_t token_len = nl ? (size_t)(nl - data) : size;
	char *given = strndup((const char *)data, token_len);
	char *header = nl ? strndup((const char *)nl + 1, size - token_len - 1) : NULL;
	char *token = NULL;
	int r;

	CHECK(given);
	r = auth_token_load(given, "the token", NULL, NULL, &token);
	CHECK((r == 0) == visible(given, strlen(given)));
	if (r == 0) {
		CHECK(token && strcmp(token, given) == 0);
		if (header)
			CHECK(auth_check(token, header) == reference_check(token, header));
		CHECK(!auth_check(token, NULL));
	}
	check_file(data, size);
	free(token);
	free(given);
	free(header);
	return 0;
}
