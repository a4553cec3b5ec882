/* SPDX-License-Identifier: MIT */
/* The options of dormant_new(): one table says each option's name, type,
 * default, environment variable and doc line, and everything else (the
 * setters, the environment, the listing for docs and bindings) reads it. */
#include "options.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "option_table.h"
#include "transfer.h"
#include "util.h"

/* The rows' types and parser are common/option_table.h's (the server's
 * table shares them); a path field is char[DORMANT_PATH_MAX]. */
_Static_assert(OPTION_PATH_MAX == DORMANT_PATH_MAX, "path fields of one size");

#define FIELD(f) offsetof(struct dormant_options, f)
#define VALUES(...) ((const char *const[]){ __VA_ARGS__, NULL })

/* Adding an option: a row here and its field in options.h. Keep each
 * option's environment variable and default as documented in dormant.h. */
static const struct option_row options[] = {
	{
		.name = "backend", .type = OPTION_ENUM, .offset = FIELD(backend),
		.default_value = "auto", .env = "DORMANT_BACKEND",
		.values = VALUES("auto", "cuda", "host"),
		.doc = "device backend: cuda, host (a simulated device in host memory), or auto "
		       "(cuda when a device is usable, else host)",
	},
	{
		.name = "host_mode", .type = OPTION_ENUM, .offset = FIELD(host_mode),
		.default_value = "release", .default_doc = "release; reclaimable with residue=checkpoint",
		.env = "DORMANT_HOST_MODE", .values = VALUES("retain", "release", "reclaimable"),
		.doc = "host memory of kept tags: retain keeps pinned buffers across cycles "
		       "(fastest), release gives it back after each wake (leanest), "
		       "reclaimable unpins them after each wake for the kernel to take "
		       "(MADV_FREE) and reuses what it left at the next sleep (the default "
		       "under residue=checkpoint, whose unpinned copies would otherwise fault "
		       "in fresh memory at every sleep)",
	},
	{
		.name = "chunk_bytes", .type = OPTION_SIZE, .offset = FIELD(chunk_bytes),
		.default_value = "1GiB", .env = "DORMANT_CHUNK_BYTES", .min = 1,
		.doc = "largest physical chunk backing an allocation, rounded up to the "
		       "device granularity",
	},
	{
		.name = "guard_timeout_ms", .type = OPTION_INT, .offset = FIELD(guard_timeout_ms),
		.default_value = "30000", .min = INT_MIN, .max = INT_MAX,
		.doc = "how long a sleep waits for training steps to leave the guard before "
		       "failing with EBUSY (negative: forever; 0: not at all)",
	},
	{
		.name = "copy_threads", .type = OPTION_INT, .offset = FIELD(copy_threads),
		.default_doc = "min(online CPUs, 16)", .env = "DORMANT_COPY_THREADS", .min = 1,
		.max = 256,
		.doc = "host threads that fault in fresh host copies and do the host side of "
		       "unpinned copies",
	},
	{
		.name = "staging_bytes", .type = OPTION_SIZE, .offset = FIELD(staging_bytes),
		.default_value = "256MiB", .env = "DORMANT_STAGING_BYTES",
		.min = ENGINE_STAGING_SLOTS * 2 * MiB,
		.doc = "pinned staging ring for host copies that stay unpinned (allocated "
		       "only then)",
	},
	{
		.name = "pin_host", .type = OPTION_BOOL, .offset = FIELD(pin_host),
		.default_value = "true", .default_doc = "true; false with residue=checkpoint",
		.env = "DORMANT_PIN_HOST",
		.doc = "pin host copies (false: keep them in ordinary memory and copy through "
		       "the staging ring, where pinned memory is scarce, or under residue="
		       "checkpoint, whose checkpoint and restore take longer with every "
		       "registered host byte)",
	},
	{
		.name = "pin_host_bytes", .type = OPTION_SIZE, .offset = FIELD(pin_host_bytes),
		.default_value = "0", .env = "DORMANT_PIN_HOST_BYTES",
		.doc = "with pin_host false: host copies of up to this many bytes are pinned "
		       "anyway, spread through each sleep's copies, so that a wake's copy "
		       "engines take those while the CPU stages the others (0: none)",
	},
	{
		.name = "pin_piece_bytes", .type = OPTION_SIZE, .offset = FIELD(pin_piece_bytes),
		.default_value = "256MiB", .env = "DORMANT_PIN_PIECE_BYTES", .min = 4096,
		.multiple = 4096,
		.doc = "host copies are pinned, and copied, in pieces of this size",
	},
	{
		.name = "pin_threads", .type = OPTION_INT, .offset = FIELD(pin_threads),
		.default_value = "1", .env = "DORMANT_PIN_THREADS", .min = 1,
		.max = HOSTBUF_PIN_THREADS_MAX,
		.doc = "threads that pin the pieces of one host copy at once, in the warm-up "
		       "and the staging ring (1: one piece after another); a sleep pins each "
		       "piece just ahead of its copy",
	},
	{
		.name = "reclaimable_pinned_bytes", .type = OPTION_SIZE,
		.offset = FIELD(reclaimable_pinned_bytes), .default_value = "0",
		.env = "DORMANT_RECLAIMABLE_PINNED_BYTES",
		.doc = "host mode reclaimable: host copies of up to this many bytes stay pinned "
		       "after a wake (and are counted in host_bytes, as in retain mode), so that "
		       "the next sleep copies into them while it pins the others (0: none)",
	},
	{
		.name = "host_devices", .type = OPTION_INT, .offset = FIELD(host_devices),
		.default_value = "1", .env = "DORMANT_HOST_DEVICES", .min = 1,
		.max = DORMANT_DEVICES_MAX,
		.doc = "host backend only: number of simulated devices",
	},
	{
		.name = "host_device_bytes", .type = OPTION_SIZE, .offset = FIELD(host_device_bytes),
		.default_value = "64GiB", .env = "DORMANT_HOST_DEVICE_BYTES", .min = 1,
		.doc = "host backend only: memory of each simulated device",
	},
	{
		.name = "verify", .type = OPTION_BOOL, .offset = FIELD(verify),
		.default_value = "true", .env = "DORMANT_VERIFY",
		.doc = "check every restored chunk against its checksum after a wake "
		       "(dormant_set_verify() changes it later)",
	},
	{
		.name = "skip_unchanged", .type = OPTION_BOOL, .offset = FIELD(skip_unchanged),
		.default_value = "true", .env = "DORMANT_SKIP_UNCHANGED",
		.doc = "retain mode: a sleep copies no chunk whose checksum says it did not "
		       "change since the last wake",
	},
	{
		.name = "parallel_devices", .type = OPTION_BOOL, .offset = FIELD(parallel_devices),
		.default_value = "true", .env = "DORMANT_PARALLEL_DEVICES",
		.doc = "drive the devices of a transition at once (false: one after another)",
	},
	{
		.name = "wake_overlap", .type = OPTION_BOOL, .offset = FIELD(wake_overlap),
		.default_value = "true", .env = "DORMANT_WAKE_OVERLAP",
		.doc = "a wake maps chunks ahead of the copies (false: maps all, then copies)",
	},
	{
		.name = "wake_map_threads", .type = OPTION_INT, .offset = FIELD(wake_map_threads),
		.default_value = "1", .env = "DORMANT_WAKE_MAP_THREADS", .min = 1, .max = 8,
		.doc = "threads that map a wake's chunks ahead of the copies",
	},
	{
		.name = "wake_copy", .type = OPTION_ENUM, .offset = FIELD(wake_copy),
		.default_value = "auto", .env = "DORMANT_WAKE_COPY",
		.values = VALUES("auto", "engine", "kernel"),
		.doc = "what copies a wake's kept chunks to the device: engine (the copy "
		       "engines), kernel (a copy kernel on the SMs: full rate while the driver "
		       "scrubs memory another process freed), or auto (per wake, the faster as "
		       "measured on its first bytes)",
	},
	{
		.name = "wake_copy_probe_bytes", .type = OPTION_SIZE,
		.offset = FIELD(wake_copy_probe_bytes), .default_value = "64MiB",
		.env = "DORMANT_WAKE_COPY_PROBE_BYTES", .min = 4096,
		.doc = "wake_copy=auto: bytes timed on each of the copy engines and the copy "
		       "kernel before choosing",
	},
	{
		.name = "wake_copy_reprobe_bytes", .type = OPTION_SIZE,
		.offset = FIELD(wake_copy_reprobe_bytes), .default_value = "4GiB",
		.env = "DORMANT_WAKE_COPY_REPROBE_BYTES", .min = 4096,
		.doc = "wake_copy=auto, the kernel chosen: the most bytes it copies before the "
		       "copy engines are timed again (the scrub that slowed them ends; first "
		       "after 8 probes' bytes, then twice as many each time)",
	},
	{
		.name = "disk_dir", .type = OPTION_PATH, .offset = FIELD(disk_dir),
		.default_doc = "$TMPDIR, else /tmp", .env = "DORMANT_DISK_DIR",
		.doc = "directory of the disk copies of tags with policy disk "
		       "(dormant_set_disk_dir() changes it later)",
	},
	{
		.name = "disk_chunk_bytes", .type = OPTION_SIZE, .offset = FIELD(disk_chunk_bytes),
		.default_value = "64MiB", .env = "DORMANT_DISK_CHUNK_BYTES", .min = 4096,
		.multiple = 4096,
		.doc = "largest single read or write of a disk copy (at most a staging slot, "
		       "staging_bytes / 4)",
	},
	{
		.name = "disk_names", .type = OPTION_BOOL, .offset = FIELD(disk_names),
		.default_value = "false", .env = "DORMANT_DISK_NAMES",
		.doc = "give disk copies a name in disk_dir while they exist (a crash leaves "
		       "them behind; unnamed ones never outlive the process)",
	},
	{
		.name = "disk_read", .type = OPTION_ENUM, .offset = FIELD(disk_read),
		.default_value = "direct", .env = "DORMANT_DISK_READ",
		.values = VALUES("direct", "cached", "stream"),
		.doc = "how a wake reads disk copies: direct (O_DIRECT, around the page cache, "
		       "4 reads in flight), cached (through the page cache with the kernel's "
		       "read-ahead, 4 reads in flight, each piece dropped from the cache once "
		       "read) or stream (as cached, with one read in flight, in file order)",
	},
	{
		.name = "warmup", .type = OPTION_ENUM, .offset = FIELD(warmup),
		.default_value = "auto", .env = "DORMANT_WARMUP",
		.values = VALUES("auto", "device", "off"),
		.doc = "set up in the background, once allocations settle, what the first sleep "
		       "would: device streams and the checksum kernel (device), and also the "
		       "kept memory's host copies, pinned in retain mode, faulted in and "
		       "reclaimable in reclaimable mode (auto); off: the first sleep does it",
	},
	{
		.name = "warmup_settle_ms", .type = OPTION_INT, .offset = FIELD(warmup_settle_ms),
		.default_value = "2000", .env = "DORMANT_WARMUP_SETTLE_MS", .min = 0,
		.max = 3600000,
		.doc = "the warm-up starts once no allocation came for this long",
	},
	{
		.name = "residue", .type = OPTION_ENUM, .offset = FIELD(residue),
		.default_value = "keep", .env = "DORMANT_RESIDUE",
		.values = VALUES("keep", "checkpoint"),
		.doc = "what a sleep that leaves every tag asleep does with what the process "
		       "still holds on its devices (CUDA context, cuBLAS, NCCL): keep it, or "
		       "checkpoint it to host memory with the driver's process checkpoint "
		       "(restored by the next wake)",
	},
	{
		.name = "residue_lock_timeout_ms", .type = OPTION_INT,
		.offset = FIELD(residue_lock_timeout_ms), .default_value = "10000",
		.env = "DORMANT_RESIDUE_LOCK_TIMEOUT_MS", .min = 1, .max = 600000,
		.doc = "residue checkpoint: how long it waits for the process's threads to "
		       "leave their CUDA calls before it gives up (the residue then stays)",
	},
	{
		.name = "residue_timeout_ms", .type = OPTION_INT,
		.offset = FIELD(residue_timeout_ms), .default_value = "120000",
		.env = "DORMANT_RESIDUE_TIMEOUT_MS", .min = 1, .max = 3600000,
		.doc = "residue checkpoint: how long a checkpoint or a restore may take before "
		       "its helper is stopped (the checkpoint's residue stays, a restore is "
		       "tried again by the next wake); at least the lock's timeout and 5 s",
	},
	{
		.name = "host_residue_bytes", .type = OPTION_SIZE, .offset = FIELD(host_residue_bytes),
		.default_value = "0", .env = "DORMANT_HOST_RESIDUE_BYTES", .min = 0,
		.doc = "host backend only: what each used simulated device holds for the process "
		       "outside tags, as a CUDA context does (residue mode checkpoint frees it)",
	},
};

_Static_assert(ARRAY_SIZE(options) <= 64, "struct dormant_options.set has 64 bits");

static const struct option_row *option_find(const char *name, size_t *ret_index)
{
	return option_row_find(options, ARRAY_SIZE(options), name, ret_index);
}

/* "a|b|c" for every enum row, built once. */
static char enum_texts[ARRAY_SIZE(options)][128];
static pthread_once_t enum_texts_once = PTHREAD_ONCE_INIT;

static void enum_texts_build(void)
{
	for (size_t i = 0; i < ARRAY_SIZE(options); i++)
		if (options[i].type == OPTION_ENUM)
			option_values_text(&options[i], enum_texts[i], sizeof(enum_texts[i]));
}

/* ---- the public calls ---------------------------------------------------- */

DORMANT_EXPORT int dormant_options_new(struct dormant_options **ret)
{
	struct dormant_options *o;

	if (!ret)
		return error_set(-EINVAL, "ret is NULL");
	o = calloc(1, sizeof(*o));
	if (!o)
		return error_set(-ENOMEM, "out of host memory");
	*ret = o;
	return 0;
}

DORMANT_EXPORT void dormant_options_destroy(struct dormant_options *o)
{
	if (!o)
		return;
	free(o);
}

DORMANT_EXPORT int dormant_options_set(struct dormant_options *o, const char *name,
				       const char *value)
{
	struct dormant_options parsed;
	const struct option_row *opt;
	size_t i;
	int r;

	if (!o || !name)
		return error_set(-EINVAL, "%s is NULL", o ? "the option name" : "the options");
	opt = option_find(name, &i);
	if (!opt)
		return error_set(-EINVAL, "unknown option '%.64s'", name);
	if (!value) {
		o->set &= ~(1ull << i);
		return 0;
	}
	/* parse into a copy: a bad value leaves the option unchanged */
	parsed = *o;
	r = option_parse(opt, value, &parsed);
	if (r < 0)
		return error_prefix(r, "option %s", name);
	memcpy((char *)o + opt->offset, (char *)&parsed + opt->offset, option_field_size(opt->type));
	o->set |= 1ull << i;
	return 0;
}

DORMANT_EXPORT int dormant_options_set_int(struct dormant_options *o, const char *name,
					   long long value)
{
	const struct option_row *opt;
	char text[32];
	size_t i;
	int r;

	if (!o || !name)
		return error_set(-EINVAL, "%s is NULL", o ? "the option name" : "the options");
	opt = option_find(name, &i);
	if (!opt)
		return error_set(-EINVAL, "unknown option '%.64s'", name);
	r = option_number_text(opt, value, text, sizeof(text), "option");
	if (r < 0)
		return r;
	return dormant_options_set(o, name, text);
}

DORMANT_EXPORT int dormant_options_set_log(struct dormant_options *o, dormant_log_fn fn,
					   void *userdata)
{
	if (!o)
		return error_set(-EINVAL, "the options are NULL");
	o->log_fn = fn;
	o->log_userdata = userdata;
	return 0;
}

DORMANT_EXPORT const char *dormant_option_name(size_t i)
{
	return i < ARRAY_SIZE(options) ? options[i].name : NULL;
}

DORMANT_EXPORT const char *dormant_option_type(size_t i)
{
	return i < ARRAY_SIZE(options) ? option_type_name(options[i].type) : NULL;
}

DORMANT_EXPORT const char *dormant_option_values(size_t i)
{
	if (i >= ARRAY_SIZE(options) || options[i].type != OPTION_ENUM)
		return NULL;
	pthread_once(&enum_texts_once, enum_texts_build);
	return enum_texts[i];
}

DORMANT_EXPORT const char *dormant_option_default(size_t i)
{
	return i < ARRAY_SIZE(options) ? option_row_default_text(&options[i]) : NULL;
}

DORMANT_EXPORT const char *dormant_option_env(size_t i)
{
	return i < ARRAY_SIZE(options) ? options[i].env : NULL;
}

DORMANT_EXPORT const char *dormant_option_doc(size_t i)
{
	return i < ARRAY_SIZE(options) ? options[i].doc : NULL;
}

/* ---- for dormant_new() --------------------------------------------------- */

int options_resolve(const struct dormant_options *o, struct dormant_options *ret)
{
	struct dormant_options r = { 0 };
	unsigned long long from_env;
	int err;

	err = option_rows_resolve(options, ARRAY_SIZE(options), o, o ? o->set : 0, 0, &r,
				  &from_env, "option");
	if (err < 0)
		return err;
	if (o) {
		r.log_fn = o->log_fn;
		r.log_userdata = o->log_userdata;
	}
	r.set = o ? o->set : 0;
	r.given = r.set | from_env;
	*ret = r;
	return 0;
}

static int options_set_pair(void *o, const char *name, const char *value)
{
	return dormant_options_set(o, name, value);
}

/* Apply "name=value[,name=value...]" to o, in order, up to the first bad one. */
static int options_apply(struct dormant_options *o, const char *text)
{
	return option_text_apply(text, false, "option", options_set_pair, o);
}

DORMANT_EXPORT int dormant_options_parse(struct dormant_options *o, const char *text)
{
	struct dormant_options *scratch;
	int r;

	if (!o || !text)
		return error_set(-EINVAL, "%s is NULL", o ? "the text" : "the options");
	/* all or nothing: try every pair on a scratch object first */
	r = dormant_options_new(&scratch);
	if (r < 0)
		return r;
	r = options_apply(scratch, text);
	dormant_options_destroy(scratch);
	if (r < 0)
		return r;
	return options_apply(o, text);
}

bool options_given(const struct dormant_options *o, const char *name)
{
	size_t i;

	return option_find(name, &i) && (o->given & (1ull << i));
}

int options_format(const struct dormant_options *o, const char *name, char *buf, size_t size)
{
	const struct option_row *opt;
	size_t i;
	int n;

	if (!name || !buf)
		return error_set(-EINVAL, "%s is NULL", name ? "the buffer" : "the option name");
	opt = option_find(name, &i);
	if (!opt)
		return error_set(-EINVAL, "unknown option '%.64s'", name);
	n = option_format(opt, o, buf, size);
	if (n < 0 || (size_t)n >= size)
		return error_set(-ENOSPC, "the value of %s needs %d bytes", name, n + 1);
	return n;
}
