# SPDX-License-Identifier: MIT
"""Fixtures for the package tests: managers on the host backend (a simulated
device in host memory, no GPU and no torch needed) and a small HTTP client."""
import json
import os
import pathlib
import sys
import urllib.error
import urllib.request

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

import dormant  # noqa: E402

MiB = 1 << 20


@pytest.fixture
def mgr():
    """A host-backend manager with a 256 MiB simulated device."""
    m = dormant.Manager(backend="host", host_device_bytes=256 * MiB)
    yield m
    m.close()


@pytest.fixture
def server(mgr):
    s = mgr.serve(quiet=True)
    yield s
    s.stop()


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.text = body.decode("utf-8", "replace")
        ctype = headers.get("Content-Type", "")
        self.json = json.loads(self.text) if "json" in ctype and self.text else None

    def __repr__(self):
        return f"<Response {self.status} {self.text[:200]!r}>"


def http(method, url, body=None, token=None, timeout=60):
    """One request; returns a Response for any status (no exception)."""
    data = None
    headers = {}
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return Response(r.status, r.headers, r.read())
    except urllib.error.HTTPError as e:
        return Response(e.code, e.headers, e.read())


def env_without_lib():
    """The environment minus what points at the built library ($DORMANT_LIB,
    and the LD_LIBRARY_PATH meson test sets)."""
    env = dict(os.environ)
    env.pop("DORMANT_LIB", None)
    env.pop("LD_LIBRARY_PATH", None)
    return env
