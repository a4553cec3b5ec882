/* SPDX-License-Identifier: MIT */
/*
 * dormant-residue-helper: the process that checkpoints and restores its
 * parent's device state for residue mode checkpoint (docs/design.md,
 * "Residue"). The driver's process checkpoint (cuCheckpointProcessLock,
 * ...Checkpoint, ...Restore, ...Unlock) acts on a process id from another
 * process: libdormant starts this program with one end of a socket pair as
 * file descriptor 3, sends it requests (residue_proto.h) and reads its
 * replies.
 *
 * It acts on its parent only (the process id is taken once, at start, never
 * from a request), runs with the parent's user and no more (it refuses to
 * run set-user-ID), and exits when the socket reads end-of-file: when the
 * parent closes its end or dies. It loads libcuda.so.1 at the first request
 * that needs it and creates no CUDA context (cuInit alone, which restore
 * needs), so it holds no device memory.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "residue_proto.h"

/* The driver's types, as cuda.h has them: this program needs no cuda.h. */
typedef int cu_result;
struct cu_lock_args {
	unsigned int timeout_ms;
	unsigned int reserved0;
	uint64_t reserved1[7];
};
struct cu_plain_args {
	uint64_t reserved[8];
};
struct cu_restore_args {
	void *gpu_pairs;
	unsigned int gpu_pairs_count;
	char reserved[52 - sizeof(void *)];
	uint64_t reserved1;
};
#define CU_SUCCESS 0
#define CU_ERROR_OUT_OF_MEMORY 2
#define CU_ERROR_NOT_SUPPORTED 801
#define CU_ERROR_NOT_READY 600
#define CU_ERROR_ILLEGAL_STATE 401

struct driver {
	bool loaded;
	int load_error; /* 0, or the -errno that loading failed with */
	char load_message[RESIDUE_MESSAGE_MAX];
	cu_result (*init)(unsigned int flags);
	cu_result (*error_name)(cu_result r, const char **ret);
	cu_result (*error_string)(cu_result r, const char **ret);
	cu_result (*get_state)(int pid, int *ret);
	cu_result (*lock)(int pid, struct cu_lock_args *args);
	cu_result (*checkpoint)(int pid, struct cu_plain_args *args);
	cu_result (*restore)(int pid, struct cu_restore_args *args);
	cu_result (*unlock)(int pid, struct cu_plain_args *args);
	/* RESIDUE_OP_FREE: the device's bus id, and NVML (loaded at its first) */
	cu_result (*device_get)(int *ret, int ordinal);
	cu_result (*device_bus_id)(char *ret, int len, int device);
	bool nvml_loaded;
	int nvml_error;
	char nvml_message[RESIDUE_MESSAGE_MAX];
	int (*nvml_by_bus_id)(const char *bus_id, void **ret);
	int (*nvml_memory)(void *device, void *ret);
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* $DORMANT_RESIDUE_HELPER_TRACE names a file that gets a timestamped line
 * before and after each step (diagnosing a step that does not return). */
static FILE *trace_file;
static double trace_t0;

static void trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void trace(const char *fmt, ...)
{
	va_list ap;

	if (!trace_file)
		return;
	fprintf(trace_file, "[%9.3f] helper %d: ", now_s() - trace_t0, (int)getpid());
	va_start(ap, fmt);
	vfprintf(trace_file, fmt, ap);
	va_end(ap);
	fputc('\n', trace_file);
	fflush(trace_file);
}

static void trace_open(void)
{
	const char *path = getenv("DORMANT_RESIDUE_HELPER_TRACE");

	trace_t0 = now_s();
	if (path && *path)
		trace_file = fopen(path, "ae");
}

static void say(struct residue_reply *rep, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void say(struct residue_reply *rep, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(rep->message, sizeof(rep->message), fmt, ap);
	va_end(ap);
}

static int driver_load(struct driver *d)
{
	static const char *const names[] = {
		"cuCheckpointProcessGetState", "cuCheckpointProcessLock",
		"cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
		"cuCheckpointProcessUnlock",
	};
	void **slots[] = {
		(void **)&d->get_state, (void **)&d->lock, (void **)&d->checkpoint,
		(void **)&d->restore, (void **)&d->unlock,
	};
	void *lib;
	cu_result r;

	if (d->loaded)
		return d->load_error;
	d->loaded = true;
	trace("dlopen libcuda.so.1");
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		snprintf(d->load_message, sizeof(d->load_message),
			 "cannot load libcuda.so.1: %s", dlerror());
		return d->load_error = -ENOTSUP;
	}
	*(void **)&d->init = dlsym(lib, "cuInit");
	*(void **)&d->error_name = dlsym(lib, "cuGetErrorName");
	*(void **)&d->error_string = dlsym(lib, "cuGetErrorString");
	*(void **)&d->device_get = dlsym(lib, "cuDeviceGet");
	*(void **)&d->device_bus_id = dlsym(lib, "cuDeviceGetPCIBusId");
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		*slots[i] = dlsym(lib, names[i]);
		if (!*slots[i]) {
			snprintf(d->load_message, sizeof(d->load_message),
				 "the driver has no %s (the process checkpoint needs driver "
				 "550 or later)",
				 names[i]);
			return d->load_error = -ENOTSUP;
		}
	}
	/* restore needs cuInit (or persistence mode); it makes no context */
	trace("cuInit");
	r = d->init ? d->init(0) : CU_SUCCESS;
	trace("cuInit: %d", r);
	if (r != CU_SUCCESS) {
		snprintf(d->load_message, sizeof(d->load_message), "cuInit failed (%d)", r);
		return d->load_error = -ENOTSUP;
	}
	return 0;
}

static int errno_of(cu_result r)
{
	switch (r) {
	case CU_SUCCESS:
		return 0;
	case CU_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CU_ERROR_NOT_SUPPORTED:
		return -ENOTSUP;
	case CU_ERROR_NOT_READY:
		return -EBUSY; /* the lock timed out: a thread stayed in a CUDA call */
	default:
		return -EIO;
	}
}

/* Record a failed driver call in rep (its name, the driver's code, name and
 * words) and return its errno. */
static int driver_failed(struct driver *d, struct residue_reply *rep, const char *call,
			 cu_result r)
{
	const char *name = NULL, *text = NULL;

	if (d->error_name)
		d->error_name(r, &name);
	if (d->error_string)
		d->error_string(r, &text);
	rep->driver_code = r;
	say(rep, "%s: %s (%d)%s%s", call, name ? name : "CUDA error", r, text ? ": " : "",
	    text ? text : "");
	return errno_of(r);
}

static int process_state(struct driver *d, int pid)
{
	int state = RESIDUE_PROCESS_UNKNOWN;
	cu_result r;

	trace("cuCheckpointProcessGetState(%d)", pid);
	r = d->get_state(pid, &state);
	trace("cuCheckpointProcessGetState: %d, state %d", r, state);
	return r == CU_SUCCESS ? state : RESIDUE_PROCESS_UNKNOWN;
}

/* One driver call into cr, traced before and after. */
#define TRACED(cr, name, call)                      \
	do {                                        \
		trace("%s(%d)", name, pid);         \
		cr = (call);                        \
		trace("%s: %d", name, cr);          \
	} while (0)

static int nvml_load(struct driver *d)
{
	int (*init)(void);
	void *lib;
	int r;

	if (d->nvml_loaded)
		return d->nvml_error;
	d->nvml_loaded = true;
	trace("dlopen libnvidia-ml.so.1");
	lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		snprintf(d->nvml_message, sizeof(d->nvml_message), "cannot load NVML: %s",
			 dlerror());
		return d->nvml_error = -ENOTSUP;
	}
	*(void **)&init = dlsym(lib, "nvmlInit_v2");
	*(void **)&d->nvml_by_bus_id = dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
	*(void **)&d->nvml_memory = dlsym(lib, "nvmlDeviceGetMemoryInfo");
	if (!init || !d->nvml_by_bus_id || !d->nvml_memory) {
		snprintf(d->nvml_message, sizeof(d->nvml_message), "NVML lacks a function");
		return d->nvml_error = -ENOTSUP;
	}
	r = init();
	trace("nvmlInit: %d", r);
	if (r != 0) {
		snprintf(d->nvml_message, sizeof(d->nvml_message), "nvmlInit failed (%d)", r);
		return d->nvml_error = -ENOTSUP;
	}
	return 0;
}

/* RESIDUE_OP_FREE: the device's memory as NVML sees it, from this process. */
static int cuda_free(struct driver *d, int ordinal, struct residue_reply *rep)
{
	struct {
		unsigned long long total, free, used; /* nvmlMemory_t */
	} memory;
	char bus_id[32];
	void *handle = NULL;
	int device, r;

	if (!d->device_get || !d->device_bus_id ||
	    d->device_get(&device, ordinal) != CU_SUCCESS ||
	    d->device_bus_id(bus_id, (int)sizeof(bus_id), device) != CU_SUCCESS) {
		say(rep, "no CUDA device %d here", ordinal);
		return -ENODEV;
	}
	r = nvml_load(d);
	if (r < 0) {
		say(rep, "%s", d->nvml_message);
		return r;
	}
	r = d->nvml_by_bus_id(bus_id, &handle);
	if (r == 0)
		r = d->nvml_memory(handle, &memory);
	trace("NVML memory of %s: %d", bus_id, r);
	if (r != 0) {
		say(rep, "NVML cannot read device %d's memory (%d)", ordinal, r);
		return -EIO;
	}
	rep->free_bytes = memory.free;
	rep->total_bytes = memory.total;
	return 0;
}

static int cuda_op(struct driver *d, int pid, const struct residue_request *req,
		   struct residue_reply *rep)
{
	struct cu_lock_args lock = { .timeout_ms = req->lock_timeout_ms };
	struct cu_plain_args plain = { 0 };
	struct cu_restore_args restore = { 0 };
	int state, r;
	cu_result cr;

	r = driver_load(d);
	if (r < 0) {
		say(rep, "%s", d->load_message);
		return r;
	}
	if (req->op == RESIDUE_OP_FREE)
		return cuda_free(d, req->device, rep);
	state = process_state(d, pid);
	switch (req->op) {
	case RESIDUE_OP_CHECKPOINT:
		TRACED(cr, "cuCheckpointProcessLock", d->lock(pid, &lock));
		if (cr != CU_SUCCESS)
			return driver_failed(d, rep, "cuCheckpointProcessLock", cr);
		TRACED(cr, "cuCheckpointProcessCheckpoint", d->checkpoint(pid, &plain));
		if (cr != CU_SUCCESS) {
			r = driver_failed(d, rep, "cuCheckpointProcessCheckpoint", cr);
			/* leave it running, as it was: the residue stays */
			TRACED(cr, "cuCheckpointProcessUnlock", d->unlock(pid, &plain));
			return r;
		}
		return 0;
	case RESIDUE_OP_RESTORE:
		if (state == RESIDUE_PROCESS_RUNNING)
			return 0;
		if (state != RESIDUE_PROCESS_LOCKED) {
			TRACED(cr, "cuCheckpointProcessRestore", d->restore(pid, &restore));
			if (cr != CU_SUCCESS)
				return driver_failed(d, rep, "cuCheckpointProcessRestore", cr);
		}
		TRACED(cr, "cuCheckpointProcessUnlock", d->unlock(pid, &plain));
		if (cr != CU_SUCCESS)
			return driver_failed(d, rep, "cuCheckpointProcessUnlock", cr);
		return 0;
	default:
		say(rep, "unknown request %u", req->op);
		return -EINVAL;
	}
}

/* The simulated device: nothing to do in the driver; the library models what
 * the checkpoint frees. The helper still answers for its parent only. */
static int host_op(int pid, const struct residue_request *req, struct residue_reply *rep)
{
	if (kill(pid, 0) < 0) {
		say(rep, "process %d is gone", pid);
		return -ESRCH;
	}
	if (req->op < RESIDUE_OP_CHECKPOINT || req->op > RESIDUE_OP_FREE) {
		say(rep, "unknown request %u", req->op);
		return -EINVAL;
	}
	if (req->op == RESIDUE_OP_FREE) {
		say(rep, "the simulated device is read inside the process");
		return -ENOTSUP;
	}
	return 0;
}

/*
 * By hand, from outside the process (diagnosis, or a process left locked or
 * checkpointed):
 *   dormant-residue-helper --pid PID state|checkpoint|restore
 * prints what the driver answered; exit status 0 when it succeeded.
 */
static int by_hand(int argc, char **argv)
{
	static const char *const state_names[] = { "running", "locked", "checkpointed",
						   "failed" };
	struct residue_request req = { .magic = RESIDUE_MAGIC, .driver = RESIDUE_DRIVER_CUDA,
				       .lock_timeout_ms = 10000 };
	struct residue_reply rep = { 0 };
	struct driver driver = { 0 };
	char *end;
	long pid;
	int r, state;

	if (argc != 4 || strcmp(argv[1], "--pid") != 0) {
		fprintf(stderr, "usage: %s --pid PID state|checkpoint|restore\n", argv[0]);
		return 2;
	}
	pid = strtol(argv[2], &end, 10);
	if (*end || pid <= 1 || pid > INT_MAX) {
		fprintf(stderr, "%s: '%s' is not a process id\n", argv[0], argv[2]);
		return 2;
	}
	if (strcmp(argv[3], "checkpoint") == 0) {
		req.op = RESIDUE_OP_CHECKPOINT;
	} else if (strcmp(argv[3], "restore") == 0) {
		req.op = RESIDUE_OP_RESTORE;
	} else if (strcmp(argv[3], "state") != 0) {
		fprintf(stderr, "%s: '%s' is not state, checkpoint or restore\n", argv[0], argv[3]);
		return 2;
	}
	r = driver_load(&driver);
	if (r < 0) {
		fprintf(stderr, "%s: %s\n", argv[0], driver.load_message);
		return 1;
	}
	if (req.op) {
		double start = now_s();

		r = cuda_op(&driver, (int)pid, &req, &rep);
		printf("%s: %s in %.3f s%s%s\n", argv[3], r < 0 ? "failed" : "done", now_s() - start,
		       r < 0 ? ": " : "", r < 0 ? rep.message : "");
	}
	state = process_state(&driver, (int)pid);
	printf("process %ld: %s\n", pid,
	       state >= 0 && state < 4 ? state_names[state] : "unknown (no CUDA, or refused)");
	return r < 0 ? 1 : 0;
}

int main(int argc, char **argv)
{
	struct driver driver = { 0 };
	int pid = (int)getppid();

	/* no privilege the parent lacks: never run set-user-ID or set-group-ID */
	if (getuid() != geteuid() || getgid() != getegid())
		return 2;
	trace_open();
	if (argc > 1)
		return by_hand(argc, argv);
	if (pid <= 1)
		return 3; /* started by nobody, or the parent is gone already */
	trace("serving process %d", pid);
	/* a dumpable helper could be traced by whoever can trace the trainer
	 * anyway; a core of it holds nothing: keep it plain */
	prctl(PR_SET_NAME, "dormant-residue", 0, 0, 0);
	signal(SIGPIPE, SIG_IGN);
	for (;;) {
		struct residue_request req;
		struct residue_reply rep = { .magic = RESIDUE_MAGIC,
					     .process_state = RESIDUE_PROCESS_UNKNOWN };
		double start;
		ssize_t n;

		trace("waiting for a request");
		n = recv(RESIDUE_HELPER_FD, &req, sizeof(req), 0);
		trace("request: %zd bytes, op %u", n, n == (ssize_t)sizeof(req) ? req.op : 0);
		if (n == 0)
			return 0; /* the parent closed its end, or died */
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return 4;
		}
		if ((size_t)n != sizeof(req) || req.magic != RESIDUE_MAGIC) {
			rep.result = -EPROTO;
			say(&rep, "a request of %zd bytes that this helper does not know "
				  "(a helper of another build?)",
			    n);
		} else if (req.fault == -ETIMEDOUT) {
			/* tests: a driver call that never returns */
			trace("injected: never answering");
			for (;;)
				pause();
		} else if (req.fault < 0) {
			/* tests: the driver call fails, as a real one would */
			rep.result = req.fault;
			rep.process_state = req.op == RESIDUE_OP_RESTORE ? RESIDUE_PROCESS_CHECKPOINTED
									 : RESIDUE_PROCESS_RUNNING;
			say(&rep, "injected fault: %s", strerror(-req.fault));
		} else {
			start = now_s();
			rep.result = req.driver == RESIDUE_DRIVER_CUDA ? cuda_op(&driver, pid, &req, &rep)
								       : host_op(pid, &req, &rep);
			rep.seconds = now_s() - start;
			if (req.driver == RESIDUE_DRIVER_CUDA && driver.get_state)
				rep.process_state = process_state(&driver, pid);
		}
		trace("reply: %d %s", rep.result, rep.message);
		if (send(RESIDUE_HELPER_FD, &rep, sizeof(rep), MSG_NOSIGNAL) < 0)
			return errno == EPIPE ? 0 : 5;
	}
}
