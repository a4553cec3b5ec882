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
 *  - checksum.c: the chunks' checksums (verify.h);
 *  - state.c:    at the bottom, the engine's state, the accounting, timing
 *                and warnings the others report into, and a chunk's pieces
 *                given back: its device memory (engine_chunk_release()), a
 *                chunk's end (engine_chunk_drop()), and the copies no wake
 *                needs any more, as the host mode says, on a worker (a
 *                wake's commit and a rollback's end: engine_copies_done(),
 *                which engine_wake_end() calls) (state.h);
 *  - transfer.c: on top, this interface: sleep (and its rollback), wake (and
 *                its end, commit or undo, engine_wake_end()).
 * The engine logs nothing (but debug traces of the waits for its workers): what
 * went wrong without failing a transition is counted in its totals, the
 * first warning's text kept (engine_warn()), for the manager to log.
 * Doors open one way: transfer.c calls the stages, the stages call state.c
 * (and a stage below them: pipeline.c uses staging.c),
 * none calls transfer.c.
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

#include "state.h"

void engine_init(struct engine *e, struct backend *b, struct workers *w,
		 const struct logger *log, enum dormant_host_mode mode, size_t staging_bytes,
		 size_t pin_piece, bool pin_host);
void engine_finish(struct engine *e);

/* items: every mapped chunk of the tags going to sleep. */
int engine_sleep(struct engine *e, struct engine_item *items, size_t count,
		 struct engine_totals *t);
/* items: every unmapped chunk of the tags waking. Maps, zero-fills and
 * restores them all; on failure gives back what it mapped. The host copies
 * stay until engine_wake_end() says how the wake ended. */
int engine_wake(struct engine *e, struct engine_item *items, size_t count, struct engine_totals *t);
/* Every wake's end, the manager's and the engine's own. Done (its copies
 * and the manager's rebuilds succeeded): the host and disk copies that no
 * wake needs any more go as the host mode says (engine_copies_done(),
 * state.h). Not done (its copies failed, or a rebuild callback after
 * them): what it mapped (the items' mapped_here) is given back, the host
 * copies intact for a retry; a chunk that cannot be unmapped is told in t.
 * A sleep's rollback ends as a wake that is done, whatever came back. */
void engine_wake_end(struct engine *e, struct engine_item *items, size_t count,
		     struct engine_totals *t, bool done);

/* Set device d up for transitions, once (a transition's first step, or
 * ahead of it: the warm-up): its streams and events, the backend's checksum
 * kernel (a kernel that cannot load is left to the checksum path to report),
 * and, when host copies go unpinned, the staging ring. Timed into setup_s.
 * Not while a transition runs on the engine. */
int engine_device_setup(struct engine *e, int d);

#endif
