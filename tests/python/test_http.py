# SPDX-License-Identifier: MIT
"""serve(): the embedded HTTP server, driven with urllib as an orchestrator
would."""
import errno
import threading
import urllib.error
import urllib.request

import pytest

from conftest import MiB, http

import dormant


def test_serve_handle(mgr, server):
    assert server.port > 0
    assert server.url == f"http://127.0.0.1:{server.port}"
    assert server.running
    assert "running" in repr(server)
    r = http("GET", server.url + "/healthz")
    assert r.status == 200
    assert r.json == {"status": "ok"}


def test_sleep_wake_stats_over_http(mgr, server):
    mgr.set_policy("grads", "discard")
    w = mgr.alloc("weights", 4 * MiB)
    mgr.alloc("grads", 4 * MiB)
    mgr.copy_to_device(w, b"\xa5" * (4 * MiB))

    r = http("POST", server.url + "/sleep", {"tags": ["grads"]})
    assert r.status == 200, r
    assert r.json["action"] == "sleep"
    assert [t["tag"] for t in r.json["tags"]] == ["grads"]
    assert r.json["state"] == "mixed"
    assert http("GET", server.url + "/is_sleeping").json == {"is_sleeping": True}

    r = http("POST", server.url + "/sleep")
    assert r.status == 200, r
    stats = http("GET", server.url + "/stats").json
    tags = {t["tag"]: t for t in stats["tags"]}
    assert stats["state"] == "asleep"
    assert tags["grads"]["host_bytes"] == 0
    assert tags["weights"]["host_bytes"] >= 4 * MiB
    # The same document as the Python API gives.
    py = mgr.stats()
    assert py["tags"] == stats["tags"]

    r = http("POST", server.url + "/wake")
    assert r.status == 200, r
    assert r.json["state"] == "awake"
    assert http("GET", server.url + "/is_sleeping").json == {"is_sleeping": False}
    assert mgr.copy_to_host(w, 4 * MiB) == b"\xa5" * (4 * MiB)


def test_unknown_tag_over_http(mgr, server):
    mgr.alloc("weights", MiB)
    r = http("POST", server.url + "/sleep", {"tags": ["nope"]})
    assert r.status == 404, r
    assert r.json["type"].endswith("unknown-tag")
    assert "nope" in r.json["detail"]


def test_wake_out_of_memory_over_http(mgr, server):
    w = mgr.alloc("weights", 32 * MiB)
    mgr.copy_to_device(w, b"\x42" * (32 * MiB))
    assert http("POST", server.url + "/sleep").status == 200
    free = mgr.stats()["devices"][0]["free_bytes"]
    mgr.debug_occupy(free - 4 * MiB)
    r = http("POST", server.url + "/wake")
    assert r.status == 503, r
    assert r.json["type"].endswith("out-of-memory")
    assert r.headers.get("Retry-After")
    assert mgr.stats()["state"] == "asleep"
    mgr.debug_occupy(0)
    r = http("POST", server.url + "/wake")
    assert r.status == 200, r
    assert mgr.copy_to_host(w, 32 * MiB) == b"\x42" * (32 * MiB)


def test_busy_over_http(mgr, server):
    mgr.alloc("w", MiB)
    in_step, leave_step = threading.Event(), threading.Event()

    def trainer():
        with mgr.step():
            in_step.set()
            leave_step.wait(60)

    t = threading.Thread(target=trainer)
    t.start()
    assert in_step.wait(30)
    first = {}
    o = threading.Thread(target=lambda: first.update(r=http("POST", server.url + "/sleep")))
    o.start()
    for _ in range(2000):
        if mgr.stats()["transition_running"]:
            break
        threading.Event().wait(0.005)
    r = http("POST", server.url + "/sleep")
    assert r.status == 409, r
    assert r.json["type"].endswith("busy")
    leave_step.set()
    t.join(30)
    o.join(30)
    assert first["r"].status == 200
    mgr.wake()


def test_token(mgr):
    with mgr.serve(token="s3cret", quiet=True) as s:
        assert http("POST", s.url + "/sleep").status == 401
        assert http("POST", s.url + "/sleep", token="wrong").status == 401
        assert http("GET", s.url + "/stats", token="s3cret").status == 200
    assert not s.running


def test_stop_closes_the_port(mgr):
    s = mgr.serve(quiet=True)
    url = s.url
    assert http("GET", url + "/healthz").status == 200
    s.stop()
    s.stop()  # idempotent
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/healthz", timeout=10)


def test_address_in_use(mgr, server):
    with pytest.raises(dormant.AddressInUseError) as e:
        mgr.serve(port=server.port, quiet=True)
    assert e.value.errno == errno.EADDRINUSE


def test_close_stops_servers():
    m = dormant.Manager(backend="host", host_device_bytes=64 * MiB)
    s = m.serve(quiet=True)
    m.close()
    assert not s.running


def test_stats_extra(mgr):
    progress = {"steps": 0}
    with mgr.serve(quiet=True, stats_extra=lambda: dict(progress)) as s:
        progress["steps"] = 41
        extra = http("GET", s.url + "/stats").json["extra"]
        # beside the process's NCCL communicators (dormant.nccl)
        assert extra.pop("nccl")["mode"] == "auto" and extra == {"steps": 41}


def test_serve_limits_and_faults(mgr):
    """serve()'s keywords reach the C options: a bad limit is refused, the
    fault switch makes the next wake fail once (503), nothing lost."""
    with pytest.raises(dormant.InvalidArgumentError, match="max_connections_per_ip"):
        mgr.serve(quiet=True, max_connections=4, max_connections_per_ip=5)
    with pytest.raises(dormant.InvalidArgumentError, match="fault rule"):
        mgr.serve(quiet=True, faults="wake:bogus")
    mgr.alloc("weights", MiB)
    with mgr.serve(quiet=True, max_connections=8, max_connections_per_ip=4,
                   request_timeout_s=5, faults="wake:create") as s:
        assert http("POST", s.url + "/sleep").status == 200
        assert http("POST", s.url + "/wake").status == 503
        assert http("POST", s.url + "/wake").status == 200


def test_serve_publishes_a_discovery_record(mgr, tmp_path):
    from dormant.client import Client, discover

    run = tmp_path / "run"
    mgr.alloc("weights", 4 * MiB)
    s = mgr.serve(port=0, publish=str(run), role="actor", quiet=True)
    try:
        (rec,) = discover(run)
        assert (rec.url, rec.port, rec.role) == (s.url, s.port, "actor")
        assert [r.state for r in Client.discover(run, retries=0).sleep()] == ["asleep"]
        assert mgr.stats()["state"] == "asleep"
    finally:
        s.stop()
    assert discover(run) == []  # a clean stop removed it
    with pytest.raises(dormant.InvalidArgumentError, match="role"):
        mgr.serve(port=0, publish=str(run), role="not a role", quiet=True)
    assert not mgr._servers  # the refused server was stopped


def test_client_sleep_sends_the_residue_in_the_body():
    from dormant.client import Client
    assert Client._request("sleep", None, "checkpoint") == (
        "POST", "/sleep", b'{"residue": "checkpoint"}')
    assert Client._request("sleep", ["weights"], "keep") == (
        "POST", "/sleep", b'{"tags": ["weights"], "residue": "keep"}')
    assert Client._request("sleep", None) == ("POST", "/sleep", b"")
    for action, residue in (("wake", "checkpoint"), ("sleep", "later")):
        with pytest.raises(ValueError):
            Client._request(action, None, residue)
