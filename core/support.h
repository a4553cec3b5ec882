/* SPDX-License-Identifier: MIT */
/*
 * The test-support door of the static core: what the benchmarks (bench/)
 * may read of a manager beyond the public API, to time the same backend,
 * worker pool and host buffers the manager uses (dormant-bench's ceiling and
 * pattern, docs/design.md "Architecture"). Not part of libdormant's ABI: only
 * what links the static core sees it. bench/ includes this header, never the
 * manager's own (manager.h, manager_state.h); what it uses of the lower rooms
 * it takes through their interfaces (backend.h, hostbuf.h, workers.h).
 */
#ifndef DORMANT_SUPPORT_H
#define DORMANT_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>

#include "dormant.h"

struct backend;
struct workers;

/* The manager's backend and worker pool (they live as long as m). */
struct backend *support_backend(struct dormant *m);
struct workers *support_workers(struct dormant *m);

/* The settings the manager resolved from its options and the machine (any
 * pointer may be NULL). */
void support_settings_get(struct dormant *m, size_t *chunk_bytes, size_t *staging_bytes,
			  size_t *pin_piece_bytes, size_t *reclaimable_pinned_bytes,
			  unsigned *copy_threads, bool *serial_devices);

#endif
