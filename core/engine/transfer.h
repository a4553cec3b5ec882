/* SPDX-License-Identifier: MIT */
/*
 * The transfer engine: moves chunks between device and host memory for a
 * transition, pipelined so that the copy engine never waits for the host.
 * Its modules, each with its private header:
 *  - chunk.h:    what it moves, and what it knows of the chunk's owner (the
 *                manager's allocation and tag: struct chunk_owner);
 *  - extent.c:   what is copied of a chunk (live runs, marks, holes);
 *  - prepare.c:  host copies of a sleep: allocated, faulted in, pinned ahead;
 *  - pipeline.c: the copies in flight, split where the host side requires;
 *  - staging.c:  the pinned staging ring for host copies left unpinned;
 *  - mapper.c:   device memory of a wake: created and mapped ahead;
 *  - transfer.c: this interface: sleep, wake, release, rollback.
 *
 *  - Sleep: synchronize, queue the first KEEP copies, release DISCARD chunks
 *    while they run, then keep a window of copies in flight and release each
 *    KEEP chunk as soon as its own copy is done; REBUILD chunks go last,
 *    once every copy is done.
 *  - Wake: create and map the chunks (mapper.c: on a thread of its own, a
 *    few chunks ahead of the copies, so that the wake costs about the larger
 *    of mapping and copying, not their sum; DORMANT_WAKE_OVERLAP=0 maps
 *    every chunk first), zero-fill DISCARD and REBUILD chunks and what KEEP
 *    chunks' host copies do not hold on a second stream, copy the KEEP runs
 *    back, synchronize.
 *
 * DORMANT_DISK chunks go to files (diskfile.h) instead: each piece is copied
 * into a staging slot and written from there while the next pieces' copies
 * run, and read back into a slot on wake ahead of its copy to the device.
 *
 * Host copies live in pinned buffers, copied straight over PCIe both ways;
 * a sleep that needs fresh ones has a thread fault them in ahead of the
 * copies, and registers each piece just ahead of its copy on the thread
 * that queues them (retain mode keeps them between cycles, release
 * mode gives them back after the wake, reclaimable mode unpins them after
 * the wake on a worker and hands them to the kernel with MADV_FREE, the
 * next sleep reusing what it left). A copy that cannot be pinned (or with
 * DORMANT_PIN_HOST=0) goes through a small pinned staging ring instead, the
 * host-side memcpy spread over the worker threads.
 *
 * Devices: each device's share of a transition (its copies, releases, maps
 * and zero-fills, on its own streams) runs on a host thread of its own, all
 * at once (DORMANT_PARALLEL_DEVICES=0: one after another, for measuring).
 * Each adds to counters of its own, summed when all are done; when one
 * fails, the others stop at their next chunk and the whole transition is
 * rolled back or undone on every device.
 *
 * Failure: a failed sleep is rolled back (released chunks are mapped again
 * and restored); a failed wake gives back everything it mapped. Host copies
 * are only dropped once the data is safely on the device.
 */
#ifndef DORMANT_TRANSFER_H
#define DORMANT_TRANSFER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "backend.h"
#include "chunk.h"
#include "dormant.h"
#include "hostbuf.h"
#include "workers.h"

#define ENGINE_WINDOW 8       /* pieces in flight per device */
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
	bool serial_devices; /* DORMANT_PARALLEL_DEVICES=0: one device after another */
	atomic_bool devices_stop; /* a device failed: the others stop early */
	_Atomic bool verify;          /* hash at sleep, compare after wake (verify.h) */
	bool skip_unchanged;          /* retain mode: release unchanged chunks uncopied */
	_Atomic bool checksum_warned; /* said once that the backend cannot hash */
	bool wake_overlap; /* wake: map chunks on a thread while earlier ones copy */
	/* DORMANT_DISK copies (diskfile.h): the directory, copied from the
	 * manager's when a sleep starts (only sleeps create files), the
	 * largest read or write, whether files get names */
	char disk_dir[DORMANT_PATH_MAX];
	size_t disk_chunk_bytes;
	bool disk_names;
	unsigned map_threads; /* threads mapping ahead (mapper.c), 1 or more */
	int wake_copy; /* enum wake_copy_mode (wakecopy.h): what copies to the device */
	size_t wake_copy_probe_bytes, wake_copy_reprobe_bytes;
	_Atomic bool copy_kernel_warned; /* said once that the device cannot run it */
	/* time spent in these calls, on any thread (dormant_transition_times) */
	_Atomic uint64_t release_ns, map_ns, host_prep_ns, host_pin_ns, setup_ns;
	_Atomic uint64_t device_setups; /* devices whose streams were made */
	struct engine_device devices[DORMANT_DEVICES_MAX];
	/* host mode reclaimable: unpins handed to the workers (struct
	 * reclaim_job), not yet done; reclaim_cond says when one is */
	pthread_mutex_t reclaim_lock;
	pthread_cond_t reclaim_cond;
	unsigned reclaims_pending;
	_Atomic bool reclaim_warned; /* said once that MADV_FREE failed */
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
struct xfer_item {
	struct chunk *chunk;
	struct chunk_owner owner;
	enum dormant_policy policy; /* its allocation's, fixed when collected */
	struct dormant_tag_change *change;
	bool mapped_here; /* wake: mapped by this call (undone on failure) */
};

struct xfer_totals {
	uint64_t copied, released, mapped, zeroed, skipped;
	uint64_t unchanged;            /* sleep: kept bytes not copied, unchanged (verify.h) */
	uint64_t verified, mismatches; /* wake: chunks whose checksum matched / did not */
	double copy_s;
	struct dormant_transition_times times; /* copy_s and the calls' times: at the end */
	struct dormant_wake_copy wake_copy;    /* wake: what copied (wakecopy.h) */
	bool rollback_failed; /* sleep: some chunks could not be restored */
};

void engine_init(struct engine *e, struct backend *b, struct workers *w,
		 const struct logger *log, enum dormant_host_mode mode, size_t staging_bytes,
		 size_t pin_piece, bool pin_host);
void engine_finish(struct engine *e);

/* items: every mapped chunk of the tags going to sleep. */
int engine_sleep(struct engine *e, struct xfer_item *items, size_t count, struct xfer_totals *t);
/* items: every unmapped chunk of the tags waking. Maps, zero-fills and
 * restores them all; on failure gives back what it mapped. The host copies
 * stay until engine_wake_commit() (the wake is done) or engine_wake_undo()
 * (a rebuild callback failed: give back what engine_wake() mapped, the host
 * copies intact for a retry). */
int engine_wake(struct engine *e, struct xfer_item *items, size_t count, struct xfer_totals *t);
void engine_wake_commit(struct engine *e, struct xfer_item *items, size_t count);
void engine_wake_undo(struct engine *e, struct xfer_item *items, size_t count,
		      struct xfer_totals *t);

/* Set device d up for transitions, once (a transition's first step, or
 * ahead of it: the warm-up): its streams and events, the backend's checksum
 * kernel (a kernel that cannot load is left to the checksum path to report),
 * and, when host copies go unpinned, the staging ring. Timed into setup_s.
 * Not while a transition runs on the engine. */
int engine_device_setup(struct engine *e, int d);

/* Give back a chunk's memory, with accounting: used by free and destroy. */
void engine_chunk_drop(struct engine *e, const struct chunk_owner *o, struct chunk *c);

/* For the engine's modules (pipeline.c, prepare.c): */
/* Kept: copied on sleep and restored on wake, to host memory or disk. */
static inline bool xfer_is_keep(const struct xfer_item *it)
{
	return it->policy == DORMANT_KEEP || it->policy == DORMANT_DISK;
}
/* Kept on disk (diskfile.h): through the staging ring, never a host buffer. */
static inline bool xfer_is_disk(const struct xfer_item *it)
{
	return it->policy == DORMANT_DISK;
}
/* Unmap and release a mapped chunk, with accounting. */
int engine_chunk_release(struct engine *e, const struct chunk_owner *o, struct chunk *c);
/* Add the seconds since start (now_monotonic_s()) to a time counter. */
static inline void engine_time_add(_Atomic uint64_t *ns, double start)
{
	atomic_fetch_add(ns, (uint64_t)((now_monotonic_s() - start) * 1e9));
}
/* Count device bytes mapped for an owner (atomic: any thread). */
void engine_account_device(struct engine *e, const struct chunk_owner *o, int64_t delta);
/* Count host bytes held for a tag. */
void engine_account_host(struct held_bytes *held, int64_t delta);

/* Free a chunk's host buffer now, taking it off the tag's host bytes (a
 * reclaimable one is off them already); waits for its reclaim job first. */
void engine_host_free(struct engine *e, struct held_bytes *held, struct chunk *c);
/* Host mode reclaimable: a wake unpins its host copies on the workers
 * (hostbuf_make_reclaimable()), marking them reclaimable at once. Wait
 * until hb's unpin is done, if one was queued, and forget it: whoever
 * touches a reclaimable buffer (reuses, frees) calls this first. The
 * buffer's host bytes fall when its unpin is done (it is pinned until
 * then). Any thread; not from a worker job. */
void engine_host_settle(struct engine *e, struct hostbuf *hb);
/* Wait until every queued unpin is done (a host-mode switch). */
void engine_reclaims_wait(struct engine *e);
/* Host mode reclaimable: take room for size bytes of host copy that stays
 * pinned while awake under reclaim_pinned_max; false when there is none. */
bool engine_pinned_awake_reserve(struct engine *e, size_t size);
/* Give back that room (the copy is freed, or unpinned after all). Any
 * thread. */
void engine_pinned_awake_unreserve(struct engine *e, size_t size);
/* Count disk bytes held for a tag. */
void engine_account_disk(struct held_bytes *held, int64_t delta);

#endif
