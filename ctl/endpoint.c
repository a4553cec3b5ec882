/* SPDX-License-Identifier: MIT */
#include "endpoint.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HOST_MAX 253

__attribute__((format(printf, 4, 5)))
static int fail(char *err, size_t err_size, int error, const char *fmt, ...)
{
	va_list ap;

	if (err && err_size) {
		va_start(ap, fmt);
		vsnprintf(err, err_size, fmt, ap);
		va_end(ap);
	}
	return error;
}

void ctl_endpoints_init(struct ctl_endpoints *list)
{
	memset(list, 0, sizeof(*list));
}

static void endpoint_finish(struct ctl_endpoint *e)
{
	free(e->name);
	free(e->base_url);
	free(e->unix_path);
}

void ctl_endpoints_finish(struct ctl_endpoints *list)
{
	if (!list)
		return;
	for (size_t i = 0; i < list->count; i++)
		endpoint_finish(&list->items[i]);
	free(list->items);
	memset(list, 0, sizeof(*list));
}

/* Takes ownership of the three strings, also on failure. */
static int endpoints_push(struct ctl_endpoints *list, char *name, char *base_url, char *unix_path,
			  char *err, size_t err_size)
{
	struct ctl_endpoint e = { .name = name, .base_url = base_url, .unix_path = unix_path };

	if (!name || !base_url) {
		endpoint_finish(&e);
		return fail(err, err_size, -ENOMEM, "out of memory");
	}
	if (list->count >= CTL_ENDPOINTS_MAX) {
		endpoint_finish(&e);
		return fail(err, err_size, -E2BIG, "more than %d endpoints", CTL_ENDPOINTS_MAX);
	}
	if (list->count == list->capacity) {
		size_t capacity = list->capacity ? list->capacity * 2 : 16;
		struct ctl_endpoint *items = realloc(list->items, capacity * sizeof(*items));

		if (!items) {
			endpoint_finish(&e);
			return fail(err, err_size, -ENOMEM, "out of memory");
		}
		list->items = items;
		list->capacity = capacity;
	}
	list->items[list->count++] = e;
	return 0;
}

static char *format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *format(const char *fmt, ...)
{
	va_list ap;
	char *s = NULL;

	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) < 0)
		s = NULL;
	va_end(ap);
	return s;
}

/* ---- ports --------------------------------------------------------------- */

/* Parse 1..65535 from s[0..len). */
static int port_parse(const char *s, size_t len, uint16_t *ret)
{
	unsigned long v = 0;

	if (len == 0 || len > 5)
		return -EINVAL;
	for (size_t i = 0; i < len; i++) {
		if (!isdigit((unsigned char)s[i]))
			return -EINVAL;
		v = v * 10 + (unsigned long)(s[i] - '0');
	}
	if (v == 0 || v > 65535)
		return -EINVAL;
	*ret = (uint16_t)v;
	return 0;
}

int ctl_ports_parse(const char *spec, uint16_t *ports, size_t max, char *err, size_t err_size)
{
	size_t count = 0;
	const char *p = spec;

	if (!spec || !*spec)
		return fail(err, err_size, -EINVAL, "empty port list");
	for (;;) {
		size_t len = strcspn(p, ",");
		const char *dash = memchr(p, '-', len);
		uint16_t first, last;

		if (dash) {
			if (port_parse(p, (size_t)(dash - p), &first) < 0 ||
			    port_parse(dash + 1, len - (size_t)(dash - p) - 1, &last) < 0 ||
			    last < first)
				return fail(err, err_size, -EINVAL,
					    "bad port range '%.*s' (FIRST-LAST, 1 to 65535)", (int)len, p);
		} else {
			if (port_parse(p, len, &first) < 0)
				return fail(err, err_size, -EINVAL,
					    "bad port '%.*s' (1 to 65535)", (int)len, p);
			last = first;
		}
		for (unsigned port = first; port <= last; port++) {
			for (size_t i = 0; i < count; i++)
				if (ports[i] == port)
					return fail(err, err_size, -EINVAL,
						    "port %u listed twice", port);
			if (count >= max)
				return fail(err, err_size, -E2BIG, "more than %zu ports", max);
			ports[count++] = (uint16_t)port;
		}
		if (p[len] == '\0')
			break;
		p += len + 1;
	}
	return (int)count;
}

/* ---- one spec ------------------------------------------------------------ */

static bool host_name_valid(const char *s, size_t len)
{
	if (len == 0 || len > HOST_MAX || s[0] == '-' || s[0] == '.')
		return false;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];

		if (!isalnum(c) && c != '-' && c != '.' && c != '_')
			return false;
	}
	return true;
}

static bool ipv6_valid(const char *s, size_t len)
{
	char buf[INET6_ADDRSTRLEN + 1];
	struct in6_addr addr;

	if (len == 0 || len >= sizeof(buf))
		return false;
	memcpy(buf, s, len);
	buf[len] = '\0';
	return inet_pton(AF_INET6, buf, &addr) == 1;
}

static int add_unix(struct ctl_endpoints *list, const char *spec, char *err, size_t err_size)
{
	const char *path = spec + strlen("unix:");
	size_t len = strlen(path);
	int r;

	if (len == 0)
		return fail(err, err_size, -EINVAL, "'%s': empty socket path", spec);
	if (len > CTL_UNIX_PATH_MAX)
		return fail(err, err_size, -EINVAL, "'%s': socket path longer than %d bytes",
			    spec, CTL_UNIX_PATH_MAX);
	for (size_t i = 0; i < len; i++)
		if (iscntrl((unsigned char)path[i]))
			return fail(err, err_size, -EINVAL, "'%s': control character in path", spec);
	/* The host part of the URL is not used on a socket, only sent as Host. */
	r = endpoints_push(list, format("unix:%s", path), format("http://localhost"),
			   format("%s", path), err, err_size);
	return r < 0 ? r : 1;
}

/* Add scheme://host:port for one host (already validated; bracketed if v6). */
static int add_host_port(struct ctl_endpoints *list, const char *scheme, const char *host,
			 size_t host_len, uint16_t port, char *err, size_t err_size)
{
	bool https = strcmp(scheme, "https") == 0;

	return endpoints_push(list,
			      format("%s%.*s:%u", https ? "https://" : "", (int)host_len, host, port),
			      format("%s://%.*s:%u", scheme, (int)host_len, host, port), NULL,
			      err, err_size);
}

int ctl_endpoints_add_spec(struct ctl_endpoints *list, const char *spec, const uint16_t *ports,
			   size_t nports, char *err, size_t err_size)
{
	const char *scheme = "http";
	const char *authority = spec;
	size_t len, host_len;
	const char *host, *port_str = NULL;
	char bracketed[INET6_ADDRSTRLEN + 3];
	uint16_t port;
	int r;

	if (!spec || !*spec)
		return fail(err, err_size, -EINVAL, "empty endpoint");
	len = strlen(spec);
	if (len > CTL_SPEC_MAX)
		return fail(err, err_size, -EINVAL, "endpoint longer than %d characters", CTL_SPEC_MAX);
	if (strncmp(spec, "unix:", 5) == 0)
		return add_unix(list, spec, err, err_size);
	if (strncmp(spec, "http://", 7) == 0) {
		authority = spec + 7;
	} else if (strncmp(spec, "https://", 8) == 0) {
		scheme = "https";
		authority = spec + 8;
	} else if (strstr(spec, "://")) {
		return fail(err, err_size, -EINVAL,
			    "'%s': only http://, https:// and unix: endpoints", spec);
	}
	len = strlen(authority);
	if (len > 0 && authority[len - 1] == '/')
		len--; /* "http://host:port/" */
	if (memchr(authority, '/', len) || memchr(authority, '@', len) ||
	    memchr(authority, '?', len) || memchr(authority, '#', len))
		return fail(err, err_size, -EINVAL,
			    "'%s': an endpoint is host[:port], without path or user", spec);

	if (len > 0 && authority[0] == '[') {
		const char *close = memchr(authority, ']', len);

		if (!close || !ipv6_valid(authority + 1, (size_t)(close - authority) - 1))
			return fail(err, err_size, -EINVAL, "'%s': bad IPv6 address", spec);
		host = authority;
		host_len = (size_t)(close - authority) + 1;
		if (host_len < len) {
			if (authority[host_len] != ':')
				return fail(err, err_size, -EINVAL, "'%s': expected ':' after ']'", spec);
			port_str = authority + host_len + 1;
		}
	} else {
		const char *colon = memchr(authority, ':', len);

		if (colon && memchr(colon + 1, ':', len - (size_t)(colon - authority) - 1)) {
			/* Two colons: a bare IPv6 address, which cannot carry a port. */
			if (!ipv6_valid(authority, len))
				return fail(err, err_size, -EINVAL, "'%s': bad IPv6 address "
					    "(write [ADDRESS]:PORT to give a port)", spec);
			snprintf(bracketed, sizeof(bracketed), "[%.*s]", (int)len, authority);
			host = bracketed;
			host_len = strlen(bracketed);
		} else {
			host = authority;
			host_len = colon ? (size_t)(colon - authority) : len;
			if (!host_name_valid(host, host_len))
				return fail(err, err_size, -EINVAL, "'%s': bad host name", spec);
			if (colon)
				port_str = colon + 1;
		}
	}

	if (port_str) {
		if (port_parse(port_str, len - (size_t)(port_str - authority), &port) < 0)
			return fail(err, err_size, -EINVAL, "'%s': bad port (1 to 65535)", spec);
		r = add_host_port(list, scheme, host, host_len, port, err, err_size);
		return r < 0 ? r : 1;
	}
	if (nports == 0) {
		uint16_t fallback = CTL_DEFAULT_PORT;

		r = add_host_port(list, scheme, host, host_len, fallback, err, err_size);
		return r < 0 ? r : 1;
	}
	for (size_t i = 0; i < nports; i++) {
		r = add_host_port(list, scheme, host, host_len, ports[i], err, err_size);
		if (r < 0)
			return r;
	}
	return (int)nports;
}

/* ---- files --------------------------------------------------------------- */

int ctl_endpoints_add_file(struct ctl_endpoints *list, const char *path, const uint16_t *ports,
			   size_t nports, char *err, size_t err_size)
{
	bool is_stdin = strcmp(path, "-") == 0;
	FILE *f = is_stdin ? stdin : fopen(path, "re");
	char line[CTL_SPEC_MAX + 2];
	char message[CTL_ERROR_MAX];
	unsigned lineno = 0;
	int total = 0, r = 0;

	if (!f)
		return fail(err, err_size, -errno, "%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		size_t len = strlen(line);
		char *s = line;

		lineno++;
		if (len == sizeof(line) - 1 && line[len - 1] != '\n' && !feof(f)) {
			r = fail(err, err_size, -EINVAL, "%s:%u: line longer than %d characters",
				 path, lineno, CTL_SPEC_MAX);
			goto out;
		}
		while (len > 0 && isspace((unsigned char)line[len - 1]))
			line[--len] = '\0';
		while (isspace((unsigned char)*s))
			s++;
		if (*s == '\0' || *s == '#')
			continue;
		r = ctl_endpoints_add_spec(list, s, ports, nports, message, sizeof(message));
		if (r < 0) {
			fail(err, err_size, r, "%s:%u: %s", path, lineno, message);
			goto out;
		}
		total += r;
	}
	if (ferror(f))
		r = fail(err, err_size, -EIO, "%s: read error", path);
out:
	if (!is_stdin)
		fclose(f);
	return r < 0 ? r : total;
}

/* ---- DNS ----------------------------------------------------------------- */

struct resolved {
	int family;
	unsigned char addr[16];
	char text[INET6_ADDRSTRLEN];
};

static int resolved_compare(const void *a, const void *b)
{
	const struct resolved *x = a, *y = b;

	if (x->family != y->family)
		return x->family == AF_INET ? -1 : 1;
	return memcmp(x->addr, y->addr, sizeof(x->addr));
}

int ctl_endpoints_add_dns(struct ctl_endpoints *list, const char *name, int family,
			  const uint16_t *ports, size_t nports, char *err, size_t err_size)
{
	struct addrinfo hints = { .ai_family = family, .ai_socktype = SOCK_STREAM };
	struct addrinfo *res = NULL;
	struct resolved *found = NULL;
	size_t count = 0, capacity = 0;
	uint16_t fallback = CTL_DEFAULT_PORT;
	int total = 0, r;

	if (!host_name_valid(name, strlen(name)) && !ipv6_valid(name, strlen(name)))
		return fail(err, err_size, -EINVAL, "--dns '%s': bad host name", name);
	if (nports == 0) {
		ports = &fallback;
		nports = 1;
	}
	r = getaddrinfo(name, NULL, &hints, &res);
	if (r != 0)
		return fail(err, err_size, -ENOENT, "--dns %s: %s", name,
			    r == EAI_SYSTEM ? strerror(errno) : gai_strerror(r));
	for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		struct resolved one = { .family = ai->ai_family };
		bool seen = false;

		if (ai->ai_family == AF_INET)
			memcpy(one.addr, &((struct sockaddr_in *)(void *)ai->ai_addr)->sin_addr, 4);
		else if (ai->ai_family == AF_INET6)
			memcpy(one.addr, &((struct sockaddr_in6 *)(void *)ai->ai_addr)->sin6_addr, 16);
		else
			continue;
		for (size_t i = 0; i < count && !seen; i++)
			seen = resolved_compare(&found[i], &one) == 0;
		if (seen)
			continue;
		if (count >= CTL_ENDPOINTS_MAX) {
			r = fail(err, err_size, -E2BIG, "--dns %s: more than %d addresses",
				 name, CTL_ENDPOINTS_MAX);
			goto out;
		}
		if (count == capacity) {
			size_t n = capacity ? capacity * 2 : 64;
			struct resolved *grown = realloc(found, n * sizeof(*grown));

			if (!grown) {
				r = fail(err, err_size, -ENOMEM, "out of memory");
				goto out;
			}
			found = grown;
			capacity = n;
		}
		inet_ntop(one.family, one.addr, one.text, sizeof(one.text));
		found[count++] = one;
	}
	if (count == 0) {
		r = fail(err, err_size, -ENOENT, "--dns %s: no IPv4 or IPv6 address", name);
		goto out;
	}
	qsort(found, count, sizeof(*found), resolved_compare);
	for (size_t i = 0; i < count; i++) {
		char host[INET6_ADDRSTRLEN + 3];

		if (found[i].family == AF_INET6)
			snprintf(host, sizeof(host), "[%s]", found[i].text);
		else
			snprintf(host, sizeof(host), "%s", found[i].text);
		for (size_t p = 0; p < nports; p++) {
			r = add_host_port(list, "http", host, strlen(host), ports[p], err, err_size);
			if (r < 0)
				goto out;
			total++;
		}
	}
	r = 0;
out:
	free(found);
	freeaddrinfo(res);
	return r < 0 ? r : total;
}

/* ---- duplicates ---------------------------------------------------------- */

static uint64_t endpoint_hash(const struct ctl_endpoint *e)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */

	for (const char *s = e->base_url; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	if (e->unix_path)
		for (const char *s = e->unix_path; *s; s++)
			h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static bool endpoint_equal(const struct ctl_endpoint *a, const struct ctl_endpoint *b)
{
	if (strcmp(a->base_url, b->base_url) != 0)
		return false;
	if (!a->unix_path || !b->unix_path)
		return a->unix_path == b->unix_path;
	return strcmp(a->unix_path, b->unix_path) == 0;
}

size_t ctl_endpoints_dedup(struct ctl_endpoints *list)
{
	size_t slots = 16, kept = 0, dropped = 0;
	size_t *table;

	while (slots < list->count * 2)
		slots *= 2;
	table = calloc(slots, sizeof(*table)); /* index + 1; 0: empty */
	if (!table)
		return 0; /* duplicates are harmless, only slower */
	for (size_t i = 0; i < list->count; i++) {
		struct ctl_endpoint *e = &list->items[i];
		size_t slot = (size_t)endpoint_hash(e) & (slots - 1);
		bool duplicate = false;

		while (table[slot]) {
			if (endpoint_equal(&list->items[table[slot] - 1], e)) {
				duplicate = true;
				break;
			}
			slot = (slot + 1) & (slots - 1);
		}
		if (duplicate) {
			endpoint_finish(e);
			dropped++;
			continue;
		}
		list->items[kept] = *e;
		table[slot] = kept + 1;
		kept++;
	}
	list->count = kept;
	free(table);
	return dropped;
}
