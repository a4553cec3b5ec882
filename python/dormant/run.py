# SPDX-License-Identifier: MIT
"""Start a program with dormant switched in:

    python3 -m dormant.run --torch-memory-saver [--capture] [--] CMD [ARG ...]

--torch-memory-saver: `import torch_memory_saver` in CMD and in every Python
    process it starts gets dormant.torch_memory_saver (dormant/_shadow is put
    first on PYTHONPATH, with the folder holding the dormant package). Without
    it nothing of torch_memory_saver is shadowed.
--capture: dormant's whole-process capture of cudaMalloc/cudaFree
    (dormant.preload.environment(): LD_PRELOAD and its variables).
--print-env: print the variables that would change (NAME=VALUE lines), do
    not run anything.

CMD replaces this process (exec), with the environment above; children
inherit it.
"""
import os
import pathlib
import sys

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
# The torch_memory_saver shadow: $DORMANT_SHADOW_DIR; in a source tree the
# build folder's (meson's preload/tms-shadow: the package beside
# libdormant-preload.so under torch_memory_saver's library file names, where
# launchers look for them); else the package's own (installed with those
# names beside it).
_BUILD_SHADOW = PACKAGE_DIR.parent.parent / "build" / "preload" / "tms-shadow"


def shadow_dir():
    env = os.environ.get("DORMANT_SHADOW_DIR")
    if env:
        return pathlib.Path(env)
    if (_BUILD_SHADOW / "torch_memory_saver").is_dir():
        return _BUILD_SHADOW
    return PACKAGE_DIR / "_shadow"


SHADOW_DIR = shadow_dir()

USAGE = ("usage: python3 -m dormant.run [--torch-memory-saver] [--capture] [--print-env] "
         "[--] CMD [ARG ...]")


def _prepend_path(value, *dirs):
    parts = [p for p in (value or "").split(os.pathsep) if p]
    new = [str(d) for d in dirs]
    return os.pathsep.join(new + [p for p in parts if p not in new])


def environment(env=None, *, torch_memory_saver=True, capture=False):
    """The environment a child needs (a new dict; env defaults to os.environ)."""
    env = dict(os.environ if env is None else env)
    if torch_memory_saver:
        env["PYTHONPATH"] = _prepend_path(env.get("PYTHONPATH"), shadow_dir(), PACKAGE_DIR.parent)
    if capture:
        from . import preload  # dormant's whole-process capture
        env = dict(preload.environment(env))
    return env


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    tms = capture = print_env = False
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        if flag == "--":
            break
        if flag == "--torch-memory-saver":
            tms = True
        elif flag == "--capture":
            capture = True
        elif flag == "--print-env":
            print_env = True
        elif flag in ("--help", "-h"):
            print(USAGE)
            print(__doc__.split("\n\n", 1)[1].rstrip())
            return 0
        else:
            print(f"dormant.run: unknown option {flag}\n{USAGE}", file=sys.stderr)
            return 2
    if not tms and not capture:
        print(f"dormant.run: say what to switch in (--torch-memory-saver, --capture)\n{USAGE}",
              file=sys.stderr)
        return 2
    try:
        env = environment(torch_memory_saver=tms, capture=capture)
    except ImportError as e:
        print(f"dormant.run: --capture needs dormant.preload, which this dormant lacks ({e}); "
              f"the dormant-run wrapper of the build (tools/dormant-run --capture) has it",
              file=sys.stderr)
        return 2
    if print_env:
        for key in sorted(env):
            if os.environ.get(key) != env[key]:
                print(f"{key}={env[key]}")
        return 0
    if not args:
        print(f"dormant.run: no command\n{USAGE}", file=sys.stderr)
        return 2
    try:
        os.execvpe(args[0], args, env)
    except OSError as e:
        print(f"dormant.run: cannot run {args[0]}: {e.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
