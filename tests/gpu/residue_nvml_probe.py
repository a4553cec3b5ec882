#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Does NVML (nvmlDeviceGetMemoryInfo) answer inside a process whose CUDA
state another process has checkpointed? (issue 34: the library reads free
memory through NVML after its helper's checkpoint, and a sleep hung there.)

    python3 tests/gpu/residue_nvml_probe.py HELPER

Makes a CUDA context (torch), asks HELPER (dormant-residue-helper --pid) to
checkpoint this process, then calls NVML from a thread with a 10 s limit,
and restores. Prints one line per step."""
import ctypes
import os
import subprocess
import sys
import threading
import time

import torch

helper = sys.argv[1]
torch.cuda.init()
x = torch.ones(1 << 20, device="cuda")
torch.cuda.synchronize()
nvml = ctypes.CDLL("libnvidia-ml.so.1")
print("nvmlInit", nvml.nvmlInit_v2(), flush=True)
handle = ctypes.c_void_p()
print("handle", nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(handle)), flush=True)


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def read(label):
    out = {}

    def call():
        m = Memory()
        t0 = time.monotonic()
        out["r"] = nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(m))
        out["s"] = time.monotonic() - t0
        out["free"] = m.free
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(10)
    print(f"{label}: " + ("HUNG (no answer in 10 s)" if t.is_alive() else
                          f"rc {out['r']} in {out['s']:.3f} s, free {out['free'] / 2**30:.2f} GiB"),
          flush=True)
    return not t.is_alive()


read("nvml before")
pid = os.getpid()
r = subprocess.run([helper, "--pid", str(pid), "checkpoint"], timeout=60)
print("checkpoint rc", r.returncode, flush=True)
ok = read("nvml while checkpointed")
r = subprocess.run([helper, "--pid", str(pid), "restore"], timeout=60)
print("restore rc", r.returncode, flush=True)
read("nvml after restore")
print("tensor after restore:", float(x.sum().item()), flush=True)
sys.exit(0 if ok else 1)
