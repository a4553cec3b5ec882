#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A Megatron-style trainer whose GPU memory sleeps and wakes with dormant.

The memory is laid out the way Megatron-LM lays it out with bf16 training,
grad-reduce-in-fp32 and its distributed-optimizer-style buffers:

  ParamAndGradBuffer (like Megatron's _ParamAndGradBuffer) allocates, in one
  constructor, a flat bf16 `param_data` and a flat fp32 `grad_data`; every
  parameter's .data becomes a view into param_data and its .main_grad a view
  into grad_data. Backward adds each bf16 .grad into .main_grad (a
  post-accumulate-grad hook) and drops .grad.

  The optimizer keeps an fp32 master copy of param_data and runs AdamW on it,
  with grad_data as its gradient; after each step the master copy is cast
  back into param_data.

The tags, with no change to this model code:
  weights    (rebuild) param_data: no host copy         2 bytes/param
  grads      (discard) grad_data: no host copy          4 bytes/param
  optimizer  (keep)    fp32 master params, Adam m, v   12 bytes/param

The bf16 weights are the fp32 master params rounded (the optimizer step
writes them so), so they need no copy either: "weights" has the rebuild
policy, and on wake, once "optimizer" is restored, its callback casts the
master params back into param_data (with data parallelism a Megatron trainer
would all-gather param_data there too: see docs/pytorch.md). --keep-weights
keeps them instead. PyTorch's free blocks inside the pools (temporaries of the
first optimizer step) are skipped by dormant's glue before every sleep.

The buffer is built inside dormant.region("weights",
dtype_tags={torch.float32: "grads"}): its bf16 allocation lands in "weights"
and its fp32 one in "grads", as Megatron's DDP constructor would need. Adam's
moments are created lazily by the first optimizer step, which therefore runs
inside dormant.region("optimizer").

Run (needs torch with CUDA and libdormant):
  PYTHONPATH=python DORMANT_LIB=build/libdormant.so python3 examples/megatron_style.py
It trains, serves the HTTP API, and every --sleep-every steps sleeps and wakes
itself over HTTP, checking that training goes on from the same bytes.
"""
import argparse
import dataclasses
import math
import os
import pathlib
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

try:
    import dormant
except ImportError:  # run from a checkout without PYTHONPATH
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
    import dormant
import dormant.client  # noqa: E402 (standard library only)


@dataclasses.dataclass
class Config:
    d_in: int = 64         # input features per token
    d_model: int = 256
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 1024
    vocab: int = 512       # output classes per token
    seq: int = 64
    batch: int = 8
    lr: float = 1e-3
    weight_decay: float = 0.01
    seed: int = 1234
    tag_prefix: str = ""   # several trainers in one process use distinct tags


# ---- the model (plain PyTorch; nothing here knows about dormant) ------------

def rms_norm(x, weight, eps=1e-5):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.norm1 = nn.Parameter(torch.ones(cfg.d_model))
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.norm2 = nn.Parameter(torch.ones(cfg.d_model))
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x):
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(rms_norm(x, self.norm1)).view(b, t, 3, h, d // h).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attn = scores.float().masked_fill(causal, float("-inf")).softmax(-1).to(x.dtype)
        y = (attn @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(rms_norm(x, self.norm2))))


class TinyTransformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.inp = nn.Linear(cfg.d_in, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.Parameter(torch.ones(cfg.d_model))
        self.head = nn.Linear(cfg.d_model, cfg.vocab)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(rms_norm(x, self.norm))


# ---- Megatron-style buffers and optimizer (nothing here knows dormant) ------

class ParamAndGradBuffer:
    """One flat bf16 param_data and one flat fp32 grad_data, allocated
    together; parameters become views (.data, .main_grad) into them."""

    ALIGN = 128  # elements: keeps every view 256-byte aligned

    def __init__(self, params, param_dtype=torch.bfloat16, grad_dtype=torch.float32):
        self.params = list(params)
        offsets, total = [], 0
        for p in self.params:
            offsets.append(total)
            total += -(-p.numel() // self.ALIGN) * self.ALIGN
        self.numel = total
        device = torch.cuda.current_device()
        self.param_data = torch.zeros(total, dtype=param_dtype, device=device)
        self.grad_data = torch.zeros(total, dtype=grad_dtype, device=device)
        for p, offset in zip(self.params, offsets):
            n, shape = p.numel(), p.shape
            host = p.data.to(param_dtype)
            p.data = self.param_data[offset:offset + n].view(shape)
            p.data.copy_(host)
            p.main_grad = self.grad_data[offset:offset + n].view(shape)
            p.register_post_accumulate_grad_hook(self._accumulate)

    @staticmethod
    def _accumulate(param):
        param.main_grad.add_(param.grad)
        param.grad = None

    def zero_grad(self):
        self.grad_data.zero_()


class MixedPrecisionAdamW:
    """AdamW on an fp32 master copy of the flat bf16 parameters; the flat
    fp32 grad buffer is the master copy's gradient (no copy)."""

    def __init__(self, buffer, lr, weight_decay):
        self.buffer = buffer
        self.main_param = nn.Parameter(buffer.param_data.detach().float())
        self.main_param.grad = buffer.grad_data
        self.optimizer = torch.optim.AdamW([self.main_param], lr=lr,
                                           weight_decay=weight_decay, fused=True)

    def state_tensors(self):
        return [t for s in self.optimizer.state.values() for t in s.values()
                if isinstance(t, torch.Tensor)]

    def step(self):
        self.optimizer.step()
        self.buffer.param_data.copy_(self.main_param.detach())


# ---- the trainer: where dormant comes in ------------------------------------

class Tags:
    def __init__(self, prefix=""):
        self.weights = prefix + "weights"
        self.grads = prefix + "grads"
        self.optimizer = prefix + "optimizer"

    def all(self):
        return [self.weights, self.grads, self.optimizer]


class Trainer:
    def __init__(self, cfg, manager=None, rebuild_weights=False):
        self.cfg = cfg
        self.dm = manager or dormant.manager()
        self.tags = Tags(cfg.tag_prefix)
        self.dm.set_policy(self.tags.weights, "keep")
        self.dm.set_policy(self.tags.grads, "discard")
        self.dm.set_policy(self.tags.optimizer, "keep")

        torch.manual_seed(cfg.seed)
        self.model = TinyTransformer(cfg)  # initialised on the CPU: reproducible
        # Megatron's DDP constructor allocates param_data and grad_data
        # together: dtype_tags sends the fp32 allocation to "grads".
        with self.dm.region(self.tags.weights, dtype_tags={torch.float32: self.tags.grads}):
            self.buffer = ParamAndGradBuffer(self.model.parameters())
        with self.dm.region(self.tags.optimizer):
            self.optimizer = MixedPrecisionAdamW(self.buffer, cfg.lr, cfg.weight_decay)
        if rebuild_weights:
            # From here on param_data can be derived from the master params.
            self.dm.set_policy(self.tags.weights, "rebuild", rebuild=self.rebuild_weights)
        self.steps_done = 0

    def rebuild_weights(self, tag):
        """The rebuild callback of the weights tag: runs on wake, after the
        optimizer tag is restored, with param_data mapped and zero-filled.
        The same cast as the end of MixedPrecisionAdamW.step(), so the same
        bits."""
        with torch.no_grad():
            self.buffer.param_data.copy_(self.optimizer.main_param.detach())

    def batches(self, count, seed=None):
        """count (x, y) pairs on the CPU, the same for the same seed."""
        g = torch.Generator().manual_seed(self.cfg.seed + 1 if seed is None else seed)
        cfg = self.cfg
        for _ in range(count):
            x = torch.randn(cfg.batch, cfg.seq, cfg.d_in, generator=g)
            y = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq), generator=g)
            yield x, y

    def train_step(self, x, y):
        """One step; returns the loss as a 0-d tensor on the GPU."""
        x = x.cuda().to(torch.bfloat16)
        y = y.cuda()
        self.buffer.zero_grad()
        logits = self.model(x)
        loss = F.cross_entropy(logits.float().view(-1, self.cfg.vocab), y.view(-1))
        loss.backward()
        if self.steps_done == 0:
            # Adam's m and v are created here: put them under "optimizer".
            with self.dm.region(self.tags.optimizer):
                self.optimizer.step()
        else:
            self.optimizer.step()
        self.steps_done += 1
        return loss.detach()

    # What tests and demos look at.
    def parameters(self):
        return list(self.model.parameters())

    def snapshot(self):
        """CPU copies of every byte that must survive a sleep."""
        return {
            "param_data": self.buffer.param_data.cpu(),
            "main_param": self.optimizer.main_param.detach().cpu(),
            "state": [t.cpu() for t in self.optimizer.state_tensors()],
        }

    def pointers(self):
        return {
            "params": [p.data_ptr() for p in self.parameters()],
            "main_grads": [p.main_grad.data_ptr() for p in self.parameters()],
            "param_data": self.buffer.param_data.data_ptr(),
            "grad_data": self.buffer.grad_data.data_ptr(),
            "main_param": self.optimizer.main_param.data_ptr(),
            "state": [t.data_ptr() for t in self.optimizer.state_tensors()],
        }


def deterministic():
    """Settings under which two runs of the same steps give the same bits."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--sleep-every", type=int, default=5)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--keep-weights", action="store_true",
                    help="copy the bf16 weights to host memory instead of rebuilding them")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("megatron_style.py needs a CUDA device (torch.cuda.is_available() is False)")

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    deterministic()
    dormant.configure(backend="cuda")
    cfg = Config(d_model=args.d_model, n_layers=args.layers, d_ff=4 * args.d_model)
    trainer = Trainer(cfg, rebuild_weights=not args.keep_weights)
    server = dormant.serve(port=args.port, quiet=True)
    itself = dormant.client.Client([server.url], timeout=600)  # over HTTP, as an orchestrator
    print(f"dormant serving {server.url} (try: curl -X POST {server.url}/sleep)")
    tags = {t["tag"]: t for t in dormant.stats()["tags"]}
    for name in trainer.tags.all():
        t = tags[name]
        print(f"  tag {name:10s} {t['policy']:8s} {t['bytes'] / 2**20:9.1f} MiB")

    for i, (x, y) in enumerate(trainer.batches(args.steps)):
        with dormant.step():
            loss = trainer.train_step(x, y).item()
        print(f"step {i:3d} loss {loss:.6f}")
        if args.sleep_every and (i + 1) % args.sleep_every == 0 and i + 1 < args.steps:
            before = trainer.snapshot()
            free0 = torch.cuda.mem_get_info()[0]
            rep = itself.sleep()[0].body
            free1 = torch.cuda.mem_get_info()[0]
            print(f"  sleep: {rep['duration_s']:.3f} s, {rep['bytes_copied'] / 2**20:.1f} MiB "
                  f"to host ({rep.get('bytes_skipped', 0) / 2**20:.1f} MiB of free blocks "
                  f"skipped), {rep['bytes_released'] / 2**20:.1f} MiB released; "
                  f"GPU free +{(free1 - free0) / 2**20:.1f} MiB; "
                  f"host held {dormant.stats()['totals']['host_bytes'] / 2**20:.1f} MiB")
            rep = itself.wake()[0].body
            after = trainer.snapshot()
            same = all(torch.equal(a, b) for a, b in zip(
                [before["param_data"], before["main_param"], *before["state"]],
                [after["param_data"], after["main_param"], *after["state"]]))
            print(f"  wake:  {rep['duration_s']:.3f} s, {rep['bytes_zeroed'] / 2**20:.1f} MiB "
                  f"zeroed; weights and optimizer state {'identical' if same else 'CHANGED'}")
            if not same:
                sys.exit(1)
    server.stop()


if __name__ == "__main__":
    main()
