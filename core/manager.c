/* SPDX-License-Identifier: MIT */
/* The manager: options, tags, allocations, copies and statistics. The
 * transitions themselves and their hooks are in transition.c, the guard in
 * guard.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "manager.h"
#include "options.h"
#include "wakecopy.h"

static void alloc_release(struct dormant *m, struct alloc *a);

static const double histogram_bounds_s[DORMANT_HISTOGRAM_BUCKETS] = {
	0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120,
};

/* ---- names --------------------------------------------------------------- */

DORMANT_EXPORT const char *dormant_policy_name(enum dormant_policy policy)
{
	switch (policy) {
	case DORMANT_KEEP:
		return "keep";
	case DORMANT_DISCARD:
		return "discard";
	case DORMANT_REBUILD:
		return "rebuild";
	case DORMANT_DISK:
		return "disk";
	}
	return NULL;
}

DORMANT_EXPORT const char *dormant_state_name(enum dormant_state state)
{
	switch (state) {
	case DORMANT_AWAKE:
		return "awake";
	case DORMANT_SLEEPING:
		return "sleeping";
	case DORMANT_ASLEEP:
		return "asleep";
	case DORMANT_WAKING:
		return "waking";
	}
	return NULL;
}

DORMANT_EXPORT const char *dormant_host_mode_name(enum dormant_host_mode mode)
{
	switch (mode) {
	case DORMANT_HOST_DEFAULT:
		return "default";
	case DORMANT_HOST_RETAIN:
		return "retain";
	case DORMANT_HOST_RELEASE:
		return "release";
	case DORMANT_HOST_RECLAIMABLE:
		return "reclaimable";
	}
	return NULL;
}

DORMANT_EXPORT int dormant_policy_from_name(const char *name, enum dormant_policy *ret)
{
	if (name && strcmp(name, "keep") == 0)
		*ret = DORMANT_KEEP;
	else if (name && strcmp(name, "discard") == 0)
		*ret = DORMANT_DISCARD;
	else if (name && strcmp(name, "rebuild") == 0)
		*ret = DORMANT_REBUILD;
	else if (name && strcmp(name, "disk") == 0)
		*ret = DORMANT_DISK;
	else
		return error_set(-EINVAL,
				 "policy must be \"keep\", \"discard\", \"rebuild\" or \"disk\", "
				 "not \"%s\"",
				 name ? name : "(null)");
	return 0;
}

DORMANT_EXPORT const char *dormant_residue_mode_name(enum dormant_residue_mode mode)
{
	switch (mode) {
	case DORMANT_RESIDUE_DEFAULT:
		return "default";
	case DORMANT_RESIDUE_KEEP:
		return "keep";
	case DORMANT_RESIDUE_CHECKPOINT:
		return "checkpoint";
	}
	return NULL;
}

DORMANT_EXPORT const char *dormant_residue_state_name(enum dormant_residue_state state)
{
	switch (state) {
	case DORMANT_RESIDUE_RESIDENT:
		return "resident";
	case DORMANT_RESIDUE_CHECKPOINTED:
		return "checkpointed";
	case DORMANT_RESIDUE_UNAVAILABLE:
		return "unavailable";
	case DORMANT_RESIDUE_STUCK:
		return "stuck";
	}
	return NULL;
}

DORMANT_EXPORT int dormant_residue_mode_from_name(const char *name,
						  enum dormant_residue_mode *ret)
{
	if (!ret)
		return error_set(-EINVAL, "ret is NULL");
	if (name && strcmp(name, "default") == 0)
		*ret = DORMANT_RESIDUE_DEFAULT;
	else if (name && strcmp(name, "keep") == 0)
		*ret = DORMANT_RESIDUE_KEEP;
	else if (name && strcmp(name, "checkpoint") == 0)
		*ret = DORMANT_RESIDUE_CHECKPOINT;
	else
		return error_set(-EINVAL, "residue must be \"keep\" or \"checkpoint\", not \"%.64s\"",
				 name ? name : "(null)");
	return 0;
}

DORMANT_EXPORT int dormant_residue_stats_get(struct dormant *m, struct dormant_residue_stats *ret)
{
	if (!m || !ret)
		return error_set(-EINVAL, "manager or ret is NULL");
	residue_stats_get(&m->residue, ret);
	return 0;
}

/* ---- lifecycle ----------------------------------------------------------- */

DORMANT_EXPORT int dormant_new(const struct dormant_options *opts, struct dormant **ret)
{
	struct backend_config config = { 0 };
	struct dormant_options o;
	pthread_condattr_t attr;
	struct dormant *m;
	int r;

	if (!ret)
		return error_set(-EINVAL, "ret is NULL");
	/* options.c: what opts set, else the environment, else the defaults */
	r = options_resolve(opts, &o);
	if (r < 0)
		return r;
	if (o.copy_threads == 0) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);
		/* faulting in a release-mode sleep's fresh host copies bounds it:
		 * on the H200 16 threads fault 16 GiB in 0.44 s, 8 in 0.60 s */
		o.copy_threads = (int)MAX(1L, MIN(cpus, 16L));
	}
	/* The driver's checkpoint and restore take longer with every host byte
	 * registered with the device (on the H200, 12 GiB of pinned host copies
	 * added 0.25 s to the checkpoint and 0.3 s to the restore, more than the
	 * staging ring costs the copies): unless asked, the copies stay in
	 * ordinary memory in that mode. And unless asked, in host mode
	 * reclaimable: a release-mode sleep's CPU copies fault in every page of
	 * the host copies it has just made (on the H100, 12 GiB: the
	 * checkpointed sleep 1.38-1.48 s, against 0.98-1.09 s reusing what the
	 * last wake left; docs/benchmarks.md). */
	if (strcmp(o.residue, "checkpoint") == 0) {
		if (!options_given(&o, "pin_host"))
			o.pin_host = false;
		if (!options_given(&o, "host_mode"))
			o.host_mode = "reclaimable";
	}
	if (!o.disk_dir[0]) {
		const char *tmp = getenv("TMPDIR");

		snprintf(o.disk_dir, sizeof(o.disk_dir), "%s",
			 tmp && *tmp && strlen(tmp) < sizeof(o.disk_dir) ? tmp : "/tmp");
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return error_set(-ENOMEM, "out of host memory");
	m->options = o;
	m->log.fn = o.log_fn;
	m->log.userdata = o.log_userdata;
	m->host_mode = strcmp(o.host_mode, "retain") == 0	 ? DORMANT_HOST_RETAIN
		       : strcmp(o.host_mode, "reclaimable") == 0 ? DORMANT_HOST_RECLAIMABLE
								 : DORMANT_HOST_RELEASE;
	m->chunk_bytes = o.chunk_bytes;
	m->guard_timeout_ms = o.guard_timeout_ms;
	m->healthy = true;
	m->next_hook_id = 1;
	for (int i = 0; i < DORMANT_HISTOGRAM_BUCKETS; i++) {
		m->sleep_seconds.bounds_s[i] = histogram_bounds_s[i];
		m->wake_seconds.bounds_s[i] = histogram_bounds_s[i];
	}

	config.name = o.backend;
	config.host_devices = o.host_devices;
	config.host_device_bytes = o.host_device_bytes;
	config.host_residue_bytes = o.host_residue_bytes;
	config.log = m->log;
	r = backend_new(&config, &m->backend);
	if (r < 0)
		goto err_free;
	m->device_count = m->backend->ops->device_count(m->backend);
	residue_init(&m->residue, m->backend,
		     strcmp(o.residue, "checkpoint") == 0 ? DORMANT_RESIDUE_CHECKPOINT
							 : DORMANT_RESIDUE_KEEP,
		     (unsigned)o.residue_lock_timeout_ms, (unsigned)o.residue_timeout_ms);
	r = workers_new((unsigned)o.copy_threads, &m->workers);
	if (r < 0) {
		error_set(r, "starting copy threads");
		goto err_backend;
	}
	engine_init(&m->engine, m->backend, m->workers, &m->log, m->host_mode, o.staging_bytes,
		    o.pin_piece_bytes, o.pin_host);
	/* Devices are driven at once; parallel_devices=false drives them one
	 * after another (to measure what the parallel transition gains). */
	m->engine.serial_devices = !o.parallel_devices;
	m->engine.pin_host_bytes = o.pin_host_bytes;
	/* host copies' pieces pinned at once, on this many threads */
	m->engine.pin_threads = (unsigned)o.pin_threads;
	/* reclaimable mode: host copies kept pinned while awake, at most */
	m->engine.reclaim_pinned_max = o.reclaimable_pinned_bytes;
	/* verification after wake (dormant_set_verify() changes it later) */
	atomic_store(&m->engine.verify, o.verify);
	/* retain mode's skip of unchanged chunks */
	m->engine.skip_unchanged = o.skip_unchanged;
	/* the wake's order: map ahead of the copies (false: map all, then copy,
	 * as before the mapper, to compare), on how many threads */
	m->engine.wake_overlap = o.wake_overlap;
	m->engine.map_threads = (unsigned)o.wake_map_threads;
	/* what copies a wake to the device (wakecopy.h) */
	m->engine.wake_copy = strcmp(o.wake_copy, "engine") == 0   ? WAKE_COPY_ENGINE
			      : strcmp(o.wake_copy, "kernel") == 0 ? WAKE_COPY_KERNEL
								   : WAKE_COPY_AUTO;
	m->engine.wake_copy_probe_bytes = o.wake_copy_probe_bytes;
	m->engine.wake_copy_reprobe_bytes = o.wake_copy_reprobe_bytes;
	/* disk copies: the directory is copied in when a sleep starts */
	m->engine.disk_chunk_bytes = o.disk_chunk_bytes;
	m->engine.disk_names = o.disk_names;
	m->engine.disk_read = strcmp(o.disk_read, "stream") == 0   ? ENGINE_DISK_STREAM
			      : strcmp(o.disk_read, "cached") == 0 ? ENGINE_DISK_CACHED
								   : ENGINE_DISK_DIRECT;
	pthread_mutex_init(&m->lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&m->guard_cond, &attr);
	pthread_condattr_destroy(&attr);
	/* what the first sleep would set up, ahead of it (warmup.h) */
	warmup_init(m, strcmp(o.warmup, "off") == 0	   ? WARMUP_OFF
		       : strcmp(o.warmup, "device") == 0 ? WARMUP_DEVICE
							 : WARMUP_AUTO,
		    o.warmup_settle_ms);
	log_write(&m->log, DORMANT_LOG_INFO,
		  "dormant: %s backend, %d device(s), host mode %s, residue %s",
		  m->backend->ops->name, m->device_count, dormant_host_mode_name(m->host_mode),
		  dormant_residue_mode_name(m->residue.mode));
	*ret = m;
	return 0;

err_backend:
	residue_finish(&m->residue);
	backend_destroy(m->backend);
err_free:
	free(m);
	return r;
}

/* The manager PyTorch's entry points use (torch.c): here, below them, so
 * that dormant_destroy() detaches it without calling up into torch.c. */
static _Atomic(struct dormant *) torch_manager;

DORMANT_EXPORT int dormant_torch_set_manager(struct dormant *m)
{
	atomic_store(&torch_manager, m);
	return 0;
}

DORMANT_EXPORT struct dormant *dormant_torch_get_manager(void)
{
	return atomic_load(&torch_manager);
}

static void torch_forget(struct dormant *m)
{
	struct dormant *expected = m;

	atomic_compare_exchange_strong(&torch_manager, &expected, NULL);
}

DORMANT_EXPORT void dormant_destroy(struct dormant *m)
{
	static const uint64_t nothing[DORMANT_DEVICES_MAX];
	struct dormant_residue_step step = { 0 };
	struct alloc_failures deferred = { 0 };

	if (!m)
		return;
	torch_forget(m);
	warmup_finish(m);
	/* The process's device state back first: freeing needs the driver. If
	 * it cannot come back (stuck), nothing of the device is touched: its
	 * memory goes with the process. */
	if (residue_checkpointed(&m->residue) &&
	    residue_restore(&m->residue, m->device_count, nothing, &step) < 0) {
		log_write(&m->log, DORMANT_LOG_ERROR,
			  "dormant_destroy: the device state stays checkpointed (%s): device "
			  "memory is left to the process's end",
			  dormant_last_error());
		residue_finish(&m->residue);
		return;
	}
	pthread_mutex_lock(&m->lock);
	alloc_destroy_deferred(m, &deferred);
	alloc_failures_log(m, &deferred);
	while (m->alloc_count)
		alloc_release(m, m->allocs[--m->alloc_count]);
	pthread_mutex_unlock(&m->lock);
	/* Background frees use the tags: finish them before the tags go. */
	workers_destroy(m->workers);
	engine_finish(&m->engine);
	for (size_t i = 0; i < m->tag_count; i++)
		free(m->tags[i]);
	free(m->allocs);
	residue_finish(&m->residue);
	backend_destroy(m->backend);
	pthread_cond_destroy(&m->guard_cond);
	pthread_mutex_destroy(&m->lock);
	free(m);
}

DORMANT_EXPORT int dormant_option_value(const struct dormant *m, const char *name, char *buf,
					size_t size)
{
	pthread_mutex_t *lock;
	int r;

	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	/* disk_dir changes at run time (dormant_set_disk_dir()), under the lock */
	lock = (pthread_mutex_t *)&m->lock;
	pthread_mutex_lock(lock);
	r = options_format(&m->options, name, buf, size);
	pthread_mutex_unlock(lock);
	return r;
}

DORMANT_EXPORT int dormant_set_disk_dir(struct dormant *m, const char *dir)
{
	if (!m || !dir)
		return error_set(-EINVAL, "%s is NULL", m ? "the directory" : "the manager");
	if (dir[0] != '/')
		return error_set(-EINVAL, "'%.64s' is not an absolute path", dir);
	if (strlen(dir) >= sizeof(m->options.disk_dir))
		return error_set(-EINVAL, "the directory is longer than %d bytes",
				 DORMANT_PATH_MAX - 1);
	pthread_mutex_lock(&m->lock);
	snprintf(m->options.disk_dir, sizeof(m->options.disk_dir), "%s", dir);
	pthread_mutex_unlock(&m->lock);
	return 0;
}

DORMANT_EXPORT const char *dormant_backend_name(const struct dormant *m)
{
	return m->backend->ops->name;
}

int manager_check_not_checkpointed(struct dormant *m)
{
	if (!residue_checkpointed(&m->residue))
		return 0;
	return error_set(-EBUSY, "the process's device state is checkpointed (residue mode "
				 "checkpoint): no device call until a wake restores it");
}

void manager_log_residue_start(struct dormant *m)
{
	char line[512];
	bool warning = false;

	if (residue_start_take(&m->residue, line, sizeof(line), &warning))
		log_write(&m->log, warning ? DORMANT_LOG_WARNING : DORMANT_LOG_INFO, "%s", line);
}

DORMANT_EXPORT int dormant_device_count(struct dormant *m)
{
	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	return m->device_count;
}

/* ---- tags ---------------------------------------------------------------- */

struct tag *tag_find(struct dormant *m, const char *name)
{
	for (size_t i = 0; i < m->tag_count; i++)
		if (strcmp(m->tags[i]->name, name) == 0)
			return m->tags[i];
	return NULL;
}

static int tag_get(struct dormant *m, const char *name, struct tag **ret)
{
	struct tag *tag = tag_find(m, name);

	if (!tag) {
		if (m->tag_count == DORMANT_TAGS_MAX)
			return error_set(-ENOSPC, "too many tags (at most %d)", DORMANT_TAGS_MAX);
		tag = calloc(1, sizeof(*tag));
		if (!tag)
			return error_set(-ENOMEM, "out of host memory");
		snprintf(tag->name, sizeof(tag->name), "%s", name);
		tag->policy = DORMANT_KEEP;
		tag->state = DORMANT_AWAKE;
		m->tags[m->tag_count++] = tag;
	}
	*ret = tag;
	return 0;
}

DORMANT_EXPORT int dormant_set_policy(struct dormant *m, const char *name,
				      enum dormant_policy policy)
{
	struct tag *tag;
	int r;

	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	r = tag_name_check(name);
	if (r < 0)
		return r;
	if (!dormant_policy_name(policy))
		return error_set(-EINVAL, "unknown policy %d", (int)policy);
	pthread_mutex_lock(&m->lock);
	r = tag_get(m, name, &tag);
	if (r == 0 && tag->state != DORMANT_AWAKE && tag->policy != policy)
		r = error_set(-EBUSY, "tag '%s' is %s; its policy can change only while awake", name,
			      dormant_state_name(tag->state));
	/* no write when nothing changes: a running transition reads the policy
	 * without the lock (found by ThreadSanitizer, tests/tsan) */
	if (r == 0 && tag->policy != policy)
		tag->policy = policy;
	pthread_mutex_unlock(&m->lock);
	return r;
}

DORMANT_EXPORT int dormant_set_rebuild(struct dormant *m, const char *name, dormant_rebuild_fn fn,
				       void *userdata)
{
	struct tag *tag;
	int r;

	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	r = tag_name_check(name);
	if (r < 0)
		return r;
	pthread_mutex_lock(&m->lock);
	r = tag_get(m, name, &tag);
	if (r == 0) {
		tag->rebuild_fn = fn;
		tag->rebuild_userdata = fn ? userdata : NULL;
	}
	pthread_mutex_unlock(&m->lock);
	return r;
}

/* ---- allocations --------------------------------------------------------- */

/* Index of the first allocation whose ptr is > p. */
static size_t alloc_upper_bound(struct dormant *m, uintptr_t p)
{
	size_t lo = 0, hi = m->alloc_count;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if ((uintptr_t)m->allocs[mid]->ptr <= p)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The allocation holding [p, p + size), or NULL. */
struct alloc *alloc_containing(struct dormant *m, uintptr_t p, size_t size)
{
	size_t i = alloc_upper_bound(m, p);
	struct alloc *a;

	if (i == 0)
		return NULL;
	a = m->allocs[i - 1];
	if (p + size < p || p + size > (uintptr_t)a->ptr + a->size)
		return NULL;
	return a;
}

static int alloc_insert(struct dormant *m, struct alloc *a)
{
	size_t i;

	if (m->alloc_count == m->alloc_capacity) {
		size_t capacity = m->alloc_capacity ? m->alloc_capacity * 2 : 64;
		struct alloc **grown = realloc(m->allocs, capacity * sizeof(*grown));

		if (!grown)
			return error_set(-ENOMEM, "out of host memory");
		m->allocs = grown;
		m->alloc_capacity = capacity;
	}
	i = alloc_upper_bound(m, (uintptr_t)a->ptr);
	memmove(&m->allocs[i + 1], &m->allocs[i], (m->alloc_count - i) * sizeof(*m->allocs));
	m->allocs[i] = a;
	m->alloc_count++;
	return 0;
}

/* Chunk owners (dedicated allocations and slabs) are on the tag's list. */
static void owner_link(struct tag *tag, struct alloc *a)
{
	a->tag = tag;
	a->prev = NULL;
	a->next = tag->allocs;
	if (tag->allocs)
		tag->allocs->prev = a;
	tag->allocs = a;
	tag->reserved_bytes += a->reserved;
	if (a->is_slab) {
		a->slab_next = tag->slabs;
		tag->slabs = a;
	}
}

static void owner_unlink(struct alloc *a)
{
	struct tag *tag = a->tag;

	if (a->prev)
		a->prev->next = a->next;
	else
		tag->allocs = a->next;
	if (a->next)
		a->next->prev = a->prev;
	a->prev = a->next = NULL;
	tag->reserved_bytes -= a->reserved;
	if (a->is_slab) {
		struct alloc **link = &tag->slabs;

		while (*link != a)
			link = &(*link)->slab_next;
		*link = a->slab_next;
		a->slab_next = NULL;
	}
}

void chunk_update_data_bytes(struct alloc *a, struct chunk *c)
{
	size_t offset = c->va - (uintptr_t)a->ptr;
	size_t used = a->is_slab ? slab_space_used_end(&a->space) : a->size;

	c->data_bytes = used > offset ? MIN(c->size, used - offset) : 0;
}

int chunk_plan(struct alloc *a, struct chunk *c)
{
	size_t offset = c->va - (uintptr_t)a->ptr;

	chunk_update_data_bytes(a, c);
	marks_normalize(&a->marks);
	if (a->is_slab)
		return plan_compute(&c->plan, offset, c->data_bytes, a->space.free,
				    a->space.free_count, &a->marks);
	return plan_compute(&c->plan, offset, c->data_bytes, NULL, 0, &a->marks);
}

/* Give back what a user allocation holds (it is out of m->allocs already). */
static void alloc_release(struct dormant *m, struct alloc *a)
{
	struct tag *tag = a->tag;

	tag->allocations--;
	tag->bytes -= a->size;
	if (a->slab) {
		struct alloc *slab = a->slab;

		size_t offset = (uintptr_t)a->ptr - (uintptr_t)slab->ptr;

		/* the range may be handed out again: its marks must not stay */
		marks_remove(&slab->marks, offset, round_up(a->size, SLAB_ALIGN));
		slab_space_give(&slab->space, offset, a->size);
		free(a);
		if (!slab_space_empty(&slab->space))
			return;
		a = slab; /* its last allocation: the slab goes too */
	}
	owner_unlink(a);
	if (a->in_transition) {
		a->doomed = true; /* the transition holds its chunks; it frees it */
	} else if (residue_checkpointed(&m->residue)) {
		/* freeing calls the driver: after the restore */
		a->next = m->deferred;
		m->deferred = a;
	} else {
		alloc_destroy(m, a);
	}
}

static int granularity_get(struct dormant *m, int device, size_t *ret)
{
	int r;

	if (m->granularity[device] == 0) {
		r = m->backend->ops->granularity(m->backend, device, &m->granularity[device]);
		if (r < 0)
			return r;
	}
	*ret = m->granularity[device];
	return 0;
}

/* bytes as "1.5 GiB" (or "512 MiB", "4 KiB", "17 bytes") into buf. */
static const char *bytes_text(uint64_t bytes, char *buf, size_t len)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double value = (double)bytes;
	size_t unit = 0;

	if (bytes < 1024) {
		snprintf(buf, len, "%llu bytes", (unsigned long long)bytes);
		return buf;
	}
	value /= 1024;
	while (value >= 1024 && unit + 1 < ARRAY_SIZE(units)) {
		value /= 1024;
		unit++;
	}
	snprintf(buf, len, value == (double)(uint64_t)value ? "%.0f %s" : "%.1f %s", value,
		 units[unit]);
	return buf;
}

/* An allocation the device cannot hold fails at once, naming the size asked
 * for, rather than after mapping (and then unmapping) every chunk that fits:
 * seconds on a large device, and with the chunk size in the message. Where
 * the device cannot say what it holds, the mapping finds out. */
static int fits_check(struct backend *b, int device, size_t size, size_t reserved)
{
	char asked[32], free_text[32], total_text[32];
	uint64_t free_bytes, total_bytes;

	if (b->ops->mem_info(b, device, &free_bytes, &total_bytes) < 0 || total_bytes == 0)
		return 0;
	bytes_text(size, asked, sizeof(asked));
	bytes_text(total_bytes, total_text, sizeof(total_text));
	if (reserved > total_bytes)
		return error_set(-ENOMEM, "%s is more than device %d holds (%s)", asked, device,
				 total_text);
	if (reserved > free_bytes)
		return error_set(-ENOMEM, "%s is more than device %d has free (%s of %s)", asked,
				 device, bytes_text(free_bytes, free_text, sizeof(free_text)),
				 total_text);
	return 0;
}

static int alloc_map(struct dormant *m, struct tag *tag, int policy, size_t size, int device,
		     struct alloc **ret)
{
	struct backend *b = m->backend;
	size_t granularity, reserved, chunk_bytes, count;
	struct alloc *a;
	struct chunk_owner owner;
	char why[DORMANT_ERROR_MAX];
	uintptr_t va;
	size_t mapped = 0;
	int r;

	r = granularity_get(m, device, &granularity);
	if (r < 0)
		return r;
	if (size > SIZE_MAX - granularity)
		return error_set(-ENOMEM, "%zu bytes is more than any device has", size);
	reserved = round_up(size, granularity);
	r = fits_check(b, device, size, reserved);
	if (r < 0)
		return r;
	chunk_bytes = round_up(m->chunk_bytes, granularity);
	count = (reserved + chunk_bytes - 1) / chunk_bytes;
	a = calloc(1, sizeof(*a) + count * sizeof(a->chunks[0]));
	if (!a)
		return error_set(-ENOMEM, "out of host memory");
	r = b->ops->va_reserve(b, device, reserved, granularity, &va);
	if (r < 0)
		goto err_free;
	a->ptr = (void *)va;
	a->size = size;
	a->reserved = reserved;
	a->device = device;
	a->policy = policy;
	a->tag = tag;
	a->chunk_count = count;
	owner = alloc_owner(a);
	for (size_t i = 0; i < count; i++) {
		struct chunk *c = &a->chunks[i];
		size_t offset = i * chunk_bytes;

		c->va = va + offset;
		c->size = MIN(chunk_bytes, reserved - offset);
		chunk_update_data_bytes(a, c);
		r = backend_mem_create_map(b, device, c->va, c->size, &c->handle);
		if (r < 0)
			goto err_unmap;
		c->mapped = true;
		mapped++;
		atomic_fetch_add(&m->engine.device_bytes[device], c->size);
		atomic_fetch_add(&tag->held.device_bytes, c->size);
	}
	*ret = a;
	return 0;

err_unmap:
	snprintf(why, sizeof(why), "%s", dormant_last_error());
	while (mapped--)
		if (engine_chunk_drop(&m->engine, &owner, &a->chunks[mapped]) < 0)
			log_write(&m->log, DORMANT_LOG_WARNING, "undoing an allocation: %s",
				  dormant_last_error());
	b->ops->va_free(b, va, reserved);
	error_set(r, "%s", why); /* the failure the caller gets */
err_free:
	free(a);
	return r;
}

/* The size of a tag's next slab on a device for a policy: it grows with what
 * the tag already has there, so a few slabs hold many small allocations. */
static size_t slab_next_size(struct dormant *m, struct tag *tag, int policy, int device,
			     size_t size)
{
	size_t total = 0, next = SLAB_MIN_BYTES;

	for (struct alloc *s = tag->slabs; s; s = s->slab_next)
		if (s->device == device && s->policy == policy)
			total += s->reserved;
	while (next < total && next < SLAB_MAX_BYTES)
		next *= 2;
	return MAX(next, round_up(size, m->granularity[device]));
}

/* Slabs are keyed by (tag, device, asked-for policy): one slab's chunks
 * sleep one way. A slab of DORMANT_POLICY_TAG follows the tag's policy. */
static int slab_alloc(struct dormant *m, struct tag *tag, int policy, size_t size, int device,
		      struct alloc **ret)
{
	struct alloc *slab, *a;
	size_t offset;
	int r = -ENOSPC;

	a = calloc(1, sizeof(*a));
	if (!a)
		return error_set(-ENOMEM, "out of host memory");
	for (slab = tag->slabs; slab; slab = slab->slab_next) {
		if (slab->device != device || slab->policy != policy)
			continue;
		r = slab_space_take(&slab->space, size, &offset);
		if (r != -ENOSPC)
			break;
	}
	if (r == -ENOSPC) {
		size_t slab_size = slab_next_size(m, tag, policy, device, size);

		r = alloc_map(m, tag, policy, slab_size, device, &slab);
		if (r < 0)
			goto err_free;
		slab->is_slab = true;
		r = slab_space_init(&slab->space, slab_size);
		if (r < 0) {
			alloc_destroy(m, slab);
			goto err_free;
		}
		owner_link(tag, slab);
		r = slab_space_take(&slab->space, size, &offset);
	}
	if (r < 0)
		goto err_free;
	a->ptr = (char *)slab->ptr + offset;
	a->size = size;
	a->device = device;
	a->policy = policy;
	a->tag = tag;
	a->slab = slab;
	*ret = a;
	return 0;

err_free:
	free(a);
	return r;
}

static bool alloc_policy_valid(int policy)
{
	return policy == DORMANT_KEEP || policy == DORMANT_DISCARD || policy == DORMANT_DISK ||
	       policy == DORMANT_POLICY_TAG;
}

/* Whether an allocation of policy (or its tag's) goes to a named disk file
 * of its own: disk_names lists a file per allocation, as torch_memory_saver
 * does (the engine gives each allocation its file then), so such
 * allocations get chunks of their own instead of a slab's share. */
static bool disk_named(const struct dormant *m, const struct tag *tag, int policy)
{
	return m->engine.disk_names &&
	       (policy == DORMANT_POLICY_TAG ? (int)tag->policy : policy) == DORMANT_DISK;
}

DORMANT_EXPORT int dormant_alloc_policy(struct dormant *m, const char *name, int policy,
					size_t size, int device, void **ret_ptr)
{
	struct tag *tag;
	struct alloc *a = NULL;
	int r;

	if (!m || !ret_ptr)
		return error_set(-EINVAL, "manager or ret_ptr is NULL");
	r = tag_name_check(name);
	if (r < 0)
		return r;
	if (size == 0)
		return error_set(-EINVAL, "cannot allocate 0 bytes");
	if (!alloc_policy_valid(policy))
		return error_set(-EINVAL,
				 "an allocation's policy must be keep (%d), discard (%d), disk (%d) "
				 "or the tag's (%d), not %d",
				 DORMANT_KEEP, DORMANT_DISCARD, DORMANT_DISK, DORMANT_POLICY_TAG,
				 policy);
	if (device < 0 || device >= m->device_count)
		return error_set(-ENODEV, "no device %d", device);

	pthread_mutex_lock(&m->lock);
	r = manager_check_not_checkpointed(m);
	if (r < 0)
		goto out;
	r = tag_get(m, name, &tag);
	if (r < 0)
		goto out;
	if (tag->state != DORMANT_AWAKE) {
		r = error_set(-EBUSY, "tag '%s' is %s; wake it before allocating", name,
			      dormant_state_name(tag->state));
		goto out;
	}
	r = granularity_get(m, device, &(size_t){ 0 });
	if (r == 0)
		r = size <= SLAB_ALLOC_MAX && !disk_named(m, tag, policy)
			    ? slab_alloc(m, tag, policy, size, device, &a)
			    : alloc_map(m, tag, policy, size, device, &a);
	if (r < 0) {
		error_prefix(r, "allocating %zu bytes under tag '%s' on device %d", size, name,
			     device);
		goto out;
	}
	if (!a->slab)
		owner_link(tag, a);
	tag->allocations++;
	tag->bytes += a->size;
	r = alloc_insert(m, a);
	if (r < 0) {
		alloc_release(m, a);
		goto out;
	}
	*ret_ptr = a->ptr;
	warmup_note_alloc(m);
out:
	pthread_mutex_unlock(&m->lock);
	return r;
}

DORMANT_EXPORT int dormant_alloc_on(struct dormant *m, const char *tag, size_t size, int device,
				    void **ret_ptr)
{
	return dormant_alloc_policy(m, tag, DORMANT_POLICY_TAG, size, device, ret_ptr);
}

DORMANT_EXPORT int dormant_alloc(struct dormant *m, const char *tag, size_t size, void **ret_ptr)
{
	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	/* asking which device is current is a device call too */
	if (residue_checkpointed(&m->residue))
		return manager_check_not_checkpointed(m);
	return dormant_alloc_on(m, tag, size, m->backend->ops->current_device(m->backend), ret_ptr);
}

DORMANT_EXPORT int dormant_free(struct dormant *m, void *ptr)
{
	struct alloc *a;
	size_t i;

	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	if (!ptr)
		return 0;
	pthread_mutex_lock(&m->lock);
	i = alloc_upper_bound(m, (uintptr_t)ptr);
	if (i == 0 || m->allocs[i - 1]->ptr != ptr) {
		pthread_mutex_unlock(&m->lock);
		return error_set(-EINVAL, "%p was not allocated by this manager", ptr);
	}
	a = m->allocs[i - 1];
	memmove(&m->allocs[i - 1], &m->allocs[i], (m->alloc_count - i) * sizeof(*m->allocs));
	m->alloc_count--;
	alloc_release(m, a);
	pthread_mutex_unlock(&m->lock);
	return 0;
}

DORMANT_EXPORT int dormant_mark_unused(struct dormant *m, void *ptr, size_t size)
{
	struct alloc *a, *owner;
	int r;

	if (!m || !ptr)
		return error_set(-EINVAL, "manager or ptr is NULL");
	pthread_mutex_lock(&m->lock);
	a = alloc_containing(m, (uintptr_t)ptr, size);
	if (!a || (size == 0 && (uintptr_t)ptr == (uintptr_t)a->ptr + a->size))
		r = error_set(-EINVAL, "[%p, +%zu) is not inside one allocation of this manager",
			      ptr, size);
	else if (a->tag->state != DORMANT_AWAKE)
		r = error_set(-EBUSY, "tag '%s' is %s; marks are for the next sleep of an awake tag",
			      a->tag->name, dormant_state_name(a->tag->state));
	else {
		owner = a->slab ? a->slab : a;
		r = marks_add(&owner->marks, (uintptr_t)ptr - (uintptr_t)owner->ptr, size);
		if (r < 0)
			error_prefix(r, "marking %zu bytes at %p unused", size, ptr);
	}
	pthread_mutex_unlock(&m->lock);
	return r;
}

/* ---- copies -------------------------------------------------------------- */

static int copy_sync(struct dormant *m, void *host, const void *device_ptr, size_t size,
		     bool to_host)
{
	struct alloc *a;
	int r;

	if (!m || !host || !device_ptr)
		return error_set(-EINVAL, "NULL argument");
	if (size == 0)
		return 0;
	pthread_mutex_lock(&m->lock);
	a = alloc_containing(m, (uintptr_t)device_ptr, size);
	if (!a)
		r = error_set(-EINVAL, "[%p, +%zu) is not inside one allocation of this manager",
			      device_ptr, size);
	else if (a->tag->state != DORMANT_AWAKE &&
		 !(m->rebuilding && a->tag->state != DORMANT_ASLEEP))
		/* rebuild callbacks copy into (and from) the tags of their
		 * transition, which are mapped by then */
		r = error_set(-EBUSY, "tag '%s' is %s", a->tag->name,
			      dormant_state_name(a->tag->state));
	else
		r = backend_copy_sync(m->backend, a->device, host, (uintptr_t)device_ptr, size,
				      to_host);
	pthread_mutex_unlock(&m->lock);
	return r;
}

DORMANT_EXPORT int dormant_copy_to_host(struct dormant *m, void *dst, const void *device_src,
					size_t size)
{
	return copy_sync(m, dst, device_src, size, true);
}

DORMANT_EXPORT int dormant_copy_to_device(struct dormant *m, void *device_dst, const void *src,
					  size_t size)
{
	return copy_sync(m, (void *)src, device_dst, size, false);
}

/* ---- statistics ---------------------------------------------------------- */

DORMANT_EXPORT int dormant_stats_get(struct dormant *m, struct dormant_stats *ret)
{
	struct backend *b;
	bool checkpointed;
	int devices;

	if (!m || !ret)
		return error_set(-EINVAL, "manager or ret is NULL");
	b = m->backend;
	memset(ret, 0, sizeof(*ret));
	snprintf(ret->backend, sizeof(ret->backend), "%s", b->ops->name);
	ret->host_mode = m->host_mode;

	pthread_mutex_lock(&m->lock);
	ret->healthy = m->healthy;
	memcpy(ret->health_error, m->health_error, sizeof(ret->health_error));
	ret->transition_running = m->transition_running;
	ret->steps_running = m->steps_running;
	ret->tag_count = m->tag_count;
	for (size_t i = 0; i < m->tag_count; i++) {
		const struct tag *tag = m->tags[i];
		struct dormant_tag_stats *ts = &ret->tags[i];

		memcpy(ts->tag, tag->name, sizeof(ts->tag));
		ts->policy = tag->policy;
		ts->state = tag->state;
		ts->allocations = tag->allocations;
		ts->bytes = tag->bytes;
		ts->reserved_bytes = tag->reserved_bytes;
		ts->device_bytes = atomic_load(&tag->held.device_bytes);
		ts->host_bytes = atomic_load(&tag->held.host_bytes);
		ts->disk_bytes = atomic_load(&tag->held.disk_bytes);
		ts->sleeps = tag->sleeps;
		ts->wakes = tag->wakes;
		ret->allocations += ts->allocations;
		ret->bytes += ts->bytes;
		ret->device_bytes += ts->device_bytes;
		ret->host_bytes += ts->host_bytes;
		ret->disk_bytes += ts->disk_bytes;
	}
	ret->sleeps_ok = m->sleeps_ok;
	ret->sleeps_failed = m->sleeps_failed;
	ret->wakes_ok = m->wakes_ok;
	ret->wakes_failed = m->wakes_failed;
	ret->sleeps_noop = m->noops[0];
	ret->wakes_noop = m->noops[1];
	ret->noops = m->noops[0] + m->noops[1];
	ret->sleeps_busy = m->busy[0];
	ret->wakes_busy = m->busy[1];
	ret->busy_rejections = m->busy[0] + m->busy[1];
	ret->bytes_to_host_total = m->bytes_to_host_total;
	ret->bytes_to_device_total = m->bytes_to_device_total;
	ret->bytes_released_total = m->bytes_released_total;
	ret->bytes_zeroed_total = m->bytes_zeroed_total;
	ret->bytes_skipped_total = m->bytes_skipped_total;
	ret->verify = atomic_load(&m->engine.verify);
	ret->bytes_unchanged_total = m->bytes_unchanged_total;
	ret->chunks_verified_total = m->chunks_verified_total;
	ret->chunk_mismatches_total = m->chunk_mismatches_total;
	ret->wakes_copy_engine = m->wakes_copy_engine;
	ret->wakes_copy_kernel = m->wakes_copy_kernel;
	ret->wakes_copy_mixed = m->wakes_copy_mixed;
	ret->bytes_to_device_engine_total = m->bytes_to_device_engine_total;
	ret->bytes_to_device_kernel_total = m->bytes_to_device_kernel_total;
	ret->last_sleep = m->last_sleep;
	ret->last_wake = m->last_wake;
	ret->sleep_seconds = m->sleep_seconds;
	ret->wake_seconds = m->wake_seconds;
	ret->sleep_times_total = m->sleep_times_total;
	ret->wake_times_total = m->wake_times_total;
	warmup_stats_get(m, &ret->warmup);
	pthread_mutex_unlock(&m->lock);

	ret->staging_bytes = atomic_load(&m->engine.staging_held);
	devices = MIN(m->device_count, DORMANT_DEVICES_MAX);
	/* while checkpointed the devices are read from outside
	 * (residue_free_outside(): the helper reads them): a CUDA call would
	 * wait for the restore */
	checkpointed = !residue_device_enter(&m->residue);
	for (int d = 0; d < devices; d++) {
		struct dormant_device_stats *ds = &ret->devices[ret->device_count];
		int r;

		if (!checkpointed && !b->ops->device_active(b, d))
			continue;
		if (checkpointed && !m->residue.used[d])
			continue;
		ds->ordinal = d;
		ds->managed_bytes = atomic_load(&m->engine.device_bytes[d]);
		r = checkpointed ? residue_free_outside(&m->residue, d, false, &ds->free_bytes,
							&ds->total_bytes)
				 : b->ops->mem_info(b, d, &ds->free_bytes, &ds->total_bytes);
		if (r < 0)
			ds->free_bytes = ds->total_bytes = 0;
		ret->device_count++;
	}
	if (!checkpointed)
		residue_device_leave(&m->residue);
	else
		manager_log_residue_start(m); /* a read that found the helper dead started another */
	return 0;
}

/* ---- testing ------------------------------------------------------------- */

DORMANT_EXPORT int dormant_debug_inject_fault(struct dormant *m, enum dormant_fault_op op,
					      unsigned nth, int error, bool repeat)
{
	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	return backend_fault_arm(m->backend, op, nth, error, repeat);
}

DORMANT_EXPORT int dormant_debug_inject_device_fault(struct dormant *m, int device,
						     enum dormant_fault_op op, unsigned nth,
						     int error, bool repeat)
{
	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	if (device < 0)
		return error_set(-EINVAL, "no device %d to inject a fault on", device);
	return backend_fault_arm_on(m->backend, op, device, nth, error, repeat);
}

DORMANT_EXPORT uint64_t dormant_debug_op_count(struct dormant *m, enum dormant_fault_op op)
{
	if (!m || (unsigned)op >= DORMANT_FAULT_OPS)
		return 0;
	return atomic_load(&m->backend->faults[op].calls);
}

DORMANT_EXPORT int dormant_debug_occupy(struct dormant *m, int device, size_t bytes)
{
	int r;

	if (!m)
		return error_set(-EINVAL, "manager is NULL");
	pthread_mutex_lock(&m->lock);
	r = manager_check_not_checkpointed(m);
	if (r == 0)
		r = backend_occupy(m->backend, device, bytes);
	pthread_mutex_unlock(&m->lock);
	return r;
}

DORMANT_EXPORT int dormant_debug_defer_write(struct dormant *m, void *device_dst, const void *src,
					     size_t size)
{
	struct alloc *a;
	int r;

	if (!m || !device_dst || !src)
		return error_set(-EINVAL, "NULL argument");
	if (!m->backend->ops->defer_write)
		return error_set(-ENOTSUP, "the %s backend has no deferred writes",
				 m->backend->ops->name);
	pthread_mutex_lock(&m->lock);
	a = alloc_containing(m, (uintptr_t)device_dst, size);
	if (!a)
		r = error_set(-EINVAL, "[%p, +%zu) is not inside one allocation of this manager",
			      device_dst, size);
	else if (a->tag->state != DORMANT_AWAKE)
		r = error_set(-EBUSY, "tag '%s' is %s", a->tag->name,
			      dormant_state_name(a->tag->state));
	else
		r = m->backend->ops->defer_write(m->backend, a->device, (uintptr_t)device_dst, src,
						 size);
	pthread_mutex_unlock(&m->lock);
	return r;
}

/* ---- whole-process capture ----------------------------------------------- */

DORMANT_EXPORT bool dormant_owns(struct dormant *m, const void *ptr)
{
	size_t i;
	bool owned;

	if (!m || !ptr)
		return false;
	pthread_mutex_lock(&m->lock);
	i = alloc_upper_bound(m, (uintptr_t)ptr);
	owned = i > 0 && m->allocs[i - 1]->ptr == ptr;
	pthread_mutex_unlock(&m->lock);
	return owned;
}
