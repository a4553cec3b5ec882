/* SPDX-License-Identifier: MIT */
/*
 * dormantctl's output: a summary table for people, JSON for programs, and
 * one line per failed endpoint on stderr for both.
 */
#ifndef DORMANTCTL_REPORT_H
#define DORMANTCTL_REPORT_H

#include <stdio.h>

#include "endpoint.h"
#include "outcome.h"

/* "16.0 MiB", "512 B", "-" for a negative count. */
void ctl_format_bytes(int64_t bytes, char *buf, size_t size);

/* Write the table: ENDPOINT STATE BYTES DURATION ERROR, then a count line. */
void ctl_report_table(FILE *out, enum ctl_command command, const struct ctl_endpoints *endpoints,
		      const struct ctl_result *results);

/* Write one JSON document (see docs/operations.md). tags may be NULL (all).
 * Returns 0 or -ENOMEM. */
int ctl_report_json(FILE *out, enum ctl_command command, const char *const *tags,
		    const struct ctl_endpoints *endpoints, const struct ctl_result *results);

/* "dormantctl: NAME: ERROR" on err for each failed endpoint. */
void ctl_report_failures(FILE *err, const struct ctl_endpoints *endpoints,
			 const struct ctl_result *results);

#endif
