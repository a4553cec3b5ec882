/* SPDX-License-Identifier: MIT */
/*
 * Disk copies: where DORMANT_DISK chunks live while asleep. A sleep gives
 * each tag one file per device (struct diskstore: one descriptor, however
 * many chunks; with disk_names one per allocation, as torch_memory_saver
 * lists them), in the manager's disk directory, and each chunk a range of
 * it (struct diskfile). The file is created without a name (O_TMPFILE; where
 * the file system lacks it, created and unlinked at once), so that nothing
 * is left behind when the process exits or dies: the space is the file
 * system's again when the descriptor closes, which is when the last chunk's
 * range goes (after a wake, on a worker: diskfile_close_begin(), _end()). A
 * range that goes before the others (its allocation freed while asleep) has
 * its space punched out of the file where the file system can. With disk_names the file is also given a name in the directory while
 * it holds a copy (torch_memory_saver lists them), removed when it closes.
 *
 * The runs of a disk chunk's plan start at multiples of DISKFILE_ALIGN in
 * its file (extent.h, plan_align()), and every read and write is of whole
 * DISKFILE_ALIGN blocks from a staging slot (aligned), so that the file can
 * be opened with O_DIRECT and bypass the page cache: the copy then costs
 * disk bandwidth, not host memory. Where O_DIRECT is refused (tmpfs before
 * Linux 6.6, some FUSE file systems) the file is written through the page
 * cache. The space is allocated when the file is created, so that a full
 * disk fails the sleep before any copy.
 */
#ifndef DORMANT_DISKFILE_H
#define DORMANT_DISKFILE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "hash.h"

struct copy_plan;

#define DISKFILE_ALIGN 4096

/* One file: its descriptor, shared by the ranges of it (refs). */
struct diskstore {
	int fd;
	bool direct;          /* opened with O_DIRECT */
	atomic_bool cached;   /* read through the page cache (diskstore_read_cached()) */
	_Atomic unsigned refs; /* ranges, closings pending, and its creator until
				* diskstore_put() */
	_Atomic unsigned ranges; /* ranges open (diskfile_open(), not yet closed) */
	uint64_t size;        /* bytes allocated on disk */
	char *name;           /* its name in the directory (disk_names), or NULL */
	atomic_bool unlinked; /* the name is out of the directory already */
};

/* A chunk's copy: bytes [base, base + size) of a store's file. */
struct diskfile {
	struct diskstore *store; /* while open */
	bool open;
	uint64_t base;
	uint64_t size; /* bytes of the file that are this chunk's */
};

/* Create an unnamed file of size bytes in dir, its space allocated, held by
 * the caller (diskstore_put()). With named, link it under a name in dir
 * too. A fault-injection point (DORMANT_FAULT_DISK). -ENOSPC (disk full),
 * -EROFS, -EACCES, -ENOENT (no such directory), -EIO; the message names the
 * directory. */
int diskstore_create(struct backend *b, const char *dir, uint64_t size, bool named,
		     struct diskstore **ret);
/* From now on read s through the page cache: O_DIRECT off its descriptor,
 * the kernel told the reads are sequential (read-ahead runs ahead of them),
 * and each piece dropped from the cache once read, so that the copy does not
 * stay in host memory (disk_read=cached). Once per store; later calls, and
 * a store that was never O_DIRECT, only return 0. -errno (fcntl). */
int diskstore_read_cached(struct diskstore *s);
/* Drop the caller's hold; the file closes with its last range. */
void diskstore_put(struct diskstore *s);
/* Open f as bytes [base, base + size) of s (inside it, aligned). */
void diskfile_open(struct diskstore *s, uint64_t base, uint64_t size, struct diskfile *f);
/* Write/read size bytes (a multiple of DISKFILE_ALIGN, buf aligned) at
 * offset (aligned) of f's range. Fault-injection points (DORMANT_FAULT_DISK). */
int diskfile_write(struct backend *b, struct diskfile *f, const void *buf, size_t size,
		   uint64_t offset);
int diskfile_read(struct backend *b, struct diskfile *f, void *buf, size_t size,
		  uint64_t offset);
/* The checksum (hash.h) of what the file holds of plan's runs. */
int diskfile_checksum(struct diskfile *f, const struct copy_plan *plan, struct checksum *ret);
/* Flip bits of the byte at offset (dormant_debug_corrupt_host()). */
int diskfile_xor_byte(struct diskfile *f, uint64_t offset, unsigned char mask);
/* Close a range: its space is punched out of the file, or, the last one,
 * the file closes (and its name goes). Accepts a closed one. */
void diskfile_close(struct diskfile *f);

/* A range closed as far as anyone can see whose space the file system has
 * yet to take back (diskfile_close_end()). */
struct diskfile_closing {
	struct diskstore *store; /* NULL: nothing left to do */
	uint64_t base, size;
	bool punch; /* other ranges stayed open: give this one's space back */
};

/* diskfile_close() in two parts, for a caller that must not wait for the
 * file system (ext4 on a virtual disk took 0.29 s to give back each GiB of a
 * wake's file): diskfile_close_begin() closes f at once (the last range of
 * a named file takes the name out of the directory) and hands its hold on
 * the file to *ret; diskfile_close_end(), later and on any thread, punches
 * the range out or closes the file. Accepts a closed f. */
void diskfile_close_begin(struct diskfile *f, struct diskfile_closing *ret);
void diskfile_close_end(struct diskfile_closing *c);

#endif
