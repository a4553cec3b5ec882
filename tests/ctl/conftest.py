# SPDX-License-Identifier: MIT
"""Fixtures for dormantctl's tests: real dormantd processes on loopback (the
host backend, no GPU) and a small mock server for answers dormantd never
gives (oversized, not JSON, a counted concurrency)."""
import os
import pathlib
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from dormantd_process import Dormantd  # noqa: E402

DORMANTD = os.environ.get("DORMANTD", "")
DORMANTCTL = os.environ.get("DORMANTCTL", "")


@pytest.fixture
def daemons(tmp_path):
    """A factory: daemons(n, *extra) starts n dormantd; all stop at the end."""
    if not DORMANTD:
        pytest.fail("set DORMANTD to the dormantd binary (meson test does)")
    started = []

    def start(count=1, *extra, unix=False):
        new = [Dormantd(DORMANTD, tmp_path, f"d{len(started) + i}", *extra, unix=unix)
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
