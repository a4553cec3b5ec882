# SPDX-License-Identifier: MIT
"""Whole-process capture on the GPU: a plain PyTorch trainer with AdamW (its
state made lazily, outside any region) started with `dormant-run --capture`,
slept and woken over HTTP after every step, trains bit-identically to a run
that never sleeps; sleep gives back nearly all of the process's GPU memory.
See tests/gpu/capture_driver.py and docs/capture.md."""
import subprocess

import capture_driver as drv


def test_p_capture_is_bit_identical_and_frees_the_process_memory(note):
    reference = drv.run(capture=True, sleep=False)
    slept = drv.run(capture=True, sleep=True)
    plain = drv.run(capture=False, sleep=False)
    assert reference["rc"] == 0 and slept["rc"] == 0 and plain["rc"] == 0
    assert slept["losses"] == reference["losses"]
    assert slept["digest"] == reference["digest"]
    note(f"losses {slept['losses']}")
    note(f"identical to an uncaptured run too: {plain['digest'] == slept['digest']}")
    for line in drv.summary(slept["cycles"]):
        note(line)
    first = slept["cycles"][0]
    # AdamW's state exists from the first step on, outside any region: it is
    # the manager's (default tag), and sleep releases it with the rest
    assert first["preload"]["active"] and first["preload"]["captured_allocations"] > 0
    assert first["released_mib"] == first["managed_mib"] > 0
    last = slept["cycles"][-1]
    if last["awake_pid_mib"] is not None:
        freed = last["awake_pid_mib"] - last["asleep_pid_mib"]
        note(f"freed {freed} of {last['awake_pid_mib']} MiB the process held "
             f"({100 * freed / last['awake_pid_mib']:.1f} %)")
        assert freed >= 0.9 * last["managed_mib"]


def test_q_regions_still_choose_the_tag_under_capture(note):
    reference = drv.run(capture=True, sleep=False, regions=True, steps=3)
    slept = drv.run(capture=True, sleep=True, regions=True, steps=3)
    assert slept["rc"] == 0 and slept["digest"] == reference["digest"]
    tags = slept["cycles"][0]["tags"]
    note(f"tags {tags}")
    assert tags.get("weights", 0) > 0 and tags.get("default", 0) > 0


def test_r_dormant_run_refuses_expandable_segments():
    proc = subprocess.run([drv.dormant_run_path(), "--capture", "--", "true"],
                          env={"PATH": "/usr/bin:/bin",
                               "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "expandable_segments" in proc.stderr
