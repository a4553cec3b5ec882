# SPDX-License-Identifier: MIT
"""Collective calls under a deadline.

ncclCommSuspend and ncclCommResume are collective: each waits in a bootstrap
barrier for every rank of the communicator. A rank whose peers do not
follow would wait there for ever, so each call runs on a thread of its own
and the hook waits for it up to a deadline. A call past its deadline cannot
be cancelled (NCCL has no way to leave the barrier but to abort the
communicator); it is left to finish when the peers arrive, and on_late()
says how it ended.
"""
import threading


class CommTimeout(TimeoutError):
    """A collective call on a communicator did not finish before its deadline."""


class Call:
    """fn() run on a thread; wait(timeout_s) returns its result or raises
    its exception, or CommTimeout (the call goes on; on_late(result, error)
    runs when it ends)."""

    def __init__(self, fn, name, on_late=None):
        self._fn = fn
        self._on_late = on_late
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._late = False
        self._result = None
        self._error = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            self._result = self._fn()
        except BaseException as e:  # handed to the waiter
            self._error = e
        with self._lock:
            self._done.set()
            late = self._late
        if late and self._on_late is not None:
            try:
                self._on_late(self._result, self._error)
            except Exception:
                pass

    def wait(self, timeout_s, what):
        if not self._done.wait(timeout_s):
            with self._lock:
                if not self._done.is_set():
                    self._late = True
                    raise CommTimeout(what)
        if self._error is not None:
            raise self._error
        return self._result


def call(fn, timeout_s, what, name="dormant-nccl", on_late=None):
    """Run fn() with a deadline of timeout_s seconds (None: none); what names
    the call in the CommTimeout's message."""
    return Call(fn, name, on_late).wait(timeout_s, what)
