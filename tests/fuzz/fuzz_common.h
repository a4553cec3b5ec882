/* SPDX-License-Identifier: MIT */
/* What the libFuzzer harnesses share: the check that fails an input, and the
 * scene of the harnesses that drive a manager (request, server). */
#ifndef DORMANT_FUZZ_COMMON_H
#define DORMANT_FUZZ_COMMON_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

struct dormant;

/* A broken promise is a finding: say where, and let libFuzzer keep the input. */
#define CHECK(cond)                                                                \
	do {                                                                       \
		if (!(cond)) {                                                     \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__,     \
				__LINE__, #cond);                                  \
			abort();                                                   \
		}                                                                  \
	} while (0)

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

/* A manager on the host backend (16 MiB device, release mode) holding tag
 * "weights" (kept, 1 MiB of a known pattern) and tag "grads" (discarded,
 * 1 MiB). Aborts when it cannot be made. The caller owns it. */
struct dormant *fuzz_scene_new(void);

/* Wake every tag of the scene's manager (waiting out a transition a client
 * gave up on) and check that the weights hold their pattern: after a wake
 * that mapped memory, and every 256 calls anyway. */
void fuzz_scene_check(struct dormant *m);

#endif
