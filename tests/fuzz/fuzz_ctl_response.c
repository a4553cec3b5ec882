/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer harness: dormantctl's reading of a server's answer
 * (ctl/outcome.c) and its reports of it (ctl/report.c). The input is one
 * byte for the command and the keep flag, two for the HTTP status, a
 * Content-Type line, then the body. A result must say ok exactly when it has
 * no error, be ok only for a 200, and show only printable ASCII; the table,
 * the JSON report and the failure lines must be written.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "endpoint.h"
#include "outcome.h"
#include "report.h"

static struct ctl_endpoints endpoints;
static FILE *sink;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	char err[CTL_ERROR_MAX];

	ctl_endpoints_init(&endpoints);
	CHECK(ctl_endpoints_add_spec(&endpoints, "10.0.0.1:8787", NULL, 0, err, sizeof(err)) == 1);
	sink = fopen("/dev/null", "w");
	CHECK(sink);
	return 0;
}

static void check_shown(const char *s, size_t size)
{
	const char *end = memchr(s, '\0', size);

	CHECK(end);
	for (; s < end; s++)
		CHECK(!iscntrl((unsigned char)*s) && (unsigned char)*s < 0x80);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size)
{
	static const char *const tags[] = { "weights", NULL };
	const unsigned char *nl;
	enum ctl_command command;
	struct ctl_result r;
	char *content_type;
	bool keep, with_tags;
	long status;

	if (size < 3)
		return 0;
	command = (enum ctl_command)(data[0] % 5);
	keep = data[0] & 0x80;
	with_tags = data[0] & 0x40;
	status = (long)(data[1] << 8 | data[2]) % 1000;
	data += 3;
	size -= 3;
	nl = memchr(data, '\n', size);
	content_type = nl ? strndup((const char *)data, (size_t)(nl - data)) : NULL;
	if (nl) {
		size -= (size_t)(nl - data) + 1;
		data = nl + 1;
	}

	ctl_result_init(&r);
	r.attempts = 1;
	ctl_result_from_response(&r, command, status, content_type, (const char *)data, size,
				 keep);
	CHECK(r.ok == (r.error[0] == '\0'));
	CHECK(!r.ok || status == 200);
	CHECK(r.http_status == status);
	check_shown(r.state, sizeof(r.state));
	check_shown(r.problem, sizeof(r.problem));
	check_shown(r.error, sizeof(r.error));
	CHECK(r.bytes >= -1 && r.host_bytes >= -1);
	CHECK(r.changed >= -1 && r.changed <= 1);
	CHECK(keep || !r.response);

	ctl_report_table(sink, command, &endpoints, &r);
	CHECK(ctl_report_json(sink, command, with_tags ? tags : NULL, &endpoints, &r) == 0);
	ctl_report_failures(sink, &endpoints, &r);
	ctl_result_finish(&r);
	free(content_type);
	return 0;
}
