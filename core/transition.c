/* SPDX-License-Identifier: MIT */
/*
 * The state machine: awake -> sleeping -> asleep -> waking -> awake, per tag.
 *
 * One transition runs at a time (a second gets -EBUSY). A transition picks
 * the tags it names that are not already in the target state, holds the
 * guard, runs the hooks, marks the tags sleeping or waking and hands their
 * chunks to the transfer engine without holding the manager lock, so that
 * alloc, free and stats go on meanwhile. Then it settles the states:
 *  - sleep ok: asleep; sleep failed: awake again (rolled back), or asleep if
 *    the rollback itself could not finish (the data is safe on the host and
 *    a wake completes it);
 *  - wake ok: awake; wake failed: asleep, host copies intact, retry works.
 *
 * Residue mode checkpoint (residue.h) brackets them: a sleep that leaves
 * every tag asleep ends, after its after-sleep hooks, with the checkpoint of
 * the process's device state; a wake starts, before its before-wake hooks,
 * with the restore. A checkpoint that fails leaves the sleep done; a restore
 * that fails fails the wake, with nothing moved.
 *
 * transition() reads as its steps: transition_start() under the lock, the
 * guard, transition_move() (the restore, the hooks, the engine's copies,
 * settle(), the after-hooks) and transition_end() (the checkpoint and the
 * residue's part of the report, the gate, the warm-up, the report's last
 * fields, the log). Everything it learned goes into the report,
 * the residue's part and the tags' states included. The modules below it
 * (residue, guard, engine) report; this file logs.
 *
 * The hooks are the transition's own points (before and after each, around
 * the copies and the rebuilds): hooks.c keeps them and runs them, and the
 * rebuild callbacks.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "manager.h"

struct transition {
	bool sleep;
	enum dormant_state target, via;
	struct tag *tags[DORMANT_TAGS_MAX]; /* the ones that change */
	size_t tag_count;
	struct alloc **allocs;              /* marked in_transition */
	size_t alloc_count;
	struct engine_item *items;
	size_t item_count;
	struct engine_totals totals;
	struct dormant_report *report;
	struct tag *named[DORMANT_TAGS_MAX]; /* report->tags[i]'s tag (tags stay) */
	bool copies_done;                   /* sleep: past engine_sleep() */
	double warmup_wait_s;               /* waiting for a warm-up to stop */
	double start;                       /* now_monotonic_s() at the call */
	bool running;                       /* it holds transition_running */
	bool guard_failed;                  /* sleep: steps did not leave in time */
	bool settled;                       /* settle() ran */
	bool restored;                      /* wake: it restored the residue */
	/* what was freed meanwhile and could not be given back: logged at the end */
	struct alloc_failures freed;
	/* a rolled-back sleep's rebuild that failed too: logged at the end */
	char rebuild_error[DORMANT_ERROR_MAX];
};

static const char *kind(const struct transition *t)
{
	return t->sleep ? "sleep" : "wake";
}

/* Pick the named tags (all if names is NULL) into the report; the ones not
 * yet in the target state go to t->tags. Called with m->lock. */
static int select_tags(struct dormant *m, const char *const *names, struct transition *t)
{
	struct dormant_report *rep = t->report;
	struct tag *picked[DORMANT_TAGS_MAX];
	size_t count = 0;
	int r;

	if (!names) {
		memcpy(picked, m->tags, m->tag_count * sizeof(picked[0]));
		count = m->tag_count;
	}
	for (size_t i = 0; names && names[i]; i++) {
		struct tag *tag;
		bool seen = false;

		r = tag_name_check(names[i]);
		if (r < 0)
			return r;
		tag = tag_find(m, names[i]);
		if (!tag)
			return error_set(-ENOENT, "unknown tag '%s'", names[i]);
		for (size_t j = 0; j < count && !seen; j++)
			seen = picked[j] == tag;
		if (!seen)
			picked[count++] = tag;
	}
	for (size_t i = 0; i < count; i++) {
		struct dormant_tag_change *change = &rep->tags[i];

		t->named[i] = picked[i];
		memcpy(change->tag, picked[i]->name, sizeof(change->tag));
		change->policy = picked[i]->policy;
		change->before = change->after = picked[i]->state;
		if (picked[i]->state != t->target)
			t->tags[t->tag_count++] = picked[i];
	}
	rep->tag_count = count;
	return 0;
}

/* Forget the marks of every owner of an awake tag (see settle()). Called
 * with m->lock. */
static void marks_drop_awake(struct dormant *m)
{
	for (size_t i = 0; i < m->tag_count; i++) {
		if (m->tags[i]->state != DORMANT_AWAKE)
			continue;
		for (struct alloc *a = m->tags[i]->allocs; a; a = a->next)
			marks_clear(&a->marks);
	}
}

static struct dormant_tag_change *change_of(struct transition *t, const struct tag *tag)
{
	for (size_t i = 0; i < t->report->tag_count; i++)
		if (strcmp(t->report->tags[i].tag, tag->name) == 0)
			return &t->report->tags[i];
	return NULL;
}

/* A sleep fixes what it copies of each kept chunk now, while the lock keeps
 * marks and slab space still (extent.h). */
static int plan_chunks(struct transition *t)
{
	for (size_t i = 0; i < t->tag_count; i++)
		for (struct alloc *a = t->tags[i]->allocs; a; a = a->next) {
			enum dormant_policy policy = alloc_policy(a);

			if (policy != DORMANT_KEEP && policy != DORMANT_DISK)
				continue;
			for (size_t c = 0; c < a->chunk_count; c++) {
				int r;

				if (!a->chunks[c].mapped)
					continue;
				r = chunk_plan(a, &a->chunks[c]);
				if (r < 0)
					return error_prefix(r, "planning the copy of tag '%s'",
							    t->tags[i]->name);
				/* whole blocks, for O_DIRECT (diskfile.h) */
				if (policy == DORMANT_DISK)
					plan_align(&a->chunks[c].plan, DISKFILE_ALIGN);
			}
		}
	return 0;
}

/* Mark the tags' allocations and list the chunks to move; nothing changes
 * if it fails. Called with m->lock. */
static int collect_items(struct transition *t)
{
	size_t allocs = 0, items = 0;
	int r;

	for (size_t i = 0; i < t->tag_count; i++)
		for (struct alloc *a = t->tags[i]->allocs; a; a = a->next) {
			allocs++;
			items += a->chunk_count;
		}
	t->allocs = malloc(MAX(allocs, (size_t)1) * sizeof(*t->allocs));
	t->items = malloc(MAX(items, (size_t)1) * sizeof(*t->items));
	if (!t->allocs || !t->items) {
		free(t->allocs);
		free(t->items);
		t->allocs = NULL;
		t->items = NULL;
		return error_set(-ENOMEM, "out of host memory");
	}
	r = t->sleep ? plan_chunks(t) : 0;
	if (r < 0) {
		free(t->allocs);
		free(t->items);
		t->allocs = NULL;
		t->items = NULL;
		return r;
	}
	for (size_t i = 0; i < t->tag_count; i++) {
		struct tag *tag = t->tags[i];
		struct dormant_tag_change *change = change_of(t, tag);

		tag->state = t->via;
		/* the policy may have changed since select_tags() (the tag was
		 * still awake, the lock let go for the guard and the hooks); from
		 * here on it cannot, and this is the one the copies follow */
		if (change)
			change->policy = tag->policy;
		for (struct alloc *a = tag->allocs; a; a = a->next) {
			a->in_transition = true;
			t->allocs[t->alloc_count++] = a;
			for (size_t c = 0; c < a->chunk_count; c++) {
				struct chunk *chunk = &a->chunks[c];

				if (a->is_slab)
					chunk_update_data_bytes(a, chunk);
				if (chunk->mapped != t->sleep)
					continue;
				t->items[t->item_count++] = (struct engine_item){
					.chunk = chunk, .owner = alloc_owner(a),
					.policy = alloc_policy(a), .change = change,
				};
			}
		}
	}
	return 0;
}

/* How many of the manager's tags are in state. Called with m->lock. (The
 * guard's guard_open() asks the same of DORMANT_AWAKE with a loop of its
 * own: a shared one in manager_state.h would send a reader of a sleep there
 * and back three times.) */
static size_t tags_in(const struct dormant *m, enum dormant_state state)
{
	size_t count = 0;

	for (size_t i = 0; i < m->tag_count; i++)
		count += m->tags[i]->state == state;
	return count;
}

static bool tag_fully_mapped(const struct tag *tag, struct transition *t)
{
	for (size_t i = 0; i < t->alloc_count; i++) {
		const struct alloc *a = t->allocs[i];

		if (a->tag != tag)
			continue;
		for (size_t c = 0; c < a->chunk_count; c++)
			if (!a->chunks[c].mapped)
				return false;
	}
	return true;
}

/* Add each part of *t to *sum (the stats' sleep_times_total, wake_times_total). */
static void times_add(struct dormant_transition_times *sum,
		      const struct dormant_transition_times *t)
{
	sum->sync_s += t->sync_s;
	sum->host_prep_s += t->host_prep_s;
	sum->host_pin_s += t->host_pin_s;
	sum->host_wait_s += t->host_wait_s;
	sum->copy_s += t->copy_s;
	sum->release_s += t->release_s;
	sum->map_s += t->map_s;
	sum->map_wait_s += t->map_wait_s;
	sum->zero_wait_s += t->zero_wait_s;
	sum->comms_s += t->comms_s;
	sum->setup_s += t->setup_s;
	sum->checksum_s += t->checksum_s;
	sum->rebuild_s += t->rebuild_s;
	sum->warmup_wait_s += t->warmup_wait_s;
}

/* Settle states, count, free what was freed meanwhile (the duration goes
 * into its histogram at transition_end()). Called with m->lock. */
static void settle(struct dormant *m, struct transition *t, int result)
{
	struct dormant_report *rep = t->report;
	struct dormant_transition_stats *last = t->sleep ? &m->last_sleep : &m->last_wake;
	struct dormant_transition_times *sum =
		t->sleep ? &m->sleep_times_total : &m->wake_times_total;
	double duration = rep->duration_s;

	times_add(sum, &t->totals.times);
	for (size_t i = 0; i < t->tag_count; i++) {
		struct tag *tag = t->tags[i];
		enum dormant_state state;

		if (result == 0)
			state = t->target;
		else if (t->sleep)
			state = !t->copies_done && tag_fully_mapped(tag, t) ? DORMANT_AWAKE
									     : DORMANT_ASLEEP;
		else
			state = DORMANT_ASLEEP;
		if (state == t->target && state != tag->state) {
			if (t->sleep)
				tag->sleeps++;
			else
				tag->wakes++;
		}
		tag->state = state;
	}
	for (size_t i = 0; i < rep->tag_count; i++) {
		rep->tags[i].after = t->named[i]->state;
		rep->tags[i].changed = rep->tags[i].after != rep->tags[i].before;
	}

	if (t->sleep) {
		if (result == 0)
			m->sleeps_ok++;
		else
			m->sleeps_failed++;
		m->bytes_to_host_total += t->totals.copied;
	} else {
		if (result == 0)
			m->wakes_ok++;
		else
			m->wakes_failed++;
		m->bytes_to_device_total += t->totals.copied;
		m->bytes_to_device_engine_total += t->totals.wake_copy.bytes_engine;
		m->bytes_to_device_kernel_total += t->totals.wake_copy.bytes_kernel;
		if (strcmp(t->totals.wake_copy.method, "engine") == 0)
			m->wakes_copy_engine++;
		else if (strcmp(t->totals.wake_copy.method, "kernel") == 0)
			m->wakes_copy_kernel++;
		else if (strcmp(t->totals.wake_copy.method, "mixed") == 0)
			m->wakes_copy_mixed++;
	}
	m->bytes_released_total += t->totals.released;
	m->bytes_zeroed_total += t->totals.zeroed;
	m->bytes_skipped_total += t->totals.skipped;
	m->bytes_unchanged_total += t->totals.unchanged;
	m->chunks_verified_total += t->totals.verified;
	m->chunk_mismatches_total += t->totals.mismatches;
	if (t->totals.rollback_failed) {
		m->healthy = false;
		snprintf(m->health_error, sizeof(m->health_error),
			 "a failed sleep could not be rolled back; wake to recover: %s",
			 dormant_last_error());
	} else if (result == 0 && tags_in(m, DORMANT_AWAKE) == m->tag_count) {
		m->healthy = true;
		m->health_error[0] = '\0';
	}
	/* Marks last until a wake: the woken tags' host copies are consumed,
	 * and the marks of tags that stayed awake are stale by now. A sleep
	 * that failed drops the marks of every tag it left awake: training
	 * goes on and may refill those bytes, so a retry must be marked anew
	 * (keeping them would let the retry skip live data). */
	if (result < 0 || !t->sleep)
		marks_drop_awake(m);

	*last = (struct dormant_transition_stats){
		.valid = true,
		.result = result,
		.started_unix_s = now_unix_s() - duration,
		.duration_s = duration,
		.bytes_copied = t->totals.copied,
		.bytes_released = t->totals.released,
		.bytes_mapped = t->totals.mapped,
		.bytes_zeroed = t->totals.zeroed,
		.bytes_skipped = t->totals.skipped,
		.copy_gbps = rep->copy_gbps,
		.bytes_unchanged = t->totals.unchanged,
		.chunks_verified = t->totals.verified,
		.chunk_mismatches = t->totals.mismatches,
		.times = t->totals.times,
		.wake_copy = t->totals.wake_copy,
	};
	if (result < 0)
		snprintf(last->error, sizeof(last->error), "%s", dormant_last_error());
	/* what was freed meanwhile goes last, its failures logged, not the
	 * transition's: freed during the transition, and (a wake that restored
	 * the residue: the driver takes frees again) while checkpointed */
	alloc_transition_end(m, t->allocs, t->alloc_count, t->restored, &t->freed);
}

/*
 * The last step of a sleep that succeeded, in residue mode checkpoint: with
 * every tag asleep, checkpoint the process's device state, into
 * rep->residue. Its failure is not the sleep's: the report and the residue
 * stats say it. Called without m->lock, with transition_running set.
 */
static void residue_after_sleep(struct dormant *m, struct dormant_report *rep)
{
	enum dormant_residue_mode mode = rep->residue.mode;
	char message[DORMANT_ERROR_MAX];
	bool all_asleep;

	if (mode == DORMANT_RESIDUE_DEFAULT)
		mode = m->residue.mode; /* set once, at dormant_create() */
	if (mode != DORMANT_RESIDUE_CHECKPOINT)
		return;
	pthread_mutex_lock(&m->lock);
	all_asleep = m->tag_count > 0 && tags_in(m, DORMANT_ASLEEP) == m->tag_count;
	pthread_mutex_unlock(&m->lock);
	if (!all_asleep)
		return;
	/* the sleep's own message (it succeeded) is what its caller reads */
	snprintf(message, sizeof(message), "%s", dormant_last_error());
	residue_checkpoint(&m->residue, m->device_count, &rep->residue);
	error_set(0, "%s", message);
}

/* The bytes a wake of t's tags maps on each device (their whole ranges). */
static void wake_need(struct transition *t, uint64_t need[DORMANT_DEVICES_MAX])
{
	memset(need, 0, DORMANT_DEVICES_MAX * sizeof(need[0]));
	for (size_t i = 0; i < t->tag_count; i++)
		for (struct alloc *a = t->tags[i]->allocs; a; a = a->next)
			if (a->device >= 0 && a->device < DORMANT_DEVICES_MAX)
				need[a->device] += a->reserved;
}

/* A wake's first step: restore the process's device state if it is
 * checkpointed (into the report's residue part); settle() then destroys what
 * was freed meanwhile. Called without m->lock, with transition_running set. */
static int residue_before_wake(struct dormant *m, struct transition *t)
{
	struct dormant_residue_step *step = &t->report->residue;
	uint64_t need[DORMANT_DEVICES_MAX];
	int r;

	/* the common case: nothing to measure, nothing to restore; asked
	 * first so that a wake does not take m->lock and walk every
	 * allocation of its tags for a restore that almost never runs */
	if (!residue_checkpointed(&m->residue))
		return 0;
	pthread_mutex_lock(&m->lock);
	wake_need(t, need);
	pthread_mutex_unlock(&m->lock);
	r = residue_restore(&m->residue, m->device_count, need, step);
	pthread_mutex_lock(&m->lock);
	if (r == -EPERM) {
		/* stuck for good: say so wherever health is read */
		m->healthy = false;
		snprintf(m->health_error, sizeof(m->health_error), "%s", dormant_last_error());
	}
	t->restored = r == 0 && step->op[0];
	pthread_mutex_unlock(&m->lock);
	return r < 0 ? error_prefix(r, "wake") : 0;
}

/*
 * With m->lock: refuse a second transition, pick the tags and take the
 * transition (transition_running), stopping a warm-up. A wake with nothing
 * to wake is over here and takes nothing (transition() drops the marks of
 * awake tags); a sleep with every tag asleep already takes it for the
 * checkpoint its end may try.
 */
static int transition_start(struct dormant *m, struct transition *t, const char *const *names)
{
	int r;

	if (m->transition_running) {
		m->busy[!t->sleep]++;
		return error_set(-EBUSY, "another sleep or wake is running");
	}
	r = select_tags(m, names, t);
	if (r < 0)
		return r;
	if (t->tag_count == 0) {
		m->noops[!t->sleep]++;
		if (!t->sleep)
			return 0;
	}
	m->transition_running = t->running = true;
	if (t->tag_count > 0) {
		if (!t->sleep)
			m->gate_hold = true; /* steps wait for the wake hooks too */
		/* a warm-up holds the engine: it stops at its next chunk */
		t->warmup_wait_s = guard_warmup_stop(m);
	}
	return 0;
}

/*
 * Move the tags' memory, with the guard held (sleep) or the gate closed
 * (wake): a wake restores the residue first; then the before-hooks, the
 * copies, the communicators' hooks, the rebuilds; then settle() and, when it
 * succeeded, the after-hooks.
 */
static int transition_move(struct dormant *m, struct transition *t)
{
	struct dormant_report *rep = t->report;
	int r;

	r = t->sleep ? 0 : residue_before_wake(m, t);
	if (r == 0)
		r = hooks_run(m, t->sleep ? DORMANT_HOOK_BEFORE_SLEEP : DORMANT_HOOK_BEFORE_WAKE,
			      NULL);
	if (r == 0) {
		pthread_mutex_lock(&m->lock);
		r = collect_items(t);
		/* where this sleep's disk copies go (dormant_set_disk_dir()) */
		if (t->sleep)
			memcpy(m->engine.disk_dir, m->options.disk_dir, sizeof(m->engine.disk_dir));
		pthread_mutex_unlock(&m->lock);
	}
	if (r < 0) {
		t->tag_count = 0; /* nothing moved */
		goto settle;
	}

	/* the engine moves the memory; then the transition's own steps */
	r = t->sleep ? engine_sleep(&m->engine, t->items, t->item_count, &t->totals)
		     : engine_wake(&m->engine, t->items, t->item_count, &t->totals);
	if (t->sleep && r == 0) {
		/* Everything that can fail on this rank alone is behind us: now
		 * the collective part (communicators). If it fails the memory
		 * stays asleep; settle() finds nothing mapped. */
		t->copies_done = true;
		r = hooks_run(m, DORMANT_HOOK_AFTER_COPIES, &t->totals.times.comms_s);
	} else if (t->sleep && !t->totals.rollback_failed) {
		/* Rolled back after REBUILD memory was released (only a failed
		 * unmap gets there): it came back zero-filled, so rebuild it. */
		char message[DORMANT_ERROR_MAX];

		snprintf(message, sizeof(message), "%s", dormant_last_error());
		if (hooks_rebuild(m, t->tags, t->tag_count, t->items, t->item_count, t->sleep) < 0)
			snprintf(t->rebuild_error, sizeof(t->rebuild_error), "%s",
				 dormant_last_error());
		error_set(r, "%s", message);
	} else if (!t->sleep && r == 0) {
		/* Every KEEP chunk of the wake is back: communicators first (a
		 * rebuild may gather over them), then rebuild from them. */
		r = hooks_run(m, DORMANT_HOOK_BEFORE_REBUILD, &t->totals.times.comms_s);
		if (r == 0) {
			double rebuild = now_monotonic_s();

			r = hooks_rebuild(m, t->tags, t->tag_count, t->items, t->item_count,
					  t->sleep);
			t->totals.times.rebuild_s += now_monotonic_s() - rebuild;
		}
		engine_wake_end(&m->engine, t->items, t->item_count, &t->totals, r == 0);
	}
	if (r < 0)
		error_prefix(r, "%s", kind(t));

settle:
	rep->duration_s = now_monotonic_s() - t->start; /* the guard's wait included */
	rep->bytes_copied = t->totals.copied;
	rep->bytes_released = t->totals.released;
	rep->bytes_mapped = t->totals.mapped;
	rep->bytes_zeroed = t->totals.zeroed;
	rep->bytes_skipped = t->totals.skipped;
	rep->bytes_unchanged = t->totals.unchanged;
	rep->chunks_verified = t->totals.verified;
	rep->chunk_mismatches = t->totals.mismatches;
	t->totals.times.warmup_wait_s = t->warmup_wait_s;
	rep->times = t->totals.times;
	rep->wake_copy = t->totals.wake_copy;
	rep->copy_gbps = t->totals.copy_s > 0 ? (double)t->totals.copied / t->totals.copy_s / 1e9
					       : 0;
	pthread_mutex_lock(&m->lock);
	settle(m, t, r);
	pthread_mutex_unlock(&m->lock);
	t->settled = true;
	free(t->items);
	free(t->allocs);
	if (r == 0)
		hooks_run(m, t->sleep ? DORMANT_HOOK_AFTER_SLEEP : DORMANT_HOOK_AFTER_WAKE, NULL);
	return r;
}

/*
 * The end of every transition. First the residue's part of the report: in
 * one that took transition_running, a sleep that succeeded checkpoints the
 * residue where asked (last, once the hooks no longer need the device; its
 * time counts in the sleep's); then the residue's mode and state, and the
 * helper's start line if a restore or checkpoint started one, all while it
 * still holds transition_running. Then the gate opens and the warm-up may
 * run again; the report's last fields (the result, how many tags are awake
 * and asleep) and, for one that took transition_running, its log: the
 * helper's start, then one line that says how it went.
 */
static void transition_end(struct dormant *m, struct transition *t, int r)
{
	struct dormant_report *rep = t->report;
	const struct dormant_residue_step *step = &rep->residue;
	struct dormant_histogram *h = t->sleep ? &m->sleep_seconds : &m->wake_seconds;
	struct dormant_transition_stats *last = t->sleep ? &m->last_sleep : &m->last_wake;
	char residue[DORMANT_ERROR_MAX + 64] = "", freed[DORMANT_ERROR_MAX + 96] = "";
	char start_line[512];
	bool started, start_warning = false;
	int bucket = 0;

	if (t->running && t->sleep && r == 0)
		residue_after_sleep(m, rep);
	residue_step_finish(&m->residue, &rep->residue);
	started = t->running && residue_start_take(&m->residue, start_line, sizeof(start_line),
						    &start_warning);
	if (t->running) {
		pthread_mutex_lock(&m->lock);
		if (t->settled) {
			/* its whole time, a sleep's checkpoint included, into
			 * its histogram and its last_sleep or last_wake */
			if (t->sleep && step->op[0])
				rep->duration_s += step->seconds;
			while (bucket < DORMANT_HISTOGRAM_BUCKETS &&
			       rep->duration_s > h->bounds_s[bucket])
				bucket++;
			h->counts[bucket]++;
			h->count++;
			h->sum_s += rep->duration_s;
			last->duration_s = rep->duration_s;
			last->started_unix_s = now_unix_s() - rep->duration_s;
		}
		guard_release(m);
		m->transition_running = false;
		guard_warmup_resume(m);
		pthread_mutex_unlock(&m->lock);
	}
	rep->result = r;
	if (r < 0)
		snprintf(rep->error, sizeof(rep->error), "%s", dormant_last_error());
	if (!t->settled) /* settle() timed one that settled */
		rep->duration_s = now_monotonic_s() - t->start;

	/* a restore or checkpoint that started the residue's helper says so */
	if (started)
		log_write(&m->log, start_warning ? DORMANT_LOG_WARNING : DORMANT_LOG_INFO, "%s",
			  start_line);
	/* nothing to sleep, nothing tried: nothing to say */
	if (t->running && (t->settled || t->guard_failed || step->op[0])) {
		/* a failed restore's message is the wake's own */
		if (step->op[0] && step->result == 0)
			snprintf(residue, sizeof(residue), "; residue %s in %.3f s", step->op,
				 step->seconds);
		else if (step->op[0] && r == 0)
			snprintf(residue, sizeof(residue), "; the residue stays: %s", step->error);
		if (t->freed.count)
			snprintf(freed, sizeof(freed),
				 "; freeing what was freed meanwhile: %u failure(s), the first: %s",
				 t->freed.count, t->freed.first);
		if (t->totals.warnings) /* the engine's: the first, and how many */
			log_write(&m->log, DORMANT_LOG_WARNING, "%s: %s (warnings: %u)", kind(t),
				  t->totals.warning, t->totals.warnings);
		log_write(&m->log,
			  r < 0		  ? DORMANT_LOG_ERROR
			  : t->freed.count ? DORMANT_LOG_WARNING
					   : DORMANT_LOG_INFO,
			  "%s: %s in %.3f s, %llu bytes copied at %.1f GB/s, %llu released, "
			  "%llu zeroed%s%s%s%s%s%s",
			  kind(t), r == 0 ? "done" : "failed", rep->duration_s,
			  (unsigned long long)rep->bytes_copied, rep->copy_gbps,
			  (unsigned long long)rep->bytes_released,
			  (unsigned long long)rep->bytes_zeroed, r == 0 ? "" : ": ",
			  r == 0 ? "" : dormant_last_error(),
			  t->rebuild_error[0] ? "; rebuilding after the rollback failed too: " : "",
			  t->rebuild_error, residue, freed);
	}

	pthread_mutex_lock(&m->lock);
	rep->tags_awake = tags_in(m, DORMANT_AWAKE);
	rep->tags_asleep = tags_in(m, DORMANT_ASLEEP);
	pthread_mutex_unlock(&m->lock);
}

static int transition(struct dormant *m, bool sleep, const char *const *names,
		      enum dormant_residue_mode residue, struct dormant_report *ret)
{
	double start = now_monotonic_s();
	struct dormant_report *rep;
	struct transition t;
	int r;

	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	/* The report is large; keep it off the caller's (maybe small) stack. */
	rep = calloc(1, sizeof(*rep));
	if (!rep)
		return error_set(-ENOMEM, "out of host memory");
	t = (struct transition){
		.start = start,
		.sleep = sleep,
		.target = sleep ? DORMANT_ASLEEP : DORMANT_AWAKE,
		.via = sleep ? DORMANT_SLEEPING : DORMANT_WAKING,
		.report = rep,
	};
	rep->residue.mode = residue;
	error_clear();
	pthread_mutex_lock(&m->lock);
	r = transition_start(m, &t, names);
	pthread_mutex_unlock(&m->lock);
	if (r == 0 && t.running && t.tag_count > 0) {
		r = sleep ? guard_close(m, &rep->guard_wait_s) : 0;
		/* steps did not leave in time: busy, and they go on */
		t.guard_failed = r < 0;
		if (!t.guard_failed)
			r = transition_move(m, &t);
	}
	if (t.guard_failed || (r == 0 && !t.running)) {
		/* what settle() does to the marks where nothing settles: a
		 * sleep the guard refused and a wake with nothing to wake drop
		 * the marks of every awake tag */
		pthread_mutex_lock(&m->lock);
		if (t.guard_failed)
			m->busy[0]++;
		marks_drop_awake(m);
		pthread_mutex_unlock(&m->lock);
	}
	transition_end(m, &t, r);
	if (ret)
		*ret = *rep;
	free(rep);
	return r;
}

DORMANT_EXPORT int dormant_sleep(struct dormant *m, const char *const *tags,
				 struct dormant_report *ret)
{
	return transition(m, true, tags, DORMANT_RESIDUE_DEFAULT, ret);
}

DORMANT_EXPORT int dormant_sleep_residue(struct dormant *m, const char *const *tags,
					 enum dormant_residue_mode mode,
					 struct dormant_report *ret)
{
	if (mode != DORMANT_RESIDUE_DEFAULT && mode != DORMANT_RESIDUE_KEEP &&
	    mode != DORMANT_RESIDUE_CHECKPOINT)
		return error_set(-EINVAL, "residue mode must be default, keep or checkpoint, not %d",
				 (int)mode);
	return transition(m, true, tags, mode, ret);
}

DORMANT_EXPORT int dormant_wake(struct dormant *m, const char *const *tags,
				struct dormant_report *ret)
{
	return transition(m, false, tags, DORMANT_RESIDUE_DEFAULT, ret);
}
