/* SPDX-License-Identifier: MIT */
/*
 * The fault switch: device faults armed at the start of sleeps and wakes, for
 * rehearsing failures over HTTP (dormantd --fault, the faults server option;
 * never from the environment alone: docs/testing.md).
 *
 *   SPEC  = RULE[,RULE]...
 *   RULE  = WHEN:OP[:NTH[:ERROR[:TIMES]]]
 *   WHEN  = sleep | wake | any
 *   OP    = create | map | copy | host-alloc | disk | checkpoint | restore;
 *           create, map and restore are called by wakes only, host-alloc and
 *           checkpoint by sleeps only: a rule that could never fire
 *           (sleep:create, sleep:map, wake:host-alloc, ...) is refused, and
 *           "any" arms where the operation is called
 *   NTH   = the nth call of OP inside the transition fails (default 1)
 *   ERROR = EIO, ENOMEM, EAGAIN, ENOSPC or a number (default ENOMEM for
 *           create, map and host-alloc, EIO for the others)
 *   TIMES = how many times the fault fires, 0 without end (default 1)
 *
 * A rule is armed at the start of each transition of its kind while it has
 * firings left; it fired when the transition made at least NTH calls of OP
 * (dormant_debug_op_count()). Whatever did not fire is disarmed when the
 * transition ends, so that it never hits the trainer's own calls.
 *
 * Residue mode's checkpoint and restore run outside the hooks (after a
 * sleep's last hook, before a wake's first: nothing may run while the process
 * is checkpointed), and only inside sleeps and wakes: their rules stay armed
 * from the start, NTH counting their calls since the arming or the last
 * firing.
 */
#ifndef DORMANT_SERVER_FAULTS_H
#define DORMANT_SERVER_FAULTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dormant.h"

#define FAULT_RULES_MAX 8
#define FAULT_SPEC_MAX 512

enum fault_when {
	FAULT_WHEN_SLEEP = 1 << 0,
	FAULT_WHEN_WAKE = 1 << 1,
};

struct fault_rule {
	unsigned when; /* enum fault_when bits */
	enum dormant_fault_op op;
	unsigned nth;
	int error; /* negative errno */
	unsigned times; /* 0: without end */
	/* transition state; transitions run one at a time */
	unsigned fired;
	bool armed;
	uint64_t calls_at_arming;
};

struct fault_switch {
	struct fault_rule rules[FAULT_RULES_MAX];
	size_t count;
	int hook_ids[4];
	struct dormant *manager;
};

/* Parse spec (NULL or "" is no rule) into fs. 0 or -EINVAL with a message. */
int faults_parse(const char *spec, struct fault_switch *fs);

/* Arm the rules at the transition points of m; nothing when there is none.
 * 0 or a negative errno. */
int faults_install(struct fault_switch *fs, struct dormant *m);

/* Remove the hooks, disarm what is armed. Accepts an uninstalled switch. */
void faults_remove(struct fault_switch *fs);

#endif
