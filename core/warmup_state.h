/* SPDX-License-Identifier: MIT */
/* The warm-up's state (warmup.h), held in struct dormant: below the
 * manager's data (manager_state.h), which warmup.c reads. */
#ifndef DORMANT_WARMUP_STATE_H
#define DORMANT_WARMUP_STATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "dormant.h"

enum warmup_mode {
	WARMUP_OFF,
	WARMUP_DEVICE, /* devices only */
	WARMUP_AUTO,   /* devices, and host copies in retain and reclaimable modes */
};

/* Everything below but cancel: under the manager lock. */
struct warmup {
	enum warmup_mode mode;
	int settle_ms;
	pthread_cond_t cond;  /* runs end, allocations come, transitions end, stop */
	pthread_t thread;
	bool thread_started;
	bool stopping;        /* the manager goes: the thread exits */
	bool pending;         /* an allocation came since the last run */
	double last_alloc_s;  /* monotonic */
	bool running;         /* a run holds the engine */
	atomic_bool cancel;   /* a transition (or the manager's end) waits for it */
	struct dormant_warmup_stats stats; /* but state and device_setups */
};

#endif
