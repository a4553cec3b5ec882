/* SPDX-License-Identifier: MIT */
/*
 * What the engine moves: a chunk, a piece of physical memory backing part of
 * an allocation, with its host or disk copy, and what the engine knows of the
 * chunk's owner. The manager owns the chunks (in its allocations and tags,
 * manager.h) and hands them to the engine with their owner's struct
 * chunk_owner (state.h: struct engine_item, engine_chunk_drop()); the
 * engine never sees an allocation or a tag.
 */
#ifndef DORMANT_CHUNK_H
#define DORMANT_CHUNK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "diskfile.h"
#include "extent.h"
#include "hash.h"
#include "hostbuf.h"

struct chunk {
	uintptr_t va;
	size_t size;        /* physical bytes, a multiple of the granularity */
	size_t data_bytes;  /* bytes of the allocation inside it */
	uint64_t handle;    /* physical memory while mapped */
	bool mapped;
	bool host_valid;    /* host.ptr (DORMANT_DISK: disk) holds this chunk's runs (plan) */
	struct copy_plan plan; /* what the host copy holds (extent.h) */
	struct hostbuf host;
	struct diskfile disk; /* DORMANT_DISK: the copy's file (host unused) */
	/* checksum.h, verify.h: the hash of the runs as the last sleep found
	 * them (sum_valid), under the layout sum_layout; retained: the host
	 * copy still holds what the last wake restored (retain mode) */
	struct checksum sum;
	uint64_t sum_layout;
	bool sum_valid, retained;
	/* host mode reclaimable: host stays pinned while awake, counted in the
	 * engine's reclaim_pinned (option reclaimable_pinned_bytes) */
	bool pinned_awake;
};

/* The bytes a tag holds in each place now. The engine counts them as it
 * maps, releases and copies chunks (atomic: any thread adds); the manager
 * keeps one in each tag and reads it for the stats. */
struct held_bytes {
	_Atomic uint64_t device_bytes;
	_Atomic uint64_t host_bytes;
	_Atomic uint64_t disk_bytes; /* DORMANT_DISK */
};

/* A chunk's owner, as far as the engine needs it: the device and address of
 * its allocation, the name and counters of its tag. The manager fills it in
 * (alloc_owner(), alloc.h); the tag outlives every use the engine makes. */
struct chunk_owner {
	int device;
	void *ptr;               /* the allocation's address (messages) */
	const char *tag;         /* its tag's name (messages) */
	struct held_bytes *held; /* its tag's counters */
};

#endif
