/* SPDX-License-Identifier: MIT */
/*
 * residue-probe: residue mode checkpoint step by step, each step timed and
 * printed, so that a step that hangs shows which one (issue 34). Public API
 * only.
 *   residue-probe [--stats-asleep] [--cycles N] [--mib N] [--residue keep|checkpoint]
 *                 [--hold S]
 * --stats-asleep reads dormant_stats_get() while checkpointed (the devices
 * through NVML). --hold S: after each sleep, print "hold PID" and wait S
 * seconds (with --residue keep, so that a process outside, such as
 * dormant-residue-helper --pid PID checkpoint, can act on this one).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dormant.h"

static double t0;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void say(const char *what)
{
	fprintf(stderr, "[%8.3f] %s\n", now() - t0, what);
}

static void logger(enum dormant_log_level level, const char *message, void *userdata)
{
	(void)level;
	(void)userdata;
	fprintf(stderr, "[%8.3f]   log: %s\n", now() - t0, message);
}

static void residue_line(struct dormant *m)
{
	struct dormant_residue_stats r;

	dormant_residue_stats_get(m, &r);
	fprintf(stderr,
		"[%8.3f]   residue %s, %llu bytes, last %s %d in %.3f s %s; helper %d; calls %llu\n",
		now() - t0, dormant_residue_state_name(r.state), (unsigned long long)r.residue_bytes,
		r.last_op, r.last_result, r.last_seconds, r.last_error, r.helper_pid,
		(unsigned long long)r.calls_while_checkpointed);
}

int main(int argc, char **argv)
{
	struct dormant_options *o;
	struct dormant_stats *st = malloc(sizeof(*st));
	struct dormant *m;
	bool stats_asleep = false;
	int cycles = 1, hold_s = 0;
	const char *residue = "checkpoint";
	char options[128];
	size_t mib = 256;
	unsigned char *host, *back;
	void *dev;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--stats-asleep") == 0)
			stats_asleep = true;
		else if (strcmp(argv[i], "--cycles") == 0 && i + 1 < argc)
			cycles = atoi(argv[++i]);
		else if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
			mib = (size_t)atol(argv[++i]);
		else if (strcmp(argv[i], "--residue") == 0 && i + 1 < argc)
			residue = argv[++i];
		else if (strcmp(argv[i], "--hold") == 0 && i + 1 < argc)
			hold_s = atoi(argv[++i]);
	}
	t0 = now();
	dormant_options_new(&o);
	snprintf(options, sizeof(options), "residue=%s,warmup=off", residue);
	if (dormant_options_parse(o, options) < 0) {
		fprintf(stderr, "%s\n", dormant_last_error());
		return 2;
	}
	dormant_options_set_log(o, logger, NULL);
	if (dormant_new(o, &m) < 0) {
		fprintf(stderr, "dormant_new: %s\n", dormant_last_error());
		return 1;
	}
	dormant_options_destroy(o);
	say("manager made");
	if (dormant_alloc(m, "weights", mib << 20, &dev) < 0) {
		fprintf(stderr, "alloc: %s\n", dormant_last_error());
		return 1;
	}
	host = malloc(mib << 20);
	back = malloc(mib << 20);
	for (size_t i = 0; i < (mib << 20); i++)
		host[i] = (unsigned char)(i * 31 + 7);
	dormant_copy_to_device(m, dev, host, mib << 20);
	dormant_stats_get(m, st);
	fprintf(stderr, "[%8.3f] filled; device 0 free %.2f GiB\n", now() - t0,
		st->devices[0].free_bytes / 1073741824.0);
	for (int c = 0; c < cycles; c++) {
		say("sleep ...");
		if (dormant_sleep(m, NULL, NULL) < 0)
			fprintf(stderr, "sleep: %s\n", dormant_last_error());
		say("slept");
		residue_line(m);
		if (hold_s > 0) {
			fprintf(stderr, "[%8.3f] hold %d\n", now() - t0, (int)getpid());
			sleep((unsigned)hold_s);
			say("held");
		}
		if (stats_asleep) {
			say("stats while checkpointed ...");
			dormant_stats_get(m, st);
			fprintf(stderr, "[%8.3f] stats: device 0 free %.2f GiB of %.2f\n", now() - t0,
				st->devices[0].free_bytes / 1073741824.0,
				st->devices[0].total_bytes / 1073741824.0);
		}
		say("wake ...");
		if (dormant_wake(m, NULL, NULL) < 0)
			fprintf(stderr, "wake: %s\n", dormant_last_error());
		say("woke");
		residue_line(m);
		dormant_copy_to_host(m, back, dev, mib << 20);
		fprintf(stderr, "[%8.3f] data %s\n", now() - t0,
			memcmp(host, back, mib << 20) == 0 ? "intact" : "DIFFERENT");
	}
	dormant_destroy(m);
	say("destroyed");
	return 0;
}
