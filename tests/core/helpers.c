/* SPDX-License-Identifier: MIT */
#include "helpers.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void pin_pieces_small(void)
{
	setenv("DORMANT_PIN_PIECE_BYTES", "1MiB", 1);
}

void unpinned(void)
{
	setenv("DORMANT_PIN_HOST", "0", 1);
}

bool on_host(struct dormant *m)
{
	return strcmp(dormant_backend_name(m), "host") == 0;
}

struct dormant *manager_from(const char *fmt, ...)
{
	struct dormant_options *o = NULL;
	struct dormant *m = NULL;
	char text[512];
	va_list ap;
	int r;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	cr_assert_eq(dormant_options_new(&o), 0);
	/* no background warm-up unless a test asks: a run between a test's
	 * steps would take host allocations its fault rules count */
	if (!strstr(text, "warmup"))
		cr_assert_eq(dormant_options_set(o, "warmup", "off"), 0);
	r = dormant_options_parse(o, text);
	cr_assert_eq(r, 0, "options \"%s\": %s", text, dormant_last_error());
	r = dormant_new(o, &m);
	dormant_options_destroy(o);
	cr_assert_eq(r, 0, "dormant_new: %s", dormant_last_error());
	return m;
}

struct dormant *manager_with(enum dormant_host_mode mode, size_t chunk_bytes)
{
	/* 8 MiB of staging: 2 MiB slots, several pieces per chunk */
	return manager_from("host_mode=%s,chunk_bytes=%zu,staging_bytes=8MiB,guard_timeout_ms=5000,"
			    "copy_threads=2",
			    dormant_host_mode_name(mode), chunk_bytes);
}

struct dormant *manager(void)
{
	return manager_with(DORMANT_HOST_RELEASE, 4 * MiB);
}

static uint64_t pattern_word(uint64_t seed, size_t i)
{
	uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 1;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint8_t pattern_byte(uint64_t seed, size_t at)
{
	return (uint8_t)(pattern_word(seed, at / 8) >> (8 * (at % 8)));
}

void pattern_make(uint8_t *buf, size_t offset, size_t size, uint64_t seed)
{
	size_t i = 0;

	/* byte by byte up to a word boundary, then whole words */
	for (; i < size && (offset + i) % 8; i++)
		buf[i] = pattern_byte(seed, offset + i);
	for (; i + 8 <= size; i += 8) {
		uint64_t w = pattern_word(seed, (offset + i) / 8);

		memcpy(buf + i, &w, 8); /* little-endian, as pattern_byte() */
	}
	for (; i < size; i++)
		buf[i] = pattern_byte(seed, offset + i);
}

void fill(struct dormant *m, void *dev, size_t size, uint64_t seed)
{
	uint8_t *buf = malloc(size);

	cr_assert_not_null(buf);
	pattern_make(buf, 0, size, seed);
	cr_assert_eq(dormant_copy_to_device(m, dev, buf, size), 0, "%s", dormant_last_error());
	free(buf);
}

bool holds_at(struct dormant *m, const void *dev, size_t offset, size_t size, uint64_t seed)
{
	uint8_t *want = malloc(size), *got = malloc(size);
	bool same;

	cr_assert(want && got);
	if (seed)
		pattern_make(want, offset, size, seed);
	else
		memset(want, 0, size);
	cr_assert_eq(dormant_copy_to_host(m, got, (const char *)dev + offset, size), 0, "%s",
		     dormant_last_error());
	same = memcmp(want, got, size) == 0;
	free(want);
	free(got);
	return same;
}

bool holds(struct dormant *m, const void *dev, size_t size, uint64_t seed)
{
	return holds_at(m, dev, 0, size, seed);
}

struct dormant_stats *stats(struct dormant *m)
{
	static _Thread_local struct dormant_stats s;

	cr_assert_eq(dormant_stats_get(m, &s), 0, "%s", dormant_last_error());
	return &s;
}

const struct dormant_tag_stats *tag_stats(const struct dormant_stats *s, const char *tag)
{
	for (size_t i = 0; i < s->tag_count; i++)
		if (strcmp(s->tags[i].tag, tag) == 0)
			return &s->tags[i];
	cr_assert_fail("no tag %s in stats", tag);
	return NULL;
}

void expect_no_device_leak(struct dormant *m)
{
	struct dormant_stats *s = stats(m);
	struct dormant_residue_stats r;
	unsigned long long residue = 0;
	char value[64];

	if (!on_host(m))
		return;
	/* the simulated context (host_residue_bytes), unless checkpointed */
	cr_assert_eq(dormant_residue_stats_get(m, &r), 0);
	if (r.state != DORMANT_RESIDUE_CHECKPOINTED &&
	    dormant_option_value(m, "host_residue_bytes", value, sizeof(value)) > 0)
		residue = strtoull(value, NULL, 10);
	for (size_t i = 0; i < s->device_count; i++)
		cr_expect_eq(s->devices[i].total_bytes - s->devices[i].free_bytes,
			     s->devices[i].managed_bytes + residue,
			     "device %d: used %llu, managed %llu, residue %llu", s->devices[i].ordinal,
			     (unsigned long long)(s->devices[i].total_bytes - s->devices[i].free_bytes),
			     (unsigned long long)s->devices[i].managed_bytes, residue);
}

uint64_t host_bytes_settled(struct dormant *m, uint64_t want)
{
	uint64_t got = 0;

	for (int i = 0; i < 1000; i++) {
		got = stats(m)->host_bytes;
		if (got == want)
			break;
		usleep(10000);
	}
	return got;
}

uint64_t host_bytes_unpinned(struct dormant *m)
{
	cr_assert_eq(dormant_set_host_mode(m, dormant_host_mode(m)), 0, "%s", dormant_last_error());
	return stats(m)->host_bytes;
}

void expect_all(struct dormant *m, enum dormant_state state)
{
	struct dormant_stats *s = stats(m);

	for (size_t i = 0; i < s->tag_count; i++)
		cr_expect_eq(s->tags[i].state, state, "tag %s is %s", s->tags[i].tag,
			     dormant_state_name(s->tags[i].state));
}

/* Rss and LazyFree of /proc/self/smaps_rollup, in bytes. */
static void smaps_rollup(long *rss, long *lazyfree)
{
	char line[256];
	long kib;
	FILE *f = fopen("/proc/self/smaps_rollup", "r");

	cr_assert_not_null(f);
	*rss = -1;
	*lazyfree = 0;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "Rss: %ld kB", &kib) == 1)
			*rss = kib * 1024;
		else if (sscanf(line, "LazyFree: %ld kB", &kib) == 1)
			*lazyfree = kib * 1024;
	}
	fclose(f);
	cr_assert_geq(*rss, 0, "no Rss in smaps_rollup");
}

long rss_bytes(void)
{
	long rss, lazyfree;

	smaps_rollup(&rss, &lazyfree);
	return rss - lazyfree;
}

long lazyfree_bytes(void)
{
	long rss, lazyfree;

	smaps_rollup(&rss, &lazyfree);
	return lazyfree;
}
