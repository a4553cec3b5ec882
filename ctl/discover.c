/* SPDX-License-Identifier: MIT */
/* Endpoints from discovery records (discover.h). */
#include "discover.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

#define RECORD_VERSION 1

__attribute__((format(printf, 4, 5)))
static int fail(char *err, size_t err_size, int error, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, err_size, fmt, ap);
	va_end(ap);
	return error;
}

int ctl_discovery_dir(const char *dir, char *ret, size_t size, char *err, size_t err_size)
{
	if (runtime_dir_name(dir, ret, size, NULL) < 0)
		return fail(err, err_size, -ENAMETOOLONG, "the discovery directory name is too long");
	return 0;
}

struct record {
	char *file;
	char *url;
	long long pid, rank, local_rank; /* -1: unknown */
};

/* Whether the process that wrote the record is gone. */
static bool record_stale(long long pid, json_t *start_ticks)
{
	long long ticks;

	if (kill((pid_t)pid, 0) < 0 && errno == ESRCH)
		return true;
	if (!json_is_integer(start_ticks))
		return false;
	ticks = process_start_ticks(pid);
	/* the pid was reused by another process */
	return ticks > 0 && ticks != json_integer_value(start_ticks);
}

static long long optional_integer(json_t *doc, const char *key, bool *bad)
{
	json_t *v = json_object_get(doc, key);

	if (!v || json_is_null(v))
		return -1;
	if (!json_is_integer(v) || json_integer_value(v) < 0) {
		*bad = true;
		return -1;
	}
	return json_integer_value(v);
}

/*
 * Read one record. Returns 1 (added to *ret), 0 (skipped: stale, or another
 * role), or -EINVAL with err saying what is wrong with the file.
 */
static int record_read(const char *dir, const char *name, const char *role, struct record *ret,
		       bool *ret_stale, char *err, size_t err_size)
{
	char path[PATH_MAX + 256], text[CTL_RECORD_MAX + 1];
	json_error_t error;
	json_t *doc, *v;
	const char *url, *why = NULL;
	bool bad = false;
	size_t len;
	FILE *f;
	int r = 0;

	*ret_stale = false;
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "re");
	if (!f) {
		/* removed between the listing and now: its server stopped */
		if (errno == ENOENT)
			return 0;
		return fail(err, err_size, -EINVAL, "%s: %s", path, strerror(errno));
	}
	len = fread(text, 1, sizeof(text), f);
	fclose(f);
	if (len > CTL_RECORD_MAX)
		return fail(err, err_size, -EINVAL,
			    "%s: not a dormant discovery record (larger than %d bytes)", path,
			    CTL_RECORD_MAX);
	doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &error);
	if (!doc)
		return fail(err, err_size, -EINVAL,
			    "%s: not a dormant discovery record (malformed JSON at byte %d: %s)",
			    path, error.position, error.text);
	v = json_object_get(doc, "version");
	url = json_string_value(json_object_get(doc, "url"));
	if (!json_is_object(doc))
		why = "not a JSON object";
	else if (!json_is_integer(v))
		why = "no integer \"version\"";
	else if (json_integer_value(v) != RECORD_VERSION)
		why = "a \"version\" this dormantctl does not know (upgrade it)";
	else if (!json_is_integer(json_object_get(doc, "pid")) ||
		 json_integer_value(json_object_get(doc, "pid")) <= 0 ||
		 json_integer_value(json_object_get(doc, "pid")) > INT_MAX)
		why = "no positive integer \"pid\"";
	else if (!url || strlen(url) >= CTL_SPEC_MAX ||
		 (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0 &&
		  strncmp(url, "unix:", 5) != 0))
		why = "no \"url\" (http://HOST:PORT or unix:PATH)";
	else if ((v = json_object_get(doc, "role")) && !json_is_null(v) && !json_is_string(v))
		why = "\"role\" is neither a string nor null";
	if (!why) {
		ret->rank = optional_integer(doc, "rank", &bad);
		ret->local_rank = optional_integer(doc, "local_rank", &bad);
		optional_integer(doc, "start_ticks", &bad);
		if (bad)
			why = "\"rank\", \"local_rank\" or \"start_ticks\" is not a whole number or null";
	}
	if (why) {
		r = fail(err, err_size, -EINVAL, "%s: not a dormant discovery record (%s)", path,
			 why);
		goto out;
	}
	ret->pid = json_integer_value(json_object_get(doc, "pid"));
	if (record_stale(ret->pid, json_object_get(doc, "start_ticks"))) {
		*ret_stale = true;
		goto out;
	}
	v = json_object_get(doc, "role");
	if (role && (!json_is_string(v) || strcmp(json_string_value(v), role) != 0))
		goto out;
	ret->file = strdup(name);
	ret->url = strdup(url);
	if (!ret->file || !ret->url) {
		free(ret->file);
		free(ret->url);
		r = fail(err, err_size, -ENOMEM, "out of memory");
		goto out;
	}
	r = 1;
out:
	json_decref(doc);
	return r;
}

/* Unknown ranks last; then the pid, then the file name. */
static int record_order(const void *a, const void *b)
{
	const struct record *x = a, *y = b;
	unsigned long long xr = (unsigned long long)x->rank, yr = (unsigned long long)y->rank;
	unsigned long long xl = (unsigned long long)x->local_rank;
	unsigned long long yl = (unsigned long long)y->local_rank;

	if (xr != yr)
		return xr < yr ? -1 : 1;
	if (xl != yl)
		return xl < yl ? -1 : 1;
	if (x->pid != y->pid)
		return x->pid < y->pid ? -1 : 1;
	return strcmp(x->file, y->file);
}

static bool is_record_name(const char *name)
{
	size_t len = strlen(name);

	return name[0] != '.' && len > 5 && strcmp(name + len - 5, ".json") == 0;
}

int ctl_endpoints_add_discovered(struct ctl_endpoints *list, const char *dir, const char *role,
				 size_t *ret_stale, char *err, size_t err_size)
{
	char directory[PATH_MAX];
	struct record *records = NULL, *grown;
	size_t count = 0, capacity = 0, stale = 0;
	struct dirent *entry;
	DIR *d;
	int r, added = 0;

	r = ctl_discovery_dir(dir, directory, sizeof(directory), err, err_size);
	if (r < 0)
		return r;
	d = opendir(directory);
	if (!d)
		return fail(err, err_size, errno == ENOENT ? -ENOENT : -EINVAL,
			    "the discovery directory %s: %s", directory, strerror(errno));
	while ((entry = readdir(d))) {
		struct record rec = { 0 };
		bool was_stale;

		if (!is_record_name(entry->d_name))
			continue;
		if (count == capacity) {
			capacity = capacity ? capacity * 2 : 16;
			if (capacity > CTL_ENDPOINTS_MAX) {
				r = fail(err, err_size, -E2BIG, "%s: more than %d records",
					 directory, CTL_ENDPOINTS_MAX);
				goto out;
			}
			grown = realloc(records, capacity * sizeof(*records));
			if (!grown) {
				r = fail(err, err_size, -ENOMEM, "out of memory");
				goto out;
			}
			records = grown;
		}
		r = record_read(directory, entry->d_name, role, &rec, &was_stale, err, err_size);
		if (r < 0)
			goto out;
		stale += was_stale;
		if (r == 1)
			records[count++] = rec;
	}
	if (count > 1)
		qsort(records, count, sizeof(*records), record_order);
	for (size_t i = 0; i < count; i++) {
		static const uint16_t no_ports[] = { CTL_DEFAULT_PORT };

		r = ctl_endpoints_add_spec(list, records[i].url, no_ports, 1, err, err_size);
		if (r < 0) {
			char why[CTL_ERROR_MAX];

			snprintf(why, sizeof(why), "%s", err);
			r = fail(err, err_size, -EINVAL, "%s/%s: %s", directory, records[i].file,
				 why);
			goto out;
		}
		added += r;
	}
	r = added;
	if (ret_stale)
		*ret_stale = stale;
out:
	closedir(d);
	for (size_t i = 0; i < count; i++) {
		free(records[i].file);
		free(records[i].url);
	}
	free(records);
	return r;
}
