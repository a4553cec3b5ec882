/* SPDX-License-Identifier: MIT */
/* Endpoints from discovery records (discover.h). */
#include "discover.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
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
 * Read one record. Returns 1 (added to *ret), 0 (skipped: stale, of another
 * role, removed meanwhile, or not a record: then *ret_why says why), or
 * -ENOMEM.
 */
static int record_read(int dirfd, const char *name, const char *role, struct record *ret,
		       bool *ret_stale, char *why_buf, size_t why_size, const char **ret_why)
{
	char text[CTL_RECORD_MAX + 2];
	json_error_t error;
	json_t *doc, *v;
	const char *url, *why = NULL;
	bool bad = false;
	long long ticks = -1;
	long len;
	int r = 0;

	*ret_stale = false;
	*ret_why = NULL;
	/* the common rules: a regular file of this user, no link, no FIFO */
	len = runtime_record_read(dirfd, name, text, CTL_RECORD_MAX + 1);
	if (len == -ENOENT)
		return 0; /* removed between the listing and now: its server stopped */
	if (len < 0) {
		snprintf(why_buf, why_size, "%s", error_text());
		*ret_why = why_buf;
		return 0;
	}
	doc = json_loadb(text, (size_t)len, JSON_REJECT_DUPLICATES, &error);
	if (!doc) {
		snprintf(why_buf, why_size, "malformed JSON at byte %d: %s", error.position,
			 error.text);
		*ret_why = why_buf;
		return 0;
	}
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
		ticks = optional_integer(doc, "start_ticks", &bad);
		if (bad)
			why = "\"rank\", \"local_rank\" or \"start_ticks\" is not a whole number or null";
	}
	if (why) {
		snprintf(why_buf, why_size, "%s", why);
		*ret_why = why_buf;
		goto out;
	}
	ret->pid = json_integer_value(json_object_get(doc, "pid"));
	/* live: a process of this user that started when the record says
	 * (pid 1, a reused pid, a record without its start time never are) */
	if (!runtime_process_live(ret->pid, ticks)) {
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
		r = -ENOMEM;
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
				 ctl_warn_fn warn, void *userdata, size_t *ret_stale,
				 size_t *ret_skipped, char *err, size_t err_size)
{
	char directory[PATH_MAX];
	struct record *records = NULL, *grown;
	size_t count = 0, capacity = 0, stale = 0, skipped = 0;
	struct dirent *entry;
	DIR *d;
	int r, fd, added = 0;

	r = ctl_discovery_dir(dir, directory, sizeof(directory), err, err_size);
	if (r < 0)
		return r;
	/* a directory another user could write to is refused whole */
	fd = runtime_dir_open(directory);
	if (fd < 0)
		return fail(err, err_size, fd == -ENOENT ? -ENOENT : -EPERM, "%s", error_text());
	d = fdopendir(fd);
	if (!d) {
		close(fd);
		return fail(err, err_size, -ENOMEM, "the discovery directory %s: %s", directory,
			    strerror(errno));
	}
	while ((entry = readdir(d))) {
		struct record rec = { 0 };
		char why_buf[CTL_ERROR_MAX / 2];
		const char *why;
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
		r = record_read(dirfd(d), entry->d_name, role, &rec, &was_stale, why_buf,
				sizeof(why_buf), &why);
		if (r < 0) {
			r = fail(err, err_size, r, "out of memory");
			goto out;
		}
		/* one bad file never keeps the others from being found */
		if (why) {
			char line[CTL_ERROR_MAX];

			skipped++;
			snprintf(line, sizeof(line), "%s/%s: skipped, not a dormant discovery "
				 "record of this user (%s)", directory, entry->d_name, why);
			if (warn)
				warn(userdata, line);
		}
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
	if (ret_skipped)
		*ret_skipped = skipped;
out:
	closedir(d);
	for (size_t i = 0; i < count; i++) {
		free(records[i].file);
		free(records[i].url);
	}
	free(records);
	return r;
}
