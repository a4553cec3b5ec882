# SPDX-License-Identifier: MIT
"""release_on_sleep(): one process group's communicator released before each
sleep, opt-in (the process-wide suspend of _comms.py leaves such a group to it).

An NCCL communicator holds GPU memory of its own (buffers per channel and
peer, 0.1 to several GiB per rank) that no dormant region covers, so it stays
resident across a sleep. release_on_sleep(group) fixes that, opt-in:

    import dormant, dormant.nccl
    import torch.distributed as dist

    dist.init_process_group("nccl")              # no device_id: WORLD's comm stays lazy
    grads = dormant.nccl.release_on_sleep(dist.new_group(ranks))
    for batch in data:
        with dormant.step():
            group = grads.group                  # restored here after a wake (collective)
            ...
            dist.all_reduce(t, group=group)

- Before every sleep (a before-sleep hook, on whatever thread runs the sleep:
  an HTTP server thread too) it waits for the device, then either suspends
  the communicator (mode "suspend": the backend's suspend()/resume(), PyTorch
  builds whose ProcessGroupNCCL has them, over NCCL's ncclCommSuspend /
  ncclCommResume, NCCL 2.29.7 and later) or destroys the group (mode
  "rebuild": dist.destroy_process_group(group), which frees the
  communicator's memory).
- It restores nothing then: restoring is collective (every rank of the group
  takes part), and the ranks' wakes do not run in step. The next use of
  .group (or restore()) after a sleep restores it on the training thread,
  where every rank arrives in the same step: resume(), or a new group of the
  same ranks and backend (dist.new_group(), which every rank of WORLD calls,
  members or not: restore in the same order on every rank, as the groups
  were made), warmed up with one all_reduce of one element so that the
  communicator is made then, not in the first real collective.
- In mode "rebuild" the group object changes: read .group at the start of
  every step and keep no other reference (DDP and FSDP keep theirs: use them
  with mode "suspend", or rebuild the wrapper). Mode "suspend" keeps it.
- A release that fails is logged (the "dormant" logger) and the sleep goes
  on: the group is then restored (rebuilt) at its next use all the same. A
  restore that fails raises.
- stats() says what it did and what it cost (seconds to release and to
  restore, in all and the last time).

mode "auto" picks "suspend" where the backend has suspend() and resume(),
else "rebuild". torch and torch.distributed can be passed as torch= and
dist= (the tests use stand-ins); they are imported only when not passed.
"""
import logging
import threading
import time

log = logging.getLogger("dormant")

MODES = ("auto", "suspend", "rebuild")

# id() of the groups a live ReleasedGroup releases: the process-wide suspend
# (mode "auto" of every manager) leaves them to it.
_managed = {}
_managed_lock = threading.Lock()


def managed_ids():
    with _managed_lock:
        return set(_managed)


class ReleasedGroup:
    """A process group released before each sleep and restored at its next use.
    Made by release_on_sleep(); thread-safe."""

    def __init__(self, group, *, mode="auto", manager=None, dist=None, torch=None,
                 device=None, warmup=True):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if torch is None:
            import torch  # noqa: PLC0415 (torch only when used)
        if dist is None:
            import torch.distributed as dist  # noqa: PLC0415
        if manager is None:
            import dormant  # noqa: PLC0415
            manager = dormant.manager()
        self._dist = dist
        self._torch = torch
        self._manager = manager
        self._group = group
        self._ranks = list(dist.get_process_group_ranks(group))
        self._backend = str(dist.get_backend(group))
        # the CUDA device of an NCCL group (the current one); None: on the CPU
        if device is None and "nccl" in self._backend.lower():
            device = torch.cuda.current_device()
        self._device = device
        self._warmup = warmup
        self._lock = threading.Lock()
        self._released = False
        self._stats = {"mode": None, "releases": 0, "restores": 0, "release_failures": 0,
                       "release_s": 0.0, "restore_s": 0.0, "last_release_s": None,
                       "last_restore_s": None, "ranks": self._ranks, "backend": self._backend}
        self._mode = self._pick_mode(mode)
        self._stats["mode"] = self._mode
        self._hook_id = manager.add_hook("before_sleep", self._release_hook)
        self._manage(group)

    def _manage(self, group, old=None):
        with _managed_lock:
            if old is not None:
                _managed.pop(id(old), None)
            _managed[id(group)] = group

    # ---- what users call ----------------------------------------------------

    @property
    def group(self):
        """The process group, restored first if a sleep released it (a
        collective: every rank of the group must get here)."""
        self.restore()
        return self._group

    @property
    def mode(self):
        return self._mode

    @property
    def released(self):
        with self._lock:
            return self._released

    def restore(self):
        """Restore the communicator if a sleep released it; nothing otherwise."""
        with self._lock:
            if not self._released:
                return
            start = time.monotonic()
            if self._mode == "suspend":
                self._backend_of(self._group).resume()
            else:
                # Not use_local_synchronization: its name is a hash of the
                # ranks, the destroyed group's again, and a new group under an
                # old name could read the old one's keys (NCCL's unique id)
                # from the store. The counter's names are new every time.
                old, self._group = self._group, self._dist.new_group(self._ranks,
                                                                     backend=self._backend)
                self._manage(self._group, old)
            if self._warmup:
                self._warm_up()
            seconds = time.monotonic() - start
            self._released = False
            self._stats["restores"] += 1
            self._stats["restore_s"] += seconds
            self._stats["last_restore_s"] = seconds

    def release(self):
        """Release the communicator now (what the hook does before a sleep).
        Call only while no collective of the group is running."""
        with self._lock:
            if self._released:
                return
            self._synchronize()
            start = time.monotonic()
            if self._mode == "suspend":
                self._backend_of(self._group).suspend()
            else:
                # marked first: a destroy that fails halfway leaves a group
                # that must be rebuilt all the same
                self._released = True
                self._dist.destroy_process_group(self._group)
            seconds = time.monotonic() - start
            self._released = True
            self._stats["releases"] += 1
            self._stats["release_s"] += seconds
            self._stats["last_release_s"] = seconds

    def stats(self):
        """A dict: mode, releases, restores, release_failures, release_s and
        restore_s (in all), last_release_s, last_restore_s, ranks, backend."""
        with self._lock:
            return dict(self._stats, released=self._released)

    def close(self):
        """Stop releasing before sleeps (the group stays as it is now)."""
        if self._hook_id is not None:
            self._manager.remove_hook(self._hook_id)
            self._hook_id = None
            with _managed_lock:
                _managed.pop(id(self._group), None)

    # ---- inside ---------------------------------------------------------------

    def _release_hook(self):
        try:
            self.release()
        except Exception:  # a sleep goes on without it
            with self._lock:
                self._stats["release_failures"] += 1
            log.warning("releasing the %s communicator of ranks %s failed; the sleep goes on "
                        "and the group is restored at its next use", self._backend,
                        self._ranks, exc_info=True)

    def _pick_mode(self, mode):
        if mode != "auto":
            if mode == "suspend" and not self._can_suspend():
                raise ValueError("mode 'suspend' needs a backend with suspend() and resume() "
                                 "(PyTorch's ProcessGroupNCCL over NCCL 2.29.7 or later)")
            return mode
        return "suspend" if self._can_suspend() else "rebuild"

    def _can_suspend(self):
        try:
            backend = self._backend_of(self._group)
        except Exception:
            return False
        return callable(getattr(backend, "suspend", None)) and \
            callable(getattr(backend, "resume", None))

    def _torch_device(self):
        if self._device is None:
            return self._torch.device("cpu")
        return self._torch.device("cuda", self._device)

    def _backend_of(self, group):
        return group._get_backend(self._torch_device())

    def _synchronize(self):
        if self._device is None:
            return
        # the hook may run on a thread of its own: the group's device, and
        # its last collectives done
        self._torch.cuda.set_device(self._device)
        self._torch.cuda.synchronize(self._device)

    def _warm_up(self):
        if self._device is not None:
            self._torch.cuda.set_device(self._device)
        one = self._torch.zeros(1, device=self._torch_device())
        self._dist.all_reduce(one, group=self._group)
        if self._device is not None:
            self._torch.cuda.synchronize(self._device)


def release_on_sleep(group, *, mode="auto", manager=None, dist=None, torch=None, device=None,
                     warmup=True):
    """Release group's communicator before every sleep of manager (default:
    dormant's default manager) and restore it at its next use; returns the
    ReleasedGroup, whose .group is the group to use. See the module's doc."""
    return ReleasedGroup(group, mode=mode, manager=manager, dist=dist, torch=torch,
                         device=device, warmup=warmup)
