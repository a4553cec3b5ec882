# SPDX-License-Identifier: MIT
"""torch_memory_saver's Python API on dormant.

    from dormant.torch_memory_saver import torch_memory_saver

    with torch_memory_saver.region("default", enable_cpu_backup=True):
        model = build_model()                      # copied to host on pause
        with torch_memory_saver.region("default"): # no backup: zeros on resume
            grad_buffer = torch.zeros(n, device="cuda")
    torch_memory_saver.pause()                     # or pause("default")
    torch_memory_saver.resume()

A program written for torch_memory_saver gets this module, unchanged, when it
is started with `python3 -m dormant.run --torch-memory-saver -- CMD ...`
(which puts a package named torch_memory_saver that re-exports this module
first on the path); see docs/migrating.md.

Everything runs on the process's default dormant manager (dormant.manager()),
so dormant.serve(), dormant.stats() and /metrics see the program's tags under
the names the program gave them, and POST /sleep and /wake work beside
pause() and resume().

How the calls map:
  - region(tag, enable_cpu_backup): allocations inside go to tag, each with
    an allocation policy of its own: "keep" (copied to host on pause,
    restored on resume) with backup, "discard" (no host copy, zero-filled on
    resume) without. One tag may hold both; pause(tag) covers both. Regions
    nest and the inner one wins.
  - pause(tag=None) / resume(tag=None): dormant sleep / wake of the tag (None:
    every tag). A tag never used and a tag already paused (or resumed) are
    no-ops, as in torch_memory_saver. A resume that finds no device memory
    raises dormant.OutOfMemoryError and leaves the tag paused with its host
    copy intact: retry it (torch_memory_saver exits the process there).
  - hook_mode "torch": regions use torch.cuda.MemPool on libdormant's
    pluggable allocator. "preload": regions use a torch.cuda.MemPool of
    PyTorch's own allocator per tag and policy, whose cudaMalloc dormant's
    LD_PRELOAD shim (dormant.preload) captures. Left unset, "preload" when
    that capture is active, else "torch". In both, only what is allocated
    inside a region (interesting region on) is managed: memory outside every
    region, under tms_set_interesting_region(False) and inside disable() is
    ordinary device memory that works while the regions are paused, unless
    TMS_INIT_ENABLE=1 or dormant-run --capture makes the whole process
    managed (tag "default"). The shim is told where the regions are
    (dormant_preload_set_thread_region()).
  - disable(): allocations inside go to a fresh pool of PyTorch's ordinary
    memory (under whole-process capture, not captured), which is given back
    when it ends; they work while everything else is paused.
  - get_cpu_backup(x, zero_copy): while x's tag is paused (or awake with
    retain_cpu_backup), a CPU tensor with x's bytes from dormant's host copy
    (zero_copy: a view of that copy, valid until the next resume or pause;
    where live-bytes packing holds x in pieces, a copy, said once). None
    for a disk-backed tensor (enable_disk_backup), paused or not, as in
    torch_memory_saver: its copy is in a file, not in host memory.
  - retain_cpu_backup, TMS_RETAIN_CPU_BACKUP: dormant's host mode "retain",
    switchable at any time between pauses and resumes.
  - memory_margin_bytes: a resume that would leave less device memory free
    than the margin raises dormant.OutOfMemoryError before it maps
    anything (retry it later).
  - cpu_backup_backend "mmap" (or TMS_INIT_CPU_BACKUP_BACKEND=mmap): dormant
    pins its host copies itself. With either backend resume() returns once
    the host copies it no longer needs are back with the operating system,
    as torch_memory_saver's do (release mode; dormant's own wake returns
    first and frees them on worker threads).
  - _impl._binary_wrapper.cdll: torch_memory_saver's C ABI (tms_* functions),
    implemented by libdormant-preload.so (preload/tms.c).
  - enable_disk_backup, set_disk_backup_dir(), TMS_DISK_BACKUP_DIR,
    TMS_DISK_BACKUP_CHUNK_MB: dormant's policy "disk" (files in the disk
    directory, named while paused as torch_memory_saver's are, checksummed,
    removed on resume); TMS_INIT_ENABLE_DISK_BACKUP=1 under capture: the
    memory outside every region.
What it cannot honour it says once per process (a RuntimeWarning): a
cuda_graph pool handle. docs/migrating.md has the whole table.

Importing this module does not import torch (region() and cuda_graph() do).
"""
import contextlib
import ctypes
import errno
import os
import threading
import time
import warnings
from typing import Any, Dict, Iterator, Optional, Union

import dormant

from .errors import (DormantError, InvalidArgumentError, OutOfMemoryError, UnknownTagError,
                     UnsupportedError)

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess"]

_TAG_DEFAULT = "default"
_HOOK_MODES = ("torch", "preload")

_warned = set()
_warned_lock = threading.Lock()


def _warn_once(key, message):
    """Say once per process what is not honoured."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(f"dormant.torch_memory_saver: {message}", RuntimeWarning, stacklevel=3)


def _preload_module():
    try:
        from . import preload
    except ImportError:
        return None
    return preload


def preload_active() -> bool:
    """Whether dormant's whole-process capture (the LD_PRELOAD shim of
    cudaMalloc/cudaFree) runs in this process."""
    preload = _preload_module()
    active = getattr(preload, "active", None)
    if callable(active):
        return bool(active())
    name = "libdormant-preload.so"
    if preload is not None:
        try:
            name = os.path.basename(str(preload.library_path()))
        except Exception:
            pass
    # What dormant-run --capture sets: the shim preloaded, capture switched on.
    entries = os.environ.get("LD_PRELOAD", "").replace(" ", ":").split(":")
    return (os.environ.get("DORMANT_PRELOAD") == "1" and
            any(os.path.basename(e) == name for e in entries if e))


def _check_tag_type(tag):
    if not isinstance(tag, str):
        raise InvalidArgumentError(f"a tag is a str, not {type(tag).__name__}", errno.EINVAL)


def _env_true(name):
    """torch_memory_saver's reading of a boolean variable."""
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _cudart_path():
    """The CUDA runtime this process loaded (from /proc/self/maps), or None."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.split(None, 5)[-1].strip()
                if os.path.basename(path).startswith("libcudart.so"):
                    return path
    except OSError:
        pass
    return None


class _Cdll(ctypes.CDLL):
    """libdormant-preload.so with torch_memory_saver's C ABI (preload/tms.c).
    As torch_memory_saver's library links the CUDA runtime, a name it does not
    define (cudaHostGetFlags, ...) is looked up in the runtime the process
    loaded."""

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("__"):
                raise
            path = _cudart_path()
            if path is None:
                raise
            fn = getattr(ctypes.CDLL(path), name)
            setattr(self, name, fn)
            return fn


def _set_signatures(cdll):
    """torch_memory_saver's argument and result types (binary_wrapper.py)."""
    c_bool, c_char_p, c_int = ctypes.c_bool, ctypes.c_char_p, ctypes.c_int
    u8p = ctypes.POINTER(ctypes.c_uint8)
    table = {
        "tms_set_current_tag": (None, [c_char_p]),
        "tms_get_current_tag": (c_char_p, []),
        "tms_set_interesting_region": (None, [c_bool]),
        "tms_get_interesting_region": (c_bool, []),
        "tms_set_enable_cpu_backup": (None, [c_bool]),
        "tms_get_enable_cpu_backup": (c_bool, []),
        "tms_set_cpu_backup_backend": (None, [c_char_p]),
        "tms_get_cpu_backup_backend": (c_char_p, []),
        "tms_set_enable_disk_backup": (None, [c_bool]),
        "tms_get_enable_disk_backup": (c_bool, []),
        "tms_set_disk_backup_dir": (None, [c_char_p]),
        "tms_pause": (c_int, [c_char_p]),
        "tms_resume": (c_int, [c_char_p]),
        "set_memory_margin_bytes": (None, [ctypes.c_uint64]),
        "tms_set_retain_cpu_backup": (None, [c_bool]),
        "tms_get_retain_cpu_backup": (c_bool, []),
        "tms_get_cpu_backup_pointer": (u8p, [u8p, ctypes.c_uint64]),
    }
    for name, (restype, argtypes) in table.items():
        fn = getattr(cdll, name)
        fn.restype = restype
        fn.argtypes = argtypes
    # dormant's own (preload/dormant-preload.h): where the regions are
    for name, restype, argtypes in (("dormant_preload_set_thread_region", c_int, [c_int]),
                                    ("dormant_preload_get_thread_region", c_bool, [])):
        fn = getattr(cdll, name, None)
        if fn is not None:
            fn.restype = restype
            fn.argtypes = argtypes


def _set_thread_region(cdll, inside):
    """Tell the shim whether this thread is inside a region (it captures
    only regions then, torch_memory_saver's contract); returns the previous
    value, or None where the library has no such call."""
    fn = getattr(cdll, "dormant_preload_set_thread_region", None)
    if fn is None:
        return None
    return int(fn(1 if inside else 0))


class _BinaryWrapper:
    """torch_memory_saver's BinaryWrapper: cdll is dormant's preload library,
    loaded from its path (the process's own copy under whole-process
    capture), in either hook mode."""

    def __init__(self, path):
        self.path = str(path)
        self.cdll = _Cdll(self.path)
        _set_signatures(self.cdll)

    def set_config(self, *, tag, interesting_region, enable_cpu_backup, cpu_backup_backend=None,
                   enable_disk_backup=False):
        cdll = self.cdll
        cdll.tms_set_current_tag(tag.encode("utf-8"))
        cdll.tms_set_interesting_region(interesting_region)
        cdll.tms_set_enable_cpu_backup(enable_cpu_backup)
        if cpu_backup_backend is not None:
            cdll.tms_set_cpu_backup_backend(cpu_backup_backend.encode("utf-8"))
        cdll.tms_set_enable_disk_backup(enable_disk_backup)


class _PoolTable(dict):
    """_impl._mem_pools: the region pools by torch_memory_saver's key. Taking
    one out (pop, del) drops dormant's own reference too, so that the pool,
    and its memory, go once the caller lets it go (as torch_memory_saver's
    tests do)."""

    def __init__(self, saver):
        super().__init__()
        self._saver = saver

    def _forget(self, pool):
        glue = self._saver._manager()._torch
        if glue is None:
            return
        with glue.lock:
            for key in [k for k, p in glue.policy_pools.items() if p is pool]:
                del glue.policy_pools[key]

    def pop(self, key, *default):
        if key not in self and default:
            return default[0]
        pool = super().pop(key)
        self._forget(pool)
        return pool

    def __delitem__(self, key):
        self.pop(key)


class _Impl:
    """What torch_memory_saver keeps in TorchMemorySaver._impl and programs
    reach into: the C library (_binary_wrapper.cdll), the region pools by
    (tag, enable_cpu_backup, enable_disk_backup, cpu_backup_backend, device)
    (_mem_pools) and the thread's C configuration (_with_region_config)."""

    def __init__(self, saver, hook_mode):
        self._saver = saver
        self._hook_mode = hook_mode
        self._mem_pools = _PoolTable(saver)
        self._wrapper = None

    @property
    def _binary_wrapper(self):
        if self._wrapper is None:
            preload = _preload_module()
            if preload is None:
                raise UnsupportedError("torch_memory_saver's C library is dormant's preload "
                                       "library, which this dormant lacks", errno.ENOSYS)
            self._wrapper = _BinaryWrapper(preload.library_path())
        return self._wrapper

    def _cdll_or_none(self):
        try:
            return self._binary_wrapper.cdll
        except (DormantError, OSError):
            return None

    def _track_regions(self):
        """Turn the shim's region tracking on (dormant_preload_set_thread_region()):
        from now on a thread outside every region captures only where the
        default says so, whatever its interesting region."""
        cdll = self._cdll_or_none()
        get = getattr(cdll, "dormant_preload_get_thread_region", None)
        if get is not None:
            _set_thread_region(cdll, bool(get()))

    @contextlib.contextmanager
    def _with_region_config(self, tag, enable_cpu_backup, cpu_backup_backend,
                            enable_disk_backup=False):
        """The thread's C configuration (tag, interesting region, backups) for
        the duration, as torch_memory_saver's; with it the thread's dormant
        tag and allocation policy, and the shim told that the thread is
        inside a region."""
        cdll = self._cdll_or_none()
        if cdll is None:
            policy = ("disk" if enable_disk_backup else
                      "keep" if enable_cpu_backup else "discard")
            with self._saver._glue().route(tag, policy, routed=False):
                yield
            return
        saved = dict(tag=cdll.tms_get_current_tag().decode("utf-8"),
                     interesting_region=cdll.tms_get_interesting_region(),
                     enable_cpu_backup=cdll.tms_get_enable_cpu_backup(),
                     cpu_backup_backend=cdll.tms_get_cpu_backup_backend().decode("utf-8"),
                     enable_disk_backup=cdll.tms_get_enable_disk_backup())
        self._binary_wrapper.set_config(tag=tag, interesting_region=True,
                                        enable_cpu_backup=enable_cpu_backup,
                                        cpu_backup_backend=cpu_backup_backend,
                                        enable_disk_backup=enable_disk_backup)
        was_inside = _set_thread_region(cdll, True)
        try:
            yield
        finally:
            if was_inside is not None:
                _set_thread_region(cdll, bool(was_inside))
            self._binary_wrapper.set_config(**saved)


class TorchMemorySaver:
    """torch_memory_saver.TorchMemorySaver on dormant. Every instance drives
    the process's default dormant manager; the module's torch_memory_saver is
    the one programs use."""

    def __init__(self) -> None:
        self._requested_mode: Optional[str] = None
        self._mode: Optional[str] = None
        self._margin_bytes = 0
        self._impl_object: Any = None
        self._lock = threading.Lock()

    # ---- set-up -------------------------------------------------------------

    def _ensure_initialized(self):
        with self._lock:
            if self._mode is not None:
                return
            conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
            if "expandable_segments:True" in conf.replace(" ", ""):
                raise UnsupportedError(
                    "torch_memory_saver regions do not work with PYTORCH_CUDA_ALLOC_CONF="
                    "expandable_segments:True (as in torch_memory_saver): unset it",
                    errno.ENOSYS)
            active = preload_active()
            mode = self._requested_mode
            if mode is None:
                mode = "preload" if active else "torch"
            elif mode == "preload" and not active:
                _warn_once("preload-inactive",
                           "hook_mode='preload' asked for, but dormant's whole-process capture "
                           "is not active in this process (start it with dormant-run --capture); "
                           "using hook_mode='torch': region() memory is managed, memory "
                           "allocated outside every region is not")
                mode = "torch"
            if _env_true("TMS_RETAIN_CPU_BACKUP"):
                self._set_retain(True)
            backup = os.environ.get("TMS_INIT_ENABLE_CPU_BACKUP")
            if mode == "preload" and backup in ("0", "1"):
                # torch_memory_saver's choice for memory outside every region
                # (tag "default" under whole-process capture)
                self._manager().set_policy(_TAG_DEFAULT, "keep" if backup == "1" else "discard")
            if mode == "preload" and os.environ.get("TMS_INIT_ENABLE_DISK_BACKUP") == "1":
                _disk_environment()
                self._manager().set_policy(_TAG_DEFAULT, "disk")
            self._impl_object = _Impl(self, mode)
            self._impl_object._track_regions()
            self._mode = mode

    @property
    def _impl(self):
        """torch_memory_saver's implementation object (see _Impl)."""
        self._ensure_initialized()
        return self._impl_object

    def _manager(self):
        return dormant.manager()

    def _glue(self):
        return self._manager()._torch_glue()

    # ---- regions ------------------------------------------------------------

    def _policy(self, enable_cpu_backup, enable_disk_backup, cpu_backup_backend):
        if cpu_backup_backend is not None:
            if not enable_cpu_backup:
                raise InvalidArgumentError("cpu_backup_backend requires enable_cpu_backup=True",
                                           errno.EINVAL)
            if cpu_backup_backend not in ("pinned", "mmap"):
                raise InvalidArgumentError(
                    f'cpu_backup_backend must be "pinned" or "mmap", not {cpu_backup_backend!r}',
                    errno.EINVAL)
            # "mmap": dormant pins its host copies itself; what mmap promises
            # (the memory back with the system when resume() returns) every
            # resume() here does
        if enable_cpu_backup and enable_disk_backup:
            raise InvalidArgumentError(
                "enable_cpu_backup and enable_disk_backup are mutually exclusive", errno.EINVAL)
        if enable_disk_backup:
            _disk_environment()
            return "disk"  # dormant's policy "disk": files in the disk directory
        return "keep" if enable_cpu_backup else "discard"

    @contextlib.contextmanager
    def region(self, tag: str = _TAG_DEFAULT, enable_cpu_backup: bool = False,
               enable_disk_backup: bool = False,
               cpu_backup_backend: Optional[str] = None) -> Iterator[None]:
        """CUDA tensors this thread allocates inside live in dormant memory
        under tag: copied to host on pause with enable_cpu_backup, else
        dropped and zero-filled on resume. Regions nest; the inner one wins."""
        _check_tag_type(tag)
        policy = self._policy(enable_cpu_backup, enable_disk_backup, cpu_backup_backend)
        self._ensure_initialized()
        backend = ""
        if enable_cpu_backup:
            backend = cpu_backup_backend or os.environ.get("TMS_INIT_CPU_BACKUP_BACKEND") or "pinned"
        impl = self._impl_object
        # The C configuration first: it saves the thread's as it stands, and
        # once route() has set the thread's policy, tms_get_enable_cpu_backup()
        # would answer the region's (a nested region without backup then
        # left its enclosing one without backup: its nested_region test).
        with impl._with_region_config(tag, bool(enable_cpu_backup), cpu_backup_backend,
                                      bool(enable_disk_backup)):
            with self._glue().route(tag, policy, plain=self._mode == "preload") as route:
                if route.pool is not None:
                    impl._mem_pools[(tag, bool(enable_cpu_backup), bool(enable_disk_backup),
                                     backend, route.device)] = route.pool
                yield

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        """Allocations inside go to a fresh pool of PyTorch's ordinary memory
        (not captured under whole-process capture), given back when it ends:
        they work while everything else is paused. The thread's tag and
        policy are reset inside."""
        import torch
        self._ensure_initialized()
        glue = self._glue()
        device = torch.cuda.current_device()
        with torch.cuda.device(device):
            pool = torch.cuda.MemPool()
        cdll = self._impl_object._cdll_or_none()
        was = cdll.tms_get_interesting_region() if cdll is not None else None
        route = glue._push(None, device, pool=pool)
        was_inside = None
        try:
            if cdll is not None:
                cdll.tms_set_interesting_region(False)
                was_inside = _set_thread_region(cdll, False)
            yield
        finally:
            if cdll is not None:
                if was_inside is not None:
                    _set_thread_region(cdll, bool(was_inside))
                cdll.tms_set_interesting_region(was)
            glue._pop(route)
            del route, pool   # its segments go back with it

    @contextlib.contextmanager
    def cuda_graph(self, cuda_graph: Any, pool: Any = None, stream: Any = None,
                   capture_error_mode: Optional[str] = None, tag: str = _TAG_DEFAULT,
                   enable_cpu_backup: bool = False,
                   cpu_backup_backend: Optional[str] = None) -> Iterator[Any]:
        """torch.cuda.graph(cuda_graph, ...) whose private memory pool lives
        in dormant memory under tag: given back on pause, back on resume
        (zero-filled without backup; a replay rewrites what it uses).
        capture_error_mode left out: "relaxed" in hook mode "torch" (the
        graph's pool maps device memory with the driver's VMM calls while
        the stream captures), else PyTorch's "global"."""
        import torch
        _check_tag_type(tag)
        policy = self._policy(enable_cpu_backup, False, cpu_backup_backend)
        self._ensure_initialized()
        glue = self._glue()
        plain = self._mode == "preload"
        if not plain:
            glue._ensure_ready()
            glue._check_tag(tag)
            if pool is not None:
                _warn_once("graph-pool",
                           "cuda_graph(pool=...): in hook_mode 'torch' the graph's memory comes "
                           "from one dormant pool per tag instead (graphs captured under one tag "
                           "share it, as graphs sharing a pool do)")
            device = torch.cuda.current_device()
            pool = glue.policy_pool(tag, policy, device, "graph").id
        if capture_error_mode is None:
            capture_error_mode = "global" if plain else "relaxed"
        # An enclosing region's routing is suspended first (PyTorch would
        # route to the routing begun first); inside, only the thread's tag and
        # policy are set: the capture routes its allocations to its pool.
        with glue.route(None, None):
            with torch.cuda.graph(cuda_graph, pool=pool, stream=stream,
                                  capture_error_mode=capture_error_mode):
                # and the C configuration, as region() sets it (before the
                # route, for the same reason): under torch_memory_saver's
                # preload name the interesting region is off outside regions,
                # so without it the graph's pool was not captured at all
                with self._impl_object._with_region_config(
                        tag, bool(enable_cpu_backup), cpu_backup_backend):
                    with glue.route(tag, policy, plain=plain, routed=False):
                        yield

    # ---- pause and resume -----------------------------------------------------

    def _transition(self, action, tag):
        self._ensure_initialized()
        m = self._manager()
        if tag is None:
            return getattr(m, action)(None)
        _check_tag_type(tag)
        try:
            return getattr(m, action)([tag])
        except UnknownTagError:
            return None  # a tag never used: nothing to do, as torch_memory_saver

    def pause(self, tag: Optional[str] = None) -> Optional[Dict[str, Any]]:
        """Give back the device memory of tag (None: every tag), copying what
        was allocated with backup to host memory. Returns dormant's report
        (None when there was nothing to do)."""
        return self._transition("sleep", tag)

    def resume(self, tag: Optional[str] = None) -> Optional[Dict[str, Any]]:
        """Bring tag (None: every tag) back at the same addresses. Raises
        dormant.OutOfMemoryError when the device memory is still taken, or
        when waking would leave less free than memory_margin_bytes: the tag
        stays paused with its host copy; call resume again later."""
        self._ensure_initialized()
        if self._margin_bytes:
            self._check_margin(tag)
        report = self._transition("wake", tag)
        self._settle_host(tag)
        return report

    def _selected(self, tag):
        stats = self._manager().stats()
        return stats, [t for t in stats.get("tags", []) if tag is None or t["tag"] == tag]

    def _check_margin(self, tag):
        """OutOfMemoryError, before anything is mapped, when waking tag would
        leave less device memory free than the margin (the manager's devices
        together)."""
        stats, tags = self._selected(tag)
        need = sum(t["reserved_bytes"] - t["device_bytes"] for t in tags
                   if t["state"] == "asleep")
        free = sum(d["free_bytes"] for d in stats.get("devices", []))
        if need and need + self._margin_bytes > free:
            raise OutOfMemoryError(
                f"resume of {tag or 'every tag'} needs {need} bytes of device memory and "
                f"{free} are free: less than memory_margin_bytes={self._margin_bytes} would "
                f"be left; nothing was mapped, retry later", errno.ENOMEM)

    def _settle_host(self, tag, timeout_s=60.0):
        """Wait until the host copies the wake gave back (release mode frees
        them on worker threads) are back with the operating system, as
        torch_memory_saver has them when resume() returns (cudaFreeHost, or
        munmap for its mmap backend). Their pinning also holds device memory
        (the GPU's page tables for them: about 20 MB per 9 GB on the H200),
        which torch_memory_saver's test_training_engine sees go away after a
        resume that returned at once."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            stats, tags = self._selected(tag)
            if stats.get("host_mode") != "release":
                return
            if not sum(t["host_bytes"] for t in tags if t["state"] == "awake"):
                return
            time.sleep(0.002)

    # ---- attributes programs set or read --------------------------------------

    @property
    def enabled(self) -> bool:
        return True

    @property
    def hook_mode(self) -> Optional[str]:
        """"torch" or "preload" (the mode in use once initialized)."""
        return self._mode or self._requested_mode

    @hook_mode.setter
    def hook_mode(self, mode: str) -> None:
        if mode not in _HOOK_MODES:
            raise InvalidArgumentError(f'hook_mode must be "torch" or "preload", not {mode!r}',
                                       errno.EINVAL)
        with self._lock:
            if self._mode is None:
                self._requested_mode = mode
                return
            current = self._mode
        if mode != current and not (mode == "preload" and "preload-inactive" in _warned):
            _warn_once("hook-mode-late", f"hook_mode={mode!r} set after the first use; "
                                         f"it stays {current!r}")

    @property
    def memory_margin_bytes(self) -> int:
        return self._margin_bytes

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value: int) -> None:
        value = int(value)
        if value < 0:
            raise InvalidArgumentError("memory_margin_bytes must be >= 0", errno.EINVAL)
        self._margin_bytes = value
        if self._impl_object is not None:
            cdll = self._impl_object._cdll_or_none()
            if cdll is not None:
                cdll.set_memory_margin_bytes(value)   # for tms_resume() too

    def _set_retain(self, retain):
        mode = "retain" if retain else "release"
        with dormant._default_lock:
            default = dormant._default
            exists = default is not None and not default.closed
            options = dict(dormant._default_options)
        if not exists and preload_active():
            default, exists = self._manager(), True   # the capture's: options from the environment
        if not exists:
            options["host_mode"] = mode
            dormant.configure(**options)
            return
        if default.host_mode != mode:
            default.host_mode = mode   # from the next pause or resume on

    @property
    def retain_cpu_backup(self) -> bool:
        """Whether host copies stay allocated across resumes (dormant's host
        mode "retain"). Settable at any time but during a pause or resume."""
        self._ensure_initialized()   # TMS_RETAIN_CPU_BACKUP
        return self._manager().host_mode == "retain"

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value: bool) -> None:
        self._set_retain(bool(value))

    def get_cpu_backup(self, x: Any, zero_copy: bool = False) -> Any:
        """While x's tag is paused (or awake with retain_cpu_backup), a CPU
        tensor with x's bytes from dormant's host copy: a new tensor, or with
        zero_copy a view of the host copy itself (read it only; valid until
        the tag's next resume or pause). Where dormant's live-bytes packing
        holds x in pieces (a mark inside it, two chunks), zero_copy gives a
        copy and says so once. None when no host copy holds x (awake, no
        backup, disk backup, not dormant memory): for a disk-backed tensor
        torch_memory_saver returns None too, paused or not."""
        import torch
        self._ensure_initialized()
        if not all(hasattr(x, a) for a in ("is_contiguous", "data_ptr", "numel", "element_size")):
            raise InvalidArgumentError(f"get_cpu_backup() needs a tensor, not {type(x).__name__}",
                                       errno.EINVAL)
        if not x.is_contiguous():
            raise InvalidArgumentError("get_cpu_backup() needs a contiguous tensor", errno.EINVAL)
        nbytes = x.numel() * x.element_size()
        if nbytes == 0:
            return None
        m = self._manager()
        ptr = x.data_ptr()
        try:
            if zero_copy:
                try:
                    host = m.host_backup(ptr, nbytes)
                except DormantError as e:
                    if e.errno != errno.ERANGE:
                        raise
                    _warn_once("zero-copy-pieces",
                               "get_cpu_backup(zero_copy=True): dormant's host copy holds this "
                               "tensor in pieces (live-bytes packing, or two chunks): returning "
                               "a copy instead of a view")
                else:
                    if host is None:
                        return None
                    buf = (ctypes.c_uint8 * nbytes).from_address(host)
                    return torch.frombuffer(buf, dtype=torch.uint8).view(x.dtype).view(x.shape)
            out = torch.empty(x.shape, dtype=x.dtype, device="cpu")
            if m.host_backup_read(ptr, nbytes, out.data_ptr()) is None:
                return None
            return out
        except InvalidArgumentError:
            return None   # not memory of dormant's

    def set_disk_backup_dir(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """The directory of disk backup files (created if needed), for the
        next pause: the manager's disk directory (dormant's disk_dir)."""
        _disk_environment()
        path = os.path.abspath(os.fspath(path))
        os.makedirs(path, exist_ok=True)
        self._manager().set_disk_dir(path)


def _disk_environment() -> None:
    """torch_memory_saver's disk backup variables as dormant's options, for
    a manager created after (dormant.manager() reads them once):
    TMS_DISK_BACKUP_DIR -> DORMANT_DISK_DIR, TMS_DISK_BACKUP_CHUNK_MB ->
    DORMANT_DISK_CHUNK_BYTES (the largest read or write), and named files
    (DORMANT_DISK_NAMES: torch_memory_saver's files are visible in the
    directory while paused). dormant's own variables win."""
    tms_dir = os.environ.get("TMS_DISK_BACKUP_DIR")
    if tms_dir:
        os.environ.setdefault("DORMANT_DISK_DIR", os.path.abspath(tms_dir))
    mb = os.environ.get("TMS_DISK_BACKUP_CHUNK_MB", "").strip()
    if mb.isdigit() and int(mb) > 0:
        os.environ.setdefault("DORMANT_DISK_CHUNK_BYTES", f"{int(mb)}MiB")
    os.environ.setdefault("DORMANT_DISK_NAMES", "1")


@contextlib.contextmanager
def configure_subprocess() -> Iterator[None]:
    """While inside, os.environ holds what a child process needs for dormant's
    whole-process capture (as torch_memory_saver's configure_subprocess()
    sets LD_PRELOAD), so subprocesses started inside are captured."""
    preload = _preload_module()
    if preload is None:
        _warn_once("configure-subprocess",
                   "configure_subprocess(): this dormant has no whole-process capture "
                   "(dormant.preload); children start without it")
        yield
        return
    before = dict(os.environ)
    env = preload.environment(dict(os.environ))
    # as torch_memory_saver's preload mode: a child captures what its regions
    # allocate, and memory outside them only with TMS_INIT_ENABLE=1
    env.setdefault("TMS_INIT_ENABLE", "0")
    changed = {k: v for k, v in env.items() if before.get(k) != v}
    removed = [k for k in before if k not in env]   # e.g. the parent's own server address
    os.environ.update(changed)
    for key in removed:
        os.environ.pop(key, None)
    try:
        yield
    finally:
        for key in list(changed) + removed:
            if key in before:
                os.environ[key] = before[key]
            else:
                os.environ.pop(key, None)


torch_memory_saver = TorchMemorySaver()
