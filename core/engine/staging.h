/* SPDX-License-Identifier: MIT */
/*
 * The staging ring: a small pinned host buffer per device, in
 * ENGINE_STAGING_SLOTS slots, for host copies that stay unpinned (pinning
 * failed, or DORMANT_PIN_HOST=0). A copy of such a chunk goes device <->
 * slot over PCIe at the pinned speed, and slot <-> host copy by memcpy
 * spread over the worker threads (pipeline.c keeps the slots busy). The
 * ring is allocated the first time a copy needs it and kept until the
 * manager is destroyed.
 */
#ifndef DORMANT_STAGING_H
#define DORMANT_STAGING_H

#include "state.h"

/* Allocate, fault in and pin device d's ring unless it has one. */
int staging_ready(struct engine *e, int d);
/* Give device d's ring back (if any). */
void staging_finish(struct engine *e, int d);

/* The host memory of a slot of a ready ring. */
static inline char *staging_slot(const struct engine_device *ed, int slot)
{
	return (char *)ed->staging.ptr + (size_t)slot * ed->slot_bytes;
}

#endif
