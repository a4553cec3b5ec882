/* SPDX-License-Identifier: MIT */
/*
 * libdormant-preload.so: whole-process capture (see dormant-preload.h and
 * docs/capture.md). Loaded with LD_PRELOAD ahead of the CUDA runtime, its
 * cudaMalloc/cudaFree win symbol resolution for every library that calls the
 * runtime dynamically (PyTorch does). The runtime's own functions are found
 * with dlsym(RTLD_NEXT), or in an already loaded libcudart when the runtime
 * was opened RTLD_LOCAL. No CUDA header is needed: the few types and codes
 * used are declared below.
 *
 * States: UNSTARTED until the first allocation call, then OFF ($DORMANT_PRELOAD
 * is not "1": pure pass-through), ACTIVE (the manager serves cudaMalloc),
 * REFUSED (capture could not start: cudaMalloc fails, so that nothing is half
 * captured) or FORKED (a fork() child of a started process: pass-through).
 * The state and the manager are set under start_lock, which fork() takes too,
 * so a child never sees a manager half made.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "dormant-preload.h"
#include "dormant-server.h"
#include "preload-private.h"

/* ---- the CUDA runtime API, as much as the shim needs --------------------- */

typedef int cudaError_t;
typedef void *cudaStream_t;
typedef void *cudaMemPool_t;

enum {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
	cudaErrorInitializationError = 3,
	cudaErrorInvalidDevice = 101,
	cudaErrorUnknown = 999,
};

DORMANT_EXPORT cudaError_t cudaMalloc(void **dev_ptr, size_t size);
DORMANT_EXPORT cudaError_t cudaFree(void *dev_ptr);
DORMANT_EXPORT cudaError_t cudaMallocAsync(void **dev_ptr, size_t size, cudaStream_t stream);
DORMANT_EXPORT cudaError_t cudaMallocFromPoolAsync(void **dev_ptr, size_t size,
						   cudaMemPool_t pool, cudaStream_t stream);
DORMANT_EXPORT cudaError_t cudaFreeAsync(void *dev_ptr, cudaStream_t stream);
DORMANT_EXPORT cudaError_t cudaMallocManaged(void **dev_ptr, size_t size, unsigned flags);

enum real_fn {
	REAL_MALLOC,
	REAL_FREE,
	REAL_MALLOC_ASYNC,
	REAL_MALLOC_FROM_POOL_ASYNC,
	REAL_FREE_ASYNC,
	REAL_MALLOC_MANAGED,
	REAL_GET_DEVICE,
	REAL_DEVICE_SYNCHRONIZE,
	REAL_STREAM_SYNCHRONIZE,
	REAL_COUNT,
};

static const char *const real_names[REAL_COUNT] = {
	[REAL_MALLOC] = "cudaMalloc",
	[REAL_FREE] = "cudaFree",
	[REAL_MALLOC_ASYNC] = "cudaMallocAsync",
	[REAL_MALLOC_FROM_POOL_ASYNC] = "cudaMallocFromPoolAsync",
	[REAL_FREE_ASYNC] = "cudaFreeAsync",
	[REAL_MALLOC_MANAGED] = "cudaMallocManaged",
	[REAL_GET_DEVICE] = "cudaGetDevice",
	[REAL_DEVICE_SYNCHRONIZE] = "cudaDeviceSynchronize",
	[REAL_STREAM_SYNCHRONIZE] = "cudaStreamSynchronize",
};

static _Atomic(void *) real_cache[REAL_COUNT];

/* ---- state --------------------------------------------------------------- */

enum state {
	STATE_UNSTARTED = 0,
	STATE_OFF,
	STATE_ACTIVE,
	STATE_REFUSED,
	STATE_FORKED,
};

static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int state;
/* Written under start_lock before state becomes ACTIVE (release), read after
 * an acquire load of state. */
static struct dormant *process_manager;
static struct dormant_server *process_server;
static char reason[DORMANT_ERROR_MAX];
static bool quiet;
/* Non-zero while this thread is inside the shim's own start: a CUDA call made
 * from there goes straight to the runtime. */
static _Thread_local int in_shim;
/* dormant_preload_set_thread_capture(): -1 unset (the default applies). */
static _Thread_local int thread_capture = -1;
/* dormant_preload_set_thread_region(): inside a region (1) or not (0). */
static _Thread_local int thread_region;
/* Set by the first dormant_preload_set_thread_region() of the process: a
 * region layer (the torch_memory_saver drop-in) says where regions are, and
 * a thread outside every region captures only as the default says. */
static atomic_bool regions_tracked;

static _Atomic uint64_t captured_allocations, captured_frees, failed_allocations, foreign_frees;
static _Atomic uint64_t async_allocations, async_bytes, managed_allocations, managed_bytes;
/* cudaMalloc calls given to the runtime as ordinary memory while capture is
 * active: the thread did not capture, or (while_asleep) it did, outside
 * every region, under a tag that was not awake */
static _Atomic uint64_t ordinary_allocations, ordinary_bytes;
static _Atomic uint64_t asleep_allocations, asleep_bytes;
static atomic_bool warned_async, warned_managed, warned_failure, warned_asleep;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void say(const char *fmt, ...)
{
	char line[768];
	va_list ap;

	if (quiet)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	/* one write, so that lines of several threads do not interleave */
	dprintf(STDERR_FILENO, "dormant-preload: %s\n", line);
}

/* ---- the real runtime ---------------------------------------------------- */

static int find_cudart(struct dl_phdr_info *info, size_t size, void *data)
{
	const char *name = info->dlpi_name, *base;

	(void)size;
	if (!name || !*name)
		return 0;
	base = strrchr(name, '/');
	base = base ? base + 1 : name;
	if (strncmp(base, "libcudart.so", strlen("libcudart.so")) != 0)
		return 0;
	snprintf(data, PATH_MAX, "%s", name);
	return 1;
}

/* The runtime's own function, or NULL where no CUDA runtime is loaded. */
static void *real_address(enum real_fn fn)
{
	void *p = atomic_load_explicit(&real_cache[fn], memory_order_acquire);
	char path[PATH_MAX] = "";
	void *handle;

	if (p)
		return p;
	p = dlsym(RTLD_NEXT, real_names[fn]);
	if (!p) {
		/* a runtime opened RTLD_LOCAL is not in the global scope */
		dl_iterate_phdr(find_cudart, path);
		if (path[0] && (handle = dlopen(path, RTLD_LAZY | RTLD_NOLOAD))) {
			p = dlsym(handle, real_names[fn]);
			dlclose(handle);
		}
	}
	if (p)
		atomic_store_explicit(&real_cache[fn], p, memory_order_release);
	return p;
}

/* As a function pointer (ISO C has no cast from void *; callers cast this
 * one to the function's own type). */
typedef void (*any_fn)(void);

static any_fn real(enum real_fn fn)
{
	void *p = real_address(fn);
	any_fn f;

	memcpy(&f, &p, sizeof(f));
	return f;
}

static cudaError_t real_malloc(void **dev_ptr, size_t size)
{
	cudaError_t (*fn)(void **, size_t) = (cudaError_t (*)(void **, size_t))real(REAL_MALLOC);

	return fn ? fn(dev_ptr, size) : cudaErrorInitializationError;
}

static cudaError_t real_free(void *dev_ptr)
{
	cudaError_t (*fn)(void *) = (cudaError_t (*)(void *))real(REAL_FREE);

	if (!fn)
		return dev_ptr ? cudaErrorInvalidValue : cudaSuccess;
	return fn(dev_ptr);
}

static int current_device(void)
{
	cudaError_t (*fn)(int *) = (cudaError_t (*)(int *))real(REAL_GET_DEVICE);
	int device = 0;

	if (!fn || fn(&device) != cudaSuccess)
		return 0;
	return device;
}

/* ---- starting ------------------------------------------------------------ */

/* Whether $name, a PyTorch allocator configuration ("key:value,key:value"),
 * sets key to value (value compared without case, as PyTorch reads it). */
static bool conf_sets(const char *conf, const char *key, const char *value)
{
	const char *p = conf;
	size_t key_len = strlen(key), value_len = strlen(value);

	while (*p) {
		const char *end = strchr(p, ',');
		const char *colon;
		size_t len = end ? (size_t)(end - p) : strlen(p), klen;

		while (len && (*p == ' ' || *p == '\t')) {
			p++;
			len--;
		}
		colon = memchr(p, ':', len);
		klen = colon ? (size_t)(colon - p) : 0;

		while (klen && (p[klen - 1] == ' ' || p[klen - 1] == '\t'))
			klen--;
		if (colon && klen == key_len && memcmp(p, key, key_len) == 0) {
			const char *v = colon + 1;
			size_t vlen = len - (size_t)(colon - p) - 1;

			while (vlen && (*v == ' ' || *v == '\t')) {
				v++;
				vlen--;
			}
			while (vlen && (v[vlen - 1] == ' ' || v[vlen - 1] == '\t'))
				vlen--;
			if (vlen == value_len && strncasecmp(v, value, vlen) == 0)
				return true;
		}
		if (!end)
			break;
		p = end + 1;
	}
	return false;
}

/* Writes why capture cannot work with the allocator configuration, if so. */
static bool unsupported_config(char *why, size_t size)
{
	static const char *const vars[] = { "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF" };

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
		const char *conf = getenv(vars[i]);

		if (!conf)
			continue;
		if (conf_sets(conf, "expandable_segments", "true")) {
			snprintf(why, size,
				 "%s sets expandable_segments:True: PyTorch then maps its memory "
				 "with cuMem* itself, which capture cannot see; unset it",
				 vars[i]);
			return true;
		}
		if (conf_sets(conf, "backend", "cudaMallocAsync")) {
			snprintf(why, size,
				 "%s sets backend:cudaMallocAsync: stream-ordered memory cannot be "
				 "captured; use PyTorch's native allocator",
				 vars[i]);
			return true;
		}
	}
	return false;
}

static void manager_log(enum dormant_log_level level, const char *message, void *userdata)
{
	(void)userdata;
	if (level <= DORMANT_LOG_WARNING)
		say("%s", message);
}

static int stats_extra(void *userdata, char *buf, size_t size);

/* The server variables are for the process the wrapper started (its pid is
 * $DORMANT_PRELOAD_PID), not for the children that inherit them. */
static bool server_is_ours(void)
{
	const char *pid = getenv("DORMANT_PRELOAD_PID");

	return !pid || !*pid || strtol(pid, NULL, 10) == (long)getpid();
}

static void refuse_locked(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void refuse_locked(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(reason, sizeof(reason), fmt, ap);
	va_end(ap);
	say("capture refused: %s; cudaMalloc will fail", reason);
	atomic_store_explicit(&state, STATE_REFUSED, memory_order_release);
}

/* Preloaded under torch_memory_saver's file name (a launcher written for it
 * put torch_memory_saver_hook_mode_preload*.so on LD_PRELOAD): capture is on
 * as with $DORMANT_PRELOAD=1, what each thread captures being
 * torch_memory_saver's interesting region ($TMS_INIT_ENABLE, regions). */
static bool preloaded_as_tms(void)
{
	const char *preload = getenv("LD_PRELOAD");

	return preload && strstr(preload, "torch_memory_saver");
}

static void start_locked(void)
{
	const char *on = getenv("DORMANT_PRELOAD");
	const char *listen = getenv("DORMANT_LISTEN");
	const char *port_file = getenv("DORMANT_PORT_FILE");
	struct dormant_options *opts = NULL;
	struct dormant_server_options *server_opts = NULL;
	struct dormant_server *server = NULL;
	struct dormant *m = NULL;
	char why[DORMANT_ERROR_MAX];
	int r;

	if ((!on || strcmp(on, "1") != 0) && !(!on && preloaded_as_tms())) {
		snprintf(reason, sizeof(reason), "off ($DORMANT_PRELOAD is not 1)");
		atomic_store_explicit(&state, STATE_OFF, memory_order_release);
		return;
	}
	if (unsupported_config(why, sizeof(why))) {
		refuse_locked("%s", why);
		return;
	}
	r = dormant_options_new(&opts);
	if (r == 0)
		r = dormant_options_set_log(opts, manager_log, NULL);
	if (r == 0)
		r = dormant_new(opts, &m);
	dormant_options_destroy(opts);
	if (r < 0) {
		refuse_locked("creating the dormant manager: %s", dormant_last_error());
		return;
	}
	/* torch_memory_saver's variables, for programs started as for it:
	 * memory outside every region with or without a host copy, and the
	 * host copies kept across resumes */
	if (getenv("TMS_INIT_ENABLE_CPU_BACKUP") && *getenv("TMS_INIT_ENABLE_CPU_BACKUP"))
		dormant_set_policy(m, "default",
				   preload_env_true(getenv("TMS_INIT_ENABLE_CPU_BACKUP"))
					   ? DORMANT_KEEP
					   : DORMANT_DISCARD);
	if (preload_env_true(getenv("TMS_RETAIN_CPU_BACKUP")))
		dormant_set_host_mode(m, DORMANT_HOST_RETAIN);
	if (listen && *listen && server_is_ours()) {
		r = dormant_server_options_new(&server_opts);
		if (r == 0)
			r = dormant_server_options_set(server_opts, "listen", listen);
		if (r == 0)
			r = dormant_server_options_set_int(server_opts, "quiet", 1);
		if (r == 0) /* its warnings, as the manager's */
			r = dormant_server_options_set_log(server_opts, manager_log, NULL);
		if (r == 0)
			r = dormant_server_options_set_stats_extra(server_opts, stats_extra, NULL);
		if (r == 0)
			r = dormant_server_start(m, server_opts, &server);
		dormant_server_options_destroy(server_opts);
		if (r < 0) {
			refuse_locked("serving on %s: %s", listen, dormant_last_error());
			dormant_destroy(m);
			return;
		}
		if (port_file && *port_file) {
			r = dormant_server_write_port_file(server, port_file);
			if (r < 0) {
				refuse_locked("writing %s: %s", port_file, strerror(-r));
				dormant_server_stop(server);
				dormant_destroy(m);
				return;
			}
		}
	}
	dormant_torch_set_manager(m);
	process_manager = m;
	process_server = server;
	reason[0] = '\0';
	atomic_store_explicit(&state, STATE_ACTIVE, memory_order_release);
	say("capturing cudaMalloc (backend %s)%s%s", dormant_backend_name(m),
	    server ? ", serving " : "", server ? dormant_server_url(server) : "");
}

static int ensure_started(void)
{
	int s = atomic_load_explicit(&state, memory_order_acquire);

	if (s != STATE_UNSTARTED)
		return s;
	pthread_mutex_lock(&start_lock);
	if (atomic_load_explicit(&state, memory_order_acquire) == STATE_UNSTARTED) {
		in_shim++;
		start_locked();
		in_shim--;
	}
	s = atomic_load_explicit(&state, memory_order_acquire);
	pthread_mutex_unlock(&start_lock);
	return s;
}

/* A child of fork() must not use its parent's manager: the manager's threads
 * (transfer workers, the server) did not come along, and neither does a CUDA
 * context. A parent that had not started leaves a child that starts itself. */
static void before_fork(void)
{
	pthread_mutex_lock(&start_lock);
}

static void after_fork_parent(void)
{
	pthread_mutex_unlock(&start_lock);
}

static void after_fork_child(void)
{
	int s = atomic_load_explicit(&state, memory_order_relaxed);

	if (s == STATE_ACTIVE || s == STATE_REFUSED) {
		process_manager = NULL;
		process_server = NULL;
		snprintf(reason, sizeof(reason),
			 "forked child of a captured process (exec it to capture it)");
		atomic_store_explicit(&state, STATE_FORKED, memory_order_release);
	}
	pthread_mutex_unlock(&start_lock);
}

__attribute__((constructor)) static void preload_init(void)
{
	const char *q = getenv("DORMANT_PRELOAD_QUIET");

	quiet = q && strcmp(q, "1") == 0;
	pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

/* ---- reports ------------------------------------------------------------- */

DORMANT_EXPORT int dormant_preload_stats_get(struct dormant_preload_stats *ret)
{
	int s;

	if (!ret)
		return -EINVAL;
	memset(ret, 0, sizeof(*ret));
	/* no start_lock: this runs on server threads, which a failing start
	 * waits for while holding it; reason is final once state is set */
	s = atomic_load_explicit(&state, memory_order_acquire);
	ret->active = s == STATE_ACTIVE;
	if (s != STATE_UNSTARTED)
		snprintf(ret->reason, sizeof(ret->reason), "%s", reason);
	ret->captured_allocations = atomic_load(&captured_allocations);
	ret->captured_frees = atomic_load(&captured_frees);
	ret->failed_allocations = atomic_load(&failed_allocations);
	ret->foreign_frees = atomic_load(&foreign_frees);
	ret->async_allocations = atomic_load(&async_allocations);
	ret->async_bytes = atomic_load(&async_bytes);
	ret->managed_allocations = atomic_load(&managed_allocations);
	ret->managed_bytes = atomic_load(&managed_bytes);
	return 0;
}

/* The "extra" member of GET /stats on the shim's server. */
static int stats_extra(void *userdata, char *buf, size_t size)
{
	struct dormant_preload_stats st;
	int n;

	(void)userdata;
	dormant_preload_stats_get(&st);
	n = snprintf(buf, size,
		     "{\"preload\": {\"active\": %s, \"captured_allocations\": %llu, "
		     "\"captured_frees\": %llu, \"failed_allocations\": %llu, "
		     "\"foreign_frees\": %llu, \"uncaptured\": {\"async_allocations\": %llu, "
		     "\"async_bytes\": %llu, \"managed_allocations\": %llu, "
		     "\"managed_bytes\": %llu}, \"ordinary\": {\"allocations\": %llu, "
		     "\"bytes\": %llu, \"while_asleep_allocations\": %llu, "
		     "\"while_asleep_bytes\": %llu}}}",
		     st.active ? "true" : "false", (unsigned long long)st.captured_allocations,
		     (unsigned long long)st.captured_frees,
		     (unsigned long long)st.failed_allocations,
		     (unsigned long long)st.foreign_frees, (unsigned long long)st.async_allocations,
		     (unsigned long long)st.async_bytes,
		     (unsigned long long)st.managed_allocations,
		     (unsigned long long)st.managed_bytes,
		     (unsigned long long)atomic_load(&ordinary_allocations),
		     (unsigned long long)atomic_load(&ordinary_bytes),
		     (unsigned long long)atomic_load(&asleep_allocations),
		     (unsigned long long)atomic_load(&asleep_bytes));
	if (n < 0 || (size_t)n >= size)
		return -ENOBUFS;
	return n;
}

DORMANT_EXPORT int dormant_preload_manager(struct dormant **ret)
{
	int s;

	if (!ret)
		return -EINVAL;
	s = ensure_started();
	if (s == STATE_ACTIVE) {
		*ret = process_manager;
		return 0;
	}
	return s == STATE_REFUSED ? -EPERM : -ENOTSUP;
}

/* ---- per-thread capture -------------------------------------------------- */

/* "1", "true", "yes", "on" (any case): as torch_memory_saver reads its
 * boolean variables, anything else is false. */
bool preload_env_true(const char *value)
{
	return value && (strcmp(value, "1") == 0 || strcasecmp(value, "true") == 0 ||
			 strcasecmp(value, "yes") == 0 || strcasecmp(value, "on") == 0);
}

DORMANT_EXPORT int dormant_preload_set_thread_capture(int on)
{
	if (on < -1 || on > 1)
		return -EINVAL;
	thread_capture = on;
	return 0;
}

/* Whether a thread outside every region captures by default: $TMS_INIT_ENABLE
 * when set; unset, dormant captures everything, torch_memory_saver's library
 * (preloaded under its name) only regions. */
static bool outside_regions_captured(void)
{
	const char *init = getenv("TMS_INIT_ENABLE");

	return init && *init ? preload_env_true(init) : !preloaded_as_tms();
}

DORMANT_EXPORT bool dormant_preload_get_thread_capture(void)
{
	if (thread_capture >= 0)
		return thread_capture == 1;
	return outside_regions_captured();
}

DORMANT_EXPORT int dormant_preload_set_thread_region(int inside)
{
	int was = thread_region;

	if (inside != 0 && inside != 1)
		return -EINVAL;
	atomic_store_explicit(&regions_tracked, true, memory_order_relaxed);
	thread_region = inside;
	return was;
}

DORMANT_EXPORT bool dormant_preload_get_thread_region(void)
{
	return thread_region == 1;
}

/*
 * Whether this thread's cudaMalloc is captured now: its flag on, and, once a
 * region layer tracks regions, inside one or outside every region where the
 * default captures there. A flag switched on outside every region (slime's
 * tms_set_interesting_region(True) after DeepEP's buffer) then captures
 * nothing: torch_memory_saver's contract is that only regions are managed.
 */
static bool thread_captures(void)
{
	if (!dormant_preload_get_thread_capture())
		return false;
	if (thread_region || !atomic_load_explicit(&regions_tracked, memory_order_relaxed))
		return true;
	return outside_regions_captured();
}

/* ---- the interposed calls ------------------------------------------------ */

static cudaError_t cuda_error_from(int r)
{
	switch (r) {
	case -ENOMEM:
	case -EBUSY:  /* the tag is asleep: no memory to hand out now */
	case -ENOSPC: /* the tag table is full */
		return cudaErrorMemoryAllocation;
	case -ENODEV:
		return cudaErrorInvalidDevice;
	case -EINVAL:
		return cudaErrorInvalidValue;
	default:
		return cudaErrorUnknown;
	}
}

/* The state for an allocation call from this thread. */
static int state_for_call(void)
{
	return in_shim ? STATE_OFF : ensure_started();
}

/* The runtime's cudaMalloc for a call the shim does not capture while it is
 * active (ordinary device memory), counted. */
static cudaError_t ordinary_malloc(void **dev_ptr, size_t size, bool while_asleep)
{
	cudaError_t e = real_malloc(dev_ptr, size);

	if (e == cudaSuccess) {
		atomic_fetch_add(&ordinary_allocations, 1);
		atomic_fetch_add(&ordinary_bytes, size);
		if (while_asleep) {
			atomic_fetch_add(&asleep_allocations, 1);
			atomic_fetch_add(&asleep_bytes, size);
		}
	}
	return e;
}

/* Whether the process's device state is checkpointed (residue mode): then no
 * call may reach the runtime, and a refused allocation stays refused. */
static bool checkpointed(struct dormant *m)
{
	struct dormant_residue_stats rs;

	return dormant_residue_stats_get(m, &rs) == 0 && rs.state == DORMANT_RESIDUE_CHECKPOINTED;
}

DORMANT_EXPORT cudaError_t cudaMalloc(void **dev_ptr, size_t size)
{
	char tag[DORMANT_TAG_MAX + 1];
	void *ptr = NULL;
	int s = state_for_call();
	int r;

	if (s == STATE_REFUSED) {
		atomic_fetch_add(&failed_allocations, 1);
		return cudaErrorInitializationError;
	}
	if (s != STATE_ACTIVE)
		return real_malloc(dev_ptr, size);
	if (!thread_captures())
		return ordinary_malloc(dev_ptr, size, false);
	if (!dev_ptr)
		return cudaErrorInvalidValue;
	if (size == 0) {
		*dev_ptr = NULL;
		return cudaSuccess;
	}
	dormant_get_thread_tag(tag, sizeof(tag));
	/* the thread's tag and policy, as dormant_torch_malloc() takes them */
	r = dormant_alloc_policy(process_manager, tag, dormant_get_thread_policy(), size,
				 current_device(), &ptr);
	if (r == -EBUSY && !thread_region && strcmp(tag, "default") == 0 &&
	    !checkpointed(process_manager)) {
		/* Outside every region (none announced, the thread's tag not
		 * chosen), under a tag that is not awake (whole-process capture, a
		 * program allocating while it sleeps): ordinary memory, as
		 * torch_memory_saver's users expect an allocation outside regions
		 * to work. It stays on the device until freed. */
		if (!atomic_exchange(&warned_asleep, true))
			say("cudaMalloc of %zu bytes outside every region while tag '%s' is not "
			    "awake: given ordinary device memory, not captured (it stays on the "
			    "device until freed; counted in /stats, ordinary.while_asleep_*)",
			    size, tag);
		return ordinary_malloc(dev_ptr, size, true);
	}
	if (r < 0) {
		atomic_fetch_add(&failed_allocations, 1);
		/* out of memory is the caller's to handle (PyTorch frees its cache
		 * and retries); anything else is worth one line */
		if (r != -ENOMEM && !atomic_exchange(&warned_failure, true))
			say("cudaMalloc of %zu bytes under tag '%s'%s: %s (further failures are "
			    "counted in /stats)", size, tag,
			    r == -EBUSY ? " inside a region" : "",
			    dormant_last_error());
		return cuda_error_from(r);
	}
	atomic_fetch_add(&captured_allocations, 1);
	*dev_ptr = ptr;
	return cudaSuccess;
}

/* Frees ptr if it is the manager's, after sync (which waits for the work that
 * may still use it, as the runtime's own free would). 1 if it was ours. */
static int free_if_ours(void *ptr, bool (*sync)(void *), void *sync_arg, cudaError_t *ret)
{
	struct dormant *m;

	if (!ptr || in_shim || atomic_load_explicit(&state, memory_order_acquire) != STATE_ACTIVE)
		return 0;
	m = process_manager;
	if (!dormant_owns(m, ptr)) {
		atomic_fetch_add(&foreign_frees, 1);
		return 0;
	}
	sync(sync_arg);
	if (dormant_free(m, ptr) < 0) {
		*ret = cudaErrorInvalidValue; /* freed twice, concurrently */
		return 1;
	}
	atomic_fetch_add(&captured_frees, 1);
	*ret = cudaSuccess;
	return 1;
}

static bool sync_device(void *unused)
{
	cudaError_t (*fn)(void) = (cudaError_t (*)(void))real(REAL_DEVICE_SYNCHRONIZE);

	(void)unused;
	return fn && fn() == cudaSuccess;
}

static bool sync_stream(void *stream)
{
	cudaError_t (*fn)(cudaStream_t) =
		(cudaError_t (*)(cudaStream_t))real(REAL_STREAM_SYNCHRONIZE);

	return fn && fn(stream) == cudaSuccess;
}

DORMANT_EXPORT cudaError_t cudaFree(void *dev_ptr)
{
	cudaError_t ret;

	if (free_if_ours(dev_ptr, sync_device, NULL, &ret))
		return ret;
	return real_free(dev_ptr);
}

DORMANT_EXPORT cudaError_t cudaFreeAsync(void *dev_ptr, cudaStream_t stream)
{
	cudaError_t (*fn)(void *, cudaStream_t) =
		(cudaError_t (*)(void *, cudaStream_t))real(REAL_FREE_ASYNC);
	cudaError_t ret;

	/* a captured pointer given back stream-ordered: wait for the stream */
	if (free_if_ours(dev_ptr, sync_stream, stream, &ret))
		return ret;
	return fn ? fn(dev_ptr, stream) : cudaErrorInitializationError;
}

static void count_uncaptured(_Atomic uint64_t *calls, _Atomic uint64_t *bytes,
			     atomic_bool *warned, const char *what, size_t size)
{
	if (state_for_call() != STATE_ACTIVE)
		return;
	atomic_fetch_add(calls, 1);
	atomic_fetch_add(bytes, size);
	if (!atomic_exchange(warned, true))
		say("%s is not captured: that memory stays on the device during sleep "
		    "(counted in /stats)", what);
}

DORMANT_EXPORT cudaError_t cudaMallocAsync(void **dev_ptr, size_t size, cudaStream_t stream)
{
	cudaError_t (*fn)(void **, size_t, cudaStream_t) =
		(cudaError_t (*)(void **, size_t, cudaStream_t))real(REAL_MALLOC_ASYNC);

	count_uncaptured(&async_allocations, &async_bytes, &warned_async, "cudaMallocAsync",
			 size);
	return fn ? fn(dev_ptr, size, stream) : cudaErrorInitializationError;
}

DORMANT_EXPORT cudaError_t cudaMallocFromPoolAsync(void **dev_ptr, size_t size,
						   cudaMemPool_t pool, cudaStream_t stream)
{
	cudaError_t (*fn)(void **, size_t, cudaMemPool_t, cudaStream_t) =
		(cudaError_t (*)(void **, size_t, cudaMemPool_t, cudaStream_t))real(
			REAL_MALLOC_FROM_POOL_ASYNC);

	count_uncaptured(&async_allocations, &async_bytes, &warned_async, "cudaMallocAsync",
			 size);
	return fn ? fn(dev_ptr, size, pool, stream) : cudaErrorInitializationError;
}

DORMANT_EXPORT cudaError_t cudaMallocManaged(void **dev_ptr, size_t size, unsigned flags)
{
	cudaError_t (*fn)(void **, size_t, unsigned) =
		(cudaError_t (*)(void **, size_t, unsigned))real(REAL_MALLOC_MANAGED);

	count_uncaptured(&managed_allocations, &managed_bytes, &warned_managed,
			 "cudaMallocManaged (managed memory)", size);
	return fn ? fn(dev_ptr, size, flags) : cudaErrorInitializationError;
}
