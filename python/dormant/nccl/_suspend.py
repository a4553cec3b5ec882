# SPDX-License-Identifier: MIT
"""Suspend every NCCL communicator of the process while dormant sleeps.

After a sleep's copies (the manager's after_copies hook) every process group
with an NCCL communicator is suspended; before a wake's rebuild callbacks
(before_rebuild) they are resumed, in the same order on every rank (the
order c10d made them). Through PyTorch's backend.suspend()/resume() where
the backend has them (PyTorch 2.12 built against NCCL 2.29.7 or later), else
through the loaded libnccl's ncclCommSuspend/ncclCommResume on
backend._comm_ptr() (0: the group has made no communicator yet, nothing to
release).

Every call has a deadline (timeout_s): past it the transition fails with an
error naming the communicator, and what this sleep suspended is resumed, so
the rank stays usable. A communicator NCCL refuses (it shares resources
with another through a split) is left as it is and named in stats().
"""
import logging
import os
import threading

from . import _calls, _discover, _group, _libnccl

log = logging.getLogger("dormant")

_INVALID_ARGUMENT, _INVALID_USAGE = 4, 5  # ncclResult_t: what NCCL refuses with


class Unavailable(Exception):
    """Suspend cannot work in this process; str() says why."""


class Suspender:
    """The after_copies/before_rebuild work of mode "auto" (see the module's
    doc). Not thread-safe by itself: the manager runs one transition at a
    time, and stats() reads under the owner's lock."""

    def __init__(self, timeout_s, dist=None, torch=None, libnccl=None):
        self.timeout_s = timeout_s
        self._dist = dist
        self._torch = torch
        self._libnccl = libnccl         # a LibNccl, or None: opened on first use
        self._lock = threading.Lock()
        self._suspended = []            # (Group, way, bytes or None), in suspend order
        self._refused = {}              # group name -> why
        self._stuck = {}                # group name -> "suspend" / "resume" past its deadline
        self.way = None
        self.reason = None              # why suspend is unavailable, or None
        self._logged_reason = None

    # ---- what the hooks call ----------------------------------------------

    def suspend_all(self):
        """Suspend every communicator; returns (count, bytes or None). On a
        failure resumes what it suspended and raises."""
        groups = _discover.nccl_groups(self._dist, self._torch)
        if not groups:
            return 0, 0
        try:
            self._check_available(groups)
        except Unavailable as why:
            self._unavailable(str(why))
            return 0, None
        self.reason = None
        free_before = self._free_bytes()
        done, counted = [], []
        managed = _group.managed_ids()
        for group in groups:
            if group.name in self._refused or group.name in self._stuck or \
                    id(group.pg) in managed:
                continue
            if any(g.name == group.name for g, _, _ in self._suspended):
                continue  # still suspended: a sleep after a failed wake
            way = self._way_of(group)
            comm = self._comm_of(group, way)
            if way == "libnccl" and not comm:
                continue  # no communicator made yet: nothing to release
            try:
                released = self._released_bytes(group, way, comm)
                _calls.call(lambda: self._suspend_one(group, way, comm), self.timeout_s,
                            self._late_message("suspend", group),
                            name="dormant-nccl-suspend",
                            on_late=lambda r, e, g=group, w=way: self._late_suspend(g, w, e))
            except _calls.CommTimeout as e:
                self._stuck[group.name] = "suspend"
                self._undo(done)
                raise _calls.CommTimeout(str(e)) from None
            except Exception as e:
                if self._refusal(e):
                    self._refused[group.name] = f"NCCL refused to suspend it: {e}"
                    log.warning("dormant: NCCL communicator %s stays resident: %s",
                                group.label, self._refused[group.name])
                    continue
                self._undo(done)
                raise RuntimeError(f"suspending NCCL communicator {group.label} failed: "
                                   f"{e}") from e
            entry = (group, way, released)
            done.append(entry)
            counted.append(released)
            with self._lock:
                self._suspended.append(entry)
        return len(done), self._bytes(counted, free_before, self._free_bytes())

    def resume_all(self):
        """Resume what is suspended, in the order it was suspended; returns
        (count, bytes or None). A failure raises; what was resumed stays so,
        the rest is resumed by the next wake."""
        with self._lock:
            pending = list(self._suspended)
        free_before = self._free_bytes()
        counted = []
        for entry in pending:
            group, way, released = entry
            comm = self._comm_of(group, way)
            try:
                _calls.call(lambda: self._resume_one(group, way, comm), self.timeout_s,
                            self._late_message("resume", group),
                            name="dormant-nccl-resume",
                            on_late=lambda r, e, g=group: self._late_resume(g, e))
            except _calls.CommTimeout as e:
                self._stuck[group.name] = "resume"
                with self._lock:
                    self._suspended.remove(entry)
                raise _calls.CommTimeout(str(e)) from None
            except Exception as e:
                raise RuntimeError(f"resuming NCCL communicator {group.label} failed: "
                                   f"{e}") from e
            with self._lock:
                self._suspended.remove(entry)
            counted.append(released)
        used = self._free_bytes()
        measured = None if free_before is None or used is None else free_before - used
        return len(counted), (sum(counted) if counted and None not in counted
                              else (max(0, measured) if measured is not None else None))

    def probe(self):
        """Find out, without suspending, whether suspend can work here
        (sets .reason and .way; logs an unavailable reason once)."""
        groups = _discover.nccl_groups(self._dist, self._torch)
        if not groups:
            return
        try:
            self._check_available(groups)
            self.reason = None
        except Unavailable as why:
            self._unavailable(str(why))

    # ---- what stats() shows -------------------------------------------------

    def communicators(self):
        groups = _discover.nccl_groups(self._dist, self._torch)
        with self._lock:
            suspended = {g.name: released for g, _, released in self._suspended}
        rows = []
        for group in groups:
            row = {"name": group.name, "ranks": group.ranks}
            if group.name in self._stuck:
                row["state"] = "stuck"
                row["reason"] = f"its {self._stuck[group.name]} passed the deadline and " \
                                "waits for its peers"
            elif group.name in self._refused:
                row["state"] = "refused"
                row["reason"] = self._refused[group.name]
            elif group.name in suspended:
                row["state"] = "suspended"
                if suspended[group.name] is not None:
                    row["bytes"] = suspended[group.name]
            else:
                row["state"] = "active"
            rows.append(row)
        return rows

    def suspended_count(self):
        with self._lock:
            return len(self._suspended)

    def state_counts(self):
        counts = {"active": 0, "suspended": 0, "refused": 0, "stuck": 0}
        for row in self.communicators():
            counts[row["state"]] += 1
        return counts

    # ---- inside -------------------------------------------------------------

    def _lib(self):
        if self._libnccl is None:
            self._libnccl = _libnccl.LibNccl.open() or False
        return self._libnccl or None

    @staticmethod
    def _has_api(group):
        b = group.backend
        return b is not None and callable(getattr(b, "suspend", None)) and \
            callable(getattr(b, "resume", None))

    def _way_of(self, group):
        return "torch" if self._has_api(group) else "libnccl"

    def _check_available(self, groups):
        if os.environ.get("NCCL_CUMEM_ENABLE") == "0":
            raise Unavailable("NCCL_CUMEM_ENABLE=0: NCCL's buffers are not cuMem memory, "
                              "which is all a suspend can release")
        if all(self._has_api(g) for g in groups):
            self.way = "torch"
            return
        lib = self._lib()
        if lib is None:
            raise Unavailable("no libnccl is loaded and PyTorch's NCCL backend has no "
                              "suspend()")
        missing = lib.suspend_missing
        if missing:
            raise Unavailable(missing)
        self.way = "libnccl" if not any(self._has_api(g) for g in groups) else "torch+libnccl"

    def _unavailable(self, reason):
        self.reason = reason
        if self._logged_reason != reason:
            self._logged_reason = reason
            log.warning("dormant: NCCL communicators stay resident while asleep: %s "
                        "(DORMANT_NCCL=rebuild destroys and recreates the process groups "
                        "instead; docs/pytorch.md, \"NCCL memory\")", reason)

    @staticmethod
    def _comm_of(group, way):
        if way != "libnccl" or group.backend is None:
            return 0
        try:
            return int(group.backend._comm_ptr())
        except Exception:
            return 0

    def _suspend_one(self, group, way, comm):
        if way == "torch":
            group.backend.suspend()
        else:
            self._lib().suspend(comm)

    def _resume_one(self, group, way, comm):
        if way == "torch":
            group.backend.resume()
        else:
            self._lib().resume(comm)

    def _released_bytes(self, group, way, comm):
        """What a suspend of group releases, from NCCL's own count; None if
        it has none."""
        try:
            if way == "libnccl":
                lib = self._lib()
                return lib.mem_stat(comm, _libnccl.STAT_GPU_MEM_SUSPEND) \
                    if lib.has_mem_stats else None
            stats = getattr(group.backend, "memory_stats", None)
            value = stats() if callable(stats) else None
            if isinstance(value, dict):
                for key in ("gpu_mem_suspend", "suspendable", "GpuMemSuspend"):
                    if key in value:
                        return int(value[key])
            return None
        except Exception:
            return None

    def _free_bytes(self):
        cuda = getattr(self._torch or _discover.modules()[1], "cuda", None)
        try:
            return int(cuda.mem_get_info()[0])
        except Exception:
            return None

    @staticmethod
    def _bytes(counted, free_before, free_after):
        if counted and None not in counted:
            return sum(counted)
        if not counted:
            return 0
        if free_before is None or free_after is None:
            return None
        return max(0, free_after - free_before)

    @staticmethod
    def _refusal(error):
        result = getattr(error, "result", None)
        if result in (_INVALID_ARGUMENT, _INVALID_USAGE):
            return True
        text = str(error).lower()
        return "invalid usage" in text or "not supported with split" in text

    def _undo(self, done):
        """Resume what this sleep suspended, last first; every rank that
        got as far does the same, so these collectives meet."""
        for entry in reversed(done):
            group, way, _ = entry
            comm = self._comm_of(group, way)
            try:
                _calls.call(lambda: self._resume_one(group, way, comm), self.timeout_s,
                            self._late_message("resume", group), name="dormant-nccl-resume",
                            on_late=lambda r, e, g=group: self._late_resume(g, e))
            except _calls.CommTimeout:
                self._stuck[group.name] = "resume"
                log.error("dormant: resuming NCCL communicator %s after a failed suspend "
                          "passed its deadline", group.label)
            except Exception:
                log.error("dormant: resuming NCCL communicator %s after a failed suspend "
                          "failed", group.label, exc_info=True)
            with self._lock:
                if entry in self._suspended:
                    self._suspended.remove(entry)

    def _late_message(self, what, group):
        # short: it must fit an error message (DORMANT_ERROR_MAX) whole
        return (f"{what} of NCCL communicator {group.label} did not finish within "
                f"{self.timeout_s:g} s: its peers did not {what} with it (a group's ranks "
                f"sleep and wake together: Client.sleep_together)")

    def _late_suspend(self, group, way, error):
        """A suspend that passed its deadline ended: if it suspended, the
        next wake resumes it."""
        self._stuck.pop(group.name, None)
        if error is None:
            with self._lock:
                self._suspended.append((group, way, None))
            log.warning("dormant: NCCL communicator %s suspended late (its peers arrived); "
                        "the next wake resumes it", group.label)

    def _late_resume(self, group, error):
        self._stuck.pop(group.name, None)
        if error is not None:
            log.error("dormant: the late resume of NCCL communicator %s failed: %s",
                      group.label, error)
