# SPDX-License-Identifier: MIT
"""libdormant's ABI (docs/design.md, "ABI"): the library exports exactly what
its public headers declare, every symbol recorded for its ABI in
tests/ci/libdormant.symbols is still there (a removal needs abi_major raised
in meson.build), every export is recorded, and the soname says the ABI."""
import os
import pathlib
import re
import subprocess

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
RECORD = HERE / "libdormant.symbols"
# the headers of libdormant itself (dormant-preload.h is libdormant-preload's)
HEADERS = ["core/dormant.h", "api/dormant-json.h", "server/dormant-server.h"]


def lib():
    path = os.environ.get("DORMANT_LIB")
    if not path:
        pytest.skip("DORMANT_LIB is not set (meson test sets it)")
    return path


def exported():
    out = subprocess.run(["nm", "-D", "--defined-only", lib()], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def declared():
    names = set()
    for header in HEADERS:
        text = (REPO / header).read_text(encoding="utf-8")
        # DORMANT_EXPORT <return type> name(: the last identifier before '('
        names.update(re.findall(r"DORMANT_EXPORT\b[^;(]*?\b(dormant_\w+)\s*\(", text))
    return names


def recorded():
    lines = RECORD.read_text(encoding="utf-8").splitlines()
    major = re.match(r"# libdormant\.so\.(\d+):", lines[0])
    assert major, f"{RECORD.name} must start with '# libdormant.so.N:'"
    return int(major.group(1)), {line for line in lines if line and not line.startswith("#")}


def test_exports_are_the_public_declarations():
    ours = {name for name in exported() if not name.startswith("_")}
    assert not ours - declared(), (
        f"exported but in no public header (hidden visibility lost?): {sorted(ours - declared())}")
    assert not declared() - ours, (
        f"declared DORMANT_EXPORT but not exported: {sorted(declared() - ours)}")


def test_every_recorded_symbol_is_still_exported():
    _, record = recorded()
    gone = record - exported()
    assert not gone, (f"{sorted(gone)} left the library: that breaks programs built before, so "
                      f"raise abi_major in meson.build and rewrite {RECORD.name} for it")


def test_every_export_is_recorded():
    _, record = recorded()
    new = {name for name in exported() if name.startswith("dormant_")} - record
    assert not new, (f"append {sorted(new)} to tests/ci/{RECORD.name} (adding symbols keeps the "
                     f"ABI; raise abi_minor in meson.build)")


def test_the_soname_says_the_abi():
    want = os.environ.get("DORMANT_ABI_MAJOR")
    if not want:
        pytest.skip("DORMANT_ABI_MAJOR is not set (meson test sets it)")
    major, _ = recorded()
    assert major == int(want), f"{RECORD.name} records ABI {major}, meson.build says {want}"
    dynamic = subprocess.run(["readelf", "-d", lib()], capture_output=True, text=True,
                             check=True).stdout
    soname = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", dynamic)
    if os.environ.get("DORMANT_PYTHON_BUNDLE") == "1":
        return  # a wheel's plain libdormant.so, loaded by path only
    assert soname and soname.group(1) == f"libdormant.so.{want}", dynamic


def test_python_looks_for_this_soname():
    want = os.environ.get("DORMANT_ABI_MAJOR")
    if not want:
        pytest.skip("DORMANT_ABI_MAJOR is not set (meson test sets it)")
    text = (REPO / "python" / "dormant" / "_library.py").read_text(encoding="utf-8")
    sonames = re.search(r'^SONAMES = \("([^"]+)"', text, re.M)
    assert sonames and sonames.group(1) == f"libdormant.so.{want}", (
        "python/dormant/_library.py SONAMES must look for the ABI's soname first")


def test_the_header_lists_every_option():
    """dormant.h's options comment names every option of the library's table
    (core/options.c) with its environment variable: the table is the
    definition, the comment what a C user reads."""
    import ctypes
    cdll = ctypes.CDLL(lib())
    for fn in ("dormant_option_name", "dormant_option_env"):
        getattr(cdll, fn).restype = ctypes.c_char_p
        getattr(cdll, fn).argtypes = [ctypes.c_size_t]
    header = (REPO / "core" / "dormant.h").read_text(encoding="utf-8")
    start = header.index("struct dormant_options;")
    block = header[header.rindex("/*", 0, start):start]
    i = 0
    while cdll.dormant_option_name(i) is not None:
        name = cdll.dormant_option_name(i).decode()
        env = cdll.dormant_option_env(i)
        assert re.search(rf"^ \*   {name}\b", block, re.M), f"dormant.h does not list option {name}"
        if env is not None:
            assert f"${env.decode()}" in block, f"dormant.h does not say {name} reads ${env.decode()}"
        i += 1
    assert i >= 10


def test_the_server_header_lists_every_server_option():
    """The same for dormant-server.h and the server's table (server/server_options.c)."""
    import ctypes
    cdll = ctypes.CDLL(lib())
    for fn in ("dormant_server_option_name", "dormant_server_option_env"):
        getattr(cdll, fn).restype = ctypes.c_char_p
        getattr(cdll, fn).argtypes = [ctypes.c_size_t]
    header = (REPO / "server" / "dormant-server.h").read_text(encoding="utf-8")
    start = header.index("struct dormant_server_options;")
    block = header[header.rindex("/*", 0, start):start]
    i = 0
    while cdll.dormant_server_option_name(i) is not None:
        name = cdll.dormant_server_option_name(i).decode()
        env = cdll.dormant_server_option_env(i)
        assert re.search(rf"^ \*   {name}\b", block, re.M), (
            f"dormant-server.h does not list server option {name}")
        if env is not None:
            assert f"${env.decode()}" in block, (
                f"dormant-server.h does not say {name} reads ${env.decode()}")
        i += 1
    assert i >= 12


def test_the_options_objects_are_opaque():
    """No public header lays out an options struct: the library allocates
    them, so that options grow by a row without breaking programs built
    before (docs/design.md, "ABI")."""
    for header in HEADERS:
        text = (REPO / header).read_text(encoding="utf-8")
        for name in ("dormant_options", "dormant_server_options"):
            assert not re.search(rf"struct {name}\s*\{{", text), f"{header} lays out struct {name}"
