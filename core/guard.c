/* SPDX-License-Identifier: MIT */
/*
 * The trainer guard and the transition hooks.
 *
 * A training step enters the guard; a sleep closes the gate (new steps wait)
 * and waits, bounded, for the running steps to leave. The gate opens again
 * when every tag is awake and no transition holds it, so a step that starts
 * while the memory is asleep waits for the wake (and its hooks).
 */
#include <errno.h>
#include <stdio.h>
#include <time.h>

#include "manager.h"

bool guard_open(struct dormant *m)
{
	return !m->gate_hold && manager_all_awake(m);
}

void guard_notify(struct dormant *m)
{
	pthread_cond_broadcast(&m->guard_cond);
}

static void deadline_after(struct timespec *ts, int timeout_ms)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += timeout_ms / 1000;
	ts->tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

int guard_close(struct dormant *m, double *ret_waited_s)
{
	double start = now_monotonic_s();
	struct timespec deadline;
	int r = 0;

	pthread_mutex_lock(&m->lock);
	m->gate_hold = true;
	if (m->guard_timeout_ms >= 0)
		deadline_after(&deadline, m->guard_timeout_ms);
	while (m->steps_running > 0 && r == 0) {
		if (m->guard_timeout_ms < 0)
			pthread_cond_wait(&m->guard_cond, &m->lock);
		else if (pthread_cond_timedwait(&m->guard_cond, &m->lock, &deadline) == ETIMEDOUT &&
			 m->steps_running > 0)
			r = error_set(-EBUSY,
				      "%u training step(s) still running after %d ms (the guard)",
				      m->steps_running, m->guard_timeout_ms);
	}
	if (r < 0) {
		m->gate_hold = false;
		guard_notify(m);
	}
	pthread_mutex_unlock(&m->lock);
	*ret_waited_s = now_monotonic_s() - start;
	return r;
}

void guard_release(struct dormant *m)
{
	m->gate_hold = false;
	guard_notify(m);
}

DORMANT_EXPORT int dormant_step_enter(struct dormant *m, int timeout_ms)
{
	struct timespec deadline;
	int r = 0;

	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	if (timeout_ms > 0)
		deadline_after(&deadline, timeout_ms);
	pthread_mutex_lock(&m->lock);
	while (!guard_open(m) && r == 0) {
		if (timeout_ms == 0)
			r = -ETIMEDOUT;
		else if (timeout_ms < 0)
			pthread_cond_wait(&m->guard_cond, &m->lock);
		else if (pthread_cond_timedwait(&m->guard_cond, &m->lock, &deadline) == ETIMEDOUT &&
			 !guard_open(m))
			r = -ETIMEDOUT;
	}
	if (r == 0)
		m->steps_running++;
	pthread_mutex_unlock(&m->lock);
	if (r < 0)
		return error_set(r, "memory is not awake after %d ms", timeout_ms);
	return 0;
}

DORMANT_EXPORT int dormant_step_leave(struct dormant *m)
{
	int r = 0;

	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	pthread_mutex_lock(&m->lock);
	if (m->steps_running == 0)
		r = error_set(-EINVAL, "no training step is inside the guard");
	else if (--m->steps_running == 0)
		guard_notify(m);
	pthread_mutex_unlock(&m->lock);
	return r;
}

DORMANT_EXPORT int dormant_hook_add(struct dormant *m, enum dormant_hook_point point,
				    dormant_hook_fn fn, void *userdata)
{
	int r;

	if (!m || !fn)
		return error_set(-EINVAL, "manager or hook is NULL");
	if ((unsigned)point > DORMANT_HOOK_BEFORE_REBUILD)
		return error_set(-EINVAL, "unknown hook point %d", (int)point);
	pthread_mutex_lock(&m->lock);
	if (m->hook_count == HOOKS_MAX) {
		r = error_set(-ENOSPC, "too many hooks (at most %d)", HOOKS_MAX);
	} else {
		r = m->next_hook_id++;
		m->hooks[m->hook_count++] = (struct hook){ .id = r, .point = point, .fn = fn,
							   .userdata = userdata };
	}
	pthread_mutex_unlock(&m->lock);
	return r;
}

DORMANT_EXPORT int dormant_hook_remove(struct dormant *m, int id)
{
	int r = -ENOENT;

	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	pthread_mutex_lock(&m->lock);
	for (size_t i = 0; i < m->hook_count; i++) {
		if (m->hooks[i].id != id)
			continue;
		for (size_t j = i + 1; j < m->hook_count; j++)
			m->hooks[j - 1] = m->hooks[j];
		m->hook_count--;
		r = 0;
		break;
	}
	pthread_mutex_unlock(&m->lock);
	if (r < 0)
		return error_set(r, "no hook %d", id);
	return 0;
}

DORMANT_EXPORT int dormant_hook_set_error(const char *message)
{
	if (!message)
		return error_set(-EINVAL, "message is NULL");
	/* the thread's error buffer is what a failing transition reads */
	error_set(-ECANCELED, "%s", message);
	return 0;
}

/* What a hook's failure does at each point: the failed transition's words. */
static const char *const hook_failure[] = {
	[DORMANT_HOOK_BEFORE_SLEEP] = "a before-sleep hook cancelled the sleep",
	[DORMANT_HOOK_BEFORE_WAKE] = "a before-wake hook cancelled the wake",
	[DORMANT_HOOK_AFTER_COPIES] = "an after-copies hook failed",
	[DORMANT_HOOK_BEFORE_REBUILD] = "a before-rebuild hook failed",
};

int hooks_run(struct dormant *m, enum dormant_hook_point point, double *seconds)
{
	const char *failure = (size_t)point < ARRAY_SIZE(hook_failure) ? hook_failure[point] : NULL;
	double start = now_monotonic_s();
	struct hook hooks[HOOKS_MAX];
	char why[DORMANT_ERROR_MAX];
	size_t count = 0;
	int r = 0;

	pthread_mutex_lock(&m->lock);
	for (size_t i = 0; i < m->hook_count; i++)
		if (m->hooks[i].point == point)
			hooks[count++] = m->hooks[i];
	pthread_mutex_unlock(&m->lock);
	if (failure)
		error_clear(); /* what a failing hook says (dormant_hook_set_error()) */
	for (size_t i = 0; i < count && r == 0; i++)
		r = hooks[i].fn(m, point, hooks[i].userdata);
	if (seconds)
		*seconds += now_monotonic_s() - start;
	if (r == 0 || !failure)
		return r;
	snprintf(why, sizeof(why), "%s", dormant_last_error());
	return error_set(-ECANCELED, "%s (it returned %d)%s%s", failure, r, why[0] ? ": " : "",
			 why);
}
