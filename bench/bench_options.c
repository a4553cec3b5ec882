/* SPDX-License-Identifier: MIT */
/* dormant-bench's flags: the usage text and the parser. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "benchutil.h"
#include "dormant-bench.h"

#ifndef DORMANT_VERSION
#define DORMANT_VERSION "unknown"
#endif

static void usage(FILE *f)
{
	fputs("usage: dormant-bench [options]\n"
	      "Measure sleep and wake of kept and discarded device memory against the\n"
	      "pinned copy ceiling of the same device.\n"
	      "\n"
	      "  --keep SIZE         bytes kept (copied to host on sleep); default 16GiB\n"
	      "  --discard SIZE      bytes discarded (zero-filled on wake); default 16GiB\n"
	      "  --tensors N         split the kept bytes into N allocations and the\n"
	      "                      discarded bytes into N more, of mixed sizes; default 1\n"
	      "  --cycles N          sleep+wake cycles, the first one cold; default 6\n"
	      "  --devices N         the same tensors on each of devices 0 to N-1 (sizes are\n"
	      "                      per device), all moved by each transition; default 1\n"
	      "  --backend NAME      auto, cuda or host; default auto\n"
	      "  --host-mode MODE    retain, release or reclaimable; default the library's\n"
	      "  --chunk SIZE        physical chunk size (chunk_bytes); default the library's\n"
	      "  --staging SIZE      pinned staging ring for host copies that stay unpinned\n"
	      "                      (pinning failed, or DORMANT_PIN_HOST=0); default the library's\n"
	      "  --copy-threads N    host threads that fault in host copies and do the host side\n"
	      "                      of staged copies; default the library's (CPUs, at most 16)\n"
	      "  --ceiling-reps N    repetitions of the ceiling copies (median); 0 skips; default 3\n"
	      "  --seed N            seed of the sizes and the pattern; default 1\n"
	      "  --label NAME        name of the run, stored in the JSON\n"
	      "  --json              print one JSON object on stdout instead of the table\n"
	      "  --json-out FILE     also write that JSON object to FILE\n"
	      "  --force             run even when the sizes do not seem to fit in memory\n"
	      "  --warm-up MODE      before the first sleep: off (the library's warm-up off:\n"
	      "                      the cold cycle sets everything up), call (dormant_warm_up()\n"
	      "                      after the fill) or wait (the library's background warm-up,\n"
	      "                      waited for); default off\n"
	      "  --verbose           the library's log on stderr\n"
	      "  --debug-corrupt     change one kept byte before the check (the run must fail)\n"
	      "  -h, --help          this text\n"
	      "  -V, --version       the version\n"
	      "SIZE: a number with an optional unit: K, M, G, T, KiB, MiB, GiB, TiB, KB, MB, GB.\n"
	      "Exit status: 0 done and verified, 1 error, 2 bad usage, 77 skipped (does not fit).\n",
	      f);
}

static int parse_size(const char *name, const char *text, size_t *ret)
{
	if (size_parse(text, ret) < 0) {
		fprintf(stderr, "dormant-bench: %s: %s\n", name, dormant_last_error());
		return -1;
	}
	return 0;
}

static int parse_number(const char *name, const char *text, unsigned long long min,
			unsigned long long max, unsigned long long *ret)
{
	if (number_parse(text, min, max, ret) < 0) {
		fprintf(stderr, "dormant-bench: %s must be a whole number from %llu to %llu, not '%s'\n",
			name, min, max, text);
		return -1;
	}
	return 0;
}

int options_parse(int argc, char **argv, struct options *o)
{
	enum {
		OPT_KEEP = 256, OPT_DISCARD, OPT_TENSORS, OPT_CYCLES, OPT_BACKEND, OPT_HOST_MODE,
		OPT_CHUNK, OPT_STAGING, OPT_COPY_THREADS, OPT_CEILING_REPS, OPT_SEED, OPT_LABEL,
		OPT_JSON, OPT_JSON_OUT, OPT_FORCE, OPT_VERBOSE, OPT_DEBUG_CORRUPT, OPT_HELP,
		OPT_DEVICES, OPT_WARM_UP,
	};
	static const struct option longopts[] = {
		{ "keep", required_argument, NULL, OPT_KEEP },
		{ "discard", required_argument, NULL, OPT_DISCARD },
		{ "tensors", required_argument, NULL, OPT_TENSORS },
		{ "cycles", required_argument, NULL, OPT_CYCLES },
		{ "devices", required_argument, NULL, OPT_DEVICES },
		{ "backend", required_argument, NULL, OPT_BACKEND },
		{ "host-mode", required_argument, NULL, OPT_HOST_MODE },
		{ "chunk", required_argument, NULL, OPT_CHUNK },
		{ "staging", required_argument, NULL, OPT_STAGING },
		{ "copy-threads", required_argument, NULL, OPT_COPY_THREADS },
		{ "ceiling-reps", required_argument, NULL, OPT_CEILING_REPS },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "label", required_argument, NULL, OPT_LABEL },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "json-out", required_argument, NULL, OPT_JSON_OUT },
		{ "force", no_argument, NULL, OPT_FORCE },
		{ "verbose", no_argument, NULL, OPT_VERBOSE },
		{ "warm-up", required_argument, NULL, OPT_WARM_UP },
		{ "debug-corrupt", no_argument, NULL, OPT_DEBUG_CORRUPT },
		{ "help", no_argument, NULL, OPT_HELP },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	unsigned long long n;
	int c;

	*o = (struct options){
		.backend = "auto",
		.warm_up = "off",
		.host_mode = DORMANT_HOST_DEFAULT,
		.keep_bytes = 16 * GiB,
		.discard_bytes = 16 * GiB,
		.tensors = 1,
		.cycles = 6,
		.devices = 1,
		.ceiling_reps = 3,
		.seed = 1,
	};
	opterr = 0; /* bench_flag_error() says it in one line */
	while ((c = getopt_long(argc, argv, ":hV", longopts, NULL)) != -1) {
		switch (c) {
		case OPT_KEEP:
			if (parse_size("--keep", optarg, &o->keep_bytes) < 0)
				return -1;
			break;
		case OPT_DISCARD:
			if (parse_size("--discard", optarg, &o->discard_bytes) < 0)
				return -1;
			break;
		case OPT_TENSORS:
			if (parse_number("--tensors", optarg, 1, TENSORS_MAX, &n) < 0)
				return -1;
			o->tensors = (size_t)n;
			break;
		case OPT_CYCLES:
			if (parse_number("--cycles", optarg, 1, CYCLES_MAX, &n) < 0)
				return -1;
			o->cycles = (unsigned)n;
			break;
		case OPT_DEVICES:
			if (parse_number("--devices", optarg, 1, DORMANT_DEVICES_MAX, &n) < 0)
				return -1;
			o->devices = (unsigned)n;
			break;
		case OPT_BACKEND:
			if (strcmp(optarg, "auto") && strcmp(optarg, "cuda") && strcmp(optarg, "host")) {
				fprintf(stderr, "dormant-bench: --backend must be auto, cuda or host\n");
				return -1;
			}
			o->backend = optarg;
			break;
		case OPT_HOST_MODE:
			if (strcmp(optarg, "retain") == 0)
				o->host_mode = DORMANT_HOST_RETAIN;
			else if (strcmp(optarg, "release") == 0)
				o->host_mode = DORMANT_HOST_RELEASE;
			else if (strcmp(optarg, "reclaimable") == 0)
				o->host_mode = DORMANT_HOST_RECLAIMABLE;
			else {
				fprintf(stderr, "dormant-bench: --host-mode must be retain, release or "
						"reclaimable\n");
				return -1;
			}
			break;
		case OPT_CHUNK:
			if (parse_size("--chunk", optarg, &o->chunk_bytes) < 0)
				return -1;
			if (o->chunk_bytes == 0) {
				fprintf(stderr, "dormant-bench: --chunk must not be 0\n");
				return -1;
			}
			break;
		case OPT_STAGING:
			if (parse_size("--staging", optarg, &o->staging_bytes) < 0)
				return -1;
			break;
		case OPT_COPY_THREADS:
			if (parse_number("--copy-threads", optarg, 1, 256, &n) < 0)
				return -1;
			o->copy_threads = (unsigned)n;
			break;
		case OPT_CEILING_REPS:
			if (parse_number("--ceiling-reps", optarg, 0, CEILING_REPS_MAX, &n) < 0)
				return -1;
			o->ceiling_reps = (unsigned)n;
			break;
		case OPT_SEED:
			if (parse_number("--seed", optarg, 0, UINT64_MAX, &n) < 0)
				return -1;
			o->seed = n;
			break;
		case OPT_LABEL:
			o->label = optarg;
			break;
		case OPT_JSON:
			o->json = true;
			break;
		case OPT_JSON_OUT:
			o->json_out = optarg;
			break;
		case OPT_FORCE:
			o->force = true;
			break;
		case OPT_VERBOSE:
			o->verbose = true;
			break;
		case OPT_WARM_UP:
			if (strcmp(optarg, "off") && strcmp(optarg, "call") && strcmp(optarg, "wait")) {
				fprintf(stderr, "dormant-bench: --warm-up must be off, call or wait\n");
				return -1;
			}
			o->warm_up = optarg;
			break;
		case OPT_DEBUG_CORRUPT:
			o->debug_corrupt = true;
			break;
		case OPT_HELP:
		case 'h':
			usage(stdout);
			exit(0);
		case 'V':
			printf("dormant-bench %s\n", DORMANT_VERSION);
			exit(0);
		default:
			return bench_flag_error(c, argv, longopts);
		}
	}
	if (optind < argc) {
		fprintf(stderr, "dormant-bench: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	if (o->keep_bytes == 0 && o->discard_bytes == 0) {
		fprintf(stderr, "dormant-bench: --keep and --discard are both 0: nothing to measure\n");
		return -1;
	}
	if (o->debug_corrupt && o->keep_bytes == 0) {
		fprintf(stderr, "dormant-bench: --debug-corrupt needs kept bytes\n");
		return -1;
	}
	return 0;
}
