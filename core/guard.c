/* SPDX-License-Identifier: MIT */
/*
 * The trainer guard.
 *
 * A training step enters the guard; a sleep closes the gate (new steps wait)
 * and waits, bounded, for the running steps to leave. The gate opens again
 * when every tag is awake and no transition holds it, so a step that starts
 * while the memory is asleep waits for the wake (and its hooks).
 */
#include <errno.h>
#include <time.h>

#include "manager.h"

bool guard_open(struct dormant *m)
{
	for (size_t i = 0; i < m->tag_count; i++)
		if (m->tags[i]->state != DORMANT_AWAKE)
			return false;
	return !m->gate_hold;
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
