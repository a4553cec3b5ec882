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

from .errors import (AddressInUseError, BusyError, CancelledError, DeviceError, DormantError,
                     InvalidArgumentError, LibraryNotFoundError, LimitError, NoDeviceError,
                     OutOfMemoryError, PermissionDeniedError, StepTimeoutError, UnknownTagError,
                     UnsupportedError)
from .manager import Manager, Server, options, server_options, stop_all_servers
from . import preload  # noqa: E402 (whole-process capture; standard library only)

__all__ = [
    "Manager", "Server", "options", "server_options", "configure", "manager", "preload", "region", "set_policy", "sleep", "wake",
    "stats", "serve", "step", "on_sleep", "on_wake", "add_hook", "remove_hook", "library_path",
    "DormantError", "BusyError", "OutOfMemoryError", "UnknownTagError", "InvalidArgumentError",
    "CancelledError", "StepTimeoutError", "DeviceError", "NoDeviceError", "LimitError",
    "AddressInUseError", "PermissionDeniedError", "UnsupportedError", "LibraryNotFoundError",
]

def _version():
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


def __getattr__(name):
    # __version__ on first use: importing dormant reads no file and loads no
    # library.
    if name == "__version__":
        version = _version()
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module 'dormant' has no attribute {name!r}")

_default = None
_default_options = {}
_default_lock = threading.Lock()
_log = logging.getLogger("dormant")


def configure(**options):
    """Set the options of the default manager (see Manager) before it is
    created. Raises BusyError once it exists with other options."""
    with _default_lock:
        if _default is not None and options != _default_options:
            raise BusyError("the default dormant manager already exists; configure() "
                            "must come before its first use", 16)  # EBUSY
        _default_options.clear()
        _default_options.update(options)


def manager():
    """The default Manager, created on first use. Under whole-process capture
    (dormant-run --capture, see dormant.preload) it is the capture shim's
    process manager, which the process does not own: configure() options do
    not apply to it (its options come from the environment)."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            from . import preload
            handle = preload._process_manager()
            if handle is not None:
                if _default_options:
                    _log.warning("dormant.configure() options %s do not apply to the "
                                 "whole-process capture manager (set DORMANT_* variables)",
                                 sorted(_default_options))
                _default = Manager._attach(handle)
            else:
                _default = Manager(**_default_options)
        return _default


def library_path():
    """The libdormant file in use (loads it if needed)."""
    from . import _library
    return _library.get().path


def region(tag, policy=None, *, dtype_tags=None):
    """See Manager.region()."""
    return manager().region(tag, policy, dtype_tags=dtype_tags)


def set_policy(tag, policy, *, rebuild=None):
    """See Manager.set_policy()."""
    return manager().set_policy(tag, policy, rebuild=rebuild)


def sleep(tags=None):
    """See Manager.sleep()."""
    return manager().sleep(tags)


def wake(tags=None):
    """See Manager.wake()."""
    return manager().wake(tags)


def stats():
    """See Manager.stats()."""
    return manager().stats()


def serve(host="127.0.0.1", port=0, token=None, **kwargs):
    """See Manager.serve()."""
    return manager().serve(host, port, token, **kwargs)


def step(timeout_s=None):
    """See Manager.step()."""
    return manager().step(timeout_s)


def on_sleep(fn=None, *, when="before"):
    """See Manager.on_sleep()."""
    return manager().on_sleep(fn, when=when)


def on_wake(fn=None, *, when="after"):
    """See Manager.on_wake()."""
    return manager().on_wake(fn, when=when)


def add_hook(point, fn):
    """See Manager.add_hook()."""
    return manager().add_hook(point, fn)


def remove_hook(hook):
    """See Manager.remove_hook()."""
    return manager().remove_hook(hook)


atexit.register(stop_all_servers)
