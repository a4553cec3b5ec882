/* SPDX-License-Identifier: MIT */
/* The options object behind struct dormant_options (dormant.h): one field per
 * row of the table in options.c. */
#ifndef DORMANT_OPTIONS_H
#define DORMANT_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>

#include "dormant.h"

/* Adding an option: a field here and a row in options.c's table (the row
 * names the field, its type, default, environment variable and doc line).
 * Field types by option type: enum -> const char * (one of the row's static
 * values), path -> char[DORMANT_PATH_MAX] (inline: copied with the struct),
 * size -> size_t, int -> int, bool -> bool. */
struct dormant_options {
	const char *backend;
	const char *host_mode;
	size_t chunk_bytes;
	int guard_timeout_ms;
	int copy_threads; /* 0 after options_resolve(): min(online CPUs, 16) */
	size_t staging_bytes;
	bool pin_host;
	size_t pin_host_bytes;
	size_t pin_piece_bytes;
	int pin_threads;
	size_t reclaimable_pinned_bytes;
	int host_devices;
	size_t host_device_bytes;
	bool verify;
	bool skip_unchanged;
	bool parallel_devices;
	bool wake_overlap;
	int wake_map_threads;
	const char *wake_copy;
	size_t wake_copy_probe_bytes;
	size_t wake_copy_reprobe_bytes;
	char disk_dir[DORMANT_PATH_MAX]; /* "" after options_resolve(): $TMPDIR or /tmp */
	size_t disk_chunk_bytes;
	bool disk_names;
	const char *disk_read;
	const char *warmup;
	int warmup_settle_ms;
	const char *residue;
	int residue_lock_timeout_ms;
	int residue_timeout_ms;
	size_t host_residue_bytes;

	dormant_log_fn log_fn;
	void *log_userdata;
	/* which rows were set with dormant_options_set() */
	unsigned long long set;
	/* after options_resolve(): which rows took their value from o or from
	 * the environment, not from the table's default */
	unsigned long long given;
};

/*
 * Fill *ret with every option's effective value: what o set (o may be NULL),
 * else the row's environment variable when set and non-empty, else its
 * default. String fields of *ret point into o (keep o alive while *ret is in
 * use). Returns -EINVAL, with a message naming the variable and the option,
 * for a bad environment variable.
 */
int options_resolve(const struct dormant_options *o, struct dormant_options *ret);

/* Whether option name of a resolved o was set or came from the environment
 * (false: its default, or no such option). */
bool options_given(const struct dormant_options *o, const char *name);

/* Write option name of o as text (what dormant_options_set() takes) into buf.
 * Returns its length, -EINVAL (unknown name), -ENOSPC (buf too small). */
int options_format(const struct dormant_options *o, const char *name, char *buf, size_t size);

#endif
