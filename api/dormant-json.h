/* SPDX-License-Identifier: MIT */
/*
 * The manager's statistics and transitions as JSON text, the same documents
 * the HTTP API serves (see openapi.yaml): for embedders that talk JSON but
 * not HTTP, such as the Python package through ctypes.
 *
 * Conventions as in dormant.h: 0 or a negative errno, message in
 * dormant_last_error(), output parameters untouched on failure, safe from
 * any thread, never prints.
 */
#ifndef DORMANT_JSON_H
#define DORMANT_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include "dormant.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The GET /stats body (without "extra") as a NUL-terminated string; pretty
 * indents it. The caller owns *ret_json and frees it with
 * dormant_json_free(). Returns -EINVAL (NULL argument), -ENOMEM.
 */
DORMANT_EXPORT int dormant_stats_json(struct dormant *m, bool pretty, char **ret_json);

/*
 * Run dormant_sleep() (action "sleep") or dormant_wake() (action "wake") on
 * tags (NULL-terminated; NULL means every tag) and describe the outcome in
 * *ret_json: the POST /sleep 200 body, with "result" "ok" on success or the
 * errno name ("EBUSY", "ENOMEM", ...) and "error" (the message) on failure.
 * Returns what dormant_sleep() or dormant_wake() returned, with *ret_json set
 * in both cases; or -EINVAL (NULL argument, unknown action) or -ENOMEM (the
 * report could not be built), and then *ret_json is untouched. The caller
 * owns *ret_json and frees it with dormant_json_free().
 */
DORMANT_EXPORT int dormant_transition_json(struct dormant *m, const char *action,
					   const char *const *tags, char **ret_json);

/*
 * As dormant_transition_json(m, "sleep", tags, ret_json), with the residue
 * handled as residue names it for this sleep only: "keep", "checkpoint", or
 * NULL or "default" for the manager's option (dormant_sleep_residue()).
 * -EINVAL for another name, *ret_json untouched.
 */
DORMANT_EXPORT int dormant_sleep_json(struct dormant *m, const char *const *tags,
				      const char *residue, char **ret_json);

/* Free a string returned by the functions above. Accepts NULL. */
DORMANT_EXPORT void dormant_json_free(char *json);

/* Writes a JSON object (text) describing extra state into buf, for the
 * "extra" member of GET /stats (dormantd reports its verifications there;
 * dormant_server_options_set_stats_extra() in dormant-server.h). Returns the
 * length written, or a negative errno. Called on server threads. */
typedef int (*dormant_stats_extra_fn)(void *userdata, char *buf, size_t size);

/* Writes lines of Prometheus text exposition format 0.0.4 (complete
 * families, "# TYPE" lines included, each line ending in a newline) into
 * buf, appended to GET /metrics (dormantd reports its verifications there).
 * Returns the length written, or a negative errno. Called on server threads. */
typedef int (*dormant_metrics_extra_fn)(void *userdata, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif
