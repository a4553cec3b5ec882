/* SPDX-License-Identifier: MIT */
/* Running a sleep or a wake for the API: the manager's call, its report as a
 * JSON document (json.c builds it), and the transition's own message kept
 * for the caller; and the exported dormant_transition_json() on top. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "common.h"
#include "dormant-json.h"

int api_transition_run(struct dormant *m, enum api_kind kind, const char *const *tags,
		       enum dormant_residue_mode residue, json_t **ret_report)
{
	struct dormant_report *rep;
	double call_s;
	int r;

	/* large: keep it off the server thread's stack */
	rep = calloc(1, sizeof(*rep));
	if (!rep) {
		*ret_report = NULL;
		return error_set(-ENOMEM, "out of host memory");
	}
	call_s = now_monotonic_s();
	r = kind == API_SLEEP ? dormant_sleep_residue(m, tags, residue, rep)
			      : dormant_wake(m, tags, rep);
	call_s = now_monotonic_s() - call_s;
	if (r < 0 && rep->result == 0) {
		/* failed before the manager wrote the report (argument checks) */
		rep->result = r;
		snprintf(rep->error, sizeof(rep->error), "%s", dormant_last_error());
	}
	*ret_report = api_report_json(kind, rep);
	/* the after-sleep and after-wake hooks (dormantd's check of what came
	 * back) run once duration_s is measured, before the answer: their part */
	if (*ret_report &&
	    json_object_set_new(*ret_report, "after_hooks_s",
				api_number(MAX(call_s - rep->duration_s, 0.0), API_SECONDS)) < 0) {
		json_decref(*ret_report);
		*ret_report = NULL;
	}
	/* nothing since sets the thread's error: dormant_last_error() is still
	 * the transition's */
	free(rep);
	return r;
}

static int transition_json(struct dormant *m, enum api_kind kind, const char *const *tags,
			   enum dormant_residue_mode residue, char **ret_json)
{
	json_t *report;
	char *text;
	int r;

	r = api_transition_run(m, kind, tags, residue, &report);
	if (!report)
		return error_set(-ENOMEM, "out of host memory");
	text = json_dumps(report, JSON_FLAGS_COMPACT);
	json_decref(report);
	if (!text)
		return error_set(-ENOMEM, "out of host memory");
	*ret_json = text;
	return r;
}

DORMANT_EXPORT int dormant_transition_json(struct dormant *m, const char *action,
					   const char *const *tags, char **ret_json)
{
	if (!m || !action || !ret_json)
		return error_set(-EINVAL, "manager, action or ret_json is NULL");
	if (strcmp(action, "sleep") == 0)
		return transition_json(m, API_SLEEP, tags, DORMANT_RESIDUE_DEFAULT, ret_json);
	if (strcmp(action, "wake") == 0)
		return transition_json(m, API_WAKE, tags, DORMANT_RESIDUE_DEFAULT, ret_json);
	return error_set(-EINVAL, "action must be \"sleep\" or \"wake\", not \"%.64s\"", action);
}

DORMANT_EXPORT int dormant_sleep_json(struct dormant *m, const char *const *tags,
				      const char *residue, char **ret_json)
{
	enum dormant_residue_mode mode = DORMANT_RESIDUE_DEFAULT;

	if (!m || !ret_json)
		return error_set(-EINVAL, "manager or ret_json is NULL");
	if (residue && dormant_residue_mode_from_name(residue, &mode) < 0)
		return error_set(-EINVAL, "residue must be \"keep\", \"checkpoint\" or "
					  "\"default\", not \"%.64s\"",
				 residue);
	return transition_json(m, API_SLEEP, tags, mode, ret_json);
}
