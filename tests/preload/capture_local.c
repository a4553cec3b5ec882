/* SPDX-License-Identifier: MIT */
/*
 * The runtime opened RTLD_LOCAL, as Python opens PyTorch: this program links
 * no CUDA runtime; it dlopen()s faketorch (argv[1]), which brings the fake
 * runtime in its local scope. The shim's cudaMalloc still wins (it is in the
 * global scope), and it must find the runtime's cudaFree for a foreign
 * pointer even though dlsym(RTLD_NEXT) cannot see it.
 */
#include <dlfcn.h>
#include <stdio.h>

#include "dormant.h"
#include "fake_cudart.h"

int main(int argc, char **argv)
{
	void *h, *mine, *theirs;
	int (*tmalloc)(void **, size_t), (*tfree)(void *), (*foreign)(void **, size_t);
	uint64_t (*count)(enum fake_op);
	struct dormant_stats st;

	if (argc < 2 || !(h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL))) {
		printf("FAIL: dlopen: %s\n", dlerror());
		return 1;
	}
	*(void **)&tmalloc = dlsym(h, "faketorch_malloc");
	*(void **)&tfree = dlsym(h, "faketorch_free");
	*(void **)&foreign = dlsym(h, "fake_cuda_foreign_malloc");
	*(void **)&count = dlsym(h, "fake_cuda_count");
	if (!tmalloc || !tfree || !foreign || !count) {
		printf("FAIL: dlsym\n");
		return 1;
	}
	if (tmalloc(&mine, 1 << 20) != 0 || count(FAKE_MALLOC) != 0) {
		printf("FAIL: cudaMalloc from a local library was not captured\n");
		return 1;
	}
	if (!dormant_torch_get_manager() || dormant_stats_get(dormant_torch_get_manager(), &st) < 0 ||
	    st.allocations != 1) {
		printf("FAIL: no managed allocation\n");
		return 1;
	}
	if (foreign(&theirs, 4096) != 0 || tfree(theirs) != 0 || count(FAKE_FREE) != 1) {
		printf("FAIL: a foreign free did not reach the local runtime\n");
		return 1;
	}
	if (tfree(mine) != 0 || count(FAKE_FREE) != 1) {
		printf("FAIL: free of ours\n");
		return 1;
	}
	printf("PASS local\n");
	return 0;
}
