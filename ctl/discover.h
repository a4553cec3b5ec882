/* SPDX-License-Identifier: MIT */
/*
 * Endpoints from discovery records: the JSON files dormant servers publish in
 * a runtime directory (server/discovery.c; format in docs/orchestrators.md).
 */
#ifndef DORMANTCTL_DISCOVER_H
#define DORMANTCTL_DISCOVER_H

#include <stddef.h>

#include "endpoint.h"

/* Records larger than this are refused (a record is some 250 bytes). */
#define CTL_RECORD_MAX 4096

/*
 * The directory readers look in: dir if not NULL, else $DORMANT_RUNTIME_DIR,
 * else $XDG_RUNTIME_DIR/dormant, else /tmp/dormant-UID (the servers'
 * default). Returns 0, or -ENAMETOOLONG with a message.
 */
int ctl_discovery_dir(const char *dir, char *ret, size_t size, char *err, size_t err_size);

/* Told one line about each file skipped (see below). */
typedef void (*ctl_warn_fn)(void *userdata, const char *line);

/*
 * Add the endpoint of every live record in the directory, those of role only
 * if role is not NULL, ordered by rank, local rank, then pid.
 *
 * Only what this user wrote is trusted (the same rules as the writer's and
 * dormant.client.discover()'s, docs/orchestrators.md): the directory must
 * be this user's and writable by no one else, else nothing is read and
 * -EPERM returned (-ELOOP for a link is reported as -EPERM too). A *.json
 * file that is not a regular file of this user writable by no one else, is
 * larger than CTL_RECORD_MAX, or is not a record, is skipped: warn (if not
 * NULL) gets a line naming it and why, and *ret_skipped counts it; the
 * others are still found. A record whose process is gone (no such pid, pid
 * 1, a process of another user, or one that started at another time than
 * the record says) is skipped and counted in *ret_stale. Files are opened
 * without following links and without blocking. Returns the number added,
 * -ENOENT (no such directory), -EPERM, -EINVAL (a record's url that is not
 * an endpoint), -E2BIG, -ENOMEM.
 */
int ctl_endpoints_add_discovered(struct ctl_endpoints *list, const char *dir, const char *role,
				 ctl_warn_fn warn, void *userdata, size_t *ret_stale,
				 size_t *ret_skipped, char *err, size_t err_size);

#endif
