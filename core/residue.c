/* SPDX-License-Identifier: MIT */
/*
 * Residue mode checkpoint (residue.h): the helper process's lifecycle and
 * the checkpoint and restore around it.
 *
 * The helper is started at the first checkpoint with posix_spawn() (no fork
 * of a large, threaded process) and one end of a SOCK_SEQPACKET socket pair
 * as its descriptor 3; the library keeps the other end, close-on-exec, so
 * that no other child of the process holds it. The helper exits when that
 * socket reads end-of-file: when residue_finish() closes it or the process
 * dies. The library reaps it: in residue_finish(), when a request finds it
 * dead, and when stats see it gone. A helper that dies is replaced at the
 * next request: the driver's state belongs to this process, not to the
 * helper, so a new helper restores what an old one checkpointed. Where Yama
 * restricts tracing to ancestors, the process names the helper its tracer
 * (PR_SET_PTRACER) while it runs.
 */
#include "residue.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "residue_proto.h"

extern char **environ;

/* A request's timeout is at least the lock's and this much more. */
#define HELPER_SLACK_S 5

static const char helper_name[] = "dormant-residue-helper";

/* Whether path names an executable file; copies it into buf. */
static bool helper_try(char *buf, size_t size, const char *dir, const char *name)
{
	int n = dir ? snprintf(buf, size, "%s/%s", dir, name) : snprintf(buf, size, "%s", name);

	return n > 0 && (size_t)n < size && access(buf, X_OK) == 0;
}

/*
 * Where the helper is: $DORMANT_RESIDUE_HELPER; beside the library (a wheel
 * puts it in the package folder, beside libdormant.so); the installed
 * libexec folder; the build tree this library was built in.
 */
static int helper_path(char *buf, size_t size)
{
	const char *env = getenv("DORMANT_RESIDUE_HELPER");
	Dl_info info;

	if (env && *env) {
		if (helper_try(buf, size, NULL, env))
			return 0;
		return error_set(-ENOENT, "$DORMANT_RESIDUE_HELPER=%.200s is not an executable file",
				 env);
	}
	if (dladdr(helper_name, &info) && info.dli_fname) {
		char dir[PATH_MAX];
		char *slash;

		snprintf(dir, sizeof(dir), "%s", info.dli_fname);
		slash = strrchr(dir, '/');
		if (slash) {
			*slash = '\0';
			if (helper_try(buf, size, dir, helper_name))
				return 0;
		}
	}
#ifdef DORMANT_LIBEXECDIR
	if (helper_try(buf, size, DORMANT_LIBEXECDIR, helper_name))
		return 0;
#endif
#ifdef DORMANT_BUILD_DIR
	if (helper_try(buf, size, DORMANT_BUILD_DIR, helper_name))
		return 0;
#endif
	return error_set(-ENOENT, "cannot find %s beside libdormant or in its libexec folder "
				  "(set $DORMANT_RESIDUE_HELPER)",
			 helper_name);
}

/* Forget a helper that was reaped: its socket closed, and its process id,
 * which may be reused now, no longer this process's tracer. With r->lock. */
static void helper_forget(struct residue *r)
{
	if (r->helper_fd >= 0) {
		close(r->helper_fd);
		r->helper_fd = -1;
	}
	if (r->helper_pid > 0) {
		prctl(PR_SET_PTRACER, 0, 0, 0, 0);
		r->helper_pid = 0;
	}
}

/* Reap the helper, which has exited or will once its socket closes. Called
 * by the thread that talks to it, with r->lock. */
static void helper_reap(struct residue *r, bool kill_it)
{
	if (r->helper_fd >= 0) {
		close(r->helper_fd);
		r->helper_fd = -1;
	}
	if (r->helper_pid > 0) {
		if (kill_it)
			kill(r->helper_pid, SIGKILL);
		/* it exits on end-of-file; anything else in the process that
		 * reaped it already makes this ECHILD, which is fine */
		while (waitpid(r->helper_pid, NULL, 0) < 0 && errno == EINTR)
			;
	}
	helper_forget(r);
}

static int helper_start(struct residue *r)
{
	posix_spawn_file_actions_t actions;
	posix_spawnattr_t attr;
	sigset_t none, all;
	char path[PATH_MAX];
	char *argv[] = { (char *)helper_name, NULL };
	char tracer[160] = "";
	int sv[2], child, e;
	pid_t pid;

	e = helper_path(path, sizeof(path));
	if (e < 0)
		return e;
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return error_set(-errno, "socketpair: %s", strerror(errno));
	/* the child's end must reach descriptor 3 without close-on-exec: a
	 * dup2() onto itself would keep the flag, so move it out of the way */
	child = fcntl(sv[1], F_DUPFD_CLOEXEC, RESIDUE_HELPER_FD + 1);
	close(sv[1]);
	if (child < 0) {
		e = -errno;
		close(sv[0]);
		return error_set(e, "fcntl: %s", strerror(-e));
	}
	posix_spawn_file_actions_init(&actions);
	posix_spawn_file_actions_adddup2(&actions, child, RESIDUE_HELPER_FD);
	posix_spawnattr_init(&attr);
	sigemptyset(&none);
	sigfillset(&all);
	posix_spawnattr_setsigmask(&attr, &none);
	posix_spawnattr_setsigdefault(&attr, &all);
	posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
	e = posix_spawn(&pid, path, &actions, &attr, argv, environ);
	posix_spawnattr_destroy(&attr);
	posix_spawn_file_actions_destroy(&actions);
	close(child);
	if (e) {
		close(sv[0]);
		return error_set(-e, "starting %s: %s", path, strerror(e));
	}
	/* Yama (ptrace_scope 1, the default of most distributions) lets a
	 * process be traced by its ancestors only, unless it names a tracer:
	 * the driver acts on this process from the helper, its child. The
	 * helper is this process's own program and acts on it alone; without
	 * Yama there is nothing to set (EINVAL). */
	if (prctl(PR_SET_PTRACER, (unsigned long)pid, 0, 0, 0) < 0 && errno != EINVAL)
		snprintf(tracer, sizeof(tracer), "; cannot name it this process's tracer: %s",
			 strerror(errno));
	r->helper_pid = pid;
	r->helper_fd = sv[0];
	r->helper_starts++;
	/* one line for each start, the manager's to log: a second one says
	 * the first had died */
	snprintf(r->start_line, sizeof(r->start_line),
		 "residue: helper %.300s started (pid %d, start %llu)%s", path, (int)pid,
		 (unsigned long long)r->helper_starts, tracer);
	r->start_warning = tracer[0] != '\0';
	return 0;
}

/*
 * One request and its reply. A helper found dead before the request is
 * replaced once; one that dies or hangs during it fails the request
 * (-EPIPE, -ETIMEDOUT). Called by the transition's thread only; takes
 * r->lock for the helper's fields, not across the wait.
 */
static int helper_exchange(struct residue *r, const struct residue_request *req,
			   double timeout_s, struct residue_reply *rep)
{
	struct pollfd pfd;
	ssize_t n;
	int fd, e;

	for (int attempt = 0;; attempt++) {
		pthread_mutex_lock(&r->lock);
		e = r->helper_fd < 0 ? helper_start(r) : 0;
		fd = r->helper_fd;
		pthread_mutex_unlock(&r->lock);
		if (e < 0)
			return e;
		/* an idle helper says nothing: anything readable, or a hang-up,
		 * means it is gone */
		pfd = (struct pollfd){ .fd = fd, .events = POLLIN };
		if (poll(&pfd, 1, 0) > 0) {
			e = EPIPE;
		} else {
			n = send(fd, req, sizeof(*req), MSG_NOSIGNAL);
			if (n == (ssize_t)sizeof(*req))
				break;
			e = n < 0 ? errno : EPROTO;
		}
		pthread_mutex_lock(&r->lock);
		helper_reap(r, true);
		pthread_mutex_unlock(&r->lock);
		/* it had died: the next start is logged */
		if (attempt > 0 || (e != EPIPE && e != ECONNRESET && e != ENOTCONN))
			return error_set(-e, "the residue helper takes no request: %s", strerror(e));
	}
	pfd = (struct pollfd){ .fd = fd, .events = POLLIN };
	do
		e = poll(&pfd, 1, (int)(timeout_s * 1000));
	while (e < 0 && errno == EINTR);
	if (e == 0) {
		pthread_mutex_lock(&r->lock);
		helper_reap(r, true);
		pthread_mutex_unlock(&r->lock);
		return error_set(-ETIMEDOUT, "the residue helper did not answer in %.0f s; stopped it",
				 timeout_s);
	}
	n = recv(fd, rep, sizeof(*rep), 0);
	if (n != (ssize_t)sizeof(*rep) || rep->magic != RESIDUE_MAGIC) {
		e = n < 0 ? errno : 0;
		pthread_mutex_lock(&r->lock);
		helper_reap(r, true);
		pthread_mutex_unlock(&r->lock);
		if (n == 0 || e == ECONNRESET)
			return error_set(-EPIPE, "the residue helper died during the request");
		return error_set(-EPROTO, "the residue helper answered %zd bytes%s%s", n,
				 e ? ": " : "", e ? strerror(e) : "");
	}
	rep->message[sizeof(rep->message) - 1] = '\0';
	return 0;
}

/* A restore may be asked again of a new helper when the old one died with it
 * (the helper restores from whatever state it finds); a checkpoint may not. */
static int helper_call_held(struct residue *r, const struct residue_request *req,
			    double timeout_s, struct residue_reply *rep)
{
	int e;

	pthread_mutex_lock(&r->lock);
	r->helper_busy = true;
	pthread_mutex_unlock(&r->lock);
	e = helper_exchange(r, req, timeout_s, rep);
	/* the helper died during a restore: ask another (its start is logged) */
	if (e == -EPIPE && req->op == RESIDUE_OP_RESTORE)
		e = helper_exchange(r, req, timeout_s, rep);
	pthread_mutex_lock(&r->lock);
	r->helper_busy = false;
	pthread_mutex_unlock(&r->lock);
	return e;
}

static int helper_call(struct residue *r, const struct residue_request *req, double timeout_s,
		       struct residue_reply *rep)
{
	int e;

	pthread_mutex_lock(&r->io);
	e = helper_call_held(r, req, timeout_s, rep);
	pthread_mutex_unlock(&r->io);
	return e;
}

void residue_init(struct residue *r, struct backend *b, enum dormant_residue_mode mode,
		  unsigned lock_timeout_ms, unsigned timeout_ms)
{
	double floor_s = lock_timeout_ms / 1000.0 + HELPER_SLACK_S;

	*r = (struct residue){
		.mode = mode == DORMANT_RESIDUE_CHECKPOINT ? mode : DORMANT_RESIDUE_KEEP,
		.lock_timeout_ms = lock_timeout_ms,
		.request_timeout_s = timeout_ms / 1000.0 > floor_s ? timeout_ms / 1000.0 : floor_s,
		.backend = b,
		.helper_fd = -1,
	};
	pthread_rwlock_init(&r->device_access, NULL);
	pthread_mutex_init(&r->io, NULL);
	pthread_mutex_init(&r->lock, NULL);
}

void residue_finish(struct residue *r)
{
	pthread_mutex_lock(&r->lock);
	helper_reap(r, false);
	pthread_mutex_unlock(&r->lock);
	pthread_mutex_destroy(&r->lock);
	pthread_mutex_destroy(&r->io);
	pthread_rwlock_destroy(&r->device_access);
}

/* Set or clear the flag that stops device calls, once none is under way. */
static void freeze(struct residue *r, bool on)
{
	pthread_rwlock_wrlock(&r->device_access);
	atomic_store(&r->checkpointed, on);
	atomic_store(&r->backend->checkpointed, on);
	pthread_rwlock_unlock(&r->device_access);
}

bool residue_device_enter(struct residue *r)
{
	pthread_rwlock_rdlock(&r->device_access);
	if (!atomic_load(&r->checkpointed))
		return true;
	pthread_rwlock_unlock(&r->device_access);
	return false;
}

void residue_device_leave(struct residue *r)
{
	pthread_rwlock_unlock(&r->device_access);
}

static struct residue_request request(struct residue *r, enum residue_op op);

/* How long a read of free memory may take the helper. */
#define FREE_TIMEOUT_S 10.0

/* What the helper read last: a read that does not ask it. */
static int free_last(struct residue *r, int device, uint64_t *ret_free, uint64_t *ret_total)
{
	*ret_free = atomic_load(&r->outside_free[device]);
	*ret_total = atomic_load(&r->outside_total[device]);
	return *ret_total ? 0 : error_set(-EBUSY, "the residue helper is busy or not running");
}

bool residue_checkpointed(struct residue *r)
{
	return atomic_load(&r->checkpointed);
}

int residue_free_outside(struct residue *r, int device, bool start, uint64_t *ret_free,
			 uint64_t *ret_total)
{
	struct backend *b = r->backend;
	struct residue_request req = request(r, RESIDUE_OP_FREE);
	struct residue_reply rep = { 0 };
	int e;

	if (device < 0 || device >= DORMANT_DEVICES_MAX)
		return error_set(-ENODEV, "no device %d", device);
	if (!atomic_load(&r->checkpointed) || req.driver != RESIDUE_DRIVER_CUDA)
		return b->ops->free_outside ? b->ops->free_outside(b, device, ret_free, ret_total)
					    : error_set(-ENOTSUP, "the backend cannot read it");
	if (pthread_mutex_trylock(&r->io) != 0)
		return free_last(r, device, ret_free, ret_total); /* a checkpoint or restore is under way */
	if (!start) {
		bool running;

		pthread_mutex_lock(&r->lock);
		running = r->helper_pid > 0;
		pthread_mutex_unlock(&r->lock);
		if (!running) {
			pthread_mutex_unlock(&r->io);
			return free_last(r, device, ret_free, ret_total);
		}
	}
	req.device = device;
	e = helper_call_held(r, &req, FREE_TIMEOUT_S, &rep);
	pthread_mutex_unlock(&r->io);
	if (e == 0 && rep.result < 0)
		e = error_set(rep.result, "%s", rep.message);
	if (e < 0)
		return error_prefix(e, "reading device %d's memory through the residue helper",
				    device);
	atomic_store(&r->outside_free[device], rep.free_bytes);
	atomic_store(&r->outside_total[device], rep.total_bytes);
	*ret_free = rep.free_bytes;
	*ret_total = rep.total_bytes;
	return 0;
}

/* Free memory of each device as seen from outside the process (0 where it
 * cannot be read). */
static void free_read(struct residue *r, int devices, uint64_t free_bytes[DORMANT_DEVICES_MAX],
		      bool known[DORMANT_DEVICES_MAX])
{
	for (int d = 0; d < devices && d < DORMANT_DEVICES_MAX; d++) {
		uint64_t total;

		known[d] = residue_free_outside(r, d, true, &free_bytes[d], &total) == 0;
		if (!known[d])
			free_bytes[d] = 0;
	}
}

/* The outcome of a checkpoint or restore, into the stats and the
 * transition's step. With r->lock. */
static void record(struct residue *r, struct dormant_residue_step *step, const char *op,
		   int result, double seconds, const char *message)
{
	snprintf(r->last_op, sizeof(r->last_op), "%s", op);
	r->last_seq++;
	r->last_result = result;
	r->last_seconds = seconds;
	snprintf(r->last_error, sizeof(r->last_error), "%s", result < 0 ? message : "");
	memcpy(step->op, r->last_op, sizeof(step->op));
	step->result = result;
	step->seconds = seconds;
	memcpy(step->error, r->last_error, sizeof(step->error));
}

/* A request for the helper. A checkpoint or a restore carries the fault the
 * tests armed for it, for the helper to fail it with, in its own words: its
 * one check (backend_fault_due()), one call counted for each request built. */
static struct residue_request request(struct residue *r, enum residue_op op)
{
	enum dormant_fault_op fault_op = op == RESIDUE_OP_CHECKPOINT ? DORMANT_FAULT_CHECKPOINT
								     : DORMANT_FAULT_RESTORE;

	return (struct residue_request){
		.magic = RESIDUE_MAGIC,
		.op = op,
		.driver = strcmp(r->backend->ops->name, "cuda") == 0 ? RESIDUE_DRIVER_CUDA
								     : RESIDUE_DRIVER_HOST,
		.lock_timeout_ms = r->lock_timeout_ms,
		.fault = op == RESIDUE_OP_FREE ? 0 : backend_fault_due(r->backend, fault_op),
	};
}

int residue_checkpoint(struct residue *r, int devices, struct dormant_residue_step *step)
{
	uint64_t before[DORMANT_DEVICES_MAX] = { 0 }, after[DORMANT_DEVICES_MAX] = { 0 };
	bool known_before[DORMANT_DEVICES_MAX] = { 0 }, known_after[DORMANT_DEVICES_MAX] = { 0 };
	struct residue_reply rep = { 0 };
	struct residue_request req;
	double start = now_monotonic_s(), seconds;
	char message[DORMANT_ERROR_MAX];
	int e;

	pthread_mutex_lock(&r->lock);
	if (r->state == DORMANT_RESIDUE_UNAVAILABLE) {
		snprintf(message, sizeof(message), "%s", r->reason);
		pthread_mutex_unlock(&r->lock);
		return error_set(-ENOTSUP, "%s", message);
	}
	pthread_mutex_unlock(&r->lock);
	if (atomic_load(&r->checkpointed))
		return 0;
	free_read(r, devices, before, known_before);
	for (int d = 0; d < DORMANT_DEVICES_MAX; d++)
		r->used[d] = d < devices && r->backend->ops->device_active(r->backend, d);
	req = request(r, RESIDUE_OP_CHECKPOINT);
	/* from here no device call starts outside this thread */
	freeze(r, true);
	e = helper_call(r, &req, r->request_timeout_s, &rep);
	seconds = now_monotonic_s() - start;
	if (e < 0) {
		/* The helper died or hung mid-request: the driver may have done
		 * part of it. Stay frozen; the next wake's restore finds the
		 * state and undoes whatever was done (residue_helper.c). */
		snprintf(message, sizeof(message), "%s; the next wake restores", dormant_last_error());
		pthread_mutex_lock(&r->lock);
		r->state = DORMANT_RESIDUE_CHECKPOINTED;
		r->checkpoint_failures++;
		record(r, step, "checkpoint", e, seconds, message);
		pthread_mutex_unlock(&r->lock);
		return error_set(e, "%s", message);
	}
	if (rep.result < 0) {
		freeze(r, false);
		pthread_mutex_lock(&r->lock);
		r->checkpoint_failures++;
		record(r, step, "checkpoint", rep.result, seconds, rep.message);
		if (rep.result == -ENOTSUP) {
			r->state = DORMANT_RESIDUE_UNAVAILABLE;
			snprintf(r->reason, sizeof(r->reason), "%s", rep.message);
		}
		pthread_mutex_unlock(&r->lock);
		return error_set(rep.result, "%s", rep.message);
	}
	if (r->backend->ops->residue_checkpointed)
		r->backend->ops->residue_checkpointed(r->backend, true);
	free_read(r, devices, after, known_after);
	pthread_mutex_lock(&r->lock);
	r->state = DORMANT_RESIDUE_CHECKPOINTED;
	r->checkpoints++;
	r->checkpoint_s_total += seconds;
	for (int d = 0; d < DORMANT_DEVICES_MAX; d++)
		r->residue_bytes[d] = known_before[d] && known_after[d] && after[d] > before[d]
					      ? after[d] - before[d]
					      : 0;
	record(r, step, "checkpoint", 0, seconds, "");
	pthread_mutex_unlock(&r->lock);
	return 0;
}

int residue_restore(struct residue *r, int devices, const uint64_t need[DORMANT_DEVICES_MAX],
		    struct dormant_residue_step *step)
{
	uint64_t free_bytes[DORMANT_DEVICES_MAX] = { 0 };
	bool known[DORMANT_DEVICES_MAX] = { 0 };
	struct residue_reply rep = { 0 };
	struct residue_request req;
	char message[DORMANT_ERROR_MAX];
	double start = now_monotonic_s(), seconds;
	int e;

	if (!atomic_load(&r->checkpointed))
		return 0;
	pthread_mutex_lock(&r->lock);
	if (r->state == DORMANT_RESIDUE_STUCK) {
		snprintf(message, sizeof(message), "%s", r->reason);
		pthread_mutex_unlock(&r->lock);
		return error_set(-EPERM, "%s", message);
	}
	pthread_mutex_unlock(&r->lock);
	/* room first: a restore that runs out of memory cannot be retried */
	free_read(r, devices, free_bytes, known);
	for (int d = 0; d < devices && d < DORMANT_DEVICES_MAX; d++) {
		uint64_t want = r->residue_bytes[d] + need[d];

		if (!known[d] || free_bytes[d] >= want)
			continue;
		snprintf(message, sizeof(message),
			 "device %d has %.2f GiB free; restoring the process's residue (%.2f GiB) "
			 "and mapping this wake's memory (%.2f GiB) needs %.2f GiB: nothing was "
			 "tried, retry once it is free",
			 d, free_bytes[d] / 1073741824.0, r->residue_bytes[d] / 1073741824.0,
			 need[d] / 1073741824.0, want / 1073741824.0);
		pthread_mutex_lock(&r->lock);
		record(r, step, "restore", -ENOMEM, 0, message);
		pthread_mutex_unlock(&r->lock);
		return error_set(-ENOMEM, "%s", message);
	}
	req = request(r, RESIDUE_OP_RESTORE);
	e = helper_call(r, &req, r->request_timeout_s, &rep);
	seconds = now_monotonic_s() - start;
	if (e == 0 && rep.result == 0) {
		if (r->backend->ops->residue_checkpointed)
			r->backend->ops->residue_checkpointed(r->backend, false);
		freeze(r, false);
		pthread_mutex_lock(&r->lock);
		r->state = DORMANT_RESIDUE_RESIDENT;
		r->restores++;
		r->restore_s_total += seconds;
		record(r, step, "restore", 0, seconds, "");
		pthread_mutex_unlock(&r->lock);
		return 0;
	}
	if (e < 0) {
		rep.result = e;
		snprintf(rep.message, sizeof(rep.message), "%s", dormant_last_error());
	}
	pthread_mutex_lock(&r->lock);
	r->restore_failures++;
	if (rep.result == -ENOMEM) {
		/* NVIDIA/cuda-checkpoint #44: after a restore that ran out of
		 * memory the driver refuses every later one */
		r->state = DORMANT_RESIDUE_STUCK;
		snprintf(r->reason, sizeof(r->reason),
			 "a restore ran out of device memory (%.120s); the driver refuses every "
			 "later restore: only ending the process frees its device memory",
			 rep.message);
		snprintf(message, sizeof(message), "%s", r->reason);
		e = -EPERM;
	} else {
		snprintf(message, sizeof(message), "restoring the process's device state: %s",
			 rep.message);
		e = rep.result;
	}
	record(r, step, "restore", e, seconds, message);
	pthread_mutex_unlock(&r->lock);
	return error_set(e, "%s", message);
}

void residue_step_finish(struct residue *r, struct dormant_residue_step *step)
{
	if (step->mode == DORMANT_RESIDUE_DEFAULT)
		step->mode = r->mode;
	pthread_mutex_lock(&r->lock);
	step->state = r->state;
	pthread_mutex_unlock(&r->lock);
}

bool residue_start_take(struct residue *r, char *buf, size_t size, bool *ret_warning)
{
	bool started;

	pthread_mutex_lock(&r->lock);
	started = r->start_line[0] != '\0';
	if (started) {
		snprintf(buf, size, "%s", r->start_line);
		*ret_warning = r->start_warning;
		r->start_line[0] = '\0';
	}
	pthread_mutex_unlock(&r->lock);
	return started;
}

void residue_stats_get(struct residue *r, struct dormant_residue_stats *ret)
{
	memset(ret, 0, sizeof(*ret));
	pthread_mutex_lock(&r->lock);
	/* a helper that died while idle is reaped here, not left a zombie */
	if (!r->helper_busy && r->helper_pid > 0 &&
	    waitpid(r->helper_pid, NULL, WNOHANG) == r->helper_pid)
		helper_forget(r);
	ret->mode = r->mode;
	ret->state = r->state;
	memcpy(ret->reason, r->reason, sizeof(ret->reason));
	ret->helper_pid = (int)r->helper_pid;
	ret->helper_starts = r->helper_starts;
	ret->checkpoints = r->checkpoints;
	ret->checkpoint_failures = r->checkpoint_failures;
	ret->restores = r->restores;
	ret->restore_failures = r->restore_failures;
	ret->checkpoint_seconds_total = r->checkpoint_s_total;
	ret->restore_seconds_total = r->restore_s_total;
	for (int d = 0; d < DORMANT_DEVICES_MAX; d++)
		ret->residue_bytes += r->residue_bytes[d];
	memcpy(ret->last_op, r->last_op, sizeof(ret->last_op));
	ret->last_seq = r->last_seq;
	ret->last_result = r->last_result;
	ret->last_seconds = r->last_seconds;
	memcpy(ret->last_error, r->last_error, sizeof(ret->last_error));
	pthread_mutex_unlock(&r->lock);
	ret->calls_while_checkpointed = atomic_load(&r->backend->calls_checkpointed);
}
