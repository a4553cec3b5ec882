# SPDX-License-Identifier: MIT
"""Fixtures for dormantctl's tests: real dormantd processes on loopback (the
host backend, no GPU) and a small mock server for answers dormantd never
gives (oversized, not JSON, a counted concurrency)."""
import os
import pathlib
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

DORMANTD = os.environ.get("DORMANTD", "")
DORMANTCTL = os.environ.get("DORMANTCTL", "")
START_TIMEOUT_S = 20


class Daemon:
    """One `dormantd --backend host` on 127.0.0.1 (a free port) or a socket."""

    def __init__(self, tmp: pathlib.Path, name: str, *extra: str, unix: bool = False):
        self.port_file = tmp / f"{name}.port"
        self.unix_path = str(tmp / f"{name}.sock") if unix else None
        self.log = open(tmp / f"{name}.log", "w+")
        args = [DORMANTD, "--backend", "host", "--keep", "8MiB", "--discard", "8MiB",
                "--quiet"]
        if unix:
            args += ["--unix", self.unix_path]
        else:
            args += ["--listen", "127.0.0.1:0", "--port-file", str(self.port_file)]
        args += list(extra)
        env = dict(os.environ)
        env.pop("DORMANT_TOKEN", None)
        env.pop("DORMANT_TOKEN_FILE", None)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env)
        self.port = None
        self._wait_listening()

    def _wait_listening(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"dormantd exited ({self.proc.returncode}): {self.log.read()}")
            if self.unix_path:
                if os.path.exists(self.unix_path):
                    return
            elif self.port_file.exists():
                text = self.port_file.read_text().strip()
                if text:
                    self.port = int(text)
                    return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("dormantd did not start listening")

    @property
    def endpoint(self) -> str:
        return f"unix:{self.unix_path}" if self.unix_path else f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def daemons(tmp_path):
    """A factory: daemons(n, *extra) starts n dormantd; all stop at the end."""
    if not DORMANTD:
        pytest.fail("set DORMANTD to the dormantd binary (meson test does)")
    started = []

    def start(count=1, *extra, unix=False):
        new = [Daemon(tmp_path, f"d{len(started) + i}", *extra, unix=unix)
               for i in range(count)]
        started.extend(new)
        return new

    yield start
    for d in started:
        d.stop()


class MockServer:
    """A threaded HTTP server on 127.0.0.1 whose answers a test chooses:
    handler(request) -> (status, headers dict, body bytes)."""

    def __init__(self, handler):
        outer = self
        self.requests = []
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with outer.lock:
                    outer.requests.append((self.command, self.path, dict(self.headers), body))
                status, headers, payload = handler(self)
                self.send_response(status)
                # "X-No-Length": no Content-Length, the body ends at close
                no_length = headers.pop("X-No-Length", None)
                for k, v in headers.items():
                    self.send_header(k, v)
                if no_length:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                else:
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = _answer
            do_POST = _answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self):
        return f"127.0.0.1:{self.port}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def mock():
    servers = []

    def start(handler):
        s = MockServer(handler)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()
