/* SPDX-License-Identifier: MIT */
/*
 * The warm-up: what a first sleep would set up, done ahead of it, in the
 * background once allocations settle (option warmup, warmup_settle_ms) or
 * when asked (dormant_warm_up()). Per device with managed memory: the copy
 * streams and events, the checksum kernel, the staging ring where copies go
 * unpinned (engine_device_setup()); with warmup=auto also the host copies of
 * awake kept chunks, one chunk at a time: in retain mode allocated, faulted
 * in and pinned, which a sleep then uses as they are; in reclaimable mode
 * faulted in and handed to the kernel unpinned, which a sleep reuses as
 * after a wake (prep_host_copy()).
 *
 * One at a time with transitions: a run holds the engine (warmup.running,
 * under the manager lock) and starts only while no transition runs; a
 * transition that starts meanwhile asks it to stop (cancel) and waits for
 * it, which it does after the chunk it is on (guard_warmup_stop(), guard.c,
 * with what else a transition keeps out: training steps). While it prepares a chunk's
 * host copy it marks the chunk's allocation in_transition, so that a free
 * meanwhile is deferred to it (doomed) as to a transition. A run that fails
 * leaves what it did not do to the sleep, which does it as without warm-up.
 */
#ifndef DORMANT_WARMUP_H
#define DORMANT_WARMUP_H

#include "warmup_state.h"

struct dormant;

/* Start the background thread (mode other than off); never fails the
 * manager: without the thread, only dormant_warm_up() warms up. */
void warmup_init(struct dormant *m, enum warmup_mode mode, int settle_ms);
/* Stop a run and the thread; before the allocations go. */
void warmup_finish(struct dormant *m);
/* An allocation came (m->lock held): run once they settle. */
void warmup_note_alloc(struct dormant *m);
/* The stats (m->lock held). */
void warmup_stats_get(struct dormant *m, struct dormant_warmup_stats *ret);

#endif
