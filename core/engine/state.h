/* SPDX-License-Identifier: MIT */
/*
 * The engine's bottom floor: its state (struct engine, one struct
 * engine_device per device), what a transition moves (struct xfer_item) and
 * adds up (struct xfer_totals), and the accounting and timing every stage
 * reports into. The stages above it (prepare, pipeline, staging, mapper,
 * checksum, host copies) include this header and each other's, never
 * transfer.h: transfer.c, on top, drives them (transfer.h has the whole
 * engine's description).
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

/* Count disk bytes held for a tag. */
void engine_account_disk(struct held_bytes *held, int64_t delta);

#endif
