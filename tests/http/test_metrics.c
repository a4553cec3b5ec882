/* SPDX-License-Identifier: MIT */
/*
 * GET /metrics read back with a small parser of the Prometheus text
 * exposition format 0.0.4: every line must parse, every sample must belong
 * to a family declared once with TYPE before it, families must not be split,
 * histograms must be cumulative and end in +Inf = _count, and the values
 * must say what happened.
 */
#include <criterion/criterion.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

#define MAX_SAMPLES 2048
#define MAX_FAMILIES 128
#define MAX_LABELS 8

struct sample {
	char name[128];
	char family[128];
	size_t label_count;
	char keys[MAX_LABELS][64];
	char values[MAX_LABELS][128];
	double value;
};

struct family {
	char name[128];
	char type[32];
	bool has_help;
	bool closed; /* another family's samples came after its own */
};

struct exposition {
	struct sample samples[MAX_SAMPLES];
	size_t sample_count;
	struct family families[MAX_FAMILIES];
	size_t family_count;
};

static bool is_name(const char *s, size_t len, bool metric)
{
	if (len == 0)
		return false;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		bool ok = isalpha((unsigned char)c) || c == '_' || (metric && c == ':') ||
			  (i > 0 && isdigit((unsigned char)c));

		if (!ok)
			return false;
	}
	return true;
}

static struct family *family_find(struct exposition *e, const char *name)
{
	for (size_t i = 0; i < e->family_count; i++)
		if (strcmp(e->families[i].name, name) == 0)
			return &e->families[i];
	return NULL;
}

/* The family a sample name belongs to: itself, or for a histogram the name
 * without _bucket, _sum or _count. */
static struct family *family_of(struct exposition *e, const char *sample_name, char *ret,
				size_t size)
{
	static const char *const suffixes[] = { "_bucket", "_sum", "_count" };
	char name[128];
	struct family *fam;

	snprintf(name, sizeof(name), "%s", sample_name);
	fam = family_find(e, name);

	snprintf(ret, size, "%s", name);
	if (fam)
		return fam;
	for (size_t i = 0; i < 3; i++) {
		size_t n = strlen(name), s = strlen(suffixes[i]);

		if (n > s && strcmp(name + n - s, suffixes[i]) == 0) {
			snprintf(ret, size, "%.*s", (int)(n - s), name);
			fam = family_find(e, ret);
			if (fam && strcmp(fam->type, "histogram") == 0)
				return fam;
		}
	}
	return NULL;
}

static double parse_value(const char *text)
{
	char *end;
	double v;

	if (strcmp(text, "+Inf") == 0)
		return INFINITY;
	if (strcmp(text, "-Inf") == 0)
		return -INFINITY;
	if (strcmp(text, "NaN") == 0)
		return NAN;
	v = strtod(text, &end);
	cr_assert(end != text && *end == '\0', "bad value '%s'", text);
	return v;
}

static void parse_comment(struct exposition *e, const char *line)
{
	char name[128], type[32];
	struct family *fam;

	if (strncmp(line, "# HELP ", 7) == 0) {
		cr_assert_eq(sscanf(line + 7, "%127s", name), 1, "%s", line);
		fam = family_find(e, name);
		if (!fam) {
			cr_assert_lt(e->family_count, MAX_FAMILIES);
			fam = &e->families[e->family_count++];
			snprintf(fam->name, sizeof(fam->name), "%s", name);
		}
		cr_assert_not(fam->has_help, "HELP twice for %s", name);
		fam->has_help = true;
		return;
	}
	if (strncmp(line, "# TYPE ", 7) == 0) {
		cr_assert_eq(sscanf(line + 7, "%127s %31s", name, type), 2, "%s", line);
		cr_assert(is_name(name, strlen(name), true), "%s", line);
		cr_assert(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 ||
				  strcmp(type, "histogram") == 0 || strcmp(type, "summary") == 0 ||
				  strcmp(type, "untyped") == 0,
			  "%s", line);
		fam = family_find(e, name);
		if (!fam) {
			cr_assert_lt(e->family_count, MAX_FAMILIES);
			fam = &e->families[e->family_count++];
			snprintf(fam->name, sizeof(fam->name), "%s", name);
		}
		cr_assert_eq(fam->type[0], '\0', "TYPE twice for %s", name);
		snprintf(fam->type, sizeof(fam->type), "%s", type);
		return;
	}
	/* other comments are allowed and ignored */
}

static void parse_sample(struct exposition *e, const char *line, struct family **current)
{
	struct sample *s;
	const char *p = line, *name_end;
	char value[64];
	struct family *fam;

	cr_assert_lt(e->sample_count, MAX_SAMPLES);
	s = &e->samples[e->sample_count++];
	memset(s, 0, sizeof(*s));
	name_end = p + strcspn(p, "{ ");
	cr_assert(is_name(p, (size_t)(name_end - p), true), "bad name in '%s'", line);
	snprintf(s->name, sizeof(s->name), "%.*s", (int)(name_end - p), p);
	p = name_end;
	if (*p == '{') {
		p++;
		while (*p != '}') {
			const char *key_end = p + strcspn(p, "=");
			size_t n = 0;

			cr_assert(*key_end == '=', "bad labels in '%s'", line);
			cr_assert(is_name(p, (size_t)(key_end - p), false), "bad label in '%s'", line);
			cr_assert_lt(s->label_count, MAX_LABELS);
			snprintf(s->keys[s->label_count], sizeof(s->keys[0]), "%.*s",
				 (int)(key_end - p), p);
			p = key_end + 1;
			cr_assert(*p == '"', "unquoted label value in '%s'", line);
			for (p++; *p != '"'; p++) {
				cr_assert(*p && *p != '\n', "unterminated label value in '%s'", line);
				if (*p == '\\') {
					p++;
					cr_assert(*p == '\\' || *p == '"' || *p == 'n',
						  "bad escape in '%s'", line);
				}
				cr_assert_lt(n, sizeof(s->values[0]) - 1);
				s->values[s->label_count][n++] = *p;
			}
			s->label_count++;
			p++;
			if (*p == ',')
				p++;
			else
				cr_assert(*p == '}', "bad label list in '%s'", line);
		}
		p++;
	}
	cr_assert(*p == ' ', "no value in '%s'", line);
	p++;
	cr_assert_eq(sscanf(p, "%63s", value), 1, "%s", line);
	s->value = parse_value(value);

	fam = family_of(e, s->name, s->family, sizeof(s->family));
	cr_assert(fam && fam->type[0], "sample '%s' has no TYPE before it", s->name);
	cr_assert_not(fam->closed, "family %s is split", fam->name);
	if (*current && *current != fam)
		(*current)->closed = true;
	*current = fam;
}

static void parse(struct exposition *e, const char *text)
{
	struct family *current = NULL;
	const char *line = text;

	memset(e, 0, sizeof(*e));
	cr_assert(strlen(text) > 0 && text[strlen(text) - 1] == '\n', "no final newline");
	while (*line) {
		const char *end = strchr(line, '\n');
		char buf[1024];

		cr_assert(end);
		cr_assert_lt((size_t)(end - line), sizeof(buf));
		snprintf(buf, sizeof(buf), "%.*s", (int)(end - line), line);
		if (buf[0] == '#')
			parse_comment(e, buf);
		else if (buf[0])
			parse_sample(e, buf, &current);
		line = end + 1;
	}
	/* no two samples with the same name and labels */
	for (size_t i = 0; i < e->sample_count; i++)
		for (size_t j = i + 1; j < e->sample_count; j++) {
			const struct sample *a = &e->samples[i], *b = &e->samples[j];
			bool same = strcmp(a->name, b->name) == 0 && a->label_count == b->label_count;

			for (size_t k = 0; same && k < a->label_count; k++)
				same = strcmp(a->keys[k], b->keys[k]) == 0 &&
				       strcmp(a->values[k], b->values[k]) == 0;
			cr_assert_not(same, "duplicate sample %s", a->name);
		}
}

static const char *label(const struct sample *s, const char *key)
{
	for (size_t i = 0; i < s->label_count; i++)
		if (strcmp(s->keys[i], key) == 0)
			return s->values[i];
	return NULL;
}

/* The value of the sample with this name and these labels ("k=v,k=v"). */
static bool value_of(const struct exposition *e, const char *name, const char *labels,
		     double *ret)
{
	for (size_t i = 0; i < e->sample_count; i++) {
		const struct sample *s = &e->samples[i];
		char want[256];
		bool match;
		char *save, *pair;

		if (strcmp(s->name, name) != 0)
			continue;
		snprintf(want, sizeof(want), "%s", labels ? labels : "");
		match = true;
		size_t wanted = 0;
		for (pair = strtok_r(want, ",", &save); pair && match;
		     pair = strtok_r(NULL, ",", &save)) {
			char *eq = strchr(pair, '=');

			cr_assert(eq);
			*eq = '\0';
			wanted++;
			match = label(s, pair) && strcmp(label(s, pair), eq + 1) == 0;
		}
		if (match && wanted == s->label_count) {
			*ret = s->value;
			return true;
		}
	}
	return false;
}

static double must(const struct exposition *e, const char *name, const char *labels)
{
	double v;

	cr_assert(value_of(e, name, labels, &v), "no sample %s{%s}", name, labels ? labels : "");
	return v;
}

static void check_histogram(const struct exposition *e, const char *kind)
{
	double previous_le = -INFINITY, previous = 0, inf = -1, count;
	char want[32];

	snprintf(want, sizeof(want), "%s", kind);
	for (size_t i = 0; i < e->sample_count; i++) {
		const struct sample *s = &e->samples[i];
		double le;

		if (strcmp(s->name, "dormant_transition_duration_seconds_bucket") != 0 ||
		    strcmp(label(s, "kind"), kind) != 0)
			continue;
		cr_assert(label(s, "le"));
		le = parse_value(label(s, "le"));
		cr_assert_gt(le, previous_le, "buckets out of order");
		cr_assert_geq(s->value, previous, "buckets not cumulative");
		previous_le = le;
		previous = s->value;
		if (isinf(le))
			inf = s->value;
	}
	cr_assert_geq(inf, 0, "no +Inf bucket for %s", kind);
	snprintf(want, sizeof(want), "kind=%s", kind);
	count = must(e, "dormant_transition_duration_seconds_count", want);
	cr_assert_eq(inf, count);
	cr_assert_geq(must(e, "dormant_transition_duration_seconds_sum", want), 0);
}

static struct exposition expo;

static void scrape(struct fixture *f)
{
	struct http_response r;
	char ct[128];

	http_get(f, "/metrics", &r);
	cr_assert_eq(r.status, 200);
	cr_assert(http_header(&r, "Content-Type", ct, sizeof(ct)));
	cr_assert_str_eq(ct, "text/plain; version=0.0.4; charset=utf-8");
	parse(&expo, r.body);
	http_response_free(&r);
}

TestSuite(metrics, .timeout = 60);

Test(metrics, every_family_parses_and_says_what_happened)
{
	static const char *const families[] = {
		"dormant_info", "dormant_healthy", "dormant_tag_state", "dormant_tag_bytes",
		"dormant_tag_allocations", "dormant_gpu_free_bytes", "dormant_gpu_total_bytes",
		"dormant_managed_device_bytes", "dormant_staging_bytes",
		"dormant_transitions_total", "dormant_transition_duration_seconds",
		"dormant_transition_running", "dormant_steps_running", "dormant_bytes_copied_total",
		"dormant_bytes_released_total", "dormant_bytes_zeroed_total",
		"dormant_bytes_skipped_total", "dormant_last_transition_timestamp_seconds", "dormant_last_transition_success",
		"dormant_bytes_unchanged_total", "dormant_chunks_verified_total",
		"dormant_chunk_mismatches_total", "dormant_verify_enabled",
		"dormant_wakes_by_copy_total", "dormant_bytes_to_device_by_copy_total",
		"dormant_warmup_runs_total", "dormant_warmup_seconds_total",
		"dormant_warmup_host_bytes_total", "dormant_warmup_running",
	};
	struct fixture f;
	struct http_response r;

	fixture_start(&f, NULL);
	scrape(&f);
	cr_assert_eq(must(&expo, "dormant_tag_state", "tag=weights,state=awake"), 1);
	cr_assert_eq(must(&expo, "dormant_tag_state", "tag=weights,state=asleep"), 0);
	cr_assert_eq(must(&expo, "dormant_transitions_total", "kind=sleep,result=ok"), 0);
	cr_assert(!value_of(&expo, "dormant_last_transition_success", "kind=sleep", &(double){0}));
	/* awake, 2 tags of TEST_TAG_BYTES mapped: free is not the total */
	cr_assert_eq(must(&expo, "dormant_gpu_free_bytes", "device=0"),
		     must(&expo, "dormant_gpu_total_bytes", "device=0") - 2.0 * TEST_TAG_BYTES);

	cr_assert_eq(dormant_warm_up(f.m), 0, "%s", dormant_last_error());
	http_post(&f, "/sleep", NULL, &r);
	http_response_free(&r);
	http_post(&f, "/sleep", NULL, &r); /* changes nothing */
	http_response_free(&r);
	scrape(&f);
	for (size_t i = 0; i < sizeof(families) / sizeof(families[0]); i++) {
		struct family *fam = family_find(&expo, families[i]);

		cr_assert(fam, "no family %s", families[i]);
		cr_assert(fam->has_help, "no HELP for %s", families[i]);
	}
	cr_assert_str_eq(family_find(&expo, "dormant_transitions_total")->type, "counter");
	cr_assert_str_eq(family_find(&expo, "dormant_transition_duration_seconds")->type,
			 "histogram");
	cr_assert_str_eq(family_find(&expo, "dormant_tag_bytes")->type, "gauge");
	cr_assert_eq(must(&expo, "dormant_info", "backend=host,host_mode=release,version=" DORMANT_VERSION),
		     1);
	cr_assert_eq(must(&expo, "dormant_healthy", NULL), 1);
	cr_assert_eq(must(&expo, "dormant_tag_state", "tag=weights,state=asleep"), 1);
	cr_assert_eq(must(&expo, "dormant_tag_state", "tag=grads,state=awake"), 0);
	cr_assert_eq(must(&expo, "dormant_tag_bytes", "tag=weights,location=device"), 0);
	cr_assert_eq(must(&expo, "dormant_tag_bytes", "tag=weights,location=host"), TEST_TAG_BYTES);
	cr_assert_eq(must(&expo, "dormant_tag_bytes", "tag=grads,location=host"), 0);
	cr_assert_eq(must(&expo, "dormant_tag_allocations", "tag=grads"), 1);
	cr_assert_gt(must(&expo, "dormant_gpu_total_bytes", "device=0"), 0);
	cr_assert_eq(must(&expo, "dormant_managed_device_bytes", "device=0"), 0);
	cr_assert_eq(must(&expo, "dormant_transitions_total", "kind=sleep,result=ok"), 1);
	cr_assert_eq(must(&expo, "dormant_transitions_total", "kind=sleep,result=noop"), 1);
	cr_assert_eq(must(&expo, "dormant_transitions_total", "kind=sleep,result=failed"), 0);
	cr_assert_eq(must(&expo, "dormant_transitions_total", "kind=wake,result=ok"), 0);
	cr_assert_eq(must(&expo, "dormant_transitions_total", "kind=wake,result=noop"), 0,
		     "a sleep's no-op counted as a wake's");
	cr_assert_eq(must(&expo, "dormant_gpu_free_bytes", "device=0"),
		     must(&expo, "dormant_gpu_total_bytes", "device=0"));
	cr_assert_eq(must(&expo, "dormant_transition_running", NULL), 0);
	cr_assert_eq(must(&expo, "dormant_steps_running", NULL), 0);
	cr_assert_eq(must(&expo, "dormant_verify_enabled", NULL), 1, "verification is on by default");
	/* dormant_warm_up() above (a background run may have come first) */
	cr_assert_geq(must(&expo, "dormant_warmup_runs_total", "result=ok"), 1);
	cr_assert_eq(must(&expo, "dormant_warmup_runs_total", "result=failed"), 0);
	cr_assert_eq(must(&expo, "dormant_warmup_host_bytes_total", NULL), 0,
		     "release mode: no host copy prepared");
	cr_assert_eq(must(&expo, "dormant_transition_phase_seconds_total",
			  "kind=sleep,phase=setup"), 0, "the warm-up set the device up");
	cr_assert_eq(must(&expo, "dormant_chunk_mismatches_total", NULL), 0);
	cr_assert_eq(must(&expo, "dormant_bytes_copied_total", "direction=to_host"),
		     TEST_TAG_BYTES);
	cr_assert_eq(must(&expo, "dormant_bytes_released_total", NULL), 2 * TEST_TAG_BYTES);
	cr_assert_eq(must(&expo, "dormant_last_transition_success", "kind=sleep"), 1);
	cr_assert_gt(must(&expo, "dormant_last_transition_timestamp_seconds", "kind=sleep"),
		     1e9);
	check_histogram(&expo, "sleep");
	check_histogram(&expo, "wake");
	cr_assert_eq(must(&expo, "dormant_transition_duration_seconds_count", "kind=sleep"), 1);

	/* a failed wake */
	cr_assert_eq(dormant_debug_inject_fault(f.m, DORMANT_FAULT_CREATE, 1, -ENOMEM, false), 0);
	http_post(&f, "/wake", NULL, &r);
	cr_assert_eq(r.status, 503);
	http_response_free(&r);
	scrape(&f);
	cr_assert_eq(must(&expo, "dormant_last_transition_success", "kind=wake"), 0,
		     "a failed wake shows as a success");
	cr_assert_eq(must(&expo, "dormant_last_transition_success", "kind=sleep"), 1);
	cr_assert_eq(must(&expo, "dormant_transitions_total", "kind=wake,result=failed"), 1);
	http_post(&f, "/wake", NULL, &r);
	cr_assert_eq(r.status, 200);
	http_response_free(&r);
	http_post(&f, "/wake", NULL, &r); /* changes nothing */
	http_response_free(&r);
	scrape(&f);
	cr_assert_eq(must(&expo, "dormant_transitions_total", "kind=wake,result=noop"), 1);
	cr_assert_eq(must(&expo, "dormant_transitions_total", "kind=sleep,result=noop"), 1);
	cr_assert_eq(must(&expo, "dormant_transitions_total", "kind=wake,result=failed"), 1);
	cr_assert_eq(must(&expo, "dormant_transitions_total", "kind=wake,result=ok"), 1);
	cr_assert_eq(must(&expo, "dormant_last_transition_success", "kind=wake"), 1);
	cr_assert_eq(must(&expo, "dormant_bytes_zeroed_total", NULL), TEST_TAG_BYTES);
	cr_assert_eq(must(&expo, "dormant_bytes_copied_total", "direction=to_device"),
		     TEST_TAG_BYTES);
	cr_assert_eq(must(&expo, "dormant_transition_duration_seconds_count", "kind=wake"), 2);
	check_histogram(&expo, "wake");
	fixture_stop(&f);
}

static int extra_metrics(void *userdata, char *buf, size_t size)
{
	return snprintf(buf, size,
			"# HELP test_extra_total An embedder's own counter.\n"
			"# TYPE test_extra_total counter\n"
			"test_extra_total{label=\"a \\\"quoted\\\" \\\\ value\"} 42\n");
}

static int broken_extra(void *userdata, char *buf, size_t size)
{
	return -EIO;
}

Test(metrics, embedder_families_are_appended)
{
	struct fixture_config config = { .server = { .metrics_extra = extra_metrics } };
	struct fixture f;

	fixture_start(&f, &config);
	scrape(&f);
	cr_assert_eq(must(&expo, "test_extra_total", "label=a \"quoted\" \\ value"), 42);
	fixture_stop(&f);

	config.server.metrics_extra = broken_extra;
	fixture_start(&f, &config);
	scrape(&f);
	cr_assert_null(family_find(&expo, "test_extra_total"));
	cr_assert(family_find(&expo, "dormant_info"));
	fixture_stop(&f);
}

Test(metrics, tag_names_as_labels)
{
	struct fixture f;
	void *p;

	fixture_start(&f, NULL);
	cr_assert_eq(dormant_alloc(f.m, "kv.cache:0-a_b", 4096, &p), 0);
	scrape(&f);
	cr_assert_eq(must(&expo, "dormant_tag_state", "tag=kv.cache:0-a_b,state=awake"), 1);
	cr_assert_eq(must(&expo, "dormant_tag_allocations", "tag=kv.cache:0-a_b"), 1);
	cr_assert_eq(dormant_free(f.m, p), 0);
	fixture_stop(&f);
}
