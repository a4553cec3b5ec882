# SPDX-License-Identifier: MIT
"""The libnccl this process already runs on, reached with ctypes.

PyTorch's wheels load libnccl.so.2 as a dependency of libtorch_cuda.so, in
a local scope: its symbols are not global, so the library is found by its
file in /proc/self/maps (an LD_PRELOAD'ed newer NCCL of the same soname is
the one mapped) and opened again with RTLD_NOLOAD, which hands back the
loaded copy and never loads a second. $DORMANT_NCCL_LIB names the file
instead (the tests' fake libnccl). Nothing here loads NCCL into a process
that has none.

ncclCommSuspend/ncclCommResume/ncclCommMemStats (NCCL 2.29.7 and later,
src/nccl.h.in) are looked up at run time; ncclGetVersion gives the version
(major * 10000 + minor * 100 + patch since 2.9).
"""
import ctypes
import os

from .._library import defining_file

SUSPEND_FROM = (2, 29, 7)
NCCL_SUSPEND_MEM = 0x01
# ncclCommMemStat_t
STAT_GPU_MEM_SUSPEND = 0     # bytes that a suspend releases
STAT_GPU_MEM_SUSPENDED = 1   # 0 active, 1 suspended
STAT_GPU_MEM_PERSIST = 2     # bytes a suspend keeps
STAT_GPU_MEM_TOTAL = 3

_RTLD_NOLOAD = getattr(os, "RTLD_NOLOAD", 4)


class NcclError(RuntimeError):
    """A call into libnccl returned an error (ncclResult_t in .result)."""

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


def version_text(code):
    major, minor, patch = version_tuple(code)
    return f"{major}.{minor}.{patch}"


def version_tuple(code):
    if code >= 10000:
        return code // 10000, code // 100 % 100, code % 100
    return code // 1000, code // 100 % 10, code % 100   # before 2.9


def mapped_paths(maps="/proc/self/maps"):
    """Every libnccl file mapped into this process, in the order of maps."""
    paths = []
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            for line in f:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                name = os.path.basename(path)
                if (name.startswith("libnccl.so") or name.startswith("libnccl-")) \
                        and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    return paths


def loaded_path(maps="/proc/self/maps"):
    """The file of the libnccl this process runs on, or None.

    Two can be mapped: PyTorch's wheels load their own by its full path
    while a newer one is on LD_PRELOAD (same soname). The calls bind to the
    one first in the global scope, which need not be first in maps (maps is
    sorted by address), so with several the global definition of
    ncclGetVersion decides, then LD_PRELOAD, then maps' order."""
    env = os.environ.get("DORMANT_NCCL_LIB")
    if env:
        return env
    paths = mapped_paths(maps)
    if len(paths) > 1:
        real = {os.path.realpath(p): p for p in paths}
        # the global definition: what a library linked to libnccl binds to
        bound = defining_file(ctypes.CDLL(None), "ncclGetVersion")
        if bound in real:
            return real[bound]
        for entry in os.environ.get("LD_PRELOAD", "").replace(":", " ").split():
            if os.path.realpath(entry) in real:
                return real[os.path.realpath(entry)]
    return paths[0] if paths else None


class LibNccl:
    """The loaded libnccl's suspend API. open() returns None when no libnccl
    is loaded; .suspend_missing says why suspend cannot be used (None: it
    can, as far as the library goes)."""

    def __init__(self, path, cdll):
        self.path = path
        self._lib = cdll
        self.version = None
        get_version = self._fn("ncclGetVersion", ctypes.c_int, [ctypes.POINTER(ctypes.c_int)])
        if get_version is not None:
            code = ctypes.c_int(0)
            if get_version(ctypes.byref(code)) == 0:
                self.version = code.value
        self._suspend = self._fn("ncclCommSuspend", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int])
        self._resume = self._fn("ncclCommResume", ctypes.c_int, [ctypes.c_void_p])
        self._mem_stats = self._fn("ncclCommMemStats", ctypes.c_int,
                                   [ctypes.c_void_p, ctypes.c_int,
                                    ctypes.POINTER(ctypes.c_uint64)])
        self._error_string = self._fn("ncclGetErrorString", ctypes.c_char_p, [ctypes.c_int])
        self._last_error = self._fn("ncclGetLastError", ctypes.c_char_p, [ctypes.c_void_p])

    @classmethod
    def open(cls, path=None):
        """The library at path (loaded if it is not), else the loaded one."""
        mode = os.RTLD_LOCAL
        if path is None:
            path = loaded_path()
            if not os.environ.get("DORMANT_NCCL_LIB"):
                mode |= _RTLD_NOLOAD   # the mapped copy, never a second one
        if not path:
            return None
        try:
            return cls(path, ctypes.CDLL(path, mode=mode))
        except OSError:
            return None

    def _fn(self, name, restype, argtypes):
        try:
            fn = getattr(self._lib, name)
        except AttributeError:
            return None
        fn.restype = restype
        fn.argtypes = argtypes
        return fn

    @property
    def version_text(self):
        return "unknown" if self.version is None else version_text(self.version)

    @property
    def suspend_missing(self):
        """Why this library cannot suspend, or None."""
        if self.version is not None and version_tuple(self.version) < SUSPEND_FROM:
            return f"NCCL {self.version_text} < {'.'.join(map(str, SUSPEND_FROM))}"
        if self._suspend is None or self._resume is None:
            return f"NCCL {self.version_text} has no ncclCommSuspend/ncclCommResume"
        return None

    @property
    def has_mem_stats(self):
        return self._mem_stats is not None

    def _check(self, what, result, comm):
        if result == 0:
            return
        text = None
        if self._last_error is not None:
            try:
                raw = self._last_error(ctypes.c_void_p(comm))
                text = raw.decode("utf-8", "replace") if raw else None
            except Exception:
                text = None
        if not text and self._error_string is not None:
            raw = self._error_string(result)
            text = raw.decode("utf-8", "replace") if raw else None
        raise NcclError(f"{what} returned {result}" + (f" ({text})" if text else ""), result)

    def suspend(self, comm):
        self._check("ncclCommSuspend", self._suspend(ctypes.c_void_p(comm), NCCL_SUSPEND_MEM),
                    comm)

    def resume(self, comm):
        self._check("ncclCommResume", self._resume(ctypes.c_void_p(comm)), comm)

    def mem_stat(self, comm, stat):
        """One ncclCommMemStats value, or None where the library has none."""
        if self._mem_stats is None:
            return None
        value = ctypes.c_uint64(0)
        self._check("ncclCommMemStats", self._mem_stats(ctypes.c_void_p(comm), stat,
                                                        ctypes.byref(value)), comm)
        return value.value
