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
    pluggable allocator. "preload": regions only choose the tag and policy
    for dormant's LD_PRELOAD capture of cudaMalloc (dormant.preload), which
    also captures memory outside every region under tag "default". Left
    unset, "preload" when that capture is active, else "torch".
What it cannot honour it says once per process (a RuntimeWarning): disk
backup (kept in host memory instead), cpu_backup_backend="mmap",
memory_margin_bytes, retain_cpu_backup after the manager exists, a
cuda_graph pool handle, disable() under capture; get_cpu_backup() raises
UnsupportedError. docs/migrating.md has the whole table.

Importing this module does not import torch (region() and cuda_graph() do).
"""
import contextlib
import errno
import os
import threading
import warnings
from typing import Any, Dict, Iterator, NoReturn, Optional

import dormant

from .errors import InvalidArgumentError, UnknownTagError, UnsupportedError

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


class TorchMemorySaver:
    """torch_memory_saver.TorchMemorySaver on dormant. Every instance drives
    the process's default dormant manager; the module's torch_memory_saver is
    the one programs use."""

    def __init__(self) -> None:
        self._requested_mode: Optional[str] = None
        self._mode: Optional[str] = None
        self._margin_bytes = 0
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
            if os.environ.get("TMS_RETAIN_CPU_BACKUP") == "1":
                self._set_retain(True)
            backup = os.environ.get("TMS_INIT_ENABLE_CPU_BACKUP")
            if mode == "preload" and backup in ("0", "1"):
                # torch_memory_saver's choice for memory outside every region
                # (tag "default" under whole-process capture)
                self._manager().set_policy(_TAG_DEFAULT, "keep" if backup == "1" else "discard")
            self._mode = mode

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
            if cpu_backup_backend == "mmap":
                _warn_once("mmap", "cpu_backup_backend='mmap' is not honoured: dormant pins its "
                                   "host copies itself, and gives them back after resume unless "
                                   "the manager runs host_mode 'retain'")
        if enable_cpu_backup and enable_disk_backup:
            raise InvalidArgumentError(
                "enable_cpu_backup and enable_disk_backup are mutually exclusive", errno.EINVAL)
        if enable_disk_backup:
            _warn_once("disk", "enable_disk_backup is not honoured: the region's memory is "
                               "copied to host memory on pause instead (dormant has no disk "
                               "backend yet)")
            return "keep"
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
        with self._glue().route(tag, policy, plain=self._mode == "preload"):
            yield

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        """Allocations inside go to ordinary PyTorch memory, not managed."""
        self._ensure_initialized()
        preload = _preload_module() if self._mode == "preload" else None
        uncaptured = getattr(preload, "uncaptured", None) if preload is not None else None
        if self._mode == "preload" and not callable(uncaptured):
            _warn_once("disable-preload",
                       "disable() under whole-process capture: the allocations inside are still "
                       "captured, under tag 'default' (this dormant.preload cannot exempt them)")
        with self._glue().route(None, None):
            if callable(uncaptured):
                with uncaptured():
                    yield
            else:
                yield

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
        dormant.OutOfMemoryError when the device memory is still taken: the
        tag stays paused with its host copy; call resume again later."""
        return self._transition("wake", tag)

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
        if value:
            _warn_once("margin", "memory_margin_bytes is not enforced: allocations in regions "
                                 "fail only when the device itself is out of memory")

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
            _warn_once("retain", f"retain_cpu_backup={bool(retain)} is not honoured: the dormant "
                                 f"manager already runs host_mode {default.host_mode!r} (set it "
                                 f"before the first region, or start with DORMANT_HOST_MODE={mode})")

    @property
    def retain_cpu_backup(self) -> bool:
        """Whether host copies stay allocated across resumes (dormant's host
        mode "retain")."""
        return self._manager().host_mode == "retain"

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value: bool) -> None:
        self._set_retain(bool(value))

    def get_cpu_backup(self, x: Any, zero_copy: bool = False) -> NoReturn:
        raise UnsupportedError(
            "get_cpu_backup() is not supported: dormant keeps host copies to itself; read the "
            "tensor after resume() instead", errno.ENOSYS)

    def set_disk_backup_dir(self, path: str) -> None:
        _warn_once("disk-dir", "set_disk_backup_dir() is not honoured: dormant has no disk "
                               "backend yet; enable_disk_backup regions are kept in host memory")


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
