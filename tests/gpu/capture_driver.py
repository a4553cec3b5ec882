# SPDX-License-Identifier: MIT
"""Drives tests/gpu/capture_trainer.py as an orchestrator would: under
`dormant-run --capture --listen`, sleeping and waking it over HTTP between
steps, measuring with nvidia-smi what the process holds awake and asleep.
Used by tests/gpu/test_preload_gpu.py and scripts/gpu-preload. Needs no
torch in this process (it never touches CUDA itself)."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[2]
TRAINER = pathlib.Path(__file__).resolve().parent / "capture_trainer.py"
MiB = 1 << 20
TIMEOUT_S = 300


def dormant_run_path():
    if os.environ.get("DORMANT_RUN"):
        return os.environ["DORMANT_RUN"]
    lib = os.environ.get("DORMANT_LIB")
    build = pathlib.Path(lib).parent if lib else REPO / "build"
    return str(build / "tools" / "dormant-run")


def gpu_memory_mib(pid):
    """(MiB the process holds per nvidia-smi or None, MiB used on the GPU)."""
    try:
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True)
    except FileNotFoundError:
        return None, None
    used_by_pid = None
    for line in apps.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
            used_by_pid = int(fields[1])
    total = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                            "--format=csv,noheader,nounits"], capture_output=True, text=True)
    try:
        used = int(total.stdout.split()[0])
    except (IndexError, ValueError):
        used = None
    return used_by_pid, used


class Trainer:
    def __init__(self, capture, regions=False, steps=6, extra_args=(), env=None, log=None):
        self.tmp = tempfile.TemporaryDirectory()
        self.port_file = pathlib.Path(self.tmp.name) / "port"
        args = [sys.executable, str(TRAINER), "--steps", str(steps), *extra_args]
        if regions:
            args.append("--regions")
        if capture:
            args = [dormant_run_path(), "--capture", "--listen", "127.0.0.1:0",
                    "--port-file", str(self.port_file), "--", *args]
        full_env = dict(os.environ if env is None else env)
        full_env.setdefault("DORMANT_BACKEND", "cuda")
        full_env.setdefault("PYTHONPATH", str(REPO / "python"))
        self.stderr = open(log, "w") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True, env=full_env)
        self.url = None

    def next_line(self):
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the trainer exited ({self.proc.wait()}) without a line")
        return line.split()

    def connect(self):
        deadline = time.monotonic() + TIMEOUT_S
        while not self.port_file.exists():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the captured trainer's server did not start")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{int(self.port_file.read_text())}"

    def http(self, method, path):
        req = urllib.request.Request(self.url + path, method=method,
                                     data=b"" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            return json.loads(r.read())

    def go(self):
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self):
        words = self.next_line()
        assert words[0] == "final", words
        self.proc.stdin.close()
        rc = self.proc.wait(timeout=TIMEOUT_S)
        self.tmp.cleanup()
        return words[1], rc


def run(capture, sleep, regions=False, steps=6, log=None, extra_args=()):
    """One training run. Returns a dict: losses, digest, rc and, for capture
    with sleep, one measurement per cycle."""
    t = Trainer(capture, regions=regions, steps=steps, log=log, extra_args=extra_args)
    losses, cycles = [], []
    try:
        for _ in range(steps):
            words = t.next_line()
            assert words[0] == "step", words
            losses.append(words[2])
            if capture and sleep:
                if t.url is None:
                    t.connect()
                awake_pid, awake_used = gpu_memory_mib(t.proc.pid)
                stats = t.http("GET", "/stats")
                report = t.http("POST", "/sleep")
                asleep_pid, asleep_used = gpu_memory_mib(t.proc.pid)
                asleep_stats = t.http("GET", "/stats")
                wake = t.http("POST", "/wake")
                cycles.append({
                    "awake_pid_mib": awake_pid, "asleep_pid_mib": asleep_pid,
                    "awake_used_mib": awake_used, "asleep_used_mib": asleep_used,
                    "managed_mib": stats["totals"]["device_bytes"] / MiB,
                    "released_mib": report["bytes_released"] / MiB,
                    "host_mib_asleep": asleep_stats["totals"]["host_bytes"] / MiB,
                    "sleep_s": report["duration_s"], "wake_s": wake["duration_s"],
                    "tags": {x["tag"]: x["bytes"] / MiB for x in stats["tags"]},
                    "preload": stats.get("extra", {}).get("preload"),
                })
            t.go()
        digest, rc = t.finish()
    finally:
        if t.proc.poll() is None:
            t.proc.kill()
            t.proc.wait()
    return {"losses": losses, "digest": digest, "rc": rc, "cycles": cycles}


def summary(cycles):
    """One line per cycle: what nvidia-smi saw awake and asleep."""
    out = []
    for i, c in enumerate(cycles):
        pid = (f"process {c['awake_pid_mib']} -> {c['asleep_pid_mib']} MiB"
               if c["awake_pid_mib"] is not None else "process n/a (nvidia-smi lists no pid)")
        freed_used = (c["awake_used_mib"] - c["asleep_used_mib"]
                      if c["awake_used_mib"] is not None else None)
        out.append(f"cycle {i}: {pid}; GPU used {c['awake_used_mib']} -> {c['asleep_used_mib']} "
                   f"MiB (freed {freed_used}); dormant managed {c['managed_mib']:.0f} MiB, "
                   f"released {c['released_mib']:.0f} MiB, host {c['host_mib_asleep']:.0f} MiB "
                   f"asleep; sleep {c['sleep_s']:.3f} s, wake {c['wake_s']:.3f} s; tags "
                   + ", ".join(f"{k} {v:.0f} MiB" for k, v in c["tags"].items()))
    return out
