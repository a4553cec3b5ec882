# SPDX-License-Identifier: MIT
"""GPU tests: a Megatron-style trainer (examples/megatron_style.py) on a real
GPU, with torch.

Run directly they skip when torch or CUDA is missing. With
DORMANT_GPU_REQUIRED=1 (as the meson 'gpu' suite runs them) they fail
instead: on the GPU machine a missing torch is an error, not a pass.

Each test prints one "PASS ..." / "FAIL ..." line with what it checked, in a
"dormant GPU results" section at the end of pytest's report, followed by the
numbers it measured.
"""
import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "examples"))

# cuBLAS is deterministic only with a fixed workspace: set before CUDA starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

REQUIRED = os.environ.get("DORMANT_GPU_REQUIRED") == "1"


def why_not_runnable():
    try:
        import torch
    except ImportError as e:
        return f"torch is not importable ({e}); set DORMANT_PYTHON to a Python that has it"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    return None


def pytest_sessionstart(session):
    reason = why_not_runnable()
    if reason and REQUIRED:
        pytest.exit(f"FAIL: the GPU tests cannot run here: {reason}", returncode=1)


def pytest_collection_modifyitems(config, items):
    reason = why_not_runnable()
    if reason:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))


_results = []


@pytest.fixture
def note(request):
    """note(text): a measured number, printed under the test's PASS/FAIL line."""
    def add(text):
        request.node.user_properties.append(("note", str(text)))
    return add


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" or (rep.when == "setup" and not rep.passed):
        doc = (getattr(item, "function", None) and item.function.__doc__) or item.name
        label = doc.strip().splitlines()[0]
        callspec = getattr(item, "callspec", None)
        if callspec is not None:   # one test per parameter: say which
            label += f" [{callspec.id}]"
        status = "PASS" if rep.passed else "SKIP" if rep.skipped else "FAIL"
        notes = [v for k, v in item.user_properties if k == "note"]
        why = ""
        if rep.failed and call.excinfo is not None:
            why = f": {call.excinfo.typename}: {str(call.excinfo.value).splitlines()[0][:300]}"
        elif rep.skipped and call.excinfo is not None:
            why = f": {call.excinfo.value}"
        _results.append((f"{status} {label}{why}", notes))


def pytest_terminal_summary(terminalreporter):
    if not _results:
        return
    terminalreporter.section("dormant GPU results")
    for line, notes in _results:
        terminalreporter.write_line(line)
        for n in notes:
            terminalreporter.write_line(f"     {n}")
