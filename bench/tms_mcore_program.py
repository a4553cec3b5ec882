#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A Megatron-core trainer written for torch_memory_saver the way miles's
Megatron actor uses it; bench/tms_side_by_side.py --workload mcore runs this
one file through the real torch_memory_saver and through dormant's switch.

    python3 bench/tms_mcore_program.py [--steps 2] [--cycles 3]
        [--layers 16 --hidden 2048 --heads 16 --vocab 32768 --seq 1024 --batch 2]
        [--retain] [--reference] [--expect dormant|torch_memory_saver]

The model is tests/gpu/mcore.py's (Megatron-LM's GPTModel, local layer spec,
bf16, DDP with fp32 grad buffers and the distributed optimizer, one rank);
the memory goes where miles puts it, through torch_memory_saver's API only:

  - GPTModel, DDP and the optimizer are built inside
    region(tag="default", enable_cpu_backup=True)
    (miles: initialize_model_and_optimizer() in that region);
  - DDP's fp32 grad_data is allocated in a nested region(enable_cpu_backup=False)
    (miles's Megatron does that in _ParamAndGradBuffer.__init__ with
    --disable-grad-buffers-cpu-backup; upstream Megatron has no such switch,
    so this program puts the nested region around that one torch.zeros call
    from outside, and fails if it did not find it);
  - Adam's moments, made lazily by the first optimizer step, in the outer
    region too;
  - what miles leaves outside the regions stays outside: NCCL's memory,
    Megatron's attention scratch buffer (made by the first forward), the
    activations PyTorch caches. The parameters' first copies, freed when DDP
    moves them into its buffers, stay in the region's pool, as in miles.

Then: --steps training steps, and --cycles times: miles's clear_memory()
(gc, empty_cache), pause() of everything, resume(), one training step. It
prints one line `RESULT {json}`: per cycle the pause and resume seconds, the
device memory pause() freed (cuMemGetInfo), the resident set above its size
before the first pause (while paused, and after resume), the loss; every
loss; a checksum of every byte kept (bf16 weights, fp32 main params, Adam
state) after the last step. --reference: the same steps with no
torch_memory_saver at all (regions are no-ops, nothing paused), the losses
and checksum the other runs must match bit for bit. Anything wrong (no torch,
no Megatron, the wrong library, the nested region not found) ends it with
exit status 1 and the reason on stderr.
"""
import argparse
import contextlib
import gc
import json
import os
import pathlib
import sys
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from rows import rss_bytes  # noqa: E402

GiB = 1 << 30


class ProgramError(Exception):
    """A reason this program cannot measure anything (said on stderr)."""


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2, help="training steps before the first pause")
    ap.add_argument("--cycles", type=int, default=3, help="pause/resume cycles, a step after each")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--ffn", type=int, default=0, help="default 4 x hidden")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--retain", action="store_true", help="torch_memory_saver.retain_cpu_backup")
    ap.add_argument("--reference", action="store_true",
                    help="no torch_memory_saver: the same steps, never paused")
    ap.add_argument("--expect", choices=("dormant", "torch_memory_saver"),
                    help="fail unless `import torch_memory_saver` gives this one")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.cycles < 1:
        ap.error("--steps and --cycles must be at least 1")
    if args.reference and (args.retain or args.expect):
        ap.error("--reference uses no torch_memory_saver: no --retain or --expect")
    if args.hidden % args.heads:
        ap.error("--hidden must be a multiple of --heads")
    return args


class NoSaver:
    """--reference: torch_memory_saver's region() as a no-op, nothing else."""

    @contextlib.contextmanager
    def region(self, tag="default", enable_cpu_backup=False):
        yield


def load_saver(expect, hook_mode):
    """`from torch_memory_saver import torch_memory_saver`, checked to be
    the library the caller meant; (saver, library name)."""
    try:
        import torch_memory_saver as package
        from torch_memory_saver import torch_memory_saver as saver
    except ImportError as e:
        raise ProgramError(f"torch_memory_saver does not import: {e} (the real one: put its "
                           f"source, built in place, on PYTHONPATH; dormant's: start this "
                           f"under `python3 -m dormant.run --torch-memory-saver --`)")
    library = "dormant" if getattr(package, "__dormant__", False) else "torch_memory_saver"
    if expect and library != expect:
        raise ProgramError(f"`import torch_memory_saver` gave {library}'s "
                           f"({package.__file__}), not {expect}'s")
    saver.hook_mode = hook_mode
    return saver, library


@contextlib.contextmanager
def grad_data_without_backup(saver, torch, buffer_class, made):
    """While DDP is built: the torch.zeros that _ParamAndGradBuffer.__init__
    calls for grad_data (the buffer's grad dtype, which differs from its
    param dtype with grad_reduce_in_fp32) runs inside
    saver.region(enable_cpu_backup=False), nested in the region around it,
    the way miles's Megatron allocates it. Each such tensor is appended to
    made."""
    init_code = buffer_class.__init__.__code__
    real_zeros = torch.zeros

    def zeros(*args, **kwargs):
        caller = sys._getframe(1)
        buffer = caller.f_locals.get("self") if caller.f_code is init_code else None
        if buffer is None or kwargs.get("dtype") != getattr(buffer, "grad_dtype", None):
            return real_zeros(*args, **kwargs)
        if buffer.grad_dtype == buffer.param_dtype:
            raise ProgramError("grad_data and param_data have one dtype: cannot tell them "
                               "apart (grad_reduce_in_fp32 must be on)")
        with saver.region(enable_cpu_backup=False):
            tensor = real_zeros(*args, **kwargs)
        made.append(tensor)
        return tensor

    torch.zeros = zeros
    try:
        yield
    finally:
        torch.zeros = real_zeros


def digest(torch, tensors, chunk=16 << 20):
    """A checksum of every byte of tensors, computed on the GPU: per chunk of
    32-bit words their sum and their sum weighted by position, folded."""
    acc = 0
    for t in tensors:
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
        if raw.storage_offset() % 4:
            raw = raw.clone()           # a view of int32 words needs 4-byte alignment
        whole = raw.numel() // 4 * 4
        words = raw[:whole].view(torch.int32)
        for start in range(0, words.numel(), chunk):
            w = words[start:start + chunk].to(torch.int64)
            pos = torch.arange(start, start + w.numel(), device=w.device, dtype=torch.int64)
            s = int(w.sum())
            ws = int((w * (pos % 65521 + 1)).sum())
            acc = (acc * 1000003 + s * 7919 + ws) % (1 << 64)
        tail = raw[whole:]
        if tail.numel():
            acc = (acc * 1000003 + int(tail.to(torch.int64).sum())) % (1 << 64)
    return f"{acc:016x}"


class Trainer:
    """GPTModel + DDP + distributed optimizer, built in saver's regions."""

    def __init__(self, saver, cfg):
        import torch
        import mcore
        from megatron.core import tensor_parallel
        from megatron.core.distributed import (DistributedDataParallel,
                                               DistributedDataParallelConfig)
        from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.transformer.module import Float16Module
        from megatron.core.transformer.transformer_config import TransformerConfig

        self.torch = torch
        self.saver = saver
        self.cfg = cfg
        mcore.init_distributed()
        # NCCL's communicator made now, outside every region: its device
        # memory is NCCL's, paused by neither library (miles tears the groups
        # down around a sleep instead).
        torch.distributed.all_reduce(torch.zeros(1, device="cuda"))
        torch.manual_seed(cfg.seed)
        tensor_parallel.model_parallel_cuda_manual_seed(cfg.seed)
        config = TransformerConfig(
            num_layers=cfg.layers, hidden_size=cfg.hidden, num_attention_heads=cfg.heads,
            ffn_hidden_size=cfg.ffn, hidden_dropout=0.0, attention_dropout=0.0,
            bf16=True, params_dtype=torch.bfloat16, use_cpu_initialization=True,
            deterministic_mode=True)
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=True,
            overlap_grad_reduce=False, overlap_param_gather=False)
        opt_config = OptimizerConfig(optimizer="adam", lr=cfg.lr, weight_decay=0.01, bf16=True,
                                     use_distributed_optimizer=True, clip_grad=1.0)
        self.grad_data = []
        with saver.region(tag="default", enable_cpu_backup=True):
            model = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(),
                             vocab_size=cfg.vocab, max_sequence_length=cfg.seq,
                             share_embeddings_and_output_weights=True)
            model = Float16Module(config, model.cuda())
            with grad_data_without_backup(saver, torch, _ParamAndGradBuffer, self.grad_data):
                self.model = DistributedDataParallel(config, ddp_config, model)
            self.optimizer = get_megatron_optimizer(opt_config, [self.model])
        del model
        buffers = self.buffers()
        if len(self.grad_data) != len(buffers) or \
                {t.data_ptr() for t in self.grad_data} != {b.grad_data.data_ptr() for b in buffers}:
            raise ProgramError(
                f"found {len(self.grad_data)} grad_data allocations for {len(buffers)} grad "
                f"buffers: Megatron's _ParamAndGradBuffer no longer allocates grad_data with "
                f"torch.zeros(dtype=grad_dtype) in its __init__ (bench/tms_mcore_program.py "
                f"must follow it)")
        self.position_ids = torch.arange(cfg.seq, device="cuda").unsqueeze(0).expand(
            cfg.batch, -1).contiguous()
        self.steps_done = 0

    def buffers(self):
        return list(self.model.buffers) + list(getattr(self.model, "expert_parallel_buffers", []))

    def param_count(self):
        return sum(p.numel() for p in self.model.module.parameters())

    def optimizers(self):
        return list(getattr(self.optimizer, "chained_optimizers", [self.optimizer]))

    def kept_tensors(self):
        """What must survive a pause: bf16 param_data, fp32 main params, Adam state."""
        out = [b.param_data for b in self.buffers()]
        for opt in self.optimizers():
            for group in opt.shard_fp32_from_float16_groups + opt.shard_fp32_groups:
                out.extend(group)
            for state in opt.optimizer.state.values():
                out.extend(t for k, t in sorted(state.items())
                           if isinstance(t, self.torch.Tensor) and t.is_cuda)
        return out

    def batches(self):
        """(tokens, labels) on the CPU, the same sequence in every run."""
        import mcore
        return mcore.token_batches(self.cfg)

    def step(self, tokens, labels):
        """One Megatron step; the loss as a Python float."""
        import mcore
        # Adam's moments are made lazily, by the first step: kept, like the rest.
        loss, ok = mcore.megatron_step(
            self.model, self.optimizer, self.position_ids, tokens, labels,
            self.saver.region(tag="default", enable_cpu_backup=True)
            if self.steps_done == 0 else None)
        if not ok:
            raise ProgramError("the optimizer step was skipped (found inf/nan)")
        self.steps_done += 1
        return float(loss)


def say(text):
    """Progress on stderr: where a run that hangs stood."""
    print(f"tms_mcore_program: {text}", file=sys.stderr, flush=True)


def clear_memory(torch):
    """miles's clear_memory() before a sleep."""
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()


def run(args):
    try:
        import torch
    except ImportError as e:
        raise ProgramError(f"this program needs PyTorch with CUDA: {e}")
    if not torch.cuda.is_available():
        raise ProgramError("torch.cuda.is_available() is False: this program needs a GPU")
    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    import mcore
    mcore.add_megatron_to_path()
    reason = mcore.why_megatron_is_missing()
    if reason:
        raise ProgramError(reason)
    mcore.deterministic()

    if args.reference:
        saver, library = NoSaver(), "none"
    else:
        saver, library = load_saver(args.expect, os.environ.get("BENCH_TMS_HOOK_MODE", "torch"))
        if args.retain:
            saver.retain_cpu_backup = True
    cfg = mcore.ModelConfig(layers=args.layers, hidden=args.hidden, heads=args.heads,
                            ffn=args.ffn or 4 * args.hidden, vocab=args.vocab, seq=args.seq,
                            batch=args.batch)
    say(f"{library}: building the model ({cfg.layers} layers, hidden {cfg.hidden})")
    t0 = time.perf_counter()
    trainer = Trainer(saver, cfg)
    build_s = time.perf_counter() - t0
    say(f"built {trainer.param_count() / 1e9:.2f} B parameters in {build_s:.1f} s; "
        f"{len(trainer.grad_data)} grad buffers in the no-backup region")
    batches = trainer.batches()
    losses = [trainer.step(*next(batches)) for _ in range(args.steps)]
    torch.cuda.synchronize()
    say(f"{args.steps} steps, losses {losses}")
    result = {
        "library": library,
        "hook_mode": None if args.reference else os.environ.get("BENCH_TMS_HOOK_MODE", "torch"),
        "reference": args.reference, "retain": args.retain,
        "model": {"layers": cfg.layers, "hidden": cfg.hidden, "heads": cfg.heads,
                  "ffn": cfg.ffn, "vocab": cfg.vocab, "seq": cfg.seq, "batch": cfg.batch},
        "params": trainer.param_count(),
        "grad_buffers_without_backup": len(trainer.grad_data),
        "grad_data_bytes": sum(b.grad_data.numel() * b.grad_data.element_size()
                               for b in trainer.buffers()),
        "kept_bytes": sum(t.numel() * t.element_size() for t in trainer.kept_tensors()),
        "build_s": build_s, "steps": args.steps, "cycles": [],
    }
    rss_before = rss_bytes()
    for _ in range(args.cycles):
        cycle = {}
        if not args.reference:
            clear_memory(torch)
            free_awake = torch.cuda.mem_get_info()[0]
            say(f"cycle {len(result['cycles']) + 1}: pause()")
            t1 = time.perf_counter()
            saver.pause()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            free_paused = torch.cuda.mem_get_info()[0]
            rss_paused = rss_bytes()
            saver.resume()
            torch.cuda.synchronize()
            t3 = time.perf_counter()
            cycle = {"pause_s": t2 - t1, "resume_s": t3 - t2,
                     "gpu_freed_bytes": free_paused - free_awake,
                     "host_paused_bytes": rss_paused - rss_before,
                     "host_awake_bytes": rss_bytes() - rss_before}
        cycle["loss"] = trainer.step(*next(batches))
        losses.append(cycle["loss"])
        result["cycles"].append(cycle)
        say(f"cycle {len(result['cycles'])}: " + ", ".join(
            f"{k} {v / GiB:.2f} GiB" if k.endswith("bytes") else f"{k} {v:.3f}"
            for k, v in cycle.items()))
    torch.cuda.synchronize()
    result["losses"] = losses
    result["digest"] = digest(torch, trainer.kept_tensors())
    return result


def main(argv=None):
    args = parse_args(argv)
    status = 1
    try:
        result = run(args)
        print("RESULT " + json.dumps(result), flush=True)
        status = 0
    except ProgramError as e:
        print(f"tms_mcore_program: {e}", file=sys.stderr)
    except Exception:
        traceback.print_exc()
        print("tms_mcore_program: failed (the traceback above)", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # Out without the interpreter's teardown (torch_memory_saver's examples do
    # the same): the process group and the allocators' pools are not torn down
    # one by one, where a hang or a crash would hide the result.
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
