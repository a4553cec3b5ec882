# SPDX-License-Identifier: MIT
"""One-rank NCCL groups made lean (issue 34).

A NCCL communicator of one rank gets NCCL's full count of channels, and each
channel holds its own device buffers: about 384 MiB per communicator on an
H100, although a one-rank collective uses no channel at all. Capping such a
group's NCCL config at one CTA (`max_ctas`) leaves it 8-32 MiB; the residue
checkpoint then has that much less to copy, and NCCL 2.30's suspend that much
less to copy out and back (docs/benchmarks.md, "Residue mode checkpoint").

lean_one_rank_groups() wraps torch.distributed.new_group() so that every
group of one rank made with the NCCL backend and without pg_options of its
own gets ProcessGroupNCCL.Options with min_ctas 1 and max_ctas N, and so
does WORLD when init_process_group() makes it of one rank (world_size 1, or
$WORLD_SIZE 1) with backend "nccl". Groups of several ranks are left alone: the cap would cut their bandwidth. It acts on
groups made after the call, so call it before the program makes its groups
(Megatron's initialize_model_parallel()). $DORMANT_NCCL_ONE_RANK_CTAS=N does
the same from `import dormant` on (lean_from_env(); it imports
torch.distributed only then), and so does $DORMANT_RESIDUE=checkpoint with
cap 1 where torch is imported before dormant (or when dormant's PyTorch glue
loads); $DORMANT_NCCL_ONE_RANK_CTAS=off keeps the groups as NCCL makes them.
"""
import os

ENV = "DORMANT_NCCL_ONE_RANK_CTAS"


def ctas_from(value):
    """The cap a value asks for: None for unset, "" or "off"; else an int >= 1."""
    if value is None or value.strip().lower() in ("", "off"):
        return None
    try:
        ctas = int(value)
    except ValueError:
        ctas = 0
    if ctas < 1:
        raise ValueError(f"{ENV} takes a whole number of CTAs from 1, or off; not {value!r}")
    return ctas


def _one_rank(dist, ranks):
    if ranks is not None:
        return len(set(ranks)) == 1
    return dist.get_world_size() == 1


def _nccl(dist, backend):
    name = backend if backend is not None else dist.get_backend()
    return str(name).lower() == "nccl"


def lean_one_rank_groups(max_ctas=1, *, dist=None):
    """Make every later one-rank NCCL group with max_ctas as its NCCL cap.

    Returns the cap now in force (a second call changes it, the wrapper is
    installed once). dist is torch.distributed unless given (tests)."""
    if isinstance(max_ctas, bool) or not isinstance(max_ctas, int) or max_ctas < 1:
        raise ValueError(f"max_ctas takes a whole number from 1, not {max_ctas!r}")
    if dist is None:
        import torch.distributed as dist
    wrapper = getattr(dist.new_group, "_dormant_lean", None)
    if wrapper is not None:
        wrapper["max_ctas"] = max_ctas
        return max_ctas
    made = dist.new_group
    state = {"max_ctas": max_ctas}

    def new_group(ranks=None, *args, **kwargs):
        backend = kwargs.get("backend")
        if (not args and kwargs.get("pg_options") is None and _one_rank(dist, ranks)
                and _nccl(dist, backend)):
            kwargs["pg_options"] = _options(dist, state["max_ctas"])
        return made(ranks, *args, **kwargs)

    new_group._dormant_lean = state
    new_group.__wrapped__ = made
    new_group.__doc__ = made.__doc__
    dist.new_group = new_group

    started = getattr(dist, "init_process_group", None)
    if started is not None:
        def init_process_group(*args, **kwargs):
            backend = kwargs.get("backend", args[0] if args else None)
            world = kwargs.get("world_size", -1)
            if world == -1:
                world = int(os.environ.get("WORLD_SIZE", "-1") or "-1")
            if (len(args) <= 1 and kwargs.get("pg_options") is None and world == 1
                    and str(backend).lower() == "nccl"):
                kwargs["pg_options"] = _options(dist, state["max_ctas"])
            return started(*args, **kwargs)

        init_process_group.__wrapped__ = started
        init_process_group.__doc__ = started.__doc__
        dist.init_process_group = init_process_group
    return max_ctas


def _options(dist, max_ctas):
    options = dist.ProcessGroupNCCL.Options()
    options.config.min_ctas = 1
    options.config.max_ctas = max_ctas
    return options


def lean_by_default(*, dist=None, environ=None, modules=None):
    """The cap dormant sets unasked: 1 with $DORMANT_RESIDUE=checkpoint and
    $DORMANT_NCCL_ONE_RANK_CTAS unset ("off" or "" turns it off), since every
    byte left on the device is copied by the checkpoint and a one-rank
    collective uses no channel; only where torch is already imported
    (modules: sys.modules unless given), so that a process without torch (an
    orchestrator's client) never imports it, and only where no cap is in
    force yet (an explicit lean_one_rank_groups() call wins). Returns the cap
    put in force, or None. dormant's PyTorch glue calls it when it loads."""
    import sys

    env = os.environ if environ is None else environ
    if ENV in env or env.get("DORMANT_RESIDUE", "").strip().lower() != "checkpoint":
        return None
    if "torch" not in (sys.modules if modules is None else modules):
        return None
    if dist is None:
        try:
            import torch.distributed as dist
        except ImportError:
            return None
    if getattr(getattr(dist, "new_group", None), "_dormant_lean", None) is not None:
        return None
    return lean_one_rank_groups(1, dist=dist)


def lean_from_env(*, dist=None, environ=None, modules=None):
    """lean_one_rank_groups() as the environment asks; returns the cap put in
    force, or None. $DORMANT_NCCL_ONE_RANK_CTAS=N: cap N (imports
    torch.distributed); unset: lean_by_default()."""
    env = os.environ if environ is None else environ
    if ENV not in env:
        return lean_by_default(dist=dist, environ=env, modules=modules)
    ctas = ctas_from(env[ENV])
    if ctas is None:
        return None
    if dist is None:
        try:
            import torch.distributed as dist
        except ImportError as e:
            raise ImportError(f"{ENV} is set, and it needs torch.distributed: {e}") from e
    return lean_one_rank_groups(ctas, dist=dist)
