/* SPDX-License-Identifier: MIT */
/*
 * dormantd: the demo and debugging daemon. A manager, the HTTP control plane
 * and a simulated trainer: tag "weights" (kept) filled with a pattern it can
 * check, tag "grads" (discarded) that its steps dirty. Every wake checks,
 * before it answers (an after-wake hook), that the weights came back intact
 * and the gradients came back zero; /stats ("extra") and /metrics count the
 * verifications.
 *
 *   dormantd --listen 127.0.0.1:8787 --backend auto --keep 1GiB --discard 1GiB
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dormant-server.h"
#include "dormant.h"

#define BLOCK_BYTES ((size_t)4 << 20)   /* fill and verify in pieces of this */
#define STEP_DIRTY_BYTES ((size_t)4096) /* what a step writes into the grads */
#define STEP_ENTER_TIMEOUT_MS 200       /* how often a waiting trainer looks at stop */
#define STEP_COMPUTE_NS 5000000L        /* a step's simulated work */
#define STEP_PAUSE_NS 5000000L          /* between steps: room for a sleep */
#define PATTERN_SEED UINT64_C(0x9e3779b97f4a7c15)
#define MAX_THREADS 256
#define MAX_FAIL_WAKES 1000000
#define MAX_CONNECTIONS 65536
#define MAX_TIMEOUT_S 86400
#define FAULTS_MAX 512 /* bytes of --fault rules, joined with commas */
#define OPTIONS_MAX 1024 /* bytes of --option pairs, joined with commas */

struct config {
	const char *listen;
	const char *unix_path;
	const char *backend;
	size_t keep_bytes;
	size_t discard_bytes;
	const char *keep_text;    /* --keep and --discard as given, for messages */
	const char *discard_text;
	enum dormant_host_mode host_mode;
	const char *token;
	const char *token_file;
	bool open_probes;
	bool insecure_no_auth;
	unsigned threads;
	bool quiet;
	unsigned fail_wakes;
	const char *port_file;
	bool publish;
	const char *publish_dir;
	const char *role;
	unsigned max_connections;
	unsigned max_connections_per_ip;
	unsigned connection_timeout_s;
	unsigned request_timeout_s;
	char faults[FAULTS_MAX]; /* "" if no --fault */
	char options[OPTIONS_MAX]; /* "" if no --option */
	char server_options[OPTIONS_MAX]; /* "" if no --server-option */
};

struct demo {
	struct config config;
	struct dormant *m;
	void *weights;
	void *grads;
	/* the trainer's steps and the after-wake hook, never at once: steps
	 * wait for a wake's hooks, and a wake only runs with a tag asleep, when
	 * no step can run */
	unsigned char *scratch;
	unsigned char *expected;
	struct dormant_stats *stats; /* the after-wake hook only */
	uint64_t weights_wakes_seen, grads_wakes_seen; /* the after-wake hook only */

	pthread_t trainer;
	atomic_bool stop;
	_Atomic uint64_t steps;
	_Atomic uint64_t verifications;
	_Atomic uint64_t mismatches;
	_Atomic uint64_t errors;
	_Atomic unsigned fail_wakes_left;

	pthread_mutex_t lock; /* last_check */
	char last_check[192];
};

/* ---- messages ------------------------------------------------------------ */

static void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn(const char *fmt, ...)
{
	char line[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fprintf(stderr, "dormantd: %s\n", line);
}

static void on_log(enum dormant_log_level level, const char *message, void *userdata)
{
	static const char *const names[] = { "error", "warning", "info", "debug" };
	const struct config *config = userdata;

	if (level >= DORMANT_LOG_INFO && config->quiet)
		return;
	if (level > DORMANT_LOG_INFO)
		return;
	fprintf(stderr, "dormantd: %s: %s\n", names[level], message);
}

/* The server's lines: its access log as "dormant: POST /sleep 200 3.1 ms"
 * (the server drops it when quiet), its warnings as "dormant: warning: ...".
 * Called on the server's log thread; one fprintf a line: stdio locks the
 * stream, so its lines never mix with dormantd's own. */
static void on_server_log(enum dormant_log_level level, const char *message, void *userdata)
{
	(void)userdata;
	if (level > DORMANT_LOG_INFO) /* libmicrohttpd's complaints about clients */
		return;
	fprintf(stderr, "dormant: %s%s\n", level <= DORMANT_LOG_WARNING ? "warning: " : "",
		message);
}

/* One option of a table: name, type, default, variable, and the doc line
 * wrapped at 78 columns under a 4-space indent. */
static void option_usage(FILE *f, const char *name, const char *type, const char *def,
			 const char *env, const char *doc)
{
	fprintf(f, "  %-18s %s, default %s%s%s\n", name, type, def, env ? ", $" : "",
		env ? env : "");
	while (*doc) {
		int n = (int)strlen(doc);

		if (n > 74) {
			n = 74;
			while (n > 0 && doc[n] != ' ')
				n--;
			if (n == 0)
				n = 74;
		}
		fprintf(f, "    %.*s\n", n, doc);
		doc += n;
		while (*doc == ' ')
			doc++;
	}
}

static void usage(FILE *f)
{
	fputs("Usage: dormantd [OPTION]...\n"
	      "Run a dormant manager with a simulated trainer behind the HTTP control plane.\n"
	      "\n"
	      "  --listen HOST:PORT    listen on TCP (default 127.0.0.1:8787; port 0: a free\n"
	      "                        port, printed)\n"
	      "  --unix PATH           listen on a Unix socket instead\n"
	      "  --backend NAME        auto (default), cuda or host\n"
	      "  --keep SIZE           bytes of tag 'weights' (kept on sleep; default 64MiB)\n"
	      "  --discard SIZE        bytes of tag 'grads' (discarded on sleep; default 64MiB)\n"
	      "  --host-mode MODE      retain, release or reclaimable (default:\n"
	      "                        $DORMANT_HOST_MODE, else release; reclaimable\n"
	      "                        with residue=checkpoint)\n"
	      "  --token TOKEN         require Authorization: Bearer TOKEN\n"
	      "  --token-file FILE     read the token from FILE\n"
	      "  --open-probes         leave /healthz, /readyz and /metrics open\n"
	      "  --insecure-no-auth    serve without a token on an address other than\n"
	      "                        loopback (refused otherwise: give --token-file)\n"
	      "  --threads N           HTTP worker threads (default 4)\n"
	      "  --max-connections N   open connections at once (default 64, at least\n"
	      "                        --threads); over it an idle one is closed, never\n"
	      "                        one carrying a request, else probes are answered\n"
	      "                        on spare slots and others get 503 + Retry-After\n"
	      "  --max-connections-per-ip N\n"
	      "                        connections of one remote address (default 32;\n"
	      "                        loopback and Unix socket clients are not counted)\n"
	      "  --connection-timeout S  idle seconds before a connection is closed\n"
	      "                        (default 30)\n"
	      "  --request-timeout S   seconds a connection has for a whole request, from\n"
	      "                        its opening or its last answer (default 10)\n"
	      "  --quiet               no access log, no info messages\n"
	      "  --fail-wakes N        the next N wakes fail as if the GPU memory were taken\n"
	      "                        (503)\n"
	      "  --fault RULE          test tool: inject a device fault, RULE is\n"
	      "                        WHEN:OP[:NTH[:ERROR[:TIMES]]] (WHEN sleep, wake or\n"
	      "                        any; OP create, map, copy, host-alloc, disk,\n"
	      "                        checkpoint or restore; see docs/testing.md);\n"
	      "                        may be given up to 8 times\n"
	      "  --port-file FILE      write the bound port to FILE once listening\n"
	      "  --publish[=DIR]       publish a discovery record (for dormantctl --discover)\n"
	      "                        in DIR (default: $DORMANT_RUNTIME_DIR, else\n"
	      "                        $XDG_RUNTIME_DIR/dormant, else /tmp/dormant-UID)\n"
	      "  --role NAME           the role in the record (default: $DORMANT_ROLE)\n"
	      "  --option NAME=VALUE   set a manager option (listed below; after --backend\n"
	      "                        and --host-mode); may be given many times\n"
	      "  --server-option NAME=VALUE\n"
	      "                        set a server option (listed below; after the flags\n"
	      "                        above); may be given many times\n"
	      "  -h, --help            show this and exit\n"
	      "  -V, --version         print the version and exit\n"
	      "\n"
	      "SIZE is a number with an optional suffix: K, M, G, T (powers of 1024, also\n"
	      "KiB, MiB, GiB, TiB) or KB, MB, GB, TB (powers of 1000). Sizes that do not fit\n"
	      "in device 0's free memory, or whose host copy does not fit in the host's\n"
	      "available memory, are refused before anything is allocated (exit status 2).\n"
	      "\n"
	      "Manager options (--option NAME=VALUE; the environment variable applies when\n"
	      "the option is not given):\n",
	      f);
	/* the library's own tables (core/options.c, server/options.c) */
	for (size_t i = 0; dormant_option_name(i); i++) {
		const char *values = dormant_option_values(i);

		option_usage(f, dormant_option_name(i), values ? values : dormant_option_type(i),
			     dormant_option_default(i), dormant_option_env(i), dormant_option_doc(i));
	}
	fputs("\nServer options (--server-option NAME=VALUE; the flags above set some of\n"
	      "them; the environment variable applies when the option is not given):\n",
	      f);
	for (size_t i = 0; dormant_server_option_name(i); i++)
		option_usage(f, dormant_server_option_name(i), dormant_server_option_type(i),
			     dormant_server_option_default(i), dormant_server_option_env(i),
			     dormant_server_option_doc(i));
}

/* ---- flags --------------------------------------------------------------- */

static int parse_size(const char *text, size_t *ret)
{
	static const struct {
		const char *suffix;
		uint64_t factor;
	} units[] = {
		{ "", 1 },
		{ "B", 1 },
		{ "K", UINT64_C(1) << 10 },
		{ "KiB", UINT64_C(1) << 10 },
		{ "KB", 1000 },
		{ "M", UINT64_C(1) << 20 },
		{ "MiB", UINT64_C(1) << 20 },
		{ "MB", 1000000 },
		{ "G", UINT64_C(1) << 30 },
		{ "GiB", UINT64_C(1) << 30 },
		{ "GB", 1000000000 },
		{ "T", UINT64_C(1) << 40 },
		{ "TiB", UINT64_C(1) << 40 },
		{ "TB", 1000000000000 },
	};
	unsigned long long value;
	char *end;

	if (text[0] < '0' || text[0] > '9')
		return -EINVAL;
	errno = 0;
	value = strtoull(text, &end, 10);
	if (errno)
		return -EINVAL;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcmp(end, units[i].suffix) != 0)
			continue;
		if (value > SIZE_MAX / units[i].factor)
			return -EINVAL;
		*ret = (size_t)(value * units[i].factor);
		return 0;
	}
	return -EINVAL;
}

static int parse_unsigned(const char *text, unsigned max, unsigned *ret)
{
	unsigned long value;
	char *end;

	if (text[0] < '0' || text[0] > '9')
		return -EINVAL;
	errno = 0;
	value = strtoul(text, &end, 10);
	if (errno || *end || value > max)
		return -EINVAL;
	*ret = (unsigned)value;
	return 0;
}

enum flags_result { FLAGS_OK = 0, FLAGS_HELP, FLAGS_VERSION };

/* An unsigned flag value from min to max, or -EINVAL after saying why. */
static int flag_unsigned(const char *name, const char *text, unsigned min, unsigned max,
			 unsigned *ret)
{
	if (parse_unsigned(text, max, ret) < 0 || *ret < min) {
		warn("--%s must be from %u to %u, not '%s'", name, min, max, text);
		return -EINVAL;
	}
	return 0;
}

/* Returns FLAGS_OK, FLAGS_HELP, FLAGS_VERSION, or -EINVAL after printing one
 * line that says why. */
static int parse_flags(int argc, char **argv, struct config *c)
{
	enum {
		OPT_LISTEN = 256, OPT_UNIX, OPT_BACKEND, OPT_KEEP, OPT_DISCARD, OPT_HOST_MODE,
		OPT_TOKEN, OPT_TOKEN_FILE, OPT_OPEN_PROBES, OPT_INSECURE_NO_AUTH, OPT_THREADS, OPT_QUIET, OPT_FAIL_WAKES,
		OPT_PORT_FILE, OPT_MAX_CONNECTIONS, OPT_MAX_PER_IP, OPT_CONNECTION_TIMEOUT,
		OPT_REQUEST_TIMEOUT, OPT_FAULT, OPT_PUBLISH, OPT_ROLE, OPT_OPTION, OPT_SERVER_OPTION,
	};
	static const struct option options[] = {
		{ "listen", required_argument, NULL, OPT_LISTEN },
		{ "unix", required_argument, NULL, OPT_UNIX },
		{ "backend", required_argument, NULL, OPT_BACKEND },
		{ "keep", required_argument, NULL, OPT_KEEP },
		{ "discard", required_argument, NULL, OPT_DISCARD },
		{ "host-mode", required_argument, NULL, OPT_HOST_MODE },
		{ "token", required_argument, NULL, OPT_TOKEN },
		{ "token-file", required_argument, NULL, OPT_TOKEN_FILE },
		{ "open-probes", no_argument, NULL, OPT_OPEN_PROBES },
		{ "insecure-no-auth", no_argument, NULL, OPT_INSECURE_NO_AUTH },
		{ "threads", required_argument, NULL, OPT_THREADS },
		{ "quiet", no_argument, NULL, OPT_QUIET },
		{ "fail-wakes", required_argument, NULL, OPT_FAIL_WAKES },
		{ "port-file", required_argument, NULL, OPT_PORT_FILE },
		{ "max-connections", required_argument, NULL, OPT_MAX_CONNECTIONS },
		{ "max-connections-per-ip", required_argument, NULL, OPT_MAX_PER_IP },
		{ "connection-timeout", required_argument, NULL, OPT_CONNECTION_TIMEOUT },
		{ "request-timeout", required_argument, NULL, OPT_REQUEST_TIMEOUT },
		{ "fault", required_argument, NULL, OPT_FAULT },
		{ "publish", optional_argument, NULL, OPT_PUBLISH },
		{ "role", required_argument, NULL, OPT_ROLE },
		{ "option", required_argument, NULL, OPT_OPTION },
		{ "server-option", required_argument, NULL, OPT_SERVER_OPTION },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ 0 },
	};
	unsigned faults = 0;
	int opt;

	*c = (struct config){
		.backend = "auto",
		.keep_bytes = (size_t)64 << 20,
		.discard_bytes = (size_t)64 << 20,
		.keep_text = "64MiB",
		.discard_text = "64MiB",
		.threads = 4,
	};
	opterr = 0;
	/* ':' first: a missing value is told apart (':') from an unknown
	 * option ('?') */
	while ((opt = getopt_long(argc, argv, ":hV", options, NULL)) != -1) {
		switch (opt) {
		case OPT_LISTEN:
			c->listen = optarg;
			break;
		case OPT_UNIX:
			c->unix_path = optarg;
			break;
		case OPT_BACKEND:
			if (strcmp(optarg, "auto") != 0 && strcmp(optarg, "cuda") != 0 &&
			    strcmp(optarg, "host") != 0) {
				warn("--backend must be auto, cuda or host, not '%s'", optarg);
				return -EINVAL;
			}
			c->backend = optarg;
			break;
		case OPT_KEEP:
		case OPT_DISCARD:
			if (parse_size(optarg, opt == OPT_KEEP ? &c->keep_bytes : &c->discard_bytes) <
			    0) {
				warn("--%s: '%s' is not a size (like 512MiB or 1G)",
				     opt == OPT_KEEP ? "keep" : "discard", optarg);
				return -EINVAL;
			}
			*(opt == OPT_KEEP ? &c->keep_text : &c->discard_text) = optarg;
			break;
		case OPT_HOST_MODE:
			if (strcmp(optarg, "retain") == 0) {
				c->host_mode = DORMANT_HOST_RETAIN;
			} else if (strcmp(optarg, "release") == 0) {
				c->host_mode = DORMANT_HOST_RELEASE;
			} else if (strcmp(optarg, "reclaimable") == 0) {
				c->host_mode = DORMANT_HOST_RECLAIMABLE;
			} else {
				warn("--host-mode must be retain, release or reclaimable, not '%s'",
				     optarg);
				return -EINVAL;
			}
			break;
		case OPT_TOKEN:
			c->token = optarg;
			break;
		case OPT_TOKEN_FILE:
			c->token_file = optarg;
			break;
		case OPT_INSECURE_NO_AUTH:
			c->insecure_no_auth = true;
			break;
		case OPT_OPEN_PROBES:
			c->open_probes = true;
			break;
		case OPT_THREADS:
			if (flag_unsigned("threads", optarg, 1, MAX_THREADS, &c->threads) < 0)
				return -EINVAL;
			break;
		case OPT_MAX_CONNECTIONS:
			if (flag_unsigned("max-connections", optarg, 1, MAX_CONNECTIONS,
					  &c->max_connections) < 0)
				return -EINVAL;
			break;
		case OPT_MAX_PER_IP:
			if (flag_unsigned("max-connections-per-ip", optarg, 1, MAX_CONNECTIONS,
					  &c->max_connections_per_ip) < 0)
				return -EINVAL;
			break;
		case OPT_CONNECTION_TIMEOUT:
			if (flag_unsigned("connection-timeout", optarg, 1, MAX_TIMEOUT_S,
					  &c->connection_timeout_s) < 0)
				return -EINVAL;
			break;
		case OPT_REQUEST_TIMEOUT:
			if (flag_unsigned("request-timeout", optarg, 1, MAX_TIMEOUT_S,
					  &c->request_timeout_s) < 0)
				return -EINVAL;
			break;
		case OPT_FAULT: {
			size_t used = strlen(c->faults);

			/* checked whole with the server's options, before anything starts */
			if (!*optarg || strchr(optarg, ',') || faults == 8 ||
			    used + strlen(optarg) + 2 > sizeof(c->faults)) {
				warn("--fault takes one rule (WHEN:OP[:NTH[:ERROR[:TIMES]]]), at most "
				     "8 times, not '%.64s'", optarg);
				return -EINVAL;
			}
			snprintf(c->faults + used, sizeof(c->faults) - used, "%s%s",
				 used ? "," : "", optarg);
			faults++;
			break;
		}
		case OPT_OPTION: {
			size_t used = strlen(c->options);
			struct dormant_options *check = NULL;
			int r = dormant_options_new(&check);

			/* checked here, before anything starts */
			if (r == 0)
				r = dormant_options_parse(check, optarg);
			dormant_options_destroy(check);
			if (r < 0) {
				warn("--option: %s", dormant_last_error());
				return -EINVAL;
			}
			if (used + strlen(optarg) + 2 > sizeof(c->options)) {
				warn("--option: at most %d bytes of options in all", OPTIONS_MAX - 1);
				return -EINVAL;
			}
			snprintf(c->options + used, sizeof(c->options) - used, "%s%s",
				 used ? "," : "", optarg);
			break;
		}
		case OPT_SERVER_OPTION: {
			size_t used = strlen(c->server_options);
			struct dormant_server_options *check = NULL;
			int r = dormant_server_options_new(&check);

			/* checked here, before anything starts */
			if (r == 0)
				r = dormant_server_options_parse(check, optarg);
			dormant_server_options_destroy(check);
			if (r < 0) {
				warn("--server-option: %s", dormant_last_error());
				return -EINVAL;
			}
			if (used + strlen(optarg) + 2 > sizeof(c->server_options)) {
				warn("--server-option: at most %d bytes of options in all",
				     OPTIONS_MAX - 1);
				return -EINVAL;
			}
			snprintf(c->server_options + used, sizeof(c->server_options) - used, "%s%s",
				 used ? "," : "", optarg);
			break;
		}
		case OPT_QUIET:
			c->quiet = true;
			break;
		case OPT_FAIL_WAKES:
			if (parse_unsigned(optarg, MAX_FAIL_WAKES, &c->fail_wakes) < 0) {
				warn("--fail-wakes must be from 0 to %d, not '%s'", MAX_FAIL_WAKES,
				     optarg);
				return -EINVAL;
			}
			break;
		case OPT_PORT_FILE:
			c->port_file = optarg;
			break;
		case OPT_PUBLISH:
			c->publish = true;
			c->publish_dir = optarg; /* NULL: the default directory */
			break;
		case OPT_ROLE:
			c->role = optarg;
			break;
		case 'h':
			return FLAGS_HELP;
		case 'V':
			return FLAGS_VERSION;
		case ':':
			/* optopt: the option's value in options[], or its character */
			for (const struct option *o = options; o->name; o++) {
				if (o->val == optopt) {
					warn("option --%s needs a value (dormantd --help lists the "
					     "options)", o->name);
					return -EINVAL;
				}
			}
			warn("option '%s' needs a value (dormantd --help lists the options)",
			     argv[optind - 1]);
			return -EINVAL;
		default:
			/* a short option's character is in optopt; a long one's text
			 * only in argv */
			if (optopt == 'h' || optopt == 'V')
				warn("option --%s takes no value", optopt == 'h' ? "help" : "version");
			else if (optopt > 0 && optopt < 256)
				warn("unknown option '-%c' (dormantd --help lists the options)",
				     optopt);
			else
				warn("unknown option '%s' (dormantd --help lists the options)",
				     argv[optind - 1]);
			return -EINVAL;
		}
	}
	if (optind < argc) {
		warn("unexpected argument '%s'", argv[optind]);
		return -EINVAL;
	}
	if (c->listen && c->unix_path) {
		warn("give --listen or --unix, not both");
		return -EINVAL;
	}
	if (c->token && c->token_file) {
		warn("give --token or --token-file, not both");
		return -EINVAL;
	}
	if (c->port_file && c->unix_path) {
		warn("--port-file needs --listen (a Unix socket has no port)");
		return -EINVAL;
	}
	if (!c->listen && !c->unix_path)
		c->listen = "127.0.0.1:8787";
	return FLAGS_OK;
}

/* ---- the pattern --------------------------------------------------------- */

static uint64_t splitmix64(uint64_t x)
{
	x += PATTERN_SEED;
	x = (x ^ (x >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	x = (x ^ (x >> 27)) * UINT64_C(0x94d049bb133111eb);
	return x ^ (x >> 31);
}

/* The expected weights bytes [offset, offset + size); offset is a multiple
 * of 8. */
static void pattern(unsigned char *dst, size_t offset, size_t size)
{
	for (size_t i = 0; i < size; i += 8) {
		uint64_t word = splitmix64((offset + i) / 8);

		memcpy(dst + i, &word, size - i < 8 ? size - i : 8);
	}
}

static int weights_fill(struct demo *d)
{
	for (size_t off = 0; off < d->config.keep_bytes; off += BLOCK_BYTES) {
		size_t size = d->config.keep_bytes - off < BLOCK_BYTES ? d->config.keep_bytes - off
								       : BLOCK_BYTES;
		int r;

		pattern(d->expected, off, size);
		r = dormant_copy_to_device(d->m, (char *)d->weights + off, d->expected, size);
		if (r < 0)
			return r;
	}
	return 0;
}

static void check_record(struct demo *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check_record(struct demo *d, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&d->lock);
	va_start(ap, fmt);
	vsnprintf(d->last_check, sizeof(d->last_check), fmt, ap);
	va_end(ap);
	pthread_mutex_unlock(&d->lock);
}

/* Compare a tag's device bytes with the pattern (weights) or zero (grads).
 * Returns 0 when they match, 1 on a mismatch, or a negative errno. */
static int verify(struct demo *d, bool weights, size_t *ret_offset)
{
	void *base = weights ? d->weights : d->grads;
	size_t total = weights ? d->config.keep_bytes : d->config.discard_bytes;

	for (size_t off = 0; off < total; off += BLOCK_BYTES) {
		size_t size = total - off < BLOCK_BYTES ? total - off : BLOCK_BYTES;
		int r = dormant_copy_to_host(d->m, d->scratch, (char *)base + off, size);

		if (r < 0)
			return r;
		if (weights)
			pattern(d->expected, off, size);
		else
			memset(d->expected, 0, size);
		if (memcmp(d->scratch, d->expected, size) == 0)
			continue;
		for (size_t i = 0; i < size; i++) {
			if (d->scratch[i] != d->expected[i]) {
				*ret_offset = off + i;
				break;
			}
		}
		return 1;
	}
	return 0;
}

static void verify_tag(struct demo *d, bool weights)
{
	const char *tag = weights ? "weights" : "grads";
	size_t offset = 0;
	int r = verify(d, weights, &offset);

	if (r < 0) {
		atomic_fetch_add(&d->errors, 1);
		check_record(d, "%s: could not read: %s", tag, dormant_last_error());
		warn("verifying %s: %s", tag, dormant_last_error());
		return;
	}
	atomic_fetch_add(&d->verifications, 1);
	if (r == 0) {
		check_record(d, "%s: ok", tag);
		return;
	}
	atomic_fetch_add(&d->mismatches, 1);
	check_record(d, "%s: mismatch at byte %zu", tag, offset);
	warn("verification failed: %s differ at byte %zu after a wake", tag, offset);
}

/* ---- the trainer --------------------------------------------------------- */

static uint64_t tag_wakes(const struct dormant_stats *st, const char *tag)
{
	for (size_t i = 0; i < st->tag_count; i++)
		if (strcmp(st->tags[i].tag, tag) == 0)
			return st->tags[i].wakes;
	return 0;
}

static void pause_ns(long ns)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = ns };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* After a wake (before it answers, the tags awake, no step running): check
 * each tag this wake brought back. In the hook rather than the trainer's
 * next step, so that no wake goes unchecked (a sleep may come before the
 * next step) and /stats right after the wake counts the check. */
static void verify_woken(struct demo *d)
{
	if (dormant_stats_get(d->m, d->stats) < 0) {
		atomic_fetch_add(&d->errors, 1);
		warn("after a wake: reading stats: %s", dormant_last_error());
		return;
	}
	uint64_t w = tag_wakes(d->stats, "weights"), g = tag_wakes(d->stats, "grads");

	if (d->weights && w != d->weights_wakes_seen)
		verify_tag(d, true);
	if (d->grads && g != d->grads_wakes_seen)
		verify_tag(d, false);
	d->weights_wakes_seen = w;
	d->grads_wakes_seen = g;
}

/* One step, inside the guard: every tag is awake and no sleep can start. */
static void step(struct demo *d)
{
	uint64_t n = atomic_load(&d->steps);

	/* "backward": dirty a piece of the gradients, which the next sleep
	 * discards and the wake after it must give back as zeros */
	if (d->grads) {
		size_t size = d->config.discard_bytes < STEP_DIRTY_BYTES ? d->config.discard_bytes
									  : STEP_DIRTY_BYTES;
		size_t slots = d->config.discard_bytes / size;
		size_t off = (size_t)(n % slots) * size;

		memset(d->scratch, 0xab, size);
		if (dormant_copy_to_device(d->m, (char *)d->grads + off, d->scratch, size) < 0) {
			atomic_fetch_add(&d->errors, 1);
			warn("step %" PRIu64 ": writing gradients: %s", n, dormant_last_error());
		}
	}
	pause_ns(STEP_COMPUTE_NS);
	atomic_fetch_add(&d->steps, 1);
}

static void *trainer_main(void *arg)
{
	struct demo *d = arg;

	while (!atomic_load(&d->stop)) {
		int r = dormant_step_enter(d->m, STEP_ENTER_TIMEOUT_MS);

		if (r == -ETIMEDOUT)
			continue; /* asleep: look at stop, wait again */
		if (r < 0) {
			warn("entering a step: %s", dormant_last_error());
			break;
		}
		step(d);
		dormant_step_leave(d->m);
		pause_ns(STEP_PAUSE_NS);
	}
	return NULL;
}

/* ---- what the server shows ----------------------------------------------- */

static int stats_extra(void *userdata, char *buf, size_t size)
{
	struct demo *d = userdata;
	char last[sizeof(d->last_check)];
	int n;

	pthread_mutex_lock(&d->lock);
	memcpy(last, d->last_check, sizeof(last));
	pthread_mutex_unlock(&d->lock);
	/* last holds only text this file wrote (no quote, no backslash) */
	n = snprintf(buf, size,
		     "{\"steps\": %" PRIu64 ", \"verifications\": %" PRIu64
		     ", \"mismatches\": %" PRIu64 ", \"errors\": %" PRIu64
		     ", \"weights_bytes\": %zu, \"grads_bytes\": %zu, \"fail_wakes_left\": %u"
		     ", \"last_verification\": \"%s\"}",
		     atomic_load(&d->steps), atomic_load(&d->verifications),
		     atomic_load(&d->mismatches), atomic_load(&d->errors), d->config.keep_bytes,
		     d->config.discard_bytes, atomic_load(&d->fail_wakes_left), last);
	return n < 0 || (size_t)n >= size ? -ENOSPC : n;
}

static int metrics_extra(void *userdata, char *buf, size_t size)
{
	struct demo *d = userdata;
	int n = snprintf(
		buf, size,
		"# HELP dormant_demo_verifications_total Checks of a tag's bytes after a wake.\n"
		"# TYPE dormant_demo_verifications_total counter\n"
		"dormant_demo_verifications_total %" PRIu64 "\n"
		"# HELP dormant_demo_mismatches_total Checks that found bytes changed by a sleep "
		"and wake.\n"
		"# TYPE dormant_demo_mismatches_total counter\n"
		"dormant_demo_mismatches_total %" PRIu64 "\n"
		"# HELP dormant_demo_steps_total Simulated training steps run.\n"
		"# TYPE dormant_demo_steps_total counter\n"
		"dormant_demo_steps_total %" PRIu64 "\n",
		atomic_load(&d->verifications), atomic_load(&d->mismatches), atomic_load(&d->steps));

	return n < 0 || (size_t)n >= size ? -ENOSPC : n;
}

/* --fail-wakes: make this wake's first device memory creation fail as if a
 * rollout engine held the memory. */
static int before_wake(struct dormant *m, enum dormant_hook_point point, void *userdata)
{
	struct demo *d = userdata;
	unsigned left = atomic_load(&d->fail_wakes_left);

	while (left > 0 && !atomic_compare_exchange_weak(&d->fail_wakes_left, &left, left - 1))
		;
	if (left > 0)
		dormant_debug_inject_fault(m, DORMANT_FAULT_CREATE, 1, -ENOMEM, false);
	return 0;
}

/* A wake that created no memory (no allocation asleep) left the fault armed:
 * disarm it so that it cannot hit something else. Then check what came back. */
static int after_wake(struct dormant *m, enum dormant_hook_point point, void *userdata)
{
	dormant_debug_inject_fault(m, DORMANT_FAULT_CREATE, 0, 0, false);
	verify_woken(userdata);
	return 0;
}

/* ---- main ---------------------------------------------------------------- */

static int sizes_check(struct demo *d);

static int demo_setup(struct demo *d)
{
	struct dormant_options *options = NULL;
	enum dormant_host_mode mode = d->config.host_mode;
	int r;

	/* --option comes last: it may override --backend and --host-mode */
	r = dormant_options_new(&options);
	if (r == 0)
		r = dormant_options_set(options, "backend", d->config.backend);
	if (r == 0 && mode != DORMANT_HOST_DEFAULT)
		r = dormant_options_set(options, "host_mode", dormant_host_mode_name(mode));
	if (r == 0)
		r = dormant_options_parse(options, d->config.options);
	if (r == 0)
		r = dormant_options_set_log(options, on_log, &d->config);
	if (r == 0)
		r = dormant_new(options, &d->m);
	dormant_options_destroy(options);
	if (r < 0) {
		warn("starting the manager: %s", dormant_last_error());
		return r;
	}
	d->scratch = malloc(BLOCK_BYTES);
	d->expected = malloc(BLOCK_BYTES);
	d->stats = malloc(sizeof(*d->stats));
	if (!d->scratch || !d->expected || !d->stats) {
		warn("out of memory");
		return -ENOMEM;
	}
	r = sizes_check(d);
	if (r < 0)
		return r;
	if ((r = dormant_set_policy(d->m, "weights", DORMANT_KEEP)) < 0 ||
	    (r = dormant_set_policy(d->m, "grads", DORMANT_DISCARD)) < 0) {
		warn("setting policies: %s", dormant_last_error());
		return r;
	}
	if (d->config.keep_bytes &&
	    (r = dormant_alloc(d->m, "weights", d->config.keep_bytes, &d->weights)) < 0) {
		warn("allocating %zu bytes of weights: %s", d->config.keep_bytes,
		     dormant_last_error());
		return r;
	}
	if (d->config.discard_bytes &&
	    (r = dormant_alloc(d->m, "grads", d->config.discard_bytes, &d->grads)) < 0) {
		warn("allocating %zu bytes of gradients: %s", d->config.discard_bytes,
		     dormant_last_error());
		return r;
	}
	if (d->weights && (r = weights_fill(d)) < 0) {
		warn("filling the weights: %s", dormant_last_error());
		return r;
	}
	check_record(d, "none yet");
	atomic_store(&d->fail_wakes_left, d->config.fail_wakes);
	if ((r = dormant_hook_add(d->m, DORMANT_HOOK_BEFORE_WAKE, before_wake, d)) < 0 ||
	    (r = dormant_hook_add(d->m, DORMANT_HOOK_AFTER_WAKE, after_wake, d)) < 0) {
		warn("adding hooks: %s", dormant_last_error());
		return r;
	}
	return 0;
}

static void demo_finish(struct demo *d)
{
	if (d->m) {
		dormant_free(d->m, d->weights);
		dormant_free(d->m, d->grads);
		dormant_destroy(d->m);
	}
	free(d->scratch);
	free(d->expected);
	free(d->stats);
	pthread_mutex_destroy(&d->lock);
}

/* The server's options from the flags; --server-option last, so that it
 * may override them. 0, or -EINVAL with the message in dormant_last_error(). */
static int server_options_fill(struct demo *d, struct dormant_server_options **ret)
{
	const struct config *c = &d->config;
	struct dormant_server_options *o;
	int r;

	r = dormant_server_options_new(&o);
	if (r < 0)
		return r;
	if (c->listen && !c->unix_path)
		r = dormant_server_options_set(o, "listen", c->listen);
	if (r == 0 && c->unix_path)
		r = dormant_server_options_set(o, "unix_path", c->unix_path);
	if (r == 0 && c->token)
		r = dormant_server_options_set(o, "token", c->token);
	if (r == 0 && c->token_file)
		r = dormant_server_options_set(o, "token_file", c->token_file);
	if (r == 0 && c->open_probes)
		r = dormant_server_options_set_int(o, "open_probes", 1);
	if (r == 0 && c->insecure_no_auth)
		r = dormant_server_options_set_int(o, "insecure_no_auth", 1);
	if (r == 0)
		r = dormant_server_options_set_int(o, "threads", c->threads);
	/* the server's default unless more threads need more */
	if (r == 0 && (c->max_connections || c->threads > 64))
		r = dormant_server_options_set_int(o, "max_connections",
						   c->max_connections ? c->max_connections
								      : c->threads);
	if (r == 0 && c->max_connections_per_ip)
		r = dormant_server_options_set_int(o, "max_connections_per_ip",
						   c->max_connections_per_ip);
	if (r == 0 && c->connection_timeout_s)
		r = dormant_server_options_set_int(o, "connection_timeout_s",
						   c->connection_timeout_s);
	if (r == 0 && c->request_timeout_s)
		r = dormant_server_options_set_int(o, "request_timeout_s", c->request_timeout_s);
	/* no --fault: none (the environment never arms faults) */
	if (r == 0 && c->faults[0])
		r = dormant_server_options_set(o, "faults", c->faults);
	if (r == 0 && c->quiet)
		r = dormant_server_options_set_int(o, "quiet", 1);
	if (r == 0 && c->server_options[0])
		r = dormant_server_options_parse(o, c->server_options);
	if (r == 0)
		r = dormant_server_options_set_log(o, on_server_log, NULL);
	if (r == 0)
		r = dormant_server_options_set_stats_extra(o, stats_extra, d);
	if (r == 0)
		r = dormant_server_options_set_metrics_extra(o, metrics_extra, d);
	if (r < 0) {
		dormant_server_options_destroy(o);
		return r;
	}
	*ret = o;
	return 0;
}

/* bytes as "1.5 GiB", "64 MiB" or "17 bytes" into buf. */
static const char *bytes_text(uint64_t bytes, char *buf, size_t len)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double value = (double)bytes / 1024;
	size_t unit = 0;

	if (bytes < 1024) {
		snprintf(buf, len, "%" PRIu64 " bytes", bytes);
		return buf;
	}
	while (value >= 1024 && unit + 1 < sizeof(units) / sizeof(units[0])) {
		value /= 1024;
		unit++;
	}
	snprintf(buf, len, value == (double)(uint64_t)value ? "%.0f %s" : "%.1f %s", value,
		 units[unit]);
	return buf;
}

/* MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read. */
static uint64_t host_available_bytes(void)
{
	unsigned long long kib = 0;
	char line[256];
	FILE *f = fopen("/proc/meminfo", "r");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1)
			break;
	fclose(f);
	return (uint64_t)kib * 1024;
}

/* Sizes that cannot fit fail here, at once, with the sizes as given, before
 * anything is allocated or filled: the tags must fit in what device 0, where
 * they are allocated, has free, and the host must hold the kept bytes' copy
 * (on the host backend the device's memory is host memory too). -E2BIG after
 * saying so. */
static int sizes_check(struct demo *d)
{
	struct dormant_stats *st = d->stats;
	uint64_t keep = d->config.keep_bytes, discard = d->config.discard_bytes;
	uint64_t host_need = keep, host_have = host_available_bytes();
	char total_text[32], free_text[32], need_text[32], have_text[32];
	const struct dormant_device_stats *dev;

	if (dormant_stats_get(d->m, st) < 0 || st->device_count == 0 ||
	    st->devices[0].total_bytes == 0)
		return 0; /* cannot tell: the allocation says */
	dev = &st->devices[0];
	if (keep > dev->free_bytes || discard > dev->free_bytes - keep) {
		warn("--keep %s and --discard %s do not fit in device 0 (%s of %s free)",
		     d->config.keep_text, d->config.discard_text,
		     bytes_text(dev->free_bytes, free_text, sizeof(free_text)),
		     bytes_text(dev->total_bytes, total_text, sizeof(total_text)));
		return -E2BIG;
	}
	if (strcmp(dormant_backend_name(d->m), "host") == 0)
		host_need += keep + discard;
	if (host_have && host_need > host_have) {
		warn("--keep %s and --discard %s need %s of host memory, %s available", d->config.keep_text,
		     d->config.discard_text, bytes_text(host_need, need_text, sizeof(need_text)),
		     bytes_text(host_have, have_text, sizeof(have_text)));
		return -E2BIG;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct dormant_server_options *server_options = NULL;
	struct dormant_server *server = NULL;
	struct demo d = { 0 };
	bool trainer_started = false;
	sigset_t signals;
	int r, sig, status = EXIT_FAILURE;

	r = parse_flags(argc, argv, &d.config);
	if (r == FLAGS_HELP) {
		usage(stdout);
		return EXIT_SUCCESS;
	}
	if (r == FLAGS_VERSION) {
		printf("dormantd %s\n", dormant_version()); /* the library's */
		return EXIT_SUCCESS;
	}
	if (r < 0)
		return 2;
	/* Everything the flags say is checked before the backend starts. */
	if (server_options_fill(&d, &server_options) < 0 ||
	    dormant_server_options_check(server_options) < 0) {
		warn("%s", dormant_last_error());
		dormant_server_options_destroy(server_options);
		return 2;
	}
	pthread_mutex_init(&d.lock, NULL);

	/* Every thread inherits the mask: SIGINT and SIGTERM arrive only
	 * through sigwait() below, and nothing runs in a signal handler. */
	sigemptyset(&signals);
	sigaddset(&signals, SIGINT);
	sigaddset(&signals, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &signals, NULL);
	signal(SIGPIPE, SIG_IGN);

	r = demo_setup(&d);
	if (r == -E2BIG)
		status = 2; /* the sizes given do not fit the device */
	if (r < 0)
		goto out;
	r = pthread_create(&d.trainer, NULL, trainer_main, &d);
	if (r != 0) {
		warn("starting the trainer thread: %s", strerror(r));
		goto out;
	}
	trainer_started = true;

	r = dormant_server_start(d.m, server_options, &server);
	dormant_server_options_destroy(server_options);
	server_options = NULL;
	if (r < 0) {
		warn("starting the HTTP server: %s", dormant_last_error());
		goto out;
	}
	/* the port file last: whoever waits for it finds the record there too */
	if (d.config.publish || d.config.role) {
		r = dormant_server_publish(server, d.config.publish_dir, d.config.role);
		if (r < 0) {
			warn("publishing the discovery record: %s", dormant_last_error());
			goto out;
		}
	}
	if (d.config.port_file) {
		r = dormant_server_write_port_file(server, d.config.port_file);
		if (r < 0) {
			warn("writing %s: %s", d.config.port_file, strerror(-r));
			goto out;
		}
	}
	printf("dormantd listening on %s\n", dormant_server_url(server));
	fflush(stdout);
	if (!d.config.quiet)
		warn("%s backend, %zu bytes of weights (keep), %zu bytes of gradients (discard)",
		     dormant_backend_name(d.m), d.config.keep_bytes, d.config.discard_bytes);

	do {
		r = sigwait(&signals, &sig);
	} while (r == EINTR);
	if (!d.config.quiet)
		warn("%s: stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
	status = atomic_load(&d.mismatches) ? 3 : EXIT_SUCCESS;

out:
	dormant_server_options_destroy(server_options); /* NULL once started */
	/* The server first: a sleep or wake in flight runs to its end. */
	dormant_server_stop(server);
	if (server && d.config.port_file)
		unlink(d.config.port_file);
	if (trainer_started) {
		atomic_store(&d.stop, true);
		pthread_join(d.trainer, NULL);
	}
	demo_finish(&d);
	return status;
}
