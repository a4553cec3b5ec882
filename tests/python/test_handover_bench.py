# SPDX-License-Identifier: MIT
"""bench/handover.py's driver on the host backend (issue 16): the phases run
over HTTP with the CPU stand-in for the rollout (the trainer's simulated
device made full while it "holds" the memory), the early wake gets its 503
and the retry succeeds, every kept byte is verified after every wake, and
the report has the transition's parts. Small sizes; nothing is timed."""
import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "handover.py"
SMALL = ["--backend", "host", "--kept-gb", "0.01", "--layers", "4", "--phases", "2",
         "--host-device-bytes", str(64 << 20)]


def run(tmp_path, *extra):
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, str(BENCH), "--out", str(out), *SMALL, *extra],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ))
    doc = json.loads((out / "handover.json").read_text())
    return p, doc


def failed(doc):
    return [c["check"] for c in doc["checks"] if not c["ok"]]


def test_handover_phases_on_the_host_backend(tmp_path):
    p, doc = run(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert failed(doc) == []
    assert [r["label"] for r in doc["results"]] == ["host-overlap1", "host-overlap0"]
    for r in doc["results"]:
        assert len(r["phases"]) == 2
        first = r["phases"][0]
        assert first["early_wake"]["status"] == 503
        assert first["wake_attempts"] > 1
        assert all(ph["verified"] for ph in r["phases"])
        for ph in r["phases"]:
            assert ph["wake_bytes"] == ph["sleep_bytes"] > 0
            assert ph["rollout"]["bytes"] == 64 << 20
            assert set(ph["wake_parts"]) >= {"map_s", "map_wait_s", "copy_s", "zero_wait_s"}
            assert ph["wake_parts"]["map_s"] > 0       # measured, not timed
            assert ph["sleep_parts"]["release_s"] > 0
    checks = [c["check"] for c in doc["checks"]]
    assert any("early wake answered 503" in c for c in checks)
    assert sum("every kept byte back" in c for c in checks) == 4
    assert "checks: " in (tmp_path / "out" / "handover.txt").read_text()


def test_a_changed_byte_fails_the_run(tmp_path):
    p, doc = run(tmp_path, "--overlap", "1", "--test-corrupt-step", "2")
    assert p.returncode == 1
    assert failed(doc) == ["host-overlap1 phase 1: every kept byte back, same addresses"]


def test_a_wake_that_is_not_refused_fails_the_run(tmp_path):
    """The rollout leaves room enough for the trainer: the early wake
    succeeds, which the benchmark must report as a failed check."""
    p, doc = run(tmp_path, "--overlap", "1", "--host-rollout-leave", str(48 << 20))
    assert p.returncode == 1
    assert "host-overlap1 phase 1: early wake answered 503" in failed(doc)
