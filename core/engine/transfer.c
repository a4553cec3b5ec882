/* SPDX-License-Identifier: MIT */
#include "transfer.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mapper.h"
#include "pipeline.h"
#include "prepare.h"
#include "staging.h"
#include "verify.h"
#include "wakecopy.h"

/* ---- disk copies --------------------------------------------------------- */

/* Does this sleep copy it to disk on device d? */
static bool disk_copies(const struct engine_item *it, int d)
{
	return it->owner.device == d && engine_item_disk(it) && engine_item_keep(it) &&
	       it->chunk->mapped && it->chunk->plan.kept > 0;
}

/* Whether items a and b (disk copies of one device) share a file: of one
 * tag; with disk_names, of one allocation too (torch_memory_saver lists a
 * file per allocation, and tools written for it count them). */
static bool disk_same_file(const struct engine *e, const struct engine_item *a,
			   const struct engine_item *b)
{
	return a->owner.held == b->owner.held && (!e->disk_names || a->owner.ptr == b->owner.ptr);
}

/* Files for the DORMANT_DISK chunks that sleep on device d: one per tag
 * (with disk_names, one per allocation: disk_same_file()), each chunk a
 * range of it (its plan laid out in blocks), in the directory this sleep
 * uses, so that a tag holds one descriptor however many chunks it has, and
 * its copy is one file read from start to end on wake; and the staging ring
 * the pieces go through. A chunk whose file cannot be made gets none, and
 * the sleep fails before any copy. */
static int disk_ready(struct engine *e, int d, struct engine_item *items, size_t count)
{
	bool any = false;
	int r;

	for (size_t i = 0; i < count; i++) {
		struct chunk *c = items[i].chunk;

		if (!disk_copies(&items[i], d))
			continue;
		any = true;
		if (c->disk.open) { /* none should be left; never reuse one */
			engine_account_disk(items[i].owner.held, -(int64_t)c->disk.size);
			diskfile_close(&c->disk);
		}
	}
	if (!any)
		return 0;
	/* the space of the copies the last wake closed first: a full disk
	 * would refuse this sleep for want of it */
	engine_disk_closings_wait(e);
	r = staging_ready(e, d);
	if (r < 0)
		return r;
	for (size_t i = 0; i < count; i++) {
		struct diskstore *store;
		uint64_t size = 0;

		/* the first chunk of a file's share without a file: its file */
		if (!disk_copies(&items[i], d) || items[i].chunk->disk.open)
			continue;
		for (size_t k = i; k < count; k++)
			if (disk_same_file(e, &items[i], &items[k]) && disk_copies(&items[k], d))
				size += plan_align(&items[k].chunk->plan, DISKFILE_ALIGN);
		r = diskstore_create(e->backend, e->disk_dir, size, e->disk_names, &store);
		if (r < 0)
			return error_prefix(r, "tag '%s'", items[i].owner.tag);
		size = 0;
		for (size_t k = i; k < count; k++) {
			struct chunk *c = items[k].chunk;
			uint64_t bytes;

			if (!disk_same_file(e, &items[i], &items[k]) || !disk_copies(&items[k], d))
				continue;
			bytes = plan_align(&c->plan, DISKFILE_ALIGN);
			diskfile_open(store, size, bytes, &c->disk);
			engine_account_disk(items[k].owner.held, (int64_t)bytes);
			size += bytes;
		}
		diskstore_put(store);
	}
	return 0;
}

/* ---- per-device resources ------------------------------------------------ */

void engine_init(struct engine *e, struct backend *b, struct workers *w,
		 const struct logger *log, enum dormant_host_mode mode, size_t staging_bytes,
		 size_t pin_piece, bool pin_host)
{
	memset(e, 0, sizeof(*e));
	e->backend = b;
	e->workers = w;
	e->log = *log;
	e->mode = mode;
	e->staging_bytes = staging_bytes;
	e->pin_piece = pin_piece;
	e->pin_threads = 1;
	e->pin_host = pin_host;
	pthread_mutex_init(&e->reclaims.lock, NULL);
	pthread_cond_init(&e->reclaims.cond, NULL);
	pthread_mutex_init(&e->disk_closings.lock, NULL);
	pthread_cond_init(&e->disk_closings.cond, NULL);
}

static void device_finish(struct engine *e, int d)
{
	struct engine_device *ed = &e->devices[d];
	const struct backend_ops *ops = e->backend->ops;

	for (int i = 0; i < ENGINE_WINDOW; i++)
		if (ed->events[i])
			ops->event_destroy(e->backend, d, ed->events[i]);
	if (ed->zero_event)
		ops->event_destroy(e->backend, d, ed->zero_event);
	if (ed->zero_stream)
		ops->stream_destroy(e->backend, d, ed->zero_stream);
	if (ed->hash_stream)
		ops->stream_destroy(e->backend, d, ed->hash_stream);
	if (ed->stream)
		ops->stream_destroy(e->backend, d, ed->stream);
	staging_finish(e, d);
	memset(ed, 0, sizeof(*ed));
}

void engine_finish(struct engine *e)
{
	for (int d = 0; d < DORMANT_DEVICES_MAX; d++)
		if (e->devices[d].ready || e->devices[d].stream)
			device_finish(e, d);
	/* every chunk was dropped, each waiting for its unpin */
	assert(e->reclaims.count == 0);
	/* and every disk copy's closing (the workers are gone) */
	assert(e->disk_closings.count == 0);
	pthread_cond_destroy(&e->disk_closings.cond);
	pthread_mutex_destroy(&e->disk_closings.lock);
	pthread_cond_destroy(&e->reclaims.cond);
	pthread_mutex_destroy(&e->reclaims.lock);
}

static int device_ready(struct engine *e, int d)
{
	struct engine_device *ed = &e->devices[d];
	const struct backend_ops *ops = e->backend->ops;
	int r;

	if (ed->ready)
		return 0;
	r = ops->stream_create(e->backend, d, &ed->stream);
	if (r < 0)
		goto err;
	r = ops->stream_create(e->backend, d, &ed->zero_stream);
	if (r < 0)
		goto err;
	r = ops->stream_create(e->backend, d, &ed->hash_stream);
	if (r < 0)
		goto err;
	r = ops->event_create(e->backend, d, &ed->zero_event);
	if (r < 0)
		goto err;
	for (int i = 0; i < ENGINE_WINDOW; i++) {
		r = ops->event_create(e->backend, d, &ed->events[i]);
		if (r < 0)
			goto err;
	}
	ed->ready = true;
	atomic_fetch_add(&e->device_setups, 1);
	return 0;

err:
	device_finish(e, d);
	return error_prefix(r, "preparing streams on device %d", d);
}

int engine_device_setup(struct engine *e, int d)
{
	struct engine_device *ed = &e->devices[d];
	const struct backend_ops *ops = e->backend->ops;
	double start;
	int r = 0;

	if (!ed->ready || !ed->kernel_tried) {
		start = now_monotonic_s();
		r = device_ready(e, d);
		if (r == 0 && !ed->kernel_tried) {
			ed->kernel_tried = true;
			/* loaded (and compiled by the driver) now rather than
			 * by the first sleep's hash; a failure is said once by
			 * the checksum path when it needs the kernel */
			if (ops->checksum_prepare)
				(void)ops->checksum_prepare(e->backend, d);
		}
		engine_time_add(&e->setup_ns, start);
	}
	/* copies that go unpinned go through the ring (timed by itself) */
	if (r == 0 && !e->pin_host)
		r = staging_ready(e, d);
	return r;
}

/* ---- devices at once ----------------------------------------------------- */

/* A tag's counters in the report, as one device adds to them. */
struct change_copy {
	struct dormant_tag_change *shared;
	struct dormant_tag_change own;
};

/* One device's share of a transition, on a host thread of its own. */
struct device_run {
	struct engine *e;
	int device;
	struct engine_item *items;
	size_t count;
	int (*fn)(struct engine *e, int d, struct engine_item *items, size_t count,
		  struct engine_totals *t);
	struct engine_totals totals;
	struct change_copy changes[DORMANT_TAGS_MAX];
	size_t change_count;
	int result;
	char error[DORMANT_ERROR_MAX];
	pthread_t thread;
	bool threaded;
};

/* Every counter of struct dormant_tag_change that the engine adds to: a
 * counter added per chunk must be summed here too. */
static void change_counters_add(struct dormant_tag_change *dst,
				const struct dormant_tag_change *src)
{
	dst->bytes_copied += src->bytes_copied;
	dst->bytes_released += src->bytes_released;
	dst->bytes_mapped += src->bytes_mapped;
	dst->bytes_zeroed += src->bytes_zeroed;
	dst->bytes_skipped += src->bytes_skipped;
	dst->bytes_unchanged += src->bytes_unchanged;
	dst->chunks_verified += src->chunks_verified;
	dst->chunk_mismatches += src->chunk_mismatches;
}

static void totals_add(struct engine_totals *dst, const struct engine_totals *src, bool overlapped)
{
	dst->copied += src->copied;
	dst->released += src->released;
	dst->mapped += src->mapped;
	dst->zeroed += src->zeroed;
	dst->skipped += src->skipped;
	dst->unchanged += src->unchanged;
	dst->verified += src->verified;
	dst->mismatches += src->mismatches;
	/* devices that worked at once took the longest one's time */
#define TOTALS_TIME(f) (dst->f = overlapped ? MAX(dst->f, src->f) : dst->f + src->f)
	TOTALS_TIME(copy_s);
	TOTALS_TIME(times.sync_s);
	TOTALS_TIME(times.host_wait_s);
	TOTALS_TIME(times.map_wait_s);
	TOTALS_TIME(times.zero_wait_s);
	TOTALS_TIME(times.checksum_s);
#undef TOTALS_TIME
	dst->rollback_failed |= src->rollback_failed;
	engine_warnings_add(dst, src);
	wake_copy_report_add(&dst->wake_copy, &src->wake_copy);
}

/* The run's own copy of a tag's counters (zeroed), made on first use. */
static struct dormant_tag_change *change_own(struct device_run *run,
					     struct dormant_tag_change *shared)
{
	struct change_copy *copy;

	if (!shared)
		return NULL;
	for (size_t i = 0; i < run->change_count; i++)
		if (run->changes[i].shared == shared)
			return &run->changes[i].own;
	/* one change per tag of the transition: there is always room */
	assert(run->change_count < DORMANT_TAGS_MAX);
	copy = &run->changes[run->change_count++];
	copy->shared = shared;
	copy->own = (struct dormant_tag_change){ .policy = shared->policy };
	memcpy(copy->own.tag, shared->tag, sizeof(copy->own.tag));
	return &copy->own;
}

static struct device_run *run_of(struct device_run *runs, size_t n, int device)
{
	for (size_t k = 0; k < n; k++)
		if (runs[k].device == device)
			return &runs[k];
	return NULL;
}

static void device_run_go(struct device_run *run)
{
	error_clear();
	run->e->devices[run->device].stopped = false;
	run->result = run->fn(run->e, run->device, run->items, run->count, &run->totals);
	if (run->result < 0) {
		snprintf(run->error, sizeof(run->error), "%s", dormant_last_error());
		atomic_store(&run->e->devices_stop, true);
	}
}

static void *device_run_main(void *arg)
{
	device_run_go(arg);
	return NULL;
}

/* A device's share stopped because another failed: not the failure to report. */
static int device_stop(struct engine *e, int d)
{
	e->devices[d].stopped = true;
	return error_set(-ECANCELED, "device %d stopped: another device failed", d);
}

/*
 * Run fn for every device that items have chunks on, each on a thread of its
 * own (the first on the calling thread), and wait for all. Each adds to its
 * own totals and tag counters, summed into t and the items' changes at the
 * end. When one fails the others stop at their next chunk; the first
 * failure (by device) is returned, its message naming the device. fn leaves
 * its device's in-flight work finished, whatever it returns.
 */
static int devices_run(struct engine *e, struct engine_item *items, size_t count,
		       int (*fn)(struct engine *e, int d, struct engine_item *items, size_t count,
				 struct engine_totals *t),
		       struct engine_totals *t)
{
	bool used[DORMANT_DEVICES_MAX] = { false };
	struct device_run *runs, *failed = NULL;
	char message[DORMANT_ERROR_MAX];
	size_t n = 0, k = 0, used_len;
	int r;

	for (size_t i = 0; i < count; i++)
		used[items[i].owner.device] = true;
	for (int d = 0; d < DORMANT_DEVICES_MAX; d++)
		n += used[d];
	atomic_store(&e->devices_stop, false);
	if (n == 0)
		return 0;
	if (n == 1) {
		for (int d = 0; d < DORMANT_DEVICES_MAX; d++)
			if (used[d]) {
				e->devices[d].stopped = false;
				return fn(e, d, items, count, t);
			}
	}
	runs = calloc(n, sizeof(*runs));
	if (!runs)
		goto serial;
	for (int d = 0; d < DORMANT_DEVICES_MAX; d++)
		if (used[d])
			runs[k++] = (struct device_run){ .e = e, .device = d, .items = items,
							 .count = count, .fn = fn };
	/* Before any thread starts: each device's items count into its own. */
	for (size_t i = 0; i < count; i++)
		items[i].change = change_own(run_of(runs, n, items[i].owner.device),
					     items[i].change);

	for (k = 1; k < n && !e->serial_devices; k++)
		runs[k].threaded =
			pthread_create(&runs[k].thread, NULL, device_run_main, &runs[k]) == 0;
	for (k = 0; k < n; k++) {
		if (runs[k].threaded)
			continue;
		/* one after another, as DORMANT_PARALLEL_DEVICES=0 asks: stop
		 * at the first failure */
		if (e->serial_devices && atomic_load(&e->devices_stop))
			break;
		device_run_go(&runs[k]);
	}
	for (k = 0; k < n; k++)
		if (runs[k].threaded)
			pthread_join(runs[k].thread, NULL);

	/* All done: the shared counters again, with every device's added. */
	for (size_t i = 0; i < count; i++)
		if (items[i].change)
			items[i].change = ((struct change_copy *)((char *)items[i].change -
								  offsetof(struct change_copy,
									   own)))->shared;
	for (k = 0; k < n; k++) {
		for (size_t c = 0; c < runs[k].change_count; c++)
			change_counters_add(runs[k].changes[c].shared, &runs[k].changes[c].own);
		totals_add(t, &runs[k].totals, !e->serial_devices);
	}
	for (k = 0; k < n; k++)
		if (runs[k].result < 0 && !e->devices[runs[k].device].stopped) {
			failed = &runs[k];
			break;
		}
	for (k = 0; k < n && !failed; k++)
		if (runs[k].result < 0)
			failed = &runs[k];
	if (!failed) {
		free(runs);
		return 0;
	}
	r = failed->result;
	used_len = (size_t)snprintf(message, sizeof(message), "device %d: %s", failed->device,
				    failed->error);
	for (k = 0; k < n && used_len < sizeof(message); k++)
		if (&runs[k] != failed && runs[k].result < 0 &&
		    !e->devices[runs[k].device].stopped)
			used_len += (size_t)snprintf(message + used_len, sizeof(message) - used_len,
						     "; device %d failed too: %s", runs[k].device,
						     runs[k].error);
	free(runs);
	return error_set(r, "%s", message);

serial:
	/* No memory for the runs: one after another, on the calling thread,
	 * with the shared counters. */
	for (int d = 0; d < DORMANT_DEVICES_MAX; d++) {
		if (!used[d])
			continue;
		r = fn(e, d, items, count, t);
		if (r < 0)
			return error_prefix(r, "device %d", d);
	}
	return 0;
}

/* The calls' times of one transition (dormant_transition_times), from the
 * engine's counters (state.h), which every stage adds to: marked when it
 * starts (times_mark()), told into its totals when it ends (times_since()). */
struct time_marks {
	uint64_t release_ns, map_ns, host_prep_ns, host_pin_ns, setup_ns;
};

static void times_mark(struct engine *e, struct time_marks *m)
{
	m->release_ns = atomic_load(&e->release_ns);
	m->map_ns = atomic_load(&e->map_ns);
	m->host_prep_ns = atomic_load(&e->host_prep_ns);
	m->host_pin_ns = atomic_load(&e->host_pin_ns);
	m->setup_ns = atomic_load(&e->setup_ns);
}

static void times_since(struct engine *e, const struct time_marks *m, struct engine_totals *t)
{
	t->times.release_s = (double)(atomic_load(&e->release_ns) - m->release_ns) / 1e9;
	t->times.map_s = (double)(atomic_load(&e->map_ns) - m->map_ns) / 1e9;
	t->times.host_prep_s = (double)(atomic_load(&e->host_prep_ns) - m->host_prep_ns) / 1e9;
	t->times.host_pin_s = (double)(atomic_load(&e->host_pin_ns) - m->host_pin_ns) / 1e9;
	t->times.setup_s = (double)(atomic_load(&e->setup_ns) - m->setup_ns) / 1e9;
	t->times.copy_s = t->copy_s;
}

/* ---- sleep --------------------------------------------------------------- */

/* Whether a sleep copies the item to a host buffer: kept in host memory,
 * mapped, with bytes to keep. */
static bool host_copied(const struct engine_item *it)
{
	return engine_item_keep(it) && !engine_item_disk(it) && it->chunk->mapped &&
	       it->chunk->plan.kept;
}

/* pin_host false with pin_host_bytes: what a sleep may pin (the host copies
 * pinned already, as a retained copy stays, count against it) and its share
 * of the unpinned host copies the sleep makes. */
static void pin_share(struct engine *e, const struct engine_item *items, size_t count)
{
	uint64_t pinned = 0, unpinned = 0;

	atomic_store(&e->pin_taken, 0);
	e->pin_max = 0;
	e->pin_ratio = 0;
	if (e->pin_host || !e->pin_host_bytes)
		return;
	for (size_t i = 0; i < count; i++) {
		const struct chunk *c = items[i].chunk;

		if (!host_copied(&items[i]))
			continue;
		if (c->host.pin_piece)
			pinned += c->host.size;
		else
			unpinned += c->plan.kept;
	}
	if (pinned >= e->pin_host_bytes || !unpinned)
		return;
	e->pin_max = e->pin_host_bytes - pinned;
	e->pin_ratio = MIN(1.0, (double)(e->pin_host_bytes - pinned) / (double)unpinned);
}

/* Whether a sleep pins this chunk's host copy. Under pin_host_bytes: the
 * chunks it pins follow each other at the share's pace through the
 * device's copies (the first pinned), so that a wake, which copies in the
 * same order, has pinned pieces for the copy engines between the ones the
 * CPU stages; never more than what is left of the bytes. */
static bool pin_chunk(struct engine *e, const struct chunk *c, uint64_t *seen, uint64_t *pinned)
{
	bool pin;

	if (e->pin_host || c->host.pin_piece)
		return e->pin_host;
	pin = e->pin_ratio > 0 && (double)*pinned <= e->pin_ratio * (double)*seen &&
	      engine_sleep_pin_reserve(e, c->plan.kept);
	*seen += c->plan.kept;
	if (pin)
		*pinned += c->plan.kept;
	return pin;
}

/* A host copy no sleep keeps, freed on a worker (engine_host_release()),
 * once a reclaimable one's unpin is done. */
static void host_release(struct engine *e, struct engine_item *it)
{
	struct engine_job *jobs = NULL;

	engine_host_settle(e, &it->chunk->host);
	engine_host_release(e, it->owner.held, it->chunk, &jobs);
	engine_jobs_submit(e, jobs);
}

/* Choose the chunks of device d whose host copies this sleep pins (it->pin),
 * before their buffers are made: those are faulted in ahead (prepare.c), as
 * registering untouched memory takes about five times as long (0.18 s per
 * GiB on the H200 against 0.03). In the order the sleep copies them, so
 * that the share's pace is the copies'. */
static void pin_choose(struct engine *e, int d, struct engine_item *items, size_t count)
{
	uint64_t seen = 0, pinned = 0;

	for (size_t i = 0; i < count; i++) {
		struct engine_item *it = &items[i];

		if (it->owner.device == d)
			it->pin = host_copied(it) && pin_chunk(e, it->chunk, &seen, &pinned);
	}
}

static int sleep_device(struct engine *e, int d, struct engine_item *items, size_t count,
			struct engine_totals *t)
{
	struct pipeline p = { .e = e, .device = d, .ed = &e->devices[d], .to_host = true,
			      .totals = t };
	bool discards_done = false;
	struct prep prep;
	double start, wait;
	int r;

	r = engine_device_setup(e, d);
	if (r < 0)
		return r;
	/* Every kernel that may still write this memory must be done. */
	start = now_monotonic_s();
	r = e->backend->ops->synchronize(e->backend, d);
	t->times.sync_s += now_monotonic_s() - start;
	if (r < 0)
		return error_prefix(r, "synchronizing device %d", d);

	start = now_monotonic_s();
	/* hash what is kept; in retain mode, release unchanged chunks */
	r = checksum_sleep(e, d, items, count, t);
	t->times.checksum_s += now_monotonic_s() - start;
	if (r < 0)
		return r;
	r = disk_ready(e, d, items, count);
	if (r < 0)
		return r;
	pin_choose(e, d, items, count);
	r = prep_start(&prep, e, d, items, count);
	if (r < 0) {
		prep_finish(&prep);
		return r;
	}
	for (size_t i = 0; i < count; i++) {
		struct engine_item *it = &items[i];
		struct chunk *c = it->chunk;

		if (it->owner.device != d || !engine_item_keep(it) || !c->mapped)
			continue;
		if (atomic_load(&e->devices_stop)) {
			r = device_stop(e, d);
			goto err;
		}
		if (c->plan.kept == 0) {
			/* a slab's free tail, or all marked unused: nothing to keep */
			r = engine_chunk_release(e, &it->owner, c, t);
			if (r < 0)
				goto err;
			it->change->bytes_released += c->size;
			t->released += c->size;
			it->change->bytes_skipped += c->plan.skipped;
			t->skipped += c->plan.skipped;
			/* a retained host copy would hold nothing now */
			if (c->host.ptr)
				host_release(e, it);
			engine_disk_release(it->owner.held, c);
			continue;
		}
		if (engine_item_disk(it)) {
			/* kept in host memory before its policy became disk */
			if (c->host.ptr)
				host_release(e, it);
		} else {
			wait = now_monotonic_s();
			r = prep_wait(&prep, it);
			t->times.host_wait_s += now_monotonic_s() - wait;
			/* what the sleep pins (it->pin), the pipeline registers */
			if (r == 0 && !c->host.pin_piece && !it->pin)
				r = staging_ready(e, d);
		}
		if (r < 0)
			goto err;
		r = pipeline_issue_chunk(&p, it, it->pin);
		if (r < 0)
			goto err;
		/* The first copies are queued: release DISCARD memory while
		 * they run. */
		if (!discards_done) {
			r = engine_release_policy(e, d, DORMANT_DISCARD, items, count, t);
			if (r < 0)
				goto err;
			discards_done = true;
		}
	}
	r = pipeline_drain(&p);
	if (r < 0)
		goto err;
	prep_finish(&prep);
	if (!discards_done) {
		r = engine_release_policy(e, d, DORMANT_DISCARD, items, count, t);
		if (r < 0)
			return r;
	}
	t->copy_s += now_monotonic_s() - start;
	return 0;

err:
	prep_finish(&prep);
	pipeline_abort(&p);
	return r;
}

static int wake_items(struct engine *e, struct engine_item *items, size_t count,
		      struct engine_totals *t);

int engine_sleep(struct engine *e, struct engine_item *items, size_t count, struct engine_totals *t)
{
	char message[DORMANT_ERROR_MAX], rollback[DORMANT_ERROR_MAX];
	struct engine_totals undo = { 0 };
	struct time_marks marks;
	int r, rr;

	memset(t, 0, sizeof(*t));
	times_mark(e, &marks);
	pin_share(e, items, count);
	r = devices_run(e, items, count, sleep_device, t);
	/* REBUILD memory goes last, once every copy is done: a sleep that
	 * fails before rolls back with it intact, and nothing is lost. */
	if (r == 0)
		r = engine_release_policy(e, -1, DORMANT_REBUILD, items, count, t);
	times_since(e, &marks, t);
	engine_reclaim_warning(e, t);
	if (r == 0)
		return 0;

	/* Roll back: what was released comes back, restored from the host;
	 * the error says when it could not (t->rollback_failed). */
	snprintf(message, sizeof(message), "%s", dormant_last_error());
	rr = wake_items(e, items, count, &undo);
	if (rr < 0) {
		t->rollback_failed = true;
		snprintf(rollback, sizeof(rollback), "%s", dormant_last_error());
	}
	engine_warnings_add(t, &undo);
	/* What came back is the wake's (wake_items() gave back what it
	 * mapped if it failed); copies made for chunks that never left the
	 * device are not needed: it ends as a wake that is done. */
	engine_wake_end(e, items, count, t, true);
	if (rr < 0)
		return error_set(r, "%s; rollback failed, the data stays on the host: %s", message,
				 rollback);
	return error_set(r, "%s", message);
}

/* ---- wake ---------------------------------------------------------------- */

struct gap_fill {
	struct engine *e;
	int device;
	struct engine_item *item;
	struct engine_totals *totals;
};

/* Zero-fill a range of a chunk that its host copy does not hold. */
static int zero_gap(void *ctx, size_t offset, size_t size)
{
	struct gap_fill *g = ctx;
	struct engine_device *ed = &g->e->devices[g->device];
	int r;

	r = g->e->backend->ops->zero(g->e->backend, g->device, g->item->chunk->va + offset, size,
				     ed->zero_stream);
	if (r < 0)
		return error_prefix(r, "zero-filling %zu bytes on device %d", size, g->device);
	g->item->change->bytes_zeroed += size;
	g->totals->zeroed += size;
	return 0;
}

/* Map (through the mapper: ahead, on its thread), zero-fill and restore
 * device d's chunks of the wake, in items order; each restored chunk's hash
 * is queued behind its copies (vw). */
static int restore_device(struct engine *e, int d, struct engine_item *items, size_t count,
			  struct engine_totals *t, struct verify_wake *vw, struct wake_copy *wc)
{
	struct engine_device *ed = &e->devices[d];
	struct pipeline p = { .e = e, .device = d, .ed = ed, .to_host = false, .totals = t,
			      .wc = wc };
	const struct backend_ops *ops = e->backend->ops;
	struct mapper mp;
	double wait;
	int r;

	r = mapper_start(&mp, e, d, items, count);
	if (r < 0)
		goto err_mapper;
	for (size_t i = 0; i < count; i++) {
		struct engine_item *it = &items[i];
		struct chunk *c = it->chunk;

		if (it->owner.device != d)
			continue;
		r = mapper_wait(&mp, it);
		if (r < 0)
			goto err;
		if (!it->mapped_here)
			continue;
		if (engine_item_keep(it) && c->host_valid) {
			/* what the host copy does not hold: marked, holes */
			struct gap_fill g = { .e = e, .device = d, .item = it, .totals = t };

			r = plan_for_each_gap(&c->plan, zero_gap, &g);
			if (r < 0)
				goto err;
			if (!c->host.pin_piece) {
				r = staging_ready(e, d);
				if (r < 0)
					goto err;
			}
			r = pipeline_issue_chunk(&p, it, false);
			if (r == 0)
				r = checksum_wake_chunk(vw, it, pipeline_last_event(&p));
			if (r < 0)
				goto err;
			continue;
		}
		/* DISCARD memory, and KEEP memory that never had a copy. */
		r = ops->zero(e->backend, d, c->va, c->size, ed->zero_stream);
		if (r < 0) {
			error_prefix(r, "zero-filling %zu bytes on device %d", c->size, d);
			goto err;
		}
		it->change->bytes_zeroed += c->size;
		t->zeroed += c->size;
	}
	r = ops->event_record(e->backend, d, ed->zero_event, ed->zero_stream);
	if (r < 0)
		goto err;
	r = pipeline_drain(&p);
	if (r < 0)
		goto err_zero;
	wait = now_monotonic_s();
	r = ops->event_wait(e->backend, d, ed->zero_event);
	t->times.zero_wait_s += now_monotonic_s() - wait;
	mapper_finish(&mp, t);
	if (r < 0)
		return error_prefix(r, "zero-filling on device %d", d);
	return 0;

err:
	/* the zero-fill queued so far must be done before the memory goes */
	(void)ops->event_record(e->backend, d, ed->zero_event, ed->zero_stream);
err_zero:
	pipeline_abort(&p);
	(void)ops->event_wait(e->backend, d, ed->zero_event);
err_mapper:
	mapper_finish(&mp, t);
	return r;
}

/* What copies device d's share of a wake (option wake_copy, wakecopy.h):
 * unless the copy engines were asked for, load the copy kernel first (and
 * run it once, empty), so that neither its load nor its first launch is
 * timed; a device that cannot run it copies with the copy engines. */
static void wake_copy_begin(struct engine *e, int d, struct wake_copy *wc,
			    struct engine_totals *t)
{
	struct backend *b = e->backend;
	bool kernel_ok = false;

	if (e->wake_copy != WAKE_COPY_ENGINE && b->ops->copy_to_device_kernel) {
		kernel_ok = b->ops->copy_to_device_kernel(b, d, 0, NULL, 0,
							  e->devices[d].stream) == 0;
		if (!kernel_ok && !atomic_exchange(&e->copy_kernel_warned, true))
			engine_warn(t, "wakes copy with the copy engines: %s",
				    dormant_last_error());
		if (!kernel_ok)
			error_clear();
	}
	wake_copy_start(wc, (enum wake_copy_mode)e->wake_copy, kernel_ok,
			e->wake_copy_probe_bytes, e->wake_copy_reprobe_bytes,
			e->devices[d].kernel_gbps);
}

/* Before a wake that maps ahead of its copies: a device that has less free
 * memory than the wake maps (another process still holds it) fails it at
 * once, before any copy, as the map-first order did. When the device cannot
 * tell, the mappings decide. */
static int room_check(struct engine *e, int d, struct engine_item *items, size_t count)
{
	uint64_t need = 0, free_bytes, total;

	for (size_t i = 0; i < count; i++)
		if (items[i].owner.device == d && !items[i].chunk->mapped)
			need += items[i].chunk->size;
	if (e->backend->ops->mem_info(e->backend, d, &free_bytes, &total) < 0)
		return 0;
	if (free_bytes >= need)
		return 0;
	return error_set(-ENOMEM,
			 "device %d has %llu bytes free and the wake maps %llu: another process "
			 "holds the memory (retry once it gives it back)",
			 d, (unsigned long long)free_bytes, (unsigned long long)need);
}

/* Device d's share of a wake: map its unmapped chunks of items (ahead of
 * the copies, on the mapper's threads; or, with DORMANT_WAKE_OVERLAP=0, all
 * first, so that a wake short of memory fails before any copy), zero-fill
 * and restore them, and verify the restored chunks. With the mapper, a wake
 * short of memory fails at room_check(), or (memory taken meanwhile,
 * fragmentation) at the first chunk that does not fit. The host copies stay
 * intact either way; wake_items() gives back what was mapped. */
static int wake_device(struct engine *e, int d, struct engine_item *items, size_t count,
		       struct engine_totals *t)
{
	struct verify_wake vw;
	struct wake_copy wc;
	struct dormant_wake_copy copied;
	bool any = false;
	double start;
	int r;

	for (size_t i = 0; i < count && !any; i++)
		any = items[i].owner.device == d && !items[i].chunk->mapped;
	if (!any)
		return 0;
	r = engine_device_setup(e, d);
	if (r < 0)
		return r;
	if (e->wake_overlap) {
		r = room_check(e, d, items, count);
		if (r < 0)
			return r;
	}
	for (size_t i = 0; i < count && !e->wake_overlap; i++) {
		struct engine_item *it = &items[i];

		if (it->owner.device != d || it->chunk->mapped)
			continue;
		r = mapper_map_one(e, it);
		if (r < 0)
			return r;
		it->change->bytes_mapped += it->chunk->size;
		t->mapped += it->chunk->size;
	}
	if (atomic_load(&e->devices_stop))
		return device_stop(e, d);

	wake_copy_begin(e, d, &wc, t);
	start = now_monotonic_s();
	r = checksum_wake_start(e, d, items, count, t, &vw);
	if (r < 0)
		return r;
	r = restore_device(e, d, items, count, t, &vw, &wc);
	wake_copy_report(&wc, &copied);
	wake_copy_report_add(&t->wake_copy, &copied);
	if (wc.kernel_gbps > 0)
		e->devices[d].kernel_gbps = wc.kernel_gbps;
	if (r == 0) {
		double wait = now_monotonic_s();

		r = checksum_wake_finish(&vw, t);
		t->times.checksum_s += now_monotonic_s() - wait;
	} else
		checksum_wake_abort(&vw);
	if (r < 0)
		return r;
	t->copy_s += now_monotonic_s() - start;
	return 0;
}

void engine_wake_end(struct engine *e, struct engine_item *items, size_t count,
		     struct engine_totals *t, bool done)
{
	/* not done: what it mapped goes back (mapped_here); the host copies
	 * stay */
	for (size_t i = 0; i < count && !done; i++) {
		struct engine_item *it = &items[i];

		if (!it->mapped_here)
			continue;
		it->mapped_here = false;
		if (engine_chunk_release(e, &it->owner, it->chunk, t) < 0) {
			engine_warn(t, "undoing a wake: %s", dormant_last_error());
			continue;
		}
		it->change->bytes_mapped -= it->chunk->size;
		t->mapped -= it->chunk->size;
	}
	if (done)
		engine_copies_done(e, items, count);
}

/* Every device at once; on failure, what any of them mapped is given back. */
static int wake_items(struct engine *e, struct engine_item *items, size_t count,
		      struct engine_totals *t)
{
	int r;

	for (size_t i = 0; i < count; i++)
		items[i].mapped_here = false;
	r = devices_run(e, items, count, wake_device, t);
	if (r < 0)
		engine_wake_end(e, items, count, t, false);
	return r;
}

int engine_wake(struct engine *e, struct engine_item *items, size_t count, struct engine_totals *t)
{
	struct time_marks marks;
	int r;

	memset(t, 0, sizeof(*t));
	times_mark(e, &marks);
	r = wake_items(e, items, count, t);
	times_since(e, &marks, t);
	engine_reclaim_warning(e, t);
	return r;
}
