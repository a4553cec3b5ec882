/* SPDX-License-Identifier: MIT */
/* Backend selection: the top of the backends' room, above each backend. */
#include "backend.h"

#include <errno.h>
#include <string.h>

int backend_new(const struct backend_config *config, struct backend **ret)
{
	const char *name = config->name ? config->name : "auto";
	int r;

	if (strcmp(name, "host") == 0)
		return backend_host_new(config, ret);
	if (strcmp(name, "cuda") == 0)
		return backend_cuda_new(config, ret);
	if (strcmp(name, "auto") != 0)
		return error_set(-EINVAL, "unknown backend '%s' (use auto, cuda or host)", name);

	r = backend_cuda_new(config, ret);
	if (r == 0)
		return 0;
	log_write(&config->log, DORMANT_LOG_INFO, "no usable CUDA device (%s); using the host backend",
		  dormant_last_error());
	return backend_host_new(config, ret);
}
