# SPDX-License-Identifier: MIT
"""dormant.nccl.lean_one_rank_groups() on a stand-in torch.distributed: which
groups get the one-CTA NCCL config and which are left as the program made
them ($DORMANT_NCCL_ONE_RANK_CTAS included)."""
import os
import pathlib
import subprocess
import sys

import pytest

from dormant.nccl import _lean


class FakeConfig:
    def __init__(self):
        self.min_ctas = None
        self.max_ctas = None


class FakeOptions:
    def __init__(self):
        self.config = FakeConfig()


class FakePGNCCL:
    Options = FakeOptions


class FakeDist:
    ProcessGroupNCCL = FakePGNCCL

    def __init__(self, world=4, backend="nccl"):
        self.world = world
        self.backend = backend
        self.made = []  # (ranks, args, kwargs) as new_group() got them

    def get_world_size(self):
        return self.world

    def get_backend(self):
        return self.backend

    def init_process_group(self, *args, **kwargs):
        self.made.append(("init", args, kwargs))

    def new_group(self, ranks=None, *args, **kwargs):
        """the original"""
        self.made.append((ranks, args, kwargs))
        return len(self.made)


def cap_of(call):
    options = call[2].get("pg_options")
    return None if options is None else (options.config.min_ctas, options.config.max_ctas)


def test_a_one_rank_nccl_group_gets_the_cap():
    dist = FakeDist()
    assert _lean.lean_one_rank_groups(2, dist=dist) == 2
    assert dist.new_group([3]) == 1
    assert cap_of(dist.made[-1]) == (1, 2)


def test_a_group_of_several_ranks_is_left_alone():
    dist = FakeDist()
    _lean.lean_one_rank_groups(dist=dist)
    dist.new_group([0, 1])
    assert cap_of(dist.made[-1]) is None


def test_all_ranks_of_a_one_rank_world_is_one_rank():
    dist = FakeDist(world=1)
    _lean.lean_one_rank_groups(dist=dist)
    dist.new_group()
    assert cap_of(dist.made[-1]) == (1, 1)
    dist = FakeDist(world=2)
    _lean.lean_one_rank_groups(dist=dist)
    dist.new_group()
    assert cap_of(dist.made[-1]) is None


def test_the_programs_own_options_and_other_backends_are_kept():
    dist = FakeDist()
    _lean.lean_one_rank_groups(dist=dist)
    own = FakeOptions()
    dist.new_group([0], pg_options=own)
    assert dist.made[-1][2]["pg_options"] is own and own.config.max_ctas is None
    dist.new_group([0], backend="gloo")
    assert cap_of(dist.made[-1]) is None
    dist.backend = "gloo"
    dist.new_group([0])
    assert cap_of(dist.made[-1]) is None
    dist.new_group([0], None, "nccl")  # positional: passed on as given
    assert dist.made[-1][1] == (None, "nccl") and cap_of(dist.made[-1]) is None


def test_a_second_call_changes_the_cap_without_wrapping_twice():
    dist = FakeDist()
    _lean.lean_one_rank_groups(1, dist=dist)
    wrapped = dist.new_group
    _lean.lean_one_rank_groups(3, dist=dist)
    assert dist.new_group is wrapped and wrapped.__doc__ == "the original"
    dist.new_group([1])
    assert len(dist.made) == 1 and cap_of(dist.made[-1]) == (1, 3)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1"])
def test_a_bad_cap_is_refused_and_nothing_is_wrapped(bad):
    dist = FakeDist()
    with pytest.raises(ValueError, match="max_ctas"):
        _lean.lean_one_rank_groups(bad, dist=dist)
    dist.new_group([0])
    assert cap_of(dist.made[-1]) is None


def test_the_environment():
    dist = FakeDist()
    assert _lean.lean_from_env(dist=dist, environ={_lean.ENV: "off"}) is None
    dist.new_group([0])
    assert cap_of(dist.made[-1]) is None
    assert _lean.lean_from_env(dist=dist, environ={_lean.ENV: " 4 "}) == 4
    dist.new_group([0])
    assert cap_of(dist.made[-1]) == (1, 4)
    for bad in ("0", "two", "-3"):
        with pytest.raises(ValueError, match=_lean.ENV):
            _lean.lean_from_env(dist=FakeDist(), environ={_lean.ENV: bad})


@pytest.mark.parametrize("residue", ["checkpoint", "keep", None])
def test_one_rank_groups_are_capped_by_default_in_every_residue_mode(residue):
    environ = {} if residue is None else {"DORMANT_RESIDUE": residue}
    dist = FakeDist()
    assert _lean.lean_from_env(dist=dist, environ=environ, modules={"torch": 1}) == 1
    dist.new_group([0])
    assert cap_of(dist.made[-1]) == (1, 1)
    dist.new_group([0, 1])
    assert cap_of(dist.made[-1]) is None, "several ranks keep their channels"


@pytest.mark.parametrize("environ, modules", [
    ({_lean.ENV: "off"}, {"torch": 1}),
    ({"DORMANT_RESIDUE": "checkpoint", _lean.ENV: ""}, {"torch": 1}),
    ({}, {}),  # no torch yet: never imported for it
])
def test_no_default_cap_with_off_or_without_torch(environ, modules):
    dist = FakeDist()
    meta_path = []
    assert _lean.lean_from_env(dist=dist, environ=environ, modules=modules,
                               meta_path=meta_path) is None
    dist.new_group([0])
    assert cap_of(dist.made[-1]) is None
    # without torch yet, a watch for torch.distributed is left, once
    watching = "torch" not in modules and _lean.ENV not in environ
    assert len(meta_path) == (1 if watching else 0)
    _lean.lean_from_env(dist=dist, environ=environ, modules=modules, meta_path=meta_path)
    assert len(meta_path) == (1 if watching else 0)


def test_the_glue_default_leaves_an_explicit_variable_alone():
    # dormant's PyTorch glue calls lean_by_default(): a variable set, even
    # to a cap, is import dormant's business, never overridden here
    for value in ("4", "off"):
        dist = FakeDist()
        assert _lean.lean_by_default(dist=dist, environ={"DORMANT_RESIDUE": "checkpoint",
                                                         _lean.ENV: value},
                                     modules={"torch": 1}) is None
        dist.new_group([0])
        assert cap_of(dist.made[-1]) is None


def test_the_default_never_overrides_a_cap_in_force():
    dist = FakeDist()
    _lean.lean_one_rank_groups(4, dist=dist)
    assert _lean.lean_from_env(dist=dist, environ={}, modules={"torch": 1}) is None
    dist.new_group([0])
    assert cap_of(dist.made[-1]) == (1, 4)


@pytest.mark.parametrize("value, says", [("x", "DORMANT_NCCL_ONE_RANK_CTAS takes a whole number"),
                                         ("off", None)])
def test_import_dormant_reads_the_environment(value, says):
    python = pathlib.Path(__file__).resolve().parents[2] / "python"
    env = dict(os.environ, DORMANT_NCCL_ONE_RANK_CTAS=value,
               PYTHONPATH=os.pathsep.join([str(python), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", "import dormant"], env=env,
                       capture_output=True, text=True, timeout=60)
    if says is None:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode != 0 and says in r.stderr


FAKE_DISTRIBUTED = (
    "import os\n"
    "class _Config:\n    min_ctas = max_ctas = None\n"
    "class _Options:\n    def __init__(self):\n        self.config = _Config()\n"
    "class ProcessGroupNCCL:\n    Options = _Options\n"
    "made = []\n"
    "def get_world_size():\n    return 8\n"
    "def get_backend():\n    return 'nccl'\n"
    "def init_process_group(backend=None, **kwargs):\n"
    "    made.append(kwargs.get('pg_options'))\n"
    "def new_group(ranks=None, **kwargs):\n    made.append(kwargs.get('pg_options'))\n")


def test_import_dormant_caps_the_groups_made_after_it(tmp_path):
    """$DORMANT_NCCL_ONE_RANK_CTAS=2, a stand-in torch.distributed on the path"""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("")
    (tmp_path / "torch" / "distributed.py").write_text(FAKE_DISTRIBUTED)
    python = pathlib.Path(__file__).resolve().parents[2] / "python"
    env = dict(os.environ, DORMANT_NCCL_ONE_RANK_CTAS="2",
               PYTHONPATH=os.pathsep.join([str(python), str(tmp_path)]))
    code = ("import dormant, torch.distributed as d; d.new_group([5]); d.new_group([0, 1]); "
            "print([None if o is None else o.config.max_ctas for o in d.made])")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[2, None]"


@pytest.mark.parametrize("torch_imports_distributed", [True, False])
@pytest.mark.parametrize("order", ["dormant first", "torch first"])
def test_the_default_caps_groups_in_either_import_order(tmp_path, order,
                                                        torch_imports_distributed):
    """No cap variable: the one-rank WORLD and
    groups a program makes are capped whether it imports dormant or torch
    first, and before any region() (Megatron's groups come first); a program
    that imports dormant alone never loads torch."""
    (tmp_path / "torch" / "distributed").mkdir(parents=True)
    (tmp_path / "torch" / "__init__.py").write_text(
        "from . import distributed\n" if torch_imports_distributed else "")
    (tmp_path / "torch" / "distributed" / "__init__.py").write_text(FAKE_DISTRIBUTED)
    python = pathlib.Path(__file__).resolve().parents[2] / "python"
    env = {k: v for k, v in os.environ.items()
           if k not in (_lean.ENV, "WORLD_SIZE", "DORMANT_RESIDUE")}
    env.update(PYTHONPATH=os.pathsep.join([str(python), str(tmp_path)]))
    first = "import dormant, torch" if order == "dormant first" else "import torch, dormant"
    # a library asking whether it exists first must not use the hook up
    asked = "import importlib.util; assert importlib.util.find_spec('torch.distributed')"
    code = (f"import sys; {first}; {asked}; import torch.distributed as d\n"
            "d.init_process_group(backend='nccl', world_size=1, rank=0)\n"
            "d.new_group([5]); d.new_group([0, 1])\n"
            "print([None if o is None else o.config.max_ctas for o in d.made])\n"
            "print(sum(type(f).__name__ == '_DistributedWatch' for f in sys.meta_path))\n")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["[1, 1, None]", "0"]
    r = subprocess.run([sys.executable, "-c", "import sys, dormant; print('torch' in sys.modules)"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


def test_a_one_rank_world_made_with_nccl_gets_the_cap(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    dist = FakeDist()
    _lean.lean_one_rank_groups(dist=dist)
    dist.init_process_group(backend="nccl", world_size=1, rank=0)
    assert cap_of(dist.made[-1]) == (1, 1)
    dist.init_process_group("nccl", world_size=2, rank=0)
    assert cap_of(dist.made[-1]) is None
    dist.init_process_group(backend="gloo", world_size=1, rank=0)
    assert cap_of(dist.made[-1]) is None
    dist.init_process_group(backend="nccl")  # the size from the environment
    assert cap_of(dist.made[-1]) is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    dist.init_process_group(backend="nccl")
    assert cap_of(dist.made[-1]) == (1, 1)


class NoConfigOptions:
    """ProcessGroupNCCL.Options of a torch whose NCCL has no config"""


def test_a_torch_without_nccl_config_makes_its_groups_uncapped():
    dist = FakeDist(world=1)
    dist.ProcessGroupNCCL = type("PG", (), {"Options": NoConfigOptions})
    _lean.lean_one_rank_groups(dist=dist)
    assert dist.new_group([0]) == 1           # made, never an error
    assert "pg_options" not in dist.made[-1][2]
    dist.init_process_group(backend="nccl", world_size=1, rank=0)
    assert "pg_options" not in dist.made[-1][2]
