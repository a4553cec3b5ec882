# SPDX-License-Identifier: MIT
"""What a PyTorch process's residue is made of (issue 34): the device memory
nvidia-smi charges to this process after each step that adds to it, with
nothing of PyTorch's own cached (empty_cache() after each step), and what
shrinking the context's limits gives back. Prints one line per step:

  python3 bench/residue_parts.py [--nccl [--one-rank-ctas N]]

--one-rank-ctas N makes the three extra (one-rank) groups with their NCCL
config's max_ctas capped at N (ProcessGroupNCCL.Options): a one-rank
collective uses no channel (NCCL's ncclLaunchOneRank), yet each one-rank
communicator gets NCCL's full count of channels, with their buffers.
"""
import ctypes
import os
import subprocess
import sys

import torch

CU_LIMIT_STACK_SIZE, CU_LIMIT_PRINTF_FIFO_SIZE, CU_LIMIT_MALLOC_HEAP_SIZE = 0, 1, 2


def used_mib():
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        pid, mib = (x.strip() for x in line.split(","))
        if int(pid) == os.getpid():
            return int(mib)
    return 0


last = [0]


def step(name):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    now = used_mib()
    print(f"{name:40s} {now:6d} MiB  (+{now - last[0]})", flush=True)
    last[0] = now


def limits(cu):
    out = {}
    for name, which in (("stack", CU_LIMIT_STACK_SIZE), ("printf", CU_LIMIT_PRINTF_FIFO_SIZE),
                        ("heap", CU_LIMIT_MALLOC_HEAP_SIZE)):
        v = ctypes.c_size_t()
        cu.cuCtxGetLimit(ctypes.byref(v), which)
        out[name] = v.value
    return out


def main():
    cu = ctypes.CDLL("libcuda.so.1")
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    step("context (torch.zeros(1))")
    a = torch.randn(4096, 4096, device="cuda")
    (a @ a).sum().item()
    step("cuBLAS matmul fp32")
    b = a.bfloat16()
    (b @ b).sum().item()
    step("cuBLAS(Lt) matmul bf16")
    x = torch.randn(8, 1024, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    lin = torch.nn.Linear(4096, 4096, device="cuda", dtype=torch.bfloat16)
    y = torch.nn.functional.gelu(torch.nn.functional.layer_norm(lin(x), (4096,)))
    y = torch.nn.functional.scaled_dot_product_attention(y.view(8, 8, 1024, 512),
                                                         y.view(8, 8, 1024, 512),
                                                         y.view(8, 8, 1024, 512))
    y.float().sum().backward()
    step("layer norm, gelu, attention, backward")
    torch.optim.AdamW(lin.parameters(), fused=True).step()
    step("fused AdamW")
    del a, b, x, y, lin
    step("tensors freed")
    if "--nccl" in sys.argv:
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
        t = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(t)
        step("NCCL: one communicator, all_reduce")
        ctas = None
        if "--one-rank-ctas" in sys.argv:
            ctas = int(sys.argv[sys.argv.index("--one-rank-ctas") + 1])
        options = None
        if ctas is not None:
            options = dist.ProcessGroupNCCL.Options()
            options.config.min_ctas = 1
            options.config.max_ctas = ctas
        groups = [dist.new_group([0], pg_options=options) for _ in range(3)]
        for g in groups:
            dist.all_reduce(t, group=g)
        step("NCCL: three more communicators" +
             ("" if ctas is None else f" (max_ctas {ctas})"))
    print("limits:", limits(cu), flush=True)
    for name, which, value in (("stack", CU_LIMIT_STACK_SIZE, 1024),
                               ("heap", CU_LIMIT_MALLOC_HEAP_SIZE, 1 << 20),
                               ("printf", CU_LIMIT_PRINTF_FIFO_SIZE, 1 << 16)):
        r = cu.cuCtxSetLimit(which, ctypes.c_size_t(value))
        step(f"cuCtxSetLimit({name}, {value}) -> {r}")
    print("limits:", limits(cu), flush=True)


if __name__ == "__main__":
    main()
