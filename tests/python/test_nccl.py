# SPDX-License-Identifier: MIT
"""dormant.nccl: a process group released before each sleep (from Python and
over HTTP) and restored at its next use, on stand-ins for torch and
torch.distributed (no torch needed). tests/gpu/two_rank_trainer.py runs it
with real NCCL."""
import threading

import pytest

from conftest import MiB, http

import dormant.nccl


class FakeBackend:
    def __init__(self, log, suspendable):
        self.log = log
        if suspendable:
            self.suspend = lambda: log.append(("suspend", threading.current_thread().name))
            self.resume = lambda: log.append(("resume", threading.current_thread().name))


class FakeGroup:
    count = 0

    def __init__(self, ranks, backend, log, suspendable):
        FakeGroup.count += 1
        self.serial = FakeGroup.count
        self.ranks = list(ranks)
        self.backend = backend
        self.destroyed = False
        self._backend = FakeBackend(log, suspendable)

    def _get_backend(self, device):
        return self._backend


class FakeDist:
    def __init__(self, suspendable=False, fail_destroy=False):
        self.log = []
        self.suspendable = suspendable
        self.fail_destroy = fail_destroy

    def new_group(self, ranks, backend=None, use_local_synchronization=False):
        self.log.append(("new_group", tuple(ranks), backend, use_local_synchronization))
        return FakeGroup(ranks, backend, self.log, self.suspendable)

    def get_process_group_ranks(self, group):
        return group.ranks

    def get_backend(self, group):
        return group.backend

    def destroy_process_group(self, group):
        self.log.append(("destroy", group.serial, threading.current_thread().name))
        if self.fail_destroy:
            raise RuntimeError("destroy failed")
        group.destroyed = True

    def all_reduce(self, tensor, group=None):
        assert not group.destroyed
        self.log.append(("all_reduce", group.serial))


class FakeTorch:
    def __init__(self, log):
        self.log = log
        self.cuda = self

    def device(self, kind, index=None):
        return (kind, index)

    def zeros(self, n, device=None):
        return [0] * n

    def current_device(self):
        return 3

    def set_device(self, device):
        self.log.append(("set_device", device))

    def synchronize(self, device=None):
        self.log.append(("synchronize", device))


def released(mgr, dist, backend="gloo", **kwargs):
    group = dist.new_group([0, 1], backend=backend)
    dist.log.clear()
    return dormant.nccl.release_on_sleep(group, manager=mgr, dist=dist, torch=FakeTorch(dist.log),
                                         **kwargs)


def names(log):
    return [entry[0] for entry in log]


def test_rebuild_destroys_before_the_sleep_and_rebuilds_at_the_next_use(mgr):
    mgr.alloc("w", MiB)
    dist = FakeDist()
    rg = released(mgr, dist)
    first = rg.group
    assert rg.mode == "rebuild" and not rg.released
    mgr.sleep()
    assert names(dist.log) == ["destroy"] and first.destroyed and rg.released
    mgr.wake()
    assert names(dist.log) == ["destroy"], "a wake restores nothing: restoring is collective"
    again = rg.group
    assert again is not first and not again.destroyed
    assert dist.log[1] == ("new_group", (0, 1), "gloo", False)
    assert dist.log[2] == ("all_reduce", again.serial), "warmed up on the new group"
    assert rg.group is again and len(dist.log) == 3, "restored once"
    s = rg.stats()
    assert (s["mode"], s["releases"], s["restores"], s["release_failures"]) == \
        ("rebuild", 1, 1, 0)
    assert s["last_release_s"] >= 0 and s["last_restore_s"] >= 0 and s["ranks"] == [0, 1]


def test_a_sleep_over_http_releases_on_the_server_thread(mgr, server):
    mgr.alloc("w", MiB)
    dist = FakeDist()
    rg = released(mgr, dist)
    assert http("POST", server.url + "/sleep").status == 200
    assert dist.log[0][0] == "destroy" and dist.log[0][2] != threading.main_thread().name
    assert http("POST", server.url + "/wake").status == 200
    rg.group
    assert names(dist.log) == ["destroy", "new_group", "all_reduce"]


def test_suspend_keeps_the_group_when_the_backend_can(mgr):
    mgr.alloc("w", MiB)
    dist = FakeDist(suspendable=True)
    rg = released(mgr, dist, backend="nccl")
    group = rg._group
    assert rg.mode == "suspend"
    mgr.sleep()
    mgr.wake()
    assert rg.group is group
    # the device first (the hook may run on another thread), then suspend
    assert names(dist.log) == ["set_device", "synchronize", "suspend", "resume", "set_device",
                               "all_reduce", "synchronize"]
    assert dist.log[1] == ("synchronize", 3)


def test_nccl_groups_wait_for_the_device_before_the_destroy(mgr):
    mgr.alloc("w", MiB)
    dist = FakeDist()
    released(mgr, dist, backend="nccl", mode="rebuild")
    mgr.sleep()
    assert names(dist.log) == ["set_device", "synchronize", "destroy"]


def test_a_failed_release_lets_the_sleep_go_on_and_rebuilds_later(mgr, caplog):
    mgr.alloc("w", MiB)
    dist = FakeDist(fail_destroy=True)
    rg = released(mgr, dist)
    mgr.sleep()
    assert mgr.stats()["tags"][0]["state"] == "asleep"
    assert rg.stats()["release_failures"] == 1 and rg.released
    assert "releasing the gloo communicator of ranks [0, 1] failed" in caplog.text
    mgr.wake()
    rg.group
    assert names(dist.log) == ["destroy", "new_group", "all_reduce"]


def test_a_rolled_back_sleep_still_restores_at_the_next_use(mgr):
    mgr.alloc("w", 8 * MiB)
    dist = FakeDist()
    rg = released(mgr, dist)
    mgr.debug_inject_fault("copy", 1)
    with pytest.raises(dormant.DormantError):
        mgr.sleep()
    assert rg.released
    rg.group
    assert names(dist.log) == ["destroy", "new_group", "all_reduce"]


def test_close_stops_the_releases(mgr):
    mgr.alloc("w", MiB)
    dist = FakeDist()
    rg = released(mgr, dist)
    rg.close()
    mgr.sleep()
    mgr.wake()
    assert dist.log == []
    rg.close()  # twice is fine


def test_bad_modes_are_refused(mgr):
    dist = FakeDist()
    with pytest.raises(ValueError, match="mode must be one of"):
        released(mgr, dist, mode="sometimes")
    with pytest.raises(ValueError, match="needs a backend with suspend"):
        released(mgr, dist, mode="suspend")
    assert released(mgr, dist, mode="rebuild", warmup=False).mode == "rebuild"
