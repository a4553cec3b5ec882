# SPDX-License-Identifier: MIT
"""dormant.region()'s routing logic, without torch or a GPU: a stand-in torch
module models what the package relies on in PyTorch (one MemPool per tag and
device, use_mem_pool routing the calling thread, the first routing begun
winning, a second routing to the same pool refused), and its allocations call
the real dormant_torch_malloc() of a host-backend manager. The checks are on
where the memory really lands: the manager's per-tag statistics."""
import contextlib
import ctypes
import importlib
import itertools
import sys
import threading
import types

import pytest

from conftest import MiB

import dormant


class FakeTorch(types.ModuleType):
    """The parts of torch that dormant/_torch.py uses."""

    def __init__(self):
        super().__init__("torch")
        self.routes = threading.local()   # per thread: [pool, ...] in begin order
        self.dtype = type("dtype", (), {})
        self.float32, self.bfloat16 = self.dtype(), self.dtype()
        self.Tensor = type("Tensor", (), {})
        self.get_default_dtype = lambda: self.float32
        self.overrides = types.SimpleNamespace(TorchFunctionMode=object)
        ids = itertools.count(1)
        fake = self

        class MemPool:
            def __init__(self, allocator):
                self.id = (0, next(ids))
                self.allocator = allocator

        class CUDAPluggableAllocator:
            def __init__(self, path, alloc_name, free_name):
                lib = ctypes.CDLL(path)
                self.malloc = getattr(lib, alloc_name)
                self.malloc.restype = ctypes.c_void_p
                self.malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]

            def allocator(self):
                return self

        @contextlib.contextmanager
        def use_mem_pool(pool, device=None):
            routes = fake._routes()
            if pool in routes:
                raise RuntimeError("beginAllocateToPool: already recording to mempool_id")
            routes.append(pool)
            try:
                yield
            finally:
                routes.remove(pool)

        @contextlib.contextmanager
        def device(index):
            yield

        self.calls = []   # empty_cache() calls, in order with other events

        class CUDAGraph:
            def capture_begin(self, pool=None):
                fake.calls.append("capture_begin")

        self._C = types.SimpleNamespace(
            _cuda_clearCublasWorkspaces=lambda: self.calls.append("clear_cublas"))
        self.cuda = types.SimpleNamespace(
            empty_cache=lambda: self.calls.append("empty_cache"), CUDAGraph=CUDAGraph,
            is_available=lambda: True, current_device=lambda: 0, device=device,
            MemPool=MemPool, use_mem_pool=use_mem_pool, OutOfMemoryError=MemoryError,
            memory=types.SimpleNamespace(CUDAPluggableAllocator=CUDAPluggableAllocator))

    def _routes(self):
        if not hasattr(self.routes, "list"):
            self.routes.list = []
        return self.routes.list

    def alloc(self, nbytes):
        """Allocate as PyTorch's caching allocator would: from the first pool
        this thread routes to (through the pool's allocator), else from
        ordinary memory (None here)."""
        routes = self._routes()
        if not routes:
            return None, None
        pool = routes[0]
        ptr = pool.allocator.malloc(nbytes, 0, None)
        assert ptr, "dormant_torch_malloc failed"
        return pool, ptr


@pytest.fixture
def glue(monkeypatch, mgr):
    fake = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.delitem(sys.modules, "dormant._torch", raising=False)
    module = importlib.import_module("dormant._torch")
    monkeypatch.setattr(dormant, "_torch", module, raising=False)
    # The simulated device stands in for CUDA here.
    monkeypatch.setattr(dormant.Manager, "backend", property(lambda self: "cuda"))
    yield fake, mgr, module
    mgr.close()  # detaches the process-wide allocator entry points
    module._attached = None
    monkeypatch.delitem(sys.modules, "dormant._torch", raising=False)


def per_tag(mgr):
    return {t["tag"]: t for t in mgr.stats()["tags"]}


def thread_tag(mgr):
    buf = ctypes.create_string_buffer(64)
    mgr._lib.dormant_get_thread_tag(buf, 64)
    return buf.value.decode()


def pool_tag(mgr, pool):
    return next(tag for (tag, _), p in mgr._torch.pools.items() if p is pool)


def test_region_allocates_under_its_tag(glue):
    fake, mgr, _ = glue
    with mgr.region("weights"):
        pool, ptr = fake.alloc(2 * MiB)
        assert thread_tag(mgr) == "weights"
    assert pool_tag(mgr, pool) == "weights"
    assert per_tag(mgr)["weights"]["bytes"] == 2 * MiB
    assert thread_tag(mgr) == "default"
    assert fake.alloc(MiB) == (None, None)  # outside: ordinary memory
    mgr.free(ptr)


def test_policy_argument(glue):
    fake, mgr, _ = glue
    with mgr.region("grads", policy="discard"):
        fake.alloc(MiB)
    assert per_tag(mgr)["grads"]["policy"] == "discard"


def test_nested_regions_inner_wins_then_outer_again(glue):
    fake, mgr, _ = glue
    with mgr.region("weights"):
        p1, _ = fake.alloc(MiB)
        with mgr.region("grads", policy="discard"):
            p2, _ = fake.alloc(MiB)
            with mgr.region("weights"):  # the same pool again, nested
                p3, _ = fake.alloc(MiB)
            p4, _ = fake.alloc(MiB)
        p5, _ = fake.alloc(MiB)
        assert thread_tag(mgr) == "weights"
    tags = [pool_tag(mgr, p) for p in (p1, p2, p3, p4, p5)]
    assert tags == ["weights", "grads", "weights", "grads", "weights"]
    stats = per_tag(mgr)
    assert stats["weights"]["allocations"] == 3
    assert stats["grads"]["allocations"] == 2
    assert fake._routes() == []
    assert thread_tag(mgr) == "default"


def test_one_pool_per_tag(glue):
    fake, mgr, _ = glue
    with mgr.region("a"):
        pa, _ = fake.alloc(MiB)
    with mgr.region("a"):
        pb, _ = fake.alloc(MiB)
    with mgr.region("b"):
        pc, _ = fake.alloc(MiB)
    assert pa is pb
    assert pc is not pa


def test_regions_are_per_thread(glue):
    fake, mgr, _ = glue
    other = {}

    def worker():
        other["plain"] = fake.alloc(MiB)          # main thread's region: not ours
        with mgr.region("worker"):
            other["tag"] = thread_tag(mgr)
            other["pool"], _ = fake.alloc(MiB)

    with mgr.region("main"):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        p, _ = fake.alloc(MiB)
    assert other["plain"] == (None, None)
    assert other["tag"] == "worker"
    assert pool_tag(mgr, other["pool"]) == "worker"
    assert pool_tag(mgr, p) == "main"


def test_exception_inside_region_restores_routing(glue):
    fake, mgr, _ = glue
    with pytest.raises(KeyError):
        with mgr.region("weights"):
            with mgr.region("grads"):
                raise KeyError("boom")
    assert fake._routes() == []
    assert thread_tag(mgr) == "default"


def test_bad_tag_changes_nothing(glue):
    fake, mgr, _ = glue
    with mgr.region("weights"):
        with pytest.raises(dormant.InvalidArgumentError):
            with mgr.region("bad tag"):
                pass
        assert thread_tag(mgr) == "weights"
        p, _ = fake.alloc(MiB)
    assert pool_tag(mgr, p) == "weights"


def test_one_manager_per_process(glue):
    fake, mgr, _ = glue
    with mgr.region("weights"):
        pass
    other = dormant.Manager(backend="host", host_device_bytes=64 * MiB)
    try:
        with pytest.raises(dormant.BusyError):
            with other.region("weights"):
                pass
    finally:
        other.close()


def test_region_needs_the_cuda_backend(monkeypatch, mgr):
    monkeypatch.setitem(sys.modules, "torch", FakeTorch())
    monkeypatch.delitem(sys.modules, "dormant._torch", raising=False)
    with pytest.raises(dormant.NoDeviceError) as e:
        with mgr.region("weights"):
            pass
    assert "host" in str(e.value)
    monkeypatch.delitem(sys.modules, "dormant._torch", raising=False)


def test_dtype_tags_route_per_call():
    """With real torch (on the CPU; skipped where torch is missing): the
    TorchFunctionMode behind dtype_tags switches to the mapped tag exactly for
    the calls of that dtype."""
    torch = pytest.importorskip("torch")
    sys.modules.pop("dormant._torch", None)
    module = importlib.import_module("dormant._torch")
    switched = []

    class RecordingGlue:
        @contextlib.contextmanager
        def switch(self, tag):
            switched.append(tag)
            yield

    with module._DtypeTagMode(RecordingGlue(), {torch.float32: "grads"}):
        switched.clear()
        torch.zeros(4, dtype=torch.bfloat16)
        assert switched == []
        torch.zeros(4, dtype=torch.float32)
        assert switched == ["grads"]
        half = torch.ones(4, dtype=torch.bfloat16)
        switched.clear()
        half.to(torch.float32)                      # a positional dtype
        assert switched == ["grads"]
        switched.clear()
        torch.empty(4)                              # the default dtype
        assert switched == ["grads"]
        switched.clear()
        half * 2                                    # dtype of the first tensor
        assert switched == []
    sys.modules.pop("dormant._torch", None)


def test_sleep_gives_back_pytorchs_cache_by_default(glue):
    """Issue 16 §3: a sleep empties the caching allocator's cache (PyTorch's
    ordinary memory) first, from Python and over HTTP, before the marks are
    taken; once per sleep."""
    fake, mgr, _ = glue
    assert mgr.empty_cache_on_sleep is True
    with mgr.region("weights"):
        _, ptr = fake.alloc(MiB)
    real = mgr._torch.mark_free_blocks
    mgr._torch.mark_free_blocks = lambda tags: (fake.calls.append("mark"), real(tags))[1]
    mgr.sleep()
    assert fake.calls == ["clear_cublas", "empty_cache", "mark"]
    mgr.wake()
    server = mgr.serve()
    try:
        import urllib.request
        urllib.request.urlopen(urllib.request.Request(server.url + "/sleep", data=b"",
                                                      method="POST"), timeout=30).read()
    finally:
        server.stop()
    assert fake.calls == ["clear_cublas", "empty_cache", "mark"] * 2
    mgr.wake()
    mgr.free(ptr)


def test_empty_cache_on_sleep_opt_out(glue, monkeypatch):
    fake, mgr, _ = glue
    with mgr.region("weights"):
        _, ptr = fake.alloc(MiB)
    mgr.empty_cache_on_sleep = False
    mgr.sleep()
    mgr.wake()
    assert "empty_cache" not in fake.calls and "clear_cublas" not in fake.calls
    mgr.free(ptr)
    monkeypatch.setenv("DORMANT_TORCH_EMPTY_CACHE", "0")
    other = dormant.Manager.__new__(dormant.Manager)
    other._init_state()
    assert other.empty_cache_on_sleep is False
    monkeypatch.delenv("DORMANT_TORCH_EMPTY_CACHE")
    other._init_state()
    assert other.empty_cache_on_sleep is True


def test_cublas_workspaces_stay_once_a_cuda_graph_was_captured(glue):
    """A graph may hold a cuBLAS workspace's address (PyTorch issue 193402):
    auto clears the workspaces until the first capture, then never; True
    clears them anyway, False never."""
    fake, mgr, module = glue
    assert mgr.clear_cublas_on_sleep is None  # auto
    with mgr.region("weights"):
        _, ptr = fake.alloc(MiB)
    mgr.sleep()
    mgr.wake()
    assert fake.calls.count("clear_cublas") == 1
    assert mgr._torch.cublas_last == "cleared"
    fake.cuda.CUDAGraph().capture_begin()   # through the wrapped method
    assert fake.calls[-1] == "capture_begin"
    mgr.sleep()
    mgr.wake()
    assert fake.calls.count("clear_cublas") == 1
    assert "CUDA graph" in mgr._torch.cublas_last
    mgr.clear_cublas_on_sleep = True
    mgr.sleep()
    mgr.wake()
    assert fake.calls.count("clear_cublas") == 2
    mgr.clear_cublas_on_sleep = False
    module._graphs_captured = 0
    mgr.sleep()
    mgr.wake()
    assert fake.calls.count("clear_cublas") == 2
    mgr.free(ptr)


def test_cublas_workspaces_stay_beside_a_dormant_graph_pool(glue):
    fake, mgr, module = glue
    with mgr.region("weights"):
        _, ptr = fake.alloc(MiB)
    mgr._torch.policy_pools[("weights", 0, 0, "graph")] = object()
    assert module._graphs_captured == 0
    mgr.sleep()
    mgr.wake()
    assert "clear_cublas" not in fake.calls and "empty_cache" in fake.calls
    mgr.free(ptr)


def test_clear_cublas_env(monkeypatch):
    other = dormant.Manager.__new__(dormant.Manager)
    for text, want in (("", None), ("auto", None), ("1", True), ("0", False)):
        monkeypatch.setenv("DORMANT_TORCH_CLEAR_CUBLAS", text)
        other._init_state()
        assert other.clear_cublas_on_sleep is want
    monkeypatch.setenv("DORMANT_TORCH_CLEAR_CUBLAS", "yes")
    with pytest.raises(dormant.InvalidArgumentError, match="auto, 1 or 0"):
        other._init_state()


def test_empty_cache_failure_does_not_cancel_the_sleep(glue):
    fake, mgr, _ = glue
    with mgr.region("weights"):
        _, ptr = fake.alloc(MiB)

    def broken():
        raise RuntimeError("CUDA error")
    fake.cuda.empty_cache = broken
    report = mgr.sleep()
    assert report["result"] == "ok" and report["state"] == "asleep"
    mgr.wake()
    mgr.free(ptr)
