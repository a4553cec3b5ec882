/* SPDX-License-Identifier: MIT */
/* What the discovery records' writer (server/) and reader (ctl/) share. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

int runtime_dir_name(const char *dir, char *ret, size_t size, bool *shared_tmp)
{
	const char *env;
	bool tmp = false;
	int n;

	if (dir && *dir)
		n = snprintf(ret, size, "%s", dir);
	else if ((env = getenv("DORMANT_RUNTIME_DIR")) && *env)
		n = snprintf(ret, size, "%s", env);
	else if ((env = getenv("XDG_RUNTIME_DIR")) && *env)
		n = snprintf(ret, size, "%s/dormant", env);
	else {
		n = snprintf(ret, size, "/tmp/dormant-%u", (unsigned)getuid());
		tmp = true;
	}
	if (shared_tmp)
		*shared_tmp = tmp;
	return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

long long process_start_ticks(long long pid)
{
	char path[64], buf[1024], *p;
	long long ticks = -1;
	size_t len;
	FILE *f;

	if (pid > 0)
		snprintf(path, sizeof(path), "/proc/%lld/stat", pid);
	else
		snprintf(path, sizeof(path), "/proc/self/stat");
	f = fopen(path, "re");
	if (!f)
		return -1;
	len = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[len] = '\0';
	p = strrchr(buf, ')'); /* the command name may hold spaces */
	/* after ")" come " 3 4 ...": p moves to the blank before each field */
	for (int field = 3; p && field <= 22; field++) {
		p = strchr(p + 1, ' ');
		if (p && field == 22)
			ticks = strtoll(p + 1, NULL, 10);
	}
	return ticks > 0 ? ticks : -1;
}
