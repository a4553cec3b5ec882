/* SPDX-License-Identifier: MIT */
/* Discovery records (discovery.h). */
#include "discovery.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

static atomic_uint serial;

int discovery_dir_open(const char *dir, char *ret, size_t size)
{
	if (runtime_dir_name(dir, ret, size, NULL) < 0)
		return error_set(-ENAMETOOLONG, "the discovery directory name is too long");
	if (mkdir(ret, 0700) < 0 && errno != EEXIST)
		return error_set(-errno, "creating the discovery directory %s: %s", ret,
				 strerror(errno));
	/* The readers' rules (common/runtime.c): another user's directory, or
	 * one others may write to, could have been made first to read or plant
	 * records, or to swap ours for theirs. */
	return runtime_dir_open(ret);
}

/* An integer from the environment (RANK, LOCAL_RANK, WORLD_SIZE), or null. */
static json_t *env_integer(const char *name)
{
	const char *value = getenv(name);
	char *end;
	long v;

	if (!value || !*value)
		return json_null();
	errno = 0;
	v = strtol(value, &end, 10);
	if (errno || *end || v < 0 || v > INT_MAX)
		return json_null();
	return json_integer(v);
}

static bool role_valid(const char *role)
{
	size_t len = strlen(role);

	if (len == 0 || len > DISCOVERY_ROLE_MAX)
		return false;
	return strspn(role, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-") ==
	       len;
}

int discovery_publish(const char *dir, const char *role, const char *url, int port,
		      char *ret_path, size_t size)
{
	char directory[PATH_MAX], path[PATH_MAX], name[64], tmp[64], host[256];
	long long ticks = process_start_ticks(0);
	struct timespec now;
	json_t *doc;
	char *text;
	unsigned number = atomic_fetch_add(&serial, 1);
	int dirfd, fd, n, r;
	size_t len;

	if (!role)
		role = getenv("DORMANT_ROLE");
	if (role && !*role)
		role = NULL;
	if (role && !role_valid(role))
		return error_set(-EINVAL,
				 "role '%.64s' is not 1 to %d characters of [A-Za-z0-9_.:-]", role,
				 DISCOVERY_ROLE_MAX);
	snprintf(name, sizeof(name), "%d-%u.json", (int)getpid(), number);
	snprintf(tmp, sizeof(tmp), ".%d-%u.tmp", (int)getpid(), number);
	/* the directory is opened once and checked (discovery_dir_open()); the
	 * files are made in that very directory, by descriptor */
	dirfd = discovery_dir_open(dir, directory, sizeof(directory));
	if (dirfd < 0)
		return dirfd;
	n = snprintf(path, sizeof(path), "%s/%s", directory, name);
	if (n < 0 || (size_t)n >= sizeof(path) || (size_t)n >= size) {
		close(dirfd);
		return error_set(-ENAMETOOLONG, "the discovery record's path is too long");
	}
	if (gethostname(host, sizeof(host)) < 0)
		host[0] = '\0';
	host[sizeof(host) - 1] = '\0';
	clock_gettime(CLOCK_REALTIME, &now);

	doc = json_pack("{s:i, s:I, s:o, s:s, s:i, s:s, s:f, s:o, s:o, s:o, s:o}", "version",
			DISCOVERY_VERSION, "pid", (json_int_t)getpid(), "start_ticks",
			ticks > 0 ? json_integer(ticks) : json_null(), "url", url, "port", port,
			"host", host, "started_unix_s",
			(double)now.tv_sec + (double)(now.tv_nsec / 1000000) / 1e3, "rank",
			env_integer("RANK"), "local_rank", env_integer("LOCAL_RANK"),
			"world_size", env_integer("WORLD_SIZE"), "role",
			role ? json_string(role) : json_null());
	text = doc ? json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(15)) : NULL;
	json_decref(doc);
	if (!text) {
		close(dirfd);
		return error_set(-ENOMEM, "out of host memory");
	}
	len = strlen(text);
	text[len] = '\n'; /* json_dumps' NUL: the file is not a C string */

	/* a leftover of a process that had this pid: never written through */
	unlinkat(dirfd, tmp, 0);
	fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0) {
		r = error_set(-errno, "writing %s/%s: %s", directory, tmp, strerror(errno));
		free(text);
		close(dirfd);
		return r;
	}
	r = write(fd, text, len + 1) == (ssize_t)(len + 1) ? 0 : -(errno ? errno : EIO);
	free(text);
	if (close(fd) < 0 && r == 0)
		r = -errno;
	if (r == 0 && renameat(dirfd, tmp, dirfd, name) < 0)
		r = -errno;
	if (r < 0)
		unlinkat(dirfd, tmp, 0);
	close(dirfd);
	if (r < 0)
		return error_set(r, "writing the discovery record %s: %s", path, strerror(-r));
	snprintf(ret_path, size, "%s", path);
	return 0;
}
