# SPDX-License-Identifier: MIT
"""The gpu suite as `meson test -C build --suite gpu` runs it on one GPU.

Its tests share one device and several of them measure the device's free
memory around a sleep (core-cuda, disk-cuda, residue-cuda): run beside each
other they see each other's allocations and fail (seen on an H100,
2026-12-07). So every test of suite 'gpu' is declared is_parallel: false,
which makes meson run it alone, whatever --num-processes says."""
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]


def meson_test_calls(text):
    """Each test(...) call of a meson.build, its parentheses balanced."""
    for m in re.finditer(r"(?m)^\s*test\(", text):
        depth, i = 0, m.end() - 1
        while i < len(text):
            if text[i] == "(":
                depth += 1
            elif text[i] == ")":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        yield text[m.start():i + 1]


def gpu_tests():
    found = []
    for build in sorted(REPO.glob("tests/**/meson.build")):
        for call in meson_test_calls(build.read_text()):
            if re.search(r"suite:\s*'gpu'", call):
                name = re.match(r"\s*test\('([^']+)'", call).group(1)
                found.append((build.relative_to(REPO), name, call))
    return found


def test_the_gpu_suite_is_found():
    names = {name for _, name, _ in gpu_tests()}
    assert {"core-cuda", "disk-cuda", "residue-cuda", "python-gpu"} <= names, names


def test_every_gpu_test_runs_alone():
    shared = [f"{path}: {name}" for path, name, call in gpu_tests()
              if not re.search(r"is_parallel:\s*false", call)]
    assert not shared, "gpu tests without is_parallel: false: " + ", ".join(shared)
