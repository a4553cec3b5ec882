# SPDX-License-Identifier: MIT
"""Every process group c10d knows, found without the program's help.

torch.distributed keeps its groups in distributed_c10d._world: pg_map (group
-> (backend name, store)), in the order they were made (a dict), pg_names
(group -> name) and pg_group_ranks (group -> {global rank: group rank}).
Megatron's groups are made with dist.new_group() and land there like any
other. Only the groups this rank belongs to are there: the others are never
made on this rank (c10d gives back GroupMember.NON_GROUP_MEMBER).

torch is never imported here: a process whose program has not imported
torch.distributed has no communicators. dist= and torch= stand in for the
modules (tests).
"""
import sys
from dataclasses import dataclass, field


@dataclass
class Group:
    """One process group with an NCCL backend on this rank."""
    pg: object
    name: str
    ranks: list
    backend_name: str
    backend: object = field(repr=False)   # pg._get_backend(cuda), None if none
    serial: int = 0                       # its place in pg_map (creation order)

    @property
    def label(self):
        """How errors and stats name it: 'name' (ranks [0, 1])."""
        return f"'{self.name}' (ranks {self.ranks})"


def modules(dist=None, torch=None):
    """(dist, torch) as loaded by the program, or (None, None)."""
    if dist is None:
        dist = sys.modules.get("torch.distributed")
    if torch is None:
        torch = sys.modules.get("torch")
    return dist, torch


def c10d_world(dist):
    c10d = getattr(dist, "distributed_c10d", None)
    return getattr(c10d, "_world", None) if c10d is not None else None


def nccl_groups(dist=None, torch=None):
    """The process groups with an NCCL backend, in the order they were made.
    [] when torch.distributed is not loaded or not initialized."""
    dist, torch = modules(dist, torch)
    if dist is None or torch is None:
        return []
    try:
        if not dist.is_available() or not dist.is_initialized():
            return []
    except Exception:
        return []
    world = c10d_world(dist)
    if world is None:
        return []
    names = getattr(world, "pg_names", {})
    group_ranks = getattr(world, "pg_group_ranks", {})
    found = []
    for serial, (pg, entry) in enumerate(list(getattr(world, "pg_map", {}).items())):
        backend_name = str(entry[0] if isinstance(entry, tuple) else entry)
        if "nccl" not in backend_name.lower():
            continue
        try:
            backend = pg._get_backend(torch.device("cuda"))
        except Exception:
            backend = None
        ranks = sorted(group_ranks.get(pg, {}).keys()) if pg in group_ranks else []
        found.append(Group(pg=pg, name=str(names.get(pg, serial)), ranks=list(ranks),
                           backend_name=backend_name, backend=backend, serial=serial))
    return found
