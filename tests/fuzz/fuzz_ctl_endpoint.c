/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness: dormantctl's endpoint lists (ctl/endpoint.c). The
 * input's first line is a port list, the rest an endpoint file; each line
 * is also given as a spec of its own. Checks: a port list gives distinct
 * ports 1..65535 within the limit; every endpoint added has a name and an
 * http(s) URL (or a socket path) without control characters; a file adds
 * exactly what its lines add one by one, and deduplication keeps the first
 * of each.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "endpoint.h"

#define PORTS_MAX 64

static char file_path[] = "/tmp/fuzz-ctl-endpoint.XXXXXX";

static void cleanup(void)
{
	unlink(file_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	int fd = mkstemp(file_path);

	CHECK(fd >= 0);
	close(fd);
	atexit(cleanup);
	return 0;
}

static void check_clean(const char *s)
{
	CHECK(s && *s);
	for (; *s; s++)
		CHECK(!iscntrl((unsigned char)*s));
}

static void check_endpoints(const struct ctl_endpoints *list)
{
	CHECK(list->count <= list->capacity);
	for (size_t i = 0; i < list->count; i++) {
		const struct ctl_endpoint *e = &list->items[i];

		check_clean(e->name);
		check_clean(e->base_url);
		CHECK(strncmp(e->base_url, "http://", 7) == 0 ||
		      strncmp(e->base_url, "https://", 8) == 0);
		if (e->unix_path)
			check_clean(e->unix_path);
	}
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
	const unsigned char *nl = memchr(data, '\n', size);
	char *spec = strndup((const char *)data, nl ? (size_t)(nl - data) : size);
	struct ctl_endpoints from_file, one_by_one;
	uint16_t ports[PORTS_MAX];
	char err[CTL_ERROR_MAX];
	size_t nports = 0, rest = nl ? size - (size_t)(nl - data) - 1 : 0;
	int r, total;
	FILE *f;

	CHECK(spec);
	r = ctl_ports_parse(spec, ports, PORTS_MAX, err, sizeof(err));
	if (r >= 0) {
		CHECK(r >= 1 && r <= PORTS_MAX);
		nports = (size_t)r;
		for (size_t i = 0; i < nports; i++) {
			CHECK(ports[i] >= 1);
			for (size_t j = 0; j < i; j++)
				CHECK(ports[i] != ports[j]);
		}
	} else {
		CHECK(err[0]);
		nports = 0;
	}
	free(spec);

	/* the rest as a file */
	ctl_endpoints_init(&from_file);
	f = fopen(file_path, "w");
	CHECK(f);
	if (rest)
		CHECK(fwrite(nl + 1, 1, rest, f) == rest);
	CHECK(fclose(f) == 0);
	total = ctl_endpoints_add_file(&from_file, file_path, nports ? ports : NULL, nports, err,
				       sizeof(err));
	CHECK(total < 0 ? err[0] != '\0' : (size_t)total == from_file.count);
	check_endpoints(&from_file);

	/* the same lines one by one (the file's trimming done here) */
	ctl_endpoints_init(&one_by_one);
	if (total >= 0 && rest) {
		char *copy = strndup((const char *)nl + 1, rest), *line, *cursor = copy;

		CHECK(copy);
		/* a NUL inside cuts a line for fgets too: only compare NUL-free input */
		if (!memchr(nl + 1, '\0', rest)) {
			while ((line = strsep(&cursor, "\n"))) {
				size_t len = strlen(line);

				while (len > 0 && isspace((unsigned char)line[len - 1]))
					line[--len] = '\0';
				while (isspace((unsigned char)*line))
					line++;
				if (!*line || *line == '#')
					continue;
				r = ctl_endpoints_add_spec(&one_by_one, line, nports ? ports : NULL,
							   nports, err, sizeof(err));
				CHECK(r > 0);
			}
			CHECK(one_by_one.count == from_file.count);
			for (size_t i = 0; i < from_file.count; i++)
				CHECK(strcmp(one_by_one.items[i].base_url,
					     from_file.items[i].base_url) == 0);
		}
		free(copy);
	}

	/* dedup: no two left alike, and never more dropped than there were */
	size_t before = from_file.count, dropped = ctl_endpoints_dedup(&from_file);

	CHECK(dropped <= before && from_file.count == before - dropped);
	for (size_t i = 0; i < from_file.count; i++)
		for (size_t j = 0; j < i && j < 64; j++)
			CHECK(strcmp(from_file.items[i].base_url, from_file.items[j].base_url) != 0 ||
			      (from_file.items[i].unix_path && from_file.items[j].unix_path &&
			       strcmp(from_file.items[i].unix_path, from_file.items[j].unix_path) != 0));
	check_endpoints(&from_file);
	ctl_endpoints_finish(&from_file);
	ctl_endpoints_finish(&one_by_one);
	return 0;
}
