/* SPDX-License-Identifier: MIT */
/*
 * What the benchmark programs share: a small JSON writer (the programs emit
 * flat, known shapes, so no JSON library is needed), human-readable sizes,
 * medians, process CPU time and the host's memory figures.
 */
#ifndef DORMANT_BENCHUTIL_H
#define DORMANT_BENCHUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"

#define JSON_OUT_DEPTH_MAX 16

/* Writes one JSON document to f, pretty-printed. Keys are NULL inside
 * arrays. Non-finite numbers are written as null. */
struct json_out {
	FILE *f;
	int depth;
	bool first[JSON_OUT_DEPTH_MAX];
};

void json_out_init(struct json_out *j, FILE *f);
void json_out_object_begin(struct json_out *j, const char *key);
void json_out_object_end(struct json_out *j);
void json_out_array_begin(struct json_out *j, const char *key);
void json_out_array_end(struct json_out *j);
void json_out_string(struct json_out *j, const char *key, const char *value);
void json_out_u64(struct json_out *j, const char *key, uint64_t value);
void json_out_i64(struct json_out *j, const char *key, int64_t value);
void json_out_double(struct json_out *j, const char *key, double value);
void json_out_bool(struct json_out *j, const char *key, bool value);
void json_out_null(struct json_out *j, const char *key);
/* Ends the document with a newline. */
void json_out_finish(struct json_out *j);

/* "16.00 GiB", "64.0 MiB", "512 B": into buf, which is returned. */
const char *bytes_human(uint64_t bytes, char *buf, size_t size);

/* Median of values[0..count); NAN when count is 0 or any value is NaN.
 * values is not modified. */
double median(const double *values, size_t count);

/* User plus system CPU seconds of the whole process (all threads). */
double process_cpu_s(void);

/* The "Name:   123 kB" fields names[0..n) of a /proc file (meminfo,
 * smaps_rollup) in bytes, read at once; UINT64_MAX for one not there (or
 * the file unreadable). */
void proc_kib_fields(const char *path, const char *const *names, uint64_t *out, size_t n);
/* MemTotal and MemAvailable of /proc/meminfo in bytes; 0 if unknown. */
uint64_t host_mem_total(void);
uint64_t host_mem_available(void);

/* The program's name, for bench_fail() messages. */
extern const char *bench_program;

/* Print "<program>: <what>" on stderr and return -1. */
int bench_fail(const char *fmt, ...) PRINTF_LIKE(1, 2);
/* The same, followed by ": " and the library's message. */
int bench_fail_lib(const char *fmt, ...) PRINTF_LIKE(1, 2);

struct option;
/* For getopt_long() run with opterr 0 and an option string that starts
 * with ':': say in one line why the flag getopt_long() returned opt for
 * (':' a missing value, anything else an unknown option) is wrong, and
 * return -1. */
int bench_flag_error(int opt, char **argv, const struct option *longopts);

/* Parse a whole decimal number in [min, max] into *ret; -1 otherwise. */
int number_parse(const char *text, unsigned long long min, unsigned long long max,
		 unsigned long long *ret);

#endif
