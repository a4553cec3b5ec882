# SPDX-License-Identifier: MIT
"""dormant.torch_memory_saver on a real GPU: each pattern torch_memory_saver
users have (tests/gpu/tms_program.py, a program written for
torch_memory_saver) runs in a process of its own, started with the one switch
(python3 -m dormant.run --torch-memory-saver), so that `import
torch_memory_saver` in it gets dormant. Whole-process capture runs under the
build's `dormant-run --capture --torch-memory-saver` (the LD_PRELOAD shim of
cudaMalloc/cudaFree); it skips, saying why, where the build has none."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")

HERE = pathlib.Path(__file__).resolve().parent
PYTHON_DIR = HERE.parents[1] / "python"
PROGRAM = HERE / "tms_program.py"


def capture_wrapper():
    """The build's dormant-run (beside the libdormant under test), which
    starts a program under whole-process capture; None when there is none."""
    lib = os.environ.get("DORMANT_LIB")
    if not lib:
        return None
    wrapper = pathlib.Path(lib).resolve().parent / "tools" / "dormant-run"
    return wrapper if wrapper.exists() else None


def run_program(scenario, note, capture=False, timeout=300):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PYTHON_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if capture:
        cmd = [str(capture_wrapper()), "--capture", "--torch-memory-saver"]
    else:
        cmd = [sys.executable, "-m", "dormant.run", "--torch-memory-saver"]
    cmd += ["--", sys.executable, str(PROGRAM), scenario]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    for line in r.stdout.splitlines():
        if line.startswith("NOTE "):
            note(line[5:])
    assert r.returncode == 0 and f"OK {scenario}" in r.stdout, \
        f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def test_one_tag(note):
    """tms: one tag, pause gives the memory back, resume at the same address"""
    run_program("one_tag", note)


def test_several_tags(note):
    """tms: several tags paused and resumed selectively"""
    run_program("several_tags", note)


def test_cpu_backup_bit_exact(note):
    """tms: enable_cpu_backup keeps every bit"""
    run_program("cpu_backup", note)


def test_nested_no_backup(note):
    """tms: nested no-backup region inside a backed-up tag, zeros after resume"""
    run_program("nested_no_backup", note)


def test_cuda_graph(note):
    """tms: cuda_graph() capture, pool released on pause, replay after resume"""
    run_program("cuda_graph", note)


def test_training_loop(note):
    """tms: training with Adam, pause/resume every step, bit-identical"""
    run_program("training", note)


def test_blocked_resume_retried(note):
    """tms: resume blocked by another process raises OutOfMemoryError, retry works"""
    run_program("blocked_resume", note)


def test_http_beside(note):
    """tms: dormant.serve() beside the module, tags by the program's names"""
    run_program("http", note)


def test_whole_process_capture(note):
    """tms: whole-process capture, an allocation outside every region released too"""
    if capture_wrapper() is None:
        pytest.skip("no tools/dormant-run beside $DORMANT_LIB (this build has no "
                    "whole-process capture, the LD_PRELOAD shim of cudaMalloc/cudaFree)")
    run_program("whole_process", note, capture=True)


def test_disable_while_paused_under_capture(note):
    """tms: training_engine pattern, a tensor made inside disable() while paused works"""
    if capture_wrapper() is None:
        pytest.skip("no tools/dormant-run beside $DORMANT_LIB")
    run_program("disable_while_paused", note, capture=True)


def test_weight_sync_under_capture(note):
    """tms: slime's weight update (disable + zero_copy backups + fresh buffers) and DeepEP"""
    if capture_wrapper() is None:
        pytest.skip("no tools/dormant-run beside $DORMANT_LIB")
    run_program("weight_sync", note, capture=True)


def test_weight_sync_torch_mode(note):
    """tms: slime's weight update in hook mode torch"""
    run_program("weight_sync", note)


# ---- torch_memory_saver's contract (issue 32): only regions are managed -------

CONTRACT = HERE / "tms_contract_program.py"
CONTRACT_PARENT = r"""
import subprocess, sys
import torch_memory_saver
assert torch_memory_saver.__dormant__
from torch_memory_saver import configure_subprocess
with configure_subprocess():
    sys.exit(subprocess.run([sys.executable] + sys.argv[1:]).returncode)
"""
CONTRACT_CHECKS = [
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
    "deepep_buffer_intact_while_paused",
    "disable_while_paused_reads_the_host_copy_into_ordinary_memory",
    "resume_succeeds",
    "every_tag_awake_after_resume",
    "weights_intact_after_resume",
    "grads_zero_after_resume",
    "deepep_buffer_intact_after_resume",
    "ordinary_allocations_never_land_in_a_managed_range",
]
_contract_runs = {}


def contract_results(hook_mode):
    """tms_contract_program.py in a child of configure_subprocess() under
    python3 -m dormant.run --torch-memory-saver, once per hook mode:
    (process, {check: [passed, detail]} or None)."""
    if hook_mode not in _contract_runs:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(PYTHON_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        for name in [k for k in env if k.startswith("TMS_") or k == "DORMANT_PRELOAD"]:
            del env[name]
        cmd = [sys.executable, "-m", "dormant.run", "--torch-memory-saver", "--",
               sys.executable, "-c", CONTRACT_PARENT, str(CONTRACT), hook_mode]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        found = [line for line in r.stdout.splitlines() if line.startswith("RESULTS ")]
        _contract_runs[hook_mode] = (r, json.loads(found[-1][8:]) if found else None)
    return _contract_runs[hook_mode]


@pytest.mark.parametrize("check", CONTRACT_CHECKS)
@pytest.mark.parametrize("hook_mode", ["preload", "torch"])
def test_contract_in_a_configure_subprocess_child(hook_mode, check):
    """tms: only regions managed; outside them ordinary memory that works while paused"""
    r, found = contract_results(hook_mode)
    assert found is not None, f"no results: exit {r.returncode}\n{r.stdout[-3000:]}\n" \
                              f"{r.stderr[-3000:]}"
    assert check in found, f"{check} did not run"
    passed, detail = found[check]
    assert passed, f"{hook_mode}: {check}: {detail}\n{r.stderr[-2000:]}"
