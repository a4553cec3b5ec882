/* SPDX-License-Identifier: MIT */
/*
 * Disk copies: where DORMANT_DISK chunks live while asleep. Each chunk's copy
 * is a file of its own in the manager's disk directory, created without a
 * name (O_TMPFILE; where the file system lacks it, created and unlinked at
 * once), so that nothing is left behind when the process exits or dies: the
 * space is the file system's again when the descriptor closes. With
 * disk_names the file is also given a name in the directory while it holds
 * a copy (torch_memory_saver lists them), removed when the copy goes.
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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "hash.h"

struct copy_plan;

#define DISKFILE_ALIGN 4096

struct diskfile {
	int fd;           /* valid while open */
	bool open;
	bool direct;      /* opened with O_DIRECT */
	uint64_t size;    /* bytes allocated on disk */
	char *name;       /* its name in the directory (disk_names), or NULL */
};

/* Create an unnamed file of size bytes in dir, its space allocated. With
 * named, link it under a name in dir too. A fault-injection point
 * (DORMANT_FAULT_DISK). -ENOSPC (disk full), -EROFS, -EACCES, -ENOENT (no
 * such directory), -EIO; the message names the directory. */
int diskfile_create(struct backend *b, const char *dir, uint64_t size, bool named,
		    struct diskfile *ret);
/* Write/read size bytes (a multiple of DISKFILE_ALIGN, buf aligned) at
 * offset (aligned). Fault-injection points (DORMANT_FAULT_DISK). */
int diskfile_write(struct backend *b, struct diskfile *f, const void *buf, size_t size,
		   uint64_t offset);
int diskfile_read(struct backend *b, struct diskfile *f, void *buf, size_t size,
		  uint64_t offset);
/* The checksum (hash.h) of what the file holds of plan's runs. */
int diskfile_checksum(struct diskfile *f, const struct copy_plan *plan, struct checksum *ret);
/* Flip bits of the byte at offset (dormant_debug_corrupt_host()). */
int diskfile_xor_byte(struct diskfile *f, uint64_t offset, unsigned char mask);
/* Close (and unlink the name of) a file; accepts a closed one. */
void diskfile_close(struct diskfile *f);

#endif
