/* SPDX-License-Identifier: MIT */
/*
 * Discovery records: where a server listens, published as one small JSON file
 * per server in a runtime directory, so that dormantctl --discover and
 * dormant.client.Client.discover() find every server of a node, however many
 * processes share a GPU and whatever ports they were given (port 0).
 * The format is in docs/orchestrators.md ("Colocated groups").
 */
#ifndef DORMANT_SERVER_DISCOVERY_H
#define DORMANT_SERVER_DISCOVERY_H

#include <stddef.h>

/* Version of the record format ("version" member). */
#define DISCOVERY_VERSION 1
/* Longest role name (same characters as a tag). */
#define DISCOVERY_ROLE_MAX 63

/*
 * The directory records go to: dir if not NULL, else $DORMANT_RUNTIME_DIR,
 * else $XDG_RUNTIME_DIR/dormant, else /tmp/dormant-UID. Created (mode 0700)
 * if missing, its parent not. Whichever it is, it must pass the readers'
 * check (runtime_dir_open(): no symbolic link, a directory of this user
 * that no one else may write to). Returns it open (the caller closes it), its
 * name in ret; or a negative errno with a message.
 */
int discovery_dir_open(const char *dir, char *ret, size_t size);

/*
 * Write the record of a server listening at url (port 0 for a Unix socket)
 * into the directory (discovery_dir(dir)), under a temporary name first and
 * renamed, so that a reader never sees half a record. role may be NULL
 * ($DORMANT_ROLE, else none). *ret_path gets the record's path. 0 or a
 * negative errno with a message.
 */
int discovery_publish(const char *dir, const char *role, const char *url, int port,
		      char *ret_path, size_t size);

#endif
