# SPDX-License-Identifier: MIT
"""A stand-in for torch in CI (no GPU, no PyTorch): the parts that
dormant.torch_memory_saver and dormant._torch use, over a model of PyTorch's
caching allocator that calls the CUDA runtime as PyTorch does.

tests/preload/tms_contract.py runs with this folder on PYTHONPATH, under the
capture shim (libdormant-preload.so) and the fake CUDA runtime
(tests/preload/fake_cudart.c, loaded here RTLD_GLOBAL as libtorch_cuda loads
libcudart), on the host backend, where device memory is host memory and an
unmapped (paused) range faults when touched.

The model keeps what matters for where memory lands:
  - pools: the default pool, and one per torch.cuda.MemPool; a thread's
    allocations go to the pool it routes to (use_mem_pool(), per thread; the
    routing begun first wins), else to the default pool;
  - segments: a pool takes a new segment from its allocator (cudaMalloc,
    resolved in the process's global scope, so the shim's when preloaded; or
    a CUDAPluggableAllocator's malloc) only when none of its free cached
    blocks fits; small requests (<= 1 MiB) share 2 MiB segments, larger ones
    get a segment of their size rounded to 2 MiB;
  - blocks: a tensor's block goes back to its own pool's cache when the
    tensor is dropped, and is handed out again by that pool only;
  - empty_cache() gives back (cudaFree) every segment none of whose blocks
    is in use, of the default pool and of pools whose MemPool is gone (a
    MemPool going away gives its unused segments back at once); a failed
    cudaMalloc empties the cache and tries once more, then raises
    torch.cuda.OutOfMemoryError.
"""
import contextlib
import ctypes
import itertools
import os
import threading
import types

_cudart = ctypes.CDLL(os.environ["DORMANT_TEST_FAKE_CUDART"], mode=ctypes.RTLD_GLOBAL)
_process = ctypes.CDLL(None)   # cudaMalloc as PyTorch binds it: the shim's if preloaded
_cuda_malloc = _process.cudaMalloc
_cuda_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
_cuda_malloc.restype = ctypes.c_int
_cuda_free = _process.cudaFree
_cuda_free.argtypes = [ctypes.c_void_p]
_cuda_free.restype = ctypes.c_int

__version__ = "0.0-dormant-test"

SMALL = 1 << 20
SMALL_SEGMENT = 2 << 20
ROUND = 512


class dtype:
    def __init__(self, name, size):
        self.name, self.itemsize = name, size

    def __repr__(self):
        return f"torch.{self.name}"


uint8 = dtype("uint8", 1)
bfloat16 = dtype("bfloat16", 2)
float32 = float = dtype("float32", 4)
get_default_dtype = lambda: float32  # noqa: E731


class OutOfMemoryError(RuntimeError):
    pass


class _Lock:
    lock = threading.RLock()


_routes = threading.local()


def _thread_routes():
    if not hasattr(_routes, "list"):
        _routes.list = []
    return _routes.list


class _Segment:
    def __init__(self, pool, ptr, size):
        self.pool, self.ptr, self.size = pool, ptr, size
        self.used = 0   # blocks in use


class _Pool:
    ids = itertools.count(1)

    def __init__(self, allocator=None, id=None):
        self.id = id if id is not None else (0, next(_Pool.ids))
        self.allocator = allocator
        self.segments = []
        self.free = []   # (ptr, size, segment), cached

    def _new_segment(self, size):
        if self.allocator is not None:
            ptr = self.allocator._malloc(size, 0, None)
            return _Segment(self, ptr, size) if ptr else None
        out = ctypes.c_void_p()
        if _cuda_malloc(ctypes.byref(out), size) != 0 or not out.value:
            return None
        return _Segment(self, out.value, size)

    def _free_segment(self, seg):
        if self.allocator is not None:
            self.allocator._free(seg.ptr, seg.size, 0, None)
        else:
            assert _cuda_free(seg.ptr) == 0, "cudaFree of a segment failed"

    def take(self, nbytes):
        size = max(ROUND, -(-nbytes // ROUND) * ROUND)
        small = size <= SMALL
        for i, (ptr, bsize, seg) in enumerate(self.free):
            if bsize >= size and (seg.size == SMALL_SEGMENT) == small:
                del self.free[i]
                if bsize > size:
                    self.free.append((ptr + size, bsize - size, seg))
                seg.used += 1
                return ptr, size, seg
        seg_size = SMALL_SEGMENT if small else -(-size // SMALL_SEGMENT) * SMALL_SEGMENT
        if seg_size == SMALL_SEGMENT and not small:
            seg_size += SMALL_SEGMENT  # a large segment never looks small
        seg = self._new_segment(seg_size)
        if seg is None:
            empty_cache()
            seg = self._new_segment(seg_size)
        if seg is None:
            raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {nbytes} bytes")
        self.segments.append(seg)
        if seg_size > size:
            self.free.append((seg.ptr + size, seg_size - size, seg))
        seg.used = 1
        return seg.ptr, size, seg

    def give_back(self, ptr, size, seg):
        seg.used -= 1
        self.free.append((ptr, size, seg))

    def release_unused(self):
        for seg in [s for s in self.segments if s.used == 0]:
            self.free = [b for b in self.free if b[2] is not seg]
            self.segments.remove(seg)
            self._free_segment(seg)

    def snapshot(self, include_traces=True):
        out = []
        for seg in self.segments:
            free = sorted((p, s) for p, s, g in self.free if g is seg)
            out.append({"address": seg.ptr, "total_size": seg.size,
                        "blocks": [{"address": p, "size": s, "state": "inactive"}
                                   for p, s in free]})
        return out


_default_pool = _Pool(id=(0, 0))
_pools = [_default_pool]   # the default pool, then those whose MemPool is gone


class MemPool:
    """torch.cuda.MemPool: a handle on a pool; when it goes, the pool's
    unused segments are given back (as PyTorch's releasePool + emptyCache)."""

    def __init__(self, allocator=None):
        self._pool = _Pool(allocator)
        self.id = self._pool.id

    def snapshot(self, include_traces=True):
        return self._pool.snapshot(include_traces)

    def __del__(self):
        pool = getattr(self, "_pool", None)
        if pool is not None:
            with _Lock.lock:
                _pools.append(pool)
                pool.release_unused()


class Tensor:
    """A contiguous 1-D tensor: device memory from the model above, or host
    memory (a ctypes buffer)."""

    def __init__(self, nbytes, dtype_, device, ptr=None, block=None, keep=None):
        self.dtype = dtype_
        self.shape = (nbytes // dtype_.itemsize,)
        self.nbytes = nbytes
        self.device = types.SimpleNamespace(type=device)
        self.is_cuda = device == "cuda"
        self._ptr, self._block, self._keep = ptr, block, keep

    def data_ptr(self):
        return self._ptr

    def numel(self):
        return self.shape[0]

    def element_size(self):
        return self.dtype.itemsize

    def is_contiguous(self):
        return True

    def view(self, what):
        if isinstance(what, dtype):
            t = Tensor(self.nbytes, what, self.device.type, self._ptr, None, self)
            return t
        return self

    def tobytes(self):
        return ctypes.string_at(self._ptr, self.nbytes)

    def __del__(self):
        block, self._block = self._block, None
        if block is not None:
            with _Lock.lock:
                block[2].pool.give_back(*block)


def empty(shape, dtype=None, device="cpu"):
    dtype = dtype or float32
    n = shape[0] if isinstance(shape, (tuple, list)) else shape
    nbytes = n * dtype.itemsize
    if str(device) == "cpu":
        buf = ctypes.create_string_buffer(max(nbytes, 1))
        return Tensor(nbytes, dtype, "cpu", ctypes.addressof(buf), None, buf)
    routes = _thread_routes()
    pool = routes[0]._pool if routes else _default_pool
    with _Lock.lock:
        ptr, size, seg = pool.take(nbytes)
    return Tensor(nbytes, dtype, "cuda", ptr, (ptr, size, seg))


def frombuffer(buf, dtype=None):
    dtype = dtype or uint8
    return Tensor(ctypes.sizeof(buf), dtype, "cpu", ctypes.addressof(buf), None, buf)


def empty_cache():
    with _Lock.lock:
        for pool in _pools:
            pool.release_unused()


class _PluggableAllocator:
    def __init__(self, path, alloc_name, free_name):
        lib = ctypes.CDLL(path)
        self._malloc = getattr(lib, alloc_name)
        self._malloc.restype = ctypes.c_void_p
        self._malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self._free = getattr(lib, free_name)
        self._free.restype = None
        self._free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]

    def allocator(self):
        return self


@contextlib.contextmanager
def _use_mem_pool(pool, device=None):
    routes = _thread_routes()
    if pool in routes:
        raise RuntimeError("beginAllocateToPool: already recording to mempool_id")
    routes.append(pool)
    try:
        yield
    finally:
        routes.remove(pool)


@contextlib.contextmanager
def _device(index):
    yield


class CUDAGraph:
    def capture_begin(self, pool=None):
        pass


def _memory_snapshot(pool_id=None):
    return _default_pool.snapshot() if pool_id in (None, (0, 0)) else []


cuda = types.SimpleNamespace(
    is_available=lambda: True, current_device=lambda: 0, device=_device,
    synchronize=lambda device=None: None, empty_cache=empty_cache,
    MemPool=MemPool, use_mem_pool=_use_mem_pool, OutOfMemoryError=OutOfMemoryError,
    CUDAGraph=CUDAGraph, memory_snapshot=_memory_snapshot,
    memory=types.SimpleNamespace(CUDAPluggableAllocator=_PluggableAllocator))
_C = types.SimpleNamespace(_cuda_clearCublasWorkspaces=lambda: None)
overrides = types.SimpleNamespace(TorchFunctionMode=object)
version = types.SimpleNamespace(cuda="13.0")
