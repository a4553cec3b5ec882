/* SPDX-License-Identifier: MIT */
/* The test-support door for bench/ (support.h). */
#include "support.h"

#include "manager.h"

struct backend *support_backend(struct dormant *m)
{
	return m->backend;
}

struct workers *support_workers(struct dormant *m)
{
	return m->workers;
}

void support_settings_get(struct dormant *m, size_t *chunk_bytes, size_t *staging_bytes,
			  size_t *pin_piece_bytes, size_t *reclaimable_pinned_bytes,
			  unsigned *copy_threads, bool *serial_devices)
{
	if (chunk_bytes)
		*chunk_bytes = m->chunk_bytes;
	if (staging_bytes)
		*staging_bytes = m->engine.staging_bytes;
	if (pin_piece_bytes)
		*pin_piece_bytes = m->engine.pin_piece;
	if (reclaimable_pinned_bytes)
		*reclaimable_pinned_bytes = m->engine.reclaim_pinned_max;
	if (copy_threads)
		*copy_threads = workers_threads(m->workers);
	if (serial_devices)
		*serial_devices = m->engine.serial_devices;
}
