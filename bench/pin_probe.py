#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""How fast host memory is registered with the device (cuMemHostRegister), by
threads at once: what a release-mode or reclaimable-mode sleep pays before
its copies (issue 24, item 1). For a buffer of --gib GiB, faulted in first
(huge pages asked for with MADV_HUGEPAGE), registered in --piece-mib pieces
by 1, 2, 4 and 8 threads, then unregistered; also after MADV_FREE and a
fresh touch (the reclaimable cycle). Prints seconds and GB/s per row.

    python3 bench/pin_probe.py [--gib 16] [--piece-mib 256]

Driver API through ctypes; no PyTorch.
"""
import argparse
import ctypes
import mmap
import threading
import time


def check(r, what):
    if r != 0:
        raise RuntimeError(f"{what}: CUresult {r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=16)
    ap.add_argument("--piece-mib", type=int, default=256)
    args = ap.parse_args()
    cu = ctypes.CDLL("libcuda.so.1")
    check(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    size = int(args.gib * (1 << 30))
    piece = args.piece_mib << 20
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    libc = ctypes.CDLL(None)
    t = time.perf_counter()
    libc.memset(ctypes.c_void_p(base), 1, ctypes.c_size_t(size))
    print(f"touch {size / 2**30:.1f} GiB: {time.perf_counter() - t:.3f} s", flush=True)
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            print("THP:", f.read().strip())
        with open("/proc/self/smaps_rollup") as f:
            print([line.strip() for line in f if "AnonHugePages" in line])
    except OSError:
        pass
    pieces = [(base + off, min(piece, size - off)) for off in range(0, size, piece)]

    def run(threads, fn):
        todo = list(pieces)
        lock = threading.Lock()

        def worker():
            check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            while True:
                with lock:
                    if not todo:
                        return
                    p, n = todo.pop()
                fn(p, n)

        ts = [threading.Thread(target=worker) for _ in range(threads)]
        t0 = time.perf_counter()
        for th in ts:
            th.start()
        for th in ts:
            th.join()
        return time.perf_counter() - t0

    def pin(p, n):
        check(cu.cuMemHostRegister_v2(ctypes.c_void_p(p), ctypes.c_size_t(n), 0),
              "cuMemHostRegister")

    def unpin(p, n):
        check(cu.cuMemHostUnregister(ctypes.c_void_p(p)), "cuMemHostUnregister")

    for threads in (1, 2, 4, 8):
        s = run(threads, pin)
        u = run(threads, unpin)
        print(f"threads {threads}: pin {s:.3f} s = {size / s / 1e9:5.1f} GB/s, "
              f"unpin {u:.3f} s = {size / u / 1e9:5.1f} GB/s", flush=True)
    # the reclaimable cycle: MADV_FREE, touch again, pin
    buf.madvise(8)  # MADV_FREE
    t = time.perf_counter()
    libc.memset(ctypes.c_void_p(base), 2, ctypes.c_size_t(size))
    print(f"after MADV_FREE, touch again: {time.perf_counter() - t:.3f} s", flush=True)
    for threads in (1, 4):
        s = run(threads, pin)
        u = run(threads, unpin)
        print(f"reclaimable, threads {threads}: pin {s:.3f} s, unpin {u:.3f} s", flush=True)


if __name__ == "__main__":
    main()
