# SPDX-License-Identifier: MIT
"""The layering of docs/design.md, held by the includes: nothing outside
core/ includes core's private headers (what api/, server/ and core share is
in common/), core/ knows nothing of HTTP or JSON, api/ nothing of sockets.
bench/ is exempt: its benchmarks drive the backend and host buffers directly,
against the static core, by design (bench/meson.build)."""
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]
PUBLIC = {"dormant.h"}
EXEMPT = {"bench", ".thirdparty"}
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
             for name in includes(text) if name in private]
    assert not found, ("core's private headers included outside core/ (move what is shared "
                       f"to common/): {found}")


def test_core_knows_no_http_nor_json():
    found = [f"{rel}: {name}" for rel, text in sources("core") for name in includes(text)
             if name in ("jansson.h", "microhttpd.h") or name.startswith("dormant-")]
    assert not found, found


def test_api_knows_no_sockets():
    found = [f"{rel}: {name}" for rel, text in sources("api") for name in includes(text)
             if name in ("microhttpd.h", "sys/socket.h", "netinet/in.h", "arpa/inet.h")]
    assert not found, found
