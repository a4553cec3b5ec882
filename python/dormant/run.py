# SPDX-License-Identifier: MIT
"""dormant-run: start a program with dormant switched in (docs/capture.md).

usage: dormant-run [--capture] [--listen HOST:PORT] [--token-file FILE]
                   [--port-file FILE] [--torch-memory-saver] [--print-env]
                   [--] CMD [ARG ...]

  --capture             whole-process capture: every cudaMalloc/cudaFree of
                        CMD (PyTorch's caching allocator included) is a dormant
                        allocation under the tag "default" (policy keep), or
                        under the tag of the dormant region running
  --listen HOST:PORT    serve the dormant HTTP API from inside CMD (port 0: any
                        free port), started with CMD's first CUDA allocation
  --token-file FILE     bearer token for that server ($DORMANT_TOKEN_FILE)
  --port-file FILE      write the port listened on to FILE
  --torch-memory-saver  `import torch_memory_saver` in CMD and in every Python
                        process it starts gets dormant.torch_memory_saver
  --print-env           print the variables that would change (NAME=VALUE
                        lines) instead of running CMD
  --version             print dormant-run's version

CMD replaces this process (exec, same pid), with the environment above;
children inherit it. Exit status 2 and one line on stderr when something makes
the request impossible (nothing runs); 126 or 127 when CMD cannot be run;
otherwise CMD's own status.

The same program, whichever way it is started: `dormant-run` (the build's
tools/dormant-run, `meson install`, or pip's console script) and
`python3 -m dormant.run`. Needs only the standard library.
"""
import os
import pathlib
import sys
from typing import Dict, List, Mapping, NoReturn, Optional, Sequence

__all__ = ["environment", "main", "shadow_dir"]

PROG = "dormant-run"
PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
# The torch_memory_saver shadow (a package named torch_memory_saver, with
# libdormant-preload.so beside it under torch_memory_saver's library file
# names, where launchers look for them): $DORMANT_SHADOW_DIR; else the one the
# launcher names (the build folder's preload/tms-shadow, for tools/dormant-run);
# in a source tree run as `python3 -m dormant.run`, its build folder's; else
# the package's own (installed with those names beside it).
_BUILD_SHADOW = PACKAGE_DIR.parent.parent / "build" / "preload" / "tms-shadow"
EXIT_USAGE = 2

# PyTorch allocator settings capture cannot see: (key, value, why).
_UNCAPTURABLE = (
    ("expandable_segments", "true",
     "expandable_segments:True (PyTorch then maps memory with cuMem* itself, which capture "
     "cannot see); unset it"),
    ("backend", "cudamallocasync",
     "backend:cudaMallocAsync (stream-ordered memory cannot be captured); use PyTorch's "
     "native allocator"),
)
_ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


class UsageError(Exception):
    """A request dormant-run refuses: exit status 2, the message on one line."""


def _prepend_path(value: Optional[str], *dirs: "os.PathLike[str] | str") -> str:
    parts = [p for p in (value or "").split(os.pathsep) if p]
    new = [str(d) for d in dirs]
    return os.pathsep.join(new + [p for p in parts if p not in new])


def _conf_sets(conf: str, key: str, value: str) -> bool:
    """Whether a PyTorch allocator configuration sets key to value (any case,
    blanks ignored)."""
    for item in conf.split(","):
        k, sep, v = "".join(item.split()).partition(":")
        if sep and k.lower() == key and v.lower() == value:
            return True
    return False


def shadow_dir(env: Optional[Mapping[str, str]] = None,
               shadow: Optional[str] = None) -> pathlib.Path:
    """Where the torch_memory_saver shadow is looked for (see above)."""
    env = os.environ if env is None else env
    if env.get("DORMANT_SHADOW_DIR"):
        return pathlib.Path(env["DORMANT_SHADOW_DIR"])
    if shadow:
        return pathlib.Path(shadow)
    if (_BUILD_SHADOW / "torch_memory_saver").is_dir():
        return _BUILD_SHADOW
    return PACKAGE_DIR / "_shadow"


def _shadow_dir(env: Mapping[str, str], shadow: Optional[str]) -> pathlib.Path:
    shadow_path = shadow_dir(env, shadow)
    if not shadow_path.is_dir():
        raise UsageError(f"cannot find dormant's torch_memory_saver shadow at {shadow_path}; "
                         f"set DORMANT_SHADOW_DIR")
    return shadow_path


def environment(env: Optional[Mapping[str, str]] = None, *, torch_memory_saver: bool = True,
                capture: bool = False, listen: Optional[str] = None,
                token_file: Optional[str] = None, port_file: Optional[str] = None,
                preload_library: Optional[str] = None, library: Optional[str] = None,
                shadow: Optional[str] = None, pid: Optional[int] = None) -> Dict[str, str]:
    """The environment a program started by dormant-run gets: a new dict, env
    (default: os.environ) with the switches applied. pid is the process that
    will exec the program (default: this one): the captured server belongs to
    it, not to its children. preload_library and library name the build's
    libdormant-preload.so and libdormant.so (the build folder's launcher
    passes them, and its torch_memory_saver shadow; elsewhere the package
    finds its own).
    Raises UsageError for what dormant-run refuses."""
    env = dict(os.environ if env is None else env)
    if not torch_memory_saver and not capture:
        raise UsageError("nothing to do: give --capture and/or --torch-memory-saver")
    if not capture and (listen is not None or port_file is not None):
        raise UsageError("--listen and --port-file serve the captured manager: "
                         "they need --capture")
    if token_file is not None and not os.access(token_file, os.R_OK):
        raise UsageError(f"cannot read the token file {token_file}")
    if capture:
        for variable in _ALLOC_CONF_VARIABLES:
            for key, value, why in _UNCAPTURABLE:
                if _conf_sets(env.get(variable, ""), key, value):
                    raise UsageError(f"refusing to capture: {variable} sets {why}")
        from . import preload  # standard library only
        if preload_library and not env.get("DORMANT_PRELOAD_LIB"):
            shim = preload_library
        else:
            try:
                shim = env.get("DORMANT_PRELOAD_LIB") or preload.library_path()
            except Exception as e:  # noqa: BLE001 (UnsupportedError, or no libdormant)
                raise UsageError(f"cannot find libdormant-preload.so ({e}); "
                                 f"set DORMANT_PRELOAD_LIB") from None
        if not os.path.isfile(shim):
            raise UsageError(f"cannot find libdormant-preload.so at {shim} "
                             f"(set DORMANT_PRELOAD_LIB)")
        shim = os.path.realpath(shim)
        # after what is there already: a sanitizer runtime must stay first
        entries = env.get("LD_PRELOAD", "").split()
        if shim not in entries:
            entries.append(shim)
        env["LD_PRELOAD"] = " ".join(entries)
        env["DORMANT_PRELOAD"] = "1"
        # the server is for this process (the pid survives exec), not children
        env["DORMANT_PRELOAD_PID"] = str(os.getpid() if pid is None else pid)
        if listen is not None:
            env["DORMANT_LISTEN"] = listen
        if port_file is not None:
            env["DORMANT_PORT_FILE"] = port_file
    if token_file is not None:
        env["DORMANT_TOKEN_FILE"] = token_file
    if torch_memory_saver:
        # the shadow, then the folder holding this dormant package, which the
        # shadow imports
        env["PYTHONPATH"] = _prepend_path(env.get("PYTHONPATH"), _shadow_dir(env, shadow),
                                          PACKAGE_DIR.parent)
        if library and not env.get("DORMANT_LIB"):
            env["DORMANT_LIB"] = library
    return env


def _usage() -> str:
    """The docstring but its title: the synopsis, the flags, what happens."""
    return __doc__.split("\n\n", 1)[1].strip("\n")


def _fail(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: Optional[Sequence[str]] = None, *, preload_library: Optional[str] = None,
         library: Optional[str] = None, shadow: Optional[str] = None) -> int:
    """dormant-run's command line; returns the exit status when it does not
    exec the program."""
    args: List[str] = list(sys.argv[1:] if argv is None else argv)
    flags: Dict[str, bool] = {"capture": False, "torch_memory_saver": False}
    values: Dict[str, Optional[str]] = {"listen": None, "token_file": None, "port_file": None}
    print_env = False
    while args and args[0].startswith("-"):
        arg = args.pop(0)
        if arg == "--":
            break
        name, eq, value = arg.partition("=")
        key = name[2:].replace("-", "_")
        if name in ("--capture", "--torch-memory-saver") and not eq:
            flags[key] = True
        elif name in ("--listen", "--token-file", "--port-file"):
            if not eq:
                if not args:
                    what = "HOST:PORT" if name == "--listen" else "a file"
                    return _fail(f"{name} needs {what}")
                value = args.pop(0)
            values[key] = value or None  # an empty value: as not given
        elif arg == "--print-env":
            print_env = True
        elif arg in ("-h", "--help"):
            print(_usage())
            return 0
        elif arg == "--version":
            from . import __version__  # the package's (dormant/__init__.py)
            print(f"{PROG} {__version__}")
            return 0
        else:
            return _fail(f"unknown option {arg} (see --help)")
    if not args and not print_env:
        return _fail("no command given (dormant-run [OPTIONS] -- CMD [ARGS...])")
    try:
        env = environment(torch_memory_saver=flags["torch_memory_saver"],
                          capture=flags["capture"], listen=values["listen"],
                          token_file=values["token_file"], port_file=values["port_file"],
                          preload_library=preload_library, library=library, shadow=shadow)
    except UsageError as e:
        return _fail(str(e))
    if print_env:
        for key in sorted(env):
            if os.environ.get(key) != env[key]:
                print(f"{key}={env[key]}")
        return 0
    _exec(args, env)


def _exec(args: List[str], env: Dict[str, str]) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(args[0], args, env)
    except OSError as e:
        print(f"{PROG}: cannot run {args[0]}: {e.strerror}", file=sys.stderr)
        sys.exit(127 if isinstance(e, FileNotFoundError) else 126)


if __name__ == "__main__":
    sys.exit(main())
