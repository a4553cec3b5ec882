/* SPDX-License-Identifier: MIT */
/* What the manager's files share: its data (manager_state.h), an
 * allocation's end (alloc.h) and the functions below. */
#ifndef DORMANT_MANAGER_H
#define DORMANT_MANAGER_H

#include "alloc.h"
#include "manager_state.h"
#include "warmup.h"

/* Shared between manager.c, transition.c and guard.c; call with m->lock. */
struct tag *tag_find(struct dormant *m, const char *name);
/* The allocation (dedicated or sub-allocation) holding [p, p + size), or NULL. */
struct alloc *alloc_containing(struct dormant *m, uintptr_t p, size_t size);
/* The data of a chunk: a slab's up to its highest live byte. */
void chunk_update_data_bytes(struct alloc *a, struct chunk *c);
/* Fix what a sleep copies of a chunk of a (the owner): its plan (extent.h). */
int chunk_plan(struct alloc *a, struct chunk *c);
/* -EBUSY with a message while the process's device state is checkpointed. */
int manager_check_not_checkpointed(struct dormant *m);
/* Log the line that says residue mode started its helper, if one is
 * waiting (residue_start_take()): after a stats read, and at a transition's
 * end before its own line. Without m->lock. */
void manager_log_residue_start(struct dormant *m);
/* Run the hooks of a point until one returns non-zero, adding the time
 * taken to *seconds (may be NULL). A failure where it fails the transition
 * (before-sleep, before-wake, after-copies, before-rebuild) is -ECANCELED
 * with its message, the hook's reason included (dormant_hook_set_error());
 * elsewhere the hook's own result. Without m->lock (hooks.c). */
int hooks_run(struct dormant *m, enum dormant_hook_point point, double *seconds);
/* Run the rebuild callbacks of tags whose memory came back zero-filled: on a
 * wake every DORMANT_REBUILD tag's with a callback, on a sleep's rollback
 * those with an item mapped_here; in order, without m->lock. 0 or
 * -ECANCELED for the first that fails (hooks.c). */
int hooks_rebuild(struct dormant *m, struct tag *const *tags, size_t tag_count,
		  const struct engine_item *items, size_t item_count, bool sleep);
/* Steps may enter: nothing holds the gate and every tag is awake. */
bool guard_open(struct dormant *m);
/* Wake steps waiting in dormant_step_enter() to look again. */
void guard_notify(struct dormant *m);
/* Sleep's side of the guard: close the gate and wait for steps to leave.
 * Returns 0 with the gate held, or -EBUSY (gate released again). Called
 * without m->lock. *ret_waited_s receives the time spent. */
int guard_close(struct dormant *m, double *ret_waited_s);
/* Release the gate held by guard_close() or a wake. Called with m->lock. */
void guard_release(struct dormant *m);
/* A transition starts (m->lock held, transition_running just set): stop a
 * warm-up run at its next chunk and wait for it; returns the seconds waited.
 * Drops the lock while it says so in the log. */
double guard_warmup_stop(struct dormant *m);
/* A transition ended (m->lock held): the warm-up thread may run again. */
void guard_warmup_resume(struct dormant *m);

#endif
