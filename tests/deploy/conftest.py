# SPDX-License-Identifier: MIT
"""Paths and loaders for the deploy checks."""
import os
import shutil
import pathlib
import sys

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from dormantd_process import Dormantd  # noqa: E402

SOURCE_ROOT = pathlib.Path(os.environ.get("SOURCE_ROOT",
                                          pathlib.Path(__file__).resolve().parents[2]))
DEPLOY = SOURCE_ROOT / "deploy"
KUBE = DEPLOY / "kubernetes"


def tool(name):
    """A tool from $NAME or PATH, looked up now: installed after the build
    folder was set up, it counts."""
    path = os.environ.get(name.upper(), "") or shutil.which(name)
    if not path:
        pytest.fail(f"{name} not found on PATH (installed? see scripts/debian-packages.txt)")
    return path


def load_kube():
    """{kind: [document, ...]} over every manifest in deploy/kubernetes."""
    docs = {}
    for path in sorted(KUBE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                doc["__file__"] = path.name
                docs.setdefault(doc["kind"], []).append(doc)
    return docs


def one(docs, kind):
    assert len(docs.get(kind, [])) == 1, f"expected one {kind}, found {len(docs.get(kind, []))}"
    return docs[kind][0]


@pytest.fixture
def daemon(tmp_path):
    started = []

    def start(*args):
        d = Dormantd(tool("dormantd"), tmp_path, f"d{len(started)}", *args)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()
