/* SPDX-License-Identifier: MIT */
/*
 * read-patterns: how fast one file reads back in several patterns, to tell
 * on a new disk which way a wake should read its disk copies (issue 32).
 *
 *   read-patterns [--create SIZE] [--repeat N] [--drop-all] FILE PATTERN...
 *
 * PATTERN is MODE:PIECE:INFLIGHT[:drop]: MODE direct (O_DIRECT, around the
 * page cache, as disk_read=direct) or buffered (through it, with the
 * kernel's read-ahead, as disk_read=cached and torch_memory_saver); PIECE
 * the size of each pread() (64MiB); INFLIGHT how many threads read at once,
 * each taking the next piece in file order; drop: each piece dropped from
 * the page cache once read (POSIX_FADV_DONTNEED, as disk_read=cached does).
 * Every pattern reads the whole file, after its pages were dropped from the
 * cache (this file's only: no root needed; with --drop-all the whole page
 * cache, as root, so that no other file's pages are reclaimed during the
 * reads), N times in turn with the others.
 * --create writes SIZE bytes of a fixed pseudo-random pattern to FILE first.
 *
 * One line a run: the pattern, GB/s, seconds. Every run must read the same
 * bytes: a sum over every 4 KiB block of its first word and offset is
 * compared across runs, and a run that disagrees (or a short read) fails
 * the program (exit 1).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

#define ALIGN 4096
#define THREADS_MAX 64

struct pattern {
	const char *text;
	bool direct, drop;
	size_t piece;
	int inflight;
};

struct run {
	const struct pattern *pt;
	int fd;
	uint64_t size;
	atomic_uint_fast64_t next;   /* the next piece's offset */
	atomic_uint_fast64_t sum;    /* of every piece's hash (order-free) */
	atomic_uint_fast64_t bytes;  /* read */
	atomic_int failed;           /* an errno */
};

/* What each 4 KiB block of a piece starts with, mixed with the block's
 * offset and summed: the same for the whole file whatever the pieces, and
 * cheap enough not to slow the reads it checks (a misplaced or missing
 * block changes it; --create makes every block start differently). */
static uint64_t piece_hash(const unsigned char *p, size_t n, uint64_t offset)
{
	uint64_t sum = 0;

	for (size_t i = 0; i < n; i += ALIGN) {
		uint64_t w = 0, h;

		memcpy(&w, p + i, MIN((size_t)8, n - i));
		h = (w ^ (offset + i)) * 0x9e3779b97f4a7c15ull;
		sum += h ^ (h >> 29);
	}
	return sum;
}

static void *reader(void *arg)
{
	struct run *r = arg;
	void *buf = NULL;

	if (posix_memalign(&buf, ALIGN, r->pt->piece)) {
		atomic_store(&r->failed, ENOMEM);
		return NULL;
	}
	for (;;) {
		uint64_t off = atomic_fetch_add(&r->next, r->pt->piece);
		size_t want, got = 0;

		if (off >= r->size || atomic_load(&r->failed))
			break;
		want = (size_t)MIN((uint64_t)r->pt->piece, r->size - off);
		while (got < want) {
			/* O_DIRECT reads whole blocks: the file's tail is padded */
			size_t ask = r->pt->direct ? round_up(want - got, ALIGN) : want - got;
			ssize_t n = pread(r->fd, (char *)buf + got, ask, (off_t)(off + got));

			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				atomic_store(&r->failed, n < 0 ? errno : EIO);
				break;
			}
			got += MIN((size_t)n, want - got);
		}
		if (got < want)
			break;
		if (r->pt->drop)
			(void)posix_fadvise(r->fd, (off_t)off, (off_t)want, POSIX_FADV_DONTNEED);
		atomic_fetch_add(&r->sum, piece_hash(buf, want, off));
		atomic_fetch_add(&r->bytes, want);
	}
	free(buf);
	return NULL;
}

static int pattern_parse(const char *text, struct pattern *ret)
{
	char mode[16], piece[32], extra[16] = "";
	int inflight = 0;
	struct pattern pt = { .text = text };

	if (sscanf(text, "%15[^:]:%31[^:]:%d:%15s", mode, piece, &inflight, extra) < 3)
		return error_set(-EINVAL, "pattern '%s' is not MODE:PIECE:INFLIGHT[:drop]", text);
	if (strcmp(mode, "direct") != 0 && strcmp(mode, "buffered") != 0)
		return error_set(-EINVAL, "pattern '%s': the mode is direct or buffered", text);
	pt.direct = strcmp(mode, "direct") == 0;
	if (size_parse(piece, &pt.piece) < 0 || pt.piece == 0 || pt.piece % ALIGN)
		return error_set(-EINVAL, "pattern '%s': the piece is a multiple of 4 KiB", text);
	if (inflight < 1 || inflight > THREADS_MAX)
		return error_set(-EINVAL, "pattern '%s': 1 to %d reads in flight", text, THREADS_MAX);
	pt.inflight = inflight;
	if (extra[0] && strcmp(extra, "drop") != 0)
		return error_set(-EINVAL, "pattern '%s': the fourth field is drop or nothing", text);
	pt.drop = extra[0] != '\0';
	*ret = pt;
	return 0;
}

/* size bytes of a pattern every run must read back the same */
static int file_create(const char *path, uint64_t size)
{
	const size_t block = 8 * MiB;
	uint64_t *buf = NULL, x = 0x9e3779b97f4a7c15ull;
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	int r = 0;

	if (fd < 0)
		return error_set(-errno, "creating %s: %s", path, strerror(errno));
	if (posix_memalign((void **)&buf, ALIGN, block)) {
		close(fd);
		return error_set(-ENOMEM, "out of host memory");
	}
	for (uint64_t done = 0; done < size && r == 0;) {
		size_t n = (size_t)MIN((uint64_t)block, size - done);

		for (size_t i = 0; i < block / 8; i++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			buf[i] = x;
		}
		if (write(fd, buf, n) != (ssize_t)n)
			r = error_set(errno ? -errno : -EIO, "writing %s: %s", path,
				      strerror(errno ? errno : EIO));
		done += n;
	}
	if (r == 0 && fsync(fd) < 0)
		r = error_set(-errno, "syncing %s: %s", path, strerror(errno));
	free(buf);
	close(fd);
	return r;
}

/* The whole page cache dropped (root; best effort, as bench/disk.py does). */
static void drop_all(void)
{
	int fd;

	sync();
	fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
	if (fd < 0)
		return;
	if (write(fd, "3\n", 2) != 2) {
		/* not root, or not allowed here: this file's pages only */
	}
	close(fd);
}

/* Read path as pt says: the blocks' sum, the bytes (the file's size) and
 * the seconds it took. */
static int run_one(const char *path, const struct pattern *pt, bool all, uint64_t *ret_sum,
		   uint64_t *ret_bytes, double *ret_s)
{
	struct run r = { .pt = pt };
	pthread_t threads[THREADS_MAX];
	struct stat st;
	double start;
	int started = 0, fd;

	/* this file's cached pages go first, as after a sleep long ago */
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return error_set(-errno, "opening %s: %s", path, strerror(errno));
	(void)fdatasync(fd);
	(void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	close(fd);
	if (all)
		drop_all();
	r.fd = open(path, O_RDONLY | (pt->direct ? O_DIRECT : 0));
	if (r.fd < 0)
		return error_set(-errno, "opening %s%s: %s", path, pt->direct ? " with O_DIRECT" : "",
				 strerror(errno));
	if (fstat(r.fd, &st) < 0 || st.st_size == 0) {
		close(r.fd);
		return error_set(-EINVAL, "%s is empty", path);
	}
	r.size = (uint64_t)st.st_size;
	start = now_monotonic_s();
	for (; started < pt->inflight; started++)
		if (pthread_create(&threads[started], NULL, reader, &r) != 0)
			break;
	for (int i = 0; i < started; i++)
		pthread_join(threads[i], NULL);
	*ret_s = now_monotonic_s() - start;
	close(r.fd);
	if (started == 0)
		return error_set(-EAGAIN, "no reader thread started");
	if (atomic_load(&r.failed))
		return error_set(-atomic_load(&r.failed), "%s: %s", pt->text,
				 strerror(atomic_load(&r.failed)));
	if (atomic_load(&r.bytes) != r.size)
		return error_set(-EIO, "%s: read %llu of %llu bytes", pt->text,
				 (unsigned long long)atomic_load(&r.bytes),
				 (unsigned long long)r.size);
	*ret_sum = atomic_load(&r.sum);
	*ret_bytes = r.size;
	return 0;
}

static int usage(void)
{
	fprintf(stderr, "usage: read-patterns [--create SIZE] [--repeat N] [--drop-all] FILE "
			"MODE:PIECE:INFLIGHT[:drop]...\n"
			"  MODE: direct or buffered; e.g. direct:64MiB:4 buffered:256MiB:1 "
			"buffered:64MiB:1:drop\n");
	return 2;
}

int main(int argc, char **argv)
{
	struct pattern patterns[32];
	size_t create = 0, count = 0;
	const char *path = NULL;
	uint64_t want = 0;
	bool have = false, all = false;
	int repeat = 1;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--create") == 0 && i + 1 < argc) {
			if (size_parse(argv[++i], &create) < 0 || create == 0)
				return fprintf(stderr, "read-patterns: --create takes a size\n"), 2;
		} else if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc) {
			repeat = atoi(argv[++i]);
			if (repeat < 1 || repeat > 100)
				return fprintf(stderr, "read-patterns: --repeat is 1 to 100\n"), 2;
		} else if (strcmp(argv[i], "--drop-all") == 0) {
			all = true;
		} else if (argv[i][0] == '-') {
			return usage();
		} else if (!path) {
			path = argv[i];
		} else if (count == ARRAY_SIZE(patterns)) {
			return fprintf(stderr, "read-patterns: at most %zu patterns\n",
				       ARRAY_SIZE(patterns)), 2;
		} else if (pattern_parse(argv[i], &patterns[count++]) < 0) {
			return fprintf(stderr, "read-patterns: %s\n", error_text()), 2;
		}
	}
	if (!path || count == 0)
		return usage();
	if (create && file_create(path, create) < 0)
		return fprintf(stderr, "read-patterns: %s\n", error_text()), 1;
	for (int rep = 0; rep < repeat; rep++) {
		for (size_t p = 0; p < count; p++) {
			uint64_t sum = 0, bytes = 0;
			double s = 0;

			if (run_one(path, &patterns[p], all, &sum, &bytes, &s) < 0)
				return fprintf(stderr, "read-patterns: %s\n", error_text()), 1;
			if (have && sum != want)
				return fprintf(stderr, "read-patterns: %s read other bytes than the "
						       "runs before it\n", patterns[p].text), 1;
			want = sum;
			have = true;
			printf("%-24s %6.2f GB/s %8.3f s\n", patterns[p].text,
			       (double)bytes / s / 1e9, s);
			fflush(stdout);
		}
	}
	return 0;
}
