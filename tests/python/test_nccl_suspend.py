# SPDX-License-Identifier: MIT
"""dormant.nccl's process-wide suspend (issue 21) on stand-ins: a fake
libnccl (tests/python/fake_nccl.c: NCCL 2.29.7's suspend API recording its
calls, failing or hanging on demand; and an NCCL 2.28.9 without it) and a
stand-in torch.distributed whose registry (distributed_c10d._world) holds
the groups, as c10d's does. No torch, no GPU."""
import ctypes
import logging
import os
import threading
import types

import pytest

from conftest import MiB, http

import dormant
import dormant.nccl
from dormant.nccl import _rebuild

FAKE = os.environ.get("DORMANT_TEST_FAKE_NCCL")
FAKE_OLD = os.environ.get("DORMANT_TEST_FAKE_NCCL_OLD")
pytestmark = pytest.mark.skipif(not FAKE, reason="built by meson (DORMANT_TEST_FAKE_NCCL)")


@pytest.fixture
def fake():
    lib = ctypes.CDLL(FAKE)
    lib.fake_nccl_calls.restype = ctypes.c_char_p
    lib.fake_nccl_hang.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.fake_nccl_fail.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p]
    lib.fake_nccl_suspended.argtypes = [ctypes.c_void_p]
    lib.fake_nccl_reset()
    lib.calls = lambda: [c for c in lib.fake_nccl_calls().decode().split(",") if c]
    yield lib
    lib.fake_nccl_reset()  # lets anything still hanging go


# ---- a stand-in torch.distributed --------------------------------------------

class Backend:
    def __init__(self, comm, log, api=False):
        self.comm = comm
        self.log = log
        if api:  # PyTorch 2.12's ProcessGroupNCCL
            self.suspend = lambda: log.append(("suspend", comm))
            self.resume = lambda: log.append(("resume", comm))

    def _comm_ptr(self):
        return self.comm


class PG:
    def __init__(self, backend):
        self.backend = backend

    def _get_backend(self, device):
        assert device == ("cuda", None)
        return self.backend


class Store:
    def __init__(self):
        self.data = {}
        self.cond = threading.Condition()

    def set(self, key, value):
        with self.cond:
            self.data[key] = value.encode() if isinstance(value, str) else value
            self.cond.notify_all()

    def get(self, key):
        with self.cond:
            assert self.cond.wait_for(lambda: key in self.data, 30)
            return self.data[key]

    def wait(self, keys, timeout):
        with self.cond:
            if not self.cond.wait_for(lambda: all(k in self.data for k in keys),
                                      timeout.total_seconds()):
                raise RuntimeError("store wait timed out")


class Dist:
    """torch.distributed as dormant.nccl reads it: is_initialized(), the
    c10d registry, new_group(), destroy_process_group()."""

    def __init__(self, rank=0, world=1, store=None, log=None):
        self.rank, self.world = rank, world
        self.log = [] if log is None else log
        self.next_comm = 0x1000 * (rank + 1)
        self.count = 0
        w = types.SimpleNamespace(pg_map={}, pg_names={}, pg_group_ranks={}, default_pg=None)
        store = store or Store()
        self.distributed_c10d = types.SimpleNamespace(_world=w, _get_default_store=lambda: store)
        self.api = False
        w.default_pg = self.new_group(list(range(world)))

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def get_rank(self):
        return self.rank

    def get_world_size(self):
        return self.world

    def new_group(self, ranks, backend="nccl", lazy=False):
        name = str(self.count)
        self.count += 1
        self.log.append(("new_group", self.rank, tuple(ranks), backend, name))
        if self.rank not in ranks:
            return "NON_GROUP_MEMBER"
        comm = 0
        if "nccl" in backend and not lazy:
            comm = self.next_comm
            self.next_comm += 0x10
        pg = PG(Backend(comm, self.log, self.api) if "nccl" in backend else None)
        pg.group_name = name
        w = self.distributed_c10d._world
        w.pg_map[pg] = (backend, None)
        w.pg_names[pg] = name
        w.pg_group_ranks[pg] = {r: i for i, r in enumerate(ranks)}
        return pg

    def destroy_process_group(self, pg):
        self.log.append(("destroy", self.rank, self.distributed_c10d._world.pg_names[pg]))
        w = self.distributed_c10d._world
        for table in (w.pg_map, w.pg_names, w.pg_group_ranks):
            table.pop(pg, None)


class Torch:
    def __init__(self, free=None):
        self.free = free  # list: [free bytes], or None for no mem_get_info
        self.cuda = types.SimpleNamespace(mem_get_info=self._mem_get_info)

    @staticmethod
    def device(kind, index=None):
        return (kind, index)

    def _mem_get_info(self):
        if self.free is None:
            raise RuntimeError("no CUDA")
        return self.free[0], 1 << 40


def comms_on(mgr, dist, lib_path=FAKE, mode="auto", timeout_s=5.0, torch=None):
    """Replace mgr's communicators by ones over the stand-ins."""
    mgr._comms.close()
    lib = dormant.nccl.LibNccl.open(lib_path) if lib_path else False
    mgr._comms = dormant.nccl.Communicators(mgr, mode, timeout_s, dist=dist,
                                            torch=torch or Torch(), libnccl=lib)
    return mgr._comms


def megatron_like(dist):
    """WORLD, two NCCL groups, a gloo group and a group that made no
    communicator yet (lazy)."""
    tp = dist.new_group([0])
    gloo = dist.new_group([0], backend="gloo")
    dp = dist.new_group([0])
    lazy = dist.new_group([0], lazy=True)
    return tp, gloo, dp, lazy


# ---- discovery and order -------------------------------------------------------

def test_every_nccl_group_is_found_in_the_order_c10d_made_them(mgr, fake):
    dist = Dist()
    tp, gloo, dp, lazy = megatron_like(dist)
    groups = dormant.nccl._discover.nccl_groups(dist, Torch())
    assert [g.pg for g in groups] == [dist.distributed_c10d._world.default_pg, tp, dp, lazy]
    assert [g.name for g in groups] == ["0", "1", "3", "4"] and groups[1].ranks == [0]


def test_suspended_after_the_copies_and_resumed_before_the_rebuild(mgr, fake):
    dist = Dist()
    tp, _, dp, _ = megatron_like(dist)
    comms_on(mgr, dist)
    w = mgr.alloc("w", MiB)
    mgr.copy_to_device(w, b"\x07" * 64)
    seen = {}

    def rebuild(tag):
        seen["suspended_at_rebuild"] = [fake.fake_nccl_suspended(c) for c in (0x1000, 0x1010)]
    mgr.set_policy("bf16", "rebuild", rebuild=rebuild)
    mgr.alloc("bf16", MiB)
    mgr.add_hook("before_sleep", lambda: seen.setdefault("calls_before_sleep", fake.calls()))
    report = mgr.sleep()
    assert seen["calls_before_sleep"] == [], "nothing suspended before the copies"
    # WORLD, tp, dp, in that order; the lazy one made no communicator
    assert fake.calls() == ["suspend:0x1000", "suspend:0x1010", "suspend:0x1020"]
    assert report["times"]["comms_s"] >= 0
    mgr.wake()
    assert seen["suspended_at_rebuild"] == [0, 0], "resumed before the rebuild callback"
    assert fake.calls()[3:] == ["resume:0x1000", "resume:0x1010", "resume:0x1020"]
    assert mgr.copy_to_host(w, 64) == b"\x07" * 64
    s = mgr._comms.stats()
    assert s["suspend"] == "available" and s["way"] == "libnccl" and s["version"] == "2.29.7"
    assert s["bytes_released_total"] == 3 * (430 << 20) == s["bytes_restored_total"]
    assert s["last_sleep"]["count"] == 3 and s["last_sleep"]["error"] is None
    assert {c["state"] for c in s["communicators"]} == {"active"}


def test_pytorchs_backend_api_comes_first(mgr, fake):
    dist = Dist()
    dist.api = True
    g = dist.new_group([0])
    comms_on(mgr, dist, torch=Torch(free=[100]))
    dist.log.clear()
    mgr.alloc("w", MiB)
    mgr.sleep()
    mgr.wake()
    assert [e[0] for e in dist.log] == ["suspend", "resume"], "g: backend.suspend()"
    assert fake.calls() == ["suspend:0x1000", "resume:0x1000"], "WORLD (no API): libnccl"
    assert mgr._comms.stats()["way"] == "torch+libnccl"
    del g


def test_stats_and_metrics_over_http(mgr, fake):
    dist = Dist()
    megatron_like(dist)
    comms_on(mgr, dist)
    mgr.alloc("w", MiB)
    server = mgr.serve(quiet=True, stats_extra=lambda: {"mine": 1})
    try:
        assert http("POST", server.url + "/sleep").status == 200
        stats = http("GET", server.url + "/stats").json
        assert stats["extra"]["mine"] == 1
        nccl = stats["extra"]["nccl"]
        assert nccl["mode"] == "auto" and nccl["suspend"] == "available"
        assert [c["state"] for c in nccl["communicators"]] == ["suspended"] * 3 + ["active"]
        assert stats["last_sleep"]["times"]["comms_s"] >= 0
        text = http("GET", server.url + "/metrics").text
        assert 'dormant_comm_suspend_available{mode="auto",reason=""} 1' in text
        assert 'dormant_comm_communicators{state="suspended"} 3' in text
        assert f'dormant_comm_bytes_total{{direction="released"}} {3 * (430 << 20)}' in text
        assert 'dormant_transition_phase_seconds_total{kind="sleep",phase="comms"}' in text
        assert http("POST", server.url + "/wake").status == 200
    finally:
        server.stop()


# ---- deadline and errors ----------------------------------------------------------

def test_a_suspend_past_its_deadline_fails_the_sleep_naming_the_communicator(mgr, fake):
    dist = Dist()
    tp = dist.new_group([0])
    comms_on(mgr, dist, timeout_s=0.3)
    w = mgr.alloc("w", MiB)
    mgr.copy_to_device(w, b"\x05" * 32)
    fake.fake_nccl_hang(b"suspend", 1)
    with pytest.raises(dormant.CancelledError) as e:
        mgr.sleep()
    assert "suspend of NCCL communicator '0' (ranks [0]) did not finish within 0.3 s" \
        in str(e.value)
    assert "sleep_together" in str(e.value)
    assert mgr.stats()["tags"][0]["state"] == "asleep", "the copies are done: it stays asleep"
    s = mgr._comms.stats()
    assert s["failures"] == 1 and s["communicators"][0]["state"] == "stuck"
    mgr.wake()  # the rank is usable: nothing was suspended
    assert mgr.copy_to_host(w, 32) == b"\x05" * 32
    # the peers arrive: the late suspend ends, and the next wake resumes it
    fake.fake_nccl_release()
    for _ in range(500):
        if mgr._comms.stats()["communicators"][0]["state"] == "suspended":
            break
        threading.Event().wait(0.01)
    assert mgr._comms.stats()["communicators"][0]["state"] == "suspended"
    mgr.sleep()
    mgr.wake()
    assert fake.fake_nccl_suspended(0x1000) == 0 and fake.fake_nccl_suspended(0x1010) == 0
    del tp


def test_a_failed_suspend_resumes_what_this_sleep_suspended(mgr, fake, server):
    dist = Dist()
    dist.new_group([0])
    comms_on(mgr, dist)
    mgr.alloc("w", MiB)
    fake.fake_nccl_fail(b"suspend", 2, 0x1010)  # ncclSystemError on the second
    r = http("POST", server.url + "/sleep")
    assert r.status == 409 and "suspending NCCL communicator '1' (ranks [0]) failed" in \
        r.json["detail"], r.json
    assert fake.calls() == ["suspend:0x1000", "suspend:0x1010", "resume:0x1000"]
    assert fake.fake_nccl_suspended(0x1000) == 0, "the rank stays usable"
    fake.fake_nccl_fail(b"suspend", 0, None)
    assert http("POST", server.url + "/wake").status == 200


def test_a_communicator_nccl_refuses_stays_and_the_sleep_goes_on(mgr, fake, caplog):
    dist = Dist()
    dist.new_group([0])
    comms_on(mgr, dist)
    mgr.alloc("w", MiB)
    fake.fake_nccl_fail(b"suspend", 5, 0x1010)  # ncclInvalidUsage: split_share
    mgr.sleep()
    rows = mgr._comms.stats()["communicators"]
    assert [r["state"] for r in rows] == ["suspended", "refused"]
    assert "invalid usage" in rows[1]["reason"]
    mgr.wake()
    assert fake.calls() == ["suspend:0x1000", "suspend:0x1010", "resume:0x1000"]


def test_a_failed_resume_fails_the_wake_and_a_retry_resumes_the_rest(mgr, fake):
    dist = Dist()
    dist.new_group([0])
    comms_on(mgr, dist)
    mgr.alloc("w", MiB)
    mgr.sleep()
    fake.fake_nccl_fail(b"resume", 2, 0x1010)
    with pytest.raises(dormant.CancelledError, match="resuming NCCL communicator '1'"):
        mgr.wake()
    assert mgr.stats()["tags"][0]["state"] == "asleep"
    fake.fake_nccl_fail(b"resume", 0, None)
    mgr.wake()
    assert fake.calls()[2:] == ["resume:0x1000", "resume:0x1010", "resume:0x1010"]
    assert fake.fake_nccl_suspended(0x1010) == 0


# ---- where it cannot work ------------------------------------------------------------

def test_an_old_nccl_is_reported_unavailable_once(mgr, caplog):
    dist = Dist()
    comms_on(mgr, dist, lib_path=FAKE_OLD)
    mgr.alloc("w", MiB)
    caplog.set_level(logging.WARNING, logger="dormant")
    mgr.sleep()
    mgr.wake()
    mgr.sleep()
    s = mgr._comms.stats()
    assert (s["suspend"], s["reason"]) == ("unavailable", "NCCL 2.28.9 < 2.29.7")
    assert caplog.text.count("NCCL 2.28.9 < 2.29.7") == 1
    assert 'dormant_comm_suspend_available{mode="auto",reason="NCCL 2.28.9 < 2.29.7"} 0' \
        in mgr._comms.metrics()
    mgr.wake()


def test_cumem_off_is_reported_unavailable(mgr, fake, monkeypatch):
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "0")
    dist = Dist()
    comms_on(mgr, dist)
    mgr.alloc("w", MiB)
    mgr.sleep()
    assert fake.calls() == []
    assert "NCCL_CUMEM_ENABLE=0" in mgr._comms.stats()["reason"]
    mgr.wake()


def test_no_libnccl_and_no_api_is_unavailable(mgr):
    comms_on(mgr, Dist(), lib_path=None)
    assert mgr._comms.stats()["suspend"] == "unavailable"


def test_the_option_and_its_environment_variable(monkeypatch):
    with dormant.Manager(backend="host", nccl="off") as m:
        assert m._comms.stats()["suspend"] == "off" and m._comms._hook_ids == []
    monkeypatch.setenv("DORMANT_NCCL", "rebuild")
    monkeypatch.setenv("DORMANT_NCCL_TIMEOUT_S", "7.5")
    with dormant.Manager(backend="host") as m:
        s = m._comms.stats()
        assert (s["mode"], s["suspend"], s["timeout_s"]) == ("rebuild", "rebuild", 7.5)
    with pytest.raises(ValueError, match="nccl must be one of auto, rebuild, off"):
        dormant.Manager(backend="host", nccl="sometimes")
    with pytest.raises(ValueError, match="nccl_timeout_s"):
        dormant.Manager(backend="host", nccl_timeout_s=0)


# ---- the fallback: destroyed and made again --------------------------------------------

def test_rebuild_destroys_after_the_copies_and_rebinds_the_programs_references(mgr, fake):
    dist = Dist()
    dp = dist.new_group([0])
    gloo = dist.new_group([0], backend="gloo")

    class Optimizer:  # attributes in no dict until asked (CPython 3.11+)
        def __init__(self, group):
            self.data_parallel_group = group

    optimizer = Optimizer(dp)

    class Config:  # a class attribute: vars() is a read-only mappingproxy
        group = dp

    state = types.SimpleNamespace(dp=dp)   # Megatron's parallel_state globals
    buckets = [dp, dp]                     # a DDP bucket list
    closure = (lambda: dp)                 # a closure cell (this frame's dp is one too)
    held = (dp,)                           # a tuple: cannot be rebound
    comms_on(mgr, dist, mode="rebuild")
    mgr.alloc("w", MiB)
    order = []
    mgr.set_policy("bf16", "rebuild", rebuild=lambda tag: order.append(
        ("rebuild", state.dp is not held[0])))
    mgr.alloc("bf16", MiB)
    dist.log.clear()
    mgr.sleep()
    assert dist.log == [("destroy", 0, "1")], "WORLD and gloo stay"
    mgr.wake()
    assert [e[0] for e in dist.log] == ["destroy", "new_group"]
    new = buckets[0]
    assert new is not held[0] and buckets == [new, new] and state.dp is new and closure() is new
    assert optimizer.data_parallel_group is new and Config.group is new
    assert order == [("rebuild", True)], "made again before the rebuild callback"
    assert dist.distributed_c10d._world.pg_names[new] == "3", "a new name: no stale keys"
    s = mgr._comms.stats()
    assert s["rebuilds"] == 1 and s["references_rebound"] >= 4 and s["references_left"] >= 1
    del gloo


def test_rebuild_rebinds_a_second_object_of_a_destroyed_group(mgr, fake):
    """PyTorch can hand out a second Python object for one C++ group (as
    Megatron-core's DDP buckets held its distributed-optimizer group on the
    H200): found by type and name, it is rebound too; objects of groups that
    live on, and other objects, are left alone."""
    dist = Dist()
    dp = dist.new_group([0])
    gloo = dist.new_group([0], backend="gloo")
    twin = PG(dp.backend)                  # the same group, another object
    twin.group_name = dp.group_name
    gloo_twin = PG(None)
    gloo_twin.group_name = gloo.group_name
    bucket = types.SimpleNamespace(group=twin, other=gloo_twin, label=dp.group_name)

    class Buffer:  # a plain object: its attributes in no dict until asked (CPython 3.11+)
        def __init__(self, group):
            self.group = group

    buffer = Buffer(twin)
    groups = [twin]
    closure = (lambda: twin)
    comms_on(mgr, dist, mode="rebuild")
    mgr.alloc("w", MiB)
    mgr.sleep()
    mgr.wake()
    new = dist.distributed_c10d._world
    fresh = next(pg for pg, name in new.pg_names.items() if name not in ("0", "1", "2"))
    assert bucket.group is fresh and groups == [fresh] and closure() is fresh
    assert buffer.group is fresh
    assert bucket.other is gloo_twin and bucket.label == "1"
    assert mgr._comms.stats()["references_rebound"] >= 3


def test_rebuild_rebinds_every_group_in_one_walk_of_the_heap(mgr, fake, monkeypatch):
    """Three groups destroyed: one gc.collect() and one gc.get_referrers()
    for all of them (each walks the whole heap: with Megatron-core loaded, a
    large part of a second per group), and a dict holding two of them gets
    both new ones."""
    dist = Dist()
    tp, dp, pp = dist.new_group([0]), dist.new_group([0]), dist.new_group([0])
    groups = {"tp": tp, "dp": dp}
    chain = [pp, tp]
    calls = {"collect": 0, "get_referrers": 0}
    real_collect, real_referrers = _rebuild.gc.collect, _rebuild.gc.get_referrers

    def collect(*a):
        calls["collect"] += 1
        return real_collect(*a)

    def get_referrers(*objs):
        calls["get_referrers"] += 1
        return real_referrers(*objs)

    comms_on(mgr, dist, mode="rebuild")
    mgr.alloc("w", MiB)
    mgr.sleep()
    monkeypatch.setattr(_rebuild.gc, "collect", collect)
    monkeypatch.setattr(_rebuild.gc, "get_referrers", get_referrers)
    mgr.wake()
    monkeypatch.undo()
    names = dist.distributed_c10d._world.pg_names
    fresh = [pg for pg, name in names.items() if name not in ("0", "1", "2", "3")]
    assert len(fresh) == 3
    assert groups["tp"] in fresh and groups["dp"] in fresh and groups["tp"] is not groups["dp"]
    assert chain[0] in fresh and chain[0] is not groups["tp"] and chain[1] is groups["tp"]
    assert calls == {"collect": 1, "get_referrers": 1}, calls
    assert mgr._comms.stats()["groups_destroyed"] == 3


def test_rebuild_makes_every_group_on_every_rank_in_one_order():
    """Three ranks; each knows only its own groups, every new_group() is
    collective over WORLD: all three make the union, in the first order."""
    store, log = Store(), []
    ranks = [Dist(rank, 3, store, log) for rank in range(3)]
    specs = [[0, 1], [0, 2], [1, 2], [0, 1, 2]]
    for spec in specs:
        for d in ranks:
            d.new_group(spec)
    builders = [_rebuild.Rebuilder(10, dist=d, torch=Torch()) for d in ranks]
    for b in builders:
        b.destroy_all()
    log.clear()
    threads = [threading.Thread(target=b.recreate_all) for b in builders]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    made = {r: [e[2] for e in log if e[0] == "new_group" and e[1] == r] for r in range(3)}
    assert made[0] == made[1] == made[2] == [tuple(s) for s in specs]
    names = {r: [e[4] for e in log if e[0] == "new_group" and e[1] == r] for r in range(3)}
    assert names[0] == names[1] == names[2]
    assert all(b.rebuilds == 1 for b in builders)


# ---- an orchestrator sleeps the ranks of a job together ------------------------------

def test_sleep_together_has_every_rank_in_flight_at_once():
    """Two ranks whose after-copies step is collective (a barrier of two, as
    ncclCommSuspend's): with concurrency=1, sleep() would send the second
    request only after the first ended, which waits for the second; the
    together calls send both at once."""
    from dormant.client import AsyncClient, Client
    import asyncio
    barrier = threading.Barrier(2, timeout=20)
    managers = [dormant.Manager(backend="host", host_device_bytes=64 * MiB, nccl="off")
                for _ in range(2)]
    servers = []
    try:
        for m in managers:
            m.alloc("w", MiB)
            m.add_hook("after_copies", barrier.wait)
            m.add_hook("before_rebuild", barrier.wait)
            servers.append(m.serve(quiet=True))
        urls = [s.url for s in servers]
        client = Client(urls, concurrency=1, retries=0)
        assert all(r.ok for r in client.sleep_together())
        assert all(r.ok for r in client.wake_together())
        aclient = AsyncClient(urls, concurrency=1, retries=0)
        assert all(r.ok for r in asyncio.run(aclient.sleep_together()))
        assert all(r.ok for r in asyncio.run(aclient.wake_together()))
        assert all(m.stats()["tags"][0]["state"] == "awake" for m in managers)
    finally:
        for s in servers:
            s.stop()
        for m in managers:
            m.close()


# ---- which libnccl, when two are mapped ---------------------------------------

_TWO_MAPPED = r"""
import ctypes, os, sys
from dormant.nccl import _libnccl
old, new, maps, how = sys.argv[1:5]
ctypes.CDLL(old, mode=os.RTLD_LOCAL)   # PyTorch's wheel: its own, by full path
ctypes.CDLL(new, mode=os.RTLD_GLOBAL if how == "global" else os.RTLD_LOCAL)
if how == "ld_preload":                # as the loader saw it (set late: nothing preloaded)
    os.environ["LD_PRELOAD"] = "libfoo.so:" + new
with open(maps, "w") as f:             # maps sorts by address: the old one first
    for i, path in enumerate((old, new)):
        f.write(f"7f00{i}000-7f00{i}fff r-xp 00000000 00:00 {i} {path}\n")
print(_libnccl.loaded_path(maps))
"""


@pytest.mark.skipif(not FAKE_OLD, reason="built by meson (DORMANT_TEST_FAKE_NCCL_OLD)")
@pytest.mark.parametrize("how", ["global", "ld_preload"])
def test_the_libnccl_the_process_binds_to_wins_over_the_first_mapped(tmp_path, how):
    """With a newer NCCL on LD_PRELOAD, PyTorch's wheel still maps its own
    (first in maps on the GPU machine): suspend must use the newer one, which
    the calls bind to, not report the old one's version."""
    import shutil
    import subprocess
    import sys
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old = shutil.copy(FAKE_OLD, tmp_path / "old" / "libnccl.so.2")
    new = shutil.copy(FAKE, tmp_path / "new" / "libnccl.so.2")
    # LD_PRELOAD stays: under ASan it names the runtime, which must come first
    env = {k: v for k, v in os.environ.items() if k != "DORMANT_NCCL_LIB"}
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(dormant.__path__[0]),
                                         env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _TWO_MAPPED, str(old), str(new),
                        str(tmp_path / "maps"), how],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(new)
