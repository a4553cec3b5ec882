/* SPDX-License-Identifier: MIT */
/* Unit tests of dormantctl's parts that need no network: endpoint parsing,
 * response reading, retry delays, output. */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "endpoint.h"
#include "outcome.h"
#include "report.h"

static char err[CTL_ERROR_MAX];

/* ---- ports ---------------------------------------------------------------- */

Test(ports, single_range_and_list)
{
	uint16_t p[16];

	cr_assert_eq(ctl_ports_parse("8787", p, 16, err, sizeof(err)), 1);
	cr_assert_eq(p[0], 8787);
	cr_assert_eq(ctl_ports_parse("8787-8794", p, 16, err, sizeof(err)), 8);
	cr_assert_eq(p[0], 8787);
	cr_assert_eq(p[7], 8794);
	cr_assert_eq(ctl_ports_parse("1,65535,10-11", p, 16, err, sizeof(err)), 4);
	cr_assert_eq(p[1], 65535);
	cr_assert_eq(p[3], 11);
}

Test(ports, rejects_bad_lists)
{
	static const char *const bad[] = {
		"", "0", "65536", "x", "80,", ",80", "80-", "-80", "90-80", "8a", "80,80",
		"80-82,81", "1-2-3", " 80", "123456",
	};
	uint16_t p[16];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		cr_expect_lt(ctl_ports_parse(bad[i], p, 16, err, sizeof(err)), 0, "'%s'", bad[i]);
		cr_expect_neq(err[0], '\0', "no message for '%s'", bad[i]);
	}
}

Test(ports, bounded)
{
	uint16_t p[4];

	cr_assert_eq(ctl_ports_parse("1-5", p, 4, err, sizeof(err)), -E2BIG);
	cr_assert_eq(ctl_ports_parse("1-4", p, 4, err, sizeof(err)), 4);
}

/* ---- endpoint specs ------------------------------------------------------- */

struct spec_case {
	const char *spec;
	const char *name;
	const char *url;
	const char *unix_path;
};

Test(endpoints, forms)
{
	static const struct spec_case cases[] = {
		{ "10.0.0.1:9000", "10.0.0.1:9000", "http://10.0.0.1:9000", NULL },
		{ "node-3.example", "node-3.example:8787", "http://node-3.example:8787", NULL },
		{ "http://h:1/", "h:1", "http://h:1", NULL },
		{ "https://h.example:443", "https://h.example:443", "https://h.example:443", NULL },
		{ "[::1]:8788", "[::1]:8788", "http://[::1]:8788", NULL },
		{ "[fd00::2]", "[fd00::2]:8787", "http://[fd00::2]:8787", NULL },
		{ "fd00::3", "[fd00::3]:8787", "http://[fd00::3]:8787", NULL },
		{ "unix:/run/dormant/0.sock", "unix:/run/dormant/0.sock", "http://localhost",
		  "/run/dormant/0.sock" },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct ctl_endpoints list;

		ctl_endpoints_init(&list);
		cr_assert_eq(ctl_endpoints_add_spec(&list, cases[i].spec, NULL, 0, err, sizeof(err)),
			     1, "%s: %s", cases[i].spec, err);
		cr_expect_str_eq(list.items[0].name, cases[i].name);
		cr_expect_str_eq(list.items[0].base_url, cases[i].url);
		if (cases[i].unix_path)
			cr_expect_str_eq(list.items[0].unix_path, cases[i].unix_path);
		else
			cr_expect_null(list.items[0].unix_path);
		ctl_endpoints_finish(&list);
	}
}

Test(endpoints, rejects_bad_specs)
{
	static const char *const bad[] = {
		"", "ftp://h:1", "h:0", "h:65536", "h:x", "h:", "h:1/sleep", "user@h:1",
		"http://h:1/path", "[::1", "[zz::1]:1", "[::1]x", "h h", "-h", "h?x", "unix:",
		"a:b:c", "h:1:2",
	};
	struct ctl_endpoints list;

	ctl_endpoints_init(&list);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		cr_expect_eq(ctl_endpoints_add_spec(&list, bad[i], NULL, 0, err, sizeof(err)), -EINVAL,
			     "'%s' accepted", bad[i]);
		cr_expect_neq(err[0], '\0', "no message for '%s'", bad[i]);
	}
	cr_assert_eq(list.count, 0);
	ctl_endpoints_finish(&list);
}

Test(endpoints, long_unix_path_rejected)
{
	char spec[300] = "unix:/";
	struct ctl_endpoints list;

	memset(spec + 6, 'a', 200);
	ctl_endpoints_init(&list);
	cr_assert_eq(ctl_endpoints_add_spec(&list, spec, NULL, 0, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "longer than"), "%s", err);
	ctl_endpoints_finish(&list);
}

Test(endpoints, host_without_port_expands_over_ports)
{
	uint16_t ports[] = { 8787, 8788, 8789 };
	struct ctl_endpoints list;

	ctl_endpoints_init(&list);
	cr_assert_eq(ctl_endpoints_add_spec(&list, "n1", ports, 3, err, sizeof(err)), 3);
	cr_assert_eq(ctl_endpoints_add_spec(&list, "n2:9000", ports, 3, err, sizeof(err)), 1);
	cr_assert_eq(list.count, 4);
	cr_expect_str_eq(list.items[2].name, "n1:8789");
	cr_expect_str_eq(list.items[3].name, "n2:9000");
	ctl_endpoints_finish(&list);
}

Test(endpoints, count_is_bounded)
{
	uint16_t ports[CTL_PORTS_MAX];
	struct ctl_endpoints list;
	char host[32];
	int r = 0;

	cr_assert_eq(ctl_ports_parse("1-1024", ports, CTL_PORTS_MAX, err, sizeof(err)), 1024);
	ctl_endpoints_init(&list);
	for (int i = 0; i < CTL_ENDPOINTS_MAX / 1024; i++) {
		snprintf(host, sizeof(host), "h%d", i);
		r = ctl_endpoints_add_spec(&list, host, ports, 1024, err, sizeof(err));
		cr_assert_eq(r, 1024);
	}
	cr_assert_eq(list.count, CTL_ENDPOINTS_MAX);
	cr_assert_eq(ctl_endpoints_add_spec(&list, "one-more:1", NULL, 0, err, sizeof(err)), -E2BIG);
	cr_assert_eq(list.count, CTL_ENDPOINTS_MAX);
	ctl_endpoints_finish(&list);
}

Test(endpoints, dedup_keeps_first_order)
{
	static const char *const specs[] = {
		"a:1", "b:1", "http://a:1", "unix:/s", "a:2", "unix:/s", "b:1",
	};
	struct ctl_endpoints list;

	ctl_endpoints_init(&list);
	for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++)
		cr_assert_eq(ctl_endpoints_add_spec(&list, specs[i], NULL, 0, err, sizeof(err)), 1);
	cr_assert_eq(ctl_endpoints_dedup(&list), 3);
	cr_assert_eq(list.count, 4);
	cr_expect_str_eq(list.items[0].name, "a:1");
	cr_expect_str_eq(list.items[1].name, "b:1");
	cr_expect_str_eq(list.items[2].name, "unix:/s");
	cr_expect_str_eq(list.items[3].name, "a:2");
	ctl_endpoints_finish(&list);
}

static char *write_temp(const char *text)
{
	static char path[64];
	int fd;

	snprintf(path, sizeof(path), "/tmp/dormantctl-test-XXXXXX");
	fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	return path;
}

Test(endpoints, file_with_comments_and_blanks)
{
	char *path = write_temp("# ranks of node 0\n\n  10.0.0.1:8787  \n\t10.0.0.1\n"
				"unix:/run/d.sock\n# end\n");
	uint16_t ports[] = { 9000, 9001 };
	struct ctl_endpoints list;

	ctl_endpoints_init(&list);
	cr_assert_eq(ctl_endpoints_add_file(&list, path, ports, 2, err, sizeof(err)), 4, "%s", err);
	cr_expect_str_eq(list.items[0].name, "10.0.0.1:8787");
	cr_expect_str_eq(list.items[2].name, "10.0.0.1:9001");
	cr_expect_str_eq(list.items[3].name, "unix:/run/d.sock");
	ctl_endpoints_finish(&list);
	unlink(path);
}

Test(endpoints, file_errors_name_the_line)
{
	char *path = write_temp("a:1\n# fine\nb:99999\n");
	struct ctl_endpoints list;

	ctl_endpoints_init(&list);
	cr_assert_eq(ctl_endpoints_add_file(&list, path, NULL, 0, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, ":3: "), "%s", err);
	cr_assert(strstr(err, "b:99999"), "%s", err);
	ctl_endpoints_finish(&list);
	unlink(path);

	ctl_endpoints_init(&list);
	cr_assert_eq(ctl_endpoints_add_file(&list, "/nonexistent/list", NULL, 0, err, sizeof(err)),
		     -ENOENT);
	cr_assert(strstr(err, "/nonexistent/list"), "%s", err);
	ctl_endpoints_finish(&list);
}

Test(endpoints, file_line_too_long)
{
	char text[CTL_SPEC_MAX + 64];
	char *path;
	struct ctl_endpoints list;

	memset(text, 'a', sizeof(text) - 2);
	text[sizeof(text) - 2] = '\n';
	text[sizeof(text) - 1] = '\0';
	path = write_temp(text);
	ctl_endpoints_init(&list);
	cr_assert_eq(ctl_endpoints_add_file(&list, path, NULL, 0, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "longer than"), "%s", err);
	ctl_endpoints_finish(&list);
	unlink(path);
}

Test(endpoints, dns_numeric_and_ports)
{
	uint16_t ports[] = { 8787, 8788 };
	struct ctl_endpoints list;

	ctl_endpoints_init(&list);
	cr_assert_eq(ctl_endpoints_add_dns(&list, "127.0.0.1", AF_UNSPEC, ports, 2, err, sizeof(err)),
		     2, "%s", err);
	cr_expect_str_eq(list.items[0].name, "127.0.0.1:8787");
	cr_expect_str_eq(list.items[1].base_url, "http://127.0.0.1:8788");
	cr_assert_eq(ctl_endpoints_add_dns(&list, "::1", AF_INET6, ports, 1, err, sizeof(err)), 1,
		     "%s", err);
	cr_expect_str_eq(list.items[2].name, "[::1]:8787");
	ctl_endpoints_finish(&list);
}

Test(endpoints, dns_localhost_ipv4)
{
	struct ctl_endpoints list;

	ctl_endpoints_init(&list);
	cr_assert_geq(ctl_endpoints_add_dns(&list, "localhost", AF_INET, NULL, 0, err, sizeof(err)),
		      1, "%s", err);
	cr_expect_str_eq(list.items[0].name, "127.0.0.1:8787");
	ctl_endpoints_finish(&list);
}

Test(endpoints, dns_bad_name)
{
	struct ctl_endpoints list;

	ctl_endpoints_init(&list);
	cr_assert_eq(ctl_endpoints_add_dns(&list, "bad name", AF_UNSPEC, NULL, 0, err, sizeof(err)),
		     -EINVAL);
	cr_assert_eq(ctl_endpoints_add_dns(&list, "127.0.0.1", AF_INET6, NULL, 0, err, sizeof(err)),
		     -ENOENT);
	cr_assert_eq(list.count, 0);
	ctl_endpoints_finish(&list);
}

/* ---- responses ------------------------------------------------------------ */

static void read_answer(struct ctl_result *r, enum ctl_command command, long status,
			const char *body)
{
	ctl_result_init(r);
	ctl_result_from_response(r, command, status,
				 status == 200 ? "application/json" : "application/problem+json",
				 body, body ? strlen(body) : 0, true);
}

Test(outcome, sleep_ok)
{
	struct ctl_result r;

	read_answer(&r, CTL_SLEEP, 200,
		    "{\"action\":\"sleep\",\"result\":\"ok\",\"changed\":true,\"state\":\"asleep\","
		    "\"duration_s\":0.25,\"bytes_copied\":100,\"bytes_released\":4096,"
		    "\"bytes_mapped\":0,\"tags\":[]}");
	cr_assert(r.ok);
	cr_expect_str_eq(r.state, "asleep");
	cr_expect_eq(r.changed, 1);
	cr_expect_eq(r.bytes, 4096);
	cr_expect_float_eq(r.duration_s, 0.25, 1e-9);
	cr_expect_str_eq(r.error, "");
	cr_expect(json_is_object(r.response));
	ctl_result_finish(&r);
}

Test(outcome, wake_counts_mapped_bytes)
{
	struct ctl_result r;

	read_answer(&r, CTL_WAKE, 200,
		    "{\"changed\":false,\"state\":\"awake\",\"bytes_released\":7,\"bytes_mapped\":9}");
	cr_assert(r.ok);
	cr_expect_eq(r.changed, 0);
	cr_expect_eq(r.bytes, 9);
	ctl_result_finish(&r);
}

Test(outcome, failed_wake_reads_the_embedded_report)
{
	struct ctl_result r;

	read_answer(&r, CTL_WAKE, 503,
		    "{\"type\":\"urn:dormant:problem:out-of-memory\",\"title\":\"Out of memory\","
		    "\"status\":503,\"detail\":\"cuMemCreate: out of memory\","
		    "\"report\":{\"state\":\"asleep\",\"changed\":false,\"duration_s\":0.5,"
		    "\"bytes_mapped\":0}}");
	cr_assert_not(r.ok);
	cr_expect_eq(r.http_status, 503);
	cr_expect_str_eq(r.problem, "out-of-memory");
	cr_expect_str_eq(r.state, "asleep");
	cr_expect_str_eq(r.error, "HTTP 503 out-of-memory: cuMemCreate: out of memory");
	cr_expect(ctl_status_retryable(r.http_status));
	ctl_result_finish(&r);
}

Test(outcome, problem_without_detail_uses_title)
{
	struct ctl_result r;

	read_answer(&r, CTL_SLEEP, 401,
		    "{\"type\":\"urn:dormant:problem:unauthorized\",\"title\":\"Unauthorized\","
		    "\"status\":401}");
	cr_assert_not(r.ok);
	cr_expect_str_eq(r.error, "HTTP 401 unauthorized: Unauthorized");
	cr_expect_not(ctl_status_retryable(401));
	ctl_result_finish(&r);
}

Test(outcome, not_json)
{
	struct ctl_result r;

	ctl_result_init(&r);
	ctl_result_from_response(&r, CTL_STATS, 502, "text/html", "<html>bad gateway</html>", 24,
				 true);
	cr_assert_not(r.ok);
	cr_expect_str_eq(r.error, "HTTP 502 (text/html)");
	cr_expect_null(r.response);
	ctl_result_finish(&r);

	read_answer(&r, CTL_STATS, 200, "[1,2]");
	cr_assert_not(r.ok);
	cr_expect(strstr(r.error, "not a JSON object"), "%s", r.error);
	ctl_result_finish(&r);

	read_answer(&r, CTL_HEALTH, 200, NULL);
	cr_assert_not(r.ok);
	ctl_result_finish(&r);
}

Test(outcome, control_characters_are_cleaned)
{
	struct ctl_result r;

	read_answer(&r, CTL_SLEEP, 409,
		    "{\"type\":\"urn:dormant:problem:busy\",\"detail\":\"a\\nb\\u001b[31m\"}");
	cr_expect_str_eq(r.error, "HTTP 409 busy: a b [31m");
	ctl_result_finish(&r);
}

/* Found by fuzz-ctl-response: a Content-Type that is not UTF-8 (or a detail
 * cut inside a UTF-8 sequence) made the JSON report fail as out of memory. */
Test(outcome, bytes_outside_ascii_are_shown_as_question_marks)
{
	struct ctl_endpoints list;
	struct ctl_result r;
	char long_detail[1024];
	char *text = NULL;
	size_t size = 0;
	FILE *out;

	ctl_endpoints_init(&list);
	cr_assert_eq(ctl_endpoints_add_spec(&list, "a:1", NULL, 0, err, sizeof(err)), 1);
	ctl_result_init(&r);
	ctl_result_from_response(&r, CTL_READY, 289, "\xf4text/html", "<html>", 6, false);
	cr_expect_str_eq(r.error, "HTTP 289 (?text/html)");
	out = open_memstream(&text, &size);
	cr_expect_eq(ctl_report_json(out, CTL_READY, NULL, &list, &r), 0);
	fclose(out);
	free(text);
	ctl_result_finish(&r);

	/* "\u00e9" is two bytes in UTF-8: 300 of them are cut somewhere */
	strcpy(long_detail, "{\"detail\":\"");
	for (int i = 0; i < 100; i++)
		strcat(long_detail, "\\u00e9");
	strcat(long_detail, "\"}");
	read_answer(&r, CTL_SLEEP, 500, long_detail);
	cr_expect(strncmp(r.error, "HTTP 500: ??", 12) == 0, "%s", r.error);
	text = NULL;
	out = open_memstream(&text, &size);
	cr_expect_eq(ctl_report_json(out, CTL_SLEEP, NULL, &list, &r), 0);
	fclose(out);
	free(text);
	ctl_result_finish(&r);
	ctl_endpoints_finish(&list);
}

Test(outcome, stats_reads_totals_and_health)
{
	struct ctl_result r;

	read_answer(&r, CTL_STATS, 200,
		    "{\"state\":\"mixed\",\"healthy\":true,\"totals\":{\"device_bytes\":1024,"
		    "\"host_bytes\":2048}}");
	cr_assert(r.ok);
	cr_expect_str_eq(r.state, "mixed");
	cr_expect_eq(r.bytes, 1024);
	cr_expect_eq(r.host_bytes, 2048);
	ctl_result_finish(&r);

	read_answer(&r, CTL_STATS, 200,
		    "{\"state\":\"asleep\",\"healthy\":false,\"health_error\":\"rollback failed\"}");
	cr_assert_not(r.ok);
	cr_expect_str_eq(r.error, "unhealthy: rollback failed");
	ctl_result_finish(&r);
}

Test(outcome, probes)
{
	struct ctl_result r;

	read_answer(&r, CTL_HEALTH, 200, "{\"status\":\"ok\"}");
	cr_assert(r.ok);
	cr_expect_str_eq(r.state, "ok");
	ctl_result_finish(&r);

	read_answer(&r, CTL_READY, 503,
		    "{\"type\":\"urn:dormant:problem:not-ready\",\"status\":503,\"detail\":\"x\"}");
	cr_assert_not(r.ok);
	cr_expect_str_eq(r.problem, "not-ready");
	ctl_result_finish(&r);
}

Test(outcome, commands)
{
	cr_assert_str_eq(ctl_command_find("sleep")->path, "/sleep");
	cr_assert_str_eq(ctl_command_find("wake")->method, "POST");
	cr_assert_str_eq(ctl_command_find("health")->path, "/healthz");
	cr_assert_str_eq(ctl_command_find("ready")->path, "/readyz");
	cr_assert_str_eq(ctl_command_find("stats")->method, "GET");
	cr_assert_null(ctl_command_find("reboot"));
	cr_assert(ctl_command_find("wake")->transition);
	cr_assert_not(ctl_command_find("stats")->transition);
}

/* ---- retries -------------------------------------------------------------- */

Test(retry, doubles_with_jitter_and_cap)
{
	struct ctl_retry_policy p = { .retries = 10, .backoff_s = 0.5, .max_delay_s = 30 };

	/* jitter factor 0.5 at random 0, just under 1 near 1 */
	cr_expect_float_eq(ctl_retry_delay_s(&p, 1, -1, 0), 0.25, 1e-9);
	cr_expect_float_eq(ctl_retry_delay_s(&p, 2, -1, 0), 0.5, 1e-9);
	cr_expect_float_eq(ctl_retry_delay_s(&p, 3, -1, 0), 1.0, 1e-9);
	cr_expect_float_eq(ctl_retry_delay_s(&p, 3, -1, 0.5), 1.5, 1e-9);
	cr_expect_lt(ctl_retry_delay_s(&p, 3, -1, 0.999999), 2.0);
	cr_expect_float_eq(ctl_retry_delay_s(&p, 40, -1, 0.999), 30, 1e-9);
	cr_expect_float_eq(ctl_retry_delay_s(&p, 1000000, -1, 0.999), 30, 1e-9);
	/* a random value out of range counts as 0 */
	cr_expect_float_eq(ctl_retry_delay_s(&p, 1, -1, NAN), 0.25, 1e-9);
	cr_expect_float_eq(ctl_retry_delay_s(&p, 1, -1, 7), 0.25, 1e-9);
}

Test(retry, honours_retry_after)
{
	struct ctl_retry_policy p = { .retries = 3, .backoff_s = 0.1, .max_delay_s = 30 };

	cr_expect_float_eq(ctl_retry_delay_s(&p, 1, 5, 0), 5, 1e-9);
	cr_expect_float_eq(ctl_retry_delay_s(&p, 1, 5, 0.5), 5.5, 1e-9);
	cr_expect_geq(ctl_retry_delay_s(&p, 2, 2, 0.99), 2);
	/* the backoff wins when it is longer */
	p.backoff_s = 20;
	cr_expect_float_eq(ctl_retry_delay_s(&p, 1, 5, 0), 10, 1e-9);
	/* and --max-delay caps Retry-After too */
	p.max_delay_s = 1;
	cr_expect_float_eq(ctl_retry_delay_s(&p, 1, 120, 0), 1, 1e-9);
	p.max_delay_s = 0;
	cr_expect_float_eq(ctl_retry_delay_s(&p, 1, 120, 0), 0, 1e-9);
}

Test(retry, statuses)
{
	cr_assert(ctl_status_retryable(503));
	cr_assert_not(ctl_status_retryable(500));
	cr_assert_not(ctl_status_retryable(409));
	cr_assert_not(ctl_status_retryable(200));
}

/* ---- output --------------------------------------------------------------- */

Test(report, bytes)
{
	char buf[32];

	ctl_format_bytes(-1, buf, sizeof(buf));
	cr_expect_str_eq(buf, "-");
	ctl_format_bytes(0, buf, sizeof(buf));
	cr_expect_str_eq(buf, "0 B");
	ctl_format_bytes(1023, buf, sizeof(buf));
	cr_expect_str_eq(buf, "1023 B");
	ctl_format_bytes(16 << 20, buf, sizeof(buf));
	cr_expect_str_eq(buf, "16.0 MiB");
	ctl_format_bytes(3ll << 40, buf, sizeof(buf));
	cr_expect_str_eq(buf, "3.0 TiB");
	ctl_format_bytes(INT64_MAX, buf, sizeof(buf));
	cr_expect_str_eq(buf, "8192.0 PiB");
}

static void two_results(struct ctl_endpoints *list, struct ctl_result r[2])
{
	ctl_endpoints_init(list);
	cr_assert_eq(ctl_endpoints_add_spec(list, "a:1", NULL, 0, err, sizeof(err)), 1);
	cr_assert_eq(ctl_endpoints_add_spec(list, "unix:/s", NULL, 0, err, sizeof(err)), 1);
	read_answer(&r[0], CTL_SLEEP, 200,
		    "{\"state\":\"asleep\",\"changed\":true,\"duration_s\":1.5,\"bytes_released\":2048}");
	r[0].attempts = 1;
	r[0].elapsed_s = 1.6;
	ctl_result_init(&r[1]);
	r[1].attempts = 5;
	snprintf(r[1].error, sizeof(r[1].error), "cannot connect: Connection refused (5 attempts)");
}

Test(report, table)
{
	struct ctl_endpoints list;
	struct ctl_result r[2];
	char *text = NULL;
	size_t size = 0;
	FILE *out = open_memstream(&text, &size);

	two_results(&list, r);
	ctl_report_table(out, CTL_SLEEP, &list, r);
	fclose(out);
	cr_expect(strstr(text, "ENDPOINT"), "%s", text);
	cr_expect(strstr(text, "\na:1       asleep  2.0 KiB    1.500s\n"), "%s", text);
	cr_expect(strstr(text, "\nunix:/s   -             -         -  cannot connect"), "%s", text);
	cr_expect(strstr(text, "2 endpoints: 1 ok, 1 failed\n"), "%s", text);
	free(text);

	text = NULL;
	out = open_memstream(&text, &size);
	ctl_report_failures(out, &list, r);
	fclose(out);
	cr_expect_str_eq(text, "dormantctl: unix:/s: cannot connect: Connection refused (5 attempts)\n");
	free(text);
	ctl_result_finish(&r[0]);
	ctl_result_finish(&r[1]);
	ctl_endpoints_finish(&list);
}

Test(report, json)
{
	static const char *const tags[] = { "weights", "grads", NULL };
	struct ctl_endpoints list;
	struct ctl_result r[2];
	char *text = NULL;
	size_t size = 0;
	FILE *out = open_memstream(&text, &size);
	json_error_t jerr;
	json_t *doc, *first, *second;

	two_results(&list, r);
	cr_assert_eq(ctl_report_json(out, CTL_SLEEP, tags, &list, r), 0);
	fclose(out);
	doc = json_loads(text, 0, &jerr);
	cr_assert(doc, "%s: %s", jerr.text, text);
	cr_expect_str_eq(json_string_value(json_object_get(doc, "command")), "sleep");
	cr_expect_eq(json_array_size(json_object_get(doc, "tags")), 2);
	cr_expect_eq(json_integer_value(json_object_get(doc, "ok")), 1);
	cr_expect_eq(json_integer_value(json_object_get(doc, "failed")), 1);
	first = json_array_get(json_object_get(doc, "results"), 0);
	second = json_array_get(json_object_get(doc, "results"), 1);
	cr_expect_str_eq(json_string_value(json_object_get(first, "url")), "http://a:1/sleep");
	cr_expect(json_is_true(json_object_get(first, "ok")));
	cr_expect_eq(json_integer_value(json_object_get(first, "bytes")), 2048);
	cr_expect(json_is_null(json_object_get(first, "error")));
	cr_expect_str_eq(json_string_value(json_object_get(json_object_get(first, "response"),
							   "state")), "asleep");
	cr_expect_str_eq(json_string_value(json_object_get(second, "unix_socket")), "/s");
	cr_expect(json_is_false(json_object_get(second, "ok")));
	cr_expect(json_is_null(json_object_get(second, "http_status")));
	cr_expect_eq(json_integer_value(json_object_get(second, "attempts")), 5);
	cr_expect(json_is_null(json_object_get(second, "state")));
	json_decref(doc);
	free(text);
	ctl_result_finish(&r[0]);
	ctl_result_finish(&r[1]);
	ctl_endpoints_finish(&list);
}
