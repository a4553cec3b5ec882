# SPDX-License-Identifier: MIT
"""A newcomer's install, from a clean clone (suite 'install').

The committed HEAD of this checkout is cloned; the README's install blocks run
in the clone as written, with only their folders changed: the C block into a
fresh prefix, the offline Python lines into a fresh venv. Then the clone is
moved away, and the installed dormantd, dormantctl and dormant-run, the
Python package and examples/hello.c run from the prefix and the venv alone:
no PYTHONPATH, DORMANT_LIB or LD_LIBRARY_PATH but what the README says to set.

Run by meson with SOURCE_ROOT and VERSION in the environment. What is not
committed is not tested here (it says so)."""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

import pytest

SOURCE_ROOT = pathlib.Path(os.environ.get("SOURCE_ROOT", pathlib.Path(__file__).parents[2]))
VERSION = os.environ.get("VERSION", "")
README = SOURCE_ROOT / "README.md"
BUILD_TIMEOUT_S = 900
RUN_TIMEOUT_S = 60
# the user's variables that would let an installed tool find things the
# install should provide on its own
SCRUBBED = ("DORMANT_LIB", "DORMANT_PRELOAD_LIB", "DORMANT_SHADOW_DIR", "PYTHONPATH",
            "LD_LIBRARY_PATH", "LD_PRELOAD", "PKG_CONFIG_PATH", "VIRTUAL_ENV", "DORMANT_TOKEN",
            "DORMANT_TOKEN_FILE")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED and not
           k.startswith(("MESON", "ASAN", "UBSAN"))}
    env["DORMANT_BACKEND"] = "host"
    env.update(extra)
    return env


def sh(script, cwd, env=None, timeout=RUN_TIMEOUT_S):
    p = subprocess.run(["sh", "-euc", script], cwd=cwd, env=env or clean_env(), text=True,
                       capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"$ {script}\nexit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def readme_block(heading_text):
    """The ```sh block that follows the paragraph starting with heading_text
    (e.g. '**C**') in README's Install section."""
    text = README.read_text()
    install = text[text.index("## Install\n"):text.index("\n## ", text.index("## Install\n") + 1)]
    start = install.index(heading_text)
    m = re.search(r"```sh\n(.*?)```", install[start:], re.S)
    assert m, f"no ```sh block after {heading_text!r} in README's Install"
    return m.group(1)


class Installed:
    """The clone, built and installed into a prefix and a venv, then moved."""

    def __init__(self, root):
        self.root = root
        self.clone = root / "clone"
        self.prefix = root / "prefix"
        self.venv = root / "venv"
        self.pip_log = ""
        self.c_log = ""


@pytest.fixture(scope="module")
def installed():
    if shutil.which("git") is None or not (SOURCE_ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to clone")
    root = pathlib.Path(tempfile.mkdtemp(prefix="dormant-install-"))
    try:
        inst = Installed(root)
        head = sh("git rev-parse --short HEAD", SOURCE_ROOT).strip()
        if sh("git status --porcelain --untracked-files=no", SOURCE_ROOT).strip():
            print(f"note: testing the commit {head}; the checkout's uncommitted changes are "
                  f"not in it")
        sh(f'git clone --quiet --no-hardlinks "{SOURCE_ROOT}" "{inst.clone}"', root)
        # the README's C block: only the prefix is ours
        c_block = readme_block("**C**")
        assert re.search(r"^prefix=\S+", c_block, re.M), c_block
        c_block = re.sub(r"^prefix=\S+", f'prefix="{inst.prefix}"', c_block, flags=re.M)
        # and hello's 1 GiB per tag made 1 MiB (the host backend copies it)
        c_block, n = re.subn(r"(build-install/hello)$", r"\1 1048576", c_block, flags=re.M)
        assert n == 1, c_block
        inst.c_log = sh(c_block, inst.clone, timeout=BUILD_TIMEOUT_S)
        # the README's offline Python lines: a venv of Debian's python3, our folder
        py_block = readme_block("**Python**")
        lines = [line.split("  #")[0].strip() for line in py_block.splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
        offline = [line for line in lines if "--no-build-isolation ." in line
                   and " -m venv " in line]
        assert len(offline) == 1, lines
        checks = [line for line in lines if line.startswith(".venv/bin/")
                  and " wheel " not in line]  # pip wheel would build once more
        script = "\n".join([offline[0]] + checks).replace(".venv", str(inst.venv))
        script = script.replace("pip install --no-build-isolation",
                                "pip install --no-index --no-cache-dir --no-build-isolation")
        inst.pip_log = sh(script, inst.clone, timeout=BUILD_TIMEOUT_S)
        # moved away: nothing installed may need the checkout
        moved = root / "moved-away"
        inst.clone.rename(moved)
        inst.clone = moved
        yield inst
    finally:
        shutil.rmtree(root, ignore_errors=True)


def site_packages(inst):
    out = sh(f'"{inst.venv}/bin/python" -c "import sysconfig; print(sysconfig.get_path(\'purelib\'))"',
             inst.root)
    return pathlib.Path(out.strip())


# ---- the prefix ------------------------------------------------------------

def test_readme_c_block_built_and_ran_hello(installed):
    assert f"dormant {VERSION}, host backend: slept and woke" in installed.c_log, installed.c_log
    # and again, the checkout gone: hello finds the installed library by the
    # README's rpath alone
    out = sh(f'"{installed.clone}/build-install/hello" 1048576', installed.root)
    assert out.startswith(f"dormant {VERSION}, host backend"), out


def test_prefix_programs_run_as_installed(installed):
    bindir = installed.prefix / "bin"
    for tool in ("dormantd", "dormantctl", "dormant-run"):
        out = sh(f'"{bindir / tool}" --version', installed.root)
        assert out == f"{tool} {VERSION}\n", (tool, out)
    dynamic = sh(f'readelf -d "{bindir}/dormantd"', installed.root)
    assert re.search(r"R(UN)?PATH.*\[\$ORIGIN/\.\./lib\]", dynamic), dynamic
    assert "libdormant.so.1" in dynamic


def test_prefix_refers_to_no_checkout(installed):
    """No installed text file (the launcher, the Python package) names the
    clone or this checkout."""
    for path in installed.prefix.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if b"\0" in data[:4096]:
                continue  # a binary: debug info may name its sources
            for checkout in (str(SOURCE_ROOT), str(installed.root / "clone")):
                assert checkout.encode() not in data, f"{path} names {checkout}"


def serve_and_drive(bindir, root):
    """The installed dormantd on a free port, slept and woken by the
    installed dormantctl."""
    port_file = root / "port"
    port_file.unlink(missing_ok=True)
    proc = subprocess.Popen([str(bindir / "dormantd"), "--listen", "127.0.0.1:0", "--port-file",
                             str(port_file), "--backend", "host", "--keep", "1MiB",
                             "--discard", "1MiB", "--quiet"], env=clean_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "dormantd did not write its port"
            time.sleep(0.05)
        port = int(port_file.read_text())
        for action in ("sleep", "wake"):
            out = sh(f'"{bindir}/dormantctl" {action} --json --port {port} 127.0.0.1', root)
            report = json.loads(out)
            assert all(r["ok"] for r in report["results"]), out
    finally:
        proc.terminate()
        proc.wait(timeout=RUN_TIMEOUT_S)


def test_prefix_dormantd_driven_by_dormantctl(installed):
    serve_and_drive(installed.prefix / "bin", installed.root)


PROBE = ("import os, sys, torch_memory_saver, dormant\n"
         "print(torch_memory_saver.__dormant__)\n"
         "print(os.path.realpath(dormant.__file__))\n"
         "print(os.path.realpath(dormant.library_path()))\n")


def test_prefix_dormant_run_switches_in_the_installed_package(installed):
    out = sh(f'"{installed.prefix}/bin/dormant-run" --torch-memory-saver -- '
             f'/usr/bin/python3 -c "$PROBE"', installed.root, clean_env(PROBE=PROBE))
    flag, package, library = out.split()
    prefix = str(installed.prefix.resolve())
    assert flag == "True"
    assert package.startswith(prefix + "/lib/python3/dist-packages/dormant/"), package
    assert library.startswith(prefix + "/lib/libdormant.so"), library


def test_prefix_dormant_run_captures_with_the_installed_shim(installed):
    probe = ("from dormant import _library, preload\n"
             "print(_library.preloaded_path())\n")
    out = sh(f'"{installed.prefix}/bin/dormant-run" --capture --torch-memory-saver -- '
             f'/usr/bin/python3 -c "$PROBE"', installed.root, clean_env(PROBE=probe))
    lib = str(installed.prefix.resolve() / "lib")
    assert out.strip() == f"{lib}/libdormant.so.1" or out.strip().startswith(f"{lib}/"), out


def test_prefix_dormant_run_refuses_as_the_module_does(installed):
    env = clean_env(PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    p = subprocess.run([str(installed.prefix / "bin" / "dormant-run"), "--capture", "--", "true"],
                       env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert p.returncode == 2 and p.stderr.startswith("dormant-run: refusing to capture"), p


# ---- the venv ----------------------------------------------------------------

def test_wheel_is_any_python3_of_its_platform(installed):
    m = re.search(r"filename=(dormant-[^ ]+\.whl)", installed.pip_log)
    assert m, installed.pip_log[-3000:]
    assert re.fullmatch(rf"dormant-{re.escape(VERSION)}-py3-none-linux_\w+\.whl", m.group(1)), \
        m.group(1)


def test_venv_programs_on_path(installed):
    bindir = installed.venv / "bin"
    for tool in ("dormantd", "dormantctl", "dormant-run"):
        out = sh(f'"{bindir / tool}" --version', installed.root)
        assert out == f"{tool} {VERSION}\n", (tool, out)
    out = sh(f'"{bindir}/python" -m dormant.run --version', installed.root)
    assert out == f"dormant-run {VERSION}\n"
    serve_and_drive(bindir, installed.root)


def test_venv_package(installed):
    site = site_packages(installed)
    here = str((site / "dormant").resolve())
    out = sh(f'"{installed.venv}/bin/python" -c "$PROBE"', installed.root,
             clean_env(PROBE="import sys, dormant\n"
                             "assert 'torch' not in sys.modules\n"
                             "m = dormant.Manager(backend='host')\n"
                             "print(dormant.__version__, m.stats()['backend'])\n"
                             "print(dormant.library_path())\n"
                             "print(dormant.preload.library_path())\n"))
    version, backend, lib, shim = out.split()
    assert (version, backend) == (VERSION, "host")
    assert os.path.dirname(os.path.realpath(lib)) == here, lib
    assert os.path.dirname(shim) == here, shim
    assert (site / "dormant" / "py.typed").is_file()
    dist = site / f"dormant-{VERSION}.dist-info"
    assert "MIT License" in (dist / "LICENSE").read_text()
    metadata = (dist / "METADATA").read_text()
    for field in ("Project-URL: Homepage, https://", "Classifier: License :: OSI Approved",
                  "Provides-Extra: torch", "Author: ", "Requires-Python: >=3.9"):
        assert field in metadata, field
    assert "dormant-run = dormant.run:main" in (dist / "entry_points.txt").read_text()


def test_venv_dormant_run_switches_in_the_venv_package(installed):
    out = sh(f'"{installed.venv}/bin/dormant-run" --torch-memory-saver -- '
             f'"{installed.venv}/bin/python" -c "$PROBE"', installed.root, clean_env(PROBE=PROBE))
    flag, package, library = out.split()
    here = str((site_packages(installed) / "dormant").resolve())
    assert flag == "True" and package.startswith(here + "/"), out
    assert os.path.dirname(library) == here, library
