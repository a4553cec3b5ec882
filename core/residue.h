/* SPDX-License-Identifier: MIT */
/*
 * Residue mode (dormant.h, "Residue"; docs/design.md): the driver's process
 * checkpoint of what the process holds on its devices outside every tag,
 * driven through a helper process (residue_helper.c, residue_proto.h).
 *
 * The manager calls residue_checkpoint() at the end of a sleep that left
 * every tag asleep and residue_restore() at the start of a wake, both from
 * the thread running the transition (one at a time). Any thread may ask
 * residue_checkpointed() and residue_stats_get(); a thread that reads a
 * device outside a transition (stats) brackets the call with
 * residue_device_enter()/residue_device_leave(), which refuse while the
 * process is checkpointed, so that no such call starts once a checkpoint
 * has begun. This module sits beside the manager, below transition.c: it
 * sees the backend, never the tags, and logs nothing (it reports).
 */
#ifndef DORMANT_RESIDUE_H
#define DORMANT_RESIDUE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "backend.h"
#include "dormant.h"
#include "util.h"

struct residue {
	enum dormant_residue_mode mode; /* the option: KEEP or CHECKPOINT */
	unsigned lock_timeout_ms;
	double request_timeout_s; /* a checkpoint's or restore's, helper included */
	struct backend *backend;
	/* no device call may start while set (residue_device_enter()) */
	pthread_rwlock_t device_access;
	_Atomic bool checkpointed;
	/* the devices the process had used when it was checkpointed */
	bool used[DORMANT_DEVICES_MAX];

	/* one request to the helper at a time (a checkpoint, a restore, or a
	 * stats thread's read of free memory, which never waits for it) */
	pthread_mutex_t io;
	/* the last free and total memory the helper read (RESIDUE_OP_FREE) */
	_Atomic uint64_t outside_free[DORMANT_DEVICES_MAX], outside_total[DORMANT_DEVICES_MAX];

	pthread_mutex_t lock; /* the fields below; never held across the helper's I/O */
	enum dormant_residue_state state;
	char reason[DORMANT_ERROR_MAX];
	bool unavailable_logged;
	pid_t helper_pid; /* 0: none */
	int helper_fd;    /* -1: none */
	bool helper_busy; /* a request is under way: only its thread reaps */
	uint64_t helper_starts;
	/* the last start's line, until the manager logs it (residue_start_take()) */
	char start_line[512];
	bool start_warning;
	uint64_t checkpoints, checkpoint_failures, restores, restore_failures;
	double checkpoint_s_total, restore_s_total;
	uint64_t residue_bytes[DORMANT_DEVICES_MAX]; /* freed by the last checkpoint */
	char last_op[16];
	uint64_t last_seq;
	int last_result;
	double last_seconds;
	char last_error[DORMANT_ERROR_MAX];
};

void residue_init(struct residue *r, struct backend *b, enum dormant_residue_mode mode,
		  unsigned lock_timeout_ms, unsigned timeout_ms);
/* Stop the helper (it exits on end-of-file) and reap it. The process must
 * not be checkpointed any more (residue_restore() first). */
void residue_finish(struct residue *r);

/*
 * A device's free and total memory as seen from outside the process: while
 * checkpointed on the CUDA driver, read by the helper (a call into the
 * driver's libraries here, NVML's included, would wait for the restore);
 * else the backend's free_outside. A read while the helper is busy with
 * another request, or with no helper running and start false (a stats read
 * does not start a process), answers what the helper read last (-EBUSY if
 * nothing).
 */
int residue_free_outside(struct residue *r, int device, bool start, uint64_t *ret_free,
			 uint64_t *ret_total);

/* Whether the process is checkpointed now (any thread; lock-free). */
bool residue_checkpointed(struct residue *r);

/*
 * Checkpoint the process's device state now, with devices (the count the
 * backend sees) measured before and after. Call with every tag asleep and
 * nothing else touching a device. Returns 0 when checkpointed, else the
 * failure (the residue stays resident and stats say why: the sleep that
 * called it still succeeds); -ENOTSUP also marks the mode unavailable for
 * good. What it tried goes into *step (op, result, seconds, error) as into
 * the stats; a call that tries nothing (checkpointed already, unavailable)
 * leaves it alone. It logs nothing: its caller says what happened
 * (residue_start_take() for the helper's starts).
 */
int residue_checkpoint(struct residue *r, int devices, struct dormant_residue_step *step);

/*
 * Restore the process's device state, if checkpointed, after checking that
 * each device has room for its residue and need[d] more bytes (what the wake
 * maps there). Returns 0 (also when there was nothing to restore); -ENOMEM
 * when a device lacks room (nothing tried) or the driver ran out (then the
 * state is stuck); -EIO or another errno with the driver's message when it
 * failed and a later call may try again; -EPERM once stuck. What it tried
 * goes into *step, as residue_checkpoint() says.
 */
int residue_restore(struct residue *r, int devices, const uint64_t need[DORMANT_DEVICES_MAX],
		    struct dormant_residue_step *step);

/* A transition's last word on the residue: the manager's mode where the step
 * names none, and the state now. */
void residue_step_finish(struct residue *r, struct dormant_residue_step *step);

/* Copy the line that says the helper's last start into buf (a start
 * before it that no one took is counted in its "start N") and forget it:
 * true if there was one, with *ret_warning set when the process could not
 * name it its tracer. The manager logs it; this module logs nothing. */
bool residue_start_take(struct residue *r, char *buf, size_t size, bool *ret_warning);

/* Bracket a device call made outside a transition: false (nothing held)
 * while the process is checkpointed. */
bool residue_device_enter(struct residue *r);
void residue_device_leave(struct residue *r);

void residue_stats_get(struct residue *r, struct dormant_residue_stats *ret);

#endif
