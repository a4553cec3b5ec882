/* SPDX-License-Identifier: MIT */
/*
 * A stand-in libnccl for the Python tests of dormant.nccl: the symbols of
 * NCCL's suspend API (ncclGetVersion, ncclCommSuspend, ncclCommResume,
 * ncclCommMemStats, ncclGetErrorString), each call recorded, able to fail or
 * to hang (as a suspend whose peers never come does, in its bootstrap
 * barrier) on demand. Built twice: as NCCL 2.29.7, and with
 * -DFAKE_NCCL_OLD as NCCL 2.28.9, which has no suspend.
 *
 * The fake_nccl_* functions drive it from the tests (ctypes). A
 * communicator is any non-zero pointer value; its state is kept in a small
 * table.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

/* NCCL's (src/nccl.h.in, with int for ncclResult_t and the enums) */
int ncclGetVersion(int *version);
const char *ncclGetErrorString(int result);
int ncclCommSuspend(void *comm, int flags);
int ncclCommResume(void *comm);
int ncclCommMemStats(void *comm, int stat, uint64_t *value);
/* the tests' */
void fake_nccl_reset(void);
const char *fake_nccl_calls(void);
void fake_nccl_hang(const char *op, int on);
void fake_nccl_release(void);
void fake_nccl_fail(const char *op, int result, void *comm);
int fake_nccl_suspended(void *comm);
#define COMMS_MAX 64

enum { SUCCESS = 0, INVALID_ARGUMENT = 4, INVALID_USAGE = 5 };
enum { STAT_SUSPEND = 0, STAT_SUSPENDED = 1, STAT_PERSIST = 2, STAT_TOTAL = 3 };

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t released = PTHREAD_COND_INITIALIZER;
static char calls[8192];
static int hang_suspend, hang_resume, release_count;
static int fail_suspend, fail_resume;          /* result to return, 0: none */
static uintptr_t fail_comm;                    /* fail only this one (0: any) */
static __attribute__((unused)) uint64_t suspend_bytes = 430ull << 20;  /* per communicator */
static __attribute__((unused)) uint64_t persist_bytes = 2ull << 20;
static struct {
	uintptr_t comm;
	int suspended;
} comms[COMMS_MAX];

static int *state_of(uintptr_t comm)
{
	for (int i = 0; i < COMMS_MAX; i++)
		if (comms[i].comm == comm)
			return &comms[i].suspended;
	for (int i = 0; i < COMMS_MAX; i++)
		if (comms[i].comm == 0) {
			comms[i].comm = comm;
			return &comms[i].suspended;
		}
	return NULL;
}

static __attribute__((unused)) void record(const char *op, uintptr_t comm)
{
	size_t used = strlen(calls);

	snprintf(calls + used, sizeof(calls) - used, "%s%s:%#lx", used ? "," : "", op,
		 (unsigned long)comm);
}

/* Wait while *flag and no fake_nccl_release() came since; called with lock. */
static __attribute__((unused)) void hang_while(const int *flag)
{
	int seen = release_count;

	while (*flag && seen == release_count)
		pthread_cond_wait(&released, &lock);
}

EXPORT int ncclGetVersion(int *version)
{
	if (!version)
		return INVALID_ARGUMENT;
#ifdef FAKE_NCCL_OLD
	*version = 22809;
#else
	*version = 22907;
#endif
	return SUCCESS;
}

EXPORT const char *ncclGetErrorString(int result)
{
	switch (result) {
	case INVALID_ARGUMENT:
		return "invalid argument";
	case INVALID_USAGE:
		return "invalid usage";
	default:
		return "unhandled system error";
	}
}

#ifndef FAKE_NCCL_OLD
static int change(uintptr_t comm, int suspend)
{
	int *state, r = SUCCESS;

	pthread_mutex_lock(&lock);
	record(suspend ? "suspend" : "resume", comm);
	hang_while(suspend ? &hang_suspend : &hang_resume);
	state = state_of(comm);
	if (!comm || !state)
		r = INVALID_ARGUMENT;
	else if ((suspend ? fail_suspend : fail_resume) && (!fail_comm || fail_comm == comm))
		r = suspend ? fail_suspend : fail_resume;
	else if (*state == suspend)
		r = INVALID_USAGE; /* NCCL: "Already suspended" */
	else
		*state = suspend;
	pthread_mutex_unlock(&lock);
	return r;
}

EXPORT int ncclCommSuspend(void *comm, int flags)
{
	if (flags != 1)
		return INVALID_ARGUMENT;
	return change((uintptr_t)comm, 1);
}

EXPORT int ncclCommResume(void *comm)
{
	return change((uintptr_t)comm, 0);
}

EXPORT int ncclCommMemStats(void *comm, int stat, uint64_t *value)
{
	int *state;

	if (!comm || !value)
		return INVALID_ARGUMENT;
	pthread_mutex_lock(&lock);
	state = state_of((uintptr_t)comm);
	switch (stat) {
	case STAT_SUSPEND:
		*value = suspend_bytes;
		break;
	case STAT_SUSPENDED:
		*value = state ? (uint64_t)*state : 0;
		break;
	case STAT_PERSIST:
		*value = persist_bytes;
		break;
	case STAT_TOTAL:
		*value = suspend_bytes + persist_bytes;
		break;
	default:
		pthread_mutex_unlock(&lock);
		return INVALID_ARGUMENT;
	}
	pthread_mutex_unlock(&lock);
	return SUCCESS;
}
#endif

/* ---- what the tests drive -------------------------------------------------- */

EXPORT void fake_nccl_reset(void)
{
	pthread_mutex_lock(&lock);
	calls[0] = '\0';
	hang_suspend = hang_resume = 0;
	fail_suspend = fail_resume = 0;
	fail_comm = 0;
	memset(comms, 0, sizeof(comms));
	release_count++;
	pthread_cond_broadcast(&released);
	pthread_mutex_unlock(&lock);
}

/* The calls so far: "suspend:0x10,resume:0x10,..." */
EXPORT const char *fake_nccl_calls(void)
{
	return calls;
}

/* op "suspend" or "resume": hang (1) or not (0) from the next call on. */
EXPORT void fake_nccl_hang(const char *op, int on)
{
	pthread_mutex_lock(&lock);
	*(strcmp(op, "suspend") == 0 ? &hang_suspend : &hang_resume) = on;
	pthread_mutex_unlock(&lock);
}

/* Let every hanging call go on (as peers arriving at the barrier). */
EXPORT void fake_nccl_release(void)
{
	pthread_mutex_lock(&lock);
	hang_suspend = hang_resume = 0;
	release_count++;
	pthread_cond_broadcast(&released);
	pthread_mutex_unlock(&lock);
}

/* op's calls (on comm, or on any if 0) return result (0: succeed). */
EXPORT void fake_nccl_fail(const char *op, int result, void *comm)
{
	pthread_mutex_lock(&lock);
	*(strcmp(op, "suspend") == 0 ? &fail_suspend : &fail_resume) = result;
	fail_comm = (uintptr_t)comm;
	pthread_mutex_unlock(&lock);
}

EXPORT int fake_nccl_suspended(void *comm)
{
	int *state, r;

	pthread_mutex_lock(&lock);
	state = state_of((uintptr_t)comm);
	r = state ? *state : -1;
	pthread_mutex_unlock(&lock);
	return r;
}
