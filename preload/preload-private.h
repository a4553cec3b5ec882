/* SPDX-License-Identifier: MIT */
/* What preload.c and tms.c share inside libdormant-preload.so. */
#ifndef DORMANT_PRELOAD_PRIVATE_H
#define DORMANT_PRELOAD_PRIVATE_H

#include <stdbool.h>
#include <stdint.h>

#include "dormant.h"

/* "1", "true", "yes", "on" (any case) are true, anything else false (NULL
 * too): as torch_memory_saver reads its boolean variables. */
bool preload_env_true(const char *value);

/* tms.c: whether waking tag (NULL: all) of m leaves at least margin bytes of
 * device memory free; -ENOMEM when not, 0 when it does or margin is 0. */
int tms_margin_check(struct dormant *m, const char *tag, uint64_t margin);
/* tms.c: wait until the host copies a release-mode wake of tag gave back are
 * back with the operating system (bounded). */
void tms_host_settle(struct dormant *m, const char *tag);
/* tms.c: whether cpu_backup_backend "mmap" was chosen in this process. */
bool tms_mmap_used(void);

#endif
