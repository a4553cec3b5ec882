/* SPDX-License-Identifier: MIT */
/*
 * The manager's data: tags, allocations and the chunks that back them, and
 * struct dormant itself. Below every file of the manager's room (manager.c,
 * transition.c, guard.c, backup.c, warmup.c, alloc.c): each includes it,
 * none of them through another's functions.
 */
#ifndef DORMANT_MANAGER_STATE_H
#define DORMANT_MANAGER_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "backend.h"
#include "checksum.h"
#include "chunk.h"
#include "diskfile.h"
#include "dormant.h"
#include "extent.h"
#include "hostbuf.h"
#include "options.h"
#include "residue.h"
#include "slab.h"
#include "transfer.h"
#include "warmup_state.h"
#include "workers.h"

struct tag;

/*
 * An allocation. Three kinds:
 *  - dedicated: its own address range and chunks (large allocations);
 *  - slab: an internal allocation whose range small allocations share;
 *  - sub-allocation: a range inside a slab, with no chunks of its own.
 * Dedicated allocations and slabs own chunks and are on tag->allocs, which
 * transitions walk; dedicated and sub-allocations are what users hold and
 * are in dormant.allocs, which lookups search.
 */
struct alloc {
	void *ptr;
	size_t size;
	size_t reserved;           /* address space of its own (0 for a sub-allocation) */
	int device;
	/* As asked for: DORMANT_KEEP, DORMANT_DISCARD, DORMANT_DISK, or
	 * DORMANT_POLICY_TAG (follows the tag, whatever its policy is at the
	 * next sleep; a tag may also be DORMANT_REBUILD). A slab
	 * and its sub-allocations share it: slabs never mix policies. */
	int policy;
	struct tag *tag;
	struct alloc *prev, *next; /* in tag->allocs: owners of chunks */
	struct alloc *slab;        /* sub-allocation: the slab it lives in */
	struct alloc *slab_next;   /* slab: in tag->slabs */
	bool is_slab;
	struct slab_space space;   /* slab: its free space */
	struct mark_set marks;     /* owner: ranges marked unused (extent.h) */
	bool in_transition;        /* a transition holds pointers to its chunks */
	bool doomed;               /* freed during a transition: destroy at its end */
	size_t chunk_count;
	struct chunk chunks[];
};

struct tag {
	char name[DORMANT_TAG_MAX + 1];
	enum dormant_policy policy;
	enum dormant_state state;
	struct alloc *allocs;      /* chunk owners: dedicated allocations and slabs */
	struct alloc *slabs;
	uint64_t allocations;      /* held by users: dedicated and sub-allocations */
	uint64_t bytes;
	uint64_t reserved_bytes;
	struct held_bytes held;    /* counted by the engine (chunk.h) */
	uint64_t sleeps, wakes;
	dormant_rebuild_fn rebuild_fn; /* DORMANT_REBUILD: refills it on wake */
	void *rebuild_userdata;
};

#define HOOKS_MAX 32

struct hook {
	int id;
	enum dormant_hook_point point;
	dormant_hook_fn fn;
	void *userdata;
};

struct dormant {
	struct backend *backend;
	struct logger log;
	struct workers *workers;
	struct engine engine;
	/* dormant_set_host_mode() changes it between transitions */
	_Atomic enum dormant_host_mode host_mode;
	size_t chunk_bytes;
	int guard_timeout_ms;
	size_t granularity[DORMANT_DEVICES_MAX]; /* 0 until first asked */
	struct dormant_options options; /* as resolved by dormant_new(): read only */
	int device_count; /* the backend's, read once: no device call while checkpointed */
	struct residue residue; /* residue.h */

	pthread_mutex_t lock; /* everything below */
	pthread_cond_t guard_cond;
	struct tag *tags[DORMANT_TAGS_MAX];
	size_t tag_count;
	struct alloc **allocs; /* sorted by ptr */
	size_t alloc_count, alloc_capacity;
	bool transition_running;
	unsigned steps_running;
	bool gate_hold; /* steps wait: a sleep waits for them or a wake is finishing */
	bool rebuilding; /* rebuild callbacks run: copies to their transition's tags work */
	struct hook hooks[HOOKS_MAX];
	size_t hook_count;
	int next_hook_id;

	bool healthy;
	char health_error[DORMANT_ERROR_MAX];
	uint64_t sleeps_ok, sleeps_failed, wakes_ok, wakes_failed;
	uint64_t noops[2], busy[2]; /* [0] sleep, [1] wake */
	uint64_t bytes_to_host_total, bytes_to_device_total;
	uint64_t bytes_released_total, bytes_zeroed_total, bytes_skipped_total;
	uint64_t bytes_unchanged_total, chunks_verified_total, chunk_mismatches_total;
	/* wakes by what copied them, and bytes by what moved them (wakecopy.h) */
	uint64_t wakes_copy_engine, wakes_copy_kernel, wakes_copy_mixed;
	uint64_t bytes_to_device_engine_total, bytes_to_device_kernel_total;
	struct dormant_transition_stats last_sleep, last_wake;
	struct dormant_histogram sleep_seconds, wake_seconds;
	struct dormant_transition_times sleep_times_total, wake_times_total;
	struct warmup warmup; /* warmup.h */
	/* allocations freed while the process was checkpointed: their address
	 * ranges go back after the restore (linked by next) */
	struct alloc *deferred;
};

/* The policy an allocation's memory sleeps and wakes with now. Call with
 * m->lock, or while its tag is in a transition (no policy changes then). */
static inline enum dormant_policy alloc_policy(const struct alloc *a)
{
	return a->policy == DORMANT_POLICY_TAG ? a->tag->policy : (enum dormant_policy)a->policy;
}

#endif
