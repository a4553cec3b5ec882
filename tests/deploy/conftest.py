# SPDX-License-Identifier: MIT
"""Paths and loaders for the deploy checks."""
import os
import pathlib
import signal
import subprocess
import time

import pytest
import yaml

SOURCE_ROOT = pathlib.Path(os.environ.get("SOURCE_ROOT",
                                          pathlib.Path(__file__).resolve().parents[2]))
DEPLOY = SOURCE_ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"


def tool(name):
    path = os.environ.get(name.upper(), "")
    if not path:
        pytest.fail(f"${name.upper()} is not set: meson test sets it "
                    f"(is {name} installed? see scripts/debian-packages.txt)")
    return path


def load_kube():
    """{kind: [document, ...]} over every manifest in deploy/kubernetes."""
    docs = {}
    for path in sorted(KUBE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                doc["__file__"] = path.name
                docs.setdefault(doc["kind"], []).append(doc)
    return docs


def one(docs, kind):
    assert len(docs.get(kind, [])) == 1, f"expected one {kind}, found {len(docs.get(kind, []))}"
    return docs[kind][0]


class Daemon:
    def __init__(self, tmp, name, *args):
        port_file = tmp / f"{name}.port"
        self.proc = subprocess.Popen(
            [tool("dormantd"), "--backend", "host", "--listen", "127.0.0.1:0",
             "--port-file", str(port_file), "--keep", "8MiB", "--discard", "8MiB", "--quiet",
             *args],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"dormantd exited: {self.proc.stderr.read().decode()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("dormantd did not start")
            time.sleep(0.02)
        self.port = int(port_file.read_text())
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stderr.close()


@pytest.fixture
def daemon(tmp_path):
    started = []

    def start(*args):
        d = Daemon(tmp_path, f"d{len(started)}", *args)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()
