/* SPDX-License-Identifier: MIT */
/*
 * What a transition keeps out of the memory it moves: training steps (the
 * trainer guard) and the warm-up.
 *
 * A training step enters the guard; a sleep closes the gate (new steps wait)
 * and waits, bounded, for the running steps to leave. The gate opens again
 * when every tag is awake and no transition holds it, so a step that starts
 * while the memory is asleep waits for the wake (and its hooks).
 *
 * A warm-up run (warmup.h) holds the engine: a transition that starts asks
 * it to stop at its next chunk and waits (the wait is the transition's
 * warmup_wait_s); once the transition ends the warm-up may run again.
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

double guard_warmup_stop(struct dormant *m)
{
	struct warmup *w = &m->warmup;
	double start;

	if (!w->running)
		return 0;
	start = now_monotonic_s();
	atomic_store(&w->cancel, true);
	/* transition_running is set: no run starts while the lock is away */
	pthread_mutex_unlock(&m->lock);
	log_write(&m->log, DORMANT_LOG_DEBUG, "waiting for the warm-up to stop");
	pthread_mutex_lock(&m->lock);
	while (w->running)
		pthread_cond_wait(&w->cond, &m->lock);
	return now_monotonic_s() - start;
}

void guard_warmup_resume(struct dormant *m)
{
	if (m->warmup.pending && m->warmup.thread_started)
		pthread_cond_broadcast(&m->warmup.cond);
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
