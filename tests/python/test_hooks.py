# SPDX-License-Identifier: MIT
"""Python hooks: order, the thread they run on (an HTTP server thread when
the transition came over HTTP), and exceptions (logged; a before-hook's
exception cancels the transition)."""
import logging
import threading

import pytest

from conftest import MiB, http

import dormant


def test_hooks_run_in_order(mgr):
    mgr.alloc("w", MiB)
    calls = []
    mgr.on_sleep(lambda: calls.append("before_sleep"))
    mgr.on_sleep(lambda: calls.append("after_sleep"), when="after")
    mgr.on_wake(lambda: calls.append("before_wake"), when="before")
    mgr.on_wake(lambda: calls.append("after_wake"))
    mgr.sleep()
    mgr.wake()
    assert calls == ["before_sleep", "after_sleep", "before_wake", "after_wake"]
    mgr.wake()  # a no-op runs no hooks
    assert len(calls) == 4


def test_hook_decorator_and_remove(mgr):
    mgr.alloc("w", MiB)
    calls = []

    @mgr.on_sleep
    def note():
        calls.append("sleep")

    mgr.sleep()
    mgr.wake()
    mgr.remove_hook(note)
    mgr.sleep()
    mgr.wake()
    assert calls == ["sleep"]
    with pytest.raises(dormant.UnknownTagError):
        mgr.remove_hook(note)
    hook_id = mgr.add_hook("after_wake", lambda: calls.append("id"))
    assert hook_id > 0
    mgr.remove_hook(hook_id)
    with pytest.raises(dormant.InvalidArgumentError):
        mgr.add_hook("during_sleep", lambda: None)


def test_hook_on_http_server_thread(mgr, server):
    mgr.alloc("w", MiB)
    seen = {}

    def before_sleep():
        seen["thread"] = threading.get_ident()
        seen["stats"] = mgr.stats()["transition_running"]  # calling back in is fine

    mgr.on_sleep(before_sleep)
    r = http("POST", server.url + "/sleep")
    assert r.status == 200, r
    assert seen["thread"] != threading.get_ident()
    assert seen["stats"] is True
    r = http("POST", server.url + "/wake")
    assert r.status == 200, r


def test_before_hook_exception_cancels(mgr, caplog):
    w = mgr.alloc("w", MiB)
    mgr.copy_to_device(w, b"\x33" * MiB)

    class Refused(Exception):
        pass

    def refuse():
        raise Refused("NCCL teardown failed")

    mgr.on_sleep(refuse)
    with caplog.at_level(logging.ERROR, logger="dormant"):
        with pytest.raises(dormant.CancelledError) as e:
            mgr.sleep()
    assert isinstance(e.value.__cause__, Refused)
    assert e.value.report["state"] == "awake"
    assert mgr.copy_to_host(w, MiB) == b"\x33" * MiB
    assert any("NCCL teardown failed" in r.getMessage() or
               (r.exc_info and "NCCL teardown failed" in str(r.exc_info[1]))
               for r in caplog.records)


def test_before_hook_exception_over_http(mgr, server, caplog):
    mgr.alloc("w", MiB)
    mgr.on_sleep(lambda: 1 / 0)
    with caplog.at_level(logging.ERROR, logger="dormant"):
        r = http("POST", server.url + "/sleep")
    assert r.status == 409, r
    assert r.json["type"].endswith("cancelled")
    assert r.json["status"] == r.status
    assert "hook" in r.json["detail"]
    assert r.json["report"]["state"] == "awake"
    assert mgr.stats()["state"] == "awake"
    assert any(r.exc_info and r.exc_info[0] is ZeroDivisionError for r in caplog.records)


def test_after_hook_exception_is_logged_not_fatal(mgr, caplog):
    mgr.alloc("w", MiB)
    mgr.on_wake(lambda: {}["missing"])
    mgr.sleep()
    with caplog.at_level(logging.ERROR, logger="dormant"):
        report = mgr.wake()
    assert report["state"] == "awake"
    assert any(r.exc_info and r.exc_info[0] is KeyError for r in caplog.records)


def test_hook_cannot_start_a_transition(mgr):
    mgr.alloc("w", MiB)
    errors = []

    def nested():
        try:
            mgr.wake()
        except dormant.BusyError as e:
            errors.append(e)
        try:
            with mgr.step(timeout_s=0):
                pass
        except dormant.BusyError as e:
            errors.append(e)

    mgr.on_sleep(nested)
    mgr.sleep()
    assert len(errors) == 2
    mgr.wake()


def test_hooks_survive_garbage_collection(mgr):
    import gc
    mgr.alloc("w", MiB)
    calls = []

    def add():
        mgr.on_sleep(lambda: calls.append(1))  # nobody else keeps the lambda

    add()
    gc.collect()
    mgr.sleep()
    mgr.wake()
    assert calls == [1]
