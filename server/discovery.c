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

int discovery_dir(const char *dir, char *ret, size_t size)
{
	bool private_tmp;
	struct stat st;

	if (runtime_dir_name(dir, ret, size, &private_tmp) < 0)
		return error_set(-ENAMETOOLONG, "the discovery directory name is too long");
	if (mkdir(ret, 0700) < 0 && errno != EEXIST)
		return error_set(-errno, "creating the discovery directory %s: %s", ret,
				 strerror(errno));
	if (lstat(ret, &st) < 0)
		return error_set(-errno, "%s: %s", ret, strerror(errno));
	/* in a directory everyone may write to, someone else could have made
	 * ours first, to read or plant records */
	if (private_tmp && (!S_ISDIR(st.st_mode) || st.st_uid != getuid()))
		return error_set(-EPERM, "%s is not a directory of this user (uid %u)", ret,
				 (unsigned)getuid());
	if (!private_tmp && stat(ret, &st) == 0 && !S_ISDIR(st.st_mode))
		return error_set(-ENOTDIR, "the discovery directory %s is not a directory", ret);
	return 0;
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
	char directory[PATH_MAX], path[PATH_MAX], tmp[PATH_MAX], host[256];
	long long ticks = process_start_ticks(0);
	struct timespec now;
	json_t *doc;
	char *text;
	unsigned number = atomic_fetch_add(&serial, 1);
	int fd, n, r;
	size_t len;

	if (!role)
		role = getenv("DORMANT_ROLE");
	if (role && !*role)
		role = NULL;
	if (role && !role_valid(role))
		return error_set(-EINVAL,
				 "role '%.64s' is not 1 to %d characters of [A-Za-z0-9_.:-]", role,
				 DISCOVERY_ROLE_MAX);
	r = discovery_dir(dir, directory, sizeof(directory));
	if (r < 0)
		return r;
	n = snprintf(path, sizeof(path), "%s/%d-%u.json", directory, (int)getpid(), number);
	if (n < 0 || (size_t)n >= sizeof(path) || (size_t)n >= size)
		return error_set(-ENAMETOOLONG, "the discovery record's path is too long");
	n = snprintf(tmp, sizeof(tmp), "%s/.%d-%u.tmp", directory, (int)getpid(), number);
	if (n < 0 || (size_t)n >= sizeof(tmp))
		return error_set(-ENAMETOOLONG, "the discovery record's path is too long");
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
	if (!text)
		return error_set(-ENOMEM, "out of host memory");
	len = strlen(text);
	text[len] = '\n'; /* json_dumps' NUL: the file is not a C string */

	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0) {
		r = error_set(-errno, "writing %s: %s", tmp, strerror(errno));
		free(text);
		return r;
	}
	r = write(fd, text, len + 1) == (ssize_t)(len + 1) ? 0 : -(errno ? errno : EIO);
	free(text);
	if (close(fd) < 0 && r == 0)
		r = -errno;
	if (r == 0 && rename(tmp, path) < 0)
		r = -errno;
	if (r < 0) {
		unlink(tmp);
		return error_set(r, "writing the discovery record %s: %s", path, strerror(-r));
	}
	snprintf(ret_path, size, "%s", path);
	return 0;
}
