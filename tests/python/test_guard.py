# SPDX-License-Identifier: MIT
"""The trainer guard: a step waits while the memory is asleep, and a sleep
waits for the running step. No wall-clock assertions: the checks look at
states and events, and a wait that would pass by being slow cannot make a
correct guard fail."""
import threading
import time

import pytest

from conftest import MiB

import dormant


def wait_until(predicate, what, tries=2000):
    """Poll predicate (each poll sleeps 5 ms) until it holds."""
    ev = threading.Event()
    for _ in range(tries):
        if predicate():
            return
        ev.wait(0.005)
    raise AssertionError(f"never happened: {what}")


def test_step_waits_while_asleep(mgr):
    mgr.alloc("w", MiB)
    mgr.sleep()
    with pytest.raises(dormant.StepTimeoutError):
        with mgr.step(timeout_s=0):
            pass
    entered = threading.Event()

    def trainer():
        with mgr.step():
            entered.set()

    t = threading.Thread(target=trainer)
    t.start()
    # While asleep the step must not start (a broken guard lets it in at once).
    assert not entered.wait(0.3)
    assert mgr.stats()["steps_running"] == 0
    mgr.wake()
    assert entered.wait(30)
    t.join(30)
    assert not t.is_alive()


def test_sleep_waits_for_running_step(mgr):
    w = mgr.alloc("w", MiB)
    mgr.copy_to_device(w, b"\x5a" * MiB)
    in_step, leave_step = threading.Event(), threading.Event()
    results = {}

    def trainer():
        with mgr.step():
            in_step.set()
            leave_step.wait(60)
            # Still inside the step: the memory must still be there.
            results["data"] = mgr.copy_to_host(w, MiB)
            # Hold the step a while longer after the sleep started: the
            # sleep's guard wait must cover at least this much.
            start = time.monotonic()
            threading.Event().wait(0.2)
            results["held_s"] = time.monotonic() - start

    def orchestrator():
        results["report"] = mgr.sleep()

    t = threading.Thread(target=trainer)
    t.start()
    assert in_step.wait(30)
    o = threading.Thread(target=orchestrator)
    o.start()
    wait_until(lambda: mgr.stats()["transition_running"], "the sleep started")
    s = mgr.stats()
    assert s["steps_running"] == 1
    assert s["tags"][0]["state"] == "awake"  # the sleep waits for the step
    leave_step.set()
    t.join(30)
    o.join(30)
    assert results["data"] == b"\x5a" * MiB
    assert results["report"]["state"] == "asleep"
    # Any sleep reports some guard wait; this one waited for the step (half of
    # the hold: the sleep may have reached the guard a little after it began).
    assert results["report"]["guard_wait_s"] >= results["held_s"] / 2
    mgr.wake()


def test_new_steps_wait_for_a_pending_sleep(mgr):
    """While a sleep waits for the running step, new steps must not enter."""
    mgr.alloc("w", MiB)
    in_step, leave_step = threading.Event(), threading.Event()
    second_entered = threading.Event()

    def first():
        with mgr.step():
            in_step.set()
            leave_step.wait(60)

    def second():
        with mgr.step():
            second_entered.set()

    t1 = threading.Thread(target=first)
    t1.start()
    assert in_step.wait(30)
    o = threading.Thread(target=mgr.sleep)
    o.start()
    wait_until(lambda: mgr.stats()["transition_running"], "the sleep started")
    t2 = threading.Thread(target=second)
    t2.start()
    assert not second_entered.wait(0.3)
    leave_step.set()
    o.join(30)
    assert mgr.stats()["state"] == "asleep"
    assert not second_entered.is_set()
    mgr.wake()
    assert second_entered.wait(30)
    t1.join(30)
    t2.join(30)


def test_guard_timeout_makes_sleep_busy():
    with dormant.Manager(backend="host", host_device_bytes=64 * MiB,
                         guard_timeout_ms=50) as m:
        w = m.alloc("w", MiB)
        m.copy_to_device(w, b"\x11" * MiB)
        with m.step():
            with pytest.raises(dormant.BusyError) as e:
                m.sleep()
            assert "step" in e.value.message
            assert m.stats()["state"] == "awake"
            assert m.copy_to_host(w, MiB) == b"\x11" * MiB
        m.sleep()  # no step now: fine
        m.wake()


def test_second_transition_is_busy(mgr):
    mgr.alloc("w", MiB)
    in_step, leave_step = threading.Event(), threading.Event()

    def trainer():
        with mgr.step():
            in_step.set()
            leave_step.wait(60)

    t = threading.Thread(target=trainer)
    t.start()
    assert in_step.wait(30)
    o = threading.Thread(target=mgr.sleep)
    o.start()
    wait_until(lambda: mgr.stats()["transition_running"], "the sleep started")
    with pytest.raises(dormant.BusyError) as e:
        mgr.wake()
    assert e.value.report is None or e.value.report["result"] != "ok"
    assert mgr.stats()["counters"]["busy_rejections"] >= 1
    leave_step.set()
    t.join(30)
    o.join(30)
    mgr.wake()


def test_step_is_a_decorator(mgr):
    calls = []

    @mgr.step()
    def train():
        calls.append(mgr.stats()["steps_running"])

    train()
    train()
    assert calls == [1, 1]
    assert mgr.stats()["steps_running"] == 0


def test_step_leaves_the_guard_when_the_step_raises():
    """An exception inside a step must leave the guard too: else the next
    sleep waits for a step that ended long ago and fails busy."""
    with dormant.Manager(backend="host", host_device_bytes=64 * MiB,
                         guard_timeout_ms=200) as m:
        w = m.alloc("w", MiB)
        m.copy_to_device(w, b"\x22" * MiB)

        class Boom(Exception):
            pass

        with pytest.raises(Boom):
            with m.step():
                raise Boom()
        assert m.stats()["steps_running"] == 0

        @m.step()
        def train():
            raise Boom()

        with pytest.raises(Boom):
            train()
        assert m.stats()["steps_running"] == 0
        assert m.sleep()["state"] == "asleep"  # no step holds the guard
        m.wake()
        assert m.copy_to_host(w, MiB) == b"\x22" * MiB
