# SPDX-License-Identifier: MIT
"""PyTorch glue: per-tag memory pools backed by libdormant.

PyTorch's caching allocator hands out memory from pools. A
torch.cuda.MemPool built on CUDAPluggableAllocator(libdormant,
"dormant_torch_malloc", "dormant_torch_free") takes its segments from
libdormant; dormant_torch_malloc() allocates under the calling thread's tag
(dormant_set_thread_tag()). One pool per (tag, device) keeps every segment of
a pool under one tag, so the caching allocator never mixes tags.

torch.cuda.use_mem_pool() routes the current thread's allocations to a pool.
PyTorch picks the first routing of a thread that was begun, and refuses to
route twice to one pool, so nested regions are done here by suspending the
outer routing while an inner one is active.

Before every sleep (from Python or HTTP) a before-sleep hook marks the blocks
that the caching allocator holds free in the pools of the tags going to sleep
as unused (dormant_mark_unused()): they are then neither copied nor kept in
host memory, and come back zero-filled. The hook runs after the trainer guard
closed, so no guarded step allocates meanwhile. Manager(mark_free_blocks=False)
turns it off.

The same hook first gives back the caching allocator's unused blocks outside
dormant's pools (torch.cuda.empty_cache()): a step's temporaries, cached in
PyTorch's ordinary memory, would otherwise stay on the device while the
trainer sleeps, taking memory the process that runs meanwhile could use.
Nothing in dormant's pools is touched (empty_cache() leaves the pools in
use alone). Manager(empty_cache_on_sleep=False) or
DORMANT_TORCH_EMPTY_CACHE=0 turns it off (the next step then allocates
without a cudaMalloc).

The hook also gives back PyTorch's cuBLAS and cuBLASLt workspaces
(torch._C._cuda_clearCublasWorkspaces()) before emptying the cache: PyTorch
keeps one per handle and stream, in use, outside dormant's pools (a trainer's
forward thread and autograd's backward thread: 2 x 32 MiB on the H200), and
the next matmul makes them again. A CUDA graph captured with a cuBLAS call can
hold a workspace's address (PyTorch issue 193402), so Manager(
clear_cublas_on_sleep=None), the default ("auto", or $DORMANT_TORCH_CLEAR_CUBLAS
auto/1/0), clears them only while no graph has been captured: none through
torch.cuda.CUDAGraph.capture_begin since this module was imported (it wraps
that method to notice) and no dormant graph pool (cuda_graph()). True clears
them always, False never.

Imported by Manager.region() only: importing dormant does not import torch.
"""
import contextlib
import ctypes
import errno
import logging
import threading
import time
import weakref

import torch

from .nccl import _lean
from .errors import (BusyError, DormantError, InvalidArgumentError, NoDeviceError,
                     UnsupportedError)

log = logging.getLogger("dormant")

# one-rank NCCL groups capped unless $DORMANT_NCCL_ONE_RANK_CTAS says
# otherwise (import dormant did it already, or left a hook that did)
_lean.lean_by_default()

# Free blocks smaller than this are not marked: they save little and would
# cut the copy of their chunk into more pieces.
MARK_MIN_BYTES = 64 << 10

_global_lock = threading.Lock()
_allocator = None     # one CUDAPluggableAllocator per process
_attached = None      # weakref to the Manager behind dormant_torch_malloc()
_graphs_captured = 0  # CUDA graph captures begun since this module was imported


def _watch_graph_captures():
    """Count the CUDA graph captures begun through torch.cuda.CUDAGraph (what
    torch.cuda.graph, make_graphed_callables and Inductor's CUDA graph trees
    call): a graph may hold a cuBLAS workspace's address, which must then stay.
    Once per process."""
    graph = getattr(torch.cuda, "CUDAGraph", None)
    begin = getattr(graph, "capture_begin", None)
    if begin is None or getattr(begin, "_dormant_watch", False):
        return

    def capture_begin(self, *args, **kwargs):
        global _graphs_captured
        _graphs_captured += 1
        return begin(self, *args, **kwargs)

    capture_begin._dormant_watch = True
    capture_begin.__doc__ = begin.__doc__
    graph.capture_begin = capture_begin


_watch_graph_captures()


# dormant_set_thread_policy() values (core/dormant.h).
POLICY_TAG = -1
_ALLOC_POLICIES = {"keep": 0, "discard": 1, "disk": 3}


class _Route:
    """One routing on a thread's stack: allocations go to pool under tag, with
    policy (an allocation policy, or POLICY_TAG: the tag's). pool None routes
    to no pool: PyTorch's ordinary memory (tag None: the thread's tag reset)."""
    __slots__ = ("tag", "device", "pool", "policy", "ctx")

    def __init__(self, tag, device, pool, policy=POLICY_TAG):
        self.tag = tag
        self.device = device
        self.pool = pool
        self.policy = policy
        self.ctx = None


class TorchGlue:
    """The region machinery of one Manager."""

    def __init__(self, manager):
        self.manager = manager
        self.lib = manager._lib
        self.pools = {}               # (tag, device) -> torch.cuda.MemPool
        # (tag, policy, device, kind) -> MemPool, for allocations with a policy
        # of their own (so the caching allocator never mixes policies in one
        # segment); kind "plain" pools use PyTorch's own allocator (cudaMalloc,
        # for a process whose cudaMalloc dormant captures), "graph" ones hold
        # CUDA graph captures.
        self.policy_pools = {}
        self.lock = threading.Lock()
        self.tls = threading.local()
        self.hook_id = None           # the before-sleep hook, once a region was used
        self.marks_total = {"sleeps": 0, "blocks": 0, "bytes": 0, "seconds": 0.0}
        self.marks_last = None
        self.cublas_last = None       # what the last sleep did with cuBLAS's workspaces

    # ---- process-wide set-up --------------------------------------------

    def _ensure_ready(self):
        global _allocator, _attached
        if not torch.cuda.is_available():
            raise NoDeviceError("dormant.region() needs CUDA, and torch.cuda.is_available() "
                                "is False", errno.ENODEV)
        backend = self.manager.backend
        if backend != "cuda":
            raise NoDeviceError(
                f"dormant.region() needs the cuda backend, and this manager runs on "
                f"'{backend}' (a simulated device PyTorch cannot use): create it with "
                f"backend='cuda' or set DORMANT_BACKEND=cuda", errno.ENODEV)
        with _global_lock:
            attached = _attached() if _attached is not None else None
            if attached is not None and attached is not self.manager and not attached.closed:
                raise BusyError("another dormant.Manager already serves PyTorch's allocator "
                                "in this process (one per process)", errno.EBUSY)
            if attached is not self.manager:
                r = self.lib.dormant_torch_set_manager(self.manager._handle())
                if r < 0:
                    self.manager._check(r)
                _attached = weakref.ref(self.manager)
            if _allocator is None:
                _allocator = torch.cuda.memory.CUDAPluggableAllocator(
                    self.lib.path, "dormant_torch_malloc", "dormant_torch_free")
        with self.lock:
            register = self.hook_id is None
            if register:
                self.hook_id = 0  # taken: one registration per manager
        if register:
            try:
                self.hook_id = self.manager.add_hook("before_sleep", self.before_sleep)
            except BaseException:
                self.hook_id = None
                raise

    # ---- free blocks before a sleep -------------------------------------

    def mark_stats(self):
        with self.lock:
            return dict(self.marks_total, last=dict(self.marks_last) if self.marks_last else None)

    def synchronize(self):
        """Wait for the work queued on every device a pool lives on."""
        with self.lock:
            devices = {device for (_, device) in self.pools}
            devices |= {device for (_, _, device, _) in self.policy_pools}
        for device in devices:
            torch.cuda.synchronize(device)

    def before_sleep(self):
        """The before-sleep hook: never cancels the sleep (marking and
        emptying the cache are only savings); a failure is logged and the
        rest copied whole."""
        if self.manager.empty_cache_on_sleep:
            self.clear_cublas_workspaces()
            try:
                torch.cuda.empty_cache()
            except Exception:
                log.warning("dormant: torch.cuda.empty_cache() failed before a sleep; "
                            "PyTorch's cached blocks stay on the device", exc_info=True)
        if not self.manager.mark_free_blocks:
            return
        start = time.perf_counter()
        blocks = nbytes = 0
        try:
            blocks, nbytes = self.mark_free_blocks(self.sleeping_tags())
        except Exception:
            log.warning("dormant: marking PyTorch's free blocks as unused failed; the sleep "
                        "copies their segments whole", exc_info=True)
        seconds = time.perf_counter() - start
        with self.lock:
            self.marks_last = {"blocks": blocks, "bytes": nbytes, "seconds": seconds}
            t = self.marks_total
            t["sleeps"] += 1
            t["blocks"] += blocks
            t["bytes"] += nbytes
            t["seconds"] += seconds

    def may_clear_cublas(self):
        """(whether this sleep gives back the cuBLAS workspaces, why not)."""
        choice = self.manager.clear_cublas_on_sleep
        if choice is not None:
            return bool(choice), None if choice else "clear_cublas_on_sleep is off"
        if _graphs_captured:
            return False, f"{_graphs_captured} CUDA graph capture(s) in this process"
        with self.lock:
            if any(kind == "graph" for (_, _, _, kind) in self.policy_pools):
                return False, "a CUDA graph pool (cuda_graph())"
        return True, None

    def clear_cublas_workspaces(self):
        """Give back PyTorch's cuBLAS workspaces where may_clear_cublas()
        allows; never fails the sleep."""
        clear = getattr(getattr(torch, "_C", None), "_cuda_clearCublasWorkspaces", None)
        allowed, why = self.may_clear_cublas()
        with self.lock:
            self.cublas_last = why if not allowed else ("cleared" if clear else
                                                       "this PyTorch cannot clear them")
        if not allowed or clear is None:
            return
        try:
            clear()
        except Exception:
            log.warning("dormant: clearing PyTorch's cuBLAS workspaces failed before a "
                        "sleep; they stay on the device", exc_info=True)
            with self.lock:
                self.cublas_last = "failed"

    def sleeping_tags(self):
        """The awake tags this sleep may cover: those named, for a sleep from
        Python on this thread; every awake tag for one from HTTP (the hook is
        not told its tags). Tags of every policy: a tag may hold kept
        allocations of their own policy (dormant_alloc_policy()), and marks
        on memory that is not kept change nothing."""
        named = getattr(self.manager._tls, "transition_tags", None)
        tags = set()
        for t in self.manager.stats().get("tags", []):
            if t.get("state") != "awake":
                continue
            if named is None or named == "all" or t["tag"] in named:
                tags.add(t["tag"])
        return tags

    def mark_free_blocks(self, tags):
        """Mark the free blocks of the pools of tags; returns (blocks, bytes)."""
        with self.lock:
            pools = [pool for (tag, _), pool in self.pools.items() if tag in tags]
            # CUDA graph pools are left whole: their free blocks are the
            # graph's scratch, reused by every replay.
            pools += [pool for (tag, _, _, kind), pool in self.policy_pools.items()
                      if tag in tags and kind != "graph"]
        blocks = nbytes = 0
        for pool in pools:
            for address, size in free_blocks(pool):
                if size < MARK_MIN_BYTES:
                    continue
                self.manager.mark_unused(address, size)
                blocks += 1
                nbytes += size
        return blocks, nbytes

    def detach(self):
        """The manager closes: PyTorch must not allocate from it any more."""
        global _attached
        with _global_lock:
            attached = _attached() if _attached is not None else None
            if attached is self.manager:
                self.lib.dormant_torch_set_manager(None)
                _attached = None
        with self.lock:
            self.pools.clear()
            self.policy_pools.clear()

    def policy_pool(self, tag, policy, device, kind="dormant"):
        """The pool for allocations of tag with an allocation policy ("keep"
        or "discard") on device. kind "dormant" and "graph" pools allocate
        through dormant_torch_malloc, "plain" ones through PyTorch's default
        allocator."""
        key = (tag, policy, device, kind)
        with self.lock:
            pool = self.policy_pools.get(key)
            if pool is None:
                with torch.cuda.device(device):
                    if kind == "plain":
                        pool = torch.cuda.MemPool()
                    else:
                        pool = torch.cuda.MemPool(_allocator.allocator())
                self.policy_pools[key] = pool
            return pool

    def _pool(self, tag, device):
        key = (tag, device)
        with self.lock:
            pool = self.pools.get(key)
            if pool is None:
                with torch.cuda.device(device):
                    pool = torch.cuda.MemPool(_allocator.allocator())
                self.pools[key] = pool
            return pool

    # ---- per-thread routing ---------------------------------------------

    def _stack(self):
        stack = getattr(self.tls, "stack", None)
        if stack is None:
            stack = self.tls.stack = []
        return stack

    def _set_thread_tag(self, tag):
        r = self.lib.dormant_set_thread_tag(tag.encode() if tag is not None else None)
        if r < 0:
            self.manager._check(r)

    def _set_thread_policy(self, policy):
        lib = self.lib
        fn = getattr(lib, "dormant_set_thread_policy", None)
        if fn is None:
            fn = getattr(lib.cdll, "dormant_set_thread_policy", None)
        if fn is None:
            if policy == POLICY_TAG:
                return  # nothing to reset in a library without policies
            raise UnsupportedError(
                f"a per-allocation policy needs dormant_set_thread_policy(), which the "
                f"libdormant at {lib.path} does not export (older than this package)",
                errno.ENOSYS)
        r = fn(policy)
        if r < 0:
            self.manager._check(r)

    def _activate(self, route):
        if route.pool is not None:
            ctx = torch.cuda.use_mem_pool(route.pool, route.device)
            ctx.__enter__()
            route.ctx = ctx
        self._set_thread_tag(route.tag)
        self._set_thread_policy(route.policy)

    def _deactivate(self, route):
        ctx, route.ctx = route.ctx, None
        if ctx is not None:
            ctx.__exit__(None, None, None)

    def _push(self, tag, device, pool=None, policy=POLICY_TAG, routed=True):
        """Route this thread's allocations on device to tag until _pop()
        (to pool with policy when given; tag None: to no pool; routed False:
        set the thread's tag and policy only, no pool)."""
        if not routed:
            pool = None
        elif pool is None and tag is not None:
            pool = self._pool(tag, device)
        route = _Route(tag, device, pool, policy)
        stack = self._stack()
        outer = stack[-1] if stack else None
        if outer is not None:
            self._deactivate(outer)
        try:
            self._activate(route)
        except BaseException:
            if outer is not None:
                self._activate(outer)
            else:
                self._set_thread_tag(None)
                self._set_thread_policy(POLICY_TAG)
            raise
        stack.append(route)
        return route

    def _pop(self, route):
        stack = self._stack()
        if not stack or stack[-1] is not route:
            raise DormantError("dormant regions must be left in the order they were entered")
        stack.pop()
        self._deactivate(route)
        if stack:
            self._activate(stack[-1])
        else:
            self._set_thread_tag(None)
            self._set_thread_policy(POLICY_TAG)

    @contextlib.contextmanager
    def route(self, tag, policy, *, plain=False, routed=True):
        """Route this thread to tag with an allocation policy ("keep",
        "discard", "disk"; None: the tag's) in a pool of its own, for the duration;
        tag None routes to PyTorch's ordinary memory. plain: the pool uses
        PyTorch's own allocator (whose cudaMalloc dormant captures), and
        nothing is attached to libdormant's allocator entry points. routed
        False: only the thread's tag and policy (for a CUDA graph capture,
        which routes to its own pool)."""
        if tag is not None:
            if not plain:
                self._ensure_ready()
            self._check_tag(tag)
        device = torch.cuda.current_device()
        value = POLICY_TAG if policy is None else _ALLOC_POLICIES[policy]
        pool = None
        if tag is not None and routed:
            pool = self.policy_pool(tag, policy, device, "plain" if plain else "dormant")
        route = self._push(tag, device, pool, value, routed=routed)
        try:
            yield route
        finally:
            self._pop(route)

    @contextlib.contextmanager
    def switch(self, tag):
        """Route to tag for a moment (used per torch call by dtype_tags)."""
        stack = self._stack()
        if stack and stack[-1].tag == tag:
            yield
            return
        device = stack[-1].device if stack else torch.cuda.current_device()
        route = self._push(tag, device)
        try:
            yield
        finally:
            self._pop(route)

    def _check_tag(self, tag):
        if not isinstance(tag, str):
            raise InvalidArgumentError(f"a tag is a str, not {type(tag).__name__}", errno.EINVAL)
        # dormant_set_thread_tag() checks the name the way the library does;
        # put the current tag back afterwards.
        buf = ctypes.create_string_buffer(64)  # DORMANT_TAG_MAX + 1
        self.lib.dormant_get_thread_tag(buf, len(buf))
        r = self.lib.dormant_set_thread_tag(tag.encode())
        self.lib.dormant_set_thread_tag(buf.value)
        if r < 0:
            self.manager._check(r)

    @contextlib.contextmanager
    def region(self, tag, policy, dtype_tags):
        self._ensure_ready()
        self._check_tag(tag)
        mode = None
        if dtype_tags:
            for dtype, other in dtype_tags.items():
                if not isinstance(dtype, torch.dtype):
                    raise InvalidArgumentError(f"dtype_tags keys are torch dtypes, not {dtype!r}",
                                               errno.EINVAL)
                self._check_tag(other)
            mode = _DtypeTagMode(self, dict(dtype_tags))
        if policy is not None:
            self.manager.set_policy(tag, policy)
        route = self._push(tag, torch.cuda.current_device())
        try:
            if mode is not None:
                with mode:
                    yield
            else:
                yield
        except torch.cuda.OutOfMemoryError as e:
            message = self.lib.last_error()
            if message and hasattr(e, "add_note"):
                e.add_note(f"dormant (last error on this thread): {message}")
            raise
        finally:
            self._pop(route)


def pool_segments(pool):
    """The caching allocator's segments of pool (torch.cuda.MemPool), as
    torch.cuda.memory_snapshot() describes them, without stack traces."""
    snapshot = getattr(pool, "snapshot", None)
    if snapshot is None:
        return torch.cuda.memory_snapshot(pool.id)
    try:
        return snapshot(include_traces=False)
    except TypeError:  # a torch whose snapshot() takes no arguments
        return snapshot()


def free_blocks(pool):
    """(address, size) of each block the caching allocator holds free
    ("inactive") in pool. Blocks freed while a stream still uses them
    ("active_pending_free") are not free yet."""
    out = []
    for segment in pool_segments(pool):
        address = segment["address"]
        for block in segment.get("blocks", ()):
            start = block.get("address", address)
            if block.get("state") == "inactive":
                out.append((start, block["size"]))
            address = start + block["size"]
    return out


def _call_dtype(args, kwargs):
    """The dtype a torch call produces: its dtype argument (by keyword, or a
    torch.dtype among its arguments, as in x.to(torch.float32)), else that of
    its first tensor argument, else the default dtype."""
    dtype = kwargs.get("dtype")
    if isinstance(dtype, torch.dtype):
        return dtype
    for arg in args:
        if isinstance(arg, torch.dtype):
            return arg
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.dtype
    return torch.get_default_dtype()


class _DtypeTagMode(torch.overrides.TorchFunctionMode):
    """Sends the allocations of a torch call to the tag its dtype maps to."""

    def __init__(self, glue, dtype_tags):
        super().__init__()
        self.glue = glue
        self.dtype_tags = dtype_tags

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tag = self.dtype_tags.get(_call_dtype(args, kwargs))
        if tag is None:
            return func(*args, **kwargs)
        with self.glue.switch(tag):
            return func(*args, **kwargs)
