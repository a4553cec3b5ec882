/* SPDX-License-Identifier: MIT */
/*
 * The README's C example as a complete program: two tags, one sleep, one
 * wake, the same addresses after it. Build it against an installed dormant:
 *
 *   cc examples/hello.c $(pkg-config --cflags --libs dormant) -o hello
 *   ./hello            # 1 GiB per tag; ./hello 1048576 for 1 MiB
 *
 * On a machine without a usable CUDA driver the host backend (ordinary
 * memory standing in for the GPU) is used; DORMANT_BACKEND=host forces it.
 */
#include <dormant.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check(int r, const char *what)
{
	if (r < 0)
		fprintf(stderr, "hello: %s: %s (%s)\n", what, dormant_last_error(), strerror(-r));
	return r;
}

int main(int argc, char **argv)
{
	size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 0) : 1ull << 30;
	struct dormant *m;
	void *weights, *grads;
	int status = EXIT_FAILURE;

	if (check(dormant_new(NULL, &m), "dormant_new") < 0) /* backend: auto */
		return EXIT_FAILURE;
	if (check(dormant_set_policy(m, "grads", DORMANT_DISCARD), "set_policy") < 0 ||
	    check(dormant_alloc(m, "weights", bytes, &weights), "alloc weights") < 0 ||
	    check(dormant_alloc(m, "grads", bytes, &grads), "alloc grads") < 0)
		goto out;
	/* all tags: the GPU memory is given back, weights copied to host first */
	if (check(dormant_sleep(m, NULL, NULL), "sleep") < 0)
		goto out;
	/* the same addresses; weights restored, grads zeroed */
	if (check(dormant_wake(m, NULL, NULL), "wake") < 0)
		goto out;
	printf("dormant %s, %s backend: slept and woke %zu bytes per tag, weights at %p\n",
	       dormant_version(), dormant_backend_name(m), bytes, weights);
	status = EXIT_SUCCESS;
out:
	dormant_destroy(m);
	return status;
}
