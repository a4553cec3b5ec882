/* SPDX-License-Identifier: MIT */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_TMPFILE, O_DIRECT, fallocate */
#endif
#include "diskfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "extent.h"

/* A name in the directory for disk_names: unique within the process, the
 * pid telling processes apart. */
static char *name_new(const char *dir)
{
	static atomic_uint serial;
	char *path;

	if (asprintf(&path, "%s/dormant-%ld-%u.bin", dir, (long)getpid(),
		     atomic_fetch_add(&serial, 1)) < 0)
		return NULL;
	return path;
}

/* Open an unnamed file in dir: O_TMPFILE, else a created and unlinked one
 * (kept, named, when named). Tries O_DIRECT first. */
static int open_unnamed(const char *dir, bool named, bool *ret_direct, char **ret_name)
{
	static const int direct_flags[] = { O_DIRECT, 0 };
	int fd = -1, err = 0;

	for (size_t i = 0; i < 2; i++) {
		fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC | direct_flags[i], 0600);
		if (fd >= 0) {
			*ret_direct = direct_flags[i] != 0;
			return fd;
		}
		err = errno;
		/* EINVAL: O_DIRECT refused, or O_TMPFILE unknown to the kernel */
		if (err != EINVAL)
			break;
	}
	if (err != EOPNOTSUPP && err != EISDIR && err != EINVAL)
		return -err;
	/* no O_TMPFILE here: a named file, unlinked at once unless wanted */
	for (int attempt = 0; attempt < 16; attempt++) {
		char *path = name_new(dir);

		if (!path)
			return -ENOMEM;
		for (size_t i = 0; i < 2; i++) {
			fd = open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | direct_flags[i], 0600);
			if (fd >= 0 || errno != EINVAL)
				break;
		}
		if (fd >= 0) {
			int flags = fcntl(fd, F_GETFL);

			*ret_direct = flags >= 0 && (flags & O_DIRECT);
			if (named) {
				*ret_name = path;
			} else {
				unlink(path);
				free(path);
			}
			return fd;
		}
		err = errno;
		free(path);
		if (err != EEXIST)
			break;
	}
	return -err;
}

int diskstore_create(struct backend *b, const char *dir, uint64_t size, bool named,
		     struct diskstore **ret)
{
	struct diskstore *s;
	int r;

	r = backend_fault_check(b, DORMANT_FAULT_DISK);
	if (r < 0)
		return error_prefix(r, "creating a disk copy in %s", dir);
	s = calloc(1, sizeof(*s));
	if (!s)
		return error_set(-ENOMEM, "out of host memory");
	s->size = size;
	atomic_init(&s->refs, 1);
	atomic_init(&s->ranges, 0);
	atomic_init(&s->unlinked, false);
	r = open_unnamed(dir, named, &s->direct, &s->name);
	if (r < 0) {
		free(s);
		return error_set(r, "creating a disk copy in %s: %s", dir, strerror(-r));
	}
	s->fd = r;
	/* the space now: a full disk fails here, before any copy */
	r = posix_fallocate(s->fd, 0, (off_t)size);
	if (r == EOPNOTSUPP || r == EINVAL)
		r = ftruncate(s->fd, (off_t)size) < 0 ? errno : 0;
	if (r != 0) {
		diskstore_put(s);
		return error_set(-r, "allocating %llu bytes for a disk copy in %s: %s",
				 (unsigned long long)size, dir, strerror(r));
	}
	if (named && !s->name) {
		/* an O_TMPFILE file gets its name through /proc */
		char proc[64];

		s->name = name_new(dir);
		snprintf(proc, sizeof(proc), "/proc/self/fd/%d", s->fd);
		if (!s->name ||
		    linkat(AT_FDCWD, proc, AT_FDCWD, s->name, AT_SYMLINK_FOLLOW) < 0) {
			r = s->name ? -errno : -ENOMEM;
			free(s->name);
			s->name = NULL;
			diskstore_put(s);
			return error_set(r, "naming a disk copy in %s: %s", dir, strerror(-r));
		}
	}
	*ret = s;
	return 0;
}

int diskstore_read_cached(struct diskstore *s)
{
	if (atomic_exchange(&s->cached, true))
		return 0;
	if (s->direct) {
		int flags = fcntl(s->fd, F_GETFL);

		if (flags < 0 || fcntl(s->fd, F_SETFL, flags & ~O_DIRECT) < 0) {
			int r = -errno;

			atomic_store(&s->cached, false);
			return error_set(r, "reading a disk copy through the page cache: %s",
					 strerror(-r));
		}
	}
	/* advice only: a kernel that ignores it reads with its default window */
	(void)posix_fadvise(s->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	return 0;
}

void diskstore_put(struct diskstore *s)
{
	if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
		return;
	if (s->name && !atomic_load(&s->unlinked))
		unlink(s->name);
	free(s->name);
	close(s->fd);
	free(s);
}

void diskfile_open(struct diskstore *s, uint64_t base, uint64_t size, struct diskfile *f)
{
	atomic_fetch_add(&s->refs, 1);
	atomic_fetch_add(&s->ranges, 1);
	*f = (struct diskfile){ .store = s, .open = true, .base = base, .size = size };
}

/* pwrite/pread all of it; short transfers continue, EINTR retries. */
static int transfer_all(struct diskfile *f, void *buf, size_t size, uint64_t offset, bool write)
{
	size_t done = 0;

	while (done < size) {
		off_t at = (off_t)(f->base + offset + done);
		ssize_t n = write ? pwrite(f->store->fd, (const char *)buf + done, size - done, at)
				  : pread(f->store->fd, (char *)buf + done, size - done, at);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return error_set(-errno, "%s %zu bytes at offset %llu of a disk copy: %s",
					 write ? "writing" : "reading", size,
					 (unsigned long long)offset, strerror(errno));
		if (n == 0)
			return error_set(-EIO, "%s a disk copy: it ended at offset %llu",
					 write ? "writing" : "reading",
					 (unsigned long long)(offset + done));
		done += (size_t)n;
	}
	return 0;
}

int diskfile_write(struct backend *b, struct diskfile *f, const void *buf, size_t size,
		   uint64_t offset)
{
	int r = backend_fault_check(b, DORMANT_FAULT_DISK);

	if (r < 0)
		return error_prefix(r, "writing a disk copy");
	return transfer_all(f, (void *)buf, size, offset, true);
}

int diskfile_read(struct backend *b, struct diskfile *f, void *buf, size_t size, uint64_t offset)
{
	int r = backend_fault_check(b, DORMANT_FAULT_DISK);

	if (r < 0)
		return error_prefix(r, "reading a disk copy");
	r = transfer_all(f, buf, size, offset, false);
	/* read once: its pages need not stay (advice; a failure loses nothing) */
	if (r == 0 && atomic_load(&f->store->cached))
		(void)posix_fadvise(f->store->fd, (off_t)(f->base + offset), (off_t)size,
				    POSIX_FADV_DONTNEED);
	return r;
}

#define CHECK_PIECE (1 * MiB)

int diskfile_checksum(struct diskfile *f, const struct copy_plan *plan, struct checksum *ret)
{
	struct checksum sum = { { 0, 0 } };
	char *buf = aligned_alloc(DISKFILE_ALIGN, CHECK_PIECE);
	int r = 0;

	if (!buf)
		return error_set(-ENOMEM, "out of host memory");
	for (size_t k = 0; k < plan->count && r == 0; k++) {
		const struct copy_run *run = &plan->runs[k];

		for (size_t done = 0; done < run->size && r == 0;) {
			size_t len = MIN(run->size - done, CHECK_PIECE);
			struct checksum part;

			r = transfer_all(f, buf, round_up(len, DISKFILE_ALIGN), run->host_offset + done,
					 false);
			if (r < 0)
				break;
			part = checksum_cpu(buf, len, run->offset + done);
			checksum_add(&sum, &part);
			done += len;
		}
	}
	free(buf);
	if (r == 0)
		*ret = sum;
	return r;
}

int diskfile_xor_byte(struct diskfile *f, uint64_t offset, unsigned char mask)
{
	uint64_t block = offset / DISKFILE_ALIGN * DISKFILE_ALIGN;
	char *buf = aligned_alloc(DISKFILE_ALIGN, DISKFILE_ALIGN);
	int r;

	if (!buf)
		return error_set(-ENOMEM, "out of host memory");
	r = transfer_all(f, buf, DISKFILE_ALIGN, block, false);
	if (r == 0) {
		buf[offset - block] ^= (char)mask;
		r = transfer_all(f, buf, DISKFILE_ALIGN, block, true);
	}
	free(buf);
	return r;
}

void diskfile_close_begin(struct diskfile *f, struct diskfile_closing *ret)
{
	struct diskstore *s = f->store;

	*ret = (struct diskfile_closing){ .store = NULL };
	if (!f->open)
		return;
	/* others still use the file: this range's space goes back alone (a
	 * file system that cannot keeps it until the file closes); the last
	 * range takes the name with it now, as the file is gone for its users */
	ret->punch = atomic_fetch_sub(&s->ranges, 1) != 1;
	if (!ret->punch && s->name && !atomic_exchange(&s->unlinked, true))
		unlink(s->name);
	ret->store = s;
	ret->base = f->base;
	ret->size = f->size;
	*f = (struct diskfile){ .store = NULL };
}

void diskfile_close_end(struct diskfile_closing *c)
{
	if (!c->store)
		return;
	if (c->punch && atomic_load(&c->store->ranges) > 0)
		(void)fallocate(c->store->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
				(off_t)c->base, (off_t)c->size);
	diskstore_put(c->store);
	c->store = NULL;
}

void diskfile_close(struct diskfile *f)
{
	struct diskfile_closing c;

	diskfile_close_begin(f, &c);
	diskfile_close_end(&c);
}
