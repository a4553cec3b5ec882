# SPDX-License-Identifier: MIT
"""Where the rebuild fallback (DORMANT_NCCL=rebuild) loses a Megatron-core
trainer: two steps, a sleep and a wake with the groups destroyed and made
again, then a step. Prints dormant's rebuild counts, every reference to a
destroyed group still alive after the wake (who holds it), and the step's
traceback if it fails. A diagnosis tool, run by hand on the GPU machine:

    DORMANT_LIB=build-gpu/libdormant.so PYTHONPATH=python:tests/gpu \\
        python3 tests/gpu/nccl_rebuild_probe.py
"""
import gc
import sys
import traceback
import types

import torch

import mcore

import dormant


def holders(obj, skip, depth=2):
    """Short descriptions of what refers to obj (dicts: their owners)."""
    out = []
    for ref in gc.get_referrers(obj):
        if id(ref) in skip or isinstance(ref, types.FrameType):
            continue
        kind = type(ref).__name__
        if isinstance(ref, dict) and depth > 0:
            keys = [k for k, v in ref.items() if v is obj][:3]
            owners = [type(o).__name__ + (f" {o.__name__}" if isinstance(o, types.ModuleType) else "")
                      for o in gc.get_referrers(ref) if id(o) not in skip
                      and not isinstance(o, types.FrameType)][:3]
            out.append(f"dict[{keys}] of {owners}")
        elif isinstance(ref, (tuple, list)) and depth > 0:
            owners = [f"{type(o).__name__}" for o in gc.get_referrers(ref)
                      if id(o) not in skip and not isinstance(o, types.FrameType)][:3]
            out.append(f"{kind}(len {len(ref)}) in {owners}")
        else:
            out.append(kind)
    return out


def coalesced(dist, group):
    """What Megatron's start_grad_sync does: reduce_scatter_tensor in a
    _coalescing_manager."""
    inp = torch.ones(64, device="cuda")
    out = torch.empty(64 // dist.get_world_size(group), device="cuda")
    with dist._coalescing_manager(group, async_ops=False):
        dist.reduce_scatter_tensor(out, inp, group=group)


def main():
    mcore.add_megatron_to_path()
    mcore.deterministic()
    dormant.configure(backend="cuda", nccl="rebuild", nccl_timeout_s=60)
    dm = dormant.manager()
    t = mcore.McoreTrainer(dm, prefix="p.")
    batches = t.batches(10)
    for _ in range(2):
        x, y = next(batches)
        with dm.step():
            t.train_step(x, y)
    torch.cuda.synchronize()
    from dormant.nccl import _discover
    old = [g.pg for g in _discover.nccl_groups()]
    print(f"before sleep: {len(old)} NCCL groups: "
          f"{[(g.name, g.backend_name) for g in _discover.nccl_groups()]}")
    dm.sleep(t.tags.all())
    dm.wake(t.tags.all())
    s = dm._comms.stats()
    print("rebuild stats:", {k: s.get(k) for k in ("rebuilds", "groups_destroyed",
                                                   "references_rebound", "references_left")})
    new = {id(g.pg) for g in _discover.nccl_groups()}
    skip = {id(old), id(sys._getframe())}
    gc.collect()
    for pg in old:
        if id(pg) in new:
            continue
        h = holders(pg, skip)
        if h:
            print(f"destroyed group still referenced: {h}")
    # the group Megatron's grad sync uses: new, old, WORLD? does it work?
    import torch.distributed as dist
    world = dist.distributed_c10d._get_default_group()
    for i, bg in enumerate(getattr(t.model, "bucket_groups", [])[:2]):
        for attr in ("intra_distributed_optimizer_instance_group", "data_parallel_group"):
            g = getattr(bg, attr, None)
            if g is None:
                continue
            where = ("WORLD" if g is world else "new" if id(g) in new else
                     "destroyed" if any(g is o for o in old) else "unknown")
            c10d = dist.distributed_c10d
            try:
                name = g.group_name
            except Exception as e:  # noqa: BLE001
                name = f"? ({type(e).__name__})"
            print(f"bucket group {i}.{attr}: {where}, {type(g).__name__} {id(g):#x}, "
                  f"name {name}, in pg_map {g in c10d._world.pg_map}, "
                  f"ranks {c10d._world.pg_group_ranks.get(g)}")
            if where != "new":
                print(f"  held by: {holders(g, skip | {id(bg.__dict__)})[:6]}")
            for what, fn in (("all_reduce", lambda: dist.all_reduce(
                    torch.ones(8, device="cuda"), group=g)),
                    ("reduce_scatter coalesced", lambda: coalesced(dist, g))):
                try:
                    fn()
                    torch.cuda.synchronize()
                    print(f"  {what}: ok")
                except Exception as e:  # noqa: BLE001
                    print(f"  {what}: {type(e).__name__}: {str(e)[:200]}")
    try:
        dist.all_reduce(torch.ones(8, device="cuda"))
        torch.cuda.synchronize()
        print("WORLD all_reduce: ok")
    except Exception as e:  # noqa: BLE001
        print(f"WORLD all_reduce: {type(e).__name__}: {str(e)[:200]}")
    try:
        for _ in range(2):
            x, y = next(batches)
            with dm.step():
                loss = t.train_step(x, y)
            print("step after wake: loss", float(loss))
        print("PROBE OK")
    except Exception:
        traceback.print_exc()
        print("PROBE FAILED")


if __name__ == "__main__":
    main()
