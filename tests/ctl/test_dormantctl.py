# SPDX-License-Identifier: MIT
"""dormantctl end to end: real dormantd processes on loopback (host backend)
for the transitions, the failures an operator meets (a rank down, a wake
answered 503 until the GPU memory is free, a wrong token), and a mock server
for answers dormantd never gives."""
import json
import os
import pty
import subprocess
import sys
import threading
import time

import pytest

from conftest import DORMANTCTL

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from dormant.client import Client  # noqa: E402

MIB = 1 << 20
# Quick retries: the tests never wait out a real backoff or Retry-After.
FAST = ["--backoff", "0.01", "--max-delay", "0.05", "--no-progress"]


def ctl(*args, env=None, stderr=subprocess.PIPE):
    full_env = dict(os.environ)
    full_env.pop("DORMANT_TOKEN", None)
    full_env.pop("DORMANT_TOKEN_FILE", None)
    full_env.update(env or {})
    return subprocess.run([DORMANTCTL, *args], stdout=subprocess.PIPE, stderr=stderr,
                          text=True, env=full_env, timeout=120, check=False)


def ctl_json(*args, env=None):
    p = ctl("--json", *args, env=env)
    try:
        doc = json.loads(p.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"not JSON (rc {p.returncode}): {p.stdout!r} {p.stderr!r}")
    return p, doc


def get_stats(url, token=None):
    """GET /stats of one server, through dormant.client."""
    return Client([url], token=token, timeout=10, retries=0).stats()[0].body


def by_endpoint(doc):
    return {r["endpoint"]: r for r in doc["results"]}


# ---- against dormantd -------------------------------------------------------

def test_all_succeed_through_sleep_and_wake(daemons):
    ds = daemons(3)
    eps = [d.endpoint for d in ds]

    p = ctl(*FAST, "sleep", *eps)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split() == ["ENDPOINT", "STATE", "BYTES", "DURATION", "ERROR"]
    for d in ds:
        row = next(line for line in lines if line.startswith(d.endpoint + " "))
        assert row.split()[1] == "asleep"
    assert lines[-1] == "3 endpoints: 3 ok, 0 failed"
    assert p.stderr == ""

    for d in ds:
        stats = get_stats(d.url)
        assert stats["state"] == "asleep"
        assert stats["totals"]["device_bytes"] == 0

    p, doc = ctl_json(*FAST, "wake", *eps)
    assert p.returncode == 0, p.stderr
    assert doc["command"] == "wake" and doc["tags"] is None
    assert (doc["endpoints"], doc["ok"], doc["failed"]) == (3, 3, 0)
    results = by_endpoint(doc)
    for d in ds:
        r = results[d.endpoint]
        assert r["ok"] is True and r["error"] is None
        assert r["http_status"] == 200 and r["attempts"] == 1
        assert r["state"] == "awake" and r["changed"] is True
        assert r["url"] == d.url + "/wake"
        # every byte slept comes back: 8 MiB kept + 8 MiB discarded
        assert r["bytes"] == r["response"]["bytes_mapped"] == 16 * MIB
        assert r["duration_s"] == pytest.approx(r["response"]["duration_s"], abs=1e-5)
        assert r["response"]["action"] == "wake"

    p, doc = ctl_json(*FAST, "stats", *eps)
    assert p.returncode == 0
    for d in ds:
        r = by_endpoint(doc)[d.endpoint]
        stats = get_stats(d.url)
        assert r["state"] == "awake" == stats["state"]
        assert r["bytes"] == stats["totals"]["device_bytes"] == 16 * MIB
        assert r["host_bytes"] == stats["totals"]["host_bytes"]
        assert r["response"]["counters"]["wakes_ok"] == 1


def test_repeated_sleep_changes_nothing(daemons):
    (d,) = daemons(1)
    assert ctl(*FAST, "sleep", d.endpoint).returncode == 0
    p = ctl(*FAST, "sleep", d.endpoint)
    assert p.returncode == 0
    assert "asleep (no change)" in p.stdout
    p, doc = ctl_json(*FAST, "sleep", d.endpoint)
    assert doc["results"][0]["changed"] is False


def test_tags_sleep_only_those(daemons):
    (d,) = daemons(1)
    tags = get_stats(d.url)["tags"]
    discard = next(t["tag"] for t in tags if t["policy"] == "discard")
    keep = next(t["tag"] for t in tags if t["policy"] == "keep")

    p, doc = ctl_json(*FAST, "--tags", discard, "sleep", d.endpoint)
    assert p.returncode == 0, p.stderr
    assert doc["tags"] == [discard]
    r = doc["results"][0]
    assert r["state"] == "mixed"
    assert [t["tag"] for t in r["response"]["tags"]] == [discard]
    assert r["bytes"] == 8 * MIB

    states = {t["tag"]: t["state"] for t in get_stats(d.url)["tags"]}
    assert states[discard] == "asleep" and states[keep] == "awake"

    p, doc = ctl_json(*FAST, "-t", f"{discard},{keep}", "wake", d.endpoint)
    assert p.returncode == 0 and doc["results"][0]["state"] == "awake"


def test_unknown_tag_fails_without_retry(daemons):
    (d,) = daemons(1)
    p, doc = ctl_json(*FAST, "--tags", "no-such-tag", "sleep", d.endpoint)
    assert p.returncode == 1
    r = doc["results"][0]
    assert r["http_status"] == 404 and r["problem"] == "unknown-tag"
    assert r["attempts"] == 1


def test_one_down(daemons):
    ds = daemons(3)
    down = ds[1]
    down.stop()

    p, doc = ctl_json(*FAST, "--retries", "2", "sleep", *[d.endpoint for d in ds])
    assert p.returncode == 1
    assert (doc["ok"], doc["failed"]) == (2, 1)
    results = by_endpoint(doc)
    bad = results[down.endpoint]
    assert bad["ok"] is False and bad["http_status"] is None
    assert bad["attempts"] == 3
    assert "Connection refused" in bad["error"] and "(3 attempts)" in bad["error"]
    for d in (ds[0], ds[2]):
        assert results[d.endpoint]["state"] == "asleep"
    # the failure is named on stderr, the others are not
    assert f"dormantctl: {down.endpoint}: cannot connect" in p.stderr
    assert ds[0].endpoint not in p.stderr

    p = ctl(*FAST, "--retries", "0", "wake", *[d.endpoint for d in ds])
    assert p.returncode == 1
    assert "3 endpoints: 2 ok, 1 failed" in p.stdout


def test_503_then_recovers(daemons):
    (flaky,) = daemons(1, "--fail-wakes", "2")
    (good,) = daemons(1)
    eps = [flaky.endpoint, good.endpoint]
    assert ctl(*FAST, "sleep", *eps).returncode == 0

    p, doc = ctl_json(*FAST, "--retries", "3", "wake", *eps)
    assert p.returncode == 0, p.stderr
    results = by_endpoint(doc)
    assert results[flaky.endpoint]["attempts"] == 3
    assert results[flaky.endpoint]["state"] == "awake"
    assert results[good.endpoint]["attempts"] == 1
    stats = get_stats(flaky.url)
    assert stats["state"] == "awake"
    assert stats["counters"]["wakes_failed"] == 2


def test_503_until_retries_run_out(daemons):
    (flaky,) = daemons(1, "--fail-wakes", "5")
    assert ctl(*FAST, "sleep", flaky.endpoint).returncode == 0

    p, doc = ctl_json(*FAST, "--retries", "1", "wake", flaky.endpoint)
    assert p.returncode == 1
    r = doc["results"][0]
    assert r["http_status"] == 503 and r["problem"] == "out-of-memory"
    assert r["attempts"] == 2 and "(2 attempts)" in r["error"]
    # the failed wake left the tags asleep with their host copies: retryable
    assert r["state"] == "asleep"
    assert get_stats(flaky.url)["state"] == "asleep"


def test_wrong_token(daemons, tmp_path):
    good = daemons(2, "--token", "s3cret")
    (other,) = daemons(1, "--token", "another")
    eps = [d.endpoint for d in good + [other]]

    p, doc = ctl_json(*FAST, "sleep", *eps, env={"DORMANT_TOKEN": "s3cret"})
    assert p.returncode == 1
    assert (doc["ok"], doc["failed"]) == (2, 1)
    bad = by_endpoint(doc)[other.endpoint]
    assert bad["http_status"] == 401 and bad["problem"] == "unauthorized"
    assert bad["attempts"] == 1  # a wrong token is not retried
    assert f"dormantctl: {other.endpoint}: HTTP 401" in p.stderr

    # --token-file wins over $DORMANT_TOKEN; a trailing newline is ignored
    token_file = tmp_path / "token"
    token_file.write_text("another\n")
    p = ctl(*FAST, "--token-file", str(token_file), "sleep", other.endpoint,
            env={"DORMANT_TOKEN": "s3cret"})
    assert p.returncode == 0, p.stdout + p.stderr

    # $DORMANT_TOKEN_FILE, as the server reads it
    p = ctl(*FAST, "wake", other.endpoint, env={"DORMANT_TOKEN_FILE": str(token_file)})
    assert p.returncode == 0, p.stdout + p.stderr

    # no token at all
    p, doc = ctl_json(*FAST, "stats", good[0].endpoint)
    assert p.returncode == 1 and doc["results"][0]["http_status"] == 401


def test_unix_socket(daemons):
    (d,) = daemons(1, unix=True)
    p, doc = ctl_json(*FAST, "sleep", d.endpoint)
    assert p.returncode == 0, p.stderr
    r = doc["results"][0]
    assert r["endpoint"] == d.endpoint and r["unix_socket"] == d.unix_path
    assert r["state"] == "asleep"


def test_file_and_dns_sources(daemons, tmp_path):
    ds = daemons(3)
    listing = tmp_path / "ranks.txt"
    listing.write_text(f"# node 0\n{ds[0].endpoint}\n\n  http://{ds[1].endpoint}/  \n")

    # the same rank through three sources is asked once
    p, doc = ctl_json(*FAST, "--file", str(listing), "health", ds[0].endpoint)
    assert p.returncode == 0, p.stderr
    assert sorted(by_endpoint(doc)) == sorted([ds[0].endpoint, ds[1].endpoint])
    assert all(r["state"] == "ok" for r in doc["results"])

    ports = ",".join(str(d.port) for d in ds)
    p, doc = ctl_json(*FAST, "--dns", "localhost", "-4", "--port", ports, "ready")
    assert p.returncode == 0, p.stderr
    assert [r["endpoint"] for r in doc["results"]] == [f"127.0.0.1:{d.port}" for d in ds]
    assert all(r["state"] == "ready" for r in doc["results"])

    # a host without a port is expanded over --port, like --dns
    p, doc = ctl_json(*FAST, "--port", ports, "health", "127.0.0.1")
    assert p.returncode == 0 and doc["endpoints"] == 3


def test_concurrency_one_still_reaches_all(daemons):
    ds = daemons(4)
    p, doc = ctl_json(*FAST, "-j", "1", "sleep", *[d.endpoint for d in ds])
    assert p.returncode == 0 and doc["ok"] == 4


# ---- usage errors (exit status 2) ---------------------------------------------

@pytest.mark.parametrize("args, message", [
    ([], "no command given"),
    (["reboot", "h:1"], "unknown command 'reboot'"),
    (["sleep"], "no endpoint given"),
    (["sleep", "h:99999"], "bad port"),
    (["sleep", "ftp://h:1"], "only http://"),
    (["stats", "--tags", "a", "h:1"], "--tags applies to sleep and wake only"),
    (["sleep", "--tags", "a,,b", "h:1"], "an empty tag"),
    (["sleep", "--tags", "a,", "h:1"], "an empty tag"),
    (["sleep", "--tags", "a;b", "h:1"], "outside [A-Za-z0-9_.:-]"),
    (["sleep", "--tags", "x" * 64, "h:1"], "longer than 63"),
    (["sleep", "--tags", ",".join(f"t{i}" for i in range(65)), "h:1"], "more than 64 tags"),
    (["sleep", "--tags", "a,a", "h:1"], "listed twice"),
    (["sleep", "--retries", "-1", "h:1"], "--retries"),
    (["sleep", "--retries", "101", "h:1"], "--retries"),
    (["sleep", "-j", "0", "h:1"], "--concurrency"),
    (["sleep", "--timeout", "nan", "h:1"], "--timeout"),
    (["sleep", "--port", "70000", "h"], "--port"),
    (["sleep", "-4", "h:1"], "-4 and -6 apply to --dns only"),
    (["sleep", "--token-file", "/nonexistent/token", "h:1"], "/nonexistent/token"),
    (["sleep", "--file", "/nonexistent/list"], "/nonexistent/list"),
    (["sleep", "--dns", "bad name!"], "bad host name"),
    (["--bogus", "sleep", "h:1"], "unknown option '--bogus'"),
    (["sleep", "--residue", "later", "h:1"], "--residue: 'later' is not keep or checkpoint"),
    (["wake", "--residue", "checkpoint", "h:1"], "--residue applies to sleep only"),
])
def test_usage_errors(args, message):
    p = ctl(*args)
    assert p.returncode == 2, p.stdout + p.stderr
    assert message in p.stderr
    assert p.stdout == ""


def test_bad_token_in_environment():
    p = ctl("sleep", "h:1", env={"DORMANT_TOKEN": "two words"})
    assert p.returncode == 2 and "DORMANT_TOKEN" in p.stderr


def test_empty_endpoint_file(tmp_path):
    f = tmp_path / "empty"
    f.write_text("# nothing here\n\n")
    p = ctl("sleep", "--file", str(f))
    assert p.returncode == 2 and "no endpoint in the file" in p.stderr


def test_help_and_version():
    p = ctl("--help")
    assert p.returncode == 0 and "Usage: dormantctl" in p.stdout
    p = ctl("--version")
    assert p.returncode == 0 and p.stdout.startswith("dormantctl ")


# ---- against a mock server ------------------------------------------------------

def json_answer(status, doc, extra=None):
    headers = {"Content-Type": "application/json" if status == 200 else
               "application/problem+json"}
    headers.update(extra or {})
    return status, headers, json.dumps(doc).encode()


def test_request_shape(mock):
    s = mock(lambda req: json_answer(200, {"state": "asleep", "changed": True}))
    p = ctl(*FAST, "sleep", s.endpoint, env={"DORMANT_TOKEN": "tok-1"})
    assert p.returncode == 0, p.stderr
    p = ctl(*FAST, "--tags", "weights,grads", "wake", s.endpoint)
    assert p.returncode == 0, p.stderr
    p = ctl(*FAST, "stats", s.endpoint)
    assert p.returncode == 0, p.stderr

    (m1, path1, h1, b1), (m2, path2, h2, b2), (m3, path3, h3, _) = s.requests
    assert (m1, path1, b1) == ("POST", "/sleep", b"")  # no body: every tag
    assert h1["Authorization"] == "Bearer tok-1"
    assert "Content-Type" not in h1
    assert (m2, path2) == ("POST", "/wake")
    assert h2["Content-Type"] == "application/json"
    assert json.loads(b2) == {"tags": ["weights", "grads"]}
    assert "Authorization" not in h2
    assert (m3, path3) == ("GET", "/stats")


def test_residue_goes_in_the_sleep_body(mock):
    s = mock(lambda req: json_answer(200, {"state": "asleep", "changed": True}))
    p = ctl(*FAST, "--residue", "checkpoint", "sleep", s.endpoint)
    assert p.returncode == 0, p.stderr
    p = ctl(*FAST, "--residue", "keep", "-t", "weights", "sleep", s.endpoint)
    assert p.returncode == 0, p.stderr
    (m1, path1, h1, b1), (_, _, _, b2) = s.requests
    assert (m1, path1) == ("POST", "/sleep")
    assert h1["Content-Type"] == "application/json"
    assert json.loads(b1) == {"residue": "checkpoint"}
    assert json.loads(b2) == {"tags": ["weights"], "residue": "keep"}


@pytest.mark.parametrize("announced", [True, False])
def test_oversized_response_is_cut(mock, announced):
    big = b"{\"state\": \"" + b"x" * (2 << 20) + b"\"}"
    headers = {"Content-Type": "application/json"}
    if not announced:
        headers["X-No-Length"] = "1"
    s = mock(lambda req: (200, dict(headers), big))
    p, doc = ctl_json(*FAST, "stats", s.endpoint)
    assert p.returncode == 1
    r = doc["results"][0]
    assert "response larger than 1048576 bytes" in r["error"]
    assert r["attempts"] == 1


def test_response_without_length_is_read(mock):
    s = mock(lambda req: (200, {"Content-Type": "application/json", "X-No-Length": "1"},
                          b'{"status": "ok"}'))
    p, doc = ctl_json(*FAST, "health", s.endpoint)
    assert p.returncode == 0 and doc["results"][0]["state"] == "ok"


def test_not_json(mock):
    s = mock(lambda req: (502, {"Content-Type": "text/html"}, b"<h1>bad gateway</h1>"))
    p, doc = ctl_json(*FAST, "stats", s.endpoint)
    assert p.returncode == 1
    assert doc["results"][0]["error"] == "HTTP 502 (text/html)"
    assert doc["results"][0]["attempts"] == 1  # only 503 is retried


def test_503_retried_then_ok(mock):
    answers = iter([
        json_answer(503, {"type": "urn:dormant:problem:out-of-memory", "status": 503,
                          "detail": "busy GPU"}),
        json_answer(503, {"type": "urn:dormant:problem:out-of-memory", "status": 503}),
        json_answer(200, {"state": "awake", "changed": True, "bytes_mapped": 5}),
    ])
    s = mock(lambda req: next(answers))
    p, doc = ctl_json(*FAST, "--retries", "2", "wake", s.endpoint)
    assert p.returncode == 0, p.stderr
    assert doc["results"][0]["attempts"] == 3
    assert doc["results"][0]["bytes"] == 5
    assert len(s.requests) == 3


def test_timed_out_transition_is_waited_out(mock):
    """An attempt that times out after sending its sleep leaves the sleep
    running on the server: the retry's 409 busy is then our own sleep, and
    dormantctl keeps retrying until the server answers for it."""
    release = threading.Event()
    calls = []

    def handler(req):
        calls.append(req.path)
        if len(calls) == 1:
            release.wait(20)  # the first sleep outlives the client's timeout (2 s: the later attempts must not time out on a loaded machine)
            return json_answer(200, {"state": "asleep"})
        if len(calls) == 2:
            return json_answer(409, {"type": "urn:dormant:problem:busy", "status": 409})
        return json_answer(200, {"state": "asleep", "changed": False})

    s = mock(handler)
    try:
        p, doc = ctl_json(*FAST, "--timeout", "2", "--retries", "3", "sleep", s.endpoint)
    finally:
        release.set()
    assert p.returncode == 0, p.stdout
    r = doc["results"][0]
    assert r["attempts"] == 3 and r["state"] == "asleep" and r["changed"] is False


def test_busy_is_not_retried_otherwise(mock):
    s = mock(lambda req: json_answer(409, {"type": "urn:dormant:problem:busy", "status": 409,
                                           "detail": "another transition is running"}))
    p, doc = ctl_json(*FAST, "--retries", "3", "wake", s.endpoint)
    assert p.returncode == 1
    r = doc["results"][0]
    assert r["attempts"] == 1 and r["problem"] == "busy"
    assert r["error"] == "HTTP 409 busy: another transition is running"


def test_each_attempt_replaces_the_last(mock):
    """A 503 carrying a report, then a dead server: the result is the last
    attempt's (no state left over from the report)."""
    answers = iter([json_answer(503, {"type": "urn:dormant:problem:out-of-memory",
                                      "status": 503, "report": {"state": "asleep"}})])
    s = mock(lambda req: next(answers))
    port = s.port

    def stop_after_first():
        while not s.requests:
            time.sleep(0.01)
        s.close()

    threading.Thread(target=stop_after_first, daemon=True).start()
    p, doc = ctl_json("--backoff", "0.3", "--max-delay", "0.3", "--no-progress",
                      "--retries", "1", "wake", f"127.0.0.1:{port}")
    assert p.returncode == 1
    r = doc["results"][0]
    assert r["attempts"] == 2
    assert r["http_status"] is None and r["state"] is None and r["problem"] is None


def test_concurrency_limit(mock):
    """-j 2 over six endpoints: never more than two in flight, and two do run
    together (each answer waits for a partner, so a client that serialised
    its requests would time out here)."""
    lock = threading.Lock()
    state = {"active": 0, "max": 0}
    barrier = threading.Barrier(2, timeout=20)

    def handler(req):
        with lock:
            state["active"] += 1
            state["max"] = max(state["max"], state["active"])
        try:
            barrier.wait()
            status = 200
        except threading.BrokenBarrierError:
            status = 500
        with lock:
            state["active"] -= 1
        return json_answer(status, {"status": "ok"})

    servers = [mock(handler) for _ in range(6)]
    p, doc = ctl_json(*FAST, "-j", "2", "health", *[s.endpoint for s in servers])
    assert p.returncode == 0, p.stdout
    assert doc["ok"] == 6
    assert state["max"] == 2


def test_progress_line_only_on_a_terminal(mock):
    s = mock(lambda req: json_answer(200, {"status": "ok"}))
    p = ctl("health", s.endpoint)
    assert p.returncode == 0
    assert "in flight" not in p.stderr

    leader, follower = pty.openpty()
    try:
        p = ctl("health", s.endpoint, stderr=follower)
        os.close(follower)
        follower = -1
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if follower >= 0:
            os.close(follower)
        os.close(leader)
    assert p.returncode == 0
    assert b"dormantctl: health" in seen and b"in flight" in seen
    assert p.stdout.splitlines()[-1] == "1 endpoint: 1 ok, 0 failed"
