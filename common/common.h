/* SPDX-License-Identifier: MIT */
/*
 * What core/, api/, server/ and ctl/ share (a static library linked into
 * each, not part of the public API): the calling thread's error message
 * behind dormant_last_error(), clocks, the parsers of sizes and tag names,
 * and the discovery records' directory; option tables in option_table.h.
 * It includes nothing of core/, api/ or server/. The private headers of each
 * component stay with it.
 */
#ifndef DORMANT_COMMON_H
#define DORMANT_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* Limits the public headers promise, here so that common/ includes no header
 * of a component above it (tests/common/test_common.c checks at build time
 * that they agree with core/dormant.h's). */
#define COMMON_ERROR_MAX 256 /* DORMANT_ERROR_MAX: a message, its NUL included */
#define COMMON_TAG_MAX 63    /* DORMANT_TAG_MAX */

/* What libdormant exports (DORMANT_EXPORT): the build hides all else. */
#if defined(__GNUC__)
#define COMMON_EXPORT __attribute__((visibility("default")))
#else
#define COMMON_EXPORT
#endif

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

#if defined(__GNUC__)
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define PRINTF_LIKE(f, a)
#endif

static inline size_t round_up(size_t value, size_t multiple)
{
	return (value + multiple - 1) / multiple * multiple;
}

/* ---- errors (error.c) ---------------------------------------------------- */

/* Record a message for the calling thread's dormant_last_error() and return
 * err (a negative errno), so that `return error_set(-EINVAL, "...")` works. */
int error_set(int err, const char *fmt, ...) PRINTF_LIKE(2, 3);

/* Prepend context to the calling thread's current message: "ctx: old". */
int error_prefix(int err, const char *fmt, ...) PRINTF_LIKE(2, 3);

/* The calling thread's message (what dormant_last_error() returns). */
const char *error_text(void);

/* Forget the calling thread's message. */
void error_clear(void);

/* The public face of error_text(), declared in core/dormant.h. */
COMMON_EXPORT const char *dormant_last_error(void);

/* ---- clocks (clock.c) ---------------------------------------------------- */

/* Seconds on the monotonic clock and on the wall clock. */
double now_monotonic_s(void);
double now_unix_s(void);

/* ---- parsers (parse.c) --------------------------------------------------- */

/* Valid tag: 1..COMMON_TAG_MAX characters of [A-Za-z0-9_.:-]. */
int tag_name_check(const char *tag);

/* Read a size like "64MiB", "1G", "4096" into *ret; -EINVAL otherwise. */
int size_parse(const char *text, size_t *ret);

/* ---- discovery records (runtime.c) --------------------------------------- */

/* The directory of the discovery records: dir when given, else
 * $DORMANT_RUNTIME_DIR, else $XDG_RUNTIME_DIR/dormant, else /tmp/dormant-UID
 * (then *shared_tmp, unless NULL, is true: a directory everyone may create,
 * whose owner must be checked). -ENAMETOOLONG when it does not fit in size. */
int runtime_dir_name(const char *dir, char *ret, size_t size, bool *shared_tmp);

/* Open the discovery directory path (no symbolic link) and check that it
 * may be trusted: a directory owned by this process's effective user and
 * writable by no one else (group or others), so that no other local user can
 * plant, swap or remove records in it. Returns the directory's descriptor
 * (O_CLOEXEC), or a negative errno with a message of one line naming path
 * and the reason: -ENOENT, -ENOTDIR, -ELOOP (a link), -EPERM (another
 * user's, or writable by others), or the errno of open(). */
int runtime_dir_open(const char *path);

/* Read record name of the directory dirfd into buf (at most size - 1 bytes,
 * NUL-terminated), opened without following a link and without blocking (a
 * FIFO never hangs the reader): it must be a regular file owned by this
 * process's effective user, writable by no one else, at most size - 1
 * bytes. Returns its length, or a negative errno with the reason as the
 * message (without the path): -ENOENT (removed meanwhile), -ELOOP, -EPERM,
 * -EINVAL (not a regular file), -EFBIG, or the errno of open() or read(). */
long runtime_record_read(int dirfd, const char *name, char *buf, size_t size);

/* Whether pid is a live process of this effective user that started at
 * start_ticks (process_start_ticks()): pid 1 never is, nor a reused pid. */
bool runtime_process_live(long long pid, long long start_ticks);

/* The start time of process pid (0: this process) in clock ticks since boot,
 * field 22 of its /proc stat: with the pid it names a process even after the
 * pid is reused. -1 when it cannot be read (no /proc, another user's process
 * under hidepid). */
long long process_start_ticks(long long pid);

#endif
