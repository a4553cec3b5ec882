/* SPDX-License-Identifier: MIT */
/*
 * What the engine moves: a chunk, a piece of physical memory backing part of
 * an allocation, with its host or disk copy. The manager owns the chunks (in
 * its allocations, manager.h) and hands them to the engine in struct
 * xfer_item (transfer.h).
 */
#ifndef DORMANT_CHUNK_H
#define DORMANT_CHUNK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "checksum.h"
#include "diskfile.h"
#include "extent.h"
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
};

#endif
