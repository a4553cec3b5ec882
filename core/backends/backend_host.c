/* SPDX-License-Identifier: MIT */
/*
 * The host backend: a simulated device on host memory, with the semantics of
 * the CUDA VMM path. Address ranges are reserved with mmap(PROT_NONE);
 * "physical memory" is a handle counted against a simulated capacity; mapping
 * puts anonymous pages at the reserved address (poisoned, since fresh device
 * memory is not zeroed either), and unmapping puts the PROT_NONE reservation
 * back. The pages an unmap takes away are kept as the simulated device's
 * spare memory, handed to the kernel as reclaimable (MADV_FREE), and the next
 * map of the same size takes them (struct host_spares). Copies are memcpy,
 * executed when issued; with
 * DORMANT_HOST_DEFER_STREAMS=1 (a test tool, off by default) work queued on a
 * stream runs only when an event after it is waited for, the stream is
 * destroyed or its device is synchronized, as on a real device, so that a
 * missing wait or synchronize shows as stale data.
 *
 * DORMANT_HOST_CHECKSUM=0, a test tool: the simulated device cannot hash, as
 * a device whose driver cannot load the checksum kernel (-ENOTSUP).
 *
 * DORMANT_HOST_COPY_KERNEL=0, a test tool: the simulated device cannot run
 * the copy kernel either (-ENOTSUP); otherwise its "kernel" copies are
 * memcpy as its copy engines' are, but only from host memory pinned in one
 * range, as a kernel reading the host copy through its mapping needs.
 * DORMANT_HOST_COPY_GBPS=ENGINE[,ENGINE...]:KERNEL, a test tool: the rates
 * (1e9 bytes/s) a wake's probes take for its copy engines (one per probe, the
 * last repeating: a scrub that ends) and its copy kernel instead of the time
 * they measured (wakecopy.h), so tests drive wake_copy=auto's choice.
 *
 * DORMANT_HOST_PIN_RESIDENT=1, a test tool: pinning memory that has pages
 * never touched fails with -EFAULT (mincore() says which are resident). The
 * driver registers untouched memory about five times slower, so whatever
 * dormant pins it faults in first; the tests hold it to that.
 *
 * DORMANT_HOST_RENDEZVOUS=to_host:MS (or to_device:MS), a test tool too: the
 * first copy in that direction on each simulated device waits, up to MS
 * milliseconds, until every simulated device has issued one, and fails with
 * -ETIMEDOUT otherwise. Devices driven one after another cannot meet there;
 * devices driven at once do, so a test proves the concurrency is real.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"

#define HOST_GRANULARITY (2 * MiB)
#define POISON_BYTE 0xa5
/* Poison a line in every stride: enough for a missing zero-fill or restore
 * to show, without faulting in every page of every mapping. */
#define POISON_STRIDE (64 * KiB)
#define POISON_LINE 64

struct host_handle {
	int device;
	size_t size;
};

/* A stream's queued work: a copy (src set) or a zero-fill (src NULL). */
struct host_op {
	struct host_op *next;
	void *dst;
	const void *src;
	size_t size;
	void *owned; /* freed once run (a deferred write's own copy of its data) */
};

struct host_stream {
	struct host_stream *next;
	uint64_t id;
	int device;
	struct host_op *head, *tail;
	uint64_t issued, done; /* ops queued and run so far */
};

/* Complete once its stream has run seq ops, or once the stream is gone. */
struct host_event {
	uint64_t stream_id; /* 0: never recorded */
	uint64_t seq;
};

struct pinned_range {
	uintptr_t start, end;
};

/* A hashing job (backend.h, checksum_start): its results stand for the
 * device buffer the kernel writes. */
struct host_job {
	size_t count, group_count;
	struct checksum_range *ranges;
	size_t *group_first; /* group_count + 1 */
	struct checksum *sums;
};

/* A queued group hash waiting for its event: it runs the moment its stream
 * has run seq ops (deferred streams: as early as a device could run it, so
 * that a hash queued before its copy is done hashes stale bytes). */
struct host_hash {
	struct host_hash *next;
	struct host_job *job;
	size_t group;
	uint64_t stream_id, seq;
};

/* DORMANT_HOST_RENDEZVOUS: one meeting of every device's first copy. */
struct rendezvous {
	int direction; /* 0: off; 1: copies to the host; 2: to the device */
	int timeout_ms;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool arrived[DORMANT_DEVICES_MAX];
	int count;
	bool over; /* everyone met, or someone gave up waiting */
};

#define HOST_HASH_THREADS_MAX 8

/* The simulated device's spare memory: pages an unmap took away, each run in
 * a reservation of its own, until a map of the same size takes them. A real
 * device's memory stays where it is; host memory given back to the system
 * does not always: on a VM whose balloon reports free pages to the
 * hypervisor (virtio-balloon's free page reporting, 2 MiB blocks, about 2 s
 * after they are freed) touching them again faults in the hypervisor. On the
 * build machine 1 GiB of such pages took 3 s to touch again, against 0.1 s
 * for pages still with the guest, and the README demo's wake after a pause
 * spent 3.8-5.7 s in map. MADV_FREE keeps the pages with the process but lets
 * the kernel take them when it needs memory: RSS less LazyFree falls on a
 * sleep as it did. At most the device's capacity is kept. */
struct host_spare {
	void *ptr;
	size_t size;
};

struct host_spares {
	pthread_mutex_t lock;
	struct host_spare *runs;
	size_t count, capacity;
	uint64_t bytes; /* in runs */
};

struct host_backend {
	struct backend base;
	int devices;
	uint64_t capacity;
	_Atomic uint64_t used[DORMANT_DEVICES_MAX];
	_Atomic bool active[DORMANT_DEVICES_MAX];
	bool defer; /* DORMANT_HOST_DEFER_STREAMS=1 */
	bool no_kernel; /* DORMANT_HOST_CHECKSUM=0: as a device without the kernel */
	bool no_copy_kernel; /* DORMANT_HOST_COPY_KERNEL=0 */
	/* DORMANT_HOST_COPY_GBPS: the engine's rates for its successive probes
	 * (the last repeats), the kernel's; 0: unset */
	double engine_gbps[8], kernel_gbps;
	unsigned engine_gbps_count;
	_Atomic unsigned engine_probes[DORMANT_DEVICES_MAX];
	pthread_mutex_t lock; /* the streams and their queues */
	struct host_stream *streams;
	uint64_t next_stream_id;
	/* stands for the trainer's own stream, for dormant_debug_defer_write() */
	struct host_stream *default_stream[DORMANT_DEVICES_MAX];
	/* Pinned host ranges, as the driver would know them: a copy must not
	 * span two of them (cuMemcpy cannot), which the copies check. */
	pthread_mutex_t pin_lock;
	struct pinned_range *pinned;
	size_t pinned_count, pinned_capacity;
	/* tests: DORMANT_HOST_PIN_FAIL=N fails the Nth pin (N+: and every
	 * later one), as a driver out of pinnable memory would */
	uint64_t pin_calls, pin_fail_at; /* under pin_lock; 0: none fails */
	bool pin_fail_repeat;
	/* tests: DORMANT_HOST_PIN_RESIDENT=1 refuses to pin memory with pages
	 * never touched (not resident): the driver registers those about five
	 * times slower, so dormant faults in what it will pin */
	bool pin_resident;
	struct rendezvous rendezvous;
	struct host_hash *hashes; /* waiting for their events, under lock */
	struct host_spares spares;
	unsigned hash_threads; /* threads hashing one large range (the "kernel") */
	/* Residue mode's model of what the driver holds for the process on a
	 * device it used (its context, libraries' workspaces): counted in
	 * used[] from the device's first use until a checkpoint gives it back
	 * (host_residue_bytes; 0: none). residue_held[d] says it is counted. */
	uint64_t residue_bytes;
	_Atomic bool residue_held[DORMANT_DEVICES_MAX];
};

/* Every op but the residue's own goes through here: it counts the calls
 * made while the process is checkpointed (backend.h), which must be none. */
static struct host_backend *host(struct backend *b)
{
	backend_note_call(b);
	return (struct host_backend *)b;
}

/* The device's context comes with its first use, as CUDA's does. */
static void residue_take(struct host_backend *h, int device)
{
	bool expected = false;

	if (h->residue_bytes &&
	    atomic_compare_exchange_strong(&h->residue_held[device], &expected, true))
		atomic_fetch_add(&h->used[device], h->residue_bytes);
}

static int check_device(struct backend *b, int device)
{
	if (device < 0 || device >= host(b)->devices)
		return error_set(-ENODEV, "no device %d (the host backend simulates %d)", device,
				 host(b)->devices);
	return 0;
}

static void op_free(struct host_op *op)
{
	free(op->owned);
	free(op);
}

static void stream_free(struct host_stream *s)
{
	while (s->head) {
		struct host_op *op = s->head;

		s->head = op->next;
		op_free(op);
	}
	free(s);
}

/* The simulated device's checksum kernel: a range of HASH_SLICE or more
 * is cut into slices hashed on up to hash_threads threads (the caller's
 * among them), as a device's threads would. The hash is a sum of per-word
 * terms (hash.h), so slices that start on word boundaries, hashed apart at
 * their own positions and added, give the CPU's bits. On the 2-core build
 * machine the README demo's sleep spent 0.45 s of its 0.6 s hashing 1 GiB. */
#define HASH_SLICE (4 * MiB)

struct hash_slice {
	const char *p;
	size_t size;
	uint64_t offset;
	struct checksum sum;
};

static void *hash_slice_main(void *arg)
{
	struct hash_slice *s = arg;

	s->sum = checksum_cpu(s->p, s->size, s->offset);
	return NULL;
}

static struct checksum hash_range(const struct host_backend *h, uintptr_t ptr, size_t size,
				  uint64_t offset)
{
	struct hash_slice slices[HOST_HASH_THREADS_MAX];
	pthread_t ids[HOST_HASH_THREADS_MAX];
	bool started[HOST_HASH_THREADS_MAX] = { false };
	size_t n = MIN((size_t)h->hash_threads, size / HASH_SLICE), step, at = 0;
	struct checksum sum = { { 0, 0 } };

	if (n <= 1)
		return checksum_cpu((const void *)ptr, size, offset);
	step = round_up((size + n - 1) / n, 8); /* slices start on words */
	for (size_t k = 0; k < n; k++) {
		size_t len = k + 1 == n ? size - at : MIN(step, size - at);

		slices[k] = (struct hash_slice){ .p = (const char *)ptr + at, .size = len,
						 .offset = offset + at };
		at += len;
	}
	for (size_t k = 1; k < n; k++)
		started[k] = pthread_create(&ids[k], NULL, hash_slice_main, &slices[k]) == 0;
	hash_slice_main(&slices[0]);
	for (size_t k = 1; k < n; k++) {
		if (started[k])
			pthread_join(ids[k], NULL);
		else /* no thread: this one hashes it */
			hash_slice_main(&slices[k]);
	}
	for (size_t k = 0; k < n; k++)
		checksum_add(&sum, &slices[k].sum);
	return sum;
}

static void job_hash(struct host_backend *h, struct host_job *job, size_t g)
{
	for (size_t i = job->group_first[g]; i < job->group_first[g + 1]; i++)
		job->sums[i] = hash_range(h, job->ranges[i].ptr, job->ranges[i].size,
					  job->ranges[i].offset);
}

/* Run the hashes waiting for stream id to have run done ops (all: done is
 * UINT64_MAX, the stream is gone). Called with lock. */
static void hashes_ready(struct host_backend *h, uint64_t id, uint64_t done)
{
	struct host_hash **p = &h->hashes;

	while (*p) {
		struct host_hash *x = *p;

		if (x->stream_id != id || x->seq > done) {
			p = &x->next;
			continue;
		}
		*p = x->next;
		job_hash(h, x->job, x->group);
		free(x);
	}
}

/*
 * Zero-fill simulated device memory, as a device's memset would: written in
 * place. (MADV_DONTNEED would be quicker here and fault the pages in again
 * at their next use; on a VM whose balloon takes freed pages, the next map's
 * poison took 3 s per GiB for them.)
 */
static void zero_fill(void *dst, size_t size)
{
	memset(dst, 0, size);
}

/* Run a stream's queued work until it has run upto ops. Called with lock. */
static void stream_run(struct host_backend *h, struct host_stream *s, uint64_t upto)
{
	while (s->head && s->done < upto) {
		struct host_op *op = s->head;

		s->head = op->next;
		if (!s->head)
			s->tail = NULL;
		if (op->src)
			memcpy(op->dst, op->src, op->size);
		else
			zero_fill(op->dst, op->size);
		s->done++;
		op_free(op);
		if (h->hashes)
			hashes_ready(h, s->id, s->done);
	}
}

static struct host_stream *stream_find(struct host_backend *h, uint64_t id)
{
	for (struct host_stream *s = h->streams; s; s = s->next)
		if (s->id == id)
			return s;
	return NULL;
}

/* Queue work on a stream, or run it at once without deferred streams. */
static int stream_issue(struct host_backend *h, struct host_stream *s, void *dst,
			const void *src, size_t size, void *owned)
{
	struct host_op *op;

	if (!h->defer) {
		if (src)
			memcpy(dst, src, size);
		else
			zero_fill(dst, size);
		free(owned);
		return 0;
	}
	op = malloc(sizeof(*op));
	if (!op) {
		free(owned);
		return error_set(-ENOMEM, "out of host memory");
	}
	*op = (struct host_op){ .dst = dst, .src = src, .size = size, .owned = owned };
	pthread_mutex_lock(&h->lock);
	if (s->tail)
		s->tail->next = op;
	else
		s->head = op;
	s->tail = op;
	s->issued++;
	pthread_mutex_unlock(&h->lock);
	return 0;
}

/* Move the pages of [va, va + size) into a spare run, leaving the range
 * mapped but empty (the caller puts the reservation back over it). false:
 * not kept (the spares are full, or the kernel cannot move them); the
 * caller's unmap frees them then. Under the lock throughout: moving the
 * page tables of a mapping is quick, and the run's slot is then its own. */
static bool spare_keep(struct host_spares *sp, uint64_t limit, uintptr_t va, size_t size)
{
	void *run = MAP_FAILED, *moved = MAP_FAILED;

	pthread_mutex_lock(&sp->lock);
	if (sp->count == sp->capacity) {
		size_t capacity = sp->capacity ? sp->capacity * 2 : 64;
		struct host_spare *runs = realloc(sp->runs, capacity * sizeof(*runs));

		if (runs) {
			sp->runs = runs;
			sp->capacity = capacity;
		}
	}
	if (sp->bytes + size <= limit && sp->count < sp->capacity) {
		/* 2 MiB aligned as the mapping is: its huge pages move whole */
		run = mmap_aligned(size, HOST_GRANULARITY, PROT_NONE, MAP_NORESERVE);
		if (run != MAP_FAILED)
			moved = mremap((void *)va, size, size,
				       MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, run);
	}
	if (moved != MAP_FAILED) {
		madvise(moved, size, MADV_FREE);
		sp->runs[sp->count++] = (struct host_spare){ .ptr = moved, .size = size };
		sp->bytes += size;
	}
	pthread_mutex_unlock(&sp->lock);
	if (moved == MAP_FAILED && run != MAP_FAILED)
		munmap(run, size);
	return moved != MAP_FAILED;
}

/* Put a spare run of exactly size bytes at va, over its reservation. false:
 * none (the caller maps fresh pages). */
static bool spare_take(struct host_spares *sp, uintptr_t va, size_t size)
{
	struct host_spare run = { 0 };

	pthread_mutex_lock(&sp->lock);
	for (size_t i = sp->count; i-- > 0;)
		if (sp->runs[i].size == size) {
			run = sp->runs[i];
			sp->runs[i] = sp->runs[--sp->count];
			sp->bytes -= size;
			break;
		}
	pthread_mutex_unlock(&sp->lock);
	if (!run.ptr)
		return false;
	if (mremap(run.ptr, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)va) != MAP_FAILED)
		return true;
	munmap(run.ptr, size);
	return false;
}

static void spares_free(struct host_spares *sp)
{
	for (size_t i = 0; i < sp->count; i++)
		munmap(sp->runs[i].ptr, sp->runs[i].size);
	free(sp->runs);
	pthread_mutex_destroy(&sp->lock);
}

static void host_destroy(struct backend *b)
{
	struct host_backend *h = host(b);

	/* Work still queued (a deferred write nobody waited for) is dropped:
	 * its memory may be gone by now. */
	while (h->streams) {
		struct host_stream *s = h->streams;

		h->streams = s->next;
		stream_free(s);
	}
	while (h->hashes) {
		struct host_hash *x = h->hashes;

		h->hashes = x->next;
		free(x);
	}
	/* the driver would keep them registered: a leak the tests look for */
	if (h->pinned_count)
		log_write(&b->log, DORMANT_LOG_WARNING,
			  "host backend: %zu host ranges still pinned at the end", h->pinned_count);
	spares_free(&h->spares);
	pthread_mutex_destroy(&h->lock);
	pthread_mutex_destroy(&h->pin_lock);
	pthread_cond_destroy(&h->rendezvous.cond);
	pthread_mutex_destroy(&h->rendezvous.lock);
	free(h->pinned);
	free(b);
}

static int host_device_count(struct backend *b)
{
	return host(b)->devices;
}

static int host_current_device(struct backend *b)
{
	(void)b;
	return 0;
}

static int host_granularity(struct backend *b, int device, size_t *ret)
{
	int r = check_device(b, device);

	if (r < 0)
		return r;
	*ret = HOST_GRANULARITY;
	return 0;
}

static int host_va_reserve(struct backend *b, int device, size_t size, size_t align,
			   uintptr_t *ret)
{
	void *p;
	int r = check_device(b, device);

	if (r < 0)
		return r;
	p = mmap_aligned(size, align, PROT_NONE, MAP_NORESERVE);
	if (p == MAP_FAILED)
		return error_set(-ENOMEM, "reserving %zu bytes of address space: %s", size,
				 strerror(errno));
	atomic_store(&host(b)->active[device], true);
	residue_take(host(b), device);
	*ret = (uintptr_t)p;
	return 0;
}

static int host_va_free(struct backend *b, uintptr_t va, size_t size)
{
	(void)b;
	if (munmap((void *)va, size) < 0)
		return error_set(-EINVAL, "freeing address range %#lx: %s", (unsigned long)va,
				 strerror(errno));
	return 0;
}

static int host_mem_create(struct backend *b, int device, size_t size, uint64_t *ret_handle)
{
	struct host_backend *h = host(b);
	struct host_handle *handle;
	uint64_t used;
	int r = check_device(b, device);

	if (r < 0)
		return r;
	if (size == 0 || size % HOST_GRANULARITY)
		return error_set(-EINVAL, "physical size %zu is not a multiple of the granularity",
				 size);
	used = atomic_fetch_add(&h->used[device], size) + size;
	if (used > h->capacity) {
		atomic_fetch_sub(&h->used[device], size);
		return error_set(-ENOMEM,
				 "device %d is out of memory: %zu bytes asked, %llu of %llu free",
				 device, size, (unsigned long long)(h->capacity - (used - size)),
				 (unsigned long long)h->capacity);
	}
	handle = malloc(sizeof(*handle));
	if (!handle) {
		atomic_fetch_sub(&h->used[device], size);
		return error_set(-ENOMEM, "out of host memory");
	}
	handle->device = device;
	handle->size = size;
	*ret_handle = (uint64_t)(uintptr_t)handle;
	return 0;
}

static int host_mem_release(struct backend *b, int device, uint64_t handle)
{
	struct host_handle *h = (struct host_handle *)(uintptr_t)handle;

	(void)device;
	atomic_fetch_sub(&host(b)->used[h->device], h->size);
	free(h);
	return 0;
}

static int host_mem_map(struct backend *b, int device, uintptr_t va, size_t size, uint64_t handle)
{
	struct host_handle *h = (struct host_handle *)(uintptr_t)handle;
	void *p;

	(void)b;
	if (h->device != device || h->size != size)
		return error_set(-EINVAL, "mapping %zu bytes of a %zu-byte handle of device %d on %d",
				 size, h->size, h->device, device);
	if (spare_take(&host(b)->spares, va, size)) {
		p = (void *)va; /* the poison writes keep its pages from the kernel */
	} else {
		p = mmap((void *)va, size, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
		if (p == MAP_FAILED)
			return error_set(-ENOMEM, "mapping %zu bytes at %#lx: %s", size,
					 (unsigned long)va, strerror(errno));
		/* Huge pages where the host has them: a restore then takes one
		 * fault per 2 MiB instead of one per 4 KiB (the granularity keeps
		 * mappings 2 MiB aligned). Only a hint; failure changes nothing. */
		madvise(p, size, MADV_HUGEPAGE);
	}
	for (size_t off = 0; off < size; off += POISON_STRIDE)
		memset((char *)p + off, POISON_BYTE, POISON_LINE);
	memset((char *)p + size - POISON_LINE, POISON_BYTE, POISON_LINE);
	return 0;
}

static int host_mem_unmap(struct backend *b, int device, uintptr_t va, size_t size)
{
	struct host_backend *h = host(b);
	void *p;

	(void)device;
	(void)spare_keep(&h->spares, h->capacity, va, size);
	p = mmap((void *)va, size, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return error_set(-EIO, "unmapping %zu bytes at %#lx: %s", size, (unsigned long)va,
				 strerror(errno));
	return 0;
}

/* DORMANT_HOST_PIN_RESIDENT: 0 when every page of [ptr, ptr + size) is
 * resident, else -EFAULT, the error set. */
static int pin_resident_check(void *ptr, size_t size)
{
	long page = sysconf(_SC_PAGESIZE);
	uintptr_t start = (uintptr_t)ptr / (uintptr_t)page * (uintptr_t)page;
	size_t pages = ((uintptr_t)ptr + size - start + (size_t)page - 1) / (size_t)page;
	unsigned char *resident = malloc(MAX(pages, (size_t)1));
	size_t missing = 0;

	if (!resident)
		return error_set(-ENOMEM, "out of host memory");
	if (mincore((void *)start, pages * (size_t)page, resident) < 0) {
		int e = errno;

		free(resident);
		return error_set(-e, "pinning %zu bytes at %p: mincore: %s", size, ptr,
				 strerror(e));
	}
	for (size_t i = 0; i < pages; i++)
		missing += !(resident[i] & 1);
	free(resident);
	if (missing)
		return error_set(-EFAULT, "pinning %zu bytes at %p: %zu of its %zu pages were "
					  "never touched (DORMANT_HOST_PIN_RESIDENT)",
				 size, ptr, missing, pages);
	return 0;
}

static int host_host_pin(struct backend *b, void *ptr, size_t size)
{
	struct host_backend *h = host(b);
	uintptr_t start = (uintptr_t)ptr;
	int r = 0;

	pthread_mutex_lock(&h->pin_lock);
	h->pin_calls++;
	if (h->pin_fail_at &&
	    (h->pin_calls == h->pin_fail_at || (h->pin_fail_repeat && h->pin_calls > h->pin_fail_at)))
		r = error_set(-ENOMEM, "pinning %zu bytes: pin call %llu fails "
				       "(DORMANT_HOST_PIN_FAIL)",
			      size, (unsigned long long)h->pin_calls);
	if (r == 0 && h->pin_resident)
		r = pin_resident_check(ptr, size);
	/* cuMemHostRegister refuses memory registered already */
	for (size_t i = 0; i < h->pinned_count && r == 0; i++)
		if (start < h->pinned[i].end && start + size > h->pinned[i].start)
			r = error_set(-EINVAL, "pinning %zu bytes at %p: part of it is pinned "
					       "already (CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)",
				      size, ptr);
	if (r == 0 && h->pinned_count == h->pinned_capacity) {
		size_t capacity = h->pinned_capacity ? h->pinned_capacity * 2 : 64;
		struct pinned_range *grown = realloc(h->pinned, capacity * sizeof(*grown));

		if (!grown)
			r = error_set(-ENOMEM, "out of host memory");
		else {
			h->pinned = grown;
			h->pinned_capacity = capacity;
		}
	}
	if (r == 0)
		h->pinned[h->pinned_count++] = (struct pinned_range){
			.start = start, .end = start + size };
	pthread_mutex_unlock(&h->pin_lock);
	return r;
}

/* DORMANT_HOST_PIN_FAIL: N or N+ (N >= 1). */
static int pin_fail_parse(struct host_backend *h, const char *text)
{
	char *end;
	unsigned long long n;

	errno = 0;
	n = strtoull(text, &end, 10);
	h->pin_fail_repeat = *end == '+';
	if (errno || n == 0 || end == text || *(end + h->pin_fail_repeat))
		return error_set(-EINVAL, "DORMANT_HOST_PIN_FAIL must be N or N+ (N >= 1), not \"%s\"",
				 text);
	h->pin_fail_at = n;
	return 0;
}

static int host_host_unpin(struct backend *b, void *ptr)
{
	struct host_backend *h = host(b);

	pthread_mutex_lock(&h->pin_lock);
	for (size_t i = 0; i < h->pinned_count; i++)
		if (h->pinned[i].start == (uintptr_t)ptr) {
			h->pinned[i] = h->pinned[--h->pinned_count];
			break;
		}
	pthread_mutex_unlock(&h->pin_lock);
	return 0;
}

/* A copy from or to pinned memory stays inside one pinned range. */
static int check_pinned_span(struct backend *b, const void *ptr, size_t size)
{
	struct host_backend *h = host(b);
	uintptr_t p = (uintptr_t)ptr;
	int r = 0;

	pthread_mutex_lock(&h->pin_lock);
	for (size_t i = 0; i < h->pinned_count; i++)
		if (p >= h->pinned[i].start && p < h->pinned[i].end && p + size > h->pinned[i].end)
			r = error_set(-EINVAL,
				      "a copy of %zu bytes at %p spans two pinned ranges "
				      "(one cuMemcpy cannot)",
				      size, ptr);
	pthread_mutex_unlock(&h->pin_lock);
	return r;
}

static int host_stream_create(struct backend *b, int device, void **ret)
{
	struct host_backend *h = host(b);
	struct host_stream *s;
	int r = check_device(b, device);

	if (r < 0)
		return r;
	s = calloc(1, sizeof(*s));
	if (!s)
		return error_set(-ENOMEM, "out of host memory");
	s->device = device;
	pthread_mutex_lock(&h->lock);
	s->id = ++h->next_stream_id;
	s->next = h->streams;
	h->streams = s;
	pthread_mutex_unlock(&h->lock);
	*ret = s;
	return 0;
}

/* Like cuStreamDestroy: work already queued still completes. */
static void host_stream_destroy(struct backend *b, int device, void *stream)
{
	struct host_backend *h = host(b);
	struct host_stream *s = stream;

	(void)device;
	pthread_mutex_lock(&h->lock);
	stream_run(h, s, s->issued);
	for (struct host_stream **p = &h->streams; *p; p = &(*p)->next)
		if (*p == s) {
			*p = s->next;
			break;
		}
	hashes_ready(h, s->id, UINT64_MAX);
	pthread_mutex_unlock(&h->lock);
	stream_free(s);
}

static int host_event_create(struct backend *b, int device, void **ret)
{
	struct host_event *event;
	int r = check_device(b, device);

	if (r < 0)
		return r;
	event = calloc(1, sizeof(*event));
	if (!event)
		return error_set(-ENOMEM, "out of host memory");
	*ret = event;
	return 0;
}

static void host_event_destroy(struct backend *b, int device, void *event)
{
	(void)b;
	(void)device;
	free(event);
}

static int host_event_record(struct backend *b, int device, void *event, void *stream)
{
	struct host_backend *h = host(b);
	struct host_event *ev = event;
	struct host_stream *s = stream;

	(void)device;
	pthread_mutex_lock(&h->lock);
	ev->stream_id = s->id;
	ev->seq = s->issued;
	pthread_mutex_unlock(&h->lock);
	return 0;
}

static int host_event_wait(struct backend *b, int device, void *event)
{
	struct host_backend *h = host(b);
	struct host_event *ev = event;
	struct host_stream *s;

	(void)device;
	pthread_mutex_lock(&h->lock);
	s = stream_find(h, ev->stream_id);
	if (s)
		stream_run(h, s, ev->seq);
	pthread_mutex_unlock(&h->lock);
	return 0;
}

/* A device's first copy in the rendezvous' direction waits for the others'. */
static int rendezvous_meet(struct host_backend *h, int device, bool to_host)
{
	struct rendezvous *rv = &h->rendezvous;
	struct timespec deadline;
	int r = 0;

	if (!rv->direction || (rv->direction == 1) != to_host)
		return 0;
	pthread_mutex_lock(&rv->lock);
	if (rv->over || rv->arrived[device]) {
		pthread_mutex_unlock(&rv->lock);
		return 0;
	}
	rv->arrived[device] = true;
	if (++rv->count == h->devices) {
		rv->over = true;
		pthread_cond_broadcast(&rv->cond);
	}
	clock_gettime(CLOCK_MONOTONIC, &deadline);
	deadline.tv_sec += rv->timeout_ms / 1000;
	deadline.tv_nsec += (long)(rv->timeout_ms % 1000) * 1000000L;
	if (deadline.tv_nsec >= 1000000000L) {
		deadline.tv_sec++;
		deadline.tv_nsec -= 1000000000L;
	}
	while (!rv->over)
		if (pthread_cond_timedwait(&rv->cond, &rv->lock, &deadline) == ETIMEDOUT)
			break;
	if (!rv->over) {
		rv->over = true; /* one meeting only: later copies pass */
		r = error_set(-ETIMEDOUT,
			      "device %d's first copy to the %s waited %d ms for the other "
			      "simulated devices' (DORMANT_HOST_RENDEZVOUS): the devices were not "
			      "driven at once",
			      device, to_host ? "host" : "device", rv->timeout_ms);
	}
	pthread_mutex_unlock(&rv->lock);
	return r;
}

static int rendezvous_init(struct rendezvous *rv)
{
	const char *env = getenv("DORMANT_HOST_RENDEZVOUS");
	pthread_condattr_t attr;
	char *end;

	pthread_mutex_init(&rv->lock, NULL);
	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&rv->cond, &attr);
	pthread_condattr_destroy(&attr);
	if (!env || !*env)
		return 0;
	if (strncmp(env, "to_host:", 8) == 0)
		rv->direction = 1;
	else if (strncmp(env, "to_device:", 10) == 0)
		rv->direction = 2;
	else
		return error_set(-EINVAL,
				 "DORMANT_HOST_RENDEZVOUS must be to_host:MS or to_device:MS, not "
				 "\"%s\"",
				 env);
	errno = 0;
	rv->timeout_ms = (int)strtol(strchr(env, ':') + 1, &end, 10);
	if (errno || *end || rv->timeout_ms <= 0 || end == strchr(env, ':') + 1)
		return error_set(-EINVAL, "DORMANT_HOST_RENDEZVOUS: bad milliseconds in \"%s\"",
				 env);
	return 0;
}

static int host_copy_to_host(struct backend *b, int device, void *dst, uintptr_t src, size_t size,
			     void *stream)
{
	int r = rendezvous_meet(host(b), device, true);

	if (r == 0)
		r = check_pinned_span(b, dst, size);
	if (r < 0)
		return r;
	return stream_issue(host(b), stream, dst, (const void *)src, size, NULL);
}

static int host_copy_to_device(struct backend *b, int device, uintptr_t dst, const void *src,
			       size_t size, void *stream)
{
	int r = rendezvous_meet(host(b), device, false);

	if (r == 0)
		r = check_pinned_span(b, src, size);
	if (r < 0)
		return r;
	return stream_issue(host(b), stream, (void *)dst, src, size, NULL);
}

/* As a kernel that reads the host copy through its device mapping: only
 * memory pinned in one range is mapped. */
static int host_copy_to_device_kernel(struct backend *b, int device, uintptr_t dst,
				      const void *src, size_t size, void *stream)
{
	struct host_backend *h = host(b);
	uintptr_t p = (uintptr_t)src;
	bool mapped = false;
	int r = check_device(b, device);

	if (r < 0)
		return r;
	if (h->no_copy_kernel)
		return error_set(-ENOTSUP, "the simulated device cannot run the copy kernel "
					   "(DORMANT_HOST_COPY_KERNEL=0)");
	if (size == 0)
		return 0;
	pthread_mutex_lock(&h->pin_lock);
	for (size_t i = 0; i < h->pinned_count && !mapped; i++)
		mapped = p >= h->pinned[i].start && size <= h->pinned[i].end - p;
	pthread_mutex_unlock(&h->pin_lock);
	if (!mapped)
		return error_set(-EINVAL,
				 "the copy kernel reads %zu bytes at %p, not within one pinned "
				 "range (only those are mapped for the device)",
				 size, src);
	r = rendezvous_meet(h, device, false);
	if (r < 0)
		return r;
	return stream_issue(h, stream, (void *)dst, src, size, NULL);
}

static double host_simulated_copy_gbps(struct backend *b, int device, bool kernel)
{
	struct host_backend *h = host(b);
	unsigned n;

	if (kernel || !h->engine_gbps_count)
		return h->kernel_gbps;
	n = atomic_fetch_add(&h->engine_probes[device], 1);
	return h->engine_gbps[MIN(n, h->engine_gbps_count - 1)];
}

/* "ENGINE[,ENGINE...]:KERNEL", rates in 1e9 bytes/s above 0. */
static int copy_gbps_parse(struct host_backend *h, const char *text)
{
	char *end;
	double v;

	h->engine_gbps_count = 0;
	for (;;) {
		errno = 0;
		v = strtod(text, &end);
		if (errno || end == text || !(v > 0) ||
		    h->engine_gbps_count == ARRAY_SIZE(h->engine_gbps))
			goto bad;
		h->engine_gbps[h->engine_gbps_count++] = v;
		if (*end == ':')
			break;
		if (*end != ',')
			goto bad;
		text = end + 1;
	}
	text = end + 1;
	errno = 0;
	v = strtod(text, &end);
	if (errno || end == text || *end || !(v > 0))
		goto bad;
	h->kernel_gbps = v;
	return 0;
bad:
	h->engine_gbps_count = 0;
	return error_set(-EINVAL,
			 "DORMANT_HOST_COPY_GBPS must be ENGINE[,ENGINE...]:KERNEL, rates in "
			 "GB/s above 0, at most 8 for the copy engines (e.g. 28:50 or 28,55:50)");
}

static int host_zero(struct backend *b, int device, uintptr_t dst, size_t size, void *stream)
{
	(void)device;
	return stream_issue(host(b), stream, (void *)dst, NULL, size, NULL);
}

/* The chunk checksum on the CPU, after the stream's queued work (as the
 * kernel would run after it on a device). */
static int no_kernel(void)
{
	return error_set(-ENOTSUP, "the simulated device cannot run the checksum kernel "
				   "(DORMANT_HOST_CHECKSUM=0)");
}

static int host_checksum(struct backend *b, int device, const struct checksum_range *ranges,
			 size_t count, void *stream, struct checksum *out)
{
	struct host_backend *h = host(b);
	struct host_stream *s = stream;
	int r = check_device(b, device);

	if (r < 0)
		return r;
	if (h->no_kernel)
		return no_kernel();
	pthread_mutex_lock(&h->lock);
	if (s)
		stream_run(h, s, s->issued);
	pthread_mutex_unlock(&h->lock);
	for (size_t i = 0; i < count; i++)
		out[i] = hash_range(h, ranges[i].ptr, ranges[i].size, ranges[i].offset);
	return 0;
}

static void job_free(struct host_job *job)
{
	free(job->ranges);
	free(job->group_first);
	free(job->sums);
	free(job);
}

static int host_checksum_start(struct backend *b, int device, const struct checksum_range *ranges,
			       size_t count, const size_t *groups, size_t group_count,
			       void *stream, void **ret_job)
{
	struct host_job *job;
	size_t at = 0;
	int r = check_device(b, device);

	(void)stream; /* the engine queues nothing else on it */
	if (r < 0)
		return r;
	if (host(b)->no_kernel)
		return no_kernel();
	job = calloc(1, sizeof(*job));
	if (!job)
		return error_set(-ENOMEM, "out of host memory");
	job->count = count;
	job->group_count = group_count;
	job->ranges = malloc(MAX(count, (size_t)1) * sizeof(*job->ranges));
	job->group_first = malloc((group_count + 1) * sizeof(*job->group_first));
	job->sums = calloc(MAX(count, (size_t)1), sizeof(*job->sums));
	if (!job->ranges || !job->group_first || !job->sums) {
		job_free(job);
		return error_set(-ENOMEM, "out of host memory");
	}
	memcpy(job->ranges, ranges, count * sizeof(*ranges));
	for (size_t g = 0; g < group_count; g++) {
		if (groups[g] > count - at) {
			job_free(job);
			return error_set(-EINVAL, "bad checksum groups");
		}
		job->group_first[g] = at;
		at += groups[g];
	}
	job->group_first[group_count] = at;
	if (at != count) {
		job_free(job);
		return error_set(-EINVAL, "checksum groups cover %zu of %zu ranges", at, count);
	}
	*ret_job = job;
	return 0;
}

/* Without deferred streams every copy is done when issued: hash at once.
 * With them, at once if the event's work has run, else the moment it runs. */
static int host_checksum_queue(struct backend *b, int device, void *job, size_t g, void *event)
{
	struct host_backend *h = host(b);
	struct host_job *j = job;
	struct host_event *ev = event;
	struct host_stream *s;
	struct host_hash *x;

	(void)device;
	if (g >= j->group_count)
		return error_set(-EINVAL, "no checksum group %zu", g);
	x = malloc(sizeof(*x));
	if (!x)
		return error_set(-ENOMEM, "out of host memory");
	pthread_mutex_lock(&h->lock);
	s = ev && h->defer ? stream_find(h, ev->stream_id) : NULL;
	if (s && s->done < ev->seq) {
		*x = (struct host_hash){ .next = h->hashes, .job = j, .group = g,
					 .stream_id = s->id, .seq = ev->seq };
		h->hashes = x;
		x = NULL;
	} else {
		job_hash(h, j, g);
	}
	pthread_mutex_unlock(&h->lock);
	free(x);
	return 0;
}

/* As a device's stream synchronize: the work each waiting hash waits for
 * runs, then the hash. */
static int host_checksum_finish(struct backend *b, int device, void *job, struct checksum *out)
{
	struct host_backend *h = host(b);
	struct host_job *j = job;

	(void)device;
	pthread_mutex_lock(&h->lock);
	for (;;) {
		struct host_hash *x = h->hashes;
		struct host_stream *s;
		uint64_t id, seq;

		while (x && x->job != j)
			x = x->next;
		if (!x)
			break;
		id = x->stream_id;
		seq = x->seq;
		s = stream_find(h, id);
		if (s)
			stream_run(h, s, seq); /* runs x, when s has run seq ops */
		hashes_ready(h, id, s ? MAX(s->done, seq) : UINT64_MAX);
	}
	pthread_mutex_unlock(&h->lock);
	if (out)
		memcpy(out, j->sums, j->count * sizeof(*out));
	job_free(j);
	return 0;
}

/* Every stream of the device, the default one too (cuCtxSynchronize). */
static int host_synchronize(struct backend *b, int device)
{
	struct host_backend *h = host(b);
	int r = check_device(b, device);

	if (r < 0)
		return r;
	pthread_mutex_lock(&h->lock);
	for (struct host_stream *s = h->streams; s; s = s->next)
		if (s->device == device)
			stream_run(h, s, s->issued);
	pthread_mutex_unlock(&h->lock);
	return 0;
}

/* Queue a copy of size bytes to dst on the device's default stream (made on
 * first use), as a kernel of the trainer still running would write it. */
static int host_defer_write(struct backend *b, int device, uintptr_t dst, const void *src,
			    size_t size)
{
	struct host_backend *h = host(b);
	void *copy;
	int r = check_device(b, device);

	if (r < 0)
		return r;
	if (!h->defer)
		return error_set(-ENOTSUP, "deferred writes need DORMANT_HOST_DEFER_STREAMS=1");
	if (!h->default_stream[device]) {
		void *s;

		r = host_stream_create(b, device, &s);
		if (r < 0)
			return r;
		h->default_stream[device] = s;
	}
	copy = malloc(size ? size : 1);
	if (!copy)
		return error_set(-ENOMEM, "out of host memory");
	memcpy(copy, src, size);
	return stream_issue(h, h->default_stream[device], (void *)dst, copy, size, copy);
}

static int host_mem_info(struct backend *b, int device, uint64_t *ret_free, uint64_t *ret_total)
{
	struct host_backend *h = host(b);
	uint64_t used;
	int r = check_device(b, device);

	if (r < 0)
		return r;
	used = atomic_load(&h->used[device]);
	*ret_free = used < h->capacity ? h->capacity - used : 0;
	*ret_total = h->capacity;
	return 0;
}

static bool host_device_active(struct backend *b, int device)
{
	return device >= 0 && device < host(b)->devices && atomic_load(&host(b)->active[device]);
}

/* As the driver's own view (NVML) would say it: no call into the device. */
static int host_free_outside(struct backend *b, int device, uint64_t *ret_free,
			     uint64_t *ret_total)
{
	struct host_backend *h = (struct host_backend *)b;
	uint64_t used;

	if (device < 0 || device >= h->devices)
		return error_set(-ENODEV, "no device %d", device);
	used = atomic_load(&h->used[device]);
	*ret_free = used < h->capacity ? h->capacity - used : 0;
	*ret_total = h->capacity;
	return 0;
}

/* What the driver's checkpoint frees, and its restore takes again. */
static void host_residue_checkpointed(struct backend *b, bool on)
{
	struct host_backend *h = (struct host_backend *)b;

	for (int d = 0; d < h->devices; d++) {
		bool expected = on;

		if (!atomic_load(&h->active[d]) ||
		    !atomic_compare_exchange_strong(&h->residue_held[d], &expected, !on))
			continue;
		if (on)
			atomic_fetch_sub(&h->used[d], h->residue_bytes);
		else
			atomic_fetch_add(&h->used[d], h->residue_bytes);
	}
}

static const struct backend_ops host_ops = {
	.name = "host",
	.destroy = host_destroy,
	.device_count = host_device_count,
	.current_device = host_current_device,
	.granularity = host_granularity,
	.va_reserve = host_va_reserve,
	.va_free = host_va_free,
	.mem_create = host_mem_create,
	.mem_release = host_mem_release,
	.mem_map = host_mem_map,
	.mem_unmap = host_mem_unmap,
	.host_pin = host_host_pin,
	.host_unpin = host_host_unpin,
	.stream_create = host_stream_create,
	.stream_destroy = host_stream_destroy,
	.event_create = host_event_create,
	.event_destroy = host_event_destroy,
	.event_record = host_event_record,
	.event_wait = host_event_wait,
	.copy_to_host = host_copy_to_host,
	.copy_to_device = host_copy_to_device,
	.zero = host_zero,
	.copy_to_device_kernel = host_copy_to_device_kernel,
	.simulated_copy_gbps = host_simulated_copy_gbps,
	.synchronize = host_synchronize,
	.mem_info = host_mem_info,
	.device_active = host_device_active,
	.defer_write = host_defer_write,
	.checksum = host_checksum,
	.checksum_start = host_checksum_start,
	.checksum_queue = host_checksum_queue,
	.checksum_finish = host_checksum_finish,
	.free_outside = host_free_outside,
	.residue_checkpointed = host_residue_checkpointed,
};

int backend_host_new(const struct backend_config *config, struct backend **ret)
{
	struct host_backend *h;
	int devices = config->host_devices;
	size_t capacity = config->host_device_bytes;
	const char *env;

	/* $DORMANT_HOST_DEVICES and $DORMANT_HOST_DEVICE_BYTES are read with
	 * the other options (options.c); 0 here is for direct callers (bench). */
	if (devices == 0)
		devices = 1;
	if (devices < 0 || devices > DORMANT_DEVICES_MAX)
		return error_set(-EINVAL, "the host backend simulates 1 to %d devices, not %d",
				 DORMANT_DEVICES_MAX, devices);
	if (capacity == 0)
		capacity = 64 * GiB;

	h = calloc(1, sizeof(*h));
	if (!h)
		return error_set(-ENOMEM, "out of host memory");
	h->base.ops = &host_ops;
	h->base.log = config->log;
	h->devices = devices;
	h->capacity = capacity;
	h->residue_bytes = MIN((uint64_t)config->host_residue_bytes, capacity);
	h->defer = (env = getenv("DORMANT_HOST_DEFER_STREAMS")) && strcmp(env, "1") == 0;
	h->no_kernel = (env = getenv("DORMANT_HOST_CHECKSUM")) && strcmp(env, "0") == 0;
	h->no_copy_kernel = (env = getenv("DORMANT_HOST_COPY_KERNEL")) && strcmp(env, "0") == 0;
	h->pin_resident = (env = getenv("DORMANT_HOST_PIN_RESIDENT")) && strcmp(env, "1") == 0;
	h->hash_threads = (unsigned)MAX(1L, MIN(sysconf(_SC_NPROCESSORS_ONLN),
						(long)HOST_HASH_THREADS_MAX));
	pthread_mutex_init(&h->lock, NULL);
	pthread_mutex_init(&h->pin_lock, NULL);
	pthread_mutex_init(&h->spares.lock, NULL);
	if (rendezvous_init(&h->rendezvous) < 0 ||
	    ((env = getenv("DORMANT_HOST_COPY_GBPS")) && *env &&
	     copy_gbps_parse(h, env) < 0) ||
	    ((env = getenv("DORMANT_HOST_PIN_FAIL")) && *env && pin_fail_parse(h, env) < 0)) {
		int r = -EINVAL;

		pthread_cond_destroy(&h->rendezvous.cond);
		pthread_mutex_destroy(&h->rendezvous.lock);
		pthread_mutex_destroy(&h->spares.lock);
		pthread_mutex_destroy(&h->pin_lock);
		pthread_mutex_destroy(&h->lock);
		free(h);
		return r;
	}
	atomic_store(&h->active[0], true);
	residue_take(h, 0);
	*ret = &h->base;
	return 0;
}
