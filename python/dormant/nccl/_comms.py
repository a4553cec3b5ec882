# SPDX-License-Identifier: MIT
"""One manager's communicators: the hooks, the mode, the counts.

Every dormant.Manager made from Python has one (Manager(nccl=...),
$DORMANT_NCCL): mode "auto" suspends (_suspend.py), "rebuild" destroys and
makes the groups again (_rebuild.py), "off" does nothing. Its stats() is
GET /stats's "nccl" (under "extra") and its metrics() the dormant_comm_*
lines of GET /metrics, both given to the server by Manager.serve().
"""
import logging
import os
import threading
import time

from . import _calls, _rebuild, _suspend

log = logging.getLogger("dormant")

MODES = ("auto", "rebuild", "off")
DEFAULT_TIMEOUT_S = 120.0


def mode_from(value):
    mode = os.environ.get("DORMANT_NCCL", "auto") if value is None else value
    mode = str(mode).strip().lower()
    if mode not in MODES:
        raise ValueError(f"nccl must be one of {', '.join(MODES)}, not {mode!r} "
                         "(DORMANT_NCCL)")
    return mode


def timeout_from(value):
    if value is None:
        value = os.environ.get("DORMANT_NCCL_TIMEOUT_S", DEFAULT_TIMEOUT_S)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"nccl_timeout_s must be a number of seconds, not {value!r} "
                         "(DORMANT_NCCL_TIMEOUT_S)") from None
    if not seconds > 0:
        raise ValueError(f"nccl_timeout_s must be more than 0, not {value!r}")
    return seconds


def _phase():
    return {"count": 0, "bytes": None, "seconds": None, "error": None}


class Communicators:
    """The NCCL side of one manager's sleeps and wakes. Thread-safe."""

    def __init__(self, manager, mode=None, timeout_s=None, *, dist=None, torch=None,
                 libnccl=None):
        self.mode = mode_from(mode)
        self.timeout_s = timeout_from(timeout_s)
        self._manager = manager
        self._lock = threading.Lock()
        self._suspender = _suspend.Suspender(self.timeout_s, dist, torch, libnccl)
        self._rebuilder = _rebuild.Rebuilder(self.timeout_s, dist, torch)
        self._counts = {"sleeps": 0, "wakes": 0, "failures": 0, "bytes_released_total": 0,
                        "bytes_restored_total": 0, "suspend_s_total": 0.0,
                        "resume_s_total": 0.0}
        self._last = {"sleep": _phase(), "wake": _phase()}
        self._hook_ids = []
        self._no_hooks = None
        if self.mode != "off":
            try:
                self._hook_ids.append(manager.add_hook("after_copies", self._after_copies))
                self._hook_ids.append(manager.add_hook("before_rebuild",
                                                       self._before_rebuild))
            except Exception as e:  # a libdormant older than these hook points
                self.close()
                self._no_hooks = f"this libdormant has no after-copies hooks ({e})"
                log.warning("dormant: NCCL communicators stay resident while asleep: %s",
                            self._no_hooks)

    def close(self):
        for hook_id in self._hook_ids:
            try:
                self._manager.remove_hook(hook_id)
            except Exception:
                pass
        self._hook_ids = []

    # ---- the hooks ----------------------------------------------------------

    def _after_copies(self):
        self._run("sleep", self._suspender.suspend_all if self.mode == "auto"
                  else self._destroy)

    def _before_rebuild(self):
        self._run("wake", self._suspender.resume_all if self.mode == "auto"
                  else self._recreate)

    def _destroy(self):
        free = self._suspender._free_bytes()
        count = self._rebuilder.destroy_all()
        after = self._suspender._free_bytes()
        return count, (None if free is None or after is None else max(0, after - free))

    def _recreate(self):
        free = self._suspender._free_bytes()
        count = self._rebuilder.recreate_all()
        after = self._suspender._free_bytes()
        return count, (None if free is None or after is None else max(0, free - after))

    def _run(self, kind, work):
        start = time.monotonic()
        error = None
        count, nbytes = 0, None
        try:
            count, nbytes = work()
        except _calls.CommTimeout as e:
            error = e
        except Exception as e:
            error = e
        seconds = time.monotonic() - start
        with self._lock:
            last = self._last[kind] = _phase()
            last.update(count=count, bytes=nbytes, seconds=seconds)
            self._counts["sleeps" if kind == "sleep" else "wakes"] += 1
            self._counts["suspend_s_total" if kind == "sleep" else "resume_s_total"] += seconds
            if nbytes:
                self._counts["bytes_released_total" if kind == "sleep"
                             else "bytes_restored_total"] += nbytes
            if error is not None:
                self._counts["failures"] += 1
                last["error"] = str(error)
        if error is not None:
            log.error("dormant: %s: %s", "suspending NCCL communicators" if kind == "sleep"
                      else "resuming NCCL communicators", error)
            raise error

    # ---- what is shown --------------------------------------------------------

    def status(self):
        """(suspend, reason): "off", "rebuild", "available", "unavailable"
        (with the reason) or "none" (no NCCL communicator seen yet)."""
        if self.mode == "off":
            return "off", "DORMANT_NCCL=off"
        if self._no_hooks:
            return "unavailable", self._no_hooks
        if self.mode == "rebuild":
            return "rebuild", None
        s = self._suspender
        if s.way is None and not s.reason:
            s.probe()
        if s.reason:
            return "unavailable", s.reason
        if s.way is None:
            return "none", None
        return "available", None

    def stats(self):
        """A dict: GET /stats's extra.nccl."""
        suspend, reason = self.status()
        with self._lock:
            out = {"mode": self.mode, "suspend": suspend, "timeout_s": self.timeout_s}
            if reason:
                out["reason"] = reason
            out.update(self._counts)
            out["last_sleep"] = dict(self._last["sleep"])
            out["last_wake"] = dict(self._last["wake"])
        if self.mode == "auto":
            lib = self._suspender._libnccl
            if lib:
                out["version"] = lib.version_text
                out["library"] = lib.path
            if self._suspender.way:
                out["way"] = self._suspender.way
            out["communicators"] = self._suspender.communicators()
        elif self.mode == "rebuild":
            r = self._rebuilder
            out.update(rebuilds=r.rebuilds, groups_destroyed=r.groups_destroyed,
                       references_rebound=r.rebound, references_left=r.references_left)
        return out

    def metrics(self):
        """Prometheus text: the dormant_comm_* families."""
        suspend, reason = self.status()
        with self._lock:
            counts = dict(self._counts)
            last = self._last["sleep"]["bytes"] or 0
        lines = []

        def family(name, kind, doc, samples):
            lines.append(f"# HELP {name} {doc}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{labels} {value}" for labels, value in samples)

        why = (reason or "").replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
        family("dormant_comm_suspend_available", "gauge",
               "1 when NCCL communicators are suspended while asleep (mode auto, NCCL 2.29.7+, "
               "cuMem); 0 with the reason",
               [(f'{{mode="{self.mode}",reason="{why}"}}',
                 1 if suspend in ("available", "none") else 0)])
        if self.mode == "auto":
            states = self._suspender.state_counts()
            family("dormant_comm_communicators", "gauge",
                   "NCCL communicators of the process by state",
                   [(f'{{state="{k}"}}', v) for k, v in sorted(states.items())])
        family("dormant_comm_bytes_total", "counter",
               "NCCL device bytes released by sleeps and restored by wakes",
               [('{direction="released"}', counts["bytes_released_total"]),
                ('{direction="restored"}', counts["bytes_restored_total"])])
        family("dormant_comm_last_sleep_bytes", "gauge",
               "NCCL device bytes the last sleep released", [("", last)])
        family("dormant_comm_seconds_total", "counter",
               "seconds spent suspending (sleep) and resuming (wake) communicators",
               [('{kind="sleep"}', f'{counts["suspend_s_total"]:.6f}'),
                ('{kind="wake"}', f'{counts["resume_s_total"]:.6f}')])
        family("dormant_comm_failures_total", "counter",
               "sleeps and wakes whose communicator step failed (deadline, NCCL error)",
               [("", counts["failures"])])
        return "\n".join(lines) + "\n"
