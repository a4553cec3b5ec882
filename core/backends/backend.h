/* SPDX-License-Identifier: MIT */
/*
 * The device backend interface: what the manager needs from a device, as a
 * table of functions. Two implementations: backend_cuda.c (the CUDA driver
 * API, loaded at run time) and backend_host.c (a simulated device on host
 * memory). The calls a test makes fail (creating, mapping and copying
 * memory) go through the backend_*() wrappers below, which add fault
 * injection; host allocations, disk, checkpoint and restore check their
 * fault where they are made (backend_fault_check()). Everything else
 * (streams, events, unmapping, releasing, queries) is called through the
 * table directly. Both backends note every call that reaches the device
 * (backend_note_call()), to count those made while the process is
 * checkpointed.
 *
 * Every function returns 0 or a negative errno and records a message with
 * error_set(). All of them are safe to call from any thread.
 */
#ifndef DORMANT_BACKEND_H
#define DORMANT_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dormant.h"
#include "hash.h"
#include "util.h"

struct backend;

struct backend_ops {
	const char *name;
	void (*destroy)(struct backend *b);
	int (*device_count)(struct backend *b);
	/* The device of the calling thread's current context, else 0. */
	int (*current_device)(struct backend *b);
	/* Smallest mapping granularity of a device (a power of two). */
	int (*granularity)(struct backend *b, int device, size_t *ret);
	/* Reserve / free a virtual address range (no physical memory). */
	int (*va_reserve)(struct backend *b, int device, size_t size, size_t align,
			  uintptr_t *ret);
	int (*va_free)(struct backend *b, uintptr_t va, size_t size);
	/* Create / release physical device memory. */
	int (*mem_create)(struct backend *b, int device, size_t size, uint64_t *ret_handle);
	int (*mem_release)(struct backend *b, int device, uint64_t handle);
	/* Map physical memory at va (read-write for the device) / unmap it. */
	int (*mem_map)(struct backend *b, int device, uintptr_t va, size_t size, uint64_t handle);
	int (*mem_unmap)(struct backend *b, int device, uintptr_t va, size_t size);
	/* Pin / unpin host memory for fast copies. A copy must not span two
	 * separately pinned ranges. */
	int (*host_pin)(struct backend *b, void *ptr, size_t size);
	int (*host_unpin)(struct backend *b, void *ptr);
	/* Streams and events of a device. event_wait blocks without spinning. */
	int (*stream_create)(struct backend *b, int device, void **ret);
	void (*stream_destroy)(struct backend *b, int device, void *stream);
	int (*event_create)(struct backend *b, int device, void **ret);
	void (*event_destroy)(struct backend *b, int device, void *event);
	int (*event_record)(struct backend *b, int device, void *event, void *stream);
	int (*event_wait)(struct backend *b, int device, void *event);
	/* Asynchronous copies and zero-fill on a stream. */
	int (*copy_to_host)(struct backend *b, int device, void *dst, uintptr_t src, size_t size,
			    void *stream);
	int (*copy_to_device)(struct backend *b, int device, uintptr_t dst, const void *src,
			      size_t size, void *stream);
	int (*zero)(struct backend *b, int device, uintptr_t dst, size_t size, void *stream);
	/* Wait for all work on the device, the process's other streams too. */
	int (*synchronize)(struct backend *b, int device);
	int (*mem_info)(struct backend *b, int device, uint64_t *ret_free, uint64_t *ret_total);
	/* Whether the device has been used (so mem_info costs no new context). */
	bool (*device_active)(struct backend *b, int device);
	/* Hash count ranges of device memory (hash.h) into out[i], after
	 * the work queued on stream before; returns when they are done. May be
	 * NULL; -ENOTSUP when the device cannot run the kernel. */
	int (*checksum)(struct backend *b, int device, const struct checksum_range *ranges,
			size_t count, void *stream, struct checksum *out);
	/* Hashing queued beside other work (a wake hashes each group of
	 * chunks while later ones still copy), all three NULL or none:
	 *  - checksum_start: a job of count ranges cut into group_count
	 *    groups of consecutive ranges (group g has groups[g]; both arrays
	 *    are copied), hashed on stream, one result per range kept on the
	 *    device until finish; -ENOTSUP when the device cannot run the
	 *    kernel;
	 *  - checksum_queue: hash group g on the job's stream once the work
	 *    recorded in event (on another stream; NULL: none) is done. The
	 *    host does not wait, nor does later work on the event's stream;
	 *  - checksum_finish: wait for every queued hash, read the results
	 *    into out[0..count) (NULL: read nothing, only wait) and free the
	 *    job, whatever it returns. */
	int (*checksum_start)(struct backend *b, int device, const struct checksum_range *ranges,
			      size_t count, const size_t *groups, size_t group_count, void *stream,
			      void **ret_job);
	int (*checksum_queue)(struct backend *b, int device, void *job, size_t g, void *event);
	int (*checksum_finish)(struct backend *b, int device, void *job, struct checksum *out);
	/* A host-to-device copy done by a kernel on the device's SMs instead
	 * of its copy engines (kernels/copy.cu), queued on stream as
	 * copy_to_device is; src lies in one range pinned with host_pin (read
	 * through its device mapping). size 0 queues nothing and only loads
	 * the kernel (a wake loads it before it times it). May be NULL;
	 * -ENOTSUP when the device cannot run the kernel. */
	int (*copy_to_device_kernel)(struct backend *b, int device, uintptr_t dst, const void *src,
				     size_t size, void *stream);
	/* The simulated device only, may be NULL: the rate (1e9 bytes/s) its
	 * copies to the device run at, by the copy engines (kernel false) or
	 * the copy kernel, which a wake's probe takes instead of the one it
	 * timed (wakecopy.h); 0: none, time it. */
	double (*simulated_copy_gbps)(struct backend *b, int device, bool kernel);
	/* Load the checksum kernel now, as the first hash would (the engine's
	 * device setup: a warm-up does it ahead of the first sleep). May be
	 * NULL (nothing to load); -ENOTSUP when the device cannot run it. */
	int (*checksum_prepare)(struct backend *b, int device);
	/* Tests only, may be NULL: queue a write of device memory on the
	 * device's default stream, run at the next synchronize (the host
	 * backend with DORMANT_HOST_DEFER_STREAMS=1). */
	int (*defer_write)(struct backend *b, int device, uintptr_t dst, const void *src,
			   size_t size);
	/* Residue mode (docs/design.md, "Residue"). May be NULL:
	 *  - free_outside: a device's free and total memory as read from
	 *    outside this process's CUDA state (NVML); -ENOTSUP when it cannot
	 *    be read. The simulated device's may run while the process is
	 *    checkpointed; the CUDA one's may not (residue_free_outside() asks
	 *    the helper then);
	 *  - residue_checkpointed: the helper process has checkpointed the
	 *    process's device state (on true) or restored it (false). The
	 *    simulated device gives back what it models as the process's
	 *    context and driver state (host_residue_bytes), and takes it again. */
	int (*free_outside)(struct backend *b, int device, uint64_t *ret_free,
			    uint64_t *ret_total);
	void (*residue_checkpointed)(struct backend *b, bool on);
};

struct fault {
	_Atomic uint64_t calls;
	_Atomic uint64_t device_calls[DORMANT_DEVICES_MAX]; /* the calls made for each device */
	_Atomic int device_only; /* 0: calls on any device count; else device + 1's only */
	_Atomic uint64_t target; /* 0: disarmed; else the call number that fails */
	_Atomic uint64_t armed_at; /* the call count when it was armed: messages count from it */
	_Atomic int error;
	_Atomic bool repeat;
};

struct backend {
	const struct backend_ops *ops;
	struct logger log;
	struct fault faults[DORMANT_FAULT_OPS];
	/* Residue mode: true while the process's device state is checkpointed,
	 * when no call may reach the device; calls_checkpointed counts those
	 * that did anyway (both backends count their calls; CI proves it 0). */
	_Atomic bool checkpointed;
	_Atomic uint64_t calls_checkpointed;
	/* Memory taken by dormant_debug_occupy(), per device. */
	uint64_t occupy_handles[DORMANT_DEVICES_MAX][64];
	size_t occupy_count[DORMANT_DEVICES_MAX];
};

struct backend_config {
	const char *name; /* "auto", "cuda", "host" */
	int host_devices;
	size_t host_device_bytes;
	size_t host_residue_bytes; /* the simulated device's model of a context */
	struct logger log;
};

/* Count a call that reached the device while the process is checkpointed
 * (struct backend's calls_checkpointed). */
static inline void backend_note_call(struct backend *b)
{
	if (atomic_load_explicit(&b->checkpointed, memory_order_relaxed))
		atomic_fetch_add(&b->calls_checkpointed, 1);
}

/* Pick and create the backend named in config. */
int backend_new(const struct backend_config *config, struct backend **ret);
void backend_destroy(struct backend *b);

/* Implementations. backend_cuda_new() fails with -ENODEV when no driver or
 * no device is usable. */
int backend_host_new(const struct backend_config *config, struct backend **ret);
int backend_cuda_new(const struct backend_config *config, struct backend **ret);

/* Count a call of op (made for device, or -1: for none) and fail it if a
 * fault is armed for it. */
int backend_fault_check(struct backend *b, enum dormant_fault_op op);
int backend_fault_check_on(struct backend *b, enum dormant_fault_op op, int device);
/* The same count, without the message: the armed error of this call of op,
 * or 0 (for a request that carries it elsewhere: the residue's helper). */
int backend_fault_due(struct backend *b, enum dormant_fault_op op);
/* Arm op's fault; _on with device >= 0 counts and fails only that device's
 * calls (not for DORMANT_FAULT_HOST_ALLOC). */
int backend_fault_arm(struct backend *b, enum dormant_fault_op op, unsigned nth, int error,
		      bool repeat);
int backend_fault_arm_on(struct backend *b, enum dormant_fault_op op, int device, unsigned nth,
			 int error, bool repeat);

/* Wrappers: fault-injected where the op is one of enum dormant_fault_op. */
int backend_mem_create(struct backend *b, int device, size_t size, uint64_t *ret_handle);
int backend_mem_map(struct backend *b, int device, uintptr_t va, size_t size, uint64_t handle);
int backend_copy_to_host(struct backend *b, int device, void *dst, uintptr_t src, size_t size,
			 void *stream);
int backend_copy_to_device(struct backend *b, int device, uintptr_t dst, const void *src,
			   size_t size, void *stream);
/* copy_to_device_kernel, counted and failed as a copy (DORMANT_FAULT_COPY);
 * -ENOTSUP where the backend has none. */
int backend_copy_to_device_kernel(struct backend *b, int device, uintptr_t dst, const void *src,
				  size_t size, void *stream);

/* Create and map physical memory of size bytes at va, in one step; on
 * failure nothing stays created or mapped. */
int backend_mem_create_map(struct backend *b, int device, uintptr_t va, size_t size,
			   uint64_t *ret_handle);
/* Unmap and release; returns the first error but always tries both. */
int backend_mem_unmap_release(struct backend *b, int device, uintptr_t va, size_t size,
			      uint64_t handle);

/* Take bytes on device outside the manager (0: give all back). */
int backend_occupy(struct backend *b, int device, size_t bytes);

/* A synchronous copy on a throwaway stream. */
int backend_copy_sync(struct backend *b, int device, void *host, uintptr_t dev, size_t size,
		      bool to_host);

#endif
