/* SPDX-License-Identifier: MIT */
/*
 * dormantctl: sleep, wake, or read many dormant servers at once.
 *
 *   dormantctl [OPTIONS] sleep|wake|stats|health|ready [ENDPOINT...]
 *
 * Exit status: 0 when every endpoint succeeded, 1 when any failed (each is
 * named on stderr), 2 for a usage or input error.
 */
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "discover.h"
#include "endpoint.h"
#include "fanout.h"
#include "outcome.h"
#include "report.h"

#define EXIT_FAILED 1
#define EXIT_USAGE 2
#define TOKEN_MAX 4096
#define RETRIES_MAX 100
#define SECONDS_MAX 86400.0

#ifndef DORMANT_VERSION
#define DORMANT_VERSION "unknown"
#endif

static const char usage_text[] =
	"Usage: dormantctl [OPTIONS] COMMAND [ENDPOINT...]\n"
	"\n"
	"Send one command to many dormant servers at once and summarise the answers.\n"
	"\n"
	"Commands:\n"
	"  sleep     POST /sleep   put the tags (default: all) to sleep\n"
	"  wake      POST /wake    wake the tags (default: all)\n"
	"  stats     GET /stats    state, device and host bytes, health\n"
	"  health    GET /healthz  liveness\n"
	"  ready     GET /readyz   readiness\n"
	"\n"
	"Endpoints (any mix; duplicates are dropped):\n"
	"  HOST[:PORT], [IPV6][:PORT], http://HOST:PORT, https://HOST:PORT, unix:/PATH\n"
	"  -f, --file FILE          endpoints from FILE, one per line, '#' comments ('-': stdin)\n"
	"      --dns NAME           every address NAME resolves to, on each --port\n"
	"                           (a Kubernetes headless Service)\n"
	"  -p, --port PORTS         ports for --dns and for endpoints without one:\n"
	"                           8787, 8787-8794, 8787,9000 (default 8787)\n"
	"  -4, -6                   --dns: IPv4 or IPv6 addresses only\n"
	"      --discover[=DIR]     every live server that published a discovery record\n"
	"                           in DIR (default $DORMANT_RUNTIME_DIR, else\n"
	"                           $XDG_RUNTIME_DIR/dormant, else /tmp/dormant-UID)\n"
	"      --role NAME          --discover: the servers of that role only\n"
	"\n"
	"Options:\n"
	"  -t, --tags LIST          comma-separated tags for sleep and wake (default: all)\n"
	"      --residue MODE       sleep: keep or checkpoint the process's residue\n"
	"                           (default: each server's option residue)\n"
	"  -j, --concurrency N      requests in flight at most (default 64, at most 4096)\n"
	"      --timeout SECONDS    per attempt, connection included (default 120)\n"
	"      --connect-timeout SECONDS  (default 5)\n"
	"  -r, --retries N          attempts after the first on a 503 or a connection\n"
	"                           error (default 4, at most 100)\n"
	"      --backoff SECONDS    delay before the first retry, doubled each time,\n"
	"                           with jitter; at least the server's Retry-After (default 0.5)\n"
	"      --max-delay SECONDS  cap on any one delay, Retry-After included (default 30)\n"
	"      --token-file FILE    bearer token (default: $DORMANT_TOKEN, then\n"
	"                           the file named by $DORMANT_TOKEN_FILE)\n"
	"      --json               one JSON document on stdout instead of the table\n"
	"      --no-progress        no progress line (drawn only when stderr is a terminal)\n"
	"  -h, --help               this text\n"
	"  -V, --version            the version\n"
	"\n"
	"Exit status: 0 all endpoints succeeded, 1 some failed (named on stderr),\n"
	"2 usage or input error.\n";

struct options {
	const struct ctl_command_info *command;
	char *tags_spec;
	char **tags;           /* NULL-terminated, or NULL for all */
	const char *residue;   /* sleep's "residue", or NULL */
	const char *file;
	const char *dns;
	bool discover;
	const char *discover_dir;
	const char *role;
	int family;
	uint16_t ports[CTL_PORTS_MAX];
	size_t nports;
	const char *token_file;
	bool json;
	bool no_progress;
	struct ctl_run_options run;
};

__attribute__((format(printf, 1, 2)))
static int usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("dormantctl: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs(" (dormantctl --help for usage)\n", stderr);
	return EXIT_USAGE;
}

static int parse_seconds(const char *name, const char *s, double min_s, double *ret)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < min_s || v > SECONDS_MAX)
		return usage_error("%s: '%s' is not a number of seconds from %g to %g", name, s,
				   min_s, SECONDS_MAX);
	*ret = v;
	return 0;
}

static int parse_unsigned(const char *name, const char *s, unsigned min, unsigned max,
			  unsigned *ret)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || !isdigit((unsigned char)s[0]) || v < min || v > max)
		return usage_error("%s: '%s' is not a whole number from %u to %u", name, s, min, max);
	*ret = (unsigned)v;
	return 0;
}

/* Same rules as the server: 1 to 63 of [A-Za-z0-9_.:-], at most 64 tags. */
static int parse_tags(struct options *o)
{
	size_t count = 1;
	char *p, *rest = o->tags_spec;
	size_t n = 0;

	for (p = o->tags_spec; *p; p++)
		count += *p == ',';
	if (count > 64)
		return usage_error("--tags: more than 64 tags");
	o->tags = calloc(count + 1, sizeof(*o->tags));
	if (!o->tags)
		return usage_error("out of memory");
	while ((p = strsep(&rest, ","))) {
		size_t len = strlen(p);

		if (len == 0)
			return usage_error("--tags: an empty tag (a comma too many?)");
		if (len > 63)
			return usage_error("--tags: '%s' is longer than 63 characters", p);
		for (size_t i = 0; i < len; i++)
			if (!isalnum((unsigned char)p[i]) && !strchr("_.:-", p[i]))
				return usage_error("--tags: '%s' has a character outside "
						   "[A-Za-z0-9_.:-]", p);
		for (size_t i = 0; i < n; i++)
			if (strcmp(o->tags[i], p) == 0)
				return usage_error("--tags: '%s' listed twice", p);
		o->tags[n++] = p;
	}
	if (n == 0)
		return usage_error("--tags: no tag given");
	return 0;
}

/* A token is sent in a header: visible ASCII only, no spaces. */
static int token_check(const char *token, const char *from)
{
	size_t len = strlen(token);

	if (len == 0)
		return usage_error("%s: the token is empty", from);
	if (len > TOKEN_MAX)
		return usage_error("%s: the token is longer than %d bytes", from, TOKEN_MAX);
	for (size_t i = 0; i < len; i++)
		if (token[i] <= ' ' || token[i] > '~')
			return usage_error("%s: the token has a blank or a character outside "
					   "printable ASCII", from);
	return 0;
}

static int token_read_file(const char *path, const char *from, char **ret)
{
	FILE *f = fopen(path, "re");
	char *buf;
	size_t len;
	int r;

	if (!f)
		return usage_error("%s %s: %s", from, path, strerror(errno));
	buf = calloc(1, TOKEN_MAX + 2);
	if (!buf) {
		fclose(f);
		return usage_error("out of memory");
	}
	len = fread(buf, 1, TOKEN_MAX + 1, f);
	fclose(f);
	while (len > 0 && isspace((unsigned char)buf[len - 1]))
		buf[--len] = '\0';
	r = token_check(buf, path);
	if (r) {
		explicit_bzero(buf, TOKEN_MAX + 2);
		free(buf);
		return r;
	}
	*ret = buf;
	return 0;
}

/* --token-file, else $DORMANT_TOKEN, else $DORMANT_TOKEN_FILE, else none. */
static int token_load(struct options *o, char **ret)
{
	const char *env = getenv("DORMANT_TOKEN");
	const char *env_file = getenv("DORMANT_TOKEN_FILE");
	int r;

	*ret = NULL;
	if (o->token_file)
		return token_read_file(o->token_file, "--token-file", ret);
	if (env && *env) {
		r = token_check(env, "DORMANT_TOKEN");
		if (r)
			return r;
		*ret = strdup(env);
		return *ret ? 0 : usage_error("out of memory");
	}
	if (env_file && *env_file)
		return token_read_file(env_file, "DORMANT_TOKEN_FILE", ret);
	return 0;
}

static char *request_body(const struct options *o)
{
	json_auto_t *tags = NULL;
	json_t *doc;
	char *text;

	if (!o->tags && !o->residue)
		return NULL;
	doc = json_object();
	if (o->tags) {
		tags = json_array();
		for (size_t i = 0; o->tags[i]; i++)
			json_array_append_new(tags, json_string(o->tags[i]));
		json_object_set(doc, "tags", tags);
	}
	if (o->residue)
		json_object_set_new(doc, "residue", json_string(o->residue));
	text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
	json_decref(doc);
	return text;
}

enum {
	OPT_DNS = 256,
	OPT_TIMEOUT,
	OPT_CONNECT_TIMEOUT,
	OPT_BACKOFF,
	OPT_MAX_DELAY,
	OPT_TOKEN_FILE,
	OPT_JSON,
	OPT_NO_PROGRESS,
	OPT_DISCOVER,
	OPT_ROLE,
	OPT_RESIDUE,
};

static const struct option long_options[] = {
	{ "file", required_argument, NULL, 'f' },
	{ "dns", required_argument, NULL, OPT_DNS },
	{ "port", required_argument, NULL, 'p' },
	{ "tags", required_argument, NULL, 't' },
	{ "concurrency", required_argument, NULL, 'j' },
	{ "timeout", required_argument, NULL, OPT_TIMEOUT },
	{ "connect-timeout", required_argument, NULL, OPT_CONNECT_TIMEOUT },
	{ "retries", required_argument, NULL, 'r' },
	{ "backoff", required_argument, NULL, OPT_BACKOFF },
	{ "max-delay", required_argument, NULL, OPT_MAX_DELAY },
	{ "token-file", required_argument, NULL, OPT_TOKEN_FILE },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "no-progress", no_argument, NULL, OPT_NO_PROGRESS },
	{ "discover", optional_argument, NULL, OPT_DISCOVER },
	{ "role", required_argument, NULL, OPT_ROLE },
	{ "residue", required_argument, NULL, OPT_RESIDUE },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ 0 },
};

static int parse_options(int argc, char **argv, struct options *o)
{
	double seconds;
	char err[CTL_ERROR_MAX];
	int c, r;

	o->run.concurrency = 64;
	o->run.timeout_ms = 120000;
	o->run.connect_timeout_ms = 5000;
	o->run.retry.retries = 4;
	o->run.retry.backoff_s = 0.5;
	o->run.retry.max_delay_s = 30;
	o->family = AF_UNSPEC;

	opterr = 0; /* usage_error() says it, in one line */
	/* ':' first: a missing value (':') is told apart from an unknown
	 * option ('?') */
	while ((c = getopt_long(argc, argv, ":f:p:t:j:r:46hV", long_options, NULL)) != -1) {
		switch (c) {
		case 'f':
			if (o->file)
				return usage_error("--file given twice");
			o->file = optarg;
			break;
		case OPT_DISCOVER:
			if (o->discover)
				return usage_error("--discover given twice");
			o->discover = true;
			o->discover_dir = optarg;
			break;
		case OPT_ROLE:
			o->role = optarg;
			break;
		case OPT_DNS:
			if (o->dns)
				return usage_error("--dns given twice");
			o->dns = optarg;
			break;
		case 'p':
			r = ctl_ports_parse(optarg, o->ports, CTL_PORTS_MAX, err, sizeof(err));
			if (r < 0)
				return usage_error("--port: %s", err);
			o->nports = (size_t)r;
			break;
		case '4':
			o->family = AF_INET;
			break;
		case '6':
			o->family = AF_INET6;
			break;
		case 't':
			free(o->tags_spec);
			o->tags_spec = strdup(optarg);
			if (!o->tags_spec)
				return usage_error("out of memory");
			break;
		case 'j':
			r = parse_unsigned("--concurrency", optarg, 1, CTL_CONCURRENCY_MAX,
					   &o->run.concurrency);
			if (r)
				return r;
			break;
		case OPT_TIMEOUT:
			if ((r = parse_seconds("--timeout", optarg, 0.001, &seconds)))
				return r;
			o->run.timeout_ms = lround(seconds * 1000);
			break;
		case OPT_CONNECT_TIMEOUT:
			if ((r = parse_seconds("--connect-timeout", optarg, 0.001, &seconds)))
				return r;
			o->run.connect_timeout_ms = lround(seconds * 1000);
			break;
		case 'r':
			r = parse_unsigned("--retries", optarg, 0, RETRIES_MAX, &o->run.retry.retries);
			if (r)
				return r;
			break;
		case OPT_BACKOFF:
			if ((r = parse_seconds("--backoff", optarg, 0, &o->run.retry.backoff_s)))
				return r;
			break;
		case OPT_MAX_DELAY:
			if ((r = parse_seconds("--max-delay", optarg, 0, &o->run.retry.max_delay_s)))
				return r;
			break;
		case OPT_TOKEN_FILE:
			o->token_file = optarg;
			break;
		case OPT_JSON:
			o->json = true;
			break;
		case OPT_NO_PROGRESS:
			o->no_progress = true;
			break;
		case OPT_RESIDUE:
			if (strcmp(optarg, "keep") != 0 && strcmp(optarg, "checkpoint") != 0)
				return usage_error("--residue: '%s' is not keep or checkpoint", optarg);
			o->residue = optarg;
			break;
		case 'h':
			fputs(usage_text, stdout);
			exit(EXIT_SUCCESS);
		case 'V':
			printf("dormantctl %s\n", DORMANT_VERSION);
			exit(EXIT_SUCCESS);
		case ':':
			for (const struct option *lo = long_options; lo->name; lo++)
				if (lo->val == optopt)
					return usage_error("option --%s needs a value", lo->name);
			return usage_error("option '%s' needs a value", argv[optind - 1]);
		default:
			/* a short option's character is in optopt, a long one's
			 * text only in argv */
			if (optopt > 0 && optopt < 128 && strncmp(argv[optind - 1], "--", 2) != 0)
				return usage_error("unknown option '-%c'", optopt);
			return usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind >= argc)
		return usage_error("no command given (sleep, wake, stats, health, ready)");
	o->command = ctl_command_find(argv[optind]);
	if (!o->command)
		return usage_error("unknown command '%s' (sleep, wake, stats, health, ready)",
				   argv[optind]);
	optind++;
	o->run.command = o->command->command;
	if (o->tags_spec) {
		if (!o->command->transition)
			return usage_error("--tags applies to sleep and wake only");
		if ((r = parse_tags(o)))
			return r;
	}
	if (o->residue && o->run.command != CTL_SLEEP)
		return usage_error("--residue applies to sleep only");
	if (o->family != AF_UNSPEC && !o->dns)
		return usage_error("-4 and -6 apply to --dns only");
	if (o->role && !o->discover)
		return usage_error("--role applies to --discover only");
	return 0;
}

/* Each request in flight holds a socket: make room for them within the hard
 * limit (the usual soft limit of 1024 is below --concurrency 4096). */
static void raise_fd_limit(unsigned concurrency)
{
	struct rlimit lim;
	rlim_t want = (rlim_t)concurrency + 64;

	if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= want)
		return;
	lim.rlim_cur = lim.rlim_max == RLIM_INFINITY || lim.rlim_max > want ? want : lim.rlim_max;
	setrlimit(RLIMIT_NOFILE, &lim);
}

/* A discovery file skipped: said, and the others used. */
static void discover_warn(void *userdata, const char *line)
{
	fprintf(stderr, "dormantctl: warning: --discover: %s\n", line);
}

static int collect_endpoints(struct options *o, int argc, char **argv,
			     struct ctl_endpoints *list)
{
	char err[CTL_ERROR_MAX];
	size_t dropped;
	int r;

	for (int i = optind; i < argc; i++) {
		r = ctl_endpoints_add_spec(list, argv[i], o->ports, o->nports, err, sizeof(err));
		if (r < 0)
			return usage_error("%s", err);
	}
	if (o->file) {
		r = ctl_endpoints_add_file(list, o->file, o->ports, o->nports, err, sizeof(err));
		if (r < 0)
			return usage_error("%s", err);
		if (r == 0)
			return usage_error("%s: no endpoint in the file", o->file);
	}
	if (o->dns) {
		r = ctl_endpoints_add_dns(list, o->dns, o->family, o->ports, o->nports, err,
					  sizeof(err));
		if (r < 0)
			return usage_error("%s", err);
	}
	if (o->discover) {
		char dir[PATH_MAX];
		size_t stale = 0, skipped = 0;

		r = ctl_endpoints_add_discovered(list, o->discover_dir, o->role, discover_warn,
						 NULL, &stale, &skipped, err, sizeof(err));
		if (r < 0)
			return usage_error("--discover: %s", err);
		if (r == 0 && ctl_discovery_dir(o->discover_dir, dir, sizeof(dir), err,
						sizeof(err)) == 0)
			return usage_error("--discover: no live server%s%s%s in %s (%zu stale "
					   "record%s, %zu other file%s skipped)",
					   o->role ? " of role '" : "", o->role ? o->role : "",
					   o->role ? "'" : "", dir, stale, stale == 1 ? "" : "s",
					   skipped, skipped == 1 ? "" : "s");
	}
	if (list->count == 0)
		return usage_error("no endpoint given (arguments, --file, --dns or --discover)");
	dropped = ctl_endpoints_dedup(list);
	(void)dropped;
	return 0;
}

int main(int argc, char **argv)
{
	struct options o = { 0 };
	struct ctl_endpoints endpoints;
	struct ctl_result *results = NULL;
	char *token = NULL, *body = NULL;
	char err[CTL_ERROR_MAX];
	int status = EXIT_USAGE, r;

	ctl_endpoints_init(&endpoints);
	signal(SIGPIPE, SIG_IGN);
	if ((r = parse_options(argc, argv, &o)))
		goto out;
	if ((r = collect_endpoints(&o, argc, argv, &endpoints)))
		goto out;
	if ((r = token_load(&o, &token)))
		goto out;
	if ((o.tags || o.residue) && !(body = request_body(&o))) {
		usage_error("out of memory");
		goto out;
	}
	results = calloc(endpoints.count, sizeof(*results));
	if (!results) {
		usage_error("out of memory");
		goto out;
	}
	for (size_t i = 0; i < endpoints.count; i++)
		ctl_result_init(&results[i]);
	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
		fprintf(stderr, "dormantctl: libcurl failed to initialise\n");
		status = EXIT_FAILED;
		goto out;
	}
	raise_fd_limit(o.run.concurrency);
	o.run.body = body;
	o.run.token = token;
	o.run.keep_responses = o.json;
	o.run.progress = !o.no_progress && isatty(STDERR_FILENO);
	r = ctl_run(&endpoints, &o.run, results, err, sizeof(err));
	curl_global_cleanup();
	if (r < 0) {
		fprintf(stderr, "dormantctl: %s\n", err);
		status = EXIT_FAILED;
		goto out;
	}
	if (o.json) {
		if (ctl_report_json(stdout, o.command->command, (const char *const *)o.tags,
				    &endpoints, results) < 0) {
			fprintf(stderr, "dormantctl: out of memory writing JSON\n");
			r = 1;
		}
	} else {
		ctl_report_table(stdout, o.command->command, &endpoints, results);
	}
	ctl_report_failures(stderr, &endpoints, results);
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "dormantctl: writing the output failed: %s\n", strerror(errno));
		r = 1;
	}
	status = r > 0 ? EXIT_FAILED : EXIT_SUCCESS;
out:
	for (size_t i = 0; results && i < endpoints.count; i++)
		ctl_result_finish(&results[i]);
	free(results);
	ctl_endpoints_finish(&endpoints);
	if (token) {
		explicit_bzero(token, strlen(token));
		free(token);
	}
	free(body);
	free(o.tags);
	free(o.tags_spec);
	return status;
}
