# SPDX-License-Identifier: MIT
""".ci/count.py: the closing line of .ci/run counts passes, failures and skips
from meson's testlog.json, through TAP (Criterion), pytest's summary and
meson's own results."""
import json
import pathlib
import subprocess
import sys

COUNT = pathlib.Path(__file__).resolve().parents[2] / ".ci" / "count.py"

CRITERION = """TAP version 13
1..4
# Criterion v2.4.1
ok - a::skipped  # SKIP no IPv6 loopback here
ok - a::fine  (0.00s)
ok - a::also_fine  (0.01s)
not ok - a::bad  (0.00s)
"""
PYTEST = ("test_x.py::test_a PASSED\ntest_x.py::test_b SKIPPED (needs torch)\n"
          "=================== 7 passed, 2 skipped, 1 failed in 3.21s ===================\n")


def run(tmp_path, *tests, missing=False):
    log = tmp_path / "testlog.json"
    log.write_text("".join(json.dumps(t) + "\n" for t in tests))
    paths = [str(log)] + ([str(tmp_path / "absent.json")] if missing else [])
    r = subprocess.run([sys.executable, str(COUNT), *paths], capture_output=True, text=True,
                       check=True)
    return r.stdout.strip()


def test_criterion_tap_skips_are_skips(tmp_path):
    assert run(tmp_path, {"result": "FAIL", "stdout": CRITERION}) == \
        "2 passed, 1 failed, 1 skipped"


def test_pytest_summary_skips_are_counted(tmp_path):
    assert run(tmp_path, {"result": "FAIL", "stdout": PYTEST}) == "7 passed, 1 failed, 2 skipped"


def test_meson_skip_is_one_skip_not_a_failure(tmp_path):
    assert run(tmp_path, {"result": "SKIP", "stdout": "no GPU\n"},
               {"result": "OK", "stdout": "fine\n"}) == "1 passed, 0 failed, 1 skipped"


def test_a_crash_and_a_missing_log_are_failures(tmp_path):
    assert run(tmp_path, {"result": "FAIL", "stdout": "ok - a::fine\n"}, missing=True) == \
        "1 passed, 2 failed, 0 skipped"


def test_everything_adds_up(tmp_path):
    assert run(tmp_path, {"result": "FAIL", "stdout": CRITERION},
               {"result": "FAIL", "stdout": PYTEST},
               {"result": "SKIP", "stdout": ""},
               {"result": "TIMEOUT", "stdout": ""}) == "9 passed, 3 failed, 4 skipped"
