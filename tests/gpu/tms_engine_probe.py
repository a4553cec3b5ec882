# SPDX-License-Identifier: MIT
"""Where torch_memory_saver's test_training_engine loses 20 MB on dormant:
its sequence (pause, an allocation inside disable(), resume, a forward pass)
with the device's used memory, PyTorch's reserved bytes and dormant's device
bytes printed at every step, and once more after a pause of a second right
after resume (something freed asynchronously shows there). A diagnosis tool,
run by hand on the GPU machine:

    TMS_INIT_ENABLE=1 TMS_INIT_ENABLE_CPU_BACKUP=1 DORMANT_BACKEND=cuda \\
    DORMANT_PRELOAD_LIB=build-gpu/preload/libdormant-preload.so \\
    DORMANT_SHADOW_DIR=build-gpu/preload/tms-shadow python3 -m dormant.run \\
        --torch-memory-saver -- python3 tests/gpu/tms_engine_probe.py

(the environment scripts/gpu-tms-suite gives the dormant side).
"""
import time
from functools import reduce

import torch
import torch_memory_saver as tms_package
from torch_memory_saver import torch_memory_saver

MB = 1e6


def show(what):
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    line = (f"{what:<28} used {(total - free) / MB:10.1f} MB  torch reserved "
            f"{torch.cuda.memory_reserved() / MB:10.1f}  allocated "
            f"{torch.cuda.memory_allocated() / MB:10.1f}")
    try:
        import dormant
        st = dormant.stats()
        line += (f"  dormant device {st['totals']['device_bytes'] / MB:10.1f}"
                 f" managed {sum(d['managed_bytes'] for d in st['devices']) / MB:10.1f}")
    except Exception as e:  # noqa: BLE001 (a probe: say why, go on)
        line += f"  (dormant.stats: {type(e).__name__}: {e})"
    print(line, flush=True)
    return total - free


def forward(weights):
    ones = torch.ones((1024 ** 3,), dtype=torch.float32, device="cuda")
    avg = reduce(lambda a, b: (a + b) / 2, [w.float().mean() for w in weights])
    outs = ones * avg
    assert outs.mean().item() == 42


def child():
    torch_memory_saver.hook_mode = "preload"
    initial = torch.full((1_000_000,), 42, dtype=torch.uint8, device="cuda")
    show("init")
    weights = [torch.full((n,), 42, dtype=torch.uint8, device="cuda")
               for n in [1024 ** 3, 1024 ** 2, 1024, 42]]
    forward(weights)
    show("after forward")
    torch_memory_saver.pause()
    show("after pause")
    with torch_memory_saver.disable():
        t = torch.full((1024 ** 3,), 53, dtype=torch.uint8, device="cuda")
        assert t.float().mean().item() == 53
        show("in disable, after exec")
        del t
    show("after disable")
    torch_memory_saver.resume()
    a = show("after resume")
    time.sleep(1.0)
    b = show("after resume + 1 s")
    forward(weights)
    c = show("after second forward")
    forward(weights)
    show("after third forward")
    print(f"resume -> 1 s later: {(b - a) / MB:+.1f} MB; -> second forward: {(c - a) / MB:+.1f} MB")
    del initial


def main():
    """As the suite runs it: a spawned child under configure_subprocess()."""
    import multiprocessing
    with tms_package.configure_subprocess():
        proc = multiprocessing.get_context("spawn").Process(target=child)
        proc.start()
        proc.join()
    print(f"child exit code {proc.exitcode}")


if __name__ == "__main__":
    main()
