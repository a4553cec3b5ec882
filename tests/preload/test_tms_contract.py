# SPDX-License-Identifier: MIT
"""torch_memory_saver's contract on dormant's drop-in, on the host backend
(issue 32): tms_contract.py, a torch_memory_saver program over a model of
PyTorch's caching allocator (fake_torch/), run as a user starts one:

  - configure_subprocess: a parent under `dormant-run --torch-memory-saver`
    starts it inside `configure_subprocess()` (hook mode preload, and torch);
  - tms_name: libdormant-preload.so in LD_PRELOAD under torch_memory_saver's
    file name, as slime's and AReaL's launchers put it there.

Each check of the program is a test of its own here. Whole-process capture
(dormant's DORMANT_PRELOAD=1 without TMS_INIT_ENABLE, as dormant-run
--capture sets; or torch_memory_saver's name with TMS_INIT_ENABLE=1, as
slime's and AReaL's launchers set) manages memory outside regions too, under
tag "default": there an allocation outside every region while it is paused
gets ordinary memory instead of failing (test_whole_process)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
SHIM = os.environ["DORMANT_TEST_PRELOAD_LIB"]
FAKE_CUDART = os.environ["DORMANT_TEST_FAKE_CUDART"]
RUN = os.environ["DORMANT_TEST_RUN"]
SHADOW = pathlib.Path(SHIM).parent / "tms-shadow"
TMS_NAMED = SHADOW / "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
PROGRAM = HERE / "tms_contract.py"
FAKE_TORCH = HERE / "fake_torch"
TIMEOUT_S = 120

pytestmark = pytest.mark.skipif(
    "libasan" in os.environ.get("LD_PRELOAD", ""),
    reason="an uninstrumented Python with an instrumented libdormant preloaded hangs at start-up")

# the checks every launch runs (tms_contract.py), in its order
CHECKS = [
    "hook_mode",
    "weights_in_a_cpu_backup_region_are_managed",
    "grads_in_a_no_backup_region_are_managed",
    "deepep_buffer_is_ordinary_memory",
    "outside_regions_after_interesting_region_on_is_ordinary",
    "pause_succeeds",
    "every_tag_paused",
    "allocation_outside_regions_while_paused_succeeds",
    "allocation_outside_regions_while_paused_is_usable",
    "allocation_outside_regions_while_paused_is_not_managed",
    "cached_block_outside_regions_serves_while_paused",
    "deepep_buffer_intact_while_paused",
    "disable_while_paused_reads_the_host_copy_into_ordinary_memory",
    "resume_succeeds",
    "every_tag_awake_after_resume",
    "regions_keep_their_addresses",
    "weights_intact_after_resume",
    "grads_zero_after_resume",
    "deepep_buffer_intact_after_resume",
    "ordinary_allocations_never_land_in_a_managed_range",
]

PARENT = r"""
import subprocess, sys
import torch_memory_saver
assert torch_memory_saver.__dormant__
from torch_memory_saver import configure_subprocess
with configure_subprocess():
    sys.exit(subprocess.run([sys.executable] + sys.argv[1:]).returncode)
"""


def base_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DORMANT_PRELOAD", "DORMANT_LISTEN", "DORMANT_PORT_FILE",
                                "TMS_", "PYTORCH_"))}
    env.update(DORMANT_BACKEND="host", DORMANT_HOST_DEVICE_BYTES=str(256 << 20),
               DORMANT_TEST_FAKE_CUDART=FAKE_CUDART, DORMANT_PRELOAD_LIB=SHIM,
               DORMANT_PRELOAD_QUIET="1")
    return env


def launch(how, hook_mode):
    """Run the program as `how` starts it; (process, results dict or None)."""
    env = base_env()
    python_path = [str(FAKE_TORCH)]
    if how == "configure_subprocess":
        env["PYTHONPATH"] = os.pathsep.join(python_path)
        cmd = [RUN, "--torch-memory-saver", "--", sys.executable, "-c", PARENT,
               str(PROGRAM), hook_mode]
    else:
        env["PYTHONPATH"] = os.pathsep.join(python_path + [str(SHADOW), str(REPO / "python")])
        library = str(TMS_NAMED) if how.startswith("tms_") else SHIM
        env["LD_PRELOAD"] = " ".join(filter(None, [os.environ.get("LD_PRELOAD", ""), library]))
        if how == "capture":
            env["DORMANT_PRELOAD"] = "1"
        if how == "tms_init_enable":
            env.update(TMS_INIT_ENABLE="1", TMS_INIT_ENABLE_CPU_BACKUP="1")
        cmd = [sys.executable, str(PROGRAM), hook_mode]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    found = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    return proc, json.loads(found[-1][len("RESULTS "):]) if found else None


_runs = {}


def results(how, hook_mode):
    key = (how, hook_mode)
    if key not in _runs:
        _runs[key] = launch(how, hook_mode)
    return _runs[key]


LAUNCHES = [("configure_subprocess", "preload"), ("configure_subprocess", "torch"),
            ("tms_name", "preload")]


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("how,hook_mode", LAUNCHES, ids=[f"{h}-{m}" for h, m in LAUNCHES])
def test_contract(how, hook_mode, check):
    proc, found = results(how, hook_mode)
    assert found is not None, \
        f"no results: rc {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert check in found, f"{check} did not run: {sorted(found)}"
    passed, detail = found[check]
    assert passed, f"{check}: {detail}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, proc.stderr


WHOLE_PROCESS_CHECKS = [
    "hook_mode",
    "outside_regions_is_managed_under_tag_default",
    "deepep_buffer_is_ordinary_memory",
    "pause_succeeds",
    "every_tag_paused",
    "allocation_outside_regions_while_paused_succeeds",
    "allocation_outside_regions_while_paused_is_usable",
    "deepep_buffer_intact_while_paused",
    "resume_succeeds",
    "weights_intact_after_resume",
    "outside_regions_intact_after_resume",
    "allocation_made_while_paused_still_ordinary_after_resume",
]


@pytest.mark.parametrize("check", WHOLE_PROCESS_CHECKS)
@pytest.mark.parametrize("how", ["capture", "tms_init_enable"])
def test_whole_process(how, check):
    proc, found = results(how, "whole_process")
    assert found is not None, \
        f"no results: rc {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert check in found, f"{check} did not run: {sorted(found)}"
    passed, detail = found[check]
    assert passed, f"{check}: {detail}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, proc.stderr


def test_every_check_is_listed():
    proc, found = results("configure_subprocess", "preload")
    assert found is not None, proc.stderr
    assert sorted(found) == sorted(CHECKS)
    proc, found = results("capture", "whole_process")
    assert found is not None, proc.stderr
    assert sorted(found) == sorted(WHOLE_PROCESS_CHECKS)
