/* SPDX-License-Identifier: MIT */
/*
 * dormant: put a process's GPU memory to sleep and wake it again at the same
 * virtual addresses.
 *
 * The manager owns device allocations grouped by tag. Sleeping a tag releases
 * its physical device memory while its virtual address range stays reserved:
 * memory with policy DORMANT_KEEP is first copied to host memory (only its
 * live bytes: not what dormant_mark_unused() marked), memory with policy
 * DORMANT_DISCARD or DORMANT_REBUILD is released with no copy at all. Waking
 * maps fresh physical memory at the same addresses, restores DORMANT_KEEP
 * memory, zero-fills the rest, then runs the rebuild callbacks of
 * DORMANT_REBUILD tags. A policy belongs to a tag, and an allocation may have
 * one of its own (dormant_alloc_policy()). Pointers never change.
 *
 * Conventions, for every function below unless its comment says otherwise:
 *  - it returns 0 (or a count) on success and a negative errno on failure;
 *  - on failure, output parameters (ret_...) are left untouched and
 *    dormant_last_error() holds a message for the calling thread;
 *  - it is safe to call from any thread, also while a transition runs;
 *  - it never prints, never calls exit() or abort() on a runtime condition.
 */
#ifndef DORMANT_H
#define DORMANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DORMANT_EXPORT __attribute__((visibility("default")))
#else
#define DORMANT_EXPORT
#endif

/* A tag is 1 to DORMANT_TAG_MAX characters of [A-Za-z0-9_.:-]. */
#define DORMANT_TAG_MAX 63
/* At most this many tags per manager. */
#define DORMANT_TAGS_MAX 64
/* At most this many devices per manager. */
#define DORMANT_DEVICES_MAX 16
/* Size of the message buffers in reports and stats. */
#define DORMANT_ERROR_MAX 256
/* Size of a path option's buffer (disk_dir), its terminating NUL included. */
#define DORMANT_PATH_MAX 4096
/* Number of finite buckets in a duration histogram. */
#define DORMANT_HISTOGRAM_BUCKETS 14

struct dormant;

enum dormant_policy {
	DORMANT_KEEP = 0,    /* copy to host on sleep, restore on wake */
	DORMANT_DISCARD = 1, /* no host copy; zero-filled on wake */
	/* No host copy; on wake zero-filled, then refilled by the tag's rebuild
	 * callback (dormant_set_rebuild()) once the wake's KEEP memory is back. */
	DORMANT_REBUILD = 2,
	/* As DORMANT_KEEP, with the copy in a file of the disk directory instead
	 * of host memory (dormant_set_disk_dir()): written from the pinned
	 * staging ring while the device-to-host copies run, checksummed like a
	 * host copy, read back on wake and removed after it. */
	DORMANT_DISK = 3,
};

/* Where a per-allocation policy is asked for (dormant_alloc_policy(),
 * dormant_set_thread_policy()): "follow the tag's policy", also when the
 * tag's policy changes later. */
#define DORMANT_POLICY_TAG (-1)

enum dormant_state {
	DORMANT_AWAKE = 0,
	DORMANT_SLEEPING,
	DORMANT_ASLEEP,
	DORMANT_WAKING,
};

enum dormant_host_mode {
	/* Take $DORMANT_HOST_MODE ("retain" or "release"), else release. */
	DORMANT_HOST_DEFAULT = 0,
	/* Keep pinned host buffers across cycles: fastest, costs host memory
	 * equal to the kept bytes while awake too. */
	DORMANT_HOST_RETAIN,
	/* Give host memory back after each wake: leanest. */
	DORMANT_HOST_RELEASE,
	/* After each wake, unpin the host buffers and hand them to the kernel
	 * as reclaimable (MADV_FREE), on a worker thread (the wake does not
	 * wait): still in RSS until taken, shown as LazyFree in
	 * /proc/PID/smaps, taken when memory runs short; the next sleep waits
	 * for the unpin and reuses what the kernel left, faulting in only the
	 * rest. */
	DORMANT_HOST_RECLAIMABLE,
};

enum dormant_log_level {
	DORMANT_LOG_ERROR = 0,
	DORMANT_LOG_WARNING,
	DORMANT_LOG_INFO,
	DORMANT_LOG_DEBUG,
};

/* Receives the library's log messages (one line, no newline). May be called
 * from any thread, including the library's own worker threads. */
typedef void (*dormant_log_fn)(enum dormant_log_level level, const char *message,
			       void *userdata);

/* ---- Options ------------------------------------------------------------ */

/*
 * Options for dormant_new(): an object the library allocates and owns the
 * layout of, so that options can be added without breaking a program built
 * before (see "ABI" in docs/design.md). Each option has a name, a type, a
 * default and often an environment variable; an option left unset takes the
 * environment variable when it is set and non-empty (read by dormant_new()),
 * else the default. The options (the table itself is in core/options.c;
 * tests/ci checks that this list names every one):
 *
 *   backend            auto|cuda|host  $DORMANT_BACKEND    auto: cuda when a
 *                      device is usable, else host
 *   host_mode          retain|release|reclaimable  $DORMANT_HOST_MODE
 *                      release; reclaimable with residue=checkpoint (enum
 *                      dormant_host_mode)
 *   chunk_bytes        size   $DORMANT_CHUNK_BYTES  1GiB: largest physical
 *                      chunk of an allocation (rounded up to the granularity)
 *   guard_timeout_ms   int    30000: how long a sleep waits for training steps
 *                      to leave the guard (negative: forever; 0: not at all)
 *   copy_threads       int    $DORMANT_COPY_THREADS  min(online CPUs, 16), at
 *                      most 256
 *   staging_bytes      size   $DORMANT_STAGING_BYTES  256MiB: pinned staging
 *                      ring for unpinned copies
 *   pin_host           bool   $DORMANT_PIN_HOST  true (false with
 *                      residue=checkpoint): pin host copies
 *   pin_host_bytes     size   $DORMANT_PIN_HOST_BYTES  0: with pin_host
 *                      false, host copies of up to this many bytes pinned
 *                      anyway, spread through each sleep's copies
 *   pin_piece_bytes    size   $DORMANT_PIN_PIECE_BYTES  256MiB
 *   pin_threads        int    $DORMANT_PIN_THREADS  1 (1 to 32): threads that
 *                      pin the pieces of one host copy at once in the
 *                      warm-up and the staging ring (the H200's driver
 *                      pins no faster with more); a sleep pins piece by
 *                      piece on the thread that queues its copies
 *   reclaimable_pinned_bytes  size  $DORMANT_RECLAIMABLE_PINNED_BYTES  0:
 *                      host mode reclaimable: host copies of up to this
 *                      many bytes stay pinned after a wake (counted in
 *                      host_bytes), so that the next sleep copies into them
 *                      while it pins the others
 *   host_devices       int    $DORMANT_HOST_DEVICES  1 (host backend only)
 *   host_device_bytes  size   $DORMANT_HOST_DEVICE_BYTES  64GiB (host backend)
 *   verify             bool   $DORMANT_VERIFY  true: check restored chunks
 *                      after a wake (dormant_set_verify())
 *   skip_unchanged     bool   $DORMANT_SKIP_UNCHANGED  true (retain mode)
 *   parallel_devices   bool   $DORMANT_PARALLEL_DEVICES  true
 *   wake_overlap       bool   $DORMANT_WAKE_OVERLAP  true: map ahead of copies
 *   wake_map_threads   int    $DORMANT_WAKE_MAP_THREADS  1 (1 to 8)
 *   wake_copy          auto|engine|kernel  $DORMANT_WAKE_COPY  auto: what
 *                      copies a wake's kept chunks to the device: the copy
 *                      engines, the copy kernel on the SMs, or per wake the
 *                      faster of the two as measured on its first bytes
 *   wake_copy_probe_bytes    size  $DORMANT_WAKE_COPY_PROBE_BYTES  64MiB:
 *                      auto times this much on each before choosing
 *   wake_copy_reprobe_bytes  size  $DORMANT_WAKE_COPY_REPROBE_BYTES  4GiB:
 *                      auto, the kernel chosen: times the copy engines again
 *                      after 8 probes' bytes of it, then twice as many each
 *                      time, at most this much
 *   disk_dir           path   $DORMANT_DISK_DIR  $TMPDIR, else /tmp: where
 *                      DORMANT_DISK copies go (dormant_set_disk_dir())
 *   disk_chunk_bytes   size   $DORMANT_DISK_CHUNK_BYTES  64MiB: largest disk
 *                      read or write (at most a staging slot: staging_bytes/4)
 *   disk_names         bool   $DORMANT_DISK_NAMES  false: give disk copies a
 *                      name in disk_dir while they exist (a crash then leaves
 *                      them behind; unnamed files never outlive the process),
 *                      one file per allocation (unnamed: one per tag); disk
 *                      allocations then get chunks of their own, not a slab's
 *   disk_read          direct|cached|stream  $DORMANT_DISK_READ  direct: how a
 *                      wake reads disk copies: O_DIRECT around the page cache
 *                      (4 reads in flight), or through it with the kernel's
 *                      read-ahead, each piece dropped from the cache once
 *                      read: cached, 4 reads in flight; stream, one read in
 *                      flight in file order (the read-ahead keeps the disk
 *                      busy)
 *   warmup             auto|device|off  $DORMANT_WARMUP  auto: what the first
 *                      sleep would set up is done in the background once
 *                      allocations settle (dormant_warm_up())
 *   warmup_settle_ms   int    $DORMANT_WARMUP_SETTLE_MS  2000: the warm-up
 *                      starts when no allocation came for this long
 *   residue            keep|checkpoint  $DORMANT_RESIDUE  keep: what a sleep
 *                      does with what the process still holds on its devices
 *                      once every tag sleeps (context, libraries,
 *                      communicators): keep it, or have the driver's process
 *                      checkpoint take it to host memory (see "Residue" below)
 *   residue_lock_timeout_ms  int  $DORMANT_RESIDUE_LOCK_TIMEOUT_MS  10000:
 *                      how long the checkpoint waits for the process's
 *                      threads to leave their CUDA calls
 *   residue_timeout_ms  int  $DORMANT_RESIDUE_TIMEOUT_MS  120000: how long a
 *                      checkpoint or restore may take before its helper is
 *                      stopped (at least the lock's timeout and 5 s)
 *   host_residue_bytes size   $DORMANT_HOST_RESIDUE_BYTES  0 (host backend):
 *                      what each used simulated device holds for the process
 *                      outside tags, as a CUDA context does
 *
 * dormant_option_name() and friends list them at run time with their docs
 * (`dormantd --help` prints them). Sizes take a unit: "4096", "64KiB",
 * "256MiB", "1GiB" (also K, M, G, T, TiB; KB, MB, GB, TB are powers of ten).
 * Booleans are "true"/"false" (also 1/0, yes/no, on/off). Paths are absolute,
 * at most DORMANT_PATH_MAX - 1 bytes.
 *
 * An options object is not thread-safe: do not change one while another
 * thread uses it. dormant_new() copies what it needs, so the object may be
 * destroyed right after.
 */
struct dormant_options;

/* Create an options object with every option unset. -EINVAL (ret NULL),
 * -ENOMEM. The caller owns *ret and frees it with dormant_options_destroy(). */
DORMANT_EXPORT int dormant_options_new(struct dormant_options **ret);

/* Free an options object. Accepts NULL. */
DORMANT_EXPORT void dormant_options_destroy(struct dormant_options *o);

/*
 * Set option name to value, given as text (the same text its environment
 * variable takes). value NULL unsets it (the environment, then the default,
 * apply again). Returns -EINVAL for an unknown name or a bad value (the
 * message names both); the option is then unchanged. -ENOMEM.
 */
DORMANT_EXPORT int dormant_options_set(struct dormant_options *o, const char *name,
				       const char *value);

/* As dormant_options_set() with a number, for int, size and bool options
 * (bool: 0 is false, anything else true). -EINVAL for other types too. */
DORMANT_EXPORT int dormant_options_set_int(struct dormant_options *o, const char *name,
					   long long value);

/*
 * Set several options from text: "name=value" pairs separated by commas or
 * white space, e.g. "backend=host,chunk_bytes=64MiB" (what `dormantd
 * --option` takes). All or nothing: -EINVAL for the first bad pair (the
 * message names it) leaves o unchanged. -ENOMEM.
 */
DORMANT_EXPORT int dormant_options_parse(struct dormant_options *o, const char *text);

/* Set the log sink (NULL: the library logs nothing, the default). fn may be
 * called from any thread, including the library's own worker threads. */
DORMANT_EXPORT int dormant_options_set_log(struct dormant_options *o, dormant_log_fn fn,
					   void *userdata);

/*
 * The options known to this library, for documentation and bindings: i runs
 * from 0 until dormant_option_name() returns NULL. Each returns a static
 * string, or NULL for i out of range:
 *  - name: what dormant_options_set() takes;
 *  - type: "enum", "size", "int" or "bool" (more types may come);
 *  - values: an enum's values as "a|b|c" (NULL for other types);
 *  - default: the default in words (a value, or how it is computed);
 *  - env: the environment variable consulted, NULL if none;
 *  - doc: one line saying what it does.
 * Never fail.
 */
DORMANT_EXPORT const char *dormant_option_name(size_t i);
DORMANT_EXPORT const char *dormant_option_type(size_t i);
DORMANT_EXPORT const char *dormant_option_values(size_t i);
DORMANT_EXPORT const char *dormant_option_default(size_t i);
DORMANT_EXPORT const char *dormant_option_env(size_t i);
DORMANT_EXPORT const char *dormant_option_doc(size_t i);

/*
 * Create a manager. opts may be NULL (every option unset: environment
 * variables and defaults apply); it is not kept. The backend is chosen here;
 * with "auto" and no usable CUDA driver the host backend is used.
 * Returns -EINVAL for a bad environment variable (the message names it),
 * -ENODEV when "cuda" is asked for and no CUDA device is usable, -ENOMEM.
 * The caller owns *ret and frees it with dormant_destroy().
 */
DORMANT_EXPORT int dormant_new(const struct dormant_options *opts, struct dormant **ret);

/*
 * Free every allocation (device and host memory) and the manager itself.
 * Accepts NULL. Must not race with any other call on the same manager; a
 * transition still running must have returned first.
 */
DORMANT_EXPORT void dormant_destroy(struct dormant *m);

/*
 * The value option name has in m, whether set, from the environment or the
 * default, as text that dormant_options_set() takes (sizes in bytes,
 * copy_threads as computed; backend as asked for, "auto" too:
 * dormant_backend_name() says which runs), into buf. Returns its length,
 * -EINVAL for an unknown name, -ENOSPC if buf is too small (64 bytes are
 * enough for every option but a path: DORMANT_PATH_MAX is).
 */
DORMANT_EXPORT int dormant_option_value(const struct dormant *m, const char *name, char *buf,
					size_t size);

/* The backend in use: "cuda" or "host". Never fails; the string is static. */
DORMANT_EXPORT const char *dormant_backend_name(const struct dormant *m);

/* The effective host memory mode (never DORMANT_HOST_DEFAULT). */
DORMANT_EXPORT enum dormant_host_mode dormant_host_mode(const struct dormant *m);

/* Number of devices the backend sees (>= 1), or a negative errno. */
DORMANT_EXPORT int dormant_device_count(struct dormant *m);

/*
 * Set the policy of a tag, creating the tag if needed. A tag never set is
 * DORMANT_KEEP. The policy is that of the tag's allocations that follow the
 * tag (all but those made with a policy of their own, dormant_alloc_policy()).
 * Returns -EINVAL for a bad tag or policy, -ENOSPC when the tag table is
 * full, -EBUSY while the tag is not awake (its policy decides how its memory
 * sleeps and wakes, so it may change only while awake).
 */
DORMANT_EXPORT int dormant_set_policy(struct dormant *m, const char *tag,
				      enum dormant_policy policy);

/*
 * Set the directory of DORMANT_DISK copies (the disk_dir option): the next
 * sleep creates its files there. It must exist and be writable; a sleep
 * into a full or read-only directory fails and rolls back, every byte still
 * on the device. Copies made before stay where they are until their wake.
 * Returns -EINVAL (NULL, not absolute, or DORMANT_PATH_MAX bytes or longer).
 */
DORMANT_EXPORT int dormant_set_disk_dir(struct dormant *m, const char *dir);

/*
 * Allocate size bytes of device memory under tag, on the device current for
 * the calling thread (CUDA) or device 0 (host backend). The address stays the
 * same across every sleep and wake until dormant_free(). Memory is aligned to
 * at least 512 bytes and is not initialised.
 * Returns -EINVAL (bad tag, size 0), -ENOSPC (tag table full), -EBUSY (the tag
 * is not awake: asleep memory cannot be handed out), -ENOMEM (device memory),
 * -EIO (other device failure).
 */
DORMANT_EXPORT int dormant_alloc(struct dormant *m, const char *tag, size_t size,
				 void **ret_ptr);

/* As dormant_alloc(), on the given device ordinal (-ENODEV if out of range). */
DORMANT_EXPORT int dormant_alloc_on(struct dormant *m, const char *tag, size_t size,
				    int device, void **ret_ptr);

/*
 * As dormant_alloc_on(), with a policy of the allocation's own: one tag may
 * hold both kept and discarded memory, and a sleep or wake of the tag covers
 * both (DORMANT_KEEP memory is copied and restored, DORMANT_DISCARD memory is
 * released without a copy and zero-filled on wake). policy is DORMANT_KEEP,
 * DORMANT_DISCARD, DORMANT_DISK, or DORMANT_POLICY_TAG (what dormant_alloc() does: the
 * memory follows the tag's policy, also when dormant_set_policy() changes it
 * later; an allocation with a policy of its own keeps it whatever the tag's
 * becomes). Small allocations share slabs only with allocations of the same
 * tag, device and asked-for policy. Returns -EINVAL for another policy, and
 * the errors of dormant_alloc_on().
 */
DORMANT_EXPORT int dormant_alloc_policy(struct dormant *m, const char *tag, int policy,
					size_t size, int device, void **ret_ptr);

/*
 * Free an allocation in any state, asleep too (its host copy is dropped).
 * During a transition of its tag the memory is given back when the
 * transition ends. Returns -EINVAL for a pointer the manager did not hand out.
 */
DORMANT_EXPORT int dormant_free(struct dormant *m, void *ptr);

/*
 * [ptr, ptr + size) of a managed allocation (a dedicated one or a slab's
 * sub-allocation; any alignment, across chunk boundaries) holds nothing that
 * must survive the next sleep: that sleep copies none of it (its host copy
 * holds only the other bytes, so no host memory either) and the wake after
 * it zero-fills it. The PyTorch glue marks the blocks its caching allocator
 * holds free. Marks add up; they last until the next wake (also one that
 * fails, changes nothing, or wakes other tags: the marks of every tag awake
 * then are dropped), a free of the allocation, or a sleep that fails: it
 * drops the marks of every tag awake after it, since training goes on and
 * may refill those bytes (mark again before the retry; the PyTorch glue
 * marks before every sleep). They only
 * matter for DORMANT_KEEP memory. Each run of kept bytes between marks is
 * at least one copy, so many small marks cost copies: mark what is large.
 * Returns -EINVAL for a range not inside one allocation of this manager,
 * -EBUSY while its tag is not awake, -ENOMEM.
 */
DORMANT_EXPORT int dormant_mark_unused(struct dormant *m, void *ptr, size_t size);

/*
 * A DORMANT_REBUILD tag's callback: refill the tag's memory from other
 * memory (bf16 weights from fp32 master params, say). Return 0, or non-zero
 * to fail the wake.
 */
typedef int (*dormant_rebuild_fn)(struct dormant *m, const char *tag, void *userdata);

/*
 * Set the rebuild callback of a tag (creating the tag if needed; fn NULL
 * removes it). It is used while the tag's policy is DORMANT_REBUILD: a sleep
 * releases the tag's memory without a copy (after the KEEP copies of that
 * sleep are done, so that a failed sleep rolls back with it intact), and a
 * wake, after every KEEP chunk of that wake is restored, runs fn once per
 * rebuild tag it wakes, in the order of the tags asked for, with the tag
 * mapped and zero-filled. fn runs on the thread running the wake, without
 * the manager lock, while the tags of the wake are waking: it may call
 * dormant_copy_to_device(), dormant_copy_to_host() (on those tags too) and
 * dormant_stats_get(), or launch kernels on the memory, but not sleep or
 * wake (-EBUSY), nor allocate under a waking tag (-EBUSY). A non-zero
 * return fails the wake with -ECANCELED: every tag of that wake goes back
 * to asleep, the KEEP tags with their host copies intact, and the same wake
 * can be retried (it runs the callbacks again). Which tags a callback needs
 * (the master params) is the caller's business: waking a rebuild tag
 * without them, in an earlier wake or this one, is the caller's choice and
 * the callback then reads whatever they hold. A rebuild tag without a
 * callback wakes zero-filled, like DORMANT_DISCARD. Allocations of the tag
 * with a policy of their own keep it (DORMANT_KEEP ones are restored before
 * the callback runs). Returns -EINVAL for a bad tag, -ENOSPC.
 */
DORMANT_EXPORT int dormant_set_rebuild(struct dormant *m, const char *tag, dormant_rebuild_fn fn,
				       void *userdata);

/* Describes what one tag went through in a transition. */
struct dormant_tag_change {
	char tag[DORMANT_TAG_MAX + 1];
	enum dormant_policy policy;
	enum dormant_state before;
	enum dormant_state after;
	bool changed;
	uint64_t bytes_copied;   /* between device and host */
	uint64_t bytes_released; /* sleep: device bytes given back */
	uint64_t bytes_mapped;   /* wake: device bytes mapped again */
	uint64_t bytes_zeroed;   /* wake: bytes zero-filled (discarded, marked unused) */
	uint64_t bytes_skipped;  /* sleep: kept bytes not copied, marked unused */
	/* sleep, retain mode: kept bytes not copied because the host copy
	 * already holds them (their checksum did not change since the last
	 * wake); they come back with their data, unlike bytes_skipped */
	uint64_t bytes_unchanged;
	uint64_t chunks_verified;  /* wake: chunks whose checksum matched */
	uint64_t chunk_mismatches; /* wake: chunks whose checksum did not */
};

/* Where a transition's time went, in seconds. The wait_ parts are time the
 * transition's own thread spent waiting for that work; the others are time
 * spent in that kind of call, summed over every thread that made them (a
 * wake maps chunks on a thread of its own while earlier chunks are copied),
 * so the parts may add up to more than the duration. */
struct dormant_transition_times {
	double sync_s;          /* sleep: waiting for the device's work to finish */
	double host_prep_s;     /* sleep: allocating and faulting in host copies */
	double host_pin_s;      /* sleep: registering (pinning) host copies */
	double host_wait_s;     /* sleep: copies waiting for a host copy to be ready */
	double copy_s;          /* the copy phase: first copy queued to the last done */
	double release_s;       /* unmapping and releasing device memory */
	double map_s;           /* wake: creating and mapping device memory */
	double map_wait_s;      /* wake: copies and zero-fill waiting for a mapping */
	double zero_wait_s;     /* wake: waiting for the zero-fill after the copies */
	double comms_s;         /* the DORMANT_HOOK_AFTER_COPIES (sleep) or
				 * DORMANT_HOOK_BEFORE_REBUILD (wake) hooks: where
				 * communicators are suspended and resumed */
	double setup_s;         /* a device's one-time setup, on the first
				 * transition that uses it unless the warm-up
				 * did it (dormant_warm_up()): streams, events,
				 * loading the checksum kernel, the staging ring */
	double checksum_s;      /* sleep: hashing the kept chunks before the
				 * copies; wake: waiting for the last hashes
				 * after the copies and comparing them */
	double rebuild_s;       /* wake: the rebuild callbacks (dormant_set_rebuild()) */
	double warmup_wait_s;   /* waiting for a running warm-up to stop */
};

/* How a wake copied kept chunks to the device (option wake_copy): by the
 * copy engines (cuMemcpy) or by the copy kernel on the SMs, which runs at
 * nearly full rate while the driver scrubs memory another process freed on
 * the copy engines (docs/design.md, "A wake"). All zero for a sleep and for
 * a wake that copied nothing. */
struct dormant_wake_copy {
	char method[16];       /* "engine" or "kernel": what carried the copies
				* after any probe; "mixed": auto switched during
				* the wake, or devices differed; "" nothing copied */
	uint64_t bytes_engine; /* copied by the copy engines (probes included) */
	uint64_t bytes_kernel; /* copied by the copy kernel (probes included) */
	unsigned probes;       /* wake_copy=auto: rate measurements made */
	double engine_gbps;    /* auto: the copy engines' last measured rate */
	double kernel_gbps;    /* auto: the copy kernel's last measured rate */
};

/* Residue mode (see "Residue" below): the option, and where the process's
 * device state outside every tag is. */
enum dormant_residue_mode {
	DORMANT_RESIDUE_DEFAULT = 0, /* dormant_sleep_residue(): the manager's */
	DORMANT_RESIDUE_KEEP,
	DORMANT_RESIDUE_CHECKPOINT,
};

enum dormant_residue_state {
	DORMANT_RESIDUE_RESIDENT = 0, /* on the devices (awake, or not checkpointed) */
	DORMANT_RESIDUE_CHECKPOINTED, /* in host memory: the devices hold nothing */
	DORMANT_RESIDUE_UNAVAILABLE,  /* the driver cannot: see reason */
	DORMANT_RESIDUE_STUCK,        /* a restore failed for good: see reason */
};

/* What one sleep or wake did with the residue: a sleep that left every tag
 * asleep in residue mode checkpoint checkpoints it, a wake restores it first
 * (or a wake's room check refuses the restore: op "restore", -ENOMEM). */
struct dormant_residue_step {
	enum dormant_residue_mode mode;   /* the manager's, or the sleep's own */
	enum dormant_residue_state state; /* after the call */
	char op[16];                      /* "checkpoint", "restore" or "" (none) */
	int result;                       /* 0 or a negative errno */
	double seconds;
	char error[DORMANT_ERROR_MAX];    /* empty on success */
};

/* The outcome of dormant_sleep() or dormant_wake(), filled in on success and
 * on failure. */
struct dormant_report {
	int result;                 /* what the call returned */
	char error[DORMANT_ERROR_MAX]; /* empty on success */
	double duration_s;          /* wall time of the whole call */
	double guard_wait_s;        /* sleep: time spent waiting for the guard */
	uint64_t bytes_copied;
	uint64_t bytes_released;
	uint64_t bytes_mapped;
	uint64_t bytes_zeroed;
	uint64_t bytes_skipped;
	double copy_gbps;           /* bytes_copied / copy time, 1e9 bytes/s */
	size_t tag_count;           /* entries used in tags[] */
	struct dormant_tag_change tags[DORMANT_TAGS_MAX];
	uint64_t bytes_unchanged;   /* see struct dormant_tag_change */
	uint64_t chunks_verified;
	uint64_t chunk_mismatches;
	struct dormant_transition_times times;
	struct dormant_wake_copy wake_copy;
	struct dormant_residue_step residue;
	/* every tag of the manager once the call ended, not only the ones
	 * named: how many are awake and how many asleep */
	size_t tags_awake, tags_asleep;
};

/*
 * Put tags to sleep. tags is a NULL-terminated array of tag names; NULL means
 * every tag. ret may be NULL. Tags already asleep are reported unchanged and
 * make no error. Waits for running training steps to leave the guard (see
 * dormant_step_enter()), runs DORMANT_HOOK_BEFORE_SLEEP hooks, synchronizes
 * the devices, releases DISCARD memory without a copy and copies KEEP memory
 * to host memory, releasing each chunk as soon as its own copy is done.
 *
 * Errors: -EBUSY (another transition runs, or the guard timed out),
 * -ENOENT (a named tag does not exist), -EINVAL (bad tag name), -ECANCELED
 * (a hook refused), -ENOMEM (host memory), -EIO (device failure).
 * On failure every tag named is rolled back to awake with its KEEP bytes
 * intact (DISCARD bytes are zero after a rollback that had released them),
 * except when a DORMANT_HOOK_AFTER_COPIES hook fails (-ECANCELED): the copies
 * are complete by then, and the tags stay asleep for a wake to complete.
 */
DORMANT_EXPORT int dormant_sleep(struct dormant *m, const char *const *tags,
				 struct dormant_report *ret);

/*
 * Wake tags: map fresh device memory at the same addresses, restore KEEP tags,
 * zero-fill DISCARD and REBUILD tags (and ranges marked unused), synchronize,
 * run DORMANT_HOOK_BEFORE_REBUILD hooks and the REBUILD tags' callbacks,
 * then run DORMANT_HOOK_AFTER_WAKE hooks
 * and let waiting training steps in. Same tags/ret convention as
 * dormant_sleep(); tags already awake are reported unchanged.
 *
 * Errors: -EBUSY, -ENOENT, -EINVAL as for sleep; -ENOMEM when device memory
 * cannot be had (typically another process still holds it): everything this
 * call mapped is given back and the tags stay asleep with their host copies
 * intact, so the same call can be retried; -EIO for other device failures,
 * and when a restored chunk's checksum differs from its sleep's
 * (dormant_set_verify()), with the same guarantee; -ECANCELED when a before-wake or before-rebuild hook or a rebuild
 * callback (dormant_set_rebuild()) refused, with the same guarantee. Every
 * wake (also one that fails or changes nothing) drops the marks of every
 * tag awake after it (dormant_mark_unused()).
 */
DORMANT_EXPORT int dormant_wake(struct dormant *m, const char *const *tags,
				struct dormant_report *ret);

/* The message of the calling thread's last failed dormant_ call, or "" if
 * none. The string belongs to the library and stays valid until the thread's
 * next failing call. */
DORMANT_EXPORT const char *dormant_last_error(void);

/* Constant strings: "keep"/"discard"/"rebuild"/"disk",
 * "awake"/"sleeping"/"asleep"/"waking", "retain"/"release". NULL for values
 * out of range. */
DORMANT_EXPORT const char *dormant_policy_name(enum dormant_policy policy);
DORMANT_EXPORT const char *dormant_state_name(enum dormant_state state);
DORMANT_EXPORT const char *dormant_host_mode_name(enum dormant_host_mode mode);

/* Parse "keep"/"discard"/"rebuild"/"disk" into *ret. -EINVAL otherwise. */
DORMANT_EXPORT int dormant_policy_from_name(const char *name, enum dormant_policy *ret);

/* The library's version, "MAJOR.MINOR.PATCH": the Meson project version it
 * was built from (the same string as dormant.__version__, dormantd --version
 * and the wheel). A constant string; never fails. */
DORMANT_EXPORT const char *dormant_version(void);

/* ---- Statistics ---------------------------------------------------------- */

struct dormant_tag_stats {
	char tag[DORMANT_TAG_MAX + 1];
	enum dormant_policy policy;
	enum dormant_state state;
	uint64_t allocations;
	uint64_t bytes;          /* bytes asked for by dormant_alloc() */
	uint64_t reserved_bytes; /* virtual bytes reserved (granularity-rounded) */
	uint64_t device_bytes;   /* physical device bytes mapped now */
	uint64_t host_bytes;     /* host bytes held for this tag now */
	uint64_t sleeps;         /* transitions that put it to sleep */
	uint64_t wakes;          /* transitions that woke it */
	uint64_t disk_bytes;     /* disk bytes held for this tag now (DORMANT_DISK) */
};

struct dormant_transition_stats {
	bool valid;           /* false until the first transition of this kind */
	int result;           /* 0 or negative errno */
	double started_unix_s;
	double duration_s;
	uint64_t bytes_copied;
	uint64_t bytes_released;
	uint64_t bytes_mapped;
	uint64_t bytes_zeroed;
	uint64_t bytes_skipped;  /* sleep: not copied, marked unused */
	double copy_gbps;
	char error[DORMANT_ERROR_MAX];
	uint64_t bytes_unchanged;  /* sleep: see struct dormant_tag_change */
	uint64_t chunks_verified;  /* wake */
	uint64_t chunk_mismatches; /* wake */
	struct dormant_transition_times times;
	struct dormant_wake_copy wake_copy; /* wake */
};

/* A Prometheus-style histogram: counts[i] is the number of observations
 * <= bounds_s[i] and > bounds_s[i-1]; counts[DORMANT_HISTOGRAM_BUCKETS] holds
 * the ones above the last bound (not cumulative). */
struct dormant_histogram {
	double bounds_s[DORMANT_HISTOGRAM_BUCKETS];
	uint64_t counts[DORMANT_HISTOGRAM_BUCKETS + 1];
	uint64_t count;
	double sum_s;
};

/* Where the background warm-up (dormant_warm_up()) stands. */
enum dormant_warmup_state {
	DORMANT_WARMUP_OFF = 0, /* option warmup=off: never runs by itself */
	DORMANT_WARMUP_IDLE,    /* nothing to prepare (no allocation since the last run) */
	DORMANT_WARMUP_PENDING, /* allocations came: runs once they settle */
	DORMANT_WARMUP_RUNNING,
};

struct dormant_warmup_stats {
	enum dormant_warmup_state state;
	uint64_t runs;           /* finished, stopped or failed */
	uint64_t failures;       /* runs that failed (a sleep then does the work) */
	uint64_t cancelled;      /* runs a sleep or wake stopped early */
	uint64_t device_setups;  /* devices set up so far, by a warm-up or a transition */
	uint64_t host_bytes;     /* host copies it prepared, in total (retain and
				  * reclaimable modes) */
	double seconds_total;    /* time its runs took */
	int last_result;         /* of the last run: 0 or a negative errno */
	char last_error[DORMANT_ERROR_MAX];
};

/* "off", "idle", "pending", "running"; "unknown" otherwise. */
DORMANT_EXPORT const char *dormant_warmup_state_name(enum dormant_warmup_state state);

struct dormant_device_stats {
	int ordinal;
	uint64_t free_bytes;    /* as the device reports it now */
	uint64_t total_bytes;
	uint64_t managed_bytes; /* physical bytes of this manager mapped now */
};

struct dormant_stats {
	char backend[16];
	enum dormant_host_mode host_mode;
	bool healthy;                   /* false after a rollback that failed */
	char health_error[DORMANT_ERROR_MAX];
	bool transition_running;
	unsigned steps_running;         /* training steps inside the guard */
	size_t tag_count;
	struct dormant_tag_stats tags[DORMANT_TAGS_MAX];
	size_t device_count;
	struct dormant_device_stats devices[DORMANT_DEVICES_MAX];
	/* totals over all tags */
	uint64_t allocations;
	uint64_t bytes;
	uint64_t device_bytes;
	uint64_t host_bytes;            /* tag copies */
	uint64_t staging_bytes;         /* pinned staging memory held */
	/* counters since dormant_new() */
	uint64_t sleeps_ok, sleeps_failed;
	uint64_t wakes_ok, wakes_failed;
	uint64_t noops;                 /* transitions that changed nothing */
	uint64_t busy_rejections;       /* -EBUSY answers */
	uint64_t sleeps_noop, wakes_noop; /* noops, by kind */
	uint64_t sleeps_busy, wakes_busy; /* busy_rejections, by kind */
	uint64_t bytes_to_host_total;
	uint64_t bytes_to_device_total;
	uint64_t bytes_released_total;
	uint64_t bytes_zeroed_total;
	uint64_t bytes_skipped_total;   /* marked unused, so not copied */
	struct dormant_transition_stats last_sleep;
	struct dormant_transition_stats last_wake;
	struct dormant_histogram sleep_seconds;
	struct dormant_histogram wake_seconds;
	bool verify;                    /* wakes verify checksums (dormant_set_verify()) */
	uint64_t bytes_unchanged_total; /* unchanged, so not copied (retain mode) */
	uint64_t chunks_verified_total;
	uint64_t chunk_mismatches_total;
	/* struct dormant_transition_times summed over every sleep and every
	 * wake that ran (changed something or failed: the transitions the
	 * duration histograms observe), each part on its own */
	struct dormant_transition_times sleep_times_total;
	struct dormant_transition_times wake_times_total;
	uint64_t disk_bytes;            /* tag copies on disk (DORMANT_DISK) */
	/* wakes that copied, by struct dormant_wake_copy's method, and the
	 * bytes to the device by what moved them (since dormant_new()) */
	uint64_t wakes_copy_engine, wakes_copy_kernel, wakes_copy_mixed;
	uint64_t bytes_to_device_engine_total, bytes_to_device_kernel_total;
	struct dormant_warmup_stats warmup;
};

/*
 * Take a consistent snapshot of the manager's statistics into *ret (caller's
 * memory; the struct is large, so do not put many on a small stack). Device
 * free/total bytes are read from the device. Never blocks behind a
 * transition. Returns -EINVAL for NULL arguments.
 */
DORMANT_EXPORT int dormant_stats_get(struct dormant *m, struct dormant_stats *ret);

/* ---- Checksums ----------------------------------------------------------- */

/*
 * Verification after wake (docs/design.md, "Checksums"): with it on (the
 * default; $DORMANT_VERIFY=0 turns it off at dormant_new()), a sleep hashes
 * what it copies of each kept chunk on the device (128 bits), and a wake
 * hashes the restored bytes again and compares; a mismatch fails the wake
 * with -EIO, naming the tag, allocation and chunk, counts in
 * chunk_mismatches, and leaves the tags asleep with their host copies, so
 * that a retry can succeed. To accept a host copy as it is, turn
 * verification off for the retry. Takes effect at the next sleep or wake (a
 * wake verifies only chunks hashed by their sleep). -EINVAL for NULL m.
 *
 * In retain mode sleeps hash whether verification is on or not: a chunk whose
 * hash and layout did not change since the wake that restored it is released
 * without a copy (bytes_unchanged), its retained host copy being exact.
 */
DORMANT_EXPORT int dormant_set_verify(struct dormant *m, bool on);

/*
 * The chunk checksum (docs/design.md, "Checksums") of size bytes at host
 * memory p, the first of them at byte offset of its chunk, into out[0] and
 * out[1]: what the device kernel computes, for callers and tests that check
 * it. Never fails (-EINVAL for NULL p with size > 0 or NULL out).
 */
DORMANT_EXPORT int dormant_checksum(const void *p, size_t size, uint64_t offset, uint64_t out[2]);

/* ---- Warm-up ------------------------------------------------------------- */

/*
 * Prepare now, on the calling thread, what the next sleep would otherwise set
 * up first (docs/design.md, "Warm-up"): on every device with managed memory,
 * the copy streams and events, the checksum kernel (loaded and compiled by
 * the driver) and, where copies go unpinned, the staging ring; in retain mode
 * (with option warmup=auto) also the host copies of the kept allocations
 * awake now, allocated, faulted in and pinned: the host memory retain mode
 * holds from the first sleep on, held from now (it counts in host_bytes); in
 * reclaimable mode the same copies faulted in and handed to the kernel
 * (MADV_FREE), unpinned and not counted, as a wake leaves them.
 * What the manager also does in the background once allocations settle
 * (option warmup, warmup_settle_ms); this call waits for a background run
 * first, and works with warmup=off too.
 *
 * Never needed for correctness: a sleep uses what is prepared and does the
 * rest itself. A sleep or wake that starts meanwhile stops the warm-up at its
 * next chunk and waits for it (the report's times.warmup_wait_s); what it
 * prepared by then stays prepared. Thread-safe. Returns 0, -EBUSY (a
 * transition runs; nothing done), -ECANCELED (a transition stopped it), or
 * the error of the step that failed (-ENOMEM, -EIO: the rest stays for the
 * sleep, which then does it itself); -EINVAL for NULL m.
 */
DORMANT_EXPORT int dormant_warm_up(struct dormant *m);

/* ---- Residue -------------------------------------------------------------- */

/*
 * What a process holds on its devices outside every tag: the CUDA context,
 * the libraries' workspaces (cuBLAS), communicators (NCCL) and PyTorch's
 * cached blocks, 0.6 to 3 GiB a GPU. With residue mode checkpoint, a sleep
 * that leaves every tag asleep ends with the driver's process checkpoint
 * (cuCheckpointProcessLock and ...Checkpoint, driven by a helper process
 * libdormant starts: dormant-residue-helper), which takes all of it to host
 * memory and gives the devices back whole; the next wake restores it
 * (...Restore and ...Unlock) before its own maps and copies. Virtual address
 * reservations, and so every tag's addresses, survive it.
 *
 * While the process is checkpointed, no thread of it may call CUDA: such a
 * call waits for the restore. The manager makes none (stats answer from
 * memory; allocating answers -EBUSY; frees wait for the restore to give
 * their address ranges back). docs/design.md, "Residue", has the rest.
 *
 * Failures lose nothing. A checkpoint that fails leaves the sleep done and
 * the residue resident (stats say why); the next sleep tries again. A
 * restore that fails fails the wake (tags asleep, host copies intact) with
 * the driver's message; the next wake tries again. A wake checks first that
 * the devices have room for the residue and the memory it maps (-ENOMEM
 * otherwise, before the restore). After a restore that ran out of memory the
 * driver refuses every later one: the state is then "stuck" and only ending
 * the process frees its device memory. Where the driver has no process
 * checkpoint, or refuses this process, the state is "unavailable" with the
 * reason, and sleeps keep the residue. (The mode and state enums, and what
 * one transition did with the residue, struct dormant_residue_step, are
 * above, with struct dormant_report.)
 */
struct dormant_residue_stats {
	enum dormant_residue_mode mode;   /* the manager's (never DEFAULT) */
	enum dormant_residue_state state;
	char reason[DORMANT_ERROR_MAX];   /* unavailable or stuck: why */
	int helper_pid;                   /* the helper process, 0 if none runs */
	uint64_t helper_starts;           /* helpers started (one dies: the next request starts one) */
	uint64_t checkpoints, checkpoint_failures;
	uint64_t restores, restore_failures;
	double checkpoint_seconds_total, restore_seconds_total;
	/* device bytes the last checkpoint gave back, over every device */
	uint64_t residue_bytes;
	/* the last checkpoint or restore (or a wake's room check that refused
	 * one): "checkpoint", "restore" or ""; last_seq counts them, so that a
	 * caller sees whether a transition made one */
	char last_op[16];
	uint64_t last_seq;
	int last_result;                  /* 0 or a negative errno */
	double last_seconds;
	char last_error[DORMANT_ERROR_MAX];
	/* calls that reached a device while checkpointed: 0, or a bug */
	uint64_t calls_while_checkpointed;
};

/* Fill *ret (caller's memory). Never touches a device, never blocks behind a
 * transition. -EINVAL for NULL arguments. */
DORMANT_EXPORT int dormant_residue_stats_get(struct dormant *m, struct dormant_residue_stats *ret);

/*
 * As dormant_sleep(), with the residue handled as mode says for this sleep
 * only (DORMANT_RESIDUE_DEFAULT: the manager's option). -EINVAL for another
 * mode. The report's residue part says what its checkpoint did, as
 * dormant_residue_stats_get()'s last_op and last_result do.
 */
DORMANT_EXPORT int dormant_sleep_residue(struct dormant *m, const char *const *tags,
					 enum dormant_residue_mode mode,
					 struct dormant_report *ret);

/* "keep"/"checkpoint" ("default" for DEFAULT), "resident"/"checkpointed"/
 * "unavailable"/"stuck"; NULL out of range. Parse with
 * dormant_residue_mode_from_name(): -EINVAL for other names. */
DORMANT_EXPORT const char *dormant_residue_mode_name(enum dormant_residue_mode mode);
DORMANT_EXPORT const char *dormant_residue_state_name(enum dormant_residue_state state);
DORMANT_EXPORT int dormant_residue_mode_from_name(const char *name,
						  enum dormant_residue_mode *ret);

/* ---- Trainer guard ------------------------------------------------------- */

/*
 * Enter a training step. While the manager is not fully awake (or a sleep is
 * waiting for steps to leave) this waits for the next wake, up to timeout_ms
 * (negative: forever, 0: do not wait). Returns 0 inside the step, -ETIMEDOUT.
 * Every successful enter must be paired with dormant_step_leave(). Do not
 * call from a hook (the transition would wait for itself).
 */
DORMANT_EXPORT int dormant_step_enter(struct dormant *m, int timeout_ms);

/* Leave a training step. -EINVAL if no step is inside. */
DORMANT_EXPORT int dormant_step_leave(struct dormant *m);

/* ---- Hooks --------------------------------------------------------------- */

enum dormant_hook_point {
	DORMANT_HOOK_BEFORE_SLEEP = 0, /* a non-zero return cancels the sleep */
	DORMANT_HOOK_AFTER_SLEEP,
	DORMANT_HOOK_BEFORE_WAKE,      /* a non-zero return cancels the wake */
	DORMANT_HOOK_AFTER_WAKE,
	/* Sleep: the copies and releases are done, the tags not yet asleep.
	 * A non-zero return fails the sleep (-ECANCELED), the tags left asleep
	 * (their bytes are safe on the host; a wake completes them). */
	DORMANT_HOOK_AFTER_COPIES,
	/* Wake: the memory is mapped and restored, no rebuild callback has run.
	 * A non-zero return fails the wake (-ECANCELED) as a rebuild that fails
	 * does: the tags stay asleep, host copies intact, retry works. */
	DORMANT_HOOK_BEFORE_REBUILD,
};

/* A hook runs on the thread that runs the transition (possibly an HTTP server
 * thread), in the order hooks were added. It must not start a transition or
 * enter the guard. Return 0, or non-zero to fail (BEFORE_ points and
 * AFTER_COPIES; see above). AFTER_COPIES and BEFORE_REBUILD are where
 * collective resources (NCCL communicators) are suspended and resumed: after
 * every step of a sleep that can fail alone, before anything of a wake that
 * needs them. Their time is the report's times.comms_s. */
typedef int (*dormant_hook_fn)(struct dormant *m, enum dormant_hook_point point,
			       void *userdata);

/* Add a hook; returns a positive id for dormant_hook_remove(), -EINVAL,
 * -ENOSPC (at most 32 hooks). */
DORMANT_EXPORT int dormant_hook_add(struct dormant *m, enum dormant_hook_point point,
				    dormant_hook_fn fn, void *userdata);

/* Remove a hook by id; -ENOENT if unknown. Must not be called from a hook. */
DORMANT_EXPORT int dormant_hook_remove(struct dormant *m, int id);

/* From a hook or rebuild callback about to return non-zero, on its own
 * thread: message (copied, truncated to DORMANT_ERROR_MAX) becomes the reason
 * in the failed transition's error (dormant_last_error(), the report's error,
 * the HTTP error body). Returns 0; -EINVAL for a NULL message. */
DORMANT_EXPORT int dormant_hook_set_error(const char *message);

/* ---- PyTorch pluggable allocator ----------------------------------------- */

/*
 * Entry points for torch.cuda.memory.CUDAPluggableAllocator. They allocate on
 * the manager set with dormant_torch_set_manager(), under the calling
 * thread's tag (dormant_set_thread_tag(); "default" if none) and with the
 * calling thread's policy (dormant_set_thread_policy()). On failure the
 * malloc returns NULL (PyTorch raises out-of-memory) and the reason is in
 * dormant_last_error().
 */
DORMANT_EXPORT void *dormant_torch_malloc(size_t size, int device, void *stream);
DORMANT_EXPORT void dormant_torch_free(void *ptr, size_t size, int device, void *stream);

/* Route dormant_torch_malloc() to m (NULL to detach). Not owned. */
DORMANT_EXPORT int dormant_torch_set_manager(struct dormant *m);

/* Set the calling thread's tag for dormant_torch_malloc(); NULL resets it to
 * "default". Returns -EINVAL for a bad tag name. */
DORMANT_EXPORT int dormant_set_thread_tag(const char *tag);

/* Copy the calling thread's tag into buf (size >= DORMANT_TAG_MAX + 1). */
DORMANT_EXPORT int dormant_get_thread_tag(char *buf, size_t size);

/* Set the calling thread's policy for dormant_torch_malloc() allocations (see
 * dormant_alloc_policy()): DORMANT_KEEP, DORMANT_DISCARD, DORMANT_DISK or DORMANT_POLICY_TAG
 * (the default: follow the tag). -EINVAL otherwise, the policy unchanged. */
DORMANT_EXPORT int dormant_set_thread_policy(int policy);
/* The calling thread's policy for dormant_torch_malloc(). Never fails. */
DORMANT_EXPORT int dormant_get_thread_policy(void);

/* ---- Whole-process capture (preload/dormant-preload.h) -------------------- */

/*
 * The manager set with dormant_torch_set_manager(), or NULL. Not owned by the
 * caller. Under whole-process capture it is the shim's process manager, which
 * the Python package attaches to instead of creating a second one.
 */
DORMANT_EXPORT struct dormant *dormant_torch_get_manager(void);

/*
 * Whether ptr is the start of an allocation of m, in any state (asleep too).
 * False for NULL arguments. Never fails, never sets dormant_last_error(). The
 * capture shim asks this before freeing, to send other pointers to the CUDA
 * runtime without waiting for the device.
 */
DORMANT_EXPORT bool dormant_owns(struct dormant *m, const void *ptr);

/* ---- Copies -------------------------------------------------------------- */

/*
 * Synchronous copies between host memory and managed device memory, for
 * callers that do not link a device runtime (the demo fills and verifies its
 * weights this way). The device range must lie inside one awake allocation.
 * Returns -EINVAL (range not managed), -EBUSY (its tag is not awake), -EIO.
 */
DORMANT_EXPORT int dormant_copy_to_host(struct dormant *m, void *dst, const void *device_src,
					size_t size);
DORMANT_EXPORT int dormant_copy_to_device(struct dormant *m, void *device_dst, const void *src,
					  size_t size);

/* ---- Host copies --------------------------------------------------------- */

/*
 * Where the host copy of [ptr, ptr + size), a range inside one DORMANT_KEEP
 * allocation, lives now: for a tag asleep, what its sleep copied; for an
 * awake tag, the copy that retain mode kept from the last wake (it holds
 * what that wake restored, not what the device holds since). *ret_host then
 * points at size bytes of host memory holding the range's bytes, owned by
 * the manager: read it, do not write it, and do not use it after the tag's
 * next wake or sleep, a change of host mode or a free of the allocation
 * (in release mode a wake gives the copy back). The copy holds only live
 * bytes, packed (dormant_mark_unused()): a range that crosses bytes it left
 * out, or two chunks (two host buffers), is not in one piece.
 * Returns -EINVAL (NULL argument, size 0, range not inside one allocation of
 * m), -ENOENT (no host copy holds the range: the memory is not kept, its tag
 * is awake without a retained copy, or is sleeping or waking), -ERANGE (the
 * copy holds the range, not in one piece: dormant_host_backup_read() copies
 * it). Thread-safe; holds the manager lock for the lookup only.
 */
DORMANT_EXPORT int dormant_host_backup(struct dormant *m, const void *ptr, size_t size,
				       void **ret_host);

/*
 * Copy the host copy of [ptr, ptr + size) (as dormant_host_backup() finds
 * it) into dst, size bytes of the caller's host memory. Bytes the copy left
 * out (marked unused, a slab's free space) read as zero, as the next wake
 * gives them. The same errors as dormant_host_backup() but -ERANGE; dst is
 * untouched on failure. Holds the manager lock while it copies: a transition
 * waits for it.
 */
DORMANT_EXPORT int dormant_host_backup_read(struct dormant *m, const void *ptr, size_t size,
					    void *dst);

/*
 * Switch the host mode (enum dormant_host_mode) of a running manager:
 * DORMANT_HOST_RETAIN, DORMANT_HOST_RELEASE or DORMANT_HOST_RECLAIMABLE
 * (treated as release until its next wake). Takes effect at the next
 * sleep or wake: switched to release, host copies retain mode kept are
 * reused by the next sleep and given back by the wake after it; switched to
 * retain, the next wake keeps its copies. dormant_host_mode() and stats say
 * the new mode; dormant_option_value("host_mode") keeps the one m was
 * created with. Waits for the unpins the last reclaimable-mode wake left to
 * the worker threads. Returns -EINVAL (another mode), -EBUSY (a transition
 * runs).
 */
DORMANT_EXPORT int dormant_set_host_mode(struct dormant *m, enum dormant_host_mode mode);

/* ---- Testing and debugging ----------------------------------------------- */

enum dormant_fault_op {
	DORMANT_FAULT_CREATE = 0, /* physical memory creation (cuMemCreate) */
	DORMANT_FAULT_MAP,        /* mapping at an address (cuMemMap) */
	DORMANT_FAULT_COPY,       /* device<->host copy (cuMemcpy*Async) */
	DORMANT_FAULT_HOST_ALLOC, /* host buffer allocation or pinning */
	DORMANT_FAULT_DISK,       /* disk copy creation, write or read */
	/* residue mode checkpoint: the helper's checkpoint of the process
	 * (a sleep's last step) and its restore (a wake's first); a restore
	 * failed with -ENOMEM leaves the process stuck, as the driver does */
	DORMANT_FAULT_CHECKPOINT,
	DORMANT_FAULT_RESTORE,
	DORMANT_FAULT_OPS,
};

/*
 * Make the nth next call (1 = the very next) of op fail with error (a negative
 * errno, e.g. -ENOMEM or -EIO), for either backend. nth 0 disarms op. If
 * repeat is true, every call from the nth on fails until disarmed. Meant for
 * tests and for rehearsing failures; -EINVAL for bad arguments.
 */
DORMANT_EXPORT int dormant_debug_inject_fault(struct dormant *m, enum dormant_fault_op op,
					      unsigned nth, int error, bool repeat);

/*
 * As dormant_debug_inject_fault(), counting and failing only the calls of op
 * made for device (create, map, copy: a host allocation belongs to no device),
 * so that a test fails one device of several whatever order they run in.
 * Returns -EINVAL for a bad device or op. Arming either kind replaces the
 * other for op; nth 0 disarms.
 */
DORMANT_EXPORT int dormant_debug_inject_device_fault(struct dormant *m, int device,
						     enum dormant_fault_op op, unsigned nth,
						     int error, bool repeat);

/* How many calls of op the backend has seen (successful or failed). */
DORMANT_EXPORT uint64_t dormant_debug_op_count(struct dormant *m, enum dormant_fault_op op);

/*
 * Take bytes of device memory outside the manager on device, as another
 * process (a rollout engine) would; bytes 0 gives all of it back. Lets tests
 * and rehearsals make a wake fail with -ENOMEM. Returns -ENOMEM if the device
 * does not have that much free.
 */
DORMANT_EXPORT int dormant_debug_occupy(struct dormant *m, int device, size_t bytes);

/*
 * Queue a write of size bytes from src into managed device memory on the
 * device's default stream, as a kernel that the trainer launched and that has
 * not finished would write it: it lands only when the device is next
 * synchronized, so a sleep that copies without synchronizing first copies
 * stale data. Only the host backend with DORMANT_HOST_DEFER_STREAMS=1 (its
 * streams then run their work when waited for, not when issued) supports it;
 * -ENOTSUP elsewhere, -EINVAL if the range is not inside one allocation,
 * -EBUSY if its tag is not awake.
 */
DORMANT_EXPORT int dormant_debug_defer_write(struct dormant *m, void *device_dst, const void *src,
					     size_t size);

/*
 * The checksum of [device_ptr, device_ptr + size) of one awake allocation as
 * dormant_checksum() defines it, computed by the backend (on the GPU with
 * CUDA: the kernel that verification uses), into out[0..1]. -EINVAL (range
 * not managed), -EBUSY (tag not awake), -ENOTSUP (the kernel cannot load),
 * -EIO.
 */
DORMANT_EXPORT int dormant_debug_checksum(struct dormant *m, const void *device_ptr, size_t size,
					  uint64_t offset, uint64_t out[2]);

/*
 * Flip bits (xor with mask, non-zero) of the host copy's byte that holds the
 * byte at device address device_ptr, of a tag asleep: a corrupted host copy,
 * for tests of verification (dormant_set_verify()); for DORMANT_DISK memory
 * the byte of its disk copy (a file corrupted while asleep). The same call again
 * restores the byte. -EINVAL (not managed, mask 0), -EBUSY (its tag is not
 * asleep), -ENOENT (no host copy holds that byte: not kept, marked unused).
 */
DORMANT_EXPORT int dormant_debug_corrupt_host(struct dormant *m, const void *device_ptr,
					      unsigned char mask);

#ifdef __cplusplus
}
#endif

#endif /* DORMANT_H */
