/* SPDX-License-Identifier: MIT */
/* What the discovery records' writer (server/) and reader (ctl/) share. */
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

int runtime_dir_name(const char *dir, char *ret, size_t size, bool *shared_tmp)
{
	const char *env;
	bool tmp = false;
	int n;

	if (dir && *dir)
		n = snprintf(ret, size, "%s", dir);
	else if ((env = getenv("DORMANT_RUNTIME_DIR")) && *env)
		n = snprintf(ret, size, "%s", env);
	else if ((env = getenv("XDG_RUNTIME_DIR")) && *env)
		n = snprintf(ret, size, "%s/dormant", env);
	else {
		n = snprintf(ret, size, "/tmp/dormant-%u", (unsigned)getuid());
		tmp = true;
	}
	if (shared_tmp)
		*shared_tmp = tmp;
	return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

long long process_start_ticks(long long pid)
{
	char path[64], buf[1024], *p;
	long long ticks = -1;
	size_t len;
	FILE *f;

	if (pid > 0)
		snprintf(path, sizeof(path), "/proc/%lld/stat", pid);
	else
		snprintf(path, sizeof(path), "/proc/self/stat");
	f = fopen(path, "re");
	if (!f)
		return -1;
	len = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[len] = '\0';
	p = strrchr(buf, ')'); /* the command name may hold spaces */
	/* after ")" come " 3 4 ...": p moves to the blank before each field */
	for (int field = 3; p && field <= 22; field++) {
		p = strchr(p + 1, ' ');
		if (p && field == 22)
			ticks = strtoll(p + 1, NULL, 10);
	}
	return ticks > 0 ? ticks : -1;
}

int runtime_dir_open(const char *path)
{
	struct stat st;
	int fd, r;

	fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		/* O_NOFOLLOW on a link: ELOOP, with O_DIRECTORY sometimes ENOTDIR */
		if ((r == -ELOOP || r == -ENOTDIR) && lstat(path, &st) == 0 && S_ISLNK(st.st_mode))
			return error_set(-ELOOP, "the discovery directory %s is a symbolic link: "
						 "refused", path);
		if (r == -ENOTDIR)
			return error_set(r, "the discovery directory %s is not a directory", path);
		return error_set(r, "the discovery directory %s: %s", path, strerror(-r));
	}
	if (fstat(fd, &st) < 0) {
		r = error_set(-errno, "the discovery directory %s: %s", path, strerror(errno));
		goto err;
	}
	if (st.st_uid != geteuid()) {
		r = error_set(-EPERM, "the discovery directory %s is owned by uid %u, not by this "
				      "user (uid %u): refused", path, (unsigned)st.st_uid,
			      (unsigned)geteuid());
		goto err;
	}
	if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		r = error_set(-EPERM, "the discovery directory %s is writable by other users "
				      "(mode %04o): refused", path, (unsigned)(st.st_mode & 07777));
		goto err;
	}
	return fd;
err:
	close(fd);
	return r;
}

long runtime_record_read(int dirfd, const char *name, char *buf, size_t size)
{
	struct stat st;
	size_t len = 0;
	ssize_t n;
	long r;
	int fd;

	fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		if (r == -ELOOP)
			return error_set(-ELOOP, "a symbolic link");
		return error_set((int)r, "%s", strerror(-(int)r));
	}
	if (fstat(fd, &st) < 0) {
		r = error_set(-errno, "%s", strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		r = error_set(-EINVAL, "not a regular file");
		goto out;
	}
	if (st.st_uid != geteuid()) {
		r = error_set(-EPERM, "owned by uid %u, not by this user (uid %u)",
			      (unsigned)st.st_uid, (unsigned)geteuid());
		goto out;
	}
	if (st.st_mode & (S_IWGRP | S_IWOTH)) {
		r = error_set(-EPERM, "writable by other users (mode %04o)",
			      (unsigned)(st.st_mode & 07777));
		goto out;
	}
	if (size == 0 || (unsigned long long)st.st_size > size - 1) {
		r = error_set(-EFBIG, "larger than %zu bytes", size ? size - 1 : 0);
		goto out;
	}
	/* bounded whatever the size said: the file may grow meanwhile */
	while (len < size - 1) {
		n = read(fd, buf + len, size - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = error_set(-errno, "%s", strerror(errno));
			goto out;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	buf[len] = '\0';
	r = (long)len;
out:
	close(fd);
	return r;
}

bool runtime_process_live(long long pid, long long start_ticks)
{
	char path[64];
	struct stat st;
	long long ticks;

	/* pid 1 is init, there in every namespace: never a record's server */
	if (pid <= 1 || pid > INT_MAX || start_ticks <= 0)
		return false;
	snprintf(path, sizeof(path), "/proc/%lld", pid);
	/* a server publishes in its own user's directory: another user's
	 * process is not the one that wrote the record */
	if (stat(path, &st) < 0 || st.st_uid != geteuid())
		return false;
	ticks = process_start_ticks(pid);
	return ticks > 0 && ticks == start_ticks;
}
