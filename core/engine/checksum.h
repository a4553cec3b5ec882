/* SPDX-License-Identifier: MIT */
/*
 * What the engine adds to the chunk hash (backends/hash.h defines it): the
 * signature of a host copy's layout. The stages that hash at sleep and
 * verify after a wake are in verify.h.
 */
#ifndef DORMANT_CHECKSUM_H
#define DORMANT_CHECKSUM_H

#include <stdint.h>

#include "extent.h"
#include "hash.h"

/* A 64-bit signature of a plan's layout (its runs and their places in the
 * host copy): two chunks' host copies hold the same bytes only when their
 * plans' layouts and their checksums agree. */
uint64_t checksum_plan_signature(const struct copy_plan *plan);

#endif
