# SPDX-License-Identifier: MIT
"""dormant: put a PyTorch trainer's GPU memory to sleep and wake it at the
same virtual addresses.

    import dormant
    with dormant.region("weights"):                 # kept: copied to host on sleep
        model = build_model().cuda()
    with dormant.region("grads", policy="discard"): # dropped on sleep, zeros on wake
        grad_buffer = torch.zeros(n, device="cuda")
    server = dormant.serve(port=8787)               # POST /sleep, POST /wake, GET /stats
    for batch in data:
        with dormant.step():                        # a sleep waits for the step to end
            train_step(batch)

The module-level functions use a default Manager created on first use, with
options from configure() and the environment ($DORMANT_BACKEND,
$DORMANT_HOST_MODE, ...). Create Manager objects for more control.

Importing dormant needs only the standard library and libdormant; torch is
imported by region() alone. See docs/pytorch.md, and docs/capture.md for
whole-process capture (dormant.preload).
"""
import atexit
import logging
import threading
from typing import (Any, Callable, ContextManager, Dict, Iterable, Mapping, Optional, TypeVar,
                    Union, overload)

from .errors import (AddressInUseError, BusyError, CancelledError, DeviceError, DormantError,
                     InvalidArgumentError, LibraryNotFoundError, LimitError, NoDeviceError,
                     OutOfMemoryError, PermissionDeniedError, StepTimeoutError, UnknownTagError,
                     UnsupportedError)
from .manager import Manager, Server, options, server_options, stop_all_servers
from . import preload  # noqa: E402 (whole-process capture; standard library only)
from .nccl import _lean  # noqa: E402 (standard library only until asked)

_lean.lean_from_env()  # $DORMANT_NCCL_ONE_RANK_CTAS: before the program makes its groups

__all__ = [
    "Manager", "Server", "options", "server_options", "configure", "manager", "preload", "region", "set_policy", "sleep", "wake",
    "stats", "serve", "step", "on_sleep", "on_wake", "add_hook", "remove_hook", "library_path",
    "DormantError", "BusyError", "OutOfMemoryError", "UnknownTagError", "InvalidArgumentError",
    "CancelledError", "StepTimeoutError", "DeviceError", "NoDeviceError", "LimitError",
    "AddressInUseError", "PermissionDeniedError", "UnsupportedError", "LibraryNotFoundError",
]

def _version() -> str:
    """The Meson project version, from one of: dormant/_version.py, written
    when the package is built (meson install, pip); in a source tree
    (PYTHONPATH=python), the project() line of its meson.build; else the
    version of the libdormant that loads (dormant_version())."""
    try:
        from ._version import VERSION  # written by the build
        return VERSION
    except ImportError:
        pass
    import pathlib
    import re
    try:
        text = (pathlib.Path(__file__).resolve().parent.parent.parent /
                "meson.build").read_text(encoding="utf-8")
        found = re.search(r"^project\('dormant',.*?\bversion: '([^']+)'", text, re.S | re.M)
        if found:
            return found.group(1)
    except OSError:
        pass
    from . import _library
    return _library.get().need("dormant_version", "dormant.__version__")().decode("ascii")


def __getattr__(name: str) -> Any:
    # __version__ on first use: importing dormant reads no file and loads no
    # library.
    if name == "__version__":
        version = _version()
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module 'dormant' has no attribute {name!r}")

# The public API's types (PEP 561: py.typed). A report or the stats is the
# JSON object the HTTP API answers, as a dict.
Tags = Union[str, Iterable[str], None]  # one tag, several, or None: every tag
Report = Dict[str, Any]
HookFn = TypeVar("HookFn", bound=Callable[[], Any])
__version__: str  # the Meson project version, read on first use (__getattr__)

_default: Optional[Manager] = None
_default_options: Dict[str, Any] = {}
_default_lock = threading.Lock()
_log = logging.getLogger("dormant")


def configure(**options: Any) -> None:
    """Set the options of the default manager (see Manager) before it is
    created. Raises BusyError once it exists with other options."""
    with _default_lock:
        if _default is not None and options != _default_options:
            raise BusyError("the default dormant manager already exists; configure() "
                            "must come before its first use", 16)  # EBUSY
        _default_options.clear()
        _default_options.update(options)


def manager() -> Manager:
    """The default Manager, created on first use. Under whole-process capture
    (dormant-run --capture, see dormant.preload) it is the capture shim's
    process manager, which the process does not own: configure() options do
    not apply to it (its options come from the environment)."""
    global _default
    with _default_lock:
        if _default is not None and not _default.closed:
            return _default
        from . import preload
        handle = preload._process_manager()
        if handle is not None:
            if _default_options:
                _log.warning("dormant.configure() options %s do not apply to the "
                             "whole-process capture manager (set DORMANT_* variables)",
                             sorted(_default_options))
            m = Manager._attach(handle)
        else:
            m = Manager(**_default_options)
        _default = m
        return m


def library_path() -> str:
    """The libdormant file in use (loads it if needed)."""
    from . import _library
    return _library.get().path


def region(tag: str, policy: Optional[str] = None, *,
           dtype_tags: Optional[Mapping[Any, str]] = None) -> ContextManager[Any]:
    """See Manager.region()."""
    return manager().region(tag, policy, dtype_tags=dtype_tags)


def set_policy(tag: str, policy: str, *,
               rebuild: Optional[Callable[[str], Any]] = None) -> None:
    """See Manager.set_policy()."""
    return manager().set_policy(tag, policy, rebuild=rebuild)


def sleep(tags: Tags = None, *, residue: Optional[str] = None) -> Report:
    """See Manager.sleep()."""
    return manager().sleep(tags, residue=residue)


def wake(tags: Tags = None) -> Report:
    """See Manager.wake()."""
    return manager().wake(tags)


def stats() -> Report:
    """See Manager.stats()."""
    return manager().stats()


def serve(host: str = "127.0.0.1", port: int = 0, token: Optional[str] = None,
          **kwargs: Any) -> Server:
    """See Manager.serve()."""
    return manager().serve(host, port, token, **kwargs)


def step(timeout_s: Optional[float] = None) -> ContextManager[Manager]:
    """See Manager.step()."""
    return manager().step(timeout_s)


@overload
def on_sleep(fn: None = None, *, when: str = "before") -> Callable[[HookFn], HookFn]: ...
@overload
def on_sleep(fn: HookFn, *, when: str = "before") -> HookFn: ...
def on_sleep(fn: Optional[HookFn] = None, *,
             when: str = "before") -> Union[HookFn, Callable[[HookFn], HookFn]]:
    """See Manager.on_sleep()."""
    return manager().on_sleep(fn, when=when)


@overload
def on_wake(fn: None = None, *, when: str = "after") -> Callable[[HookFn], HookFn]: ...
@overload
def on_wake(fn: HookFn, *, when: str = "after") -> HookFn: ...
def on_wake(fn: Optional[HookFn] = None, *,
            when: str = "after") -> Union[HookFn, Callable[[HookFn], HookFn]]:
    """See Manager.on_wake()."""
    return manager().on_wake(fn, when=when)


def add_hook(point: str, fn: Callable[[], Any]) -> int:
    """See Manager.add_hook()."""
    return manager().add_hook(point, fn)


def remove_hook(hook: Union[int, Callable[[], Any]]) -> None:
    """See Manager.remove_hook()."""
    return manager().remove_hook(hook)


atexit.register(stop_all_servers)
