/* SPDX-License-Identifier: MIT */
/*
 * Whole-process capture: libdormant-preload.so, loaded with LD_PRELOAD (see
 * tools/dormant-run and docs/capture.md), interposes the CUDA runtime's
 * cudaMalloc and cudaFree so that every device allocation a program makes
 * through them (PyTorch's caching allocator included) is a dormant allocation
 * of one process-wide manager, under the calling thread's tag and policy
 * ("default", following the tag's policy, keep unless set otherwise; a region
 * chooses others: dormant_set_thread_tag(), dormant_set_thread_policy()).
 *
 * Capture is on when $DORMANT_PRELOAD is "1", or when it is unset and the
 * shim was preloaded under torch_memory_saver's file name ($LD_PRELOAD names
 * a torch_memory_saver library: a launcher written for it); otherwise every
 * call goes through to the CUDA runtime untouched. The manager is created at the first
 * interposed allocation (or the first dormant_preload_manager() call), with
 * options from the environment ($DORMANT_BACKEND, $DORMANT_HOST_MODE, ...),
 * and an HTTP server is started beside it when $DORMANT_LISTEN is set.
 *
 * An allocation outside every region (none announced on the thread,
 * dormant_preload_set_thread_region(), and the thread's tag "default")
 * whose tag is not awake (the program allocates while it sleeps) is given
 * ordinary device memory by the CUDA runtime, not captured: it works, and
 * stays on the device until freed (counted in /stats, "ordinary"; one log
 * line). Inside a region, under a tag the thread chose, or while the process
 * is checkpointed (residue mode), it fails with cudaErrorMemoryAllocation.
 *
 * What is not captured, and what the shim does then:
 *  - cudaMallocAsync, cudaMallocFromPoolAsync, cudaMallocManaged: passed to
 *    the CUDA runtime, counted in struct dormant_preload_stats and /stats,
 *    one log line per kind on stderr. That memory stays resident.
 *  - cudaMallocHost, cudaHostAlloc, cudaMallocPitch, cudaMalloc3D, arrays:
 *    not interposed (host memory, or rare entry points).
 *  - capture that cannot start (PyTorch's expandable segments or its
 *    cudaMallocAsync backend in $PYTORCH_CUDA_ALLOC_CONF / $PYTORCH_ALLOC_CONF,
 *    a manager or server that fails to start): every cudaMalloc then returns
 *    cudaErrorInitializationError and the reason is logged once; nothing is
 *    half captured.
 *  - a child made by fork() without exec() is not captured: the shim passes
 *    every call through there (the parent's manager is not the child's).
 *
 * The shim never exits or aborts the process. Its lines on stderr start with
 * "dormant-preload: "; $DORMANT_PRELOAD_QUIET=1 silences them.
 */
#ifndef DORMANT_PRELOAD_H
#define DORMANT_PRELOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "dormant.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dormant_preload_stats {
	/* Capture works in this process: allocations go to the manager. */
	bool active;
	/* "" while active or not yet started; else why not ("off",
	 * "forked child", or the refusal). */
	char reason[DORMANT_ERROR_MAX];
	uint64_t captured_allocations; /* cudaMalloc calls the manager served */
	uint64_t captured_frees;       /* cudaFree/cudaFreeAsync of its pointers */
	uint64_t failed_allocations;   /* cudaMalloc calls that returned an error */
	uint64_t foreign_frees;        /* frees of other pointers, passed through */
	uint64_t async_allocations;    /* cudaMallocAsync/FromPoolAsync passed through */
	uint64_t async_bytes;
	uint64_t managed_allocations;  /* cudaMallocManaged passed through */
	uint64_t managed_bytes;
};

/*
 * The process manager of the shim, created on first use. Not owned by the
 * caller: never dormant_destroy() it. It is also the manager of
 * dormant_torch_malloc() (dormant_torch_get_manager()).
 * Returns -ENOTSUP when capture is off in this process ($DORMANT_PRELOAD not
 * "1", or a forked child), -EPERM when capture was refused (the message says
 * why), or the error of dormant_new() / dormant_server_start().
 * Thread-safe.
 */
DORMANT_EXPORT int dormant_preload_manager(struct dormant **ret);

/* Fill *ret with the shim's counters. Never fails for a non-NULL ret. */
DORMANT_EXPORT int dormant_preload_stats_get(struct dormant_preload_stats *ret);

/*
 * Whether cudaMalloc calls of the calling thread are captured (the default)
 * or go to the CUDA runtime as if the shim were not there (ordinary device
 * memory, not managed: it stays on the device and works while the process's
 * managed memory sleeps). For what must not be dormant memory: buffers
 * shared with other processes by CUDA IPC (DeepEP's), and
 * torch_memory_saver's disable() and interesting region. Frees need no
 * flag: a pointer the manager did not hand out always goes to the runtime.
 * on: 1 captured, 0 not, -1 back to the default: $TMS_INIT_ENABLE when set
 * (torch_memory_saver's variable: "1"/"true" captured, else not), else
 * captured (not captured when preloaded under torch_memory_saver's name,
 * as torch_memory_saver). Once regions are tracked, 1 captures only inside a
 * region or where the default captures (dormant_preload_set_thread_region()).
 * Returns -EINVAL for another value. Per thread; never blocks.
 */
DORMANT_EXPORT int dormant_preload_set_thread_capture(int on);
/* The calling thread's capture flag (torch_memory_saver's interesting
 * region), as set or defaulted above. Whether a cudaMalloc is captured also
 * depends on regions, once they are tracked (dormant_preload_set_thread_region()).
 * Never fails. */
DORMANT_EXPORT bool dormant_preload_get_thread_capture(void);

/*
 * Whether the calling thread is inside a region (1) or outside every region
 * (0): the torch_memory_saver drop-in calls it as its region() and
 * cuda_graph() begin and end (and with 0 inside disable()). The first call in
 * the process, with either value, turns region tracking on for every thread:
 * from then on a thread's cudaMalloc is captured only when its capture flag
 * is on and it is inside a region, or outside every region where the
 * default captures there ($TMS_INIT_ENABLE=1, or dormant's own capture with
 * $TMS_INIT_ENABLE unset). A flag switched on outside every region where the
 * default does not capture (slime's tms_set_interesting_region(True) after
 * DeepEP's buffer, in a child of configure_subprocess()) then captures
 * nothing: only regions are managed, as torch_memory_saver promises, and
 * the rest is ordinary memory that works while the regions sleep. Before
 * any call the capture flag alone decides.
 * Returns the previous value (0 or 1), -EINVAL for another value. Per
 * thread; never blocks.
 */
DORMANT_EXPORT int dormant_preload_set_thread_region(int inside);
/* Whether the calling thread is inside a region (as last set). Never fails. */
DORMANT_EXPORT bool dormant_preload_get_thread_region(void);

#ifdef __cplusplus
}
#endif

#endif
