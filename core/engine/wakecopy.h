/* SPDX-License-Identifier: MIT */
/*
 * What copies a wake's kept chunks to the device (option wake_copy): the copy
 * engines (cuMemcpy) or the copy kernel on the SMs (backend.h,
 * copy_to_device_kernel; kernels/copy.cu).
 *
 * Right after another process frees device memory the driver scrubs the
 * freed frames on the copy engines, and our copies share them: about half
 * the rate for a second. The kernel reads the pinned host copy over PCIe
 * with the SMs and keeps nearly the full rate; with the copy engines free it
 * is a little slower than they are. So wake_copy=auto measures: each
 * device's wake times its first wake_copy_probe_bytes (64 MiB) on the copy
 * engines, the next as many with the kernel (a device's first wake only:
 * later ones reuse that rate), and copies the rest with the faster (wake_copy_choose(): the kernel only when clearly faster). Having
 * chosen the kernel it times the copy engines again after 512 MiB of the
 * kernel, then after twice as much each time the kernel stays, up to every
 * wake_copy_reprobe_bytes (4 GiB), and goes back to them once the scrub is
 * over.
 *
 * A probe is timed on the host: the pipeline is drained before it starts
 * and when it ends (also at each chunk's end, so that waiting for the next
 * chunk's mapping is not counted), so it measures only the copies. On the
 * simulated device the backend supplies the rates (backend.h,
 * simulated_copy_gbps; $DORMANT_HOST_COPY_GBPS), so the tests drive the
 * decision without timing.
 */
#ifndef DORMANT_WAKECOPY_H
#define DORMANT_WAKECOPY_H

#include <stdbool.h>
#include <stdint.h>

#include "dormant.h"

/* The kernel must beat the copy engines by this factor to be chosen: both
 * copy at the same PCIe limit when the copy engines are free, so a small
 * difference is noise. */
#define WAKE_COPY_KERNEL_MARGIN 1.15
/* Once the kernel is chosen, the copy engines are timed again after this
 * many probes' bytes of the kernel (512 MiB by default), then after twice
 * as many each time the kernel stays, up to wake_copy_reprobe_bytes: our
 * own sleep's release makes the driver scrub too, and that scrub is over
 * within milliseconds (on the H200 a wake right after a sleep of 16 GiB
 * copied 4 GiB by the kernel before it looked again, 8 ms lost). */
#define WAKE_COPY_FIRST_REPROBE 8

enum wake_copy_mode {
	WAKE_COPY_AUTO,
	WAKE_COPY_ENGINE,
	WAKE_COPY_KERNEL,
};

enum wake_copy_phase {
	WAKE_COPY_RUN,          /* copying with the chosen method */
	WAKE_COPY_PROBE_ENGINE, /* timing the copy engines */
	WAKE_COPY_PROBE_KERNEL, /* timing the kernel */
};

/* One device's share of one wake. */
struct wake_copy {
	enum wake_copy_mode mode;
	uint64_t probe_size, reprobe_size; /* the options' bytes */
	bool kernel;  /* the method of the next direct piece */
	bool decided; /* auto: a choice was made (a later one may switch) */
	bool choice;  /* auto: the latest choice (true: the kernel) */
	bool switched; /* auto: a later choice differed from the first */
	enum wake_copy_phase phase;
	/* the probe under way: bytes it has left and has timed so far, seconds
	 * of its closed segments, the open segment's start (0: none open) */
	uint64_t probe_left, probe_bytes;
	double probe_s, segment_start;
	uint64_t since_choice; /* bytes copied by the kernel since the choice */
	uint64_t reprobe_after; /* since_choice that times the engines again */
	double engine_gbps, kernel_gbps;
	unsigned probes;
	uint64_t bytes_engine, bytes_kernel;
};

/* The decision of wake_copy=auto: true (the kernel) when the kernel's
 * measured rate beats the copy engines' by WAKE_COPY_KERNEL_MARGIN; a rate of
 * 0 or less means unmeasured (never the kernel). */
bool wake_copy_choose(double engine_gbps, double kernel_gbps);

/* Start a device's wake, probes of probe_size bytes, timing the copy
 * engines again after reprobe_size bytes of the kernel. kernel_ok: the
 * device can run the kernel (else every mode copies with the copy
 * engines). kernel_gbps: the kernel's rate an earlier wake of the device
 * measured (0: none); with it, auto times only the copy engines, since the
 * kernel's rate holds through a scrub and the probe costs a drained
 * pipeline (7 ms of an 8 GiB wake on the H200). */
void wake_copy_start(struct wake_copy *wc, enum wake_copy_mode mode, bool kernel_ok,
		     uint64_t probe_size, uint64_t reprobe_size, double kernel_gbps);

/* Whether a probe is under way (its pieces must be cut at probe_left and
 * timed: wake_copy_segment_*()). */
static inline bool wake_copy_probing(const struct wake_copy *wc)
{
	return wc->phase != WAKE_COPY_RUN;
}

/* Count a direct piece of size bytes queued with the current method; ends
 * the probe's bytes (the caller then closes the segment). */
void wake_copy_count(struct wake_copy *wc, uint64_t size);

/* A probe's segment opens (the pipeline empty) at now_s, and closes (the
 * pipeline drained again) at now_s; gbps_override > 0 replaces the measured
 * rate (the simulated device). Closing the probe's last segment makes the
 * decision. */
void wake_copy_segment_open(struct wake_copy *wc, double now_s);
void wake_copy_segment_close(struct wake_copy *wc, double now_s, double gbps_override);

/* The method as struct dormant_wake_copy names it ("": nothing copied). */
void wake_copy_report(const struct wake_copy *wc, struct dormant_wake_copy *ret);
/* Add a device's report to a wake's (devices that differ: "mixed"). */
void wake_copy_report_add(struct dormant_wake_copy *dst, const struct dormant_wake_copy *src);

#endif
