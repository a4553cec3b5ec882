# SPDX-License-Identifier: MIT
"""The examples: rl_loop.py's orchestration runs end to end on the simulated
trainer (no torch); the torch examples at least compile."""
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


def test_examples_compile(tmp_path):
    for name in ("megatron_style.py", "rl_loop.py"):
        py_compile.compile(str(EXAMPLES / name), cfile=str(tmp_path / (name + "c")),
                           doraise=True)
