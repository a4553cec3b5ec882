/* SPDX-License-Identifier: MIT */
/*
 * Residue mode checkpoint (dormant.h, "Residue"; issue 34): the state
 * machine around the driver's process checkpoint, its helper process, its
 * failures and retries, and that no call reaches the device while the
 * process is checkpointed. On the host backend the simulated device models
 * the residue (host_residue_bytes) and the helper answers for the driver;
 * test-residue runs on CUDA too (residue-cuda, gpu suite), where the
 * host-only expectations are skipped.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

#define RESIDUE (64 * MiB)

static struct dormant_residue_stats residue(struct dormant *m)
{
	struct dormant_residue_stats s;

	cr_assert_eq(dormant_residue_stats_get(m, &s), 0);
	return s;
}

/* Checkpoint mode, a 64 MiB residue per used simulated device, 4 MiB chunks. */
static struct dormant *checkpointing(const char *more)
{
	return manager_from("residue=checkpoint,host_residue_bytes=%zu,chunk_bytes=4MiB,"
			    "staging_bytes=8MiB,copy_threads=2,guard_timeout_ms=5000%s%s",
			    RESIDUE, more ? "," : "", more ? more : "");
}

static uint64_t device_free(struct dormant *m)
{
	struct dormant_stats *s = stats(m);

	cr_assert_geq(s->device_count, 1);
	return s->devices[0].free_bytes;
}

/* weights (kept, filled with seed 1) and grads (discarded) */
static void trainer(struct dormant *m, void **weights, void **grads)
{
	cr_assert_eq(dormant_set_policy(m, "grads", DORMANT_DISCARD), 0);
	cr_assert_eq(dormant_alloc(m, "weights", 24 * MiB, weights), 0, "%s",
		     dormant_last_error());
	cr_assert_eq(dormant_alloc(m, "grads", 16 * MiB, grads), 0, "%s", dormant_last_error());
	fill(m, *weights, 24 * MiB, 1);
	fill(m, *grads, 16 * MiB, 2);
}

static bool reaped(int pid)
{
	/* ours and reaped: waitpid knows no such child any more */
	return waitpid(pid, NULL, WNOHANG) < 0 && errno == ECHILD;
}

Test(residue, checkpoint_gives_the_residue_back_and_the_wake_restores_it)
{
	struct dormant *m = checkpointing(NULL);
	struct dormant_residue_stats r;
	void *weights, *grads;
	uint64_t free_awake, free_asleep;

	trainer(m, &weights, &grads);
	free_awake = device_free(m);
	r = residue(m);
	cr_expect_eq(r.mode, DORMANT_RESIDUE_CHECKPOINT);
	cr_expect_eq(r.state, DORMANT_RESIDUE_RESIDENT);
	cr_expect_eq(r.helper_starts, 0, "no helper before the first checkpoint");

	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	r = residue(m);
	cr_expect_eq(r.state, DORMANT_RESIDUE_CHECKPOINTED, "%s", r.last_error);
	cr_expect_eq(r.checkpoints, 1);
	cr_expect_str_eq(r.last_op, "checkpoint");
	cr_expect_eq(r.last_result, 0);
	cr_expect_gt(r.helper_pid, 0);
	free_asleep = device_free(m);
	cr_expect_gt(free_asleep, free_awake, "the sleep gave device memory back");
	if (on_host(m)) {
		cr_expect_eq(r.residue_bytes, RESIDUE);
		cr_expect_eq(free_asleep - free_awake, 40 * MiB + RESIDUE,
			     "the tags' memory and the residue: the device holds nothing");
	}

	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	r = residue(m);
	cr_expect_eq(r.state, DORMANT_RESIDUE_RESIDENT);
	cr_expect_eq(r.restores, 1);
	cr_expect_str_eq(r.last_op, "restore");
	cr_expect(holds(m, weights, 24 * MiB, 1), "kept bytes survive");
	cr_expect(holds(m, grads, 16 * MiB, 0), "discarded bytes come back zero");
	if (on_host(m)) {
		cr_expect_eq(device_free(m), free_awake, "the residue is back");
	} else {
		/* the driver's restore lays the context out again: what it
		 * holds may differ by a little, not by the residue */
		uint64_t free_woke = device_free(m), slack = r.residue_bytes / 8;

		cr_expect(free_woke + slack >= free_awake && free_woke <= free_awake + slack,
			  "the residue is back: free %llu awake, %llu asleep, %llu woken "
			  "(residue %llu)", (unsigned long long)free_awake,
			  (unsigned long long)free_asleep, (unsigned long long)free_woke,
			  (unsigned long long)r.residue_bytes);
	}
	cr_expect_eq(r.calls_while_checkpointed, 0);
	/* cycles go on with the same helper */
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
		cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	}
	r = residue(m);
	cr_expect_eq(r.checkpoints, 4);
	cr_expect_eq(r.restores, 4);
	cr_expect_eq(r.helper_starts, 1);
	cr_expect(holds(m, weights, 24 * MiB, 1));
	expect_no_device_leak(m);
	dormant_destroy(m);
}

/* The log of a manager: its last line, for the transition's one line. */
static char last_line[1024];
static int helper_lines; /* lines that say the residue helper started */

static void keep_last_line(enum dormant_log_level level, const char *message, void *userdata)
{
	(void)userdata;
	/* the transitions' own lines: debug traces come from the workers at
	 * any time (residue=checkpoint runs in host mode reclaimable, whose
	 * background unpins say so), after a wake's line as often as not */
	if (level == DORMANT_LOG_DEBUG)
		return;
	snprintf(last_line, sizeof(last_line), "%s", message);
	helper_lines += strstr(message, "residue: helper") != NULL;
}

static struct dormant *checkpointing_logged(void)
{
	struct dormant_options *o;
	struct dormant *m;

	cr_assert_eq(dormant_options_new(&o), 0);
	cr_assert_eq(dormant_options_parse(o, "residue=checkpoint,host_residue_bytes=67108864,"
					      "chunk_bytes=4MiB,staging_bytes=8MiB,copy_threads=2"),
		     0, "%s", dormant_last_error());
	cr_assert_eq(dormant_options_set_log(o, keep_last_line, NULL), 0);
	cr_assert_eq(dormant_new(o, &m), 0, "%s", dormant_last_error());
	dormant_options_destroy(o);
	return m;
}

/* Each report says what its transition did with the residue and how many
 * tags are awake and asleep after it, and so does its line of log. */
Test(residue, the_report_says_what_the_transition_did_with_the_residue)
{
	struct dormant *m = checkpointing_logged();
	const char *const weights_only[] = { "weights", NULL };
	struct dormant_report rep;
	void *weights, *grads;
	double first_s;

	trainer(m, &weights, &grads);
	/* one tag of two asleep: no checkpoint */
	cr_assert_eq(dormant_sleep(m, weights_only, &rep), 0, "%s", rep.error);
	cr_expect_str_eq(rep.residue.op, "");
	cr_expect_eq(rep.residue.mode, DORMANT_RESIDUE_CHECKPOINT, "the manager's mode");
	cr_expect_eq(rep.residue.state, DORMANT_RESIDUE_RESIDENT);
	cr_expect_eq(rep.tags_asleep, 1);
	cr_expect_eq(rep.tags_awake, 1);
	cr_expect_null(strstr(last_line, "residue"), "%s", last_line);
	first_s = rep.duration_s;

	/* the rest: every tag asleep, checkpointed */
	cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "%s", rep.error);
	cr_expect_str_eq(rep.residue.op, "checkpoint");
	cr_expect_eq(rep.residue.result, 0);
	cr_expect_eq(rep.residue.state, DORMANT_RESIDUE_CHECKPOINTED);
	cr_expect_str_eq(rep.residue.error, "");
	cr_expect_eq(rep.tags_asleep, 2);
	cr_expect_eq(rep.tags_awake, 0);
	cr_expect(strstr(last_line, "sleep: done") && strstr(last_line, "residue checkpoint in"),
		  "%s", last_line);
	cr_expect_eq(helper_lines, 1, "the helper's start is logged once, by the transition");
	cr_expect_geq(rep.duration_s, rep.residue.seconds, "its time is the sleep's");
	cr_expect_eq(stats(m)->last_sleep.duration_s, rep.duration_s, "and so in the stats");
	cr_expect(fabs(stats(m)->sleep_seconds.sum_s - (first_s + rep.duration_s)) < 1e-9,
		  "the histogram has both sleeps' whole times: %f, %f + %f",
		  stats(m)->sleep_seconds.sum_s, first_s, rep.duration_s);

	/* a wake whose restore fails says so, and keeps it checkpointed */
	cr_assert_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_RESTORE, 1, -EIO, false), 0);
	cr_expect_eq(dormant_wake(m, NULL, &rep), -EIO);
	cr_expect_str_eq(rep.residue.op, "restore");
	cr_expect_eq(rep.residue.result, -EIO);
	cr_expect_eq(rep.residue.state, DORMANT_RESIDUE_CHECKPOINTED);
	cr_expect(strstr(rep.residue.error, "injected"), "%s", rep.residue.error);
	cr_expect_eq(rep.tags_asleep, 2);
	cr_expect(strstr(last_line, "wake: failed"), "%s", last_line);

	cr_assert_eq(dormant_wake(m, NULL, &rep), 0, "%s", rep.error);
	cr_expect_str_eq(rep.residue.op, "restore");
	cr_expect_eq(rep.residue.result, 0);
	cr_expect_eq(rep.residue.state, DORMANT_RESIDUE_RESIDENT);
	cr_expect_eq(rep.tags_awake, 2);
	cr_expect_eq(rep.tags_asleep, 0);
	cr_expect(strstr(last_line, "residue restore in"), "%s", last_line);

	/* a checkpoint that fails: the sleep succeeds, its report says why */
	cr_assert_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_CHECKPOINT, 1, -EIO, false), 0);
	cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "%s", rep.error);
	cr_expect_str_eq(rep.error, "");
	cr_expect_str_eq(rep.residue.op, "checkpoint");
	cr_expect_eq(rep.residue.result, -EIO);
	cr_expect_eq(rep.residue.state, DORMANT_RESIDUE_RESIDENT);
	cr_expect(strstr(rep.residue.error, "injected"), "%s", rep.residue.error);
	cr_expect(strstr(last_line, "the residue stays: ") && strstr(last_line, "injected"), "%s",
		  last_line);

	/* asleep already: the sleep moves nothing, tries the checkpoint again
	 * and says so */
	last_line[0] = '\0';
	cr_assert_eq(dormant_sleep(m, NULL, &rep), 0, "%s", rep.error);
	cr_expect_str_eq(rep.residue.op, "checkpoint");
	cr_expect_eq(rep.residue.result, 0);
	cr_expect(strstr(last_line, "residue checkpoint in"), "%s", last_line);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);

	/* a sleep's own mode is the one its report names */
	cr_assert_eq(dormant_sleep_residue(m, NULL, DORMANT_RESIDUE_KEEP, &rep), 0);
	cr_expect_eq(rep.residue.mode, DORMANT_RESIDUE_KEEP);
	cr_expect_str_eq(rep.residue.op, "");
	cr_expect_eq(rep.residue.state, DORMANT_RESIDUE_RESIDENT);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	cr_expect(holds(m, weights, 24 * MiB, 1));
	dormant_destroy(m);
}

Test(residue, keep_mode_starts_no_helper_and_keeps_the_residue)
{
	struct dormant *m = manager_from("host_residue_bytes=%zu", RESIDUE);
	struct dormant_residue_stats r;
	void *weights, *grads;

	trainer(m, &weights, &grads);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	r = residue(m);
	cr_expect_eq(r.mode, DORMANT_RESIDUE_KEEP);
	cr_expect_eq(r.state, DORMANT_RESIDUE_RESIDENT);
	cr_expect_eq(r.helper_starts, 0);
	cr_expect_eq(r.checkpoints, 0);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	cr_expect(holds(m, weights, 24 * MiB, 1));
	dormant_destroy(m);
}

Test(residue, only_a_sleep_that_leaves_every_tag_asleep_checkpoints)
{
	struct dormant *m = checkpointing(NULL);
	const char *weights_tag[] = { "weights", NULL };
	const char *grads_tag[] = { "grads", NULL };
	void *weights, *grads;

	trainer(m, &weights, &grads);
	cr_assert_eq(dormant_sleep(m, grads_tag, NULL), 0);
	cr_expect_eq(residue(m).state, DORMANT_RESIDUE_RESIDENT, "weights are still awake");
	cr_expect_eq(residue(m).checkpoints, 0);
	cr_assert_eq(dormant_sleep(m, weights_tag, NULL), 0);
	cr_expect_eq(residue(m).state, DORMANT_RESIDUE_CHECKPOINTED);
	/* a wake of one tag restores the whole process first */
	cr_assert_eq(dormant_wake(m, weights_tag, NULL), 0, "%s", dormant_last_error());
	cr_expect_eq(residue(m).state, DORMANT_RESIDUE_RESIDENT);
	cr_expect(holds(m, weights, 24 * MiB, 1));
	cr_assert_eq(dormant_wake(m, grads_tag, NULL), 0);
	dormant_destroy(m);
}

Test(residue, a_sleep_chooses_its_own_mode)
{
	struct dormant *keep = manager_from("host_residue_bytes=%zu", RESIDUE);
	struct dormant *checkpoint = checkpointing(NULL);
	void *weights, *grads;

	trainer(keep, &weights, &grads);
	cr_assert_eq(dormant_sleep_residue(keep, NULL, DORMANT_RESIDUE_CHECKPOINT, NULL), 0);
	cr_expect_eq(residue(keep).state, DORMANT_RESIDUE_CHECKPOINTED);
	cr_assert_eq(dormant_wake(keep, NULL, NULL), 0);
	cr_expect(holds(keep, weights, 24 * MiB, 1));

	trainer(checkpoint, &weights, &grads);
	cr_assert_eq(dormant_sleep_residue(checkpoint, NULL, DORMANT_RESIDUE_KEEP, NULL), 0);
	cr_expect_eq(residue(checkpoint).state, DORMANT_RESIDUE_RESIDENT);
	cr_expect_eq(residue(checkpoint).checkpoints, 0);
	cr_expect_eq(dormant_sleep_residue(checkpoint, NULL, (enum dormant_residue_mode)7, NULL),
		     -EINVAL);
	/* every tag is asleep already: the sleep changes nothing but the residue */
	cr_assert_eq(dormant_sleep(checkpoint, NULL, NULL), 0);
	cr_expect_eq(residue(checkpoint).state, DORMANT_RESIDUE_CHECKPOINTED);
	cr_assert_eq(dormant_wake(checkpoint, NULL, NULL), 0);
	dormant_destroy(keep);
	dormant_destroy(checkpoint);
}

Test(residue, nothing_reaches_the_device_while_checkpointed)
{
	struct dormant *m = checkpointing(NULL);
	struct dormant_stats *s;
	void *weights, *grads, *spare, *torch_spare, *more = NULL;

	trainer(m, &weights, &grads);
	cr_assert_eq(dormant_alloc(m, "weights", 8 * MiB, &spare), 0);
	cr_assert_eq(dormant_alloc(m, "weights", MiB, &torch_spare), 0);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	cr_assert_eq(residue(m).state, DORMANT_RESIDUE_CHECKPOINTED);

	/* the server's reads answer from memory */
	s = stats(m);
	cr_expect_eq(s->device_count, 1);
	cr_expect_gt(s->devices[0].total_bytes, 0, "read from outside the process");
	/* no allocation, no warm-up, no occupation: each would call the device */
	cr_expect_eq(dormant_alloc(m, "weights", MiB, &more), -EBUSY);
	cr_expect_eq(dormant_alloc(m, "fresh", MiB, &more), -EBUSY);
	cr_expect(strstr(dormant_last_error(), "checkpointed"), "%s", dormant_last_error());
	cr_expect_eq(dormant_alloc_on(m, "fresh", MiB, 0, &more), -EBUSY);
	cr_expect_null(more);
	cr_expect_eq(dormant_warm_up(m), -EBUSY);
	cr_expect_eq(dormant_debug_occupy(m, 0, MiB), -EBUSY);
	/* a free is taken now and done after the restore */
	cr_expect_eq(dormant_free(m, spare), 0);
	cr_expect_eq(residue(m).calls_while_checkpointed, 0);
	/* PyTorch's too (a pool destroyed at interpreter exit): no
	 * synchronize, which crashed in the CUDA driver */
	cr_assert_eq(dormant_torch_set_manager(m), 0);
	dormant_torch_free(torch_spare, MiB, 0, NULL);
	cr_expect_eq(residue(m).calls_while_checkpointed, 0);
	dormant_torch_set_manager(NULL);

	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_expect(holds(m, weights, 24 * MiB, 1));
	cr_expect_eq(residue(m).calls_while_checkpointed, 0);
	expect_no_device_leak(m); /* the freed range went back after the restore */
	cr_expect_eq(dormant_free(m, spare), -EINVAL, "freed once");
	cr_expect_eq(dormant_free(m, torch_spare), -EINVAL, "PyTorch's free was taken");
	dormant_destroy(m);
}

/* A free while checkpointed waits for the restore; the wake that restores
 * ends it with the rest of what it no longer needs. */
Test(residue, a_free_while_checkpointed_gives_its_copy_back_at_the_wake)
{
	struct dormant *m = checkpointing("host_mode=release");
	void *weights, *grads, *spare;
	uint64_t held;

	trainer(m, &weights, &grads);
	cr_assert_eq(dormant_alloc(m, "weights", 8 * MiB, &spare), 0);
	fill(m, spare, 8 * MiB, 3);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_assert_eq(residue(m).state, DORMANT_RESIDUE_CHECKPOINTED);
	held = stats(m)->host_bytes;
	cr_expect_geq(held, 32 * MiB, "the weights' copies and the spare's");

	cr_expect_eq(dormant_free(m, spare), 0);
	cr_expect_eq(stats(m)->host_bytes, held, "its copy stays until the restore");
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_expect(holds(m, weights, 24 * MiB, 1));
	cr_expect_eq(host_bytes_settled(m, 0), 0,
		     "release mode: every copy given back, the freed spare's too");
	cr_expect_eq(residue(m).calls_while_checkpointed, 0);
	dormant_destroy(m);
}

Test(residue, a_failed_checkpoint_leaves_the_sleep_done_and_the_next_sleep_retries)
{
	struct dormant *m = checkpointing(NULL);
	struct dormant_residue_stats r;
	void *weights, *grads;

	trainer(m, &weights, &grads);
	cr_assert_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_CHECKPOINT, 1, -EIO, false), 0);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "the sleep itself succeeded");
	expect_all(m, DORMANT_ASLEEP);
	r = residue(m);
	cr_expect_eq(r.state, DORMANT_RESIDUE_RESIDENT, "the residue stays");
	cr_expect_eq(r.checkpoint_failures, 1);
	cr_expect_eq(r.last_result, -EIO);
	cr_expect(strstr(r.last_error, "injected"), "%s", r.last_error);
	cr_expect_eq(residue(m).calls_while_checkpointed, 0);
	/* asleep already: sleeping again tries the checkpoint again */
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	r = residue(m);
	cr_expect_eq(r.state, DORMANT_RESIDUE_CHECKPOINTED);
	cr_expect_eq(r.checkpoints, 1);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	cr_expect(holds(m, weights, 24 * MiB, 1));
	dormant_destroy(m);
}

Test(residue, a_checkpoint_that_does_not_return_is_stopped_and_the_wake_restores)
{
	/* the request's timeout: the lock's (1 ms) and 5 s at least */
	struct dormant *m = checkpointing("residue_lock_timeout_ms=1,residue_timeout_ms=1000");
	struct dormant_residue_stats r;
	void *weights, *grads;
	int helper;

	trainer(m, &weights, &grads);
	cr_assert_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_CHECKPOINT, 1, -ETIMEDOUT, false),
		     0);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0, "the sleep itself succeeded");
	expect_all(m, DORMANT_ASLEEP);
	r = residue(m);
	cr_expect_eq(r.last_result, -ETIMEDOUT);
	cr_expect(strstr(r.last_error, "did not answer"), "%s", r.last_error);
	cr_expect_eq(r.checkpoint_failures, 1);
	cr_expect_eq(r.helper_pid, 0, "the hung helper was stopped");
	/* the driver may have done part of it: the wake restores whatever is there */
	cr_expect_eq(r.state, DORMANT_RESIDUE_CHECKPOINTED);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	r = residue(m);
	cr_expect_eq(r.state, DORMANT_RESIDUE_RESIDENT);
	cr_expect_eq(r.helper_starts, 2);
	helper = r.helper_pid;
	cr_expect_gt(helper, 0);
	cr_expect(holds(m, weights, 24 * MiB, 1));
	cr_expect_eq(r.calls_while_checkpointed, 0);
	dormant_destroy(m);
	cr_expect(reaped(helper));
}

Test(residue, a_failed_restore_fails_the_wake_and_the_next_wake_retries)
{
	struct dormant *m = checkpointing(NULL);
	struct dormant_report rep;
	struct dormant_residue_stats r;
	void *weights, *grads;

	trainer(m, &weights, &grads);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	cr_assert_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_RESTORE, 1, -EIO, false), 0);
	cr_expect_eq(dormant_wake(m, NULL, &rep), -EIO);
	cr_expect(strstr(rep.error, "restoring"), "%s", rep.error);
	expect_all(m, DORMANT_ASLEEP);
	r = residue(m);
	cr_expect_eq(r.state, DORMANT_RESIDUE_CHECKPOINTED);
	cr_expect_eq(r.restore_failures, 1);
	cr_expect_eq(r.calls_while_checkpointed, 0, "the wake stopped before any device call");
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	cr_expect_eq(residue(m).state, DORMANT_RESIDUE_RESIDENT);
	cr_expect(holds(m, weights, 24 * MiB, 1), "the host copies were intact");
	cr_expect_eq(stats(m)->wakes_failed, 1);
	dormant_destroy(m);
}

Test(residue, a_restore_out_of_memory_is_stuck_for_good)
{
	struct dormant *m = checkpointing(NULL);
	struct dormant_residue_stats r;
	void *weights, *grads;

	if (!on_host(m)) {
		/* on a GPU the process would stay checkpointed to its end */
		dormant_destroy(m);
		cr_skip_test("the model of a stuck restore: host backend only");
	}
	trainer(m, &weights, &grads);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	cr_assert_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_RESTORE, 1, -ENOMEM, false), 0);
	cr_expect_eq(dormant_wake(m, NULL, NULL), -EPERM);
	r = residue(m);
	cr_expect_eq(r.state, DORMANT_RESIDUE_STUCK);
	cr_expect(strstr(r.reason, "only ending the process"), "%s", r.reason);
	cr_expect_not(stats(m)->healthy);
	cr_expect(strstr(stats(m)->health_error, "restore"), "%s", stats(m)->health_error);
	/* every later wake fails at once, without asking the driver again */
	cr_expect_eq(dormant_wake(m, NULL, NULL), -EPERM);
	cr_expect_eq(residue(m).restore_failures, 1);
	expect_all(m, DORMANT_ASLEEP);
	cr_expect_eq(residue(m).calls_while_checkpointed, 0);
	dormant_destroy(m); /* leaves the device to the process's end; must not hang */
}

Test(residue, the_driver_without_a_checkpoint_makes_the_mode_unavailable_once)
{
	struct dormant *m = checkpointing(NULL);
	struct dormant_residue_stats r;
	void *weights, *grads;

	trainer(m, &weights, &grads);
	cr_assert_eq(dormant_debug_inject_fault(m, DORMANT_FAULT_CHECKPOINT, 1, -ENOTSUP, false),
		     0);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	r = residue(m);
	cr_expect_eq(r.state, DORMANT_RESIDUE_UNAVAILABLE);
	cr_expect(strstr(r.reason, "injected"), "%s", r.reason);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	r = residue(m);
	cr_expect_eq(r.state, DORMANT_RESIDUE_UNAVAILABLE, "not tried again");
	cr_expect_eq(dormant_debug_op_count(m, DORMANT_FAULT_CHECKPOINT), 1);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	cr_expect(holds(m, weights, 24 * MiB, 1));
	dormant_destroy(m);
}

Test(residue, a_wake_without_room_for_the_residue_answers_before_the_restore)
{
	/* 320 MiB devices: the residue (64), tag a (128), tag b (64) */
	struct dormant *m = checkpointing("host_device_bytes=320MiB");

	if (!on_host(m)) {
		dormant_destroy(m);
		cr_skip_test("a full device is the simulated device's (host_device_bytes)");
	}
	const char *a_tag[] = { "a", NULL };
	const char *b_tag[] = { "b", NULL };
	struct dormant_residue_stats r;
	void *a, *b;

	cr_assert_eq(dormant_alloc(m, "a", 128 * MiB, &a), 0);
	cr_assert_eq(dormant_alloc(m, "b", 64 * MiB, &b), 0);
	fill(m, a, 128 * MiB, 3);
	fill(m, b, 64 * MiB, 4);
	cr_assert_eq(dormant_sleep(m, a_tag, NULL), 0);
	/* another process takes what a gave back */
	cr_assert_eq(dormant_debug_occupy(m, 0, 160 * MiB), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_sleep(m, b_tag, NULL), 0);
	cr_assert_eq(residue(m).state, DORMANT_RESIDUE_CHECKPOINTED);
	/* 160 MiB free; the residue and both tags need 256 */
	cr_expect_eq(dormant_wake(m, NULL, NULL), -ENOMEM);
	cr_expect(strstr(dormant_last_error(), "nothing was tried"), "%s", dormant_last_error());
	r = residue(m);
	cr_expect_eq(r.restores + r.restore_failures, 0, "the restore was not tried");
	cr_expect_eq(r.state, DORMANT_RESIDUE_CHECKPOINTED);
	expect_all(m, DORMANT_ASLEEP);
	/* the residue and b fit (128 MiB) */
	cr_assert_eq(dormant_wake(m, b_tag, NULL), 0, "%s", dormant_last_error());
	cr_expect(holds(m, b, 64 * MiB, 4));
	cr_assert_eq(dormant_debug_occupy(m, 0, 0), 0);
	cr_assert_eq(dormant_wake(m, a_tag, NULL), 0, "%s", dormant_last_error());
	cr_expect(holds(m, a, 128 * MiB, 3));
	cr_expect_eq(residue(m).calls_while_checkpointed, 0);
	dormant_destroy(m);
}

Test(residue, a_helper_that_dies_is_replaced_and_reaped)
{
	struct dormant *m = checkpointing(NULL);
	struct dormant_residue_stats r;
	void *weights, *grads;
	int first, second;

	trainer(m, &weights, &grads);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	first = residue(m).helper_pid;
	cr_assert_gt(first, 0);
	/* dies while the process is checkpointed: a new one restores it */
	cr_assert_eq(kill(first, SIGKILL), 0);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0, "%s", dormant_last_error());
	r = residue(m);
	cr_expect_eq(r.helper_starts, 2);
	cr_expect_eq(r.restores, 1);
	cr_expect(holds(m, weights, 24 * MiB, 1));
	cr_expect(reaped(first), "no zombie of the dead helper");

	/* dies while idle and awake: stats reap it */
	second = r.helper_pid;
	cr_assert_gt(second, 0);
	cr_assert_neq(second, first);
	cr_assert_eq(kill(second, SIGKILL), 0);
	for (int i = 0; i < 500 && residue(m).helper_pid; i++)
		usleep(10000);
	cr_expect_eq(residue(m).helper_pid, 0);
	cr_expect(reaped(second));
	/* and the next sleep starts another */
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	cr_expect_eq(residue(m).state, DORMANT_RESIDUE_CHECKPOINTED);
	cr_expect_eq(residue(m).helper_starts, 3);
	cr_assert_eq(dormant_wake(m, NULL, NULL), 0);
	dormant_destroy(m);
}

Test(residue, destroy_while_checkpointed_restores_and_reaps_the_helper)
{
	struct dormant *m = checkpointing(NULL);
	void *weights, *grads;
	int helper;

	trainer(m, &weights, &grads);
	cr_assert_eq(dormant_sleep(m, NULL, NULL), 0);
	helper = residue(m).helper_pid;
	cr_assert_gt(helper, 0);
	dormant_destroy(m);
	cr_expect(reaped(helper), "the helper exited and was reaped");
}

/* A trainer process killed while asleep: its helper (now an orphan, reparented
 * to this test, a subreaper) exits on its own. */
Test(residue, the_helper_dies_with_its_trainer)
{
	int fds[2], status, helper = 0;
	pid_t trainer_pid;

	cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
	cr_assert_eq(pipe(fds), 0);
	trainer_pid = fork();
	cr_assert_geq(trainer_pid, 0);
	if (trainer_pid == 0) {
		struct dormant *m = checkpointing(NULL);
		void *weights, *grads;
		int pid;

		close(fds[0]);
		trainer(m, &weights, &grads);
		if (dormant_sleep(m, NULL, NULL) < 0)
			_exit(2);
		pid = residue(m).helper_pid;
		if (write(fds[1], &pid, sizeof(pid)) != sizeof(pid))
			_exit(3);
		pause(); /* killed here, asleep and checkpointed */
		_exit(4);
	}
	close(fds[1]);
	cr_assert_eq(read(fds[0], &helper, sizeof(helper)), (ssize_t)sizeof(helper));
	cr_assert_gt(helper, 0);
	cr_assert_eq(kill(trainer_pid, SIGKILL), 0);
	cr_assert_eq(waitpid(trainer_pid, &status, 0), trainer_pid);
	/* the orphaned helper comes to us: it must exit, not wait forever */
	for (int i = 0; i < 500; i++) {
		if (waitpid(helper, &status, WNOHANG) == helper)
			break;
		usleep(10000);
	}
	cr_expect(reaped(helper), "the helper outlived its trainer");
	if (!reaped(helper))
		kill(helper, SIGKILL);
}

Test(residue, options_and_names)
{
	enum dormant_residue_mode mode = DORMANT_RESIDUE_DEFAULT;
	struct dormant *m = checkpointing(NULL);
	char value[64];

	cr_expect_gt(dormant_option_value(m, "residue", value, sizeof(value)), 0);
	cr_expect_str_eq(value, "checkpoint");
	cr_expect_gt(dormant_option_value(m, "residue_lock_timeout_ms", value, sizeof(value)), 0);
	cr_expect_str_eq(value, "10000");
	cr_expect_eq(dormant_residue_mode_from_name("keep", &mode), 0);
	cr_expect_eq(mode, DORMANT_RESIDUE_KEEP);
	cr_expect_eq(dormant_residue_mode_from_name("freeze", &mode), -EINVAL);
	cr_expect_eq(mode, DORMANT_RESIDUE_KEEP, "unchanged on failure");
	cr_expect_str_eq(dormant_residue_state_name(DORMANT_RESIDUE_STUCK), "stuck");
	cr_expect_null(dormant_residue_state_name((enum dormant_residue_state)9));
	cr_expect_eq(dormant_residue_stats_get(NULL, NULL), -EINVAL);
	dormant_destroy(m);
}
