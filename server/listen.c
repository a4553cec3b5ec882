/* SPDX-License-Identifier: MIT */
/* The listening socket of the server, from its listen or unix_path option
 * (moved out of server.c with the options). */
#include "listen.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common.h"

int socket_errno(int err, const char *what, const char *where)
{
	int r = err == EADDRINUSE || err == EACCES || err == ENOMEM ? -err : -EIO;

	if (err == EADDRNOTAVAIL || err == EAFNOSUPPORT)
		r = -EINVAL;
	return error_set(r, "%s %s: %s", what, where, strerror(err));
}

bool sockaddr_is_local(const struct sockaddr *addr)
{
	const struct in6_addr *a6;

	if (!addr)
		return false;
	switch (addr->sa_family) {
	case AF_UNIX:
		return true;
	case AF_INET:
		return (ntohl(((const struct sockaddr_in *)addr)->sin_addr.s_addr) >> 24) == 127;
	case AF_INET6:
		a6 = &((const struct sockaddr_in6 *)addr)->sin6_addr;
		return IN6_IS_ADDR_LOOPBACK(a6) || (IN6_IS_ADDR_V4MAPPED(a6) && a6->s6_addr[12] == 127);
	}
	return false;
}

int listen_parse(const char *listen, char *host, size_t host_size, char *port, size_t port_size)
{
	const char *colon, *host_start = listen, *host_end;
	char *end;
	unsigned long value;

	if (listen[0] == '[') {
		host_start = listen + 1;
		host_end = strchr(host_start, ']');
		if (!host_end || host_end[1] != ':')
			return error_set(-EINVAL, "listen address '%.64s' is not [IPv6]:PORT",
					 listen);
		colon = host_end + 1;
	} else {
		colon = strrchr(listen, ':');
		if (!colon || memchr(listen, ':', (size_t)(colon - listen)))
			return error_set(-EINVAL,
					 "listen address '%.64s' is not HOST:PORT (IPv6 as [::1]:PORT)",
					 listen);
		host_end = colon;
	}
	if (host_end == host_start || (size_t)(host_end - host_start) >= host_size)
		return error_set(-EINVAL, "listen address '%.64s' has no host or too long a one",
				 listen);
	errno = 0;
	value = strtoul(colon + 1, &end, 10);
	if (errno || end == colon + 1 || *end || value > 65535 || colon[1] == '-' ||
	    colon[1] == '+' || strlen(colon + 1) >= port_size)
		return error_set(-EINVAL, "listen address '%.64s' has no port from 0 to 65535",
				 listen);
	memcpy(host, host_start, (size_t)(host_end - host_start));
	host[host_end - host_start] = '\0';
	snprintf(port, port_size, "%lu", value);
	return 0;
}

int listen_tcp(struct listener *s, const char *listen_addr)
{
	struct addrinfo hints = { .ai_flags = AI_PASSIVE | AI_NUMERICSERV,
				  .ai_socktype = SOCK_STREAM };
	struct sockaddr_storage bound;
	socklen_t bound_len = sizeof(bound);
	char host[NI_MAXHOST], port[8];
	struct addrinfo *ai;
	int fd, r, one = 1;

	r = listen_parse(listen_addr, host, sizeof(host), port, sizeof(port));
	if (r < 0)
		return r;
	r = getaddrinfo(host, port, &hints, &ai);
	if (r != 0)
		return error_set(-EINVAL, "cannot resolve '%s': %s", host, gai_strerror(r));
	fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0) {
		r = socket_errno(errno, "creating a socket for", listen_addr);
		goto out;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		r = socket_errno(errno, "binding", listen_addr);
		goto err_close;
	}
	if (listen(fd, SOMAXCONN) < 0) {
		r = socket_errno(errno, "listening on", listen_addr);
		goto err_close;
	}
	if (getsockname(fd, (struct sockaddr *)&bound, &bound_len) < 0) {
		r = socket_errno(errno, "reading the address of", listen_addr);
		goto err_close;
	}
	s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
						    : ((struct sockaddr_in *)&bound)->sin_port);
	/* brackets around an IPv6 literal, not around a name that resolved to
	 * an IPv6 address */
	snprintf(s->url, sizeof(s->url), "http://%s%s%s:%d", strchr(host, ':') ? "[" : "", host,
		 strchr(host, ':') ? "]" : "", s->port);
	s->fd = fd;
	s->local = sockaddr_is_local((struct sockaddr *)&bound);
	r = 0;
	goto out;

err_close:
	close(fd);
out:
	freeaddrinfo(ai);
	return r;
}

/* Whether something accepts connections on the Unix socket at addr. */
static bool unix_socket_alive(const struct sockaddr_un *addr)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool alive;

	if (fd < 0)
		return true; /* cannot tell: do not remove it */
	alive = connect(fd, (const struct sockaddr *)addr, sizeof(*addr)) == 0 ||
		errno != ECONNREFUSED;
	close(fd);
	return alive;
}

int listen_unix(struct listener *s, const char *path)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct stat st;
	mode_t old_umask;
	int fd, r;

	if (!*path || strlen(path) >= sizeof(addr.sun_path))
		return error_set(-EINVAL, "unix socket path must be 1 to %zu bytes",
				 sizeof(addr.sun_path) - 1);
	memcpy(addr.sun_path, path, strlen(path));
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return error_set(-EADDRINUSE, "%s exists and is not a socket", path);
		if (unix_socket_alive(&addr))
			return error_set(-EADDRINUSE, "%s: another server listens there", path);
		unlink(path); /* stale: its server is gone */
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return socket_errno(errno, "creating a socket for", path);
	/* only the owner may connect: created so, never briefly wider */
	old_umask = umask(0177);
	r = bind(fd, (struct sockaddr *)&addr, sizeof(addr));
	umask(old_umask);
	if (r < 0) {
		r = socket_errno(errno, "binding", path);
		close(fd);
		return r;
	}
	if (listen(fd, SOMAXCONN) < 0 || stat(path, &st) < 0) {
		r = socket_errno(errno, "listening on", path);
		unlink(path);
		close(fd);
		return r;
	}
	s->unix_path = strdup(path);
	if (!s->unix_path) {
		unlink(path);
		close(fd);
		return error_set(-ENOMEM, "out of host memory");
	}
	s->unix_dev = st.st_dev;
	s->unix_ino = st.st_ino;
	s->port = 0;
	snprintf(s->url, sizeof(s->url), "unix:%s", path);
	s->fd = fd;
	s->local = true;
	return 0;
}

/* Remove our socket file, unless another one took its place. */
void listener_unix_remove(struct listener *s)
{
	struct stat st;

	if (!s->unix_path)
		return;
	if (lstat(s->unix_path, &st) == 0 && st.st_dev == s->unix_dev && st.st_ino == s->unix_ino)
		unlink(s->unix_path);
	free(s->unix_path);
	s->unix_path = NULL;
}
