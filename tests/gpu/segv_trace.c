// SPDX-License-Identifier: MIT
/*
 * Diagnostic, for the GPU machine (which has no gdb): LD_PRELOAD it and a
 * SIGSEGV, SIGBUS or SIGABRT prints the native stack (each frame's object
 * and symbol or offset) to stderr, then the signal takes its course.
 *   cc -shared -fPIC -O1 -g -o segv_trace.so tests/gpu/segv_trace.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void say(const char *line)
{
	if (write(2, line, strlen(line)) < 0)
		return; /* nowhere else to say it */
}

static void on_signal(int sig, siginfo_t *si, void *uc)
{
	void *frames[64];
	int n = backtrace(frames, 64);
	char line[512];

	(void)uc;
	snprintf(line, sizeof(line), "segv_trace: signal %d at address %p, %d frames\n", sig,
		 si->si_addr, n);
	say(line);
	for (int i = 0; i < n; i++) {
		Dl_info info = { 0 };

		dladdr(frames[i], &info);
		snprintf(line, sizeof(line), "  #%d %p %s %s+%#lx\n", i, frames[i],
			 info.dli_fname ? info.dli_fname : "?", info.dli_sname ? info.dli_sname : "",
			 info.dli_sname ? (unsigned long)((char *)frames[i] - (char *)info.dli_saddr)
					: (unsigned long)((char *)frames[i] - (char *)info.dli_fbase));
		say(line);
	}
	signal(sig, SIG_DFL);
	raise(sig);
}

__attribute__((constructor)) static void segv_trace_init(void)
{
	struct sigaction sa = { .sa_sigaction = on_signal, .sa_flags = SA_SIGINFO | SA_RESETHAND };

	sigaction(SIGSEGV, &sa, NULL);
	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGABRT, &sa, NULL);
}
