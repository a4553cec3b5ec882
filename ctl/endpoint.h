/* SPDX-License-Identifier: MIT */
/*
 * Endpoint lists for dormantctl: parsing "host:port", "http://host:port",
 * "unix:/path", files of them, and DNS names that resolve to many addresses
 * (a Kubernetes headless Service), expanded over a list of ports.
 *
 * Errors are a negative errno with a message in the caller's buffer.
 */
#ifndef DORMANTCTL_ENDPOINT_H
#define DORMANTCTL_ENDPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* At most this many endpoints in one run (after expansion over ports). */
#define CTL_ENDPOINTS_MAX 65536
/* At most this many ports in a port list ("8787-8794,9000"). */
#define CTL_PORTS_MAX 1024
/* Longest endpoint spec or line of an endpoint file. */
#define CTL_SPEC_MAX 512
/* sun_path holds 108 bytes including the terminating NUL. */
#define CTL_UNIX_PATH_MAX 107
/* The port dormant listens on by default. */
#define CTL_DEFAULT_PORT 8787
/* Size of the error message buffers callers pass in. */
#define CTL_ERROR_MAX 256

struct ctl_endpoint {
	char *name;      /* shown to the user: "10.0.0.1:8787", "unix:/run/d.sock" */
	char *base_url;  /* "http://10.0.0.1:8787"; "http://localhost" for a socket */
	char *unix_path; /* NULL for TCP */
};

/* Embedded in the caller's memory: ctl_endpoints_init() / _finish(). */
struct ctl_endpoints {
	struct ctl_endpoint *items;
	size_t count;
	size_t capacity;
};

void ctl_endpoints_init(struct ctl_endpoints *list);
void ctl_endpoints_finish(struct ctl_endpoints *list);

/*
 * Parse a port list: "8787", "8787-8794", "8787,8790-8791". Ports are
 * 1..65535, ranges ascending, at most max in all; duplicates are an error.
 * Returns the number of ports written to ports[], or -EINVAL / -E2BIG.
 */
int ctl_ports_parse(const char *spec, uint16_t *ports, size_t max, char *err, size_t err_size);

/*
 * Add the endpoints one spec names. A spec without a port is expanded over
 * ports[] (nports >= 1). Accepted: "host", "host:port", "[v6]", "[v6]:port",
 * "http://host:port", "https://host:port" (an optional trailing "/"), and
 * "unix:/path". Returns the number added, -EINVAL (bad spec), -E2BIG (over
 * CTL_ENDPOINTS_MAX), -ENOMEM.
 */
int ctl_endpoints_add_spec(struct ctl_endpoints *list, const char *spec, const uint16_t *ports,
			   size_t nports, char *err, size_t err_size);

/*
 * Add the specs in a file, one per line; blank lines and lines starting with
 * '#' are skipped, surrounding blanks ignored. path "-" reads stdin. Errors
 * name the file and line. Returns the number added or a negative errno.
 */
int ctl_endpoints_add_file(struct ctl_endpoints *list, const char *path, const uint16_t *ports,
			   size_t nports, char *err, size_t err_size);

/*
 * Resolve name with getaddrinfo() (family AF_UNSPEC, AF_INET or AF_INET6) and
 * add every distinct address it returns, in a stable order (IPv4 first, then
 * by address), once per port. Returns the number added, -ENOENT (no address),
 * -E2BIG, -ENOMEM.
 */
int ctl_endpoints_add_dns(struct ctl_endpoints *list, const char *name, int family,
			  const uint16_t *ports, size_t nports, char *err, size_t err_size);

/* Drop later duplicates (same URL and socket), keeping the first order.
 * Returns the number dropped. */
size_t ctl_endpoints_dedup(struct ctl_endpoints *list);

#endif
