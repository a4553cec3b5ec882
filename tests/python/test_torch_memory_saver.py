# SPDX-License-Identifier: MIT
"""dormant.torch_memory_saver without torch or a GPU: a stand-in torch (the
one of test_region_glue.py, plus CUDA graphs and plain pools) whose
allocations call the real dormant_torch_malloc() of a host-backend manager.
What is checked is where the memory really lands and what comes back after a
pause and a resume: the manager's statistics and the bytes themselves."""
import contextlib
import ctypes
import importlib
import os
import subprocess
import sys
import types
import warnings

import pytest

from conftest import MiB, REPO, http
from test_region_glue import FakeTorch, thread_tag

import dormant

PYTHON_DIR = REPO / "python"


class FakeTorchTMS(FakeTorch):
    """FakeTorch with MemPool() on PyTorch's own allocator (allocations from
    it land nowhere: None) and torch.cuda.graph(g, pool=id) routing the
    capture's allocations to the pool of that id."""

    def __init__(self):
        super().__init__()
        fake = self
        base_pool = self.cuda.MemPool
        self.pools_by_id = {}
        self.captures = []

        def mem_pool(allocator=None):
            pool = base_pool(allocator)
            fake.pools_by_id[pool.id] = pool
            return pool

        @contextlib.contextmanager
        def graph(cuda_graph, pool=None, stream=None, capture_error_mode="global"):
            # pool None: a private pool of PyTorch's allocator, as PyTorch's
            target = fake.pools_by_id[pool] if pool is not None else mem_pool()
            routes = fake._routes()
            fake.captures.append((cuda_graph, pool, capture_error_mode, list(routes)))
            routes.append(target)      # as PyTorch: the routing begun first wins
            try:
                yield
            finally:
                routes.remove(target)

        self.cuda.MemPool = mem_pool
        self.cuda.graph = graph
        self.cuda.CUDAGraph = type("CUDAGraph", (), {})

        self.uint8 = self.dtype()
        self.empty = lambda shape, dtype=None, device=None: CpuTensor(bytearray(shape[0]))
        self.frombuffer = lambda buf, dtype=None: CpuTensor(buf)

    def alloc(self, nbytes):
        routes = self._routes()
        if routes and routes[0].allocator is None:
            return routes[0], None   # cudaMalloc: whatever captures it
        return super().alloc(nbytes)


class CpuTensor:
    """A stand-in CPU tensor of bytes over a buffer (bytearray or ctypes)."""

    def __init__(self, buf):
        self.buf = buf
        self.shape = (len(buf),)

    def data_ptr(self):
        return ctypes.addressof(ctypes.c_char.from_buffer(self.buf))

    def view(self, _):
        return self

    def tobytes(self):
        return bytes(self.buf)


class DeviceTensor:
    """A stand-in contiguous uint8 CUDA tensor at a managed address."""

    def __init__(self, fake, ptr, nbytes):
        self.ptr, self.nbytes = ptr, nbytes
        self.dtype, self.shape = fake.uint8, (nbytes,)

    def is_contiguous(self):
        return True

    def numel(self):
        return self.nbytes

    def element_size(self):
        return 1

    def data_ptr(self):
        return self.ptr


@pytest.fixture
def env(monkeypatch, mgr):
    """(fake torch, the manager, a fresh TorchMemorySaver)."""
    fake = FakeTorchTMS()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.delitem(sys.modules, "dormant._torch", raising=False)
    module = importlib.import_module("dormant._torch")
    monkeypatch.setattr(dormant, "_torch", module, raising=False)
    monkeypatch.setattr(dormant.Manager, "backend", property(lambda self: "cuda"))
    monkeypatch.setattr(dormant, "_default", mgr)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("TMS_RETAIN_CPU_BACKUP", raising=False)
    tms_module = importlib.import_module("dormant.torch_memory_saver")
    tms_module._warned.clear()
    yield fake, mgr, tms_module.TorchMemorySaver()
    mgr.close()
    module._attached = None
    monkeypatch.delitem(sys.modules, "dormant._torch", raising=False)


def tags(mgr):
    return {t["tag"]: t for t in mgr.stats()["tags"]}


def policy_pool_key(mgr, pool):
    return next(k for k, p in mgr._torch.policy_pools.items() if p is pool)


def pattern(n, seed):
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


def has_thread_policy(mgr):
    return hasattr(mgr._lib.cdll, "dormant_set_thread_policy")


needs_policy = pytest.mark.skipif(
    not hasattr(dormant._library.get().cdll, "dormant_set_thread_policy"),
    reason="libdormant has no dormant_set_thread_policy (per-allocation policy) yet")


# ---- regions ----------------------------------------------------------------

@needs_policy
def test_region_allocates_under_the_named_tag(env):
    fake, mgr, tms = env
    with tms.region():
        pool, ptr = fake.alloc(2 * MiB)
        assert thread_tag(mgr) == "default"
    with tms.region("kv_cache"):
        pool2, ptr2 = fake.alloc(MiB)
    assert policy_pool_key(mgr, pool)[:2] == ("default", "discard")
    assert policy_pool_key(mgr, pool2)[:2] == ("kv_cache", "discard")
    t = tags(mgr)
    assert t["default"]["bytes"] == 2 * MiB and t["kv_cache"]["bytes"] == MiB
    assert fake.alloc(MiB) == (None, None)   # outside every region: ordinary memory


@needs_policy
def test_backup_kept_and_no_backup_zeroed_in_one_tag(env):
    """miles's layout: grad_data in a no-backup region nested in the backed-up
    "default" tag; pause("default") covers both."""
    fake, mgr, tms = env
    with tms.region("default", enable_cpu_backup=True):
        kept_pool, kept = fake.alloc(MiB)
        with tms.region("default", enable_cpu_backup=False):
            grad_pool, grad = fake.alloc(MiB)
        after_pool, after = fake.alloc(MiB)   # the outer region again
    assert kept_pool is after_pool and grad_pool is not kept_pool
    mgr.copy_to_device(kept, pattern(MiB, 1))
    mgr.copy_to_device(grad, pattern(MiB, 2))
    mgr.copy_to_device(after, pattern(MiB, 3))
    report = tms.pause("default")
    assert report["changed"] and tags(mgr)["default"]["state"] == "asleep"
    tms.resume("default")
    assert mgr.copy_to_host(kept, MiB) == pattern(MiB, 1)
    assert mgr.copy_to_host(after, MiB) == pattern(MiB, 3)
    assert mgr.copy_to_host(grad, MiB) == bytes(MiB)


@needs_policy
def test_nested_regions_inner_wins(env):
    fake, mgr, tms = env
    with tms.region("weights", enable_cpu_backup=True):
        p1, _ = fake.alloc(MiB)
        with tms.region("kv_cache"):
            p2, _ = fake.alloc(MiB)
            assert thread_tag(mgr) == "kv_cache"
        p3, _ = fake.alloc(MiB)
        assert thread_tag(mgr) == "weights"
    keys = [policy_pool_key(mgr, p)[:2] for p in (p1, p2, p3)]
    assert keys == [("weights", "keep"), ("kv_cache", "discard"), ("weights", "keep")]
    assert fake._routes() == [] and thread_tag(mgr) == "default"


@needs_policy
def test_dormant_region_inside_a_tms_region_follows_its_tag_policy(env):
    """A dormant.region() nested in a tms region resets the thread's
    allocation policy to the tag's."""
    fake, mgr, tms = env
    mgr.set_policy("grads", "discard")
    with tms.region("weights", enable_cpu_backup=True):
        with mgr.region("grads"):
            _, grad = fake.alloc(MiB)
        _, weight = fake.alloc(MiB)
    mgr.copy_to_device(grad, pattern(MiB, 4))
    mgr.copy_to_device(weight, pattern(MiB, 5))
    tms.pause()
    tms.resume()
    assert mgr.copy_to_host(grad, MiB) == bytes(MiB)
    assert mgr.copy_to_host(weight, MiB) == pattern(MiB, 5)


def test_bad_arguments_change_nothing(env):
    fake, mgr, tms = env
    with pytest.raises(dormant.InvalidArgumentError):
        with tms.region("bad tag"):
            pass
    with pytest.raises(dormant.InvalidArgumentError):
        with tms.region(7):
            pass
    with pytest.raises(ValueError):
        with tms.region(cpu_backup_backend="pinned"):   # needs enable_cpu_backup
            pass
    with pytest.raises(ValueError):
        with tms.region(enable_cpu_backup=True, enable_disk_backup=True):
            pass
    assert fake._routes() == [] and thread_tag(mgr) == "default"
    assert tags(mgr) == {}


@needs_policy
def test_disable_goes_to_a_fresh_ordinary_pool_given_back_after(env):
    """disable(): a pool of PyTorch's own allocator made for it (never one
    holding cached blocks of paused memory), the thread's tag reset and its
    capture off; everything back after."""
    fake, mgr, tms = env
    cdll = tms._impl._binary_wrapper.cdll
    with tms.region("weights", enable_cpu_backup=True):
        assert cdll.tms_get_interesting_region()
        with tms.disable():
            pool, ptr = fake.alloc(MiB)
            assert ptr is None and pool.allocator is None   # cudaMalloc, not dormant
            assert thread_tag(mgr) == "default"
            assert not cdll.tms_get_interesting_region()    # not captured either
        with tms.disable():
            again, _ = fake.alloc(MiB)
        assert again is not pool
        assert cdll.tms_get_interesting_region()
        weights_pool, _ = fake.alloc(MiB)
    assert policy_pool_key(mgr, weights_pool)[0] == "weights"
    assert all(p is not pool for p in mgr._torch.policy_pools.values())
    assert fake._routes() == []


@needs_policy
def test_cuda_graph_memory_under_its_tag_released_on_pause(env):
    fake, mgr, tms = env
    g = fake.cuda.CUDAGraph()
    with tms.region("weights", enable_cpu_backup=True):   # capture may sit in a region
        fake.alloc(MiB)
        with tms.cuda_graph(g, tag="graph"):
            pool, ptr = fake.alloc(4 * MiB)
            assert thread_tag(mgr) == "graph"
        assert thread_tag(mgr) == "weights"
    assert fake.captures[0][0] is g
    assert fake.captures[0][3] == []   # the region's routing was suspended before the capture
    assert fake.captures[0][2] == "relaxed"
    key = policy_pool_key(mgr, pool)
    assert key[0] == "graph" and key[3] == "graph" and fake.captures[0][1] == pool.id
    assert tags(mgr)["graph"]["bytes"] == 4 * MiB
    released = tms.pause("graph")["bytes_released"]
    assert released >= 4 * MiB
    assert tags(mgr)["weights"]["state"] == "awake"
    tms.resume("graph")


@needs_policy
@pytest.mark.parametrize("preload", [False, True])
def test_cuda_graph_sets_the_c_configuration_as_a_region_does(env, monkeypatch, preload):
    """Under torch_memory_saver's preload name the interesting region is off
    outside regions: a capture that set only the tag left the graph's pool
    uncaptured, and pause("graph") released nothing (its cuda_graph test on
    the H200)."""
    fake, mgr, tms = env
    if preload:
        monkeypatch.setattr(importlib.import_module("dormant.torch_memory_saver"),
                            "preload_active", lambda: True)
        tms.hook_mode = "preload"
    cdll = tms._impl._binary_wrapper.cdll
    cdll.tms_set_interesting_region(False)
    try:
        with tms.cuda_graph(fake.cuda.CUDAGraph(), tag="graph", enable_cpu_backup=True):
            assert cdll.tms_get_interesting_region()
            assert cdll.tms_get_current_tag() == b"graph"
            assert cdll.tms_get_enable_cpu_backup()
        assert not cdll.tms_get_interesting_region()
        assert cdll.tms_get_current_tag() == b"default"
    finally:
        cdll.tms_set_interesting_region(True)


@needs_policy
def test_cuda_graph_given_pool_is_replaced_and_said_once(env):
    fake, mgr, tms = env
    with pytest.warns(RuntimeWarning, match="pool"):
        with tms.cuda_graph(fake.cuda.CUDAGraph(), pool=(9, 9), tag="graph"):
            fake.alloc(MiB)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with tms.cuda_graph(fake.cuda.CUDAGraph(), pool=(9, 9), tag="graph"):
            pass


# ---- pause and resume ---------------------------------------------------------

@needs_policy
def test_pause_quirks_are_no_ops(env):
    fake, mgr, tms = env
    assert tms.pause("never_used") is None       # a tag never used
    assert tms.resume("never_used") is None
    assert tms.pause() is not None               # no tags at all: fine
    with tms.region("a", enable_cpu_backup=True):
        fake.alloc(MiB)
    assert tms.pause("a")["changed"]
    assert not tms.pause("a")["changed"]         # twice: nothing more
    assert not tms.pause()["changed"]
    assert tms.resume("a")["changed"]
    assert not tms.resume("a")["changed"]
    assert "never_used" not in tags(mgr)


@needs_policy
def test_tags_paused_and_resumed_selectively(env):
    fake, mgr, tms = env
    with tms.region("type1", enable_cpu_backup=True):
        _, p1 = fake.alloc(MiB)
    with tms.region("type2", enable_cpu_backup=True):
        _, p2 = fake.alloc(MiB)
    mgr.copy_to_device(p1, pattern(MiB, 6))
    mgr.copy_to_device(p2, pattern(MiB, 7))
    tms.pause("type1")
    assert {k: v["state"] for k, v in tags(mgr).items()} == {"type1": "asleep",
                                                               "type2": "awake"}
    tms.pause("type2")
    tms.resume("type2")
    assert tags(mgr)["type1"]["state"] == "asleep"
    assert mgr.copy_to_host(p2, MiB) == pattern(MiB, 7)
    tms.resume()
    assert mgr.copy_to_host(p1, MiB) == pattern(MiB, 6)


@needs_policy
def test_resume_without_memory_raises_and_can_be_retried(env):
    """Where torch_memory_saver exits the process: OutOfMemoryError, the tag
    stays paused with its host copy, and the same resume works later."""
    fake, mgr, tms = env
    with tms.region("weights", enable_cpu_backup=True):
        _, ptr = fake.alloc(8 * MiB)
    mgr.copy_to_device(ptr, pattern(8 * MiB, 8))
    tms.pause("weights")
    mgr.debug_occupy(256 * MiB)                  # another process took it all
    with pytest.raises(dormant.OutOfMemoryError):
        tms.resume("weights")
    assert tags(mgr)["weights"]["state"] == "asleep"
    mgr.debug_occupy(0)
    assert tms.resume("weights")["changed"]
    assert mgr.copy_to_host(ptr, 8 * MiB) == pattern(8 * MiB, 8)


@needs_policy
def test_http_sees_the_program_s_tags(env):
    fake, mgr, tms = env
    with tms.region("kv_cache"):
        fake.alloc(MiB)
    with tms.region("weights", enable_cpu_backup=True):
        fake.alloc(MiB)
    with mgr.serve(quiet=True) as server:
        r = http("POST", server.url + "/sleep", {"tags": ["kv_cache"]})
        assert r.status == 200, r
        stats = http("GET", server.url + "/stats").json
        states = {t["tag"]: t["state"] for t in stats["tags"]}
        assert states == {"kv_cache": "asleep", "weights": "awake"}
        assert not tms.pause("kv_cache")["changed"]   # HTTP put it to sleep already
        tms.resume("kv_cache")
        metrics = http("GET", server.url + "/metrics").text
        assert 'tag="kv_cache"' in metrics and 'tag="weights"' in metrics


# ---- attributes ----------------------------------------------------------------

def test_hook_mode_defaults_to_torch_and_preload_falls_back_once(env, monkeypatch):
    fake, mgr, tms = env
    monkeypatch.setattr(importlib.import_module("dormant.torch_memory_saver"),
                        "preload_active", lambda: False)
    assert tms.enabled is True
    tms.hook_mode = "preload"
    assert tms.hook_mode == "preload"
    with pytest.warns(RuntimeWarning, match="hook_mode='preload'"):
        tms.pause()
    assert tms.hook_mode == "torch"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tms.pause()
    with pytest.raises(dormant.InvalidArgumentError):
        tms.hook_mode = "ptrace"


def test_preload_mode_sets_only_tag_and_policy(env, monkeypatch):
    """Under whole-process capture regions use pools on PyTorch's own
    allocator (cudaMalloc, which the shim captures) and set the thread's tag."""
    fake, mgr, tms = env
    monkeypatch.setattr(importlib.import_module("dormant.torch_memory_saver"),
                        "preload_active", lambda: True)
    if not has_thread_policy(mgr):
        pytest.skip("libdormant has no dormant_set_thread_policy yet")
    monkeypatch.setenv("TMS_INIT_ENABLE_CPU_BACKUP", "0")
    with tms.region("weights", enable_cpu_backup=True):
        pool, ptr = fake.alloc(MiB)
        assert thread_tag(mgr) == "weights"
    assert tms.hook_mode == "preload"
    assert tags(mgr)["default"]["policy"] == "discard"   # memory outside regions: no backup
    assert ptr is None and pool.allocator is None
    assert policy_pool_key(mgr, pool) == ("weights", "keep", 0, "plain")


def test_memory_margin_refuses_a_resume_and_loses_nothing(env):
    fake, mgr, tms = env
    with tms.region("w", enable_cpu_backup=True):
        _, ptr = fake.alloc(16 * MiB)
    mgr.copy_to_device(ptr, pattern(16 * MiB, 7))
    tms.pause("w")
    free = mgr.stats()["devices"][0]["free_bytes"]
    tms.memory_margin_bytes = free - 8 * MiB   # waking 16 MiB would leave less
    assert tms.memory_margin_bytes == free - 8 * MiB
    with pytest.raises(dormant.OutOfMemoryError, match="memory_margin_bytes"):
        tms.resume("w")
    assert tags(mgr)["w"]["state"] == "asleep"
    assert tags(mgr)["w"]["device_bytes"] == 0          # nothing was mapped
    tms.memory_margin_bytes = free - 32 * MiB
    tms.resume("w")                                     # the retry works
    assert mgr.copy_to_host(ptr, 16 * MiB) == pattern(16 * MiB, 7)
    with pytest.raises(dormant.InvalidArgumentError):
        tms.memory_margin_bytes = -1


@needs_policy
def test_retain_cpu_backup_switches_the_running_manager(env, monkeypatch):
    fake, mgr, tms = env
    with tms.region("w", enable_cpu_backup=True):
        _, ptr = fake.alloc(MiB)
    x = DeviceTensor(fake, ptr, MiB)
    mgr.copy_to_device(ptr, pattern(MiB, 3))
    tms.retain_cpu_backup = True
    assert tms.retain_cpu_backup and mgr.host_mode == "retain"
    tms.pause()
    first = tms.get_cpu_backup(x, zero_copy=True)
    tms.resume()
    kept = tms.get_cpu_backup(x, zero_copy=True)        # awake: the retained copy
    assert kept is not None and kept.data_ptr() == first.data_ptr()
    assert kept.tobytes() == pattern(MiB, 3)
    tms.retain_cpu_backup = False
    assert mgr.host_mode == "release"
    tms.pause()
    tms.resume()
    assert tms.get_cpu_backup(x) is None                 # given back by that resume
    # Before the default manager exists it becomes its host mode.
    monkeypatch.setattr(dormant, "_default", None)
    monkeypatch.setattr(dormant, "_default_options", {})
    tms.retain_cpu_backup = True
    assert dormant._default_options == {"host_mode": "retain"}


@needs_policy
def test_get_cpu_backup_while_paused(env):
    fake, mgr, tms = env
    with tms.region("w", enable_cpu_backup=True):
        _, ptr = fake.alloc(4 * MiB)
    with tms.region("g"):
        _, grad = fake.alloc(MiB)
    x = DeviceTensor(fake, ptr, 4 * MiB)
    mgr.copy_to_device(ptr, pattern(4 * MiB, 8))
    assert tms.get_cpu_backup(x) is None                 # awake
    tms.pause()
    copy = tms.get_cpu_backup(x)
    assert isinstance(copy.buf, bytearray) and copy.tobytes() == pattern(4 * MiB, 8)
    view = tms.get_cpu_backup(x, zero_copy=True)
    assert view.data_ptr() == mgr.host_backup(ptr, 4 * MiB)
    assert view.tobytes() == pattern(4 * MiB, 8)
    assert tms.get_cpu_backup(DeviceTensor(fake, grad, MiB)) is None   # no backup
    assert tms.get_cpu_backup(DeviceTensor(fake, 4096, 16)) is None    # not dormant's
    tms.resume()
    assert tms.get_cpu_backup(x) is None


@needs_policy
def test_get_cpu_backup_of_a_packed_copy_is_a_copy_said_once(env):
    """A mark inside the tensor: the host copy holds it in two pieces, so
    zero_copy gives a copy (the marked bytes zero, as the resume gives them)."""
    fake, mgr, tms = env
    with tms.region("w", enable_cpu_backup=True):
        _, ptr = fake.alloc(4 * MiB)
    data = pattern(4 * MiB, 9)
    mgr.copy_to_device(ptr, data)
    mgr.mark_unused(ptr + MiB, MiB)
    tms.pause()
    with pytest.warns(RuntimeWarning, match="in pieces"):
        got = tms.get_cpu_backup(DeviceTensor(fake, ptr, 4 * MiB), zero_copy=True)
    assert isinstance(got.buf, bytearray)
    assert got.tobytes() == data[:MiB] + bytes(MiB) + data[2 * MiB:]
    tms.resume()


@needs_policy
@pytest.mark.parametrize("backend", ["pinned", "mmap"])
def test_resume_returns_with_the_host_memory_back(env, monkeypatch, backend):
    """Release mode gives host copies back on worker threads; resume()
    returns only once they are back, with either backend, as
    torch_memory_saver's does (their pinning holds device memory too: its
    test_training_engine measures it). The release is made slow here: stats
    say the copy is still held for a few reads."""
    fake, mgr, tms = env
    with tms.region("m", enable_cpu_backup=True, cpu_backup_backend=backend):
        _, ptr = fake.alloc(4 * MiB)
    data = bytes(range(256)) * (4 * MiB // 256)
    mgr.copy_to_device(ptr, data)
    tms.pause()
    assert tags(mgr)["m"]["host_bytes"] >= 4 * MiB
    real_stats, held_reads = mgr.stats, []

    def slow_release_stats():
        st = real_stats()
        m = next(t for t in st["tags"] if t["tag"] == "m")
        if m["state"] == "awake" and len(held_reads) < 3:
            held_reads.append(1)
            m["host_bytes"] = 4096
        return st

    monkeypatch.setattr(mgr, "stats", slow_release_stats)
    tms.resume()
    assert len(held_reads) == 3                 # it waited through them
    assert tags(mgr)["m"]["host_bytes"] == 0
    assert mgr.copy_to_host(ptr, 4 * MiB) == data


def test_the_c_library_is_reachable_as_in_torch_memory_saver(env):
    fake, mgr, tms = env
    cdll = tms._impl._binary_wrapper.cdll
    with tms.region("kv", enable_cpu_backup=True, cpu_backup_backend="mmap"):
        assert cdll.tms_get_current_tag() == b"kv"
        assert cdll.tms_get_enable_cpu_backup() and not cdll.tms_get_enable_disk_backup()
        assert cdll.tms_get_cpu_backup_backend() == b"mmap"
        with tms.region("grads"):
            assert cdll.tms_get_current_tag() == b"grads"
            assert not cdll.tms_get_enable_cpu_backup()
        assert cdll.tms_get_current_tag() == b"kv"
    assert cdll.tms_get_current_tag() == b"default"
    assert cdll.tms_get_cpu_backup_backend() == b"pinned"
    assert isinstance(tms._impl._mem_pools, dict) and tms._impl._mem_pools


def test_get_cpu_backup_of_what_is_no_tensor_is_a_clear_error(env):
    fake, mgr, tms = env
    with pytest.raises(dormant.InvalidArgumentError, match="needs a tensor"):
        tms.get_cpu_backup(object())


@needs_policy
def test_disk_backup_goes_to_files_of_the_directory(env, tmp_path, monkeypatch):
    fake, mgr, tms = env
    monkeypatch.setenv("DORMANT_DISK_NAMES", "0")  # the manager exists: no effect
    monkeypatch.setenv("TMS_DISK_BACKUP_CHUNK_MB", "1")
    monkeypatch.delenv("DORMANT_DISK_CHUNK_BYTES", raising=False)
    target = tmp_path / "made"  # created by set_disk_backup_dir(), as TMS does
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # honoured now: nothing to say
        tms.set_disk_backup_dir(target)
        with tms.region("w", enable_disk_backup=True):
            _, ptr = fake.alloc(3 * MiB)
    assert target.is_dir() and mgr.option("disk_dir") == str(target)
    assert os.environ["DORMANT_DISK_CHUNK_BYTES"] == "1MiB"
    mgr.copy_to_device(ptr, pattern(3 * MiB, 9))
    tms.pause("w")
    w = tags(mgr)["w"]
    assert w["host_bytes"] == 0 and w["disk_bytes"] >= 3 * MiB
    tms.resume("w")
    assert mgr.copy_to_host(ptr, 3 * MiB) == pattern(3 * MiB, 9)
    assert tags(mgr)["w"]["disk_bytes"] == 0


@needs_policy
@pytest.mark.parametrize("host_mode", ["release", "retain"])
def test_get_cpu_backup_of_a_disk_backed_tensor_is_none(env, tmp_path, host_mode):
    # as torch_memory_saver's: a disk-backed allocation has no copy in host
    # memory (its tms_get_cpu_backup_pointer() answers NULL for one, paused
    # or not, and get_cpu_backup() None); the data is read back on resume
    fake, mgr, tms = env
    tms.retain_cpu_backup = host_mode == "retain"
    tms.set_disk_backup_dir(tmp_path)
    with tms.region("w", enable_disk_backup=True):
        _, ptr = fake.alloc(2 * MiB)
    with tms.region("w", enable_cpu_backup=True):
        _, kept = fake.alloc(MiB)
    x = DeviceTensor(fake, ptr, 2 * MiB)
    mgr.copy_to_device(ptr, pattern(2 * MiB, 10))
    mgr.copy_to_device(kept, pattern(MiB, 11))
    cdll = tms._impl._binary_wrapper.cdll
    u8p = ctypes.POINTER(ctypes.c_uint8)
    assert tms.get_cpu_backup(x) is None                          # awake
    for _ in range(2):   # the second cycle: retain mode keeps host copies by then
        tms.pause("w")
        assert tags(mgr)["w"]["disk_bytes"] >= 2 * MiB
        assert tms.get_cpu_backup(x) is None                      # paused: in a file
        assert tms.get_cpu_backup(x, zero_copy=True) is None
        assert not cdll.tms_get_cpu_backup_pointer(ctypes.cast(ptr, u8p), 2 * MiB)
        got = tms.get_cpu_backup(DeviceTensor(fake, kept, MiB))   # the kept one beside it
        assert got is not None and got.tobytes() == pattern(MiB, 11)
        tms.resume("w")
        assert tms.get_cpu_backup(x) is None                      # awake, retained or not
        assert mgr.copy_to_host(ptr, 2 * MiB) == pattern(2 * MiB, 10)


def test_expandable_segments_refused(env, monkeypatch):
    fake, mgr, tms = env
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    with pytest.raises(dormant.UnsupportedError, match="expandable_segments"):
        with tms.region():
            pass


def test_configure_subprocess_uses_dormant_preload(monkeypatch):
    module = importlib.import_module("dormant.torch_memory_saver")
    fake_preload = types.ModuleType("dormant.preload")
    def environment(env=None):
        out = {**env, "LD_PRELOAD": "/x/libdormant-preload.so", "DORMANT_CAPTURE": "1"}
        out.pop("DORMANT_LISTEN", None)          # a child gets no server of its own
        return out

    fake_preload.environment = environment
    monkeypatch.setitem(sys.modules, "dormant.preload", fake_preload)
    monkeypatch.setattr(dormant, "preload", fake_preload, raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.setenv("DORMANT_CAPTURE", "0")
    monkeypatch.setenv("DORMANT_LISTEN", "127.0.0.1:8787")
    monkeypatch.delenv("TMS_INIT_ENABLE", raising=False)
    with module.configure_subprocess():
        assert os.environ["LD_PRELOAD"] == "/x/libdormant-preload.so"
        assert os.environ["DORMANT_CAPTURE"] == "1"
        assert os.environ["TMS_INIT_ENABLE"] == "0"   # torch_memory_saver's: regions only
        assert "DORMANT_LISTEN" not in os.environ
    assert "LD_PRELOAD" not in os.environ and os.environ["DORMANT_CAPTURE"] == "0"
    assert "TMS_INIT_ENABLE" not in os.environ
    monkeypatch.setenv("TMS_INIT_ENABLE", "1")
    with module.configure_subprocess():
        assert os.environ["TMS_INIT_ENABLE"] == "1"
    assert os.environ["DORMANT_LISTEN"] == "127.0.0.1:8787"


# ---- the switch ------------------------------------------------------------------

PROBE = ("import importlib.util, sys\n"
         "spec = importlib.util.find_spec('torch_memory_saver')\n"
         "if spec is None:\n"
         "    print('absent')\n"
         "    sys.exit(0)\n"
         "import torch_memory_saver as t\n"
         "from torch_memory_saver import torch_memory_saver, TorchMemorySaver\n"
         "from torch_memory_saver.hooks.mode_preload import configure_subprocess\n"
         "from torch_memory_saver.entrypoint import TorchMemorySaver as T2\n"
         "from torch_memory_saver.testing_utils import get_and_print_gpu_memory\n"
         "print(getattr(t, '__dormant__', False), type(torch_memory_saver).__module__,\n"
         "      T2 is TorchMemorySaver)\n")


def run_python(args, env=None):
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = str(PYTHON_DIR)
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_hook_util_create_gives_each_mode_its_class():
    program = ("from torch_memory_saver.hooks.base import HookUtilBase\n"
               "p = HookUtilBase.create('preload')\n"
               "t = HookUtilBase.create('torch')\n"
               "print(type(p).__name__, type(t).__name__,\n"
               "      p.get_path_binary().endswith('.so'), p.get_allocator())\n"
               "try:\n"
               "    HookUtilBase.create('other')\n"
               "except KeyError as e:\n"
               "    print('KeyError', e)\n")
    r = run_python(["-m", "dormant.run", "--torch-memory-saver", "--",
                    sys.executable, "-c", program])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["HookUtilModePreload", "HookUtilModeTorch", "True", "None",
                                "KeyError", "'other'"]


def test_without_the_switch_nothing_is_shadowed():
    r = run_python(["-c", "import dormant, dormant.torch_memory_saver\n" + PROBE])
    assert r.returncode == 0, r.stderr
    assert "dormant.torch_memory_saver" not in r.stdout     # absent, or the real package


def test_the_switch_gives_dormant_to_the_program_and_its_children():
    r = run_python(["-m", "dormant.run", "--torch-memory-saver", "--",
                    sys.executable, "-c", PROBE])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "dormant.torch_memory_saver", "True"]
    child = ("import subprocess, sys\n"
             f"sys.exit(subprocess.run([sys.executable, '-c', {PROBE!r}]).returncode)\n")
    r = run_python(["-m", "dormant.run", "--torch-memory-saver", sys.executable, "-c", child])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:2] == ["True", "dormant.torch_memory_saver"]


def test_a_tms_program_runs_unchanged_under_the_switch():
    """A program written for torch_memory_saver (pause/resume of named tags,
    the attributes it sets), on the host backend where it needs no torch."""
    program = ("from torch_memory_saver import torch_memory_saver\n"
               "torch_memory_saver.hook_mode = 'torch'\n"
               "torch_memory_saver.pause('kv_cache')\n"
               "torch_memory_saver.pause()\n"
               "torch_memory_saver.resume()\n"
               "import dormant\n"
               "print('ok', dormant.manager().backend)\n")
    env = dict(os.environ, DORMANT_BACKEND="host")
    r = run_python(["-m", "dormant.run", "--torch-memory-saver", "--",
                    sys.executable, "-c", program], env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "host"]


def test_run_refuses_bad_usage():
    r = run_python(["-m", "dormant.run", "--", "true"])
    assert r.returncode == 2 and "nothing to do" in r.stderr
    r = run_python(["-m", "dormant.run", "--torch-memory-saver"])
    assert r.returncode == 2 and "no command" in r.stderr
    r = run_python(["-m", "dormant.run", "--bogus", "true"])
    assert r.returncode == 2 and "unknown option" in r.stderr
    r = run_python(["-m", "dormant.run", "--torch-memory-saver", "--print-env"])
    assert r.returncode == 0
    line = next(x for x in r.stdout.splitlines() if x.startswith("PYTHONPATH="))
    assert line.split("=", 1)[1].split(os.pathsep)[0].endswith("shadow")


def test_capture_is_detected_as_dormant_run_sets_it(monkeypatch):
    module = importlib.import_module("dormant.torch_memory_saver")
    bare = types.ModuleType("dormant.preload")                  # no active(), no library_path()
    monkeypatch.setitem(sys.modules, "dormant.preload", bare)
    monkeypatch.setattr(dormant, "preload", bare, raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libasan.so /b/preload/libdormant-preload.so")
    monkeypatch.setenv("DORMANT_PRELOAD", "1")
    assert module.preload_active()
    monkeypatch.setenv("DORMANT_PRELOAD", "0")                  # preloaded, switched off
    assert not module.preload_active()
    monkeypatch.setenv("DORMANT_PRELOAD", "1")
    monkeypatch.setenv("LD_PRELOAD", "/b/libdormant-preloader.so")
    assert not module.preload_active()


@needs_policy
def test_free_blocks_of_the_per_policy_pools_are_not_copied(env, monkeypatch):
    """The glue's before-sleep marking covers the pools of tms regions: a
    block the caching allocator holds free is skipped by the pause and comes
    back zero-filled, the rest of the segment intact."""
    fake, mgr, tms = env
    with tms.region("w", enable_cpu_backup=True):
        pool, ptr = fake.alloc(4 * MiB)
    data = pattern(4 * MiB, 12)
    mgr.copy_to_device(ptr, data)
    glue_module = sys.modules["dormant._torch"]
    monkeypatch.setattr(glue_module, "free_blocks",
                        lambda p: [(ptr + MiB, MiB)] if p is pool else [])
    report = tms.pause("w")
    assert report["bytes_skipped"] == MiB, report
    tms.resume("w")
    back = mgr.copy_to_host(ptr, 4 * MiB)
    assert back[:MiB] == data[:MiB] and back[2 * MiB:] == data[2 * MiB:]
    assert back[MiB:2 * MiB] == bytes(MiB)


_NESTED = r"""
import importlib, sys
sys.path[:0] = sys.argv[1:3]
import test_torch_memory_saver as t
fake = t.FakeTorchTMS()
sys.modules["torch"] = fake
import dormant
mgr = dormant.Manager(backend="host", host_device_bytes=64 << 20)
dormant.Manager.backend = property(lambda self: "cuda")
dormant._default = mgr
tms_module = importlib.import_module("dormant.torch_memory_saver")
tms_module.preload_active = lambda: True
tms = tms_module.TorchMemorySaver()
tms.hook_mode = "preload"
tms._ensure_initialized()
cdll = tms._impl._binary_wrapper.cdll
states = [cdll.tms_get_enable_cpu_backup()]
with tms.region(tag="grad_buffer", enable_cpu_backup=False):
    states.append(cdll.tms_get_enable_cpu_backup())
states.append(cdll.tms_get_enable_cpu_backup())
print(states)
"""


def test_a_nested_region_without_backup_gives_the_outer_its_backup_back():
    """torch_memory_saver's nested_region test, in a fresh process (the
    thread's configuration is still the $TMS_INIT_* one there): with
    TMS_INIT_ENABLE_CPU_BACKUP=1 the state before, inside and after a
    region(enable_cpu_backup=False) is on, off, on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMS_")}
    env.update(TMS_INIT_ENABLE="1", TMS_INIT_ENABLE_CPU_BACKUP="1")
    r = subprocess.run([sys.executable, "-c", _NESTED, str(REPO / "tests" / "python"),
                        str(PYTHON_DIR)], env=env, capture_output=True, text=True, timeout=120,
                       cwd=str(REPO / "tests" / "python"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[True, False, True]"
