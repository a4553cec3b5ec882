/* SPDX-License-Identifier: MIT */
/*
 * Disk copies (policy DORMANT_DISK, issue 20 item 5): the copy of a tag
 * goes to files in a directory instead of host memory, is read back and
 * verified on wake, and leaves no file behind; a full disk, a read-only or
 * missing directory, a failed write or read, and a file corrupted while
 * asleep each give a clear error, lose nothing, and a retry works. Public
 * API only; each test gets a directory of its own.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* unshare, mount namespaces */
#endif
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dormant.h"
#include "helpers.h"

static char dir[256];

static void dir_make(void)
{
	snprintf(dir, sizeof(dir), "%s/dormant-disk-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
}

/* Entries of the test's directory (. and .. not counted). */
static int dir_entries(void)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	cr_assert_not_null(d);
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	closedir(d);
	return n;
}

/* Bytes of the files in the test's directory. */
static uint64_t dir_bytes(void)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	uint64_t sum = 0;

	cr_assert_not_null(d);
	while ((e = readdir(d))) {
		struct stat st;

		if (fstatat(dirfd(d), e->d_name, &st, 0) == 0 && S_ISREG(st.st_mode))
			sum += (uint64_t)st.st_size;
	}
	closedir(d);
	return sum;
}

static void dir_remove(void)
{
	cr_expect_eq(dir_entries(), 0, "a file was left behind in %s", dir);
	umount2(dir, MNT_DETACH); /* a test's own mount, if any */
	rmdir(dir);
}

/* 4 MiB chunks, an 8 MiB staging ring (2 MiB slots), disk pieces of 1 MiB:
 * a chunk's copy takes several pieces through several slots. */
static struct dormant *disk_manager(const char *extra)
{
	return manager_from("chunk_bytes=4MiB,staging_bytes=8MiB,copy_threads=2,"
			    "disk_chunk_bytes=1MiB,disk_dir=%s%s%s",
			    dir, *extra ? "," : "", extra);
}

static const char *const *const all = NULL; /* every tag */

static int sleep_all(struct dormant *m)
{
	return dormant_sleep(m, all, NULL);
}

static int wake_all(struct dormant *m)
{
	return dormant_wake(m, all, NULL);
}

/* A disk tag (a multi-chunk allocation, a small one in a slab), a kept tag
 * and a discarded one. */
struct scene {
	struct dormant *m;
	void *big, *small, *kept, *grads;
};

#define BIG (10 * MiB + 12345)
#define SMALL (7 * KiB)
#define KEPT (3 * MiB)
#define GRADS (2 * MiB)

static void scene_make(struct scene *s, const char *extra)
{
	s->m = disk_manager(extra);
	cr_assert_eq(dormant_set_policy(s->m, "cold", DORMANT_DISK), 0, "%s",
		     dormant_last_error());
	cr_assert_eq(dormant_set_policy(s->m, "grads", DORMANT_DISCARD), 0);
	cr_assert_eq(dormant_alloc(s->m, "cold", BIG, &s->big), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_alloc(s->m, "cold", SMALL, &s->small), 0);
	cr_assert_eq(dormant_alloc(s->m, "weights", KEPT, &s->kept), 0);
	cr_assert_eq(dormant_alloc(s->m, "grads", GRADS, &s->grads), 0);
	fill(s->m, s->big, BIG, 1);
	fill(s->m, s->small, SMALL, 2);
	fill(s->m, s->kept, KEPT, 3);
	fill(s->m, s->grads, GRADS, 4);
}

static void expect_intact(struct scene *s)
{
	cr_expect(holds(s->m, s->big, BIG, 1), "big allocation lost");
	cr_expect(holds(s->m, s->small, SMALL, 2), "small allocation lost");
	cr_expect(holds(s->m, s->kept, KEPT, 3), "kept allocation lost");
}

TestSuite(disk, .init = dir_make, .fini = dir_remove);

Test(disk, sleeps_to_files_not_host_memory_and_wakes_bit_identical)
{
	struct scene s;

	scene_make(&s, "");
	for (int cycle = 0; cycle < 3; cycle++) {
		const struct dormant_tag_stats *cold;

		cr_assert_eq(sleep_all(s.m), 0, "cycle %d: %s", cycle, dormant_last_error());
		cold = tag_stats(stats(s.m), "cold");
		cr_expect_eq(cold->policy, DORMANT_DISK);
		cr_expect_eq(cold->host_bytes, 0, "a disk tag holds no host memory");
		cr_expect_geq(cold->disk_bytes, BIG + SMALL, "the disk holds the copy");
		cr_expect_eq(cold->device_bytes, 0);
		cr_expect_eq(stats(s.m)->disk_bytes, cold->disk_bytes);
		cr_expect_eq(tag_stats(stats(s.m), "weights")->disk_bytes, 0);
		cr_expect_geq(tag_stats(stats(s.m), "weights")->host_bytes, KEPT);
		cr_expect_eq(dir_entries(), 0, "the files have no name");

		cr_assert_eq(wake_all(s.m), 0, "cycle %d: %s", cycle, dormant_last_error());
		expect_intact(&s);
		cr_expect(holds(s.m, s.grads, GRADS, 0), "discarded memory comes back zeroed");
		cr_expect_eq(stats(s.m)->disk_bytes, 0, "the files are gone after the wake");
		cr_expect_geq(stats(s.m)->chunks_verified_total, 4u * (cycle + 1),
			      "disk chunks are verified as host copies are");
		fill(s.m, s.grads, GRADS, 4);
	}
	expect_no_device_leak(s.m);
	dormant_destroy(s.m);
}

Test(disk, marked_ranges_skip_the_disk_and_wake_zeroed)
{
	struct scene s;

	scene_make(&s, "");
	/* an odd-sized mark inside the big allocation: two runs, each laid
	 * out on a block of the file */
	cr_assert_eq(dormant_mark_unused(s.m, (char *)s.big + 3 * MiB + 17, 2 * MiB + 5), 0);
	cr_assert_eq(sleep_all(s.m), 0, "%s", dormant_last_error());
	cr_expect_lt(tag_stats(stats(s.m), "cold")->disk_bytes, BIG + SMALL - MiB);
	cr_assert_eq(wake_all(s.m), 0, "%s", dormant_last_error());
	cr_expect(holds_at(s.m, s.big, 0, 3 * MiB + 17, 1));
	cr_expect(holds_at(s.m, s.big, 3 * MiB + 17, 2 * MiB + 5, 0), "marked bytes are zeroed");
	cr_expect(holds_at(s.m, s.big, 5 * MiB + 22, BIG - (5 * MiB + 22), 1));
	cr_expect(holds(s.m, s.small, SMALL, 2));
	dormant_destroy(s.m);
}

Test(disk, an_allocation_may_go_to_disk_in_a_kept_tag_in_retain_mode)
{
	struct dormant *m = disk_manager("host_mode=retain");
	void *kept, *cold;

	cr_assert_eq(dormant_alloc(m, "w", 6 * MiB, &kept), 0);
	cr_assert_eq(dormant_alloc_policy(m, "w", DORMANT_DISK, 6 * MiB, 0, &cold), 0, "%s",
		     dormant_last_error());
	fill(m, kept, 6 * MiB, 5);
	fill(m, cold, 6 * MiB, 6);
	for (int cycle = 0; cycle < 2; cycle++) {
		cr_assert_eq(sleep_all(m), 0, "%s", dormant_last_error());
		cr_expect_geq(stats(m)->disk_bytes, 6 * MiB);
		cr_expect_lt(stats(m)->host_bytes, 7 * MiB, "only the kept one is in host memory");
		cr_assert_eq(wake_all(m), 0, "%s", dormant_last_error());
		cr_expect(holds(m, kept, 6 * MiB, 5));
		cr_expect(holds(m, cold, 6 * MiB, 6));
		cr_expect_eq(stats(m)->disk_bytes, 0, "retain mode keeps no disk copy");
	}
	dormant_destroy(m);
}

Test(disk, names_show_while_asleep_and_go_on_wake_free_and_destroy)
{
	struct scene s;

	scene_make(&s, "disk_names=true");
	cr_assert_eq(sleep_all(s.m), 0, "%s", dormant_last_error());
	/* named, as torch_memory_saver's: a file per allocation, the big one's
	 * 3 chunks in one and the slab's chunk (the small one) in another */
	cr_expect_eq(dir_entries(), 2, "one named file per allocation");
	cr_expect_eq(dir_bytes(), stats(s.m)->disk_bytes, "the files are the disk bytes");
	cr_assert_eq(wake_all(s.m), 0, "%s", dormant_last_error());
	cr_expect_eq(dir_entries(), 0);
	expect_intact(&s);

	cr_assert_eq(sleep_all(s.m), 0);
	cr_assert_eq(dormant_free(s.m, s.big), 0, "freed while asleep");
	cr_assert_eq(dormant_free(s.m, s.small), 0);
	cr_expect_eq(dir_entries(), 0, "their files went with them");
	cr_expect_eq(tag_stats(stats(s.m), "cold")->disk_bytes, 0);
	cr_assert_eq(wake_all(s.m), 0, "%s", dormant_last_error());
	cr_assert_eq(dormant_alloc(s.m, "cold", 5 * MiB, &s.big), 0);
	fill(s.m, s.big, 5 * MiB, 9);
	cr_assert_eq(sleep_all(s.m), 0);
	cr_expect_geq(dir_entries(), 1);
	dormant_destroy(s.m); /* asleep: its files go too */
	cr_expect_eq(dir_entries(), 0);
}

/* The descriptors this process holds on files in the test's directory
 * (named or not: an unnamed file's link reads "DIR/#inode (deleted)"): how
 * many, the bytes the file system allocated for them, and how many read
 * around the page cache (O_DIRECT in /proc/self/fdinfo). */
struct disk_fds {
	int count, direct;
	uint64_t allocated;
};

static struct disk_fds disk_fds(void)
{
	struct disk_fds out = { 0, 0, 0 };
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;

	cr_assert_not_null(d);
	while ((e = readdir(d))) {
		char link[300], target[512], info[300], line[128];
		struct stat st;
		ssize_t n;
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(link, sizeof(link), "/proc/self/fd/%s", e->d_name);
		n = readlink(link, target, sizeof(target) - 1);
		if (n < 0)
			continue;
		target[n] = 0;
		if (strncmp(target, dir, strlen(dir)) != 0 || target[strlen(dir)] != '/')
			continue;
		out.count++;
		if (stat(link, &st) == 0)
			out.allocated += (uint64_t)st.st_blocks * 512;
		snprintf(info, sizeof(info), "/proc/self/fdinfo/%s", e->d_name);
		f = fopen(info, "r");
		while (f && fgets(line, sizeof(line), f)) {
			unsigned long flags;

			if (sscanf(line, "flags: %lo", &flags) == 1)
				out.direct += (flags & O_DIRECT) != 0;
		}
		if (f)
			fclose(f);
	}
	closedir(d);
	return out;
}

/* Descriptors this process holds. */
static int fd_count(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = 0;

	cr_assert_not_null(d);
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Unnamed (the default): one file, one descriptor, per disk tag however
 * many chunks and allocations it has. Named (disk_names, the drop-in's): one
 * per allocation, as torch_memory_saver lists them; still not per chunk.
 * A wake removes the copies at once (names, disk bytes) and leaves closing
 * the descriptors, where the file system gives the space back, to a worker:
 * the next sleep waits for those before it makes its own, and the manager's
 * end for the last. */
Test(disk, a_tag_holds_one_file_and_one_descriptor_however_many_chunks)
{
	for (int named = 0; named < 2; named++) {
		int before = fd_count();
		struct scene s;
		void *other;
		int awake;
		bool host;

		scene_make(&s, named ? "disk_names=true" : "");
		host = on_host(s.m);
		cr_assert_eq(dormant_set_policy(s.m, "cold2", DORMANT_DISK), 0);
		cr_assert_eq(dormant_alloc(s.m, "cold2", 9 * MiB, &other), 0);
		fill(s.m, other, 9 * MiB, 7);
		awake = fd_count();
		for (int cycle = 0; cycle < 2; cycle++) {
			/* cold: the big allocation (3 chunks) and the slab's; cold2: one */
			int files = named ? 3 : 2;

			cr_assert_eq(sleep_all(s.m), 0, "%s", dormant_last_error());
			cr_expect_eq(fd_count() - awake, files, "named=%d cycle %d: %d descriptors, "
				     "not one per chunk, nor the last wake's (%d more)", named, cycle,
				     files, fd_count() - awake);
			cr_expect_eq(disk_fds().count, files, "named=%d: the descriptors are the "
				     "disk copies'", named);
			cr_expect_eq(dir_entries(), named ? files : 0, "named=%d", named);
			if (named)
				cr_expect_eq(dir_bytes(), stats(s.m)->disk_bytes,
					     "the files are the disk bytes");
			cr_assert_eq(wake_all(s.m), 0, "%s", dormant_last_error());
			cr_expect_eq(dir_entries(), 0, "the names go with the wake");
			cr_expect_eq(stats(s.m)->disk_bytes, 0, "and the disk bytes");
			cr_expect_leq(fd_count() - awake, files, "no descriptor is added");
			expect_intact(&s);
			cr_expect(holds(s.m, other, 9 * MiB, 7), "the second tag's allocation lost");
		}
		dormant_destroy(s.m);
		/* the disk copies' descriptors, not the process's: a CUDA driver
		 * keeps the ones it opened at its first use (/dev/nvidia*) */
		cr_expect_eq(disk_fds().count, 0, "named=%d: every disk descriptor closed by "
			     "the end", named);
		if (host)
			cr_expect_eq(fd_count(), before, "named=%d: and nothing else left open",
				     named);
	}
}

/* disk_read=cached and stream: the wake reads through the page cache
 * (O_DIRECT off the tag's descriptor from its first read on; direct keeps
 * it), the data comes back intact, and a wake that fails part-way (a read
 * refused) keeps the file and wakes on retry, as with direct reads. */
Test(disk, cached_reads_leave_o_direct_and_wake_intact_and_retry)
{
	static const char *const modes[] = { "direct", "cached", "stream" };

	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		bool cached = i > 0;
		char options[64];
		uint64_t calls;
		struct scene s;

		snprintf(options, sizeof(options), "disk_read=%s", modes[i]);
		scene_make(&s, options);
		cr_assert_eq(sleep_all(s.m), 0, "%s", dormant_last_error());
		cr_assert_eq(disk_fds().count, 1, "no descriptor of the disk copy in %s", dir);
		if (disk_fds().direct == 0)
			cr_skip("%s takes no O_DIRECT: the read modes look alike here", dir);
		/* the third disk call of the wake fails: some pieces were read */
		calls = dormant_debug_op_count(s.m, DORMANT_FAULT_DISK);
		cr_assert_eq(dormant_debug_inject_fault(s.m, DORMANT_FAULT_DISK, 3, -EIO, false), 0);
		cr_assert_eq(wake_all(s.m), -EIO, "%s: %s", options, dormant_last_error());
		expect_all(s.m, DORMANT_ASLEEP);
		/* stream reads one piece at a time: none after the failed one;
		 * the others had the next pieces (4 a chunk) in flight already */
		calls = dormant_debug_op_count(s.m, DORMANT_FAULT_DISK) - calls;
		if (strcmp(modes[i], "stream") == 0)
			cr_expect_eq(calls, 3, "%s: %llu reads, not one at a time", options,
				     (unsigned long long)calls);
		else
			cr_expect_gt(calls, 3, "%s: %llu reads, one at a time", options,
				     (unsigned long long)calls);
		cr_expect_eq(disk_fds().direct, cached ? 0 : 1,
			     "%s: O_DIRECT %s after the wake's reads", options,
			     cached ? "still on" : "gone");
		cr_assert_eq(wake_all(s.m), 0, "%s, retry: %s", options, dormant_last_error());
		expect_intact(&s);
		cr_expect_eq(stats(s.m)->disk_bytes, 0, "the copy goes with the wake");
		dormant_destroy(s.m);
		/* its descriptor closes on a worker, by the manager's end at the latest */
		cr_expect_eq(disk_fds().count, 0, "%s: the file closed", options);
	}
}

/* An allocation freed while its tag sleeps on disk gives its part of the
 * tag's file back at once (one with chunks of its own: larger than a
 * slab's); the rest of the file still wakes intact. */
Test(disk, an_allocation_freed_while_asleep_gives_its_space_back)
{
	struct scene s;
	uint64_t before, after, held;
	void *own;

	scene_make(&s, ""); /* unnamed: the tag's allocations share one file */
	cr_assert_eq(dormant_alloc(s.m, "cold", 40 * MiB, &own), 0, "%s", dormant_last_error());
	fill(s.m, own, 40 * MiB, 8);
	cr_assert_eq(sleep_all(s.m), 0, "%s", dormant_last_error());
	cr_assert_eq(disk_fds().count, 1, "one file for the tag");
	before = disk_fds().allocated;
	held = tag_stats(stats(s.m), "cold")->disk_bytes;
	cr_assert_geq(before, 40 * MiB + BIG, "the file holds the copy (%llu bytes)",
		      (unsigned long long)before);
	cr_assert_eq(dormant_free(s.m, own), 0, "%s", dormant_last_error());
	after = disk_fds().allocated;
	cr_expect_eq(tag_stats(stats(s.m), "cold")->disk_bytes, held - 40 * MiB,
		     "counted off the tag");
	cr_expect_eq(disk_fds().count, 1, "the other allocations' copies are still there");
	cr_expect_leq(after, before - 40 * MiB + 64 * KiB, "its space was punched out "
		      "(%llu of %llu bytes left)", (unsigned long long)after,
		      (unsigned long long)before);
	cr_assert_eq(wake_all(s.m), 0, "%s", dormant_last_error());
	expect_intact(&s);
	cr_expect_eq(tag_stats(stats(s.m), "cold")->disk_bytes, 0);
	dormant_destroy(s.m);
	cr_expect_eq(disk_fds().count, 0, "the file closed by the manager's end");
}

Test(disk, a_file_corrupted_while_asleep_fails_the_wake_and_is_not_restored)
{
	struct scene s;
	struct dormant_report rep;

	scene_make(&s, "");
	cr_assert_eq(sleep_all(s.m), 0);
	cr_assert_eq(dormant_debug_corrupt_host(s.m, (char *)s.big + 5 * MiB + 3, 0x40), 0, "%s",
		     dormant_last_error());
	cr_assert_eq(dormant_wake(s.m, all, &rep), -EIO);
	cr_expect(strstr(rep.error, "disk copy changed after the sleep"), "%s", rep.error);
	cr_expect(strstr(rep.error, "'cold'"), "names the tag: %s", rep.error);
	cr_expect_eq(rep.chunk_mismatches, 1);
	expect_all(s.m, DORMANT_ASLEEP);
	cr_expect_geq(stats(s.m)->disk_bytes, BIG + SMALL, "the disk copy stays for a retry");
	/* the same byte again: the file is whole, and the retry works */
	cr_assert_eq(dormant_debug_corrupt_host(s.m, (char *)s.big + 5 * MiB + 3, 0x40), 0);
	cr_assert_eq(wake_all(s.m), 0, "%s", dormant_last_error());
	expect_intact(&s);
	dormant_destroy(s.m);
}

Test(disk, a_missing_directory_fails_the_sleep_with_everything_on_the_device)
{
	struct scene s;
	char missing[300];
	struct dormant_report rep;

	scene_make(&s, "");
	snprintf(missing, sizeof(missing), "%s/not-there", dir);
	cr_assert_eq(dormant_set_disk_dir(s.m, missing), 0);
	cr_assert_eq(dormant_sleep(s.m, all, &rep), -ENOENT);
	cr_expect(strstr(rep.error, missing), "names the directory: %s", rep.error);
	expect_all(s.m, DORMANT_AWAKE);
	expect_intact(&s);
	cr_expect_eq(stats(s.m)->disk_bytes, 0);
	/* pointed at a directory that exists, the same sleep works */
	cr_assert_eq(dormant_set_disk_dir(s.m, dir), 0);
	cr_assert_eq(sleep_all(s.m), 0, "%s", dormant_last_error());
	cr_assert_eq(wake_all(s.m), 0, "%s", dormant_last_error());
	expect_intact(&s);
	dormant_destroy(s.m);
}

/* Make the test's directory a filesystem of its own (a private mount
 * namespace: it goes when the test's process ends): false when this process
 * may not mount. */
static bool dir_mount(const char *type, const char *options, unsigned long flags)
{
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		return false;
	return mount(type, dir, type, flags, options) == 0;
}

Test(disk, a_full_disk_fails_the_sleep_and_a_retry_with_room_works)
{
	struct scene s;
	struct dormant_report rep;

	if (!dir_mount("tmpfs", "size=4m", 0))
		cr_skip_test("cannot mount a small tmpfs here (%s): the fault-injected "
			     "ENOSPC test covers it", strerror(errno));
	scene_make(&s, "");
	cr_assert_eq(dormant_sleep(s.m, all, &rep), -ENOSPC, "%s", rep.error);
	cr_expect(strstr(rep.error, dir), "names the directory: %s", rep.error);
	expect_all(s.m, DORMANT_AWAKE);
	expect_intact(&s);
	cr_expect_eq(stats(s.m)->disk_bytes, 0);
	cr_expect_eq(dir_entries(), 0);
	/* room made (the tmpfs grown), the same sleep works */
	cr_assert_eq(mount(NULL, dir, NULL, MS_REMOUNT, "size=64m"), 0, "%s", strerror(errno));
	cr_assert_eq(sleep_all(s.m), 0, "%s", dormant_last_error());
	cr_assert_eq(wake_all(s.m), 0, "%s", dormant_last_error());
	expect_intact(&s);
	dormant_destroy(s.m);
	umount(dir);
}

Test(disk, a_read_only_directory_fails_the_sleep_and_a_retry_works)
{
	struct scene s;
	struct dormant_report rep;
	int want;

	if (geteuid() != 0) {
		cr_assert_eq(chmod(dir, 0500), 0);
		want = -EACCES;
	} else {
		/* root writes through permissions: a read-only bind mount */
		if (!dir_mount(dir, NULL, MS_BIND) ||
		    mount(NULL, dir, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) < 0)
			cr_skip_test("root cannot mount here: %s", strerror(errno));
		want = -EROFS;
	}
	scene_make(&s, "");
	cr_assert_eq(dormant_sleep(s.m, all, &rep), want, "%s", rep.error);
	cr_expect(strstr(rep.error, dir), "names the directory: %s", rep.error);
	expect_all(s.m, DORMANT_AWAKE);
	expect_intact(&s);
	if (want == -EACCES)
		cr_assert_eq(chmod(dir, 0700), 0);
	else
		cr_assert_eq(umount(dir), 0);
	cr_assert_eq(sleep_all(s.m), 0, "%s", dormant_last_error());
	cr_assert_eq(wake_all(s.m), 0, "%s", dormant_last_error());
	expect_intact(&s);
	dormant_destroy(s.m);
}

/* Every disk call of a sleep (create, write) and of a wake (read) failing
 * in turn, named files on so that a leftover shows: each failed sleep rolls
 * back with everything on the device and no file; each failed wake leaves
 * the tags asleep with their copies; the retry works. */
Test(disk, every_disk_call_failing_loses_nothing)
{
	for (int wake = 0; wake < 2; wake++) {
		for (unsigned n = 1;; n++) {
			struct scene s;
			uint64_t calls;
			int r;

			scene_make(&s, "disk_names=true");
			if (wake)
				cr_assert_eq(sleep_all(s.m), 0, "%s", dormant_last_error());
			cr_assert_eq(dormant_debug_inject_fault(s.m, DORMANT_FAULT_DISK, n, -ENOSPC,
								false),
				     0);
			calls = dormant_debug_op_count(s.m, DORMANT_FAULT_DISK);
			r = wake ? wake_all(s.m) : sleep_all(s.m);
			if (dormant_debug_op_count(s.m, DORMANT_FAULT_DISK) - calls < n) {
				/* fewer calls than n: the fault never fired */
				cr_assert_eq(r, 0, "%s", dormant_last_error());
				cr_assert_gt(n, 3, "a transition makes several disk calls");
				dormant_destroy(s.m);
				break;
			}
			cr_assert_eq(r, -ENOSPC, "%s %u: %d %s", wake ? "wake" : "sleep", n, r,
				     dormant_last_error());
			cr_expect(strstr(dormant_last_error(), "injected fault: disk"), "%s",
				  dormant_last_error());
			if (wake) {
				expect_all(s.m, DORMANT_ASLEEP);
				cr_expect_geq(stats(s.m)->disk_bytes, BIG + SMALL, "copies kept");
				cr_assert_eq(wake_all(s.m), 0, "retry: %s", dormant_last_error());
			} else {
				expect_all(s.m, DORMANT_AWAKE);
				cr_expect_eq(stats(s.m)->disk_bytes, 0, "sleep %u", n);
				cr_expect_eq(dir_entries(), 0, "sleep %u left a file", n);
				expect_intact(&s);
				cr_assert_eq(sleep_all(s.m), 0, "retry: %s", dormant_last_error());
				cr_assert_eq(wake_all(s.m), 0, "%s", dormant_last_error());
			}
			expect_intact(&s);
			cr_expect_eq(stats(s.m)->disk_bytes, 0);
			expect_no_device_leak(s.m);
			dormant_destroy(s.m);
			cr_expect_eq(dir_entries(), 0);
		}
	}
}

Test(disk, a_wake_short_of_device_memory_keeps_the_disk_copies)
{
	struct scene s;
	const struct dormant_stats *st;

	scene_make(&s, "host_device_bytes=64MiB");
	cr_assert_eq(sleep_all(s.m), 0);
	st = stats(s.m);
	cr_assert_eq(dormant_debug_occupy(s.m, 0, st->devices[0].free_bytes - 4 * MiB), 0, "%s",
		     dormant_last_error());
	cr_assert_eq(wake_all(s.m), -ENOMEM);
	expect_all(s.m, DORMANT_ASLEEP);
	cr_expect_geq(stats(s.m)->disk_bytes, BIG + SMALL);
	cr_assert_eq(dormant_debug_occupy(s.m, 0, 0), 0);
	cr_assert_eq(wake_all(s.m), 0, "%s", dormant_last_error());
	expect_intact(&s);
	dormant_destroy(s.m);
}

Test(disk, several_devices_each_write_their_own)
{
	struct dormant *m = disk_manager("host_devices=2");
	void *p[2];

	if (dormant_device_count(m) < 2) {	/* the CUDA backend on a one-GPU machine */
		dormant_destroy(m);
		cr_skip_test("one device only");
	}
	cr_assert_eq(dormant_set_policy(m, "cold", DORMANT_DISK), 0);
	for (int d = 0; d < 2; d++) {
		cr_assert_eq(dormant_alloc_on(m, "cold", 9 * MiB, d, &p[d]), 0);
		fill(m, p[d], 9 * MiB, 10 + d);
	}
	cr_assert_eq(sleep_all(m), 0, "%s", dormant_last_error());
	cr_expect_geq(stats(m)->disk_bytes, 18 * MiB);
	cr_assert_eq(wake_all(m), 0, "%s", dormant_last_error());
	for (int d = 0; d < 2; d++)
		cr_expect(holds(m, p[d], 9 * MiB, 10 + d), "device %d", d);
	dormant_destroy(m);
}

Test(disk, the_directory_option_and_its_setter)
{
	struct dormant *m = disk_manager("");
	char buf[DORMANT_PATH_MAX];
	char longer[DORMANT_PATH_MAX + 1];
	enum dormant_policy policy;

	cr_assert_gt(dormant_option_value(m, "disk_dir", buf, sizeof(buf)), 0);
	cr_expect_str_eq(buf, dir);
	cr_assert_eq(dormant_set_disk_dir(m, "/var/tmp"), 0);
	cr_assert_gt(dormant_option_value(m, "disk_dir", buf, sizeof(buf)), 0);
	cr_expect_str_eq(buf, "/var/tmp");
	cr_expect_eq(dormant_set_disk_dir(m, ""), -EINVAL);
	cr_expect_eq(dormant_set_disk_dir(m, NULL), -EINVAL);
	cr_expect_eq(dormant_set_disk_dir(m, "relative/dir"), -EINVAL, "an absolute path only");
	memset(longer, 'a', sizeof(longer) - 1);
	longer[sizeof(longer) - 1] = '\0';
	cr_expect_eq(dormant_set_disk_dir(m, longer), -EINVAL);
	cr_assert_gt(dormant_option_value(m, "disk_dir", buf, sizeof(buf)), 0);
	cr_expect_str_eq(buf, "/var/tmp", "a refused directory changes nothing");
	cr_expect_eq(dormant_option_value(m, "disk_dir", buf, 4), -ENOSPC);
	cr_expect_str_eq(dormant_policy_name(DORMANT_DISK), "disk");
	cr_assert_eq(dormant_policy_from_name("disk", &policy), 0);
	cr_expect_eq(policy, DORMANT_DISK);
	cr_expect_eq(dormant_set_thread_policy(DORMANT_DISK), 0);
	cr_expect_eq(dormant_get_thread_policy(), DORMANT_DISK);
	dormant_destroy(m);
}

Test(disk, the_directory_comes_from_the_environment)
{
	struct dormant *m;
	char buf[DORMANT_PATH_MAX];

	setenv("DORMANT_DISK_DIR", dir, 1);
	cr_assert_eq(dormant_new(NULL, &m), 0, "%s", dormant_last_error());
	cr_assert_gt(dormant_option_value(m, "disk_dir", buf, sizeof(buf)), 0);
	cr_expect_str_eq(buf, dir);
	dormant_destroy(m);
	unsetenv("DORMANT_DISK_DIR");
	setenv("TMPDIR", "/var/tmp", 1);
	cr_assert_eq(dormant_new(NULL, &m), 0);
	cr_assert_gt(dormant_option_value(m, "disk_dir", buf, sizeof(buf)), 0);
	cr_expect_str_eq(buf, "/var/tmp", "the default is $TMPDIR");
	dormant_destroy(m);
}
