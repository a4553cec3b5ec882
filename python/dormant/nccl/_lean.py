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
torch.distributed only then). Unset, dormant puts cap 1 in force by default
(lean_by_default()), in whichever order the program imports dormant and
torch: where torch is not imported yet, `import dormant` leaves a one-shot
import hook that puts the cap in force as soon as torch.distributed has
loaded, so that the groups a program makes before its first region() are
capped too (importing dormant never imports torch for it).
$DORMANT_NCCL_ONE_RANK_CTAS=off keeps the groups as NCCL makes them.
"""
import os
import sys

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
            _cap(dist, kwargs, state["max_ctas"])
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
                _cap(dist, kwargs, state["max_ctas"])
            return started(*args, **kwargs)

        init_process_group.__wrapped__ = started
        init_process_group.__doc__ = started.__doc__
        dist.init_process_group = init_process_group
    return max_ctas


def _cap(dist, kwargs, max_ctas):
    """Put ProcessGroupNCCL.Options capped at max_ctas into kwargs as
    pg_options; where this torch or its NCCL has no such config (an older
    NCCL, another backend behind the name) leave kwargs as the program gave
    them, said once in the log, never a failure of the program's call."""
    try:
        options = dist.ProcessGroupNCCL.Options()
        options.config.min_ctas = 1
        options.config.max_ctas = max_ctas
    except (AttributeError, TypeError, RuntimeError) as e:
        if not _cap_failed:
            _cap_failed.append(e)
            import logging
            logging.getLogger("dormant").info(
                "one-rank NCCL groups left uncapped: this torch has no NCCL config "
                "(min_ctas/max_ctas): %s", e)
        return
    kwargs["pg_options"] = options


_cap_failed = []  # the first failure, said once


def lean_by_default(*, dist=None, environ=None, modules=None, meta_path=None):
    """The cap dormant sets unasked: 1 with $DORMANT_NCCL_ONE_RANK_CTAS unset
    ("off" or "" turns it off). A one-rank collective never runs on NCCL's
    channels (a copy, or NCCL's own small kernel), while each channel holds
    device buffers: capped, a one-rank communicator holds about 10 MiB
    instead of about 384 (H100), which a sleeping trainer keeps (residue
    keep) or the checkpoint copies (residue checkpoint). Only where no cap is
    in force yet (an explicit lean_one_rank_groups() call wins). Where torch
    is not imported yet (modules: sys.modules unless given) it imports
    nothing, so that a process without torch (an orchestrator's client) never
    loads it: it leaves a _DistributedWatch on meta_path (sys.meta_path
    unless given) that calls it again once torch.distributed has loaded.
    Returns the cap put in force now, or None. import dormant and dormant's
    PyTorch glue call it."""
    env = os.environ if environ is None else environ
    if ENV in env:
        return None
    if "torch" not in (sys.modules if modules is None else modules):
        _DistributedWatch.install(sys.meta_path if meta_path is None else meta_path, env)
        return None
    if dist is None:
        try:
            import torch.distributed as dist
        except ImportError:
            return None
    if getattr(getattr(dist, "new_group", None), "_dormant_lean", None) is not None:
        return None
    return lean_one_rank_groups(1, dist=dist)


def lean_from_env(*, dist=None, environ=None, modules=None, meta_path=None):
    """lean_one_rank_groups() as the environment asks; returns the cap put in
    force, or None. $DORMANT_NCCL_ONE_RANK_CTAS=N: cap N (imports
    torch.distributed); unset: lean_by_default()."""
    env = os.environ if environ is None else environ
    if ENV not in env:
        return lean_by_default(dist=dist, environ=env, modules=modules, meta_path=meta_path)
    ctas = ctas_from(env[ENV])
    if ctas is None:
        return None
    if dist is None:
        try:
            import torch.distributed as dist
        except ImportError as e:
            raise ImportError(f"{ENV} is set, and it needs torch.distributed: {e}") from e
    return lean_one_rank_groups(ctas, dist=dist)


class _DistributedWatch:
    """A one-shot import hook: the first import of torch.distributed runs as
    it would without it, and lean_by_default() follows once the module has
    loaded (before the importer gets it back). It finds nothing itself (the
    other finders do; it hands their spec on with its loader wrapped) and
    leaves meta_path once the module has loaded: a find_spec() alone (a
    library asking whether torch.distributed exists) leaves it waiting. At
    most one per meta_path."""

    NAME = "torch.distributed"

    def __init__(self, meta_path, environ):
        self.meta_path = meta_path
        self.environ = environ

    @classmethod
    def install(cls, meta_path, environ):
        if not any(isinstance(f, cls) for f in meta_path):
            meta_path.insert(0, cls(meta_path, environ))

    def _leave(self):
        try:
            self.meta_path.remove(self)
        except ValueError:
            pass

    def find_spec(self, name, path, target=None):
        if name != self.NAME:
            return None
        for finder in [f for f in self.meta_path if f is not self]:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ThenLean(spec.loader, self)
        return spec

    def invalidate_caches(self):
        pass


class _ThenLean:
    """A loader that runs another and then lean_by_default() on the module;
    anything else asked of it is the other's answer. The cap is best effort:
    a torch.distributed without new_group (not built with it) or one that
    fails to take it is left as it loaded."""

    def __init__(self, loader, watch):
        self._loader = loader
        self._watch = watch

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._watch._leave()
        if not callable(getattr(module, "new_group", None)):
            return
        try:
            lean_by_default(dist=module, environ=self._watch.environ, modules={"torch": True})
        except Exception:  # noqa: BLE001 (an import never fails for the cap)
            import logging
            logging.getLogger("dormant").warning(
                "could not cap torch.distributed's one-rank NCCL groups", exc_info=True)
