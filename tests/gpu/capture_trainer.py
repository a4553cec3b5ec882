#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A plain PyTorch trainer that knows nothing of dormant, for whole-process
capture on the GPU (tests/gpu/capture_driver.py runs it, under
`dormant-run --capture` or not).

An MLP stack with AdamW: the optimizer's state is created lazily by the first
step, outside any region, by PyTorch's caching allocator; cuBLAS allocates
its workspaces on its own. After every step the trainer prints its loss and
waits for a line on stdin (the orchestrator's turn: it may sleep and wake the
process over HTTP meanwhile). At the end it prints a SHA-256 of every
parameter and optimizer state byte.

With --regions it imports dormant and builds the model inside
dormant.region("weights"): the weights go to that tag, everything else to
"default" (regions still choose the tag under capture).

Protocol on stdout: "step I LOSS", then "final HEX".
"""
import argparse
import hashlib
import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


def build(width, layers):
    blocks = []
    for _ in range(layers):
        blocks += [nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)]
    return nn.Sequential(*blocks).cuda()


def digest(model, optimizer):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        for v in optimizer.state[p].values():
            if torch.is_tensor(v):
                h.update(v.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--regions", action="store_true")
    args = ap.parse_args()

    torch.manual_seed(1234)
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.regions:
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
        import dormant
        with dormant.region("weights"):
            model = build(args.width, args.layers)
    else:
        model = build(args.width, args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cuda").manual_seed(99)
    for step in range(args.steps):
        x = torch.randn(args.batch, args.width, device="cuda", generator=gen)
        target = torch.randn(args.batch, args.width, device="cuda", generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        optimizer.step()           # the first one creates AdamW's state
        optimizer.zero_grad(set_to_none=False)
        torch.cuda.synchronize()
        print(f"step {step} {loss.item()!r}", flush=True)
        if not sys.stdin.readline():
            return 1
    print(f"final {digest(model, optimizer)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
