# SPDX-License-Identifier: MIT
"""The PyTorch allocator entry points (core/torch.c), called through ctypes the
way CUDAPluggableAllocator calls them, on the host backend: allocations land
under the calling thread's tag, frees give them back. torch is not needed."""
import ctypes
import threading

import pytest

from conftest import MiB


@pytest.fixture
def entry(mgr):
    cdll = mgr._lib.cdll
    malloc = cdll.dormant_torch_malloc
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    free = cdll.dormant_torch_free
    free.restype = None
    free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    assert mgr._lib.dormant_torch_set_manager(mgr._handle()) == 0
    yield mgr, malloc, free
    mgr._lib.dormant_torch_set_manager(None)
    mgr._lib.dormant_set_thread_tag(None)


def tags(mgr):
    return {t["tag"]: t for t in mgr.stats()["tags"]}


def test_malloc_under_thread_tag(entry):
    mgr, malloc, free = entry
    lib = mgr._lib
    p = malloc(2 * MiB, 0, None)
    assert p
    assert tags(mgr)["default"]["allocations"] == 1
    assert lib.dormant_set_thread_tag(b"weights") == 0
    q = malloc(4 * MiB, 0, None)
    assert tags(mgr)["weights"]["bytes"] == 4 * MiB
    # Another thread has its own tag.
    other = {}

    def worker():
        assert lib.dormant_set_thread_tag(b"grads") == 0
        other["p"] = malloc(2 * MiB, 0, None)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert tags(mgr)["grads"]["allocations"] == 1
    assert tags(mgr)["weights"]["allocations"] == 1
    for ptr in (p, q, other["p"]):
        free(ptr, 0, 0, None)
    assert all(t["allocations"] == 0 for t in tags(mgr).values())


def test_malloc_failure_returns_null_with_reason(entry):
    mgr, malloc, free = entry
    lib = mgr._lib
    assert lib.dormant_set_thread_tag(b"weights") == 0
    p = malloc(MiB, 0, None)
    mgr.sleep()
    assert malloc(MiB, 0, None) is None  # asleep: PyTorch raises out-of-memory
    assert "asleep" in lib.last_error()
    mgr.wake()
    assert malloc(512 * MiB, 0, None) is None  # more than the simulated device has
    free(p, MiB, 0, None)


def test_bad_thread_tag(entry):
    mgr, _, _ = entry
    assert mgr._lib.dormant_set_thread_tag(b"no spaces") < 0


def test_detached_manager(entry):
    mgr, malloc, free = entry
    mgr._lib.dormant_torch_set_manager(None)
    assert malloc(MiB, 0, None) is None
    assert "no dormant manager" in mgr._lib.last_error()
    free(None, 0, 0, None)  # harmless


def test_free_unknown_pointer_is_harmless(entry):
    mgr, malloc, free = entry
    free(0x1000, 4096, 0, None)
    p = malloc(MiB, 0, None)
    free(p, MiB, 0, None)
    assert tags(mgr)["default"]["allocations"] == 0
