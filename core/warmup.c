/* SPDX-License-Identifier: MIT */
#include "warmup.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "alloc.h"
#include "manager_state.h"
#include "prepare.h"

/* ---- host copies (retain and reclaimable modes) --------------------------- */

/* The size of the host copy a sleep would give chunk c of a now (its plan's
 * kept bytes). Called with m->lock. 0: nothing to keep, or no memory to
 * plan with (the sleep then decides). */
static size_t kept_now(struct alloc *a, struct chunk *c)
{
	size_t offset = c->va - (uintptr_t)a->ptr;
	size_t used = a->is_slab ? slab_space_used_end(&a->space) : a->size;
	size_t data = used > offset ? MIN(c->size, used - offset) : 0;
	struct copy_plan plan = { 0 };
	size_t kept;

	marks_normalize(&a->marks);
	if (plan_compute(&plan, offset, data, a->is_slab ? a->space.free : NULL,
			 a->is_slab ? a->space.free_count : 0, &a->marks) < 0)
		return 0;
	kept = plan.kept;
	plan_finish(&plan);
	return kept;
}

/* The next awake kept chunk without a host copy that fits, or false.
 * Called with m->lock. */
static bool next_chunk(struct dormant *m, struct alloc **ret_alloc, struct chunk **ret_chunk,
		       size_t *ret_kept)
{
	for (size_t i = 0; i < m->tag_count; i++) {
		if (m->tags[i]->state != DORMANT_AWAKE)
			continue;
		for (struct alloc *a = m->tags[i]->allocs; a; a = a->next) {
			if (alloc_policy(a) != DORMANT_KEEP || a->doomed)
				continue;
			for (size_t k = 0; k < a->chunk_count; k++) {
				struct chunk *c = &a->chunks[k];
				size_t kept;

				/* a reclaimable or unpinned buffer: the sleep's */
				if (!c->mapped || c->host.reclaimable ||
				    (c->host.ptr && !c->host.pin_piece && m->engine.pin_host))
					continue;
				kept = kept_now(a, c);
				if (!kept || prep_host_fits(&c->host, kept))
					continue;
				*ret_alloc = a;
				*ret_chunk = c;
				*ret_kept = kept;
				return true;
			}
		}
	}
	return false;
}

/* Prepare the host copies of awake kept chunks, one chunk at a time, until
 * none is left, a transition asks to stop, or a step fails: pinned (retain
 * mode, counted in host_bytes) or reclaimable (faulted in and handed to the
 * kernel, not counted: reclaimable mode's host copies while awake; pinned
 * while reclaimable_pinned_bytes has room, as a wake leaves them). Called
 * with m->lock, which it drops around each chunk's work. */
static int host_copies(struct dormant *m, bool reclaimable)
{
	struct warmup *w = &m->warmup;

	for (;;) {
		struct hostbuf fresh = { 0 }, old = { 0 };
		struct alloc *a;
		struct chunk *c;
		size_t kept, room;
		char tag[DORMANT_TAG_MAX + 1];
		bool attached = false, gone, pinned_awake;
		int r;

		if (atomic_load(&w->cancel))
			return error_set(-ECANCELED, "a sleep or wake stopped the warm-up");
		if (!next_chunk(m, &a, &c, &kept))
			return 0;
		/* a free meanwhile waits for us (alloc_release(): doomed) */
		a->in_transition = true;
		memcpy(tag, a->tag->name, sizeof(tag));
		pthread_mutex_unlock(&m->lock);
		log_write(&m->log, DORMANT_LOG_DEBUG,
			  "warm-up: preparing the %zu-byte host copy of a chunk of tag '%s'", kept,
			  tag);
		room = round_up(kept, 4096); /* the size of the buffer prepared */
		pinned_awake = reclaimable && m->engine.pin_host &&
			       engine_pinned_awake_reserve(&m->engine, room);
		r = prep_host_copy(&m->engine, kept, reclaimable && !pinned_awake, &fresh);
		pthread_mutex_lock(&m->lock);
		a->in_transition = false;
		gone = a->doomed;
		if (r == 0 && !gone && c->mapped && a->tag->state == DORMANT_AWAKE &&
		    alloc_policy(a) == DORMANT_KEEP && !c->host.reclaimable) {
			/* a copy that no longer fits (the slab grew) gives way */
			if (c->host.ptr) {
				old = c->host;
				engine_account_host(&a->tag->held, -(int64_t)old.size);
				c->retained = false;
				if (c->pinned_awake)
					engine_pinned_awake_unreserve(&m->engine, old.size);
			}
			c->host = fresh;
			c->host_valid = false;
			c->pinned_awake = pinned_awake;
			if (!fresh.reclaimable) /* reclaimable: held by the kernel's leave */
				engine_account_host(&a->tag->held, (int64_t)fresh.size);
			w->stats.host_bytes += fresh.size;
			attached = true;
		}
		if (pinned_awake && !attached)
			engine_pinned_awake_unreserve(&m->engine, room);
		if (gone) /* freed meanwhile: its free was left to us */
			alloc_destroy(m, a);
		if (r < 0)
			return error_prefix(r, "warm-up: the host copy of tag '%s'", tag);
		if (!attached || old.ptr) {
			pthread_mutex_unlock(&m->lock);
			hostbuf_free(m->backend, attached ? &old : &fresh);
			pthread_mutex_lock(&m->lock);
		}
		/* nothing else changes an awake chunk: never loop on one */
		if (!attached && !gone)
			return error_set(-EAGAIN, "warm-up: tag '%s' changed meanwhile", tag);
	}
}

/* ---- a run ----------------------------------------------------------------- */

/* One run, on the calling thread; no transition runs, none is running
 * (m->lock held, dropped while it works). */
static int run_locked(struct dormant *m)
{
	struct warmup *w = &m->warmup;
	bool devices[DORMANT_DEVICES_MAX];
	double start = now_monotonic_s();
	enum dormant_host_mode mode = atomic_load(&m->host_mode);
	bool host = w->mode != WARMUP_DEVICE &&
		    (mode == DORMANT_HOST_RETAIN || mode == DORMANT_HOST_RECLAIMABLE);
	int r = 0;

	w->running = true;
	w->pending = false;
	atomic_store(&w->cancel, false);
	for (int d = 0; d < DORMANT_DEVICES_MAX; d++)
		devices[d] = atomic_load(&m->engine.device_bytes[d]) > 0;
	pthread_mutex_unlock(&m->lock);
	error_clear();
	for (int d = 0; d < DORMANT_DEVICES_MAX && r == 0; d++) {
		if (!devices[d])
			continue;
		if (atomic_load(&w->cancel))
			r = error_set(-ECANCELED, "a sleep or wake stopped the warm-up");
		else
			r = engine_device_setup(&m->engine, d);
		if (r < 0 && r != -ECANCELED)
			error_prefix(r, "warm-up: device %d", d);
	}
	pthread_mutex_lock(&m->lock);
	if (r == 0 && host)
		r = host_copies(m, mode == DORMANT_HOST_RECLAIMABLE);
	w->running = false;
	w->stats.runs++;
	w->stats.seconds_total += now_monotonic_s() - start;
	w->stats.last_result = r;
	w->stats.last_error[0] = '\0';
	if (r == -ECANCELED) {
		w->stats.cancelled++;
		w->pending = true; /* what it did not get to: after the transition */
	} else if (r < 0) {
		w->stats.failures++;
	}
	if (r < 0)
		snprintf(w->stats.last_error, sizeof(w->stats.last_error), "%s",
			 dormant_last_error());
	pthread_cond_broadcast(&w->cond);
	return r;
}

static void deadline_at(struct timespec *ts, double when_s)
{
	double now = now_monotonic_s();
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	when_s = when_s - now + (double)t.tv_sec + (double)t.tv_nsec / 1e9;
	ts->tv_sec = (time_t)when_s;
	ts->tv_nsec = (long)((when_s - (double)ts->tv_sec) * 1e9);
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

static void *warmup_main(void *arg)
{
	struct dormant *m = arg;
	struct warmup *w = &m->warmup;

	pthread_mutex_lock(&m->lock);
	while (!w->stopping) {
		double due = w->last_alloc_s + w->settle_ms / 1e3;
		struct timespec ts;

		/* nothing touches a device while the process is checkpointed */
		if (!w->pending || m->transition_running || w->running ||
		    residue_checkpointed(&m->residue)) {
			pthread_cond_wait(&w->cond, &m->lock);
			continue;
		}
		if (now_monotonic_s() < due) {
			deadline_at(&ts, due);
			pthread_cond_timedwait(&w->cond, &m->lock, &ts);
			continue;
		}
		if (run_locked(m) < 0 && w->stats.last_result != -ECANCELED)
			log_write(&m->log, DORMANT_LOG_INFO, "%s (the next sleep does it itself)",
				  w->stats.last_error);
	}
	pthread_mutex_unlock(&m->lock);
	return NULL;
}

/* ---- the manager's side ---------------------------------------------------- */

void warmup_init(struct dormant *m, enum warmup_mode mode, int settle_ms)
{
	struct warmup *w = &m->warmup;
	pthread_condattr_t attr;

	w->mode = mode;
	w->settle_ms = settle_ms;
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&w->cond, &attr);
	pthread_condattr_destroy(&attr);
	if (mode == WARMUP_OFF)
		return;
	w->thread_started = pthread_create(&w->thread, NULL, warmup_main, m) == 0;
	if (!w->thread_started)
		log_write(&m->log, DORMANT_LOG_WARNING,
			  "no warm-up thread: the first sleep sets up what it needs");
}

void warmup_finish(struct dormant *m)
{
	struct warmup *w = &m->warmup;

	pthread_mutex_lock(&m->lock);
	w->stopping = true;
	atomic_store(&w->cancel, true);
	pthread_cond_broadcast(&w->cond);
	while (w->running) /* a dormant_warm_up() caller's run */
		pthread_cond_wait(&w->cond, &m->lock);
	pthread_mutex_unlock(&m->lock);
	if (w->thread_started)
		pthread_join(w->thread, NULL);
	w->thread_started = false;
	pthread_cond_destroy(&w->cond);
}

void warmup_note_alloc(struct dormant *m)
{
	struct warmup *w = &m->warmup;

	w->last_alloc_s = now_monotonic_s();
	if (!w->pending) {
		w->pending = true;
		if (w->thread_started)
			pthread_cond_broadcast(&w->cond);
	}
}

void warmup_stats_get(struct dormant *m, struct dormant_warmup_stats *ret)
{
	struct warmup *w = &m->warmup;

	*ret = w->stats;
	if (w->running)
		ret->state = DORMANT_WARMUP_RUNNING;
	else if (w->mode == WARMUP_OFF || !w->thread_started)
		ret->state = DORMANT_WARMUP_OFF;
	else
		ret->state = w->pending ? DORMANT_WARMUP_PENDING : DORMANT_WARMUP_IDLE;
	ret->device_setups = atomic_load(&m->engine.device_setups);
}

DORMANT_EXPORT const char *dormant_warmup_state_name(enum dormant_warmup_state state)
{
	switch (state) {
	case DORMANT_WARMUP_OFF:
		return "off";
	case DORMANT_WARMUP_IDLE:
		return "idle";
	case DORMANT_WARMUP_PENDING:
		return "pending";
	case DORMANT_WARMUP_RUNNING:
		return "running";
	}
	return "unknown";
}

DORMANT_EXPORT int dormant_warm_up(struct dormant *m)
{
	struct warmup *w;
	int r;

	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	w = &m->warmup;
	pthread_mutex_lock(&m->lock);
	while (w->running && !m->transition_running && !w->stopping)
		pthread_cond_wait(&w->cond, &m->lock); /* the background run */
	if (m->transition_running || w->running) {
		pthread_mutex_unlock(&m->lock);
		return error_set(-EBUSY, "a sleep or wake is running");
	}
	if (residue_checkpointed(&m->residue)) {
		pthread_mutex_unlock(&m->lock);
		return error_set(-EBUSY, "the process's device state is checkpointed (residue "
					 "mode); wake first");
	}
	r = run_locked(m);
	pthread_mutex_unlock(&m->lock);
	/* run_locked() left the message of a failure */
	return r;
}
