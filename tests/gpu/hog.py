# SPDX-License-Identifier: MIT
"""Another process that takes the GPU's free memory, as a rollout engine
would: allocates all but LEAVE_BYTES of it, prints "HOLDING <bytes> FREE
<bytes>", holds it until a line arrives on stdin, then exits."""
import sys

import torch

leave = int(sys.argv[1]) if len(sys.argv) > 1 else 64 << 20
torch.cuda.init()
free, _ = torch.cuda.mem_get_info()
want = free - leave
held = None
while want > 0 and held is None:
    try:
        held = torch.empty(want, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        want -= 32 << 20  # the context and the allocator's rounding take some
torch.cuda.synchronize()
print(f"HOLDING {want if held is not None else 0} FREE {torch.cuda.mem_get_info()[0]}",
      flush=True)
sys.stdin.readline()
