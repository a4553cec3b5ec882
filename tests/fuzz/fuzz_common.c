/* SPDX-License-Identifier: MIT */
#include "fuzz_common.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "dormant.h"

#define TAG_BYTES ((size_t)1 << 20)

static void *weights;
static unsigned char *pattern;

struct dormant *fuzz_scene_new(void)
{
	/* TAG_BYTES chunks, 16 of them per device */
	static const char options[] = "backend=host,host_mode=release,chunk_bytes=1MiB,"
				      "guard_timeout_ms=10,copy_threads=1,host_devices=1,"
				      "host_device_bytes=16MiB";
	struct dormant_options *o = NULL;
	struct dormant *m = NULL;
	void *grads;
	int r;

	r = dormant_options_new(&o);
	if (r == 0)
		r = dormant_options_parse(o, options);
	if (r == 0)
		r = dormant_new(o, &m);
	dormant_options_destroy(o);
	if (r < 0 || dormant_set_policy(m, "grads", DORMANT_DISCARD) < 0 ||
	    dormant_alloc(m, "weights", TAG_BYTES, &weights) < 0 ||
	    dormant_alloc(m, "grads", TAG_BYTES, &grads) < 0) {
		fprintf(stderr, "fuzz: setup: %s\n", dormant_last_error());
		abort();
	}
	pattern = malloc(TAG_BYTES);
	CHECK(pattern);
	for (size_t i = 0; i < TAG_BYTES; i++)
		pattern[i] = (unsigned char)(i * 131 + 7);
	CHECK(dormant_copy_to_device(m, weights, pattern, TAG_BYTES) == 0);
	return m;
}

void fuzz_scene_check(struct dormant *m)
{
	static unsigned inputs;
	struct dormant_report rep;
	unsigned char *back;
	int r;

	/* a transition the client gave up on may still run: wait for it */
	for (int i = 0; (r = dormant_wake(m, NULL, &rep)) == -EBUSY && i < 5000; i++)
		usleep(1000);
	CHECK(r == 0);
	if (rep.bytes_mapped == 0 && ++inputs % 256 != 0)
		return;
	back = malloc(TAG_BYTES);
	CHECK(back);
	CHECK(dormant_copy_to_host(m, back, weights, TAG_BYTES) == 0);
	CHECK(memcmp(back, pattern, TAG_BYTES) == 0);
	free(back);
}
