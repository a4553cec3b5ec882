# SPDX-License-Identifier: MIT
"""The package's public API is typed (PEP 561: dormant/py.typed): every public
function, method and property of dormant, dormant.client and
dormant.torch_memory_saver (and dormant-run's module) annotates its
parameters and its result, and mypy finds the annotations consistent with
the code (python3-mypy, scripts/debian-packages.txt)."""
import inspect
import os
import pathlib
import subprocess
import sys

import pytest

import dormant
import dormant.client
import dormant.run
import dormant.torch_memory_saver

PYTHON_DIR = pathlib.Path(dormant.__file__).resolve().parents[1]
MODULES = [dormant, dormant.client, dormant.torch_memory_saver, dormant.run]


def public_callables():
    """(qualified name, function) for each public function, method and
    property accessor."""
    seen = set()
    for module in MODULES:
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj):
                yield f"{module.__name__}.{name}", obj
            elif inspect.isclass(obj) and obj.__module__.startswith("dormant") and obj not in seen:
                seen.add(obj)
                for attr, member in vars(obj).items():
                    if attr.startswith("_") and attr not in ("__init__", "__enter__", "__exit__",
                                                             "__aenter__", "__aexit__"):
                        continue
                    if isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    if isinstance(member, property):
                        for accessor in (member.fget, member.fset):
                            if accessor is not None:
                                yield f"{obj.__qualname__}.{attr}", accessor
                    elif inspect.isfunction(member):
                        yield f"{obj.__qualname__}.{attr}", inspect.unwrap(member)


def test_the_package_says_it_is_typed():
    assert (PYTHON_DIR / "dormant" / "py.typed").is_file()


def test_every_public_callable_is_annotated():
    missing = []
    count = 0
    for name, fn in public_callables():
        count += 1
        sig = inspect.signature(fn)
        params = [p for p in list(sig.parameters.values())
                  if p.name not in ("self", "cls")]
        untyped = [p.name for p in params if p.annotation is inspect.Parameter.empty]
        if untyped or sig.return_annotation is inspect.Signature.empty:
            missing.append(f"{name}{sig}")
    assert count > 60, f"only {count} public callables found"
    assert not missing, "not annotated:\n  " + "\n  ".join(missing)


def test_mypy_agrees_with_the_annotations():
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is not installed: apt-get install python3-mypy (scripts/setup-debian)")
    modules = [m.__name__ for m in MODULES] + ["dormant.manager"]
    # the modules named, not what they import (errors there are not the API's)
    args = [sys.executable, "-m", "mypy", "--ignore-missing-imports", "--follow-imports=silent",
            "--no-error-summary", "--cache-dir", os.devnull]
    for m in modules:
        args += ["-m", m]
    p = subprocess.run(args, cwd=PYTHON_DIR, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
