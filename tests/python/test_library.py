# SPDX-License-Identifier: MIT
"""Loading: no torch at import, where libdormant is looked for, and what the
error says when it is nowhere."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, env_without_lib

import dormant


def run_python(code, env, cwd=None):
    env.setdefault("PYTHONPATH", str(REPO / "python"))
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def copy_package(tmp_path):
    """The package alone in a folder of its own: no build folder two levels up."""
    dest = tmp_path / "site"
    shutil.copytree(REPO / "python" / "dormant", dest / "dormant",
                    ignore=shutil.ignore_patterns("__pycache__", "_paths.py", "*.so*"))
    return dest


def test_import_does_not_import_torch():
    code = ("import sys, dormant\n"
            "assert 'torch' not in sys.modules, 'importing dormant imported torch'\n"
            "m = dormant.Manager(backend='host')\n"
            "m.stats() if m._lib.has('dormant_stats_json') else None\n"
            "assert 'torch' not in sys.modules, 'using dormant imported torch'\n"
            "print('ok')\n")
    r = run_python(code, dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_import_works_without_the_library():
    env = dict(os.environ, DORMANT_LIB="/nonexistent/libdormant.so")
    r = run_python("import dormant; print(dormant.__version__)", env)
    assert r.returncode == 0, r.stderr


def test_dormant_lib_not_found_names_it():
    env = dict(os.environ, DORMANT_LIB="/nonexistent/libdormant.so")
    code = ("import dormant\n"
            "try:\n"
            "    dormant.Manager(backend='host')\n"
            "except dormant.LibraryNotFoundError as e:\n"
            "    print(e)\n"
            "else:\n"
            "    raise SystemExit('loaded a library that does not exist')\n")
    r = run_python(code, env)
    assert r.returncode == 0, r.stderr
    assert "$DORMANT_LIB" in r.stdout
    assert "/nonexistent/libdormant.so: no such file" in r.stdout
    # DORMANT_LIB set: nothing else is tried.
    assert "system loader" not in r.stdout


def test_not_found_lists_every_place(tmp_path):
    site = copy_package(tmp_path)
    env = env_without_lib()
    env["PYTHONPATH"] = str(site)
    # (In this process the library is loaded already, so the loader would
    # find it by its soname: ask a fresh process.)
    probe = run_python("import ctypes; ctypes.CDLL('libdormant.so.1')", env, cwd=tmp_path)
    if probe.returncode == 0:
        pytest.skip("libdormant is installed system-wide: the loader finds it")
    code = ("import dormant\n"
            "try:\n"
            "    dormant.Manager(backend='host')\n"
            "except dormant.LibraryNotFoundError as e:\n"
            "    print(e)\n"
            "else:\n"
            "    raise SystemExit('found a library')\n")
    r = run_python(code, env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "beside the package: " + str(site / "dormant" / "libdormant.so") in out
    assert "the meson build folder: " in out
    assert "the system loader: libdormant.so.1" in out
    assert "the system loader: libdormant.so:" in out
    assert "DORMANT_LIB" in out  # the advice


def test_found_beside_the_package(tmp_path):
    site = copy_package(tmp_path)
    shutil.copy(dormant.library_path(), site / "dormant" / "libdormant.so")
    env = env_without_lib()
    env["PYTHONPATH"] = str(site)
    code = ("import dormant, os\n"
            "m = dormant.Manager(backend='host')\n"
            "print(m.library_path)\n")
    r = run_python(code, env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == os.path.realpath(site / "dormant" / "libdormant.so")


def test_library_path_is_the_loaded_file():
    assert os.path.realpath(os.environ["DORMANT_LIB"]) == dormant.library_path()


def test_not_a_library(tmp_path):
    bogus = tmp_path / "libdormant.so"
    bogus.write_text("not an ELF file")
    env = dict(os.environ, DORMANT_LIB=str(bogus))
    code = ("import dormant\n"
            "try:\n"
            "    dormant.Manager(backend='host')\n"
            "except dormant.LibraryNotFoundError as e:\n"
            "    print(e)\n")
    r = run_python(code, env)
    assert r.returncode == 0, r.stderr
    assert str(bogus) in r.stdout


def test_version_is_the_meson_project_version():
    # one place: meson.build's project version, through dormant_version() in
    # a source tree (no _version.py there) and _version.py once built
    import re
    want = re.search(r"version: '([^']+)'", (REPO / "meson.build").read_text()).group(1)
    r = run_python("import sys, dormant\n"
                   "v = dormant.__version__\n"
                   "assert 'torch' not in sys.modules\n"
                   "print(v, dormant.Manager(backend='host')._lib.dormant_version().decode())\n",
                   dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [want, want]
