/* SPDX-License-Identifier: MIT */
#include "wakecopy.h"

#include <stdio.h>
#include <string.h>

#include "util.h"

bool wake_copy_choose(double engine_gbps, double kernel_gbps)
{
	if (!(kernel_gbps > 0))
		return false;
	if (!(engine_gbps > 0))
		return true; /* the copy engines measured nothing: they are stuck */
	return kernel_gbps > engine_gbps * WAKE_COPY_KERNEL_MARGIN;
}

static void probe_begin(struct wake_copy *wc, enum wake_copy_phase phase)
{
	wc->phase = phase;
	wc->kernel = phase == WAKE_COPY_PROBE_KERNEL;
	wc->probe_left = wc->probe_size;
	wc->probe_bytes = 0;
	wc->probe_s = 0;
	wc->segment_start = 0;
}

void wake_copy_start(struct wake_copy *wc, enum wake_copy_mode mode, bool kernel_ok,
		     uint64_t probe_size, uint64_t reprobe_size, double kernel_gbps)
{
	memset(wc, 0, sizeof(*wc));
	wc->probe_size = MAX(probe_size, (uint64_t)1);
	wc->reprobe_size = reprobe_size;
	wc->mode = kernel_ok ? mode : WAKE_COPY_ENGINE;
	wc->phase = WAKE_COPY_RUN;
	wc->kernel = wc->mode == WAKE_COPY_KERNEL;
	if (wc->mode == WAKE_COPY_AUTO) {
		wc->kernel_gbps = kernel_gbps > 0 ? kernel_gbps : 0; /* known: not timed again */
		probe_begin(wc, WAKE_COPY_PROBE_ENGINE);
	}
}

void wake_copy_count(struct wake_copy *wc, uint64_t size)
{
	if (wc->kernel)
		wc->bytes_kernel += size;
	else
		wc->bytes_engine += size;
	if (wake_copy_probing(wc)) {
		wc->probe_left -= MIN(size, wc->probe_left);
		wc->probe_bytes += size;
		return;
	}
	if (wc->mode != WAKE_COPY_AUTO || !wc->kernel)
		return;
	/* the kernel was chosen: is the scrub over yet? */
	wc->since_choice += size;
	if (wc->since_choice >= wc->reprobe_after)
		probe_begin(wc, WAKE_COPY_PROBE_ENGINE);
}

void wake_copy_segment_open(struct wake_copy *wc, double now_s)
{
	/* never 0: 0 means no segment open */
	wc->segment_start = now_s > 0 ? now_s : 1e-9;
}

static void decide(struct wake_copy *wc)
{
	bool kernel = wake_copy_choose(wc->engine_gbps, wc->kernel_gbps);

	if (wc->decided && kernel != wc->choice)
		wc->switched = true;
	wc->decided = true;
	wc->choice = kernel;
	wc->kernel = kernel;
	wc->phase = WAKE_COPY_RUN;
	wc->since_choice = 0;
	if (kernel) /* soon at first, less often while the kernel stays */
		wc->reprobe_after = wc->reprobe_after
					    ? MIN(wc->reprobe_after * 2, wc->reprobe_size)
					    : MIN(wc->reprobe_size,
						  WAKE_COPY_FIRST_REPROBE * wc->probe_size);
}

void wake_copy_segment_close(struct wake_copy *wc, double now_s, double gbps_override)
{
	double gbps;

	if (!wake_copy_probing(wc) || wc->segment_start == 0)
		return;
	wc->probe_s += now_s - wc->segment_start;
	wc->segment_start = 0;
	if (wc->probe_left > 0)
		return; /* the probe goes on in the next chunk */
	gbps = gbps_override > 0 ? gbps_override
				 : (double)wc->probe_bytes / MAX(wc->probe_s, 1e-9) / 1e9;
	wc->probes++;
	if (wc->phase == WAKE_COPY_PROBE_ENGINE) {
		wc->engine_gbps = gbps;
		/* the kernel's rate holds through a scrub: measured once */
		if (wc->kernel_gbps > 0)
			decide(wc);
		else
			probe_begin(wc, WAKE_COPY_PROBE_KERNEL);
	} else {
		wc->kernel_gbps = gbps;
		decide(wc);
	}
}

void wake_copy_report(const struct wake_copy *wc, struct dormant_wake_copy *ret)
{
	const char *method;

	memset(ret, 0, sizeof(*ret));
	if (wc->bytes_engine + wc->bytes_kernel == 0)
		return;
	if (wc->mode != WAKE_COPY_AUTO)
		method = wc->mode == WAKE_COPY_KERNEL ? "kernel" : "engine";
	else if (wc->switched || (!wc->decided && wc->bytes_kernel))
		method = "mixed";
	else if (!wc->decided)
		method = "engine";
	else
		method = wc->choice ? "kernel" : "engine";
	snprintf(ret->method, sizeof(ret->method), "%s", method);
	ret->bytes_engine = wc->bytes_engine;
	ret->bytes_kernel = wc->bytes_kernel;
	ret->probes = wc->probes;
	ret->engine_gbps = wc->engine_gbps;
	ret->kernel_gbps = wc->kernel_gbps;
}

void wake_copy_report_add(struct dormant_wake_copy *dst, const struct dormant_wake_copy *src)
{
	if (!src->method[0])
		return;
	if (!dst->method[0])
		snprintf(dst->method, sizeof(dst->method), "%s", src->method);
	else if (strcmp(dst->method, src->method) != 0)
		snprintf(dst->method, sizeof(dst->method), "mixed");
	dst->bytes_engine += src->bytes_engine;
	dst->bytes_kernel += src->bytes_kernel;
	dst->probes += src->probes;
	dst->engine_gbps = MAX(dst->engine_gbps, src->engine_gbps);
	dst->kernel_gbps = MAX(dst->kernel_gbps, src->kernel_gbps);
}
