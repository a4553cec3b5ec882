# SPDX-License-Identifier: MIT
"""The fallback where suspend cannot work (DORMANT_NCCL=rebuild): process
groups destroyed after a sleep's copies and made again before a wake's
rebuilds, the program's references to them pointed at the new ones.

- Destroying: every NCCL group of this rank but the default one (WORLD:
  destroying it ends torch.distributed; its communicator stays), with
  dist.destroy_process_group(), which shuts its communicator down and frees
  its memory.
- Making again: dist.new_group() is collective over WORLD: every rank calls
  it for every group, members or not, in one order, and the groups' names
  (a counter, never used before: no stale keys in the store) must agree.
  A rank knows only its own groups, so the ranks first exchange what they
  destroyed through the default store (one key per rank and rebuild) and all
  make the union, in the order the groups were first made.
- Rebinding: the old group objects stay referenced by the program
  (Megatron's parallel_state globals, its DDP buffers, the optimizer). Every
  dict (module globals, instance __dict__), list, closure cell and object
  attribute that refers to an old group is pointed at its new one
  (gc.get_referrers). A
  reference held in a tuple, a __slots__ attribute or C++ (a DTensor
  DeviceMesh, FSDP2) cannot be rebound: stats() counts them
  ("references_left"), and such programs want suspend. PyTorch may hand out
  a second Python object for one C++ group: those are found by the group's
  type and name among every dict, list and closure cell of the process
  (rebind_wrappers()).
"""
import datetime
import gc
import json
import logging
import time
import types

from . import _discover

log = logging.getLogger("dormant")


class Rebuilder:
    def __init__(self, timeout_s, dist=None, torch=None):
        self.timeout_s = timeout_s
        self._dist = dist
        self._torch = torch
        self._destroyed = []     # (old group, spec) of this rank
        self.epoch = 0
        self.rebuilds = 0
        self.rebound = 0
        self.references_left = 0
        self.groups_destroyed = 0

    def _modules(self):
        return _discover.modules(self._dist, self._torch)

    def destroy_all(self):
        """Destroy this rank's NCCL groups but WORLD; returns how many."""
        dist, _ = self._modules()
        if self._destroyed:
            return 0  # a failed wake left them destroyed: the next wake makes them
        world = _discover.c10d_world(dist) if dist is not None else None
        default = getattr(world, "default_pg", None) if world is not None else None
        groups = [g for g in _discover.nccl_groups(self._dist, self._torch)
                  if g.pg is not default]
        for group in groups:
            # the backend as c10d wrote it ("nccl", "cuda:nccl,cpu:gloo"):
            # new_group() takes both forms
            spec = {"order": _order_key(group), "ranks": group.ranks,
                    "backend": group.backend_name, "name": group.name}
            dist.destroy_process_group(group.pg)
            self._destroyed.append((group.pg, spec))
        self.groups_destroyed = len(self._destroyed)
        return len(groups)

    def recreate_all(self):
        """Make the groups again on every rank and rebind this rank's
        references; returns how many of this rank's groups came back."""
        dist, _ = self._modules()
        if dist is None or not dist.is_initialized():
            return 0
        self.epoch += 1
        mine = [spec for _, spec in self._destroyed]
        start = time.monotonic()
        every = self._exchange(dist, mine)
        made = {}
        for spec in every:
            group = dist.new_group(spec["ranks"], backend=spec["backend"])
            made[_key(spec)] = group
        made_s = time.monotonic() - start
        renamed = {}
        pairs = []
        for old, spec in self._destroyed:
            new = made.get(_key(spec))
            pairs.append((old, new))
            if new is not None and spec.get("name"):
                renamed[spec["name"]] = new
        rebound, left = rebind_many(pairs, keep=(self._destroyed,))
        if self._destroyed:
            # the objects c10d knows now, and the old ones rebound above
            world = _discover.c10d_world(dist)
            seen = {id(pg) for pg in getattr(world, "pg_map", {})}
            seen |= {id(old) for old, _ in self._destroyed}
            r, l = rebind_wrappers(type(self._destroyed[0][0]), renamed, seen,
                                   keep=(self._destroyed,))
            rebound += r
            left += l
        count = len(self._destroyed)
        log.info("NCCL rebuild: %d groups made again in %.3f s, %d references rebound "
                 "(%d left) in %.3f s", len(every), made_s, rebound, left,
                 time.monotonic() - start - made_s)
        self._destroyed = []
        self.rebuilds += 1
        self.rebound, self.references_left = rebound, left
        return count

    def _exchange(self, dist, mine):
        """Every rank's destroyed groups, one list in creation order."""
        size = dist.get_world_size()
        if size <= 1:
            return sorted(mine, key=lambda s: s["order"])
        store = dist.distributed_c10d._get_default_store()
        prefix = f"dormant/nccl-rebuild/{self.epoch}/"
        store.set(prefix + str(dist.get_rank()), json.dumps(mine))
        keys = [prefix + str(rank) for rank in range(size)]
        if self.timeout_s is not None and hasattr(store, "wait"):
            # every rank's list, or an error naming the wait (not a hang)
            store.wait(keys, datetime.timedelta(seconds=self.timeout_s))
        union = {}
        for rank in range(size):
            raw = store.get(prefix + str(rank))
            for spec in json.loads(raw.decode() if isinstance(raw, bytes) else raw):
                union[_key(spec)] = spec
        return sorted(union.values(), key=lambda s: s["order"])


def _key(spec):
    return (tuple(spec["order"]), tuple(spec["ranks"]), spec["backend"])


def _order_key(group):
    """Where the group stands in the order c10d made them, the same on every
    rank: group names are c10d's counter then (new_group without
    use_local_synchronization); a hashed name sorts after, by its ranks."""
    try:
        return [0, int(group.name), ""]
    except ValueError:
        return [1, 0, group.name]


def rebind_many(pairs, keep=()):
    """Point the dicts, lists, closure cells and objects' attributes that
    refer to an old group of pairs ((old, new), ...) at its new one; returns
    (rebound, left): references changed and objects whose references could
    not be (tuples, objects' slots, C++). keep: containers of our own, left
    alone.

    One gc.collect() and one gc.get_referrers() for all the groups: each
    walks the whole heap, which with Megatron-core and PyTorch loaded costs
    a large part of a second; group by group, a wake that made 20 groups
    again spent seconds here.

    An object's attributes may live in no dict of their own until someone
    asks for one (CPython 3.11+ keeps them inline), and gc.get_referrers()
    then gives the object itself: its vars() are rebound."""
    new_of = {id(old): new for old, new in pairs if new is not None and old is not new}
    olds = [old for old, _ in pairs if id(old) in new_of]
    if not olds:
        return 0, 0
    is_old = set(new_of)
    skip = {id(k) for k in keep} | {id(pairs), id(olds)}

    def swap(v):  # olds holds every old group alive: ids name them
        return new_of.get(id(v))

    rebound = left = 0
    gc.collect()
    for ref in gc.get_referrers(*olds):
        if id(ref) in skip or isinstance(ref, types.FrameType):
            continue
        if isinstance(ref, dict):
            for k, v in list(ref.items()):
                nv = swap(v)
                if nv is not None:
                    ref[k] = nv
                    rebound += 1
        elif isinstance(ref, list):
            for i, item in enumerate(ref):
                nv = swap(item)
                if nv is not None:
                    ref[i] = nv
                    rebound += 1
        elif isinstance(ref, types.CellType):
            nv = swap(ref.cell_contents)
            if nv is not None:
                ref.cell_contents = nv
                rebound += 1
        elif isinstance(ref, tuple) and (_is_own_tuple(ref, is_old) or any(ref is p for p in pairs)):
            continue
        else:
            changed = _rebind_attributes(ref, swap)
            rebound += changed
            left += 0 if changed else 1
    return rebound, left


def _rebind_attributes(ref, swap):
    """ref's attributes that are an old group, set to its new one (swap(v):
    the new one, or None); how many."""
    try:
        attrs = vars(ref)
    except TypeError:  # no __dict__: slots, C++
        return 0
    changed = 0
    for k, v in list(attrs.items()):
        new = swap(v)
        if new is not None:
            try:
                attrs[k] = new
            except TypeError:  # a class's mappingproxy
                try:
                    setattr(ref, k, new)
                except (AttributeError, TypeError):
                    continue
            changed += 1
    return changed


def _group_name(pg):
    """c10d's name of the group (ProcessGroup.group_name), or None."""
    try:
        name = pg.group_name
    except Exception:
        return None
    return name if isinstance(name, str) and name else None


def rebind_wrappers(pg_type, renamed, seen, keep=()):
    """Point other Python objects for a destroyed group at its new one.

    A C++ group can have more than one Python object: PyTorch hands out a
    new one for it where the first was not alive at the time (seen with
    Megatron-core's distributed-optimizer group, held by its DDP buffers and
    bucket groups, on the H200). rebind_many() follows the object c10d
    keeps, so those stayed with the destroyed group and the next collective
    failed on an aborted communicator. Here the process's objects, and the values of
    its dicts, lists and closure cells, are searched for objects of the
    group's type that are not in seen (ids: pg_map's groups, and the old
    objects rebind_many() followed already) and whose name is a destroyed
    group's (renamed: name -> new group); each is rebound as rebind_many()
    does. Returns
    (rebound, left)."""
    if not renamed:
        return 0, 0
    skip = {id(k) for k in keep}
    stale = {}

    def consider(v):
        if type(v) is pg_type and id(v) not in seen and id(v) not in stale:
            name = _group_name(v)
            if name in renamed:
                stale[id(v)] = (v, renamed[name])

    for obj in gc.get_objects():
        if id(obj) in skip:
            continue
        if isinstance(obj, dict):
            for v in list(obj.values()):
                consider(v)
        elif isinstance(obj, list):
            for v in list(obj):
                consider(v)
        elif isinstance(obj, types.CellType):
            try:
                consider(obj.cell_contents)
            except ValueError:  # an empty cell
                pass
        else:
            consider(obj)
    pairs = list(stale.values())
    stale.clear()  # its tuples refer to the objects
    return rebind_many(pairs, keep=keep)


def _is_own_tuple(ref, is_old):
    """Our own (old group, spec) pairs (is_old: the old groups' ids)."""
    return (len(ref) == 2 and id(ref[0]) in is_old and isinstance(ref[1], dict)
            and "order" in ref[1])
