# SPDX-License-Identifier: MIT
"""Whole-process capture (docs/capture.md).

A program started with `dormant-run --capture -- CMD` (or with the variables
of environment() set) runs with libdormant-preload.so preloaded: every
cudaMalloc/cudaFree of the process, PyTorch's caching allocator included, is
a dormant allocation of one process manager, under the tag "default" (keep)
unless a region chose another. dormant.manager() then returns that manager.

    from dormant import preload
    preload.active()                  # True inside a captured process
    subprocess.Popen(cmd, env=preload.environment())   # capture a child too

Importing this module needs only the standard library.
"""
import ctypes
import errno
import os
import pathlib

from .errors import UnsupportedError, error_from

__all__ = ["library_path", "active", "environment", "stats"]

LIBRARY_NAME = "libdormant-preload.so"

# The variables of a captured process that name its own server: a child gets
# none of them (it would compete for the same address).
_SERVER_VARIABLES = ("DORMANT_LISTEN", "DORMANT_PORT_FILE", "DORMANT_PRELOAD_PID")


class _Stats(ctypes.Structure):
    """struct dormant_preload_stats (preload/dormant-preload.h)."""
    _fields_ = [
        ("active", ctypes.c_bool),
        ("reason", ctypes.c_char * 256),  # DORMANT_ERROR_MAX
        ("captured_allocations", ctypes.c_uint64),
        ("captured_frees", ctypes.c_uint64),
        ("failed_allocations", ctypes.c_uint64),
        ("foreign_frees", ctypes.c_uint64),
        ("async_allocations", ctypes.c_uint64),
        ("async_bytes", ctypes.c_uint64),
        ("managed_allocations", ctypes.c_uint64),
        ("managed_bytes", ctypes.c_uint64),
    ]


def _shim():
    """The process's handle with the shim's functions, or None without it."""
    try:
        process = ctypes.CDLL(None)
        get_manager = process.dormant_preload_manager
        get_stats = process.dormant_preload_stats_get
    except (AttributeError, OSError):
        return None
    get_manager.restype = ctypes.c_int
    get_manager.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    get_stats.restype = ctypes.c_int
    get_stats.argtypes = [ctypes.POINTER(_Stats)]
    return process


def _loaded_library_path():
    process = _shim()
    if process is None:
        return None
    from . import _library
    info = _library._DlInfo()
    dladdr = process.dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_library._DlInfo)]
    dladdr.restype = ctypes.c_int
    if dladdr(ctypes.cast(process.dormant_preload_manager, ctypes.c_void_p),
              ctypes.byref(info)) and info.dli_fname:
        return os.path.realpath(os.fsdecode(info.dli_fname))
    return None


def _candidates():
    env = os.environ.get("DORMANT_PRELOAD_LIB")
    if env:
        return [env]
    out = []
    loaded = _loaded_library_path()
    if loaded:
        out.append(loaded)
    from . import _library
    package = pathlib.Path(__file__).resolve().parent
    out.append(str(package / LIBRARY_NAME))                 # a wheel
    repo_build = package.parent.parent / "build"
    out.append(str(repo_build / "preload" / LIBRARY_NAME))  # the source tree
    libdir = _library._installed_libdir()
    if libdir:
        out.append(os.path.join(libdir, LIBRARY_NAME))
    # beside the libdormant this package uses (meson installs both there)
    try:
        libdir = pathlib.Path(_library.get().path).parent
        out.append(str(libdir / LIBRARY_NAME))
        out.append(str(libdir / "preload" / LIBRARY_NAME))  # a meson build folder
    except Exception:  # noqa: BLE001 (no libdormant: the other places still count)
        pass
    return out


def library_path():
    """The path of libdormant-preload.so: the one loaded in this process if
    any, else $DORMANT_PRELOAD_LIB, the package folder, the meson build folder
    of this source tree, the installed library folder. UnsupportedError when
    none exists."""
    tried = _candidates()
    for path in tried:
        if os.path.isfile(path):
            return os.path.realpath(path)
    raise UnsupportedError(f"{LIBRARY_NAME} not found; tried: {', '.join(tried)}. "
                           f"Build it (meson compile -C build) or set DORMANT_PRELOAD_LIB",
                           errno.ENOENT)


def stats():
    """The shim's counters as a dict (as in GET /stats "extra"."preload"), or
    None when the shim is not loaded in this process."""
    process = _shim()
    if process is None:
        return None
    st = _Stats()
    process.dormant_preload_stats_get(ctypes.byref(st))
    out = {name: getattr(st, name) for name, _ in _Stats._fields_}
    out["reason"] = st.reason.decode("utf-8", "replace")
    return out


def active():
    """True when this process runs under whole-process capture: the shim is
    loaded, $DORMANT_PRELOAD is 1, and this is not a fork() child of a
    captured process. Starts the shim's manager if it was not started yet (so
    that a refusal is known). Never raises."""
    process = _shim()
    if process is None:
        return False
    handle = ctypes.c_void_p()
    return process.dormant_preload_manager(ctypes.byref(handle)) == 0 and bool(handle.value)


def _process_manager():
    """The shim's manager handle, or None where capture is off. Raises when
    capture was refused (the reason is in the message)."""
    process = _shim()
    if process is None:
        return None
    handle = ctypes.c_void_p()
    r = process.dormant_preload_manager(ctypes.byref(handle))
    if r == -errno.ENOTSUP:
        return None
    if r < 0:
        from . import _library
        reason = stats()["reason"] or _library.get().last_error()
        raise error_from(r, f"whole-process capture: {reason}")
    return handle.value


def environment(env=None):
    """The environment for a child process that must be captured too: a new
    dict, env (default: os.environ) with libdormant-preload.so appended to
    LD_PRELOAD and DORMANT_PRELOAD=1. The child gets no server of its own
    (DORMANT_LISTEN and DORMANT_PORT_FILE are left out); other dormant
    variables ($DORMANT_BACKEND, ...) pass on as they are."""
    out = dict(os.environ if env is None else env)
    path = library_path()
    preload = out.get("LD_PRELOAD", "").split()
    if path not in preload:
        preload.append(path)
    out["LD_PRELOAD"] = " ".join(preload)
    out["DORMANT_PRELOAD"] = "1"
    for name in _SERVER_VARIABLES:
        out.pop(name, None)
    return out
