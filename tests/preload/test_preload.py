# SPDX-License-Identifier: MIT
"""Whole-process capture on the host backend, with a fake CUDA runtime.

capture-test and capture-local call cudaMalloc/cudaFree (the fake runtime's
unless the shim takes them) and say PASS or FAIL; this file runs them under
libdormant-preload.so, through tools/dormant-run, and runs Python under the
shim to check that the package attaches to the shim's manager."""
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

import dormant  # noqa: E402
from dormant import preload  # noqa: E402
from dormant.client import Client  # noqa: E402

SHIM = os.environ["DORMANT_TEST_PRELOAD_LIB"]
CAPTURE = os.environ["DORMANT_TEST_CAPTURE"]
CAPTURE_LOCAL = os.environ["DORMANT_TEST_CAPTURE_LOCAL"]
FAKETORCH = os.environ["DORMANT_TEST_FAKETORCH"]
FAKE_CUDART = os.environ["DORMANT_TEST_FAKE_CUDART"]
RUN = os.environ["DORMANT_TEST_RUN"]
TIMEOUT_S = 60


def base_env(**extra):
    """The test's environment without any dormant variable a case did not ask
    for (the sanitizer runtimes in LD_PRELOAD stay, first)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DORMANT_PRELOAD", "DORMANT_LISTEN", "DORMANT_PORT_FILE",
                                "DORMANT_TOKEN", "PYTORCH_"))}
    env["DORMANT_BACKEND"] = "host"
    env["DORMANT_HOST_DEVICE_BYTES"] = str(256 << 20)
    env.update(extra)
    return env


def captured_env(**extra):
    env = base_env(**{"DORMANT_PRELOAD": "1", **extra})
    env["LD_PRELOAD"] = " ".join(filter(None, [os.environ.get("LD_PRELOAD", ""), SHIM]))
    return env


def run(args, env, **kwargs):
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                          **kwargs)


def assert_pass(proc, mode):
    assert proc.returncode == 0 and f"PASS {mode}" in proc.stdout, \
        f"rc {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"


# ---- the shim under LD_PRELOAD ----------------------------------------------

@pytest.mark.parametrize("mode", ["basic", "foreign", "tags", "errors", "passthrough", "fork",
                                  "threads"])
def test_captured(mode):
    assert_pass(run([CAPTURE, mode], captured_env()), mode)


def test_allocating_while_asleep_gets_ordinary_memory_outside_regions():
    # whole-process capture: a cudaMalloc outside every region while its tag
    # sleeps is the runtime's ordinary memory (said once on stderr); inside a
    # region it is refused (capture_test.c, mode_asleep)
    proc = run([CAPTURE, "asleep"], captured_env())
    assert_pass(proc, "asleep")
    lines = [line for line in proc.stderr.splitlines() if "outside every region" in line]
    assert len(lines) == 1 and "tag 'default' is not awake" in lines[0] \
        and "ordinary device memory" in lines[0], proc.stderr


def test_without_the_shim_the_program_fails_its_checks():
    # the checks can fail: the same program on the bare fake runtime
    proc = run([CAPTURE, "basic"], base_env())
    assert proc.returncode == 1 and "FAIL" in proc.stdout


def test_off_without_the_switch():
    env = captured_env()
    del env["DORMANT_PRELOAD"]
    assert_pass(run([CAPTURE, "off"], env), "off")
    assert_pass(run([CAPTURE, "off"], captured_env(DORMANT_PRELOAD="0")), "off")


def test_runtime_opened_rtld_local():
    assert_pass(run([CAPTURE_LOCAL, FAKETORCH], captured_env()), "local")


@pytest.mark.parametrize("variable,value,reason", [
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", "expandable_segments"),
    ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64, expandable_segments : true",
     "expandable_segments"),
    ("PYTORCH_ALLOC_CONF", "expandable_segments:True", "PYTORCH_ALLOC_CONF"),
    ("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync", "cudaMallocAsync"),
    ("DORMANT_BACKEND", "bogus", "creating the dormant manager"),
    ("DORMANT_LISTEN", "256.1.1.1:99999", "serving on"),
])
def test_refused(variable, value, reason):
    proc = run([CAPTURE, "refused", reason], captured_env(**{variable: value}))
    assert_pass(proc, "refused")
    lines = [line for line in proc.stderr.splitlines() if "capture refused" in line]
    assert len(lines) == 1 and reason in lines[0], proc.stderr


@pytest.mark.parametrize("value", ["expandable_segments:False", "backend:native",
                                   "max_split_size_mb:128"])
def test_supported_allocator_configurations(value):
    assert_pass(run([CAPTURE, "basic"], captured_env(PYTORCH_CUDA_ALLOC_CONF=value)), "basic")


def test_quiet():
    proc = run([CAPTURE, "basic"], captured_env(DORMANT_PRELOAD_QUIET="1"))
    assert_pass(proc, "basic")
    assert "dormant-preload" not in proc.stderr
    proc = run([CAPTURE, "basic"], captured_env())
    assert "dormant-preload: capturing cudaMalloc (backend host)" in proc.stderr


# ---- dormant-run --------------------------------------------------------------

# The two ways to start it: the build's launcher and the package's module. They
# are one program (python/dormant/run.py) and must answer alike.
MODULE = [sys.executable, "-m", "dormant.run"]
LAUNCHERS = {"tools/dormant-run": [RUN], "python3 -m dormant.run": MODULE}


def launcher_env(launcher, **extra):
    env = base_env(**extra)
    if launcher is MODULE:
        env["PYTHONPATH"] = str(REPO / "python")
    return env


@pytest.fixture(params=list(LAUNCHERS))
def launcher(request):
    return LAUNCHERS[request.param]


@pytest.mark.parametrize("args,env,message", [
    (["--capture", "--", "true"], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
     "expandable_segments"),
    (["--capture", "--", "true"], {"PYTORCH_ALLOC_CONF": "a:1,expandable_segments:TRUE"},
     "expandable_segments"),
    (["--capture", "--", "true"], {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
     "cudaMallocAsync"),
    (["--capture", "--", "true"], {"DORMANT_PRELOAD_LIB": "/nonexistent/libdormant-preload.so"},
     "cannot find libdormant-preload.so"),
    (["--listen", "127.0.0.1:0", "--torch-memory-saver", "--", "true"],
     {"DORMANT_SHADOW_DIR": "/"}, "need --capture"),
    (["--capture"], {}, "no command"),
    (["--", "true"], {}, "nothing to do"),
    (["--bogus", "--", "true"], {}, "unknown option"),
    (["--capture", "--token-file", "/nonexistent/token", "--", "true"], {}, "token file"),
    (["--torch-memory-saver", "--", "true"], {"DORMANT_SHADOW_DIR": "/nonexistent/shadow"},
     "torch_memory_saver shadow"),
    (["--listen"], {}, "--listen needs HOST:PORT"),
    (["--capture", "--port-file"], {}, "--port-file needs a file"),
    (["--capture=yes", "--", "true"], {}, "unknown option --capture=yes"),
])
def test_run_refuses(launcher, args, env, message):
    proc = run([*launcher, *args], launcher_env(launcher, **env))
    assert proc.returncode == 2, proc
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("dormant-run: ") and message in lines[0], \
        proc.stderr
    assert proc.stdout == ""


def test_run_cannot_run_the_command(launcher, tmp_path):
    (tmp_path / "plain").write_text("not a program\n")
    proc = run([*launcher, "--torch-memory-saver", "--", "/nonexistent/program"],
               launcher_env(launcher))
    assert proc.returncode == 127 and "cannot run /nonexistent/program" in proc.stderr, proc
    proc = run([*launcher, "--torch-memory-saver", "--", str(tmp_path / "plain")],
               launcher_env(launcher))
    assert proc.returncode == 126 and "cannot run" in proc.stderr, proc


def test_run_help_and_version(launcher):
    proc = run([*launcher, "--help"], launcher_env(launcher))
    assert proc.returncode == 0 and proc.stdout.startswith("usage: dormant-run [--capture]")
    for flag in ("--capture", "--listen", "--token-file", "--port-file", "--torch-memory-saver",
                 "--print-env", "--version"):
        assert f"  {flag}" in proc.stdout, flag
    proc = run([*launcher, "--version"], launcher_env(launcher))
    assert proc.returncode == 0 and proc.stdout == f"dormant-run {dormant.__version__}\n", proc


def test_run_prints_the_environment(launcher):
    proc = run([*launcher, "--capture", "--listen=127.0.0.1:0", "--print-env"],
               launcher_env(launcher, DORMANT_PRELOAD_LIB=SHIM))
    assert proc.returncode == 0, proc
    env = dict(line.split("=", 1) for line in proc.stdout.splitlines())
    assert env["DORMANT_PRELOAD"] == "1" and env["DORMANT_LISTEN"] == "127.0.0.1:0", env
    assert env["LD_PRELOAD"].split()[-1] == os.path.realpath(SHIM), env
    assert "PYTHONPATH" not in env  # no --torch-memory-saver


def test_run_sets_the_environment(launcher):
    # keeps a sanitizer's LD_PRELOAD, if any
    env = launcher_env(launcher, DORMANT_PRELOAD_LIB=SHIM) if launcher is MODULE else base_env()
    script = 'echo "$$|$DORMANT_PRELOAD_PID|$DORMANT_PRELOAD|$LD_PRELOAD|$DORMANT_LISTEN"'
    proc = run([*launcher, "--capture", "--listen", "127.0.0.1:0", "--", "sh", "-c", script], env)
    assert proc.returncode == 0, proc.stderr
    pid, pid_var, switch, ld_preload, listen = proc.stdout.strip().split("|")
    assert pid == pid_var  # the command runs as the wrapper's own process
    assert switch == "1" and listen == "127.0.0.1:0"
    entries = ld_preload.split()
    assert entries[-1] == os.path.realpath(SHIM)
    assert entries[:-1] == os.environ.get("LD_PRELOAD", "").split()  # sanitizers stay first


def test_run_torch_memory_saver_flag(tmp_path):
    # the shadow first, then the package it imports (the checkout's python/)
    proc = run([RUN, "--torch-memory-saver", "--", "sh", "-c", 'echo "$PYTHONPATH"'],
               base_env(DORMANT_SHADOW_DIR=str(tmp_path), PYTHONPATH="/x"))
    assert proc.returncode == 0, proc
    assert proc.stdout.strip() == f"{tmp_path}:{REPO / 'python'}:/x", proc


def test_run_torch_memory_saver_from_the_build_folder():
    # what the README's switch runs, from a checkout: the shadow imports the
    # checkout's dormant, whatever the caller's PYTHONPATH
    program = ("import torch_memory_saver, dormant\n"
               "print(torch_memory_saver.__dormant__, dormant.__file__)\n")
    env = base_env()
    env.pop("PYTHONPATH", None)
    proc = run([RUN, "--torch-memory-saver", "--", sys.executable, "-c", program], env,
               cwd="/")
    assert proc.returncode == 0, proc
    flag, path = proc.stdout.split()
    assert flag == "True" and path == str(REPO / "python" / "dormant" / "__init__.py"), proc


def test_run_captures(tmp_path):
    assert_pass(run([RUN, "--capture", "--", CAPTURE, "basic"], base_env()), "basic")


def test_run_child_captured_without_a_server(tmp_path):
    # sh is the process the wrapper started; capture-test is its child: it is
    # captured (the variables pass on) but the server is sh's, not its own
    port_file = tmp_path / "port"
    proc = run([RUN, "--capture", "--listen", "127.0.0.1:0", "--port-file", str(port_file),
                "--", "sh", "-c", f'"{CAPTURE}" basic'], base_env())
    assert_pass(proc, "basic")
    assert not port_file.exists()
    assert "serving" not in proc.stderr


class Served:
    """capture-test serve under dormant-run with a server from the variables."""

    def __init__(self, tmp_path, token):
        self.port_file = tmp_path / "port"
        token_file = tmp_path / "token"
        token_file.write_text(token + "\n")
        self.token = token
        self.proc = subprocess.Popen(
            [RUN, "--capture", "--listen", "127.0.0.1:0", "--port-file", str(self.port_file),
             "--token-file", str(token_file), "--", CAPTURE, "serve"],
            env=base_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("ready"), line + self.proc.stderr.read()
        self.address = int(line.split()[1], 16)
        deadline = time.monotonic() + TIMEOUT_S
        while not self.port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{int(self.port_file.read_text())}"

    def request(self, method, path, token=True):
        """(HTTP status, parsed answer or None on failure), through dormant.client."""
        c = Client([self.url], token=self.token if token else False, retries=0,
                   timeout=TIMEOUT_S, raise_on_error=False)
        action = {("GET", "/stats"): c.stats, ("POST", "/sleep"): c.sleep,
                  ("POST", "/wake"): c.wake}[(method, path)]
        r, = action()
        return r.status, r.body if r.ok else None

    def say(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self):
        self.proc.stdin.close()
        return self.proc.wait(timeout=TIMEOUT_S)


def test_http_drives_a_program_that_knows_nothing_of_dormant(tmp_path):
    s = Served(tmp_path, "s3cret-token")
    try:
        assert s.request("GET", "/stats", token=False)[0] == 401
        status, st = s.request("GET", "/stats")
        assert status == 200
        default = [t for t in st["tags"] if t["tag"] == "default"][0]
        assert default["allocations"] == 1 and default["bytes"] == 8 << 20
        assert default["policy"] == "keep"
        assert st["extra"]["preload"]["active"] is True
        assert st["extra"]["preload"]["captured_allocations"] == 1
        assert st["extra"]["preload"]["ordinary"] == {
            "allocations": 0, "bytes": 0, "while_asleep_allocations": 0,
            "while_asleep_bytes": 0}
        assert s.request("POST", "/sleep")[0] == 200
        st = s.request("GET", "/stats")[1]
        default = [t for t in st["tags"] if t["tag"] == "default"][0]
        assert default["state"] == "asleep" and default["device_bytes"] == 0
        assert s.request("POST", "/wake")[0] == 200
        assert s.say("check") == "intact"
        assert s.say("free") == "free 0"
        assert s.request("GET", "/stats")[1]["totals"]["allocations"] == 0
    finally:
        assert s.close() == 0


# ---- the Python package -----------------------------------------------------------

# Under ASan the interpreter is not instrumented and the sanitizer runtimes
# are preloaded: preloading the instrumented libdormant.so as well (which the
# shim brings) hangs the interpreter at start-up in glibc's locale lock, shim
# or not (`LD_PRELOAD="libasan.so libubsan.so build-asan/libdormant.so"
# python3 -c 1`). The plain build runs these; the C programs run in both.
python_under_asan = pytest.mark.skipif(
    "libasan" in os.environ.get("LD_PRELOAD", ""),
    reason="an uninstrumented Python with an instrumented libdormant preloaded hangs at start-up")

PYTHON_UNDER_SHIM = r"""
import ctypes, os, sys
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)   # as torch loads its runtime
import dormant
from dormant import preload, _library
assert preload.active()
m = dormant.manager()
assert m.captured and m.backend == "host"
assert dormant.manager() is m
process = ctypes.CDLL(None)
ptr = ctypes.c_void_p()
assert process.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)) == 0
tags = {t["tag"]: t for t in m.stats()["tags"]}
assert tags["default"]["allocations"] == 1, tags
m.alloc("weights", 4096)
m.close()                                  # not ours: the manager lives on
again = dormant.manager()
assert again is not m and again.captured
assert again.stats()["totals"]["allocations"] == 2
assert preload.stats()["captured_allocations"] == 1
assert _library.get().path == _library.preloaded_path()
assert preload.library_path() == os.path.realpath(sys.argv[2])
ctypes.CDLL(_library.get().path).dormant_torch_get_manager.restype = ctypes.c_void_p
assert ctypes.CDLL(_library.get().path).dormant_torch_get_manager() == again._m.value
dormant.sleep()
dormant.wake()
assert process.cudaFree(ptr) == 0
print("PASS python")
"""


@python_under_asan
def test_python_attaches_to_the_shim_manager(tmp_path):
    # $DORMANT_LIB names another file: the package must still take the copy
    # the shim loaded (a second copy would have a registry of its own)
    other = tmp_path / "libdormant.so"
    shutil.copy(os.environ["DORMANT_LIB"], other)
    env = captured_env(PYTHONPATH=str(REPO / "python"), DORMANT_LIB=str(other))
    env.pop("DORMANT_PRELOAD_LIB", None)
    proc = run([sys.executable, "-c", PYTHON_UNDER_SHIM, FAKE_CUDART, SHIM], env)
    assert_pass(proc, "python")


@python_under_asan
def test_python_when_refused():
    code = ("import dormant\ntry:\n    dormant.manager()\nexcept dormant.DormantError as e:\n"
            "    print('refused', e)\n")
    env = captured_env(PYTHONPATH=str(REPO / "python"),
                       PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    proc = run([sys.executable, "-c", code], env)
    assert proc.returncode == 0 and "refused whole-process capture" in proc.stdout \
        and "expandable_segments" in proc.stdout, proc


def test_python_without_the_shim(monkeypatch):
    monkeypatch.setenv("DORMANT_PRELOAD_LIB", SHIM)
    assert not preload.active()
    assert preload.stats() is None
    assert preload.library_path() == os.path.realpath(SHIM)
    env = preload.environment({"LD_PRELOAD": "/lib/a.so", "DORMANT_LISTEN": "127.0.0.1:1",
                               "DORMANT_PRELOAD_PID": "1", "DORMANT_BACKEND": "host"})
    assert env["LD_PRELOAD"] == f"/lib/a.so {os.path.realpath(SHIM)}"
    assert env["DORMANT_PRELOAD"] == "1" and env["DORMANT_BACKEND"] == "host"
    assert "DORMANT_LISTEN" not in env and "DORMANT_PRELOAD_PID" not in env
    # twice: not appended again
    assert preload.environment(env)["LD_PRELOAD"] == env["LD_PRELOAD"]
    monkeypatch.setenv("DORMANT_PRELOAD_LIB", "/nonexistent.so")
    with pytest.raises(dormant.UnsupportedError):
        preload.library_path()


def test_environment_captures_a_child(monkeypatch):
    monkeypatch.setenv("DORMANT_PRELOAD_LIB", SHIM)
    env = preload.environment(base_env(LD_PRELOAD=os.environ.get("LD_PRELOAD", "")))
    assert_pass(run([CAPTURE, "basic"], env), "basic")
