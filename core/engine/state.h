/* SPDX-License-Identifier: MIT */
/*
 * The engine's bottom floor: its state (struct engine, one struct
 * engine_device per device), what a transition moves (struct engine_item) and
 * adds up (struct engine_totals), and the accounting and timing every stage
 * reports into; and a chunk's pieces given back, now or on a worker (the
 * copies a wake no longer needs, as the host mode says). The stages above it
 * (prepare, pipeline, staging, mapper, checksum) include this header and
 * each other's, never transfer.h: transfer.c, on top, drives them
 * (transfer.h has the whole engine's description).
 */
#ifndef DORMANT_ENGINE_STATE_H
#define DORMANT_ENGINE_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "backend.h"
#include "chunk.h"
#include "dormant.h"
#include "hostbuf.h"
#include "workers.h"

#define ENGINE_WINDOW 8       /* pieces in flight per device */

/* Jobs of one kind on the workers, under lock; cond says when one is done. */
struct engine_pending {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned count;
};
#define ENGINE_STAGING_SLOTS 4

struct engine_device {
	bool ready;
	bool kernel_tried; /* the backend was asked to load its checksum kernel */
	bool stopped;      /* its share of a transition stopped: another device failed */
	void *stream;      /* copies */
	void *zero_stream; /* zero-fill, beside the copies */
	void *zero_event;
	void *hash_stream; /* wake: chunk checksums beside the copies (verify.h) */
	void *events[ENGINE_WINDOW];
	struct hostbuf staging;
	size_t slot_bytes;
	/* wake_copy=auto: the copy kernel's rate as a wake measured it (GB/s;
	 * 0: never), so that later wakes time only the copy engines */
	double kernel_gbps;
};

struct engine {
	struct backend *backend;
	struct workers *workers;
	struct logger log;
	enum dormant_host_mode mode;
	size_t staging_bytes;
	size_t pin_piece; /* pinned host buffers are registered in pieces this big */
	unsigned pin_threads; /* threads registering one buffer's pieces at once */
	bool pin_host;    /* pin host copies; else copy them through the staging ring */
	/* pin_host false: host copies of up to pin_host_bytes are pinned anyway,
	 * spread through each sleep's copies (a wake's copy engines take those
	 * while the CPU fills the ring for the others); pin_ratio, pin_max:
	 * this sleep's share of its unpinned copies and the bytes it may pin,
	 * set by engine_sleep(); pin_taken: the bytes it pinned so far */
	size_t pin_host_bytes;
	double pin_ratio;
	uint64_t pin_max;
	_Atomic uint64_t pin_taken;
	bool serial_devices; /* DORMANT_PARALLEL_DEVICES=0: one device after another */
	atomic_bool devices_stop; /* a device failed: the others stop early */
	_Atomic bool verify;          /* hash at sleep, compare after wake (verify.h) */
	bool skip_unchanged;          /* retain mode: release unchanged chunks uncopied */
	_Atomic bool checksum_warned; /* said once that the backend cannot hash */
	bool wake_overlap; /* wake: map chunks on a thread while earlier ones copy */
	/* DORMANT_DISK copies (diskfile.h): the directory, copied from the
	 * manager's when a sleep starts (only sleeps create files), the
	 * largest read or write, whether files get names, how a wake reads
	 * them (option disk_read) */
	char disk_dir[DORMANT_PATH_MAX];
	size_t disk_chunk_bytes;
	bool disk_names;
	enum engine_disk_read {
		ENGINE_DISK_DIRECT, /* O_DIRECT, four reads in flight */
		ENGINE_DISK_CACHED, /* through the page cache (diskstore_read_cached()) */
		ENGINE_DISK_STREAM, /* as cached, one read in flight */
	} disk_read;
	unsigned map_threads; /* threads mapping ahead (mapper.c), 1 or more */
	int wake_copy; /* enum wake_copy_mode (wakecopy.h): what copies to the device */
	size_t wake_copy_probe_bytes, wake_copy_reprobe_bytes;
	_Atomic bool copy_kernel_warned; /* said once that the device cannot run it */
	/* time spent in these calls, on any thread (dormant_transition_times) */
	_Atomic uint64_t release_ns, map_ns, host_prep_ns, host_pin_ns, setup_ns;
	_Atomic uint64_t device_setups; /* devices whose streams were made */
	struct engine_device devices[DORMANT_DEVICES_MAX];
	/* jobs handed to the workers that someone waits for, not yet done:
	 * host mode reclaimable's unpins (struct reclaim_job; reclaims.cond
	 * also says when one of them is done) and the disk copies a wake
	 * removed, whose space a worker gives back (struct disk_closing) */
	struct engine_pending reclaims, disk_closings;
	/* MADV_FREE failed (said once): its message, until the next sleep or
	 * wake hands it to the manager in its totals; under reclaims.lock */
	bool reclaim_warned;
	char reclaim_warning[DORMANT_ERROR_MAX];
	/* host mode reclaimable: host copies of up to reclaim_pinned_max bytes
	 * stay pinned after a wake (struct chunk's pinned_awake), so that the
	 * next sleep copies into them while it pins the others; reclaim_pinned:
	 * the bytes of those now */
	size_t reclaim_pinned_max;
	_Atomic uint64_t reclaim_pinned;
	_Atomic uint64_t staging_held;
	_Atomic uint64_t device_bytes[DORMANT_DEVICES_MAX]; /* managed, mapped now */
};

/* One chunk to move, with its owner (device, messages, accounting). */
struct engine_item {
	struct chunk *chunk;
	struct chunk_owner owner;
	enum dormant_policy policy; /* its allocation's, fixed when collected */
	struct dormant_tag_change *change;
	bool mapped_here; /* wake: mapped by this call (undone on failure) */
	bool pin;         /* sleep: its host copy is pinned (pin_host, or its share of
			   * pin_host_bytes), chosen before its buffer is made */
};

struct engine_totals {
	uint64_t copied, released, mapped, zeroed, skipped;
	uint64_t unchanged;            /* sleep: kept bytes not copied, unchanged (verify.h) */
	uint64_t verified, mismatches; /* wake: chunks whose checksum matched / did not */
	double copy_s;
	struct dormant_transition_times times; /* copy_s and the calls' times: at the end */
	struct dormant_wake_copy wake_copy;    /* wake: what copied (wakecopy.h) */
	bool rollback_failed; /* sleep: some chunks could not be restored */
	/* what went wrong without failing the transition (a fallback, memory
	 * that could not be given back): how many, and the first one's text;
	 * the manager logs it (engine_warn()) */
	unsigned warnings;
	char warning[DORMANT_ERROR_MAX];
};

/* A job for the workers, the first member of each: the functions below that
 * queue one put it on a list (*jobs), which engine_jobs_submit() hands to
 * the workers. */
struct engine_job {
	struct engine_job *next;
	void (*run)(void *job);
};

/* Host mode reclaimable: a chunk's unpin and MADV_FREE, on a worker
 * (engine_copies_done() queues it). It works on a copy of the buffer: the
 * chunk's owner waits for done before touching the buffer
 * (engine_host_settle()). */
struct reclaim_job {
	struct engine_job job;
	struct engine *e;
	struct hostbuf buffer;
	struct held_bytes *held;
	bool done; /* under e->reclaims.lock */
};

/* Kept: copied on sleep and restored on wake, to host memory or disk. */
static inline bool engine_item_keep(const struct engine_item *it)
{
	return it->policy == DORMANT_KEEP || it->policy == DORMANT_DISK;
}
/* Kept on disk (diskfile.h): through the staging ring, never a host buffer. */
static inline bool engine_item_disk(const struct engine_item *it)
{
	return it->policy == DORMANT_DISK;
}
/* Tell the manager something that went wrong without failing the
 * transition: counted in t, the first one's text kept. */
void engine_warn(struct engine_totals *t, const char *fmt, ...) PRINTF_LIKE(2, 3);
/* Add src's warnings to dst's (dst's first stays first). */
void engine_warnings_add(struct engine_totals *dst, const struct engine_totals *src);
/* Add the seconds since start (now_monotonic_s()) to a time counter. */
void engine_time_add(_Atomic uint64_t *ns, double start);
/* Count device bytes mapped for an owner (atomic: any thread). */
void engine_account_device(struct engine *e, const struct chunk_owner *o, int64_t delta);
/* Count host bytes held for a tag. */
void engine_account_host(struct held_bytes *held, int64_t delta);
/* Count disk bytes held for a tag. */
void engine_account_disk(struct held_bytes *held, int64_t delta);

/* A failure of MADV_FREE on a worker since the last call (said once in the
 * engine's life, kept under reclaims.lock): told in t. */
void engine_reclaim_warning(struct engine *e, struct engine_totals *t);

/* ---- a chunk's pieces, given back ----------------------------------------- *
 * Each with its accounting, from any thread; the stages and transfer.c call
 * them, and the manager engine_chunk_drop() (through transfer.h). */

/* Unmap and release a mapped chunk's device memory. Returns a negative errno
 * when it could not be unmapped (it stays mapped). Once unmapped, physical
 * memory that cannot be released is told in t (engine_warn()); with t NULL
 * it is returned as the failure (the chunk is unmapped all the same). */
int engine_chunk_release(struct engine *e, const struct chunk_owner *o, struct chunk *c,
			 struct engine_totals *t);
/* Release the mapped chunks of one policy on device d (-1: every device),
 * counted in t and their tags' changes; stops at the first that fails. */
int engine_release_policy(struct engine *e, int d, enum dormant_policy policy,
			  struct engine_item *items, size_t count, struct engine_totals *t);
/* Host mode reclaimable: wait until hb's unpin is done, if one was queued
 * (engine_copies_done()), and forget it: whoever touches a reclaimable buffer (reuses,
 * frees) calls this first. Any thread; not from a worker job. */
void engine_host_settle(struct engine *e, struct hostbuf *hb);
/* Give back room taken under reclaimable_pinned_bytes (a host copy kept
 * pinned while awake is freed, or unpinned after all). Any thread. */
void engine_pinned_awake_unreserve(struct engine *e, size_t size);
/* A chunk's host copy leaves (freed, or reclaimable after all): the room it
 * held under reclaimable_pinned_bytes, if any, goes back. */
void engine_pinned_awake_end(struct engine *e, struct chunk *c);
/* Free a chunk's host buffer now: off the tag's host bytes (a reclaimable
 * one is off them already), then, once its unpin is done, freed. */
void engine_host_free(struct engine *e, struct held_bytes *held, struct chunk *c);
/* Remove a chunk's disk copy, if it has one (the file goes with its last
 * descriptor). */
void engine_disk_release(struct held_bytes *held, struct chunk *c);
/* A chunk's end (a free, the manager's end): its device memory, its host
 * copy and its disk copy given back, in this order, each with its
 * accounting. Returns a negative errno, the error set, when its device
 * memory could not be unmapped or released; the copies go either way. */
int engine_chunk_drop(struct engine *e, const struct chunk_owner *o, struct chunk *c);

/* ---- copies no wake needs any more ---------------------------------------- *
 * Once a wake no longer needs them: host copies freed on a worker, unpinned
 * and handed to the kernel (host mode reclaimable), or kept pinned under
 * reclaimable_pinned_bytes, as the host mode says (engine_copies_done(): a
 * wake's commit, a sleep's rollback); disk copies removed at once, their
 * files closed on a worker. And the budgets of host copies kept pinned. */

/* Wait until every queued unpin is done (a host-mode switch). */
void engine_reclaims_wait(struct engine *e);
/* Host mode reclaimable: take room for size bytes of host copy that stays
 * pinned while awake under reclaim_pinned_max; false when there is none
 * (engine_pinned_awake_unreserve(), state.h, gives it back). */
bool engine_pinned_awake_reserve(struct engine *e, size_t size);
/* pin_host false with pin_host_bytes: take room for size bytes of a
 * sleep's host copy pinned under pin_max (what is left of pin_host_bytes);
 * false when there is none. One budget for the devices that sleep at once;
 * the next sleep starts it again. */
bool engine_sleep_pin_reserve(struct engine *e, size_t size);
/* Give a host copy back, its unpin settled (engine_host_settle()): unmapping
 * gigabytes takes a while, so it happens on a worker thread (a job queued on
 * *jobs) and the host bytes fall when it is done; without memory for the
 * job, here and now. */
void engine_host_release(struct engine *e, struct held_bytes *held, struct chunk *c,
			 struct engine_job **jobs);
/* Hand the jobs queued on a list to the workers, in the order queued. */
void engine_jobs_submit(struct engine *e, struct engine_job *jobs);
/* Wait until the space of every disk copy a wake removed is given back (a
 * sleep that makes disk copies, before it allocates theirs). */
void engine_disk_closings_wait(struct engine *e);
/* The copies of items that no wake needs any more, once the data is on the
 * device: each chunk's host copy as the host mode says (retain keeps it,
 * release frees it on a worker, reclaimable unpins it on a worker or keeps
 * it pinned under reclaimable_pinned_bytes) and its disk copy removed
 * without waiting for the file system (its file closed on a worker). The
 * workers get these jobs at the end, at once. That is every item's chunk on the device
 * now: first those a wake (or a sleep's rollback) mapped (mapped_here), whose
 * retained host copy (retain mode, its hash known) now holds what the device
 * has; then, after a sleep rolled back, those that never left the device. One call, each chunk once: the
 * wake's commit, and the end of a rollback whatever came back
 * (engine_wake_end()). */
void engine_copies_done(struct engine *e, struct engine_item *items, size_t count);


#endif
