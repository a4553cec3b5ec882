# SPDX-License-Identifier: MIT
"""serve() passes each server option to the library's own table
(dormant_server_options_set, server/server_options.c): names and values are checked
there, and Python keeps no mirror of struct dormant_server_options."""
import inspect
import logging

import pytest

from conftest import http

import dormant
from dormant import _library
from dormant.client import Client
from dormant.errors import InvalidArgumentError
from dormant.manager import Manager


def test_the_list_comes_from_the_library():
    by_name = {o["name"]: o for o in dormant.server_options()}
    # every keyword serve() has for a server option is a row of the table
    keywords = set(inspect.signature(Manager.serve).parameters) - {
        "self", "host", "port", "stats_extra", "publish", "role", "options"}
    assert keywords <= set(by_name), keywords - set(by_name)
    assert "listen" in by_name and "publish" in by_name
    assert by_name["token"]["env"] == "DORMANT_TOKEN"
    assert by_name["token_file"]["env"] == "DORMANT_TOKEN_FILE"
    # the fault switch is never armed from the environment (issue 25)
    assert by_name["faults"]["env"] is None
    assert by_name["insecure_no_auth"]["env"] == "DORMANT_INSECURE_NO_AUTH"
    assert by_name["publish"]["env"] == "DORMANT_PUBLISH"
    assert by_name["threads"]["type"] == "int" and by_name["threads"]["default"] == "4"
    assert by_name["quiet"]["type"] == "bool"
    assert all(o["doc"] for o in by_name.values())
    assert not hasattr(_library, "ServerOptions")


def test_the_keywords_reach_the_server(mgr):
    # token and open_probes are seen over HTTP; the limits must be accepted
    with mgr.serve(token="s3cret", open_probes=True, threads=2, max_connections=8,
                   max_connections_per_ip=4, connection_timeout_s=5, request_timeout_s=5,
                   quiet=True, faults="") as s:
        assert http("GET", s.url + "/stats").status == 401
        assert http("GET", s.url + "/stats", token="s3cret").status == 200
        assert http("GET", s.url + "/healthz").status == 200
    # 0 still means the default, as before the options had names
    with mgr.serve(threads=0, max_connections=0, request_timeout_s=0, quiet=True) as s:
        assert http("GET", s.url + "/stats").status == 200


def test_other_options_by_name(mgr, tmp_path):
    path = str(tmp_path / "s.sock")
    with mgr.serve(**{"unix_path": path, "quiet": "yes"}) as s:
        assert s.url == f"unix:{path}"
    # an option serve() has no keyword for goes by name too, and wins over
    # host and port
    with mgr.serve(quiet=True, listen="127.0.0.1:0") as s:
        assert s.port > 0


def test_faults_reach_the_server(mgr):
    mgr.alloc("weights", 1 << 20)
    with mgr.serve(quiet=True, faults="wake:create") as s:
        assert http("POST", s.url + "/sleep").status == 200
        assert http("POST", s.url + "/wake").status >= 500


@pytest.mark.parametrize("kwargs, words", [
    ({"threads": 1000}, ["threads", "1000"]),
    ({"request_timeout_s": -1}, ["request_timeout_s", "-1"]),
    ({"treads": 2}, ["treads", "options: listen"]),
    ({"faults": "wake:nonsense"}, ["faults", "nonsense"]),
    ({"token": "has space"}, ["token"]),
    ({"open_probes": "perhaps"}, ["open_probes", "perhaps"]),
    ({"threads": 8, "max_connections": 4}, ["max_connections", "threads"]),
    ({"port": 70000}, ["listen", "70000"]),
])
def test_a_bad_option_is_named(mgr, kwargs, words):
    with pytest.raises(dormant.InvalidArgumentError) as e:
        mgr.serve(quiet=True, **kwargs)
    for word in words:
        assert word in str(e.value), (word, str(e.value))
    assert not mgr._servers


def test_serve_never_reads_faults_from_the_environment(mgr, monkeypatch):
    monkeypatch.setenv("DORMANT_FAULTS", "wake:create")
    mgr.alloc("weights", 1 << 20)
    with mgr.serve(quiet=True) as s:
        assert http("POST", s.url + "/sleep").status == 200
        assert http("POST", s.url + "/wake").status == 200
        c = Client([s.url], timeout=10, retries=0)
        assert c.stats()[0].body["faults"] == {"armed": False, "rules": None}


def test_serve_beyond_loopback_needs_a_token_or_insecure_no_auth(mgr, monkeypatch):
    monkeypatch.delenv("DORMANT_TOKEN", raising=False)
    monkeypatch.delenv("DORMANT_TOKEN_FILE", raising=False)
    monkeypatch.delenv("DORMANT_INSECURE_NO_AUTH", raising=False)
    with pytest.raises(InvalidArgumentError, match="without a token"):
        mgr.serve("0.0.0.0", quiet=True)
    with mgr.serve("0.0.0.0", quiet=True, insecure_no_auth=True) as s:
        assert s.port > 0
    with pytest.raises(InvalidArgumentError, match="placeholder"):
        mgr.serve("0.0.0.0", quiet=True, token="REPLACE-ME-openssl-rand-hex-32")


def test_the_server_logs_through_logging_and_never_prints(mgr, caplog, capfd):
    caplog.set_level(logging.INFO, logger="dormant.server")
    capfd.readouterr()
    with mgr.serve(faults="wake:create") as s:
        assert http("GET", s.url + "/healthz").status == 200
    with mgr.serve(quiet=True) as s:
        assert http("GET", s.url + "/readyz").status == 200
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "dormant.server"]
    assert (logging.WARNING, "fault injection armed (a test tool): wake:create") in lines, lines
    assert any(level == logging.INFO and m.startswith("GET /healthz 200 ") and m.endswith(" ms")
               for level, m in lines), lines
    # quiet: no access log
    assert not any("/readyz" in m for _, m in lines), lines
    printed = capfd.readouterr()
    assert "healthz" not in printed.err and "fault injection" not in printed.err, printed.err
