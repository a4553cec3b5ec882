# SPDX-License-Identifier: MIT
"""A real Megatron-core trainer under dormant, shared by
tests/gpu/test_megatron_core_gpu.py and bench/megatron_core.py.

Megatron-LM's own megatron/core (in <repo>/.thirdparty/megatron, see
scripts/gpu-megatron) with the local (non-Transformer-Engine) layer spec:
a GPTModel in bf16 (Float16Module), Megatron's DistributedDataParallel with
fp32 grad buffers (grad_reduce_in_fp32) and the distributed optimizer, on a
one-rank process group. The memory goes under tags the way docs/pytorch.md's
Megatron recipe says:

  weights    keep or rebuild   DDP's bf16 param_data            2 bytes/param
  grads      discard           DDP's fp32 grad_data             4 bytes/param
  optimizer  keep              fp32 main params, Adam m and v  12 bytes/param

With rebuild=True the weights tag has the "rebuild" policy: no host copy, and
on wake the distributed optimizer's fp32 main params are copied back into
param_data (the bf16 rounding Megatron does after every step), then
all-gathered across the data-parallel group when there is more than one rank.
"""
import contextlib
import dataclasses
import os
import pathlib
import socket
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
MEGATRON = REPO / ".thirdparty" / "megatron"
PYLIBS = REPO / ".thirdparty" / "pylibs"   # pure-Python fallbacks (packaging)


def add_megatron_to_path():
    """Put the fetched megatron/core first on sys.path, and the pure-Python
    fallbacks last (the machine's own packages win)."""
    if str(MEGATRON) not in sys.path:
        sys.path.insert(0, str(MEGATRON))
    if PYLIBS.is_dir() and str(PYLIBS) not in sys.path:
        sys.path.append(str(PYLIBS))
    if str(REPO / "python") not in sys.path:
        sys.path.insert(0, str(REPO / "python"))


def why_megatron_is_missing():
    """None when megatron.core imports here, else the reason in words."""
    add_megatron_to_path()
    if not (MEGATRON / "megatron" / "core" / "__init__.py").is_file():
        return (f"no Megatron-core at {MEGATRON}/megatron/core (copy megatron/core of "
                f"NVIDIA/Megatron-LM there; see scripts/gpu-megatron)")
    try:
        import megatron.core  # noqa: F401
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec  # noqa
    except Exception as e:  # an ImportError, or whatever its module code raised
        return f"megatron.core does not import: {type(e).__name__}: {e}"
    return None


@dataclasses.dataclass
class ModelConfig:
    layers: int = 2
    hidden: int = 256
    heads: int = 4
    ffn: int = 1024
    vocab: int = 1024
    seq: int = 128
    batch: int = 4
    lr: float = 1e-3
    seed: int = 1234


# About 186 M parameters: the size of model the live-bytes targets were set on.
BENCH_MODEL = ModelConfig(layers=12, hidden=1024, heads=16, ffn=4096, vocab=32768, seq=1024,
                          batch=4)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_initialized = False


def init_distributed():
    """A one-rank NCCL process group and Megatron's parallel state (TP = PP =
    DP = 1). Idempotent."""
    global _initialized
    import torch
    from megatron.core import parallel_state
    if _initialized:
        return
    torch.cuda.set_device(0)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            backend="nccl", init_method=f"tcp://127.0.0.1:{free_port()}", world_size=1, rank=0)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1,
                                                 pipeline_model_parallel_size=1)
    _initialized = True


def deterministic():
    import torch
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def token_batches(cfg, count=None, seed=None):
    """(tokens, labels) pairs on the CPU for cfg (a ModelConfig), the same for
    the same seed (default cfg.seed + 1); count None: for ever."""
    import itertools

    import torch
    g = torch.Generator().manual_seed(cfg.seed + 1 if seed is None else seed)
    for _ in (range(count) if count is not None else itertools.count()):
        tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=g)
        yield tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def megatron_step(model, optimizer, position_ids, tokens, labels, optimizer_region=None):
    """One Megatron training step of a DDP model and its optimizer: (the loss
    as a 0-d tensor on the GPU, whether the optimizer stepped).
    optimizer_region: a context manager the optimizer step runs in (the first
    step makes Adam's moments, lazily: where they land), or None."""
    tokens, labels = tokens.cuda(), labels.cuda()
    model.zero_grad_buffer()
    optimizer.zero_grad()
    losses = model(input_ids=tokens, position_ids=position_ids, attention_mask=None,
                   labels=labels)
    loss = losses.float().mean()
    loss.backward()
    model.finish_grad_sync()
    with optimizer_region if optimizer_region is not None else contextlib.nullcontext():
        ok, _, _ = optimizer.step()
    return loss.detach(), ok


class Tags:
    def __init__(self, prefix=""):
        self.weights = prefix + "weights"
        self.grads = prefix + "grads"
        self.optimizer = prefix + "optimizer"

    def all(self):
        return [self.weights, self.grads, self.optimizer]


class McoreTrainer:
    """A GPTModel trained with Megatron's DDP and distributed optimizer, its
    memory under dormant tags (dm: the dormant.Manager serving PyTorch)."""

    def __init__(self, dm, cfg=ModelConfig(), *, prefix="", rebuild=False):
        import torch
        from megatron.core import tensor_parallel
        from megatron.core.distributed import (DistributedDataParallel,
                                               DistributedDataParallelConfig)
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.transformer.module import Float16Module
        from megatron.core.transformer.transformer_config import TransformerConfig

        init_distributed()
        self.dm = dm
        self.cfg = cfg
        self.tags = Tags(prefix)
        self.rebuild = rebuild
        self.rebuilds = 0           # rebuild callbacks that succeeded
        self.rebuild_fault = None   # an exception the next rebuild raises (tests)
        if rebuild:
            dm.set_policy(self.tags.weights, "rebuild", rebuild=self._rebuild_weights)
        else:
            dm.set_policy(self.tags.weights, "keep")
        dm.set_policy(self.tags.grads, "discard")
        dm.set_policy(self.tags.optimizer, "keep")

        torch.manual_seed(cfg.seed)
        tensor_parallel.model_parallel_cuda_manual_seed(cfg.seed)
        self.config = TransformerConfig(
            num_layers=cfg.layers, hidden_size=cfg.hidden, num_attention_heads=cfg.heads,
            ffn_hidden_size=cfg.ffn, hidden_dropout=0.0, attention_dropout=0.0,
            bf16=True, params_dtype=torch.bfloat16, use_cpu_initialization=True,
            deterministic_mode=True)
        # Built outside any region: DDP copies the parameters into its
        # param_data and these are freed to PyTorch's default pool.
        model = GPTModel(config=self.config, transformer_layer_spec=get_gpt_layer_local_spec(),
                         vocab_size=cfg.vocab, max_sequence_length=cfg.seq,
                         share_embeddings_and_output_weights=True)
        model = Float16Module(self.config, model.cuda())
        self.ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=True,
            overlap_grad_reduce=False, overlap_param_gather=False)
        # DDP's constructor allocates param_data (bf16) and grad_data (fp32)
        # together: dtype_tags sends the fp32 one to the grads tag.
        with dm.region(self.tags.weights, dtype_tags={torch.float32: self.tags.grads}):
            self.model = DistributedDataParallel(self.config, self.ddp_config, model)
        del model
        torch.cuda.empty_cache()
        self.opt_config = OptimizerConfig(
            optimizer="adam", lr=cfg.lr, weight_decay=0.01, bf16=True,
            use_distributed_optimizer=True, clip_grad=1.0)
        with dm.region(self.tags.optimizer):
            self.optimizer = get_megatron_optimizer(self.opt_config, [self.model])
        self.position_ids = torch.arange(cfg.seq, device="cuda").unsqueeze(0).expand(
            cfg.batch, -1).contiguous()
        # Megatron's local attention (DotProductAttention) takes a scratch tensor of
        # batch x heads x seq x seq bf16 from parallel_state's process-wide global memory
        # buffer at its first forward and keeps it: outside every region, so it stayed
        # on the GPU asleep (64 MiB at batch 2, 16 heads, seq 1024). It is only the
        # ignored input of a baddbmm with beta=0, so it goes under the discarded grads
        # tag: made here, the forward finds it big enough and reuses it. (The first
        # trainer of a process makes it; later ones reuse that one.)
        from megatron.core import parallel_state
        heads = cfg.heads // parallel_state.get_tensor_model_parallel_world_size()
        parallel_state.get_global_memory_buffer().get_tensor(
            (cfg.batch * heads, cfg.seq, cfg.seq), torch.bfloat16, "mpu",
            mem_alloc_context=lambda: dm.region(self.tags.grads))
        self.steps_done = 0

    # ---- what Megatron has ------------------------------------------------

    def optimizers(self):
        """The DistributedOptimizer(s) inside get_megatron_optimizer's result."""
        return list(getattr(self.optimizer, "chained_optimizers", [self.optimizer]))

    def buffers(self):
        return list(self.model.buffers) + list(getattr(self.model, "expert_parallel_buffers", []))

    def parameters(self):
        return list(self.model.module.parameters())

    def param_count(self):
        return sum(p.numel() for p in self.parameters())

    # ---- the rebuild callback -----------------------------------------------

    def _rebuild_weights(self, tag):
        """On wake, with param_data mapped and zero-filled: the bf16 weights
        are the fp32 main params rounded, exactly what the optimizer step
        writes into param_data."""
        import torch
        if self.rebuild_fault is not None:
            fault, self.rebuild_fault = self.rebuild_fault, None
            raise fault
        with torch.no_grad():
            for opt in self.optimizers():
                opt._copy_main_params_to_model_params()
            if torch.distributed.get_world_size(self.data_parallel_group()) > 1:
                # Each rank rebuilt its own shard: all-gather the rest.
                self.model.start_param_sync(force_sync=True)
        self.rebuilds += 1

    def data_parallel_group(self):
        from megatron.core import parallel_state
        return parallel_state.get_data_parallel_group()

    # ---- training -------------------------------------------------------------

    def batches(self, count, seed=None):
        """count (tokens, labels) pairs on the CPU, the same for the same seed."""
        return token_batches(self.cfg, count, seed)

    def train_step(self, tokens, labels):
        """One Megatron step; returns the loss as a 0-d tensor on the GPU."""
        # Adam's moments are created lazily, by the first step.
        loss, ok = megatron_step(self.model, self.optimizer, self.position_ids, tokens, labels,
                                 self.dm.region(self.tags.optimizer)
                                 if self.steps_done == 0 else None)
        assert ok, "the optimizer step was skipped"
        self.steps_done += 1
        return loss

    # ---- what the checks look at ------------------------------------------------

    def main_params(self):
        out = []
        for opt in self.optimizers():
            for group in opt.shard_fp32_from_float16_groups + opt.shard_fp32_groups:
                out.extend(group)
        return out

    def state_tensors(self):
        import torch
        out = []
        for opt in self.optimizers():
            for state in opt.optimizer.state.values():
                out.extend(t for t in state.values() if isinstance(t, torch.Tensor) and t.is_cuda)
        return out

    def snapshot(self):
        """CPU copies of every byte that must survive a sleep."""
        return {
            "param_data": [b.param_data.cpu() for b in self.buffers()],
            "main_params": [p.detach().cpu() for p in self.main_params()],
            "state": [t.cpu() for t in self.state_tensors()],
        }

    def pointers(self):
        return {
            "params": [p.data_ptr() for p in self.parameters()],
            "main_grads": [p.main_grad.data_ptr() for p in self.parameters()],
            "param_data": [b.param_data.data_ptr() for b in self.buffers()],
            "grad_data": [b.grad_data.data_ptr() for b in self.buffers()],
            "main_params": [p.data_ptr() for p in self.main_params()],
            "state": [t.data_ptr() for t in self.state_tensors()],
        }

    def grads_nonzero(self):
        return sum(int(b.grad_data.count_nonzero().item()) for b in self.buffers())


def bits(t):
    """A view whose equality is bit equality (NaNs included)."""
    import torch
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(width)


def snapshots_equal(a, b):
    import torch
    return all(len(a[k]) == len(b[k]) and all(torch.equal(bits(x), bits(y))
                                               for x, y in zip(a[k], b[k])) for k in a)
