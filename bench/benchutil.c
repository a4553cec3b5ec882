/* SPDX-License-Identifier: MIT */
#include "benchutil.h"

#include <assert.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "dormant.h"

/* ---- JSON ---------------------------------------------------------------- */

void json_out_init(struct json_out *j, FILE *f)
{
	memset(j, 0, sizeof(*j));
	j->f = f;
	j->first[0] = true;
}

static void write_escaped(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", f);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

/* Comma, newline and indentation before a member, then its key. */
static void member(struct json_out *j, const char *key)
{
	if (j->depth > 0) {
		if (!j->first[j->depth])
			fputc(',', j->f);
		fputc('\n', j->f);
		for (int i = 0; i < j->depth; i++)
			fputs("  ", j->f);
	}
	j->first[j->depth] = false;
	if (key) {
		write_escaped(j->f, key);
		fputs(": ", j->f);
	}
}

static void open_container(struct json_out *j, const char *key, char c)
{
	member(j, key);
	fputc(c, j->f);
	assert(j->depth + 1 < JSON_OUT_DEPTH_MAX);
	j->depth++;
	j->first[j->depth] = true;
}

static void close_container(struct json_out *j, char c)
{
	bool empty = j->first[j->depth];

	assert(j->depth > 0);
	j->depth--;
	if (!empty) {
		fputc('\n', j->f);
		for (int i = 0; i < j->depth; i++)
			fputs("  ", j->f);
	}
	fputc(c, j->f);
}

void json_out_object_begin(struct json_out *j, const char *key)
{
	open_container(j, key, '{');
}

void json_out_object_end(struct json_out *j)
{
	close_container(j, '}');
}

void json_out_array_begin(struct json_out *j, const char *key)
{
	open_container(j, key, '[');
}

void json_out_array_end(struct json_out *j)
{
	close_container(j, ']');
}

void json_out_string(struct json_out *j, const char *key, const char *value)
{
	member(j, key);
	if (value)
		write_escaped(j->f, value);
	else
		fputs("null", j->f);
}

void json_out_u64(struct json_out *j, const char *key, uint64_t value)
{
	member(j, key);
	fprintf(j->f, "%" PRIu64, value);
}

void json_out_i64(struct json_out *j, const char *key, int64_t value)
{
	member(j, key);
	fprintf(j->f, "%" PRId64, value);
}

void json_out_double(struct json_out *j, const char *key, double value)
{
	member(j, key);
	if (isfinite(value))
		fprintf(j->f, "%.9g", value);
	else
		fputs("null", j->f);
}

void json_out_bool(struct json_out *j, const char *key, bool value)
{
	member(j, key);
	fputs(value ? "true" : "false", j->f);
}

void json_out_null(struct json_out *j, const char *key)
{
	member(j, key);
	fputs("null", j->f);
}

void json_out_finish(struct json_out *j)
{
	assert(j->depth == 0);
	fputc('\n', j->f);
	fflush(j->f);
}

/* ---- numbers ------------------------------------------------------------- */

const char *bytes_human(uint64_t bytes, char *buf, size_t size)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB" };
	double value = (double)bytes;
	int unit = -1;

	while (value >= 1024 && unit + 1 < (int)(sizeof(units) / sizeof(units[0]))) {
		value /= 1024;
		unit++;
	}
	if (unit < 0)
		snprintf(buf, size, "%" PRIu64 " B", bytes);
	else
		snprintf(buf, size, "%.*f %s", value < 100 ? 2 : 1, value, units[unit]);
	return buf;
}

static int compare_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double median(const double *values, size_t count)
{
	double *sorted, result;

	if (count == 0)
		return NAN;
	for (size_t i = 0; i < count; i++)
		if (isnan(values[i]))
			return NAN;
	sorted = malloc(count * sizeof(*sorted));
	if (!sorted)
		return NAN;
	memcpy(sorted, values, count * sizeof(*sorted));
	qsort(sorted, count, sizeof(*sorted), compare_double);
	result = count % 2 ? sorted[count / 2] : (sorted[count / 2 - 1] + sorted[count / 2]) / 2;
	free(sorted);
	return result;
}

double process_cpu_s(void)
{
	struct rusage ru;

	if (getrusage(RUSAGE_SELF, &ru) < 0)
		return NAN;
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

void proc_kib_fields(const char *path, const char *const *names, uint64_t *out, size_t n)
{
	char line[256];
	FILE *f = fopen(path, "r");

	for (size_t i = 0; i < n; i++)
		out[i] = UINT64_MAX;
	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		for (size_t i = 0; i < n; i++) {
			size_t len = strlen(names[i]);

			if (strncmp(line, names[i], len) == 0 && line[len] == ':')
				out[i] = strtoull(line + len + 1, NULL, 10) * 1024;
		}
	fclose(f);
}

static uint64_t meminfo_field(const char *name)
{
	uint64_t bytes;

	proc_kib_fields("/proc/meminfo", &name, &bytes, 1);
	return bytes == UINT64_MAX ? 0 : bytes;
}

uint64_t host_mem_total(void)
{
	return meminfo_field("MemTotal");
}

uint64_t host_mem_available(void)
{
	return meminfo_field("MemAvailable");
}

int number_parse(const char *text, unsigned long long min, unsigned long long max,
		 unsigned long long *ret)
{
	unsigned long long value;
	char *end;

	if (!text || *text < '0' || *text > '9')
		return -1;
	errno = 0;
	value = strtoull(text, &end, 10);
	if (errno || *end || value < min || value > max)
		return -1;
	*ret = value;
	return 0;
}

/* ---- errors -------------------------------------------------------------- */

const char *bench_program = "bench";

static int report(const char *fmt, va_list ap, const char *why)
{
	fprintf(stderr, "%s: ", bench_program);
	vfprintf(stderr, fmt, ap);
	if (why)
		fprintf(stderr, ": %s", why[0] ? why : "unknown error");
	fputc('\n', stderr);
	return -1;
}

int bench_fail(const char *fmt, ...)
{
	va_list ap;
	int r;

	va_start(ap, fmt);
	r = report(fmt, ap, NULL);
	va_end(ap);
	return r;
}

int bench_flag_error(int opt, char **argv, const struct option *longopts)
{
	const char *arg = argv[optind - 1];

	if (opt == ':') {
		for (const struct option *o = longopts; o->name; o++)
			if (o->val == optopt)
				return bench_fail("option --%s needs a value (%s --help lists the options)",
						  o->name, bench_program);
		return bench_fail("option '%s' needs a value (%s --help lists the options)", arg,
				  bench_program);
	}
	/* a short option's character is in optopt, a long one's text only in argv */
	if (optopt > 0 && optopt < 128 && strncmp(arg, "--", 2) != 0)
		return bench_fail("unknown option '-%c' (%s --help lists the options)", optopt,
				  bench_program);
	return bench_fail("unknown option '%s' (%s --help lists the options)", arg, bench_program);
}

int bench_fail_lib(const char *fmt, ...)
{
	const char *why = dormant_last_error();
	va_list ap;
	int r;

	va_start(ap, fmt);
	r = report(fmt, ap, why);
	va_end(ap);
	return r;
}
