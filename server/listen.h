/* SPDX-License-Identifier: MIT */
/* The server's listening socket (listen.c). */
#ifndef DORMANT_SERVER_LISTEN_H
#define DORMANT_SERVER_LISTEN_H

#include <limits.h>
#include <stdbool.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/types.h>

struct listener {
	int port;
	char url[sizeof("http://[]:65535") + NI_MAXHOST + PATH_MAX];
	char *unix_path; /* removed at stop if it is still our socket */
	dev_t unix_dev;
	ino_t unix_ino;
	int fd; /* ours until the daemon runs, and again once quiesced */
	bool local; /* a Unix socket or a loopback address: this node only */
};

/* Whether addr is a loopback address (127.0.0.0/8, ::1, ::ffff:127.x.y.z)
 * or a Unix socket's: a client of this node. NULL: false. */
bool sockaddr_is_local(const struct sockaddr *addr);

/* Split "host:port" or "[v6]:port" (the listen option) into host and port;
 * -EINVAL with a message naming listen when it is neither. */
int listen_parse(const char *listen, char *host, size_t host_size, char *port, size_t port_size);

/* Bind and listen on "host:port" (listen_parse()), or on a Unix socket at
 * path (mode 0600; a stale socket there is replaced); fill port, url, fd.
 * 0 or a negative errno (-EADDRINUSE, -EACCES, -EINVAL, -ENOMEM, -EIO). */
int listen_tcp(struct listener *l, const char *listen_addr);
int listen_unix(struct listener *l, const char *path);

/* Remove our socket file, unless another one took its place. */
void listener_unix_remove(struct listener *l);

/* The errno of a failed socket call as ours, with the message
 * "WHAT WHERE: strerror". */
int socket_errno(int err, const char *what, const char *where);

#endif
