# SPDX-License-Identifier: MIT
"""The layering of docs/design.md ("Architecture"), held by the includes.

Outside core/: nothing includes core's private headers (what api/, server/
and core share is in common/), core/ knows nothing of HTTP or JSON, api/
nothing of sockets nor any header of server/, common/ no header of core/,
api/ or server/, and no room's meson.build puts a higher room's folder on
its include path. bench/ is exempt for the files that time the backend and
host buffers directly (BENCH_INTERNALS), against the static core: they see
the lower rooms' interfaces and the core's test-support header (support.h),
never the manager's own headers (BENCH_MAY).

Inside core/, three rooms whose doors open one way: core/backends/ (the
device interface, its implementations, the hash) at the bottom includes
nothing of the two above it; core/engine/ (the transfer engine) includes the
backends' headers but nothing of the manager's; the manager (core/ itself)
may include all. Nor does a lower room name a higher room's types: what the
engine knows of the manager's allocations and tags comes in its own
struct chunk_owner (engine/chunk.h). core/dormant.h (public) and core/util.h are the ground
floor: every room may include them, and they include no room's header.
Headers are found by name (meson puts the three folders on the include
path), so a name says its room; no two rooms may hold the same name."""
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]
PUBLIC = {"dormant.h"}
EXEMPT = {".thirdparty"}
# bench/'s files that time the backend and host buffers themselves, against
# the static core (bench/meson.build); every other file of bench/ keeps to
# the public API and common/ like the rest of the tree.
BENCH_INTERNALS = {"bench/bench_ceiling.c", "bench/bench_core.c", "bench/pinned.h",
                   "bench/probe-vmm.c"}
CORE = REPO / "core"
FLOOR = {"dormant.h", "util.h"}  # core/: every room may include them

INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.M)


def sources(folder=None):
    root = REPO / folder if folder else REPO
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(REPO)
        if path.suffix not in (".c", ".h", ".cc", ".cpp") or not path.is_file():
            continue
        if rel.parts[0] in EXEMPT or rel.parts[0].startswith("build"):
            continue
        yield rel, path.read_text(encoding="utf-8", errors="replace")


def includes(text):
    return INCLUDE.findall(text)


def test_core_private_headers_stay_in_core():
    private = {p.name for p in (REPO / "core").rglob("*.h")} - PUBLIC
    assert "util.h" in private and "manager.h" in private
    found = [f"{rel}: {name}" for rel, text in sources() if rel.parts[0] != "core"
             and rel.as_posix() not in BENCH_INTERNALS
             for name in includes(text) if name in private]
    assert not found, ("core's private headers included outside core/ (move what is shared "
                       f"to common/): {found}")


# What bench/'s BENCH_INTERNALS may include of core's private headers: the
# core's test-support door (support.h) and the lower rooms' interfaces; never
# the manager's own headers.
BENCH_MAY = {"support.h", "backend.h", "hostbuf.h", "workers.h", "util.h"}


def test_bench_reaches_the_manager_through_its_support_header_only():
    private = {p.name for p in (REPO / "core").rglob("*.h")} - PUBLIC
    assert BENCH_MAY <= private
    found = [f"{rel}: {name}" for rel, text in sources("bench")
             if rel.as_posix() in BENCH_INTERNALS
             for name in includes(text) if name in private and name not in BENCH_MAY]
    assert not found, ("bench/ includes a private header of the manager: use core/support.h "
                       f"(the test-support door) instead: {found}")


def test_core_knows_no_http_nor_json():
    found = [f"{rel}: {name}" for rel, text in sources("core") for name in includes(text)
             if name in ("jansson.h", "microhttpd.h") or name.startswith("dormant-")]
    assert not found, found


def test_api_knows_no_sockets():
    found = [f"{rel}: {name}" for rel, text in sources("api") for name in includes(text)
             if name in ("microhttpd.h", "sys/socket.h", "netinet/in.h", "arpa/inet.h")]
    assert not found, found


def test_api_knows_no_server():
    # not even dormant-server.h: what api/ and the server share lives in api/
    # (the callback types in dormant-json.h) or common/
    server = {p.name for p in (REPO / "server").glob("*.h")}
    assert {"auth.h", "dormant-server.h"} <= server
    found = [f"{rel}: {name}" for rel, text in sources("api") for name in includes(text)
             if pathlib.PurePosixPath(name).name in server]
    assert not found, f"api/ includes server/'s headers (move the shared piece down): {found}"


def test_common_includes_no_component():
    """common/ is below core/, api/ and server/: it includes none of their
    headers (what it needs of them, such as the public limits, is its own)."""
    above = {p.name for room in ("core", "api", "server") for p in (REPO / room).rglob("*.h")}
    assert {"dormant.h", "manager.h", "api.h", "dormant-server.h"} <= above
    found = [f"{rel}: {name}" for rel, text in sources("common") for name in includes(text)
             if pathlib.PurePosixPath(name).name in above]
    assert not found, f"common/ includes a header of a room above it: {found}"


# The include-folder rule, in the build: the folders a room's meson.build puts
# on its own include path, or hands to its users, are its own or a lower
# room's. (core/meson.build still hands its private folders to its users,
# docs/design.md says why; bench/ and the tests reach them through it.)
MESON_FOLDERS = re.compile(r"include_directories\(([^)]*)\)")
LOWER = {"common": set(), "api": {"common", "core"}, "server": {"common", "core", "api"}}


def include_folders(room):
    """The folders, relative to the repository, that room/meson.build names
    in include_directories()."""
    text = (REPO / room / "meson.build").read_text(encoding="utf-8")
    folders = set()
    for args in MESON_FOLDERS.findall(text):
        for name in re.findall(r"'([^']*)'", args):
            folders.add((pathlib.PurePosixPath(room) / name).as_posix())
    return {os_normpath(f) for f in folders}


def os_normpath(path):
    parts = []
    for part in pathlib.PurePosixPath(path).parts:
        if part == "..":
            parts.pop()
        elif part != ".":
            parts.append(part)
    return "/".join(parts)


def test_rooms_build_with_their_own_include_folders():
    found = []
    for room, lower in LOWER.items():
        folders = include_folders(room)
        assert room in folders, f"{room}/meson.build names no include folder of its own"
        found += [f"{room}/meson.build: {folder}" for folder in sorted(folders)
                  if folder.split("/")[0] != room and folder.split("/")[0] not in lower]
    assert not found, ("a room's meson.build puts a higher room's folder on the include "
                       f"path: {found}")


def rooms():
    """Header names of each room of core/, and of the ground floor."""
    backends = {p.name for p in (CORE / "backends").rglob("*.h")}
    engine = {p.name for p in (CORE / "engine").rglob("*.h")}
    manager = {p.name for p in CORE.glob("*.h")} - FLOOR
    assert {"backend.h", "hash.h", "hash_mix.h"} <= backends
    assert {"transfer.h", "pipeline.h", "checksum.h"} <= engine
    assert {"manager.h", "options.h", "slab.h"} <= manager
    return backends, engine, manager


def room_includes(folder, forbidden):
    """(file, header) for each include under core/folder of a forbidden name."""
    found = []
    root = CORE / folder if folder else CORE
    for path in sorted(root.rglob("*") if folder else root.glob("*")):
        if path.suffix not in (".c", ".h", ".cu") or not path.is_file():
            continue
        rel = path.relative_to(REPO).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [(rel, pathlib.PurePosixPath(name).name) for name in includes(text)
                  if pathlib.PurePosixPath(name).name in forbidden]
    return found


def test_rooms_hold_distinct_names():
    backends, engine, manager = rooms()
    both = (backends & engine) | (backends & manager) | (engine & manager) | \
        ((backends | engine | manager) & FLOOR)
    assert not both, f"one header name in two rooms (includes go by name): {both}"


def test_backends_include_nothing_above():
    backends, engine, manager = rooms()
    found = room_includes("backends", engine | manager)
    assert not found, ("core/backends/ includes the engine's or the manager's headers (move "
                       f"the piece it needs down, or pass it in): {found}")


def test_engine_includes_no_manager_header():
    backends, engine, manager = rooms()
    found = room_includes("engine", manager)
    assert not found, ("core/engine/ includes the manager's headers (what it needs from the "
                       f"manager comes in through its own header, chunk.h): {found}")


# Types a lower room never names (an include can hide behind another
# header): the engine knows a chunk's owner by struct chunk_owner and a tag's
# counters by struct held_bytes (chunk.h), never the manager's allocation or
# tag; the backends know neither room.
MANAGER_TYPES = {"alloc", "tag", "dormant", "hook", "warmup", "slab_space"}
ENGINE_TYPES = {"engine", "chunk", "chunk_owner", "held_bytes", "engine_item", "hostbuf",
                "copy_plan"}
STRUCT = re.compile(r"\bstruct\s+(\w+)")


def room_types(folder, forbidden):
    found = []
    for path in sorted((CORE / folder).rglob("*")):
        if path.suffix not in (".c", ".h", ".cu") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        found += [f"{path.relative_to(REPO).as_posix()}: struct {name}"
                  for name in STRUCT.findall(text) if name in forbidden]
    return found


def test_engine_names_no_manager_type():
    found = room_types("engine", MANAGER_TYPES)
    assert not found, ("core/engine/ names the manager's types (pass what it needs in "
                       f"struct chunk_owner or another type of its own): {found}")


def test_backends_name_no_type_above():
    found = room_types("backends", MANAGER_TYPES | ENGINE_TYPES)
    assert not found, f"core/backends/ names the engine's or the manager's types: {found}"


def test_ground_floor_includes_no_room():
    backends, engine, manager = rooms()
    found = [(rel, name) for rel, name in room_includes("", backends | engine | manager)
             if pathlib.PurePosixPath(rel).name in FLOOR]
    assert not found, found


# Floors inside a room (docs/design.md, "Architecture"): a file includes no
# header of a floor above its own. Each floor lists its files by stem; a
# header a floor may not include is any header of a higher floor.
FLOORS = {
    "engine": [
        {"state", "chunk", "extent", "hostbuf", "workers", "diskfile", "wakecopy"},
        {"staging", "checksum", "verify"},
        {"pipeline", "prepare", "mapper"},
        {"transfer"},
    ],
    "backends": [
        {"backend", "hash", "hash_mix"},
        {"backend_cuda_driver", "backend_host"},
        {"backend_cuda_kernel", "backend_cuda_checksum", "backend_cuda_copy"},
        {"backend_cuda"},
        {"backend_choose"},
    ],
    # the manager's room: its data at the bottom; the files on top share
    # manager.h and may use each other (one room, one header)
    "": [
        {"warmup_state", "residue", "residue_proto", "options", "slab", "util", "version"},
        {"manager_state"},
        {"alloc"},
        {"manager", "warmup", "guard", "hooks", "backup", "torch", "transition",
         "manager_verify", "residue_helper", "support"},
    ],
}


def floor_violations(folder, floors):
    level = {stem: i for i, floor in enumerate(floors) for stem in floor}
    root = CORE / folder if folder else CORE
    found = []
    for path in sorted(root.glob("*")):
        if path.suffix not in (".c", ".h") or path.stem not in level:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for name in includes(text):
            stem = pathlib.PurePosixPath(name).stem
            if pathlib.PurePosixPath(name).suffix == ".h" and level.get(stem, -1) > level[path.stem]:
                found.append(f"{path.relative_to(REPO).as_posix()} includes {name}")
    return found


def test_every_file_of_a_room_has_a_floor():
    """A new file must say where it stands: in FLOORS above."""
    missing = []
    for folder, floors in FLOORS.items():
        known = set().union(*floors)
        root = CORE / folder if folder else CORE
        missing += [p.relative_to(REPO).as_posix() for p in sorted(root.glob("*"))
                    if p.suffix in (".c", ".h") and p.stem not in known
                    and p.name not in FLOOR]
    assert not missing, f"files with no floor in tests/ci/test_layout.py's FLOORS: {missing}"


def test_no_file_includes_a_floor_above_its_own():
    found = []
    for folder, floors in FLOORS.items():
        found += floor_violations(folder, floors)
    assert not found, ("a file includes a header of a floor above its own (move the piece it "
                       f"needs down, or pass it in as a callback): {found}")


def meson_block(text, start):
    """The text of a call from `start` to its closing parenthesis."""
    i = text.index(start)
    depth = 0
    for j in range(i, len(text)):
        depth += text[j] == "("
        depth -= text[j] == ")"
        if text[j] == ")" and depth == 0:
            return text[i:j + 1]
    raise AssertionError(f"{start} is not closed")


def test_what_links_the_core_sees_its_public_header_only():
    """core_dep puts core/public (a copy of dormant.h, nothing else) on the
    include path, not the three rooms' folders; core_private_dep, which does,
    is used by bench/ alone."""
    core = (CORE / "meson.build").read_text()
    block = meson_block(core, "core_dep = declare_dependency(")
    assert "core_public_inc" in block and "core_inc" not in block.replace(
        "core_public_inc", ""), block
    public = CORE / "public"
    assert sorted(p.name for p in public.iterdir()) == ["meson.build"], \
        "core/public/ holds no source header: the build copies dormant.h there"
    users = sorted(p.relative_to(REPO).as_posix() for p in REPO.rglob("meson.build")
                   if not p.relative_to(REPO).parts[0].startswith(("build", ".")) and
                   "core_private_dep" in p.read_text() and p.parent != CORE)
    assert users == ["bench/meson.build"], users


def test_every_tsan_scenario_is_a_test_of_its_own():
    # tests/tsan/meson.build runs each scenario of the driver as a test of
    # its own: a scenario missing from its list would never run in CI
    driver = (REPO / "tests/tsan/tsan_driver.c").read_text()
    table = driver[driver.index("} scenarios[] = {"):]
    table = table[:table.index("};")]
    in_driver = re.findall(r'\{ "([a-z_]+)", scenario_', table)
    build = (REPO / "tests/tsan/meson.build").read_text()
    listed = re.findall(r"'([a-z_]+)'", build[build.index("tsan_scenarios = ["):
                                                build.index("]", build.index("tsan_scenarios"))])
    assert in_driver, "no scenarios read from tsan_driver.c"
    assert listed == in_driver, (listed, in_driver)
