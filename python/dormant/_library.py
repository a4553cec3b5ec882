# SPDX-License-Identifier: MIT
"""Finding and loading libdormant, and its C declarations for ctypes.

The library is looked for, in this order:
  1. $DORMANT_LIB (a path to the .so; if set, nothing else is tried);
  2. beside the package (dormant/libdormant.so, as pip installs it: see
     pyproject.toml and meson's -Dpython_bundle=true);
  3. the meson build folder of the source tree this package sits in
     (<repo>/build/libdormant.so);
  4. the library folder recorded at installation (dormant/_paths.py,
     written by meson install);
  5. the system loader (libdormant.so.1, then libdormant.so).
Under whole-process capture (libdormant-preload.so, see dormant.preload) the
libdormant the shim already loaded comes before all of these: a second copy
would have a manager registry of its own.
When none loads, LibraryNotFoundError lists every place tried and why.
"""
import ctypes
import ctypes.util
import os
import pathlib
import threading

from .errors import LibraryNotFoundError, UnsupportedError

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
SONAMES = ("libdormant.so.1", "libdormant.so")  # abi_major in meson.build

c_int, c_uint, c_size_t, c_bool = ctypes.c_int, ctypes.c_uint, ctypes.c_size_t, ctypes.c_bool
c_char_p, c_void_p, c_double, c_uint64 = ctypes.c_char_p, ctypes.c_void_p, ctypes.c_double, ctypes.c_uint64

# enum dormant_policy / dormant_hook_point / dormant_fault_op
POLICIES = {"keep": 0, "discard": 1, "rebuild": 2, "disk": 3}
POLICY_TAG = -1  # DORMANT_POLICY_TAG: an allocation that follows its tag's policy
HOOK_POINTS = {"before_sleep": 0, "after_sleep": 1, "before_wake": 2, "after_wake": 3,
               "after_copies": 4, "before_rebuild": 5}
FAULT_OPS = {"create": 0, "map": 1, "copy": 2, "host_alloc": 3, "disk": 4}
LOG_LEVELS = {0: "error", 1: "warning", 2: "info", 3: "debug"}
TAG_MAX = 63

LOG_FN = ctypes.CFUNCTYPE(None, c_int, c_char_p, c_void_p)
HOOK_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_int, c_void_p)
EXTRA_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_void_p, c_size_t)
REBUILD_FN = ctypes.CFUNCTYPE(c_int, c_void_p, c_char_p, c_void_p)  # dormant_rebuild_fn


# name: (restype, argtypes). Functions missing from the loaded library are
# left out and reported by Library.need() when used.
_PROTOTYPES = {
    # struct dormant_options is opaque: its names, types and defaults are the
    # library's own table (core/options.c), listed by dormant_option_*().
    "dormant_options_new": (c_int, [ctypes.POINTER(c_void_p)]),
    "dormant_options_destroy": (None, [c_void_p]),
    "dormant_options_set": (c_int, [c_void_p, c_char_p, c_char_p]),
    "dormant_options_set_log": (c_int, [c_void_p, LOG_FN, c_void_p]),
    "dormant_option_name": (c_char_p, [c_size_t]),
    "dormant_option_type": (c_char_p, [c_size_t]),
    "dormant_option_values": (c_char_p, [c_size_t]),
    "dormant_option_default": (c_char_p, [c_size_t]),
    "dormant_option_env": (c_char_p, [c_size_t]),
    "dormant_option_doc": (c_char_p, [c_size_t]),
    "dormant_option_value": (c_int, [c_void_p, c_char_p, c_char_p, c_size_t]),
    "dormant_new": (c_int, [c_void_p, ctypes.POINTER(c_void_p)]),
    "dormant_destroy": (None, [c_void_p]),
    "dormant_backend_name": (c_char_p, [c_void_p]),
    "dormant_host_mode": (c_int, [c_void_p]),
    "dormant_host_mode_name": (c_char_p, [c_int]),
    "dormant_device_count": (c_int, [c_void_p]),
    "dormant_set_policy": (c_int, [c_void_p, c_char_p, c_int]),
    "dormant_set_disk_dir": (c_int, [c_void_p, c_char_p]),
    "dormant_alloc": (c_int, [c_void_p, c_char_p, c_size_t, ctypes.POINTER(c_void_p)]),
    "dormant_alloc_on": (c_int, [c_void_p, c_char_p, c_size_t, c_int,
                                 ctypes.POINTER(c_void_p)]),
    "dormant_alloc_policy": (c_int, [c_void_p, c_char_p, c_int, c_size_t, c_int,
                                     ctypes.POINTER(c_void_p)]),
    "dormant_free": (c_int, [c_void_p, c_void_p]),
    "dormant_mark_unused": (c_int, [c_void_p, c_void_p, c_size_t]),
    "dormant_set_rebuild": (c_int, [c_void_p, c_char_p, REBUILD_FN, c_void_p]),
    "dormant_last_error": (c_char_p, []),
    "dormant_version": (c_char_p, []),
    "dormant_step_enter": (c_int, [c_void_p, c_int]),
    "dormant_step_leave": (c_int, [c_void_p]),
    "dormant_hook_add": (c_int, [c_void_p, c_int, HOOK_FN, c_void_p]),
    "dormant_hook_remove": (c_int, [c_void_p, c_int]),
    "dormant_hook_set_error": (c_int, [c_char_p]),
    "dormant_torch_set_manager": (c_int, [c_void_p]),
    "dormant_set_thread_tag": (c_int, [c_char_p]),
    "dormant_get_thread_tag": (c_int, [ctypes.c_char_p, c_size_t]),
    "dormant_set_thread_policy": (c_int, [c_int]),
    "dormant_get_thread_policy": (c_int, []),
    "dormant_copy_to_host": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t]),
    "dormant_copy_to_device": (c_int, [c_void_p, c_void_p, c_void_p, c_size_t]),
    "dormant_debug_inject_fault": (c_int, [c_void_p, c_int, c_uint, c_int, c_bool]),
    "dormant_debug_op_count": (c_uint64, [c_void_p, c_int]),
    "dormant_debug_occupy": (c_int, [c_void_p, c_int, c_size_t]),
    # checksums (issue 15)
    "dormant_set_verify": (c_int, [c_void_p, c_bool]),
    "dormant_debug_corrupt_host": (c_int, [c_void_p, c_void_p, ctypes.c_ubyte]),
    # host copies (issue 20)
    "dormant_host_backup": (c_int, [c_void_p, c_void_p, c_size_t, ctypes.POINTER(c_void_p)]),
    "dormant_host_backup_read": (c_int, [c_void_p, c_void_p, c_size_t, c_void_p]),
    "dormant_set_host_mode": (c_int, [c_void_p, c_int]),
    # warm-up (issue 24)
    "dormant_warm_up": (c_int, [c_void_p]),
    # api/dormant-json.h
    "dormant_stats_json": (c_int, [c_void_p, c_bool, ctypes.POINTER(c_void_p)]),
    "dormant_transition_json": (c_int, [c_void_p, c_char_p, ctypes.POINTER(c_char_p),
                                        ctypes.POINTER(c_void_p)]),
    "dormant_sleep_json": (c_int, [c_void_p, ctypes.POINTER(c_char_p), c_char_p,
                                   ctypes.POINTER(c_void_p)]),
    "dormant_json_free": (None, [c_void_p]),
    # server/dormant-server.h
    # struct dormant_server_options is opaque too: its table is
    # server/server_options.c, listed by dormant_server_option_*().
    "dormant_server_options_new": (c_int, [ctypes.POINTER(c_void_p)]),
    "dormant_server_options_destroy": (None, [c_void_p]),
    "dormant_server_options_set": (c_int, [c_void_p, c_char_p, c_char_p]),
    "dormant_server_options_get": (c_int, [c_void_p, c_char_p, c_char_p, c_size_t]),
    "dormant_server_options_set_stats_extra": (c_int, [c_void_p, EXTRA_FN, c_void_p]),
    "dormant_server_options_set_metrics_extra": (c_int, [c_void_p, EXTRA_FN, c_void_p]),
    "dormant_server_options_set_log": (c_int, [c_void_p, LOG_FN, c_void_p]),
    "dormant_server_option_name": (c_char_p, [c_size_t]),
    "dormant_server_option_type": (c_char_p, [c_size_t]),
    "dormant_server_option_default": (c_char_p, [c_size_t]),
    "dormant_server_option_env": (c_char_p, [c_size_t]),
    "dormant_server_option_doc": (c_char_p, [c_size_t]),
    "dormant_server_start": (c_int, [c_void_p, c_void_p, ctypes.POINTER(c_void_p)]),
    "dormant_server_port": (c_int, [c_void_p]),
    "dormant_server_url": (c_char_p, [c_void_p]),
    "dormant_server_stop": (None, [c_void_p]),
    "dormant_server_publish": (c_int, [c_void_p, c_char_p, c_char_p]),
}


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", c_char_p), ("dli_fbase", c_void_p),
                ("dli_sname", c_char_p), ("dli_saddr", c_void_p)]


def defining_file(cdll, symbol):
    """The file (real path) whose symbol cdll resolves, via dladdr: with
    ctypes.CDLL(None), the first definition in the process's global scope.
    None when there is none."""
    try:
        libc = ctypes.CDLL(None)
        dladdr = libc.dladdr
        dladdr.argtypes = [c_void_p, ctypes.POINTER(_DlInfo)]
        dladdr.restype = c_int
        info = _DlInfo()
        addr = ctypes.cast(getattr(cdll, symbol), c_void_p)
        if dladdr(addr, ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(os.fsdecode(info.dli_fname))
    except (AttributeError, OSError):
        pass
    return None


def _loaded_path(cdll, fallback):
    """The file the dynamic loader really mapped for cdll."""
    return defining_file(cdll, "dormant_new") or fallback


class Library:
    """A loaded libdormant: the ctypes handle, its path, its functions."""

    def __init__(self, cdll, path, how):
        self.cdll = cdll
        self.path = path  # the file loaded: what CUDAPluggableAllocator opens
        self.how = how    # where it was found, in words
        self.missing = []
        for name, (restype, argtypes) in _PROTOTYPES.items():
            try:
                fn = getattr(cdll, name)
            except AttributeError:
                self.missing.append(name)
                continue
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)
        if "dormant_new" in self.missing:
            raise LibraryNotFoundError(f"{path} is not libdormant (no dormant_new)")

    def has(self, name):
        return name not in self.missing

    def need(self, name, what):
        """The function name, or UnsupportedError saying what needs it."""
        if name in self.missing:
            raise UnsupportedError(
                f"{what} needs {name}(), which the libdormant at {self.path} does not "
                f"export (built without it, or older than this package)", 38)  # ENOSYS
        return getattr(self, name)

    def _option_table(self, prefix, fields):
        """The rows of one of the library's option tables: each a dict of
        fields, read with the functions prefix + field (text, None if none)."""
        if not self.has(prefix + "name"):
            return []
        out = []
        i = 0
        while getattr(self, prefix + "name")(i) is not None:
            row = {}
            for name in fields:
                value = getattr(self, prefix + name)(i)
                row[name] = value.decode("utf-8") if value is not None else None
            out.append(row)
            i += 1
        return out

    def options(self):
        """The manager options this library knows (dormant_option_*()), as a
        list of dicts: name, type, values (enum: a list, else None), default,
        env (None if none) and doc."""
        rows = self._option_table("dormant_option_",
                                  ("name", "type", "values", "default", "env", "doc"))
        for row in rows:
            row["values"] = row["values"].split("|") if row["values"] else None
        return rows

    def server_options(self):
        """The server options this library knows (dormant_server_option_*()),
        as a list of dicts: name, type ("text", "int", "bool"), default, env
        (None if none) and doc."""
        return self._option_table("dormant_server_option_",
                                  ("name", "type", "default", "env", "doc"))

    def last_error(self):
        msg = self.dormant_last_error()
        return msg.decode("utf-8", "replace") if msg else ""


def _repo_build_dir():
    # python/dormant/_library.py -> the repository root is two folders up.
    return PACKAGE_DIR.parent.parent / "build"


def _installed_libdir():
    try:
        from . import _paths  # written by meson install
    except ImportError:
        return None
    return getattr(_paths, "LIBDIR", None)


def preloaded_path():
    """The libdormant that the capture shim loaded into this process, or None
    when libdormant-preload.so is not loaded."""
    try:
        process = ctypes.CDLL(None)
        process.dormant_preload_manager  # noqa: B018 (present only with the shim)
        process.dormant_new  # noqa: B018
    except (AttributeError, OSError):
        return None
    path = _loaded_path(process, None)
    return path if path and os.path.exists(path) else None


def candidates():
    """(description, path or soname, is_file) in search order."""
    preloaded = preloaded_path()
    if preloaded:
        return [("the capture shim's (libdormant-preload.so)", preloaded, True)]
    env = os.environ.get("DORMANT_LIB")
    if env:
        return [("$DORMANT_LIB", env, True)]
    out = []
    out.append(("beside the package", str(PACKAGE_DIR / "libdormant.so"), True))
    out.append(("the meson build folder", str(_repo_build_dir() / "libdormant.so"), True))
    libdir = _installed_libdir()
    if libdir:
        out.append(("the installed library folder", os.path.join(libdir, SONAMES[0]), True))
    for soname in SONAMES:
        out.append(("the system loader", soname, False))
    return out


def load():
    """Load libdormant from the first place that works (see module doc)."""
    tried = []
    for how, where, is_file in candidates():
        if is_file and not os.path.exists(where):
            tried.append(f"  {how}: {where}: no such file")
            continue
        try:
            cdll = ctypes.CDLL(where)
        except OSError as e:
            tried.append(f"  {how}: {where}: {e}")
            continue
        try:
            return Library(cdll, _loaded_path(cdll, where), how)
        except LibraryNotFoundError as e:
            tried.append(f"  {how}: {where}: {e}")
    found = ctypes.util.find_library("dormant")
    hint = f" (ctypes.util.find_library sees {found})" if found else ""
    raise LibraryNotFoundError(
        "cannot load libdormant; tried:\n" + "\n".join(tried) +
        f"\nBuild it (meson setup build && meson compile -C build), or set DORMANT_LIB to "
        f"the path of libdormant.so{hint}.", 2)  # ENOENT


_lock = threading.Lock()
_library = None


def get():
    """The process's libdormant, loaded on first use."""
    global _library
    with _lock:
        if _library is None:
            _library = load()
        return _library
