/* SPDX-License-Identifier: MIT */
#include "dormant.h"

#ifndef DORMANT_VERSION
#error "DORMANT_VERSION (the Meson project version) must be defined by the build"
#endif

DORMANT_EXPORT const char *dormant_version(void)
{
	return DORMANT_VERSION;
}
