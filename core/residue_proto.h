/* SPDX-License-Identifier: MIT */
/*
 * The messages between libdormant and its residue helper
 * (dormant-residue-helper, residue_helper.c): one request, one reply, each a
 * fixed-size record on a SOCK_SEQPACKET socket pair (the helper's end is its
 * file descriptor 3). Both sides are built from the same tree, so the layout
 * is the same; the magic catches a helper from another build.
 *
 * The helper acts on its parent process only (getppid() when it starts): a
 * request names no process. It exits when the socket reads end-of-file, that
 * is when the trainer closes its end or dies.
 */
#ifndef DORMANT_RESIDUE_PROTO_H
#define DORMANT_RESIDUE_PROTO_H

#include <stdint.h>

#define RESIDUE_MAGIC 0x64726573u /* "dres" */
#define RESIDUE_HELPER_FD 3
#define RESIDUE_MESSAGE_MAX 200

enum residue_op {
	/* Lock the parent's CUDA API (bounded by lock_timeout_ms) and
	 * checkpoint its device state; a checkpoint that fails unlocks again. */
	RESIDUE_OP_CHECKPOINT = 1,
	/* Restore the parent's device state and unlock it. From LOCKED only
	 * unlocks; from RUNNING does nothing. */
	RESIDUE_OP_RESTORE,
	/* Read a device's free and total memory from outside the process
	 * (NVML, the device found by its PCI bus id): inside a checkpointed
	 * process a call into the driver's libraries waits for the restore. */
	RESIDUE_OP_FREE,
};

enum residue_driver {
	RESIDUE_DRIVER_HOST = 0, /* the simulated device: the helper only answers */
	RESIDUE_DRIVER_CUDA,     /* libcuda.so.1's cuCheckpointProcess* */
};

/* Process states as the driver reports them (CUprocessState). */
enum residue_process_state {
	RESIDUE_PROCESS_RUNNING = 0,
	RESIDUE_PROCESS_LOCKED,
	RESIDUE_PROCESS_CHECKPOINTED,
	RESIDUE_PROCESS_FAILED,
	RESIDUE_PROCESS_UNKNOWN = -1,
};

struct residue_request {
	uint32_t magic;
	uint32_t op;             /* enum residue_op */
	uint32_t driver;         /* enum residue_driver */
	uint32_t lock_timeout_ms;
	int32_t fault;           /* tests: non-zero, fail the op with this -errno
	                          * (-ETIMEDOUT: never answer, as a hung driver) */
	int32_t device;          /* RESIDUE_OP_FREE: the device's CUDA ordinal */
};

struct residue_reply {
	uint32_t magic;
	int32_t result;          /* 0 or a negative errno */
	int32_t driver_code;     /* the driver's result (CUresult), 0 if none */
	int32_t process_state;   /* enum residue_process_state after the op */
	double seconds;          /* time the driver calls took */
	uint64_t free_bytes;     /* RESIDUE_OP_FREE */
	uint64_t total_bytes;
	char message[RESIDUE_MESSAGE_MAX]; /* the driver's words on failure */
};

#endif
