# SPDX-License-Identifier: MIT
"""The Manager class: one libdormant manager, driven from Python over ctypes."""
import contextlib
import ctypes
import errno
import json
import logging
import os
import threading
import time
import weakref
from typing import (Any, Callable, ContextManager, Dict, Iterable, Iterator, List, Mapping,
                    Optional, Union)

from . import _library
from ._library import c_void_p
from .errors import BusyError, DormantError, InvalidArgumentError, StepTimeoutError, error_from

log = logging.getLogger("dormant")

# How long one dormant_step_enter() call waits before Python looks at signals
# again (so that Ctrl-C interrupts a step waiting for a wake).
_STEP_SLICE_MS = 100

_live_managers: "weakref.WeakSet[Manager]" = weakref.WeakSet()

# Manager._tls.transition_tags while a sleep or wake of every tag runs.
_TAGS_ALL = "all"

def _encode_tag(tag):
    if isinstance(tag, bytes):
        return tag
    if not isinstance(tag, str):
        raise InvalidArgumentError(f"a tag is a str, not {type(tag).__name__}", errno.EINVAL)
    return tag.encode("utf-8")


def _tag_array(tags):
    """A NULL-terminated const char *[] for tags (None: every tag)."""
    if tags is None:
        return None, None
    if isinstance(tags, (str, bytes)):
        tags = [tags]
    encoded = [_encode_tag(t) for t in tags]
    array = (ctypes.c_char_p * (len(encoded) + 1))(*encoded, None)
    return array, encoded  # keep the bytes alive as long as the array


# Before the options were set by name (struct dormant_options had a field
# each, 0 meaning "the default"), Manager took these with 0 as the default;
# it keeps that meaning for its callers.
_ZERO_IS_DEFAULT = frozenset({"chunk_bytes", "guard_timeout_ms", "copy_threads",
                              "staging_bytes", "host_devices", "host_device_bytes"})


def _option_text(name, value):
    """An option's value as the text dormant_options_set() takes, or None to
    leave the option unset. Whether the name exists and the value fits is for
    the library to say."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if value == 0 and name in _ZERO_IS_DEFAULT:
            return None
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fsdecode(value)
    raise InvalidArgumentError(
        f"option {name}: a str, int or bool, not {type(value).__name__}", errno.EINVAL)


# serve()'s numbers that take 0 for "the default", as before the options
# became names
_SERVER_ZERO_IS_DEFAULT = frozenset({"threads", "max_connections", "connection_timeout_s",
                                     "max_connections_per_ip", "request_timeout_s"})


def _server_option_text(name, value):
    """A server option's value as dormant_server_options_set() takes it, or
    None to leave it unset."""
    if isinstance(value, int) and not isinstance(value, bool) and value == 0 \
            and name in _SERVER_ZERO_IS_DEFAULT:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    return _option_text(name, value)


_server_logger = logging.getLogger("dormant.server")


def _server_log(level, message, userdata):
    """The server's log callback: its lines into the logger "dormant.server"."""
    try:
        _server_logger.log({0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO}.get(
                           level, logging.DEBUG), "%s",
                       message.decode("utf-8", "replace") if message else "")
    except BaseException:  # never let an exception into C
        pass


def server_options() -> List[Dict[str, Any]]:
    """The server options that serve(**options) takes, from the loaded
    library's table: a list of dicts with name, type ("text", "int",
    "bool"), default, env (its environment variable, or None) and doc."""
    return _library.get().server_options()


def options() -> List[Dict[str, Any]]:
    """The manager options that Manager(**options) takes, from the loaded
    library's table: a list of dicts with name, type ("enum", "size", "int",
    "bool", "path", "string"), values (an enum's, else None), default, env (its
    environment variable, or None) and doc."""
    return _library.get().options()


def _tristate_env(name):
    """$name as None (unset, empty or "auto"), True ("1") or False ("0")."""
    text = os.environ.get(name, "").strip().lower()
    if text in ("", "auto"):
        return None
    if text in ("1", "0"):
        return text == "1"
    raise InvalidArgumentError(f"${name} must be auto, 1 or 0, not {text!r}", errno.EINVAL)


def _policy_value(policy):
    if isinstance(policy, str) and policy in _library.POLICIES:
        return _library.POLICIES[policy]
    names = ", ".join(f'"{p}"' for p in _library.POLICIES)
    raise InvalidArgumentError(f"policy must be one of {names}, not {policy!r}", errno.EINVAL)


class Server:
    """The HTTP server started by Manager.serve(): .url, .port, .stop().

    Also a context manager that stops the server on exit."""

    def __init__(self, manager: "Manager", handle: Any, extra_callback: Any) -> None:
        self._manager = manager
        self._handle = handle
        self._extra_callback = extra_callback  # the C callback must outlive the server
        self._lock = threading.Lock()
        lib = manager._lib
        self.port = lib.dormant_server_port(handle)
        url = lib.dormant_server_url(handle)
        self.url = url.decode("utf-8") if url else ""

    @property
    def running(self) -> bool:
        return self._handle is not None

    def stop(self) -> None:
        """Stop listening and wait for requests in flight (a sleep or wake among
        them runs to its end). Idempotent. Not from a hook."""
        if self._manager._in_hook():
            raise DormantError("Server.stop() must not be called from a hook", errno.EDEADLK)
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            self._manager._lib.dormant_server_stop(handle)
            self._manager._servers.discard(self)
            self._extra_callback = None

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self):
        state = "running" if self.running else "stopped"
        return f"<dormant.Server {self.url or '?'} {state}>"


class Manager:
    """A dormant manager: tags of device memory that sleep and wake.

    Options (all optional): every manager option of the library, by its
    name, e.g. backend="host", host_mode="retain", chunk_bytes="64MiB" or
    chunk_bytes=64 << 20, pin_host=False. dormant.options() lists them with
    their types, defaults, environment variables and docs: the library's own
    table (core/options.c) decides which names exist and what values they
    take, and a bad name or value raises InvalidArgumentError (a ValueError)
    naming both. Left out or None, an option takes its environment variable
    ($DORMANT_BACKEND, $DORMANT_HOST_MODE, ...), else its default. Values are
    str (as the environment variable takes them), int or bool. For the
    numeric options of earlier versions (chunk_bytes, guard_timeout_ms,
    copy_threads, staging_bytes, host_devices, host_device_bytes) 0 still
    means "the default"; guard_timeout_ms="0" means "do not wait".
    And three of Python's own:
        log: None (the library logs nothing), True (to the "dormant" logger)
            or a callable(level, message) with level "error", "warning",
            "info" or "debug". It is called from library threads; keep it
            short and do not call dormant from it.
        mark_free_blocks: True (the default): once region() is in use, every
            sleep first marks the blocks that PyTorch's caching allocator
            holds free in the pools of the tags going to sleep as unused
            (mark_unused()), so they are neither copied nor kept in host
            memory. False turns that off (whole segments are copied); the
            attribute of the same name can change it later.
        empty_cache_on_sleep: True (the default, unless
            $DORMANT_TORCH_EMPTY_CACHE is 0): once region() is in use, every
            sleep first gives back the caching allocator's unused blocks
            outside dormant's pools (torch.cuda.empty_cache()), so that a
            sleeping trainer leaves no cached memory behind. False keeps
            them; the attribute of the same name can change it later.
        clear_cublas_on_sleep: with empty_cache_on_sleep, also give back
            PyTorch's cuBLAS workspaces (32 MiB per thread and stream that
            ran a matmul; the next matmul makes them again). None (the
            default, else $DORMANT_TORCH_CLEAR_CUBLAS: auto, 1 or 0):
            only while the process has captured no CUDA graph, which may
            hold a workspace's address. True always, False never; the
            attribute of the same name can change it later.
        nccl: what sleeps do with the process's NCCL communicators: "auto"
            (the default, else $DORMANT_NCCL): suspend them after the
            copies and resume them before the rebuilds (NCCL 2.29.7+);
            "rebuild": destroy the process groups and make them again;
            "off". See dormant.nccl and docs/pytorch.md, "NCCL memory".
        nccl_timeout_s: how long a suspend or resume waits for the
            group's other ranks before the transition fails naming the
            communicator (default $DORMANT_NCCL_TIMEOUT_S, else 120).

    Every method is safe to call from any thread. Hooks added with on_sleep()
    and on_wake() run on the thread that runs the transition, which may be an
    HTTP server thread.
    """

    # set by _init_state(); declared here for the type checker
    _m: Optional[ctypes.c_void_p]
    _torch: Any
    _comms: Any

    def __init__(self, *, log: Any = None, mark_free_blocks: bool = True,
                 empty_cache_on_sleep: Optional[bool] = None,
                 clear_cublas_on_sleep: Optional[bool] = None, nccl: Optional[str] = None,
                 nccl_timeout_s: Optional[float] = None, **options: Any) -> None:
        self._init_state()
        from . import nccl as _nccl  # standard library only; torch is never imported
        nccl_mode = _nccl._comms.mode_from(nccl)
        nccl_timeout = _nccl._comms.timeout_from(nccl_timeout_s)
        self.mark_free_blocks = bool(mark_free_blocks)
        if empty_cache_on_sleep is not None:
            self.empty_cache_on_sleep = bool(empty_cache_on_sleep)
        if clear_cublas_on_sleep is not None:
            self.clear_cublas_on_sleep = bool(clear_cublas_on_sleep)
        texts = [(name, _option_text(name, value)) for name, value in options.items()]
        self._log_callback = self._make_log_callback(log)
        lib = self._lib
        opts = c_void_p()
        self._check(lib.dormant_options_new(ctypes.byref(opts)))
        try:
            for name, text in texts:
                if text is None:
                    continue
                result = lib.dormant_options_set(opts, name.encode("utf-8"), text.encode("utf-8"))
                if result < 0:
                    known = ", ".join(o["name"] for o in lib.options())
                    raise error_from(result, f"Manager(): {lib.last_error()} (options: {known})")
            if self._log_callback is not None:
                self._check(lib.dormant_options_set_log(opts, self._log_callback, None))
            handle = c_void_p()
            self._check(lib.dormant_new(opts, ctypes.byref(handle)))
        finally:
            lib.dormant_options_destroy(opts)
        self._m = handle
        _live_managers.add(self)
        self._comms = _nccl.Communicators(self, nccl_mode, nccl_timeout)

    def _init_state(self):
        self._lib = _library.get()
        self._m = None
        self._owned = True          # False: the capture shim's manager (see _attach)
        self._hooks = {}            # id -> (fn, C callback, point)
        self._rebuilds = {}         # tag -> (fn, C callback): must outlive the C side's use
        self._servers = set()
        self._tls = threading.local()
        self._lock = threading.Lock()
        self._torch = None          # the region machinery, once region() is used
        self._log_callback = None
        self._comms = None          # dormant.nccl.Communicators
        self.mark_free_blocks = True
        self.empty_cache_on_sleep = os.environ.get("DORMANT_TORCH_EMPTY_CACHE", "1") != "0"
        self.clear_cublas_on_sleep = _tristate_env("DORMANT_TORCH_CLEAR_CUBLAS")

    @classmethod
    def _attach(cls, handle):
        """A Manager over a manager this object does not own: the process
        manager of whole-process capture (dormant.preload). close() stops
        this object's servers and forgets the handle; the manager lives on."""
        self = cls.__new__(cls)
        self._init_state()
        self._m = c_void_p(handle)
        self._owned = False
        _live_managers.add(self)
        from . import nccl as _nccl
        self._comms = _nccl.Communicators(self)
        return self

    @property
    def captured(self) -> bool:
        """True for the process manager of whole-process capture."""
        return not self._owned

    # ---- plumbing ---------------------------------------------------------

    @staticmethod
    def _make_log_callback(log_option):
        if log_option is None or log_option is False:
            return None
        if log_option is True:
            levels = {"error": logging.ERROR, "warning": logging.WARNING,
                      "info": logging.INFO, "debug": logging.DEBUG}

            def sink(level, message):
                log.log(levels[level], "%s", message)
        elif callable(log_option):
            sink = log_option
        else:
            raise InvalidArgumentError("log must be None, True or a callable", errno.EINVAL)

        def trampoline(level, message, userdata):
            try:
                sink(_library.LOG_LEVELS.get(level, "info"),
                     message.decode("utf-8", "replace") if message else "")
            except BaseException:  # never let an exception into C
                pass
        return _library.LOG_FN(trampoline)

    def _handle(self):
        if self._m is None:
            raise DormantError("this dormant manager is closed", errno.EBADF)
        return self._m

    def _check(self, result):
        if result < 0:
            raise error_from(result, self._lib.last_error())
        return result

    def _in_hook(self):
        return getattr(self._tls, "hook_depth", 0) > 0

    def _take_json(self, out):
        if not out.value:
            return None
        try:
            return json.loads(ctypes.string_at(out.value).decode("utf-8"))
        finally:
            self._lib.dormant_json_free(out)

    # ---- lifecycle --------------------------------------------------------

    def close(self) -> None:
        """Stop this manager's servers and free every allocation and the
        manager itself. Tensors that still live in its memory must not be
        used afterwards. Idempotent."""
        for server in list(self._servers):
            server.stop()
        if self._torch is not None and self._owned:
            self._torch.detach()
        if self._comms is not None:
            self._comms.close()
            self._comms = None
        with self._lock:
            handle, self._m = self._m, None
        if handle is not None and self._owned:
            self._lib.dormant_destroy(handle)
        self._hooks.clear()
        _live_managers.discard(self)

    @property
    def closed(self) -> bool:
        return self._m is None

    def __enter__(self) -> "Manager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self):
        if self._m is None:
            return "<dormant.Manager closed>"
        return f"<dormant.Manager backend={self.backend} host_mode={self.host_mode}>"

    # ---- properties -------------------------------------------------------

    @property
    def backend(self) -> str:
        """"cuda" or "host"."""
        return self._lib.dormant_backend_name(self._handle()).decode()

    def option(self, name: str) -> Any:
        """The value option name has in this manager (set, from the
        environment or the default) as text: sizes in bytes ("1073741824"),
        booleans "true"/"false". InvalidArgumentError for an unknown name."""
        buf = ctypes.create_string_buffer(4096)  # DORMANT_PATH_MAX: a path option
        self._check(self._lib.need("dormant_option_value", "Manager.option()")(
            self._handle(), name.encode("utf-8"), buf, len(buf)))
        return buf.value.decode("utf-8")

    @property
    def host_mode(self) -> str:
        """"retain" or "release". Settable while no transition runs
        (dormant_set_host_mode()): takes effect at the next sleep or wake."""
        mode = self._lib.dormant_host_mode(self._handle())
        return self._lib.dormant_host_mode_name(mode).decode()

    @host_mode.setter
    def host_mode(self, mode: str) -> None:
        values = {"retain": 1, "release": 2, "reclaimable": 3}  # enum dormant_host_mode
        if mode not in values:
            raise InvalidArgumentError(
                f'host_mode is "retain", "release" or "reclaimable", not {mode!r}', errno.EINVAL)
        fn = self._lib.need("dormant_set_host_mode", "setting host_mode")
        self._check(fn(self._handle(), values[mode]))

    @property
    def device_count(self) -> int:
        return self._check(self._lib.dormant_device_count(self._handle()))

    @property
    def library_path(self) -> str:
        """The libdormant file this manager runs on."""
        return self._lib.path

    # ---- tags, allocations ------------------------------------------------

    def set_policy(self, tag: str, policy: str, *,
                   rebuild: Optional[Callable[[str], Any]] = None) -> None:
        """Set a tag's policy, creating the tag if needed. Only while the tag
        is awake (else BusyError).

        "keep": copied to host on sleep, restored on wake.
        "discard": no copy; zero-filled on wake.
        "disk": as "keep", the copy in files of the disk directory
            (set_disk_dir(), the disk_dir option) instead of host memory:
            written while the copies run, verified on wake, removed after.
        "rebuild": no copy; on wake, after every "keep" tag of that wake is
            restored, rebuild(tag) runs with the tag's memory mapped and
            zero-filled, to recompute its content from other tags (e.g. bf16
            weights from fp32 master params). rebuild is required with
            "rebuild" and refused with the others. It runs on the thread
            running the wake (maybe an HTTP server thread) and must not
            sleep, wake or enter a step. If it raises, the wake fails (the
            exception's message is in the error; from Python it is also the
            error's __cause__): the tags stay asleep with their host copies
            intact, and the same wake can be retried. A tag woken without
            the tags its rebuild reads is the caller's choice."""
        name = _encode_tag(tag)
        value = _policy_value(policy)
        if policy == "rebuild":
            if not callable(rebuild):
                raise InvalidArgumentError('set_policy(tag, "rebuild") needs rebuild=<a callable>',
                                           errno.EINVAL)
            set_rebuild = self._lib.need("dormant_set_rebuild", 'set_policy(tag, "rebuild")')
            callback = _library.REBUILD_FN(self._rebuild_trampoline(rebuild))
            with self._lock:
                # The callback is installed first, so the tag never has the
                # rebuild policy without one; the old one stays referenced
                # until it is replaced in the C side.
                self._check(set_rebuild(self._handle(), name, callback, None))
                self._rebuilds[name] = (rebuild, callback)
        elif rebuild is not None:
            raise InvalidArgumentError(f'rebuild= goes with the "rebuild" policy, not {policy!r}',
                                       errno.EINVAL)
        self._check(self._lib.dormant_set_policy(self._handle(), name, value))

    def _rebuild_trampoline(self, fn):
        tls = self._tls
        manager = weakref.ref(self)

        def trampoline(m, tag, userdata):
            tls.hook_depth = getattr(tls, "hook_depth", 0) + 1
            name = tag.decode("utf-8", "replace") if tag else ""
            try:
                fn(name)
                owner = manager()
                if owner is not None and owner._torch is not None:
                    owner._torch.synchronize()  # the rebuilt bytes are there before steps go on
                return 0
            except BaseException as e:  # never let an exception into C
                try:
                    tls.hook_error = e
                    tls.rebuild_error = f"the rebuild of tag '{name}' raised " \
                                        f"{type(e).__name__}: {e}"
                    log.error("dormant rebuild callback of tag %r raised: failing the wake",
                              name, exc_info=True)
                except BaseException:
                    pass
                return -errno.EIO
            finally:
                tls.hook_depth -= 1

        return trampoline

    def mark_unused(self, ptr: int, size: int) -> None:
        """Say that [ptr, ptr + size) of a managed allocation holds nothing
        that must survive the next sleep: that sleep neither copies nor keeps
        it, and the wake after it zero-fills it. The mark lasts until that
        wake or a free of the allocation. InvalidArgumentError for a range
        that is not inside one managed allocation. (With region(), the glue
        marks the caching allocator's free blocks itself before each sleep;
        see mark_free_blocks.)"""
        fn = self._lib.need("dormant_mark_unused", "mark_unused()")
        self._check(fn(self._handle(), ptr, size))

    def set_disk_dir(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Set the directory of the "disk" policy's copies (the disk_dir
        option): the next sleep writes there. It must exist; a relative path
        is made absolute here. A sleep into a full, read-only or missing
        directory raises, every byte still on the device."""
        fn = self._lib.need("dormant_set_disk_dir", "set_disk_dir()")
        self._check(fn(self._handle(), os.fsencode(os.path.abspath(os.fspath(path)))))

    def warm_up(self) -> None:
        """Set up now what the next sleep would set up first (dormant_warm_up()):
        device streams, the checksum kernel and, in retain mode, the kept
        memory's pinned host copies. The manager also does this by itself once
        allocations settle (option warmup, warmup_settle_ms); this waits for it.
        Raises BusyError while a sleep or wake runs; never needed for a sleep
        to work."""
        fn = self._lib.need("dormant_warm_up", "warm_up()")
        self._check(fn(self._handle()))

    def set_verify(self, on: bool) -> None:
        """Turn verification after wake on or off (on by default; DORMANT_VERIFY=0
        turns it off): wakes hash the restored chunks on the device and raise
        DeviceError (EIO), the tags asleep with their host copies, when a chunk
        differs from what its sleep copied."""
        fn = self._lib.need("dormant_set_verify", "set_verify()")
        self._check(fn(self._handle(), bool(on)))

    def debug_corrupt_host(self, ptr: int, mask: int = 1) -> None:
        """Tests only: flip the bits of mask in the host copy's byte that holds
        device address ptr, of a tag asleep (the same call again restores it)."""
        fn = self._lib.need("dormant_debug_corrupt_host", "debug_corrupt_host()")
        self._check(fn(self._handle(), ptr, mask))

    def host_backup(self, ptr: int, size: int) -> Optional[int]:
        """The address of the host copy of [ptr, ptr + size) (a kept range of
        one allocation) while its tag is asleep, or awake with the copy retain
        mode kept: size bytes of host memory the manager owns, valid until the
        tag's next sleep or wake. None when no host copy holds the range.
        Raises DormantError with errno ERANGE when the copy holds it in pieces (live-bytes
        packing, two chunks): host_backup_read() copies it then."""
        fn = self._lib.need("dormant_host_backup", "host_backup()")
        out = c_void_p()
        r = fn(self._handle(), ptr, size, ctypes.byref(out))
        if r == -errno.ENOENT:
            return None
        self._check(r)
        return out.value

    def host_backup_read(self, ptr: int, size: int,
                         dst: Optional[int] = None) -> Union[bytes, int, None]:
        """The bytes of the host copy of [ptr, ptr + size) (bytes it left out
        read as zero): into dst, the address of size writable bytes (returns
        size), or without dst as bytes. None when no host copy holds the
        range (dst then untouched)."""
        fn = self._lib.need("dormant_host_backup_read", "host_backup_read()")
        buf = None
        if dst is None:
            buf = ctypes.create_string_buffer(size)
            dst = ctypes.addressof(buf)
        r = fn(self._handle(), ptr, size, dst)
        if r == -errno.ENOENT:
            return None
        self._check(r)
        return buf.raw if buf is not None else size

    def free_block_marks(self) -> Optional[Dict[str, Any]]:
        """What the glue's marking of free blocks did: a dict with "sleeps",
        "blocks", "bytes", "seconds" (totals) and "last" (the same for the
        last sleep), or None before region() is used."""
        return None if self._torch is None else self._torch.mark_stats()

    def alloc(self, tag: str, size: int, device: Optional[int] = None) -> int:
        """Allocate size bytes of device memory under tag; returns the address
        (an int). For code that does not go through PyTorch."""
        ptr = c_void_p()
        if device is None:
            r = self._lib.dormant_alloc(self._handle(), _encode_tag(tag), size, ctypes.byref(ptr))
        else:
            r = self._lib.dormant_alloc_on(self._handle(), _encode_tag(tag), size, device,
                                           ctypes.byref(ptr))
        self._check(r)
        assert ptr.value is not None  # a successful allocation has an address
        return ptr.value

    def free(self, ptr: int) -> None:
        self._check(self._lib.dormant_free(self._handle(), ptr))

    def copy_to_device(self, ptr: int, data: bytes) -> None:
        """Copy bytes-like data to managed device memory at ptr (synchronous)."""
        buf = (ctypes.c_char * len(data)).from_buffer_copy(data)
        self._check(self._lib.dormant_copy_to_device(self._handle(), ptr, buf, len(data)))

    def copy_to_host(self, ptr: int, size: int) -> bytes:
        """Read size bytes of managed device memory at ptr; returns bytes."""
        buf = ctypes.create_string_buffer(size)
        self._check(self._lib.dormant_copy_to_host(self._handle(), buf, ptr, size))
        return buf.raw

    # ---- transitions and stats --------------------------------------------

    def _transition(self, action, tags, residue=None):
        lib = self._lib
        if residue is not None:
            if residue not in ("keep", "checkpoint"):
                raise ValueError(f"residue must be 'keep', 'checkpoint' or None, not {residue!r}")
            sleep_json = lib.need("dormant_sleep_json", "sleep(residue=...)")
            fn = lambda m, _action, array, out: sleep_json(m, array, residue.encode(), out)  # noqa: E731
        else:
            fn = lib.need("dormant_transition_json", f"{action}()")
        if self._in_hook():
            raise BusyError(f"{action}() must not be called from a hook", errno.EBUSY)
        array, _keep = _tag_array(tags)
        out = c_void_p()
        self._tls.hook_error = None
        self._tls.rebuild_error = None
        # What the before-sleep hook of the torch glue reads (same thread).
        self._tls.transition_tags = _TAGS_ALL if tags is None else {
            t.decode("utf-8", "replace") if isinstance(t, bytes) else t
            for t in ([tags] if isinstance(tags, (str, bytes)) else tags)}
        try:
            r = fn(self._handle(), action.encode(), array, ctypes.byref(out))
        finally:
            self._tls.transition_tags = None
        message = lib.last_error() if r < 0 else ""
        report = self._take_json(out)
        if r < 0:
            if not message and report:
                message = report.get("error") or report.get("detail") or ""
            rebuild_error, self._tls.rebuild_error = self._tls.rebuild_error, None
            if rebuild_error:
                message = f"{message}: {rebuild_error}" if message else rebuild_error
            err = error_from(r, message, report)
            cause, self._tls.hook_error = getattr(self._tls, "hook_error", None), None
            raise err from cause
        return report

    def sleep(self, tags: Union[str, Iterable[str], None] = None, *,
              residue: Optional[str] = None) -> Dict[str, Any]:
        """Put tags (a name, a list of names, or None: every tag) to sleep.
        Waits for running training steps (see step()), runs the before-sleep
        hooks, releases device memory (copying "keep" tags to host memory).
        residue: "checkpoint" or "keep" for this sleep only (None: option
        residue): once every tag is asleep, "checkpoint" puts the rest of the
        process's device state (CUDA context, cuBLAS, NCCL) through the
        driver's process checkpoint; the next wake restores it. Its failure
        does not fail the sleep: report["residue"] says what happened.
        Returns the report dict (as POST /sleep does). Raises BusyError,
        UnknownTagError, CancelledError, OutOfMemoryError, DeviceError, each
        with .report; a failed sleep leaves the tags awake, data intact."""
        return self._transition("sleep", tags, residue)

    def wake(self, tags: Union[str, Iterable[str], None] = None) -> Dict[str, Any]:
        """Wake tags at the same addresses: "keep" tags restored, "discard"
        tags zero-filled; then the after-wake hooks run and waiting steps go
        on. Returns the report dict. OutOfMemoryError when the device memory
        is still held elsewhere: the tags stay asleep, intact; retry later."""
        return self._transition("wake", tags)

    def stats(self) -> Dict[str, Any]:
        """A dict shaped like GET /stats."""
        fn = self._lib.need("dormant_stats_json", "stats()")
        out = c_void_p()
        self._check(fn(self._handle(), False, ctypes.byref(out)))
        return self._take_json(out)

    # ---- the trainer guard ------------------------------------------------

    def _step_enter(self, timeout_s):
        if self._in_hook():
            raise BusyError("step() must not be entered from a hook (the transition "
                            "would wait for itself)", errno.EDEADLK)
        m = self._handle()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if deadline is None:
                slice_ms = _STEP_SLICE_MS
            else:
                slice_ms = max(0, min(_STEP_SLICE_MS, int((deadline - time.monotonic()) * 1000)))
            r = self._lib.dormant_step_enter(m, slice_ms)
            if r == 0:
                return
            if r != -errno.ETIMEDOUT:
                self._check(r)
            if deadline is not None and time.monotonic() >= deadline:
                raise StepTimeoutError(f"memory is not awake after {timeout_s} s",
                                       errno.ETIMEDOUT)

    @contextlib.contextmanager
    def step(self, timeout_s: Optional[float] = None) -> Iterator["Manager"]:
        """Mark one training step (the trainer guard). Entering waits while the
        memory is asleep or a sleep is waiting for steps to end (up to
        timeout_s; None: for ever, still interruptible by Ctrl-C; then
        StepTimeoutError). A sleep waits for running steps to leave."""
        self._step_enter(timeout_s)
        try:
            yield self
        finally:
            self._check(self._lib.dormant_step_leave(self._handle()))

    # ---- hooks ------------------------------------------------------------

    def add_hook(self, point: str, fn: Callable[[], Any]) -> int:
        """Run fn() at point: "before_sleep", "after_copies" (a sleep's
        copies done, the tags not yet asleep), "after_sleep", "before_wake",
        "before_rebuild" (a wake's memory back, no rebuild callback run yet)
        or "after_wake". It runs on the thread running the transition (maybe
        an HTTP server thread); it must not sleep, wake, or enter a step. If
        it raises, the exception is logged to the "dormant" logger and, at a
        before_ point or after_copies, the transition fails (CancelledError
        / HTTP 409, its message the exception's); after_copies leaves the
        tags asleep. Returns an id for remove_hook()."""
        if point not in _library.HOOK_POINTS:
            raise InvalidArgumentError(
                f"hook point must be one of {', '.join(_library.HOOK_POINTS)}, not {point!r}",
                errno.EINVAL)
        if not callable(fn):
            raise InvalidArgumentError("a hook must be callable", errno.EINVAL)
        before = point.startswith("before") or point == "after_copies"
        tls = self._tls
        lib = self._lib

        def trampoline(m, hook_point, userdata):
            tls.hook_depth = getattr(tls, "hook_depth", 0) + 1
            try:
                fn()
                return 0
            except BaseException as e:  # never let an exception into C
                try:
                    tls.hook_error = e
                    log.error("dormant %s hook %r raised%s", point,
                              getattr(fn, "__qualname__", fn),
                              ": failing the transition" if before else "", exc_info=True)
                    if before and lib.has("dormant_hook_set_error"):
                        # the reason, in the error of the transition (HTTP too)
                        lib.dormant_hook_set_error(
                            (str(e) or type(e).__name__).encode("utf-8", "replace"))
                except BaseException:
                    pass
                return 1 if before else 0
            finally:
                tls.hook_depth -= 1

        callback = _library.HOOK_FN(trampoline)
        with self._lock:
            hook_id = self._check(self._lib.dormant_hook_add(
                self._handle(), _library.HOOK_POINTS[point], callback, None))
            self._hooks[hook_id] = (fn, callback, point)
        return hook_id

    def remove_hook(self, hook: Union[int, Callable[[], Any]]) -> None:
        """Remove a hook by the id add_hook() returned, or by its function
        (every registration of it). Not from a hook."""
        if self._in_hook():
            raise BusyError("remove_hook() must not be called from a hook", errno.EDEADLK)
        with self._lock:
            if isinstance(hook, int):
                ids = [hook]
            else:
                ids = [i for i, (fn, _, _) in self._hooks.items() if fn is hook]
                if not ids:
                    raise error_from(-errno.ENOENT, f"{hook!r} is not a hook")
            for hook_id in ids:
                self._check(self._lib.dormant_hook_remove(self._handle(), hook_id))
                # The C side no longer calls it: the callback may go.
                self._hooks.pop(hook_id, None)

    def on_sleep(self, fn: Optional[Callable[[], Any]] = None, *, when: str = "before") -> Any:
        """Run fn() when memory goes to sleep (when="before": may cancel by
        raising; "after"). Usable as a decorator. Returns fn."""
        if fn is None:
            return lambda f: self.on_sleep(f, when=when)
        self.add_hook(f"{when}_sleep", fn)
        return fn

    def on_wake(self, fn: Optional[Callable[[], Any]] = None, *, when: str = "after") -> Any:
        """Run fn() when memory wakes (when="after": the memory is back;
        "before": may cancel by raising). Usable as a decorator. Returns fn."""
        if fn is None:
            return lambda f: self.on_wake(f, when=when)
        self.add_hook(f"{when}_wake", fn)
        return fn

    # ---- the HTTP server ----------------------------------------------------

    def serve(self, host: str = "127.0.0.1", port: int = 0, token: Optional[str] = None, *,
              unix_path: Optional[str] = None, token_file: Optional[str] = None,
              open_probes: bool = False, threads: int = 0, max_connections: int = 0,
              connection_timeout_s: float = 0, quiet: bool = False,
              stats_extra: Optional[Callable[[], Dict[str, Any]]] = None,
              max_connections_per_ip: int = 0, request_timeout_s: float = 0,
              faults: Optional[str] = None, publish: Any = None, role: Optional[str] = None,
              **options: Any) -> Server:
        """Start the HTTP control plane (POST /sleep, /wake, GET /stats, ...)
        on its own threads inside this process. port 0 picks a free port.
        token None: $DORMANT_TOKEN / $DORMANT_TOKEN_FILE if set, else no
        authentication. stats_extra: a callable returning a dict, shown as
        "extra" in GET /stats, beside "nccl" (the process's NCCL
        communicators, dormant.nccl; their dormant_comm_* lines are in GET
        /metrics). Limits (0: the defaults of dormant-server.h):
        max_connections (64) and max_connections_per_ip (32; loopback and
        Unix socket clients are not counted per address): over them an idle
        connection is closed to make room, never one carrying a request,
        else probes are answered on spare slots and other requests get 503
        with Retry-After; connection_timeout_s (30) idle
        seconds; request_timeout_s (10) for a whole request from a
        connection's opening or last answer. faults: a test tool, device
        faults armed at sleeps and wakes ("wake:create", see
        docs/testing.md); None or "": none ($DORMANT_FAULTS is never read).
        Listening beyond loopback without a token needs
        insecure_no_auth=True (a server option, taken by name).
        publish: True (or a directory) writes a discovery record there, so
        that dormantctl --discover and dormant.client.Client.discover() find
        this server on a port 0 (docs/orchestrators.md); None:
        $DORMANT_PUBLISH decides. role: the record's role (implies publish;
        default $DORMANT_ROLE). Further keyword arguments are server options
        by name (dormant.server_options() lists them all). Every option goes
        to the library by name (dormant_server_options_set()); an unknown
        name or a bad value raises InvalidArgumentError naming both.
        The server's access log (a line per request, "POST /sleep 200
        312.418 ms", unless quiet) goes to the logger "dormant.server" at
        INFO, its warnings at start (faults armed, no token beyond
        loopback) at WARNING; the library itself never prints.
        Returns a Server (.url, .port, .stop())."""
        lib = self._lib
        start = lib.need("dormant_server_start", "serve()")
        lib.need("dormant_server_options_new", "serve()")
        named = {
            "unix_path": unix_path, "token": token, "token_file": token_file,
            "open_probes": open_probes or None, "quiet": quiet or None, "threads": threads,
            "max_connections": max_connections, "connection_timeout_s": connection_timeout_s,
            "max_connections_per_ip": max_connections_per_ip,
            "request_timeout_s": request_timeout_s, "faults": faults,
        }
        if unix_path is None:
            h = f"[{host}]" if ":" in host and not host.startswith("[") else host
            named["listen"] = f"{h}:{int(port)}"
        named.update(options)
        texts = [(name, _server_option_text(name, value)) for name, value in named.items()]
        opts = c_void_p()
        self._check(lib.dormant_server_options_new(ctypes.byref(opts)))
        extra_callback = None
        handle = c_void_p()
        try:
            for name, text in texts:
                if text is None:
                    continue
                r = lib.dormant_server_options_set(opts, name.encode("utf-8"),
                                                   text.encode("utf-8"))
                if r < 0:
                    known = ", ".join(o["name"] for o in lib.server_options())
                    raise error_from(r, f"serve(): {lib.last_error()} (options: {known})")
            comms = self._comms
            if comms is not None:
                # GET /stats's extra.nccl and the dormant_comm_* metrics
                user_extra = stats_extra

                def stats_extra():
                    extra = dict(user_extra() or {}) if user_extra is not None else {}
                    extra["nccl"] = comms.stats()
                    return extra
            if stats_extra is not None:
                extra_callback = [_library.EXTRA_FN(_extra_trampoline(stats_extra))]
                self._check(lib.dormant_server_options_set_stats_extra(opts, extra_callback[0],
                                                                       None))
            if comms is not None and lib.has("dormant_server_options_set_metrics_extra"):
                extra_callback = (extra_callback or []) + [
                    _library.EXTRA_FN(_text_trampoline(comms.metrics))]
                self._check(lib.dormant_server_options_set_metrics_extra(
                    opts, extra_callback[-1], None))
            if lib.has("dormant_server_options_set_log"):
                extra_callback = (extra_callback or []) + [_library.LOG_FN(_server_log)]
                self._check(lib.dormant_server_options_set_log(opts, extra_callback[-1], None))
            self._check(start(self._handle(), opts, ctypes.byref(handle)))
        finally:
            lib.dormant_server_options_destroy(opts)
        server = Server(self, handle, extra_callback)
        self._servers.add(server)
        if publish or role is not None:
            where = None if publish is True or not publish else os.fspath(publish)
            fn = lib.need("dormant_server_publish", "serve(publish=...)")
            r = fn(handle, None if where is None else os.fsencode(where),
                   None if role is None else os.fsencode(role))
            if r < 0:
                message = lib.last_error()
                server.stop()
                raise error_from(r, message)
        return server

    # ---- PyTorch ------------------------------------------------------------

    def region(self, tag: str, policy: Optional[str] = None, *,
               dtype_tags: Optional[Mapping[Any, str]] = None) -> ContextManager[Any]:
        """A context manager: CUDA tensors PyTorch allocates inside it on this
        thread live in dormant memory under tag (one torch.cuda.MemPool per
        tag and device). policy, if given, sets the tag's policy first.
        dtype_tags ({torch.float32: "grads", ...}) sends allocations whose
        dtype is listed to that tag instead (decided per torch call; see
        docs/pytorch.md). Needs torch with CUDA and the cuda backend."""
        return self._torch_glue().region(tag, policy, dtype_tags)

    def _torch_glue(self):
        """The region machinery (dormant._torch.TorchGlue), made on first use;
        also used by dormant.torch_memory_saver."""
        if self._torch is None:
            from . import _torch  # torch is imported here, not at package import
            with self._lock:
                if self._torch is None:
                    self._torch = _torch.TorchGlue(self)
        return self._torch

    # ---- testing ----------------------------------------------------------

    def debug_occupy(self, nbytes: int, device: int = 0) -> None:
        """Take nbytes of device memory outside the manager, as another
        process would (0 gives it back): makes a wake fail with ENOMEM."""
        self._check(self._lib.dormant_debug_occupy(self._handle(), device, nbytes))

    def debug_inject_fault(self, op: str, nth: int, error: int = -errno.EIO,
                           repeat: bool = False) -> None:
        """Make the nth next call of op ("create", "map", "copy",
        "host_alloc", "disk": a disk copy's create, write or read) fail
        with error (a negative errno); nth 0 disarms."""
        if op not in _library.FAULT_OPS:
            raise InvalidArgumentError(f"unknown fault op {op!r}", errno.EINVAL)
        self._check(self._lib.dormant_debug_inject_fault(self._handle(), _library.FAULT_OPS[op],
                                                         nth, error, repeat))

    def debug_op_count(self, op: str) -> int:
        return self._lib.dormant_debug_op_count(self._handle(), _library.FAULT_OPS[op])

    def __del__(self):
        # Best effort for managers nobody closed; never while PyTorch may
        # still hold tensors in its memory.
        try:
            if self._m is not None and self._owned and self._torch is None and not self._servers:
                self.close()
        except Exception:
            pass


def _buffer_trampoline(produce, what):
    """A callback that writes produce()'s bytes and a NUL into the library's
    buffer: the length, -ENOSPC when they do not fit, -EIO when it raised."""
    def trampoline(userdata, buf, size):
        try:
            data = produce()
        except BaseException:
            log.error("dormant %s callback raised", what, exc_info=True)
            return -errno.EIO
        if len(data) + 1 > size:
            return -errno.ENOSPC
        ctypes.memmove(buf, data, len(data))
        ctypes.memset(buf + len(data), 0, 1)
        return len(data)
    return trampoline


def _extra_trampoline(fn):
    """A dormant_stats_extra_fn over fn() returning what json.dumps takes."""
    return _buffer_trampoline(lambda: json.dumps(fn()).encode(), "stats_extra")


def _text_trampoline(fn):
    """A dormant_metrics_extra_fn over fn() returning text."""
    return _buffer_trampoline(lambda: fn().encode(), "metrics")


def stop_all_servers() -> None:
    """Stop every server of every live manager (at interpreter exit: server
    threads must not call into Python while it shuts down)."""
    for manager in list(_live_managers):
        for server in list(manager._servers):
            try:
                server.stop()
            except Exception:
                pass
