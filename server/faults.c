/* SPDX-License-Identifier: MIT */
/* The fault switch (see faults.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "faults.h"
#include "common.h"

static const struct {
	const char *name;
	int error;
} errors[] = {
	{ "EIO", -EIO }, { "ENOMEM", -ENOMEM }, { "EAGAIN", -EAGAIN }, { "ENOSPC", -ENOSPC },
};

static const char *const op_names[] = {
	[DORMANT_FAULT_CREATE] = "create",
	[DORMANT_FAULT_MAP] = "map",
	[DORMANT_FAULT_COPY] = "copy",
	[DORMANT_FAULT_HOST_ALLOC] = "host-alloc",
	[DORMANT_FAULT_DISK] = "disk",
	[DORMANT_FAULT_CHECKPOINT] = "checkpoint",
	[DORMANT_FAULT_RESTORE] = "restore",
};
/* a name for every op: a missing last one would leave the array short (and
 * a missing middle one NULL: the designators above keep them in order) */
_Static_assert(ARRAY_SIZE(op_names) == DORMANT_FAULT_OPS, "a name for every fault op");

/* The transitions that call each operation: a rule for any other never
 * fires, and is refused. Sleep copies to host memory (host-alloc: its host
 * copies) and releases device memory; wake creates, maps and copies back. */
static const unsigned op_calls[] = {
	[DORMANT_FAULT_CREATE] = FAULT_WHEN_WAKE,
	[DORMANT_FAULT_MAP] = FAULT_WHEN_WAKE,
	[DORMANT_FAULT_COPY] = FAULT_WHEN_SLEEP | FAULT_WHEN_WAKE,
	[DORMANT_FAULT_HOST_ALLOC] = FAULT_WHEN_SLEEP,
	/* disk copies: created and written by sleeps, read by wakes */
	[DORMANT_FAULT_DISK] = FAULT_WHEN_SLEEP | FAULT_WHEN_WAKE,
	/* residue mode checkpoint: a sleep's checkpoint, a wake's restore */
	[DORMANT_FAULT_CHECKPOINT] = FAULT_WHEN_SLEEP,
	[DORMANT_FAULT_RESTORE] = FAULT_WHEN_WAKE,
};
_Static_assert(ARRAY_SIZE(op_calls) == DORMANT_FAULT_OPS, "the calls of every fault op");

static bool number(const char *text, unsigned long max, unsigned long *ret)
{
	char *end;

	if (text[0] < '0' || text[0] > '9')
		return false;
	errno = 0;
	*ret = strtoul(text, &end, 10);
	return !errno && !*end && *ret <= max;
}

static int rule_parse(char *text, struct fault_rule *rule)
{
	char *fields[6] = { 0 };
	size_t n = 0;
	unsigned long value;
	char *save = NULL;

	for (char *f = strtok_r(text, ":", &save); f; f = strtok_r(NULL, ":", &save)) {
		if (n == 5)
			return error_set(-EINVAL, "fault rule has more than 5 fields "
						  "(WHEN:OP[:NTH[:ERROR[:TIMES]]])");
		fields[n++] = f;
	}
	if (n < 2)
		return error_set(-EINVAL, "fault rule '%.64s' is not WHEN:OP[:NTH[:ERROR[:TIMES]]]",
				 text);
	if (strcmp(fields[0], "sleep") == 0)
		rule->when = FAULT_WHEN_SLEEP;
	else if (strcmp(fields[0], "wake") == 0)
		rule->when = FAULT_WHEN_WAKE;
	else if (strcmp(fields[0], "any") == 0)
		rule->when = FAULT_WHEN_SLEEP | FAULT_WHEN_WAKE;
	else
		return error_set(-EINVAL, "fault rule: '%.32s' is not sleep, wake or any", fields[0]);
	rule->op = DORMANT_FAULT_OPS;
	for (int op = 0; op < DORMANT_FAULT_OPS; op++)
		if (op_names[op] && strcmp(fields[1], op_names[op]) == 0)
			rule->op = (enum dormant_fault_op)op;
	if (rule->op == DORMANT_FAULT_OPS)
		return error_set(-EINVAL, "fault rule: '%.32s' is not create, map, copy, host-alloc, "
					  "disk, checkpoint or restore",
				 fields[1]);
	if (!(rule->when & op_calls[rule->op]))
		return error_set(-EINVAL, "fault rule %s:%s would never fire: a %s makes no %s call "
					  "(%s fires at %s)", fields[0], fields[1], fields[0],
				 fields[1], fields[1],
				 op_calls[rule->op] == FAULT_WHEN_WAKE ? "wake" : "sleep");
	/* "any" arms where the operation is called */
	rule->when &= op_calls[rule->op];
	rule->nth = 1;
	if (fields[2]) {
		if (!number(fields[2], 1000000, &value) || value == 0)
			return error_set(-EINVAL, "fault rule: NTH '%.32s' is not from 1 to 1000000",
					 fields[2]);
		rule->nth = (unsigned)value;
	}
	rule->error = rule->op == DORMANT_FAULT_COPY || rule->op == DORMANT_FAULT_DISK ||
			      rule->op == DORMANT_FAULT_CHECKPOINT || rule->op == DORMANT_FAULT_RESTORE
			      ? -EIO
			      : -ENOMEM;
	if (fields[3]) {
		bool found = false;

		for (size_t i = 0; i < sizeof(errors) / sizeof(errors[0]); i++) {
			if (strcmp(fields[3], errors[i].name) == 0) {
				rule->error = errors[i].error;
				found = true;
			}
		}
		if (!found && number(fields[3], 4095, &value) && value > 0) {
			rule->error = -(int)value;
			found = true;
		}
		if (!found)
			return error_set(-EINVAL, "fault rule: ERROR '%.32s' is not EIO, ENOMEM, "
						  "EAGAIN, ENOSPC or a number from 1 to 4095",
					 fields[3]);
	}
	rule->times = 1;
	if (fields[4]) {
		if (!number(fields[4], 1000000, &value))
			return error_set(-EINVAL, "fault rule: TIMES '%.32s' is not from 0 to 1000000",
					 fields[4]);
		rule->times = (unsigned)value;
	}
	return 0;
}

int faults_parse(const char *spec, struct fault_switch *fs)
{
	char copy[FAULT_SPEC_MAX];
	char *save = NULL;
	int r;

	memset(fs, 0, sizeof(*fs));
	for (size_t i = 0; i < sizeof(fs->hook_ids) / sizeof(fs->hook_ids[0]); i++)
		fs->hook_ids[i] = -1;
	if (!spec || !*spec)
		return 0;
	if (strlen(spec) >= sizeof(copy))
		return error_set(-EINVAL, "fault spec is longer than %d bytes", FAULT_SPEC_MAX - 1);
	strcpy(copy, spec);
	for (char *rule = strtok_r(copy, ",", &save); rule; rule = strtok_r(NULL, ",", &save)) {
		if (fs->count == FAULT_RULES_MAX)
			return error_set(-EINVAL, "more than %d fault rules", FAULT_RULES_MAX);
		r = rule_parse(rule, &fs->rules[fs->count]);
		if (r < 0)
			return r;
		/* the backend holds one fault per operation */
		for (size_t i = 0; i < fs->count; i++)
			if (fs->rules[i].op == fs->rules[fs->count].op &&
			    (fs->rules[i].when & fs->rules[fs->count].when))
				return error_set(-EINVAL, "two fault rules for %s in the same transition",
						 op_names[fs->rules[i].op]);
		fs->count++;
	}
	if (fs->count == 0)
		return error_set(-EINVAL, "fault spec '%.64s' has no rule", spec);
	return 0;
}

/* The residue's checkpoint runs after a sleep's after hooks and its restore
 * before a wake's before hooks (no hook may run while the process is
 * checkpointed): their rules stay armed between transitions instead, and
 * count their calls from the arming (only sleeps checkpoint, only wakes
 * restore). */
static bool outside_hooks(enum dormant_fault_op op)
{
	return op == DORMANT_FAULT_CHECKPOINT || op == DORMANT_FAULT_RESTORE;
}

static void arm(struct dormant *m, struct fault_rule *rule)
{
	if (rule->times && rule->fired >= rule->times)
		return;
	rule->calls_at_arming = dormant_debug_op_count(m, rule->op);
	rule->armed = dormant_debug_inject_fault(m, rule->op, rule->nth, rule->error, false) == 0;
}

/* Count what fired in the transition that ends (or ended, failing, without
 * its after hook), and disarm the rest; a rule armed between transitions
 * stays armed until it fires, and is armed again while it has firings left. */
static void settle(struct fault_switch *fs, struct dormant *m, bool ending)
{
	for (size_t i = 0; i < fs->count; i++) {
		struct fault_rule *rule = &fs->rules[i];
		bool fired;

		if (!rule->armed)
			continue;
		fired = dormant_debug_op_count(m, rule->op) - rule->calls_at_arming >= rule->nth;
		if (fired)
			rule->fired++;
		if (!fired && outside_hooks(rule->op) && !ending)
			continue;
		rule->armed = false;
		dormant_debug_inject_fault(m, rule->op, 0, 0, false);
		if (outside_hooks(rule->op) && !ending)
			arm(m, rule);
	}
}

/* Before a transition: arm the rules of this kind with firings left. */
static int before(struct dormant *m, enum dormant_hook_point point, void *userdata)
{
	struct fault_switch *fs = userdata;
	unsigned when = point == DORMANT_HOOK_BEFORE_SLEEP ? FAULT_WHEN_SLEEP : FAULT_WHEN_WAKE;

	settle(fs, m, false);
	for (size_t i = 0; i < fs->count; i++) {
		struct fault_rule *rule = &fs->rules[i];

		if ((rule->when & when) && !outside_hooks(rule->op))
			arm(m, rule);
	}
	return 0;
}

static int after(struct dormant *m, enum dormant_hook_point point, void *userdata)
{
	settle(userdata, m, false);
	return 0;
}

int faults_install(struct fault_switch *fs, struct dormant *m)
{
	static const enum dormant_hook_point points[4] = {
		DORMANT_HOOK_BEFORE_SLEEP, DORMANT_HOOK_AFTER_SLEEP,
		DORMANT_HOOK_BEFORE_WAKE, DORMANT_HOOK_AFTER_WAKE,
	};

	if (fs->count == 0)
		return 0;
	fs->manager = m;
	for (int i = 0; i < 4; i++) {
		bool is_before = points[i] == DORMANT_HOOK_BEFORE_SLEEP ||
				 points[i] == DORMANT_HOOK_BEFORE_WAKE;
		int id = dormant_hook_add(m, points[i], is_before ? before : after, fs);

		if (id < 0) {
			faults_remove(fs);
			return id;
		}
		fs->hook_ids[i] = id;
	}
	for (size_t i = 0; i < fs->count; i++)
		if (outside_hooks(fs->rules[i].op))
			arm(m, &fs->rules[i]);
	return 0;
}

void faults_remove(struct fault_switch *fs)
{
	if (!fs->manager)
		return;
	for (int i = 0; i < 4; i++) {
		if (fs->hook_ids[i] >= 0)
			dormant_hook_remove(fs->manager, fs->hook_ids[i]);
		fs->hook_ids[i] = -1;
	}
	settle(fs, fs->manager, true);
	fs->manager = NULL;
}
