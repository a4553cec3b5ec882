/* SPDX-License-Identifier: MIT */
/* dormant-bench: the run (dormant-bench.h says what it measures and which
 * file does what). */
#include <stdlib.h>

#include "benchutil.h"
#include "dormant-bench.h"

static int bench_run(struct bench *b)
{
	int r;

	r = bench_setup(b);
	if (r != 0)
		return r;
	r = fit_check(b);
	if (r != 0)
		return r;
	if (ceiling_measure(b) < 0 || tensors_allocate(b) < 0 || tensors_fill(b) < 0 ||
	    warm_up(b) < 0)
		return -1;
	for (unsigned i = 0; i < b->opt.cycles; i++) {
		if (cycle_run(b, &b->cycles[i]) < 0) {
			fprintf(stderr, "dormant-bench: in cycle %u of %u\n", i + 1, b->opt.cycles);
			return -1;
		}
		b->cycles_done++;
	}
	if (b->opt.debug_corrupt && tensors_corrupt(b) < 0)
		return -1;
	if (tensors_check(b) < 0)
		return -1;
	return results_write(b);
}

int main(int argc, char **argv)
{
	struct bench b = { 0 };
	int r;

	bench_program = "dormant-bench";
	/* The kept bytes stand for weights a trainer changes every step: retain
	 * mode must copy them, not skip them as unchanged (the frozen case is
	 * dormant-verify-bench's). Set it to 1 to see the skip here. */
	setenv("DORMANT_SKIP_UNCHANGED", "0", 0);
	if (options_parse(argc, argv, &b.opt) < 0)
		return EXIT_USAGE;
	r = bench_run(&b);
	bench_finish(&b);
	if (r == EXIT_SKIP)
		return EXIT_SKIP;
	return r < 0 ? 1 : 0;
}
