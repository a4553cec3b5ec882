# SPDX-License-Identifier: MIT
"""The examples: rl_loop.py's orchestration and ray_driver.py's many-rank
driver run end to end on the simulated trainer (no torch); the torch examples
at least compile."""
import os
import py_compile
import subprocess
import sys

from conftest import REPO

EXAMPLES = REPO / "examples"


def test_rl_loop_simulated():
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    r = subprocess.run([sys.executable, str(EXAMPLES / "rl_loop.py"), "--simulate",
                        "--cycles", "3", "--steps-per-phase", "2", "--rollout-s", "0.05"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert out.count("rollout phase: /sleep took") == 3
    assert out.count("/wake took") == 3
    assert "done: 3 rollout/train cycles" in out
    # The simulated trainer checks its kept weights after every wake; a loss
    # would have failed the run above.


def test_ray_driver_drives_many_ranks():
    # docs/orchestrators.md's example: three local processes stand in for actors
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"))
    r = subprocess.run([sys.executable, str(EXAMPLES / "ray_driver.py"), "--ranks", "3",
                        "--cycles", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert out.count("slept 3 ranks: 72.0 MiB") == 3, out
    assert out.count("woke 3 ranks: 72.0 MiB") == 3, out
    assert "states ['asleep']" in out and "states ['awake']" in out
    assert "RankError: sleep: 1 of 3 ranks failed" in out
    assert "1 failed, 2 asleep" in out and "[driver] done" in out


def test_examples_compile(tmp_path):
    for name in ("megatron_style.py", "rl_loop.py", "ray_driver.py"):
        py_compile.compile(str(EXAMPLES / name), cfile=str(tmp_path / (name + "c")),
                           doraise=True)
