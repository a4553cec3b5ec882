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

/*
 * Add the endpoint of every live record in the directory, those of role only
 * if role is not NULL, ordered by rank, local rank, then pid. A record whose
 * process is gone (no such pid, or a pid reused by a process that started at
 * another time) is skipped and counted in *ret_stale. A file that is not a
 * record is an error naming it and saying why: acting on some servers and
 * silently not on others is worse than not acting. Returns the number added,
 * -ENOENT (no such directory), -EINVAL (a bad record), -E2BIG, -ENOMEM.
 */
int ctl_endpoints_add_discovered(struct ctl_endpoints *list, const char *dir, const char *role,
				 size_t *ret_stale, char *err, size_t err_size);

#endif
