/* SPDX-License-Identifier: MIT */
/*
 * torch_memory_saver's C ABI (the tms_* functions of its preload and torch
 * hook libraries), on dormant: the same names, signatures and meaning, so
 * that code which loads that library with ctypes, or through
 * torch_memory_saver._impl._binary_wrapper.cdll, gets dormant (see
 * docs/migrating.md). The library is installed under torch_memory_saver's
 * file names too (preload/meson.build).
 *
 * How each maps:
 *  - interesting region: the thread's capture flag
 *    (dormant_preload_set_thread_capture(); $TMS_INIT_ENABLE its default);
 *    once the drop-in announces its regions (dormant_preload_set_thread_region())
 *    it captures only inside them, or where the default captures;
 *  - current tag: the thread's dormant tag (dormant_set_thread_tag());
 *  - cpu backup, disk backup: the thread's allocation policy, DORMANT_DISK
 *    with disk backup, DORMANT_KEEP with cpu backup, DORMANT_DISCARD without
 *    ($TMS_INIT_ENABLE_CPU_BACKUP, $TMS_INIT_ENABLE_DISK_BACKUP their
 *    defaults);
 *  - disk backup directory: the manager's disk_dir (dormant_set_disk_dir();
 *    $TMS_DISK_BACKUP_DIR when the manager is made);
 *  - cpu backup backend: "pinned" or "mmap" ($TMS_INIT_CPU_BACKUP_BACKEND);
 *    dormant pins its host copies itself, and once "mmap" was chosen a
 *    resume returns only after the host copies it no longer needs are
 *    given back to the operating system;
 *  - retain: the manager's host mode (dormant_set_host_mode());
 *  - memory margin: a resume that would leave less device memory free than
 *    the margin fails (cudaErrorMemoryAllocation) before it maps anything;
 *  - pause / resume: dormant_sleep() / dormant_wake() of the tag (NULL: all);
 *  - cpu backup pointer: dormant_host_backup().
 * The manager is the process's: the shim's under whole-process capture, else
 * the one attached to dormant_torch_malloc() (dormant_torch_set_manager(),
 * as the Python package does). Nothing here exits, aborts or prints: where
 * torch_memory_saver would abort on bad input, the call does nothing.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "dormant-preload.h"
#include "preload-private.h"

enum { CUDA_SUCCESS = 0, CUDA_ERROR_MEMORY_ALLOCATION = 2, CUDA_ERROR_UNKNOWN = 999 };

/* -1: unset (the environment's default applies) */
static _Thread_local int thread_cpu_backup = -1;
static _Thread_local int thread_disk_backup = -1;
static _Thread_local char thread_backend[8];
static _Thread_local char thread_tag_text[DORMANT_TAG_MAX + 1];

static _Atomic uint64_t margin_bytes;
static atomic_bool mmap_used;
static atomic_int pending_retain = -1; /* retain asked for before a manager existed */

static pthread_mutex_t dir_lock = PTHREAD_MUTEX_INITIALIZER;
static char *disk_backup_dir;
static atomic_bool dir_pending; /* set, not yet given to the manager */

DORMANT_EXPORT void tms_set_interesting_region(bool is_interesting_region);
DORMANT_EXPORT bool tms_get_interesting_region(void);
DORMANT_EXPORT void tms_set_current_tag(const char *tag);
DORMANT_EXPORT const char *tms_get_current_tag(void);
DORMANT_EXPORT bool tms_get_enable_cpu_backup(void);
DORMANT_EXPORT void tms_set_enable_cpu_backup(bool enable_cpu_backup);
DORMANT_EXPORT const char *tms_get_cpu_backup_backend(void);
DORMANT_EXPORT void tms_set_cpu_backup_backend(const char *backend);
DORMANT_EXPORT bool tms_get_enable_disk_backup(void);
DORMANT_EXPORT void tms_set_enable_disk_backup(bool enable_disk_backup);
DORMANT_EXPORT void tms_set_disk_backup_dir(const char *dir);
DORMANT_EXPORT const char *tms_get_disk_backup_dir(void);
DORMANT_EXPORT void set_memory_margin_bytes(uint64_t value);
DORMANT_EXPORT void tms_set_retain_cpu_backup(bool retain_cpu_backup);
DORMANT_EXPORT bool tms_get_retain_cpu_backup(void);
DORMANT_EXPORT int tms_pause(const char *tag);
DORMANT_EXPORT int tms_resume(const char *tag);
DORMANT_EXPORT uint8_t *tms_get_cpu_backup_pointer(const uint8_t *gpu_ptr, uint64_t size);
DORMANT_EXPORT void *tms_torch_malloc(ssize_t size, int device, void *stream);
DORMANT_EXPORT void tms_torch_free(void *ptr, ssize_t size, int device, void *stream);

/* The process's manager, or NULL when there is none yet. */
static struct dormant *tms_manager(void)
{
	struct dormant *m = dormant_torch_get_manager();

	if (!m && dormant_preload_manager(&m) < 0)
		m = NULL;
	if (m) {
		int retain = atomic_exchange(&pending_retain, -1);

		if (retain >= 0)
			dormant_set_host_mode(m, retain ? DORMANT_HOST_RETAIN : DORMANT_HOST_RELEASE);
		if (atomic_exchange(&dir_pending, false)) {
			/* a directory dormant refuses (not absolute) changes nothing */
			pthread_mutex_lock(&dir_lock);
			if (disk_backup_dir)
				dormant_set_disk_dir(m, disk_backup_dir);
			pthread_mutex_unlock(&dir_lock);
		}
	}
	return m;
}

static bool env_flag(const char *name)
{
	return preload_env_true(getenv(name));
}

/* ---- per-thread configuration --------------------------------------------- */

DORMANT_EXPORT void tms_set_interesting_region(bool is_interesting_region)
{
	dormant_preload_set_thread_capture(is_interesting_region ? 1 : 0);
}

DORMANT_EXPORT bool tms_get_interesting_region(void)
{
	return dormant_preload_get_thread_capture();
}

DORMANT_EXPORT void tms_set_current_tag(const char *tag)
{
	/* a name dormant refuses leaves the tag as it was */
	if (tag)
		dormant_set_thread_tag(tag);
}

DORMANT_EXPORT const char *tms_get_current_tag(void)
{
	if (dormant_get_thread_tag(thread_tag_text, sizeof(thread_tag_text)) < 0)
		snprintf(thread_tag_text, sizeof(thread_tag_text), "default");
	return thread_tag_text;
}

DORMANT_EXPORT bool tms_get_enable_disk_backup(void)
{
	if (thread_disk_backup >= 0)
		return thread_disk_backup == 1;
	return env_flag("TMS_INIT_ENABLE_DISK_BACKUP");
}

DORMANT_EXPORT bool tms_get_enable_cpu_backup(void)
{
	const char *init;
	int policy;

	if (thread_cpu_backup >= 0)
		return thread_cpu_backup == 1;
	/* a dormant region (the Python package's) chose the thread's policy */
	policy = dormant_get_thread_policy();
	if (policy != DORMANT_POLICY_TAG)
		return policy == DORMANT_KEEP && !tms_get_enable_disk_backup();
	/* the policy of the tag: $TMS_INIT_ENABLE_CPU_BACKUP sets "default"'s
	 * when the shim starts; unset, dormant keeps */
	init = getenv("TMS_INIT_ENABLE_CPU_BACKUP");
	return init && *init ? preload_env_true(init) : true;
}

/* Allocations of the thread go to disk with disk backup, are kept in host
 * memory with cpu backup, discarded without either. */
static void apply_policy(void)
{
	enum dormant_policy policy = DORMANT_DISCARD;

	if (tms_get_enable_disk_backup())
		policy = DORMANT_DISK;
	else if (tms_get_enable_cpu_backup())
		policy = DORMANT_KEEP;
	dormant_set_thread_policy(policy);
}

DORMANT_EXPORT void tms_set_enable_cpu_backup(bool enable_cpu_backup)
{
	thread_cpu_backup = enable_cpu_backup;
	apply_policy();
}

DORMANT_EXPORT void tms_set_enable_disk_backup(bool enable_disk_backup)
{
	thread_disk_backup = enable_disk_backup;
	apply_policy();
}

DORMANT_EXPORT const char *tms_get_cpu_backup_backend(void)
{
	if (!thread_backend[0]) {
		const char *init = getenv("TMS_INIT_CPU_BACKUP_BACKEND");

		/* as torch_memory_saver: "mmap", else the default "pinned" */
		tms_set_cpu_backup_backend(init && strcmp(init, "mmap") == 0 ? "mmap" : "pinned");
	}
	return thread_backend;
}

DORMANT_EXPORT void tms_set_cpu_backup_backend(const char *backend)
{
	if (!backend || (strcmp(backend, "pinned") != 0 && strcmp(backend, "mmap") != 0))
		return;
	snprintf(thread_backend, sizeof(thread_backend), "%s", backend);
	if (strcmp(backend, "mmap") == 0)
		atomic_store(&mmap_used, true);
}

/* ---- process-wide settings ------------------------------------------------- */

DORMANT_EXPORT void tms_set_disk_backup_dir(const char *dir)
{
	char *copy;

	if (!dir || !(copy = strdup(dir)))
		return;
	pthread_mutex_lock(&dir_lock);
	free(disk_backup_dir);
	disk_backup_dir = copy;
	pthread_mutex_unlock(&dir_lock);
	atomic_store(&dir_pending, true);
	tms_manager(); /* applies it, where a manager exists */
}

/* Not torch_memory_saver's: the directory last set, else $TMS_DISK_BACKUP_DIR,
 * else NULL. The string stays valid until the next set. */
DORMANT_EXPORT const char *tms_get_disk_backup_dir(void)
{
	const char *dir;

	pthread_mutex_lock(&dir_lock);
	dir = disk_backup_dir;
	pthread_mutex_unlock(&dir_lock);
	return dir ? dir : getenv("TMS_DISK_BACKUP_DIR");
}

DORMANT_EXPORT void set_memory_margin_bytes(uint64_t value)
{
	atomic_store(&margin_bytes, value);
}

DORMANT_EXPORT void tms_set_retain_cpu_backup(bool retain_cpu_backup)
{
	struct dormant *m;

	atomic_store(&pending_retain, retain_cpu_backup ? 1 : 0);
	m = tms_manager(); /* applies it, where a manager exists */
	(void)m;
}

DORMANT_EXPORT bool tms_get_retain_cpu_backup(void)
{
	struct dormant *m = tms_manager();
	int pending;

	if (m)
		return dormant_host_mode(m) == DORMANT_HOST_RETAIN;
	pending = atomic_load(&pending_retain);
	return pending >= 0 ? pending == 1 : env_flag("TMS_RETAIN_CPU_BACKUP");
}

/* ---- pause and resume -------------------------------------------------------- */

static bool tag_selected(const char *tag, const char *name)
{
	return !tag || strcmp(tag, name) == 0;
}

/*
 * Whether waking tag (NULL: all) leaves at least the margin free: the device
 * bytes the wake maps (reserved, not mapped, of the tags asleep) against the
 * free bytes of the manager's devices. -ENOMEM when it would not.
 */
int tms_margin_check(struct dormant *m, const char *tag, uint64_t margin)
{
	struct dormant_stats *st;
	uint64_t need = 0, free_bytes = 0;
	int r = 0;

	if (!margin)
		return 0;
	st = malloc(sizeof(*st));
	if (!st)
		return -ENOMEM;
	r = dormant_stats_get(m, st);
	if (r == 0) {
		for (size_t i = 0; i < st->tag_count; i++) {
			const struct dormant_tag_stats *t = &st->tags[i];

			if (tag_selected(tag, t->tag) && t->state == DORMANT_ASLEEP)
				need += t->reserved_bytes - t->device_bytes;
		}
		for (size_t i = 0; i < st->device_count; i++)
			free_bytes += st->devices[i].free_bytes;
		if (need && need + margin > free_bytes)
			r = -ENOMEM;
	}
	free(st);
	return r;
}

/* Wait (up to 60 s) until the host copies of tag that the wake no longer
 * needs are back with the operating system: release mode gives them back
 * on worker threads. */
void tms_host_settle(struct dormant *m, const char *tag)
{
	struct dormant_stats *st = malloc(sizeof(*st));
	struct timespec pause_ts = { 0, 2 * 1000 * 1000 };

	if (!st)
		return;
	for (int i = 0; i < 30000; i++) {
		uint64_t held = 0;

		if (dormant_stats_get(m, st) < 0 || st->host_mode != DORMANT_HOST_RELEASE)
			break;
		for (size_t k = 0; k < st->tag_count; k++)
			if (tag_selected(tag, st->tags[k].tag) && st->tags[k].state == DORMANT_AWAKE)
				held += st->tags[k].host_bytes;
		if (!held)
			break;
		nanosleep(&pause_ts, NULL);
	}
	free(st);
}

bool tms_mmap_used(void)
{
	return atomic_load(&mmap_used);
}

static int transition(const char *tag, bool wake)
{
	const char *tags[2] = { tag, NULL };
	struct dormant *m = tms_manager();
	int r;

	if (!m)
		return CUDA_SUCCESS; /* nothing allocated yet: nothing to do */
	if (tag && !*tag)
		tag = NULL; /* torch_memory_saver's "" is every tag */
	if (wake) {
		r = tms_margin_check(m, tag, atomic_load(&margin_bytes));
		if (r < 0)
			return CUDA_ERROR_MEMORY_ALLOCATION;
		r = dormant_wake(m, tag ? tags : NULL, NULL);
		if (r == 0 && tms_mmap_used())
			tms_host_settle(m, tag);
	} else {
		r = dormant_sleep(m, tag ? tags : NULL, NULL);
	}
	if (r == 0 || r == -ENOENT) /* a tag never used: nothing to do */
		return CUDA_SUCCESS;
	return r == -ENOMEM ? CUDA_ERROR_MEMORY_ALLOCATION : CUDA_ERROR_UNKNOWN;
}

DORMANT_EXPORT int tms_pause(const char *tag)
{
	return transition(tag, false);
}

DORMANT_EXPORT int tms_resume(const char *tag)
{
	return transition(tag, true);
}

DORMANT_EXPORT uint8_t *tms_get_cpu_backup_pointer(const uint8_t *gpu_ptr, uint64_t size)
{
	struct dormant *m = tms_manager();
	void *host = NULL;

	/* NULL also where dormant's copy holds the range in pieces (live-bytes
	 * packing): dormant_host_backup_read() copies those */
	if (!m || !gpu_ptr || dormant_host_backup(m, gpu_ptr, size, &host) < 0)
		return NULL;
	return host;
}

/* ---- PyTorch's pluggable allocator (hook mode "torch") ------------------------ */

DORMANT_EXPORT void *tms_torch_malloc(ssize_t size, int device, void *stream)
{
	if (size < 0)
		return NULL;
	if (!dormant_torch_get_manager()) {
		struct dormant *m = tms_manager();

		if (m)
			dormant_torch_set_manager(m);
	}
	return dormant_torch_malloc((size_t)size, device, stream);
}

DORMANT_EXPORT void tms_torch_free(void *ptr, ssize_t size, int device, void *stream)
{
	dormant_torch_free(ptr, size < 0 ? 0 : (size_t)size, device, stream);
}
