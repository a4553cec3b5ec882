#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Can a sleep into unpinned host memory reach the PCIe ceiling? (issue 24,
item 1). Device to host copies of --gib GiB into a host buffer left as a
reclaimable-mode sleep finds it (huge pages, faulted in, MADV_FREE, touched
again), four ways:

  ceiling   the buffer pinned beforehand: copies only;
  pin       one thread registers 256 MiB pieces in order, another copies
            each piece once it is registered (what dormant does today);
  staged    copies through a pinned ring of 4 x 64 MiB slots, each slot
            copied on to the buffer by --threads threads (pin_host=0);
  inline    as pin, but the registering thread queues each piece's copy
            itself (the driver serializes registration with other calls);
  hybrid    both at once: registered pieces copied from the front, staged
            ones from the back, until they meet (inl+stg: inline and staged).

Also what memcpy alone moves between host buffers by 1 to 16 threads.
Prints seconds and GB/s per row. Driver API through ctypes; no PyTorch.

    python3 bench/hybrid_probe.py [--gib 16] [--threads 8] [--reps 2]
"""
import argparse
import concurrent.futures
import ctypes
import mmap
import threading
import time

MiB = 1 << 20


def check(r, what):
    if r != 0:
        raise RuntimeError(f"{what}: CUresult {r}")


class Probe:
    def __init__(self, gib, threads, piece_mib):
        cu = self.cu = ctypes.CDLL("libcuda.so.1")
        check(cu.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        check(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev), "ctx")
        check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        self.libc = ctypes.CDLL(None)
        self.libc.memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        self.libc.memcpy.restype = ctypes.c_void_p
        self.size = int(gib * (1 << 30))
        self.piece = piece_mib * MiB
        self.slot = 64 * MiB
        self.slots = 4
        self.dptr = ctypes.c_uint64()
        check(cu.cuMemAlloc_v2(ctypes.byref(self.dptr), ctypes.c_size_t(self.size)), "alloc")
        check(cu.cuMemsetD8_v2(self.dptr, 7, ctypes.c_size_t(self.size)), "memset")
        check(cu.cuCtxSynchronize(), "sync")
        self.buf = mmap.mmap(-1, self.size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.buf.madvise(mmap.MADV_HUGEPAGE)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.buf))
        self.memset_threads(1)
        self.buf.madvise(8)  # MADV_FREE: as a reclaimable wake leaves it
        self.memset_threads(2)
        self.ring = mmap.mmap(-1, self.slot * self.slots,
                              flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.ring_base = ctypes.addressof(ctypes.c_char.from_buffer(self.ring))
        self.libc.memset(ctypes.c_void_p(self.ring_base), 0, ctypes.c_size_t(len(self.ring)))
        for s in range(self.slots):
            check(cu.cuMemHostRegister_v2(ctypes.c_void_p(self.ring_base + s * self.slot),
                                          ctypes.c_size_t(self.slot), 0), "ring pin")
        self.streams = []
        for _ in range(2):
            st = ctypes.c_void_p()
            check(cu.cuStreamCreate(ctypes.byref(st), 1), "stream")
            self.streams.append(st)
        self.pool = concurrent.futures.ThreadPoolExecutor(max(threads, 16))
        self.threads = threads
        self.pieces = [(off, min(self.piece, self.size - off))
                       for off in range(0, self.size, self.piece)]

    def memset_threads(self, value, threads=8):
        step = (self.size + threads - 1) // threads
        ts = [threading.Thread(target=self.libc.memset,
                               args=(ctypes.c_void_p(self.base + i * step), value,
                                     ctypes.c_size_t(max(0, min(step, self.size - i * step)))))
              for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    def bind(self):
        check(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def pin(self, off, n):
        check(self.cu.cuMemHostRegister_v2(ctypes.c_void_p(self.base + off),
                                           ctypes.c_size_t(n), 0), "pin")

    def unpin_all(self):
        for off, _ in self.pieces:
            check(self.cu.cuMemHostUnregister(ctypes.c_void_p(self.base + off)), "unpin")

    def d2h(self, host, off, n, stream):
        check(self.cu.cuMemcpyDtoHAsync_v2(ctypes.c_void_p(host),
                                           ctypes.c_uint64(self.dptr.value + off),
                                           ctypes.c_size_t(n), stream), "d2h")

    def sync(self, stream):
        check(self.cu.cuStreamSynchronize(stream), "stream sync")

    def memcpy_par(self, dst, src, n, threads):
        step = max((n + threads - 1) // threads, 4 * MiB)
        futs = [self.pool.submit(self.libc.memcpy, dst + o, src + o, min(step, n - o))
                for o in range(0, n, step)]
        for f in futs:
            f.result()

    # -- the four ways -------------------------------------------------------
    def ceiling(self):
        for off, n in self.pieces:
            self.pin(off, n)
        t = time.perf_counter()
        for off, n in self.pieces:
            self.d2h(self.base + off, off, n, self.streams[0])
        self.sync(self.streams[0])
        s = time.perf_counter() - t
        self.unpin_all()
        return s, {"bad": self.check_bytes()}

    def front(self, state, lock, inline=False):
        """Register pieces from the front and copy each once registered:
        on another thread, or (inline) on the same one, between pins."""
        self.bind()
        done = []
        copier_q = []
        cond = threading.Condition(lock)

        def pinner():
            self.bind()
            while True:
                with lock:
                    i = state["front"]
                    if i >= state["back"]:
                        state["pin_done"] = True
                        cond.notify_all()
                        return
                    state["front"] = i + 1
                off, n = self.pieces[i]
                self.pin(off, n)
                if inline:
                    self.d2h(self.base + off, off, n, self.streams[0])
                with lock:
                    if inline:
                        done.append(i)
                    else:
                        copier_q.append(i)
                    cond.notify_all()

        th = threading.Thread(target=pinner)
        th.start()
        while True:
            with lock:
                while not copier_q and not state["pin_done"]:
                    cond.wait()
                if not copier_q:
                    break
                i = copier_q.pop(0)
            off, n = self.pieces[i]
            self.d2h(self.base + off, off, n, self.streams[0])
            done.append(i)
        self.sync(self.streams[0])
        th.join()
        return done

    def back(self, state, lock, threads):
        """Stage pieces from the back through the ring until the front meets."""
        self.bind()
        staged = []
        events = []
        for _ in range(self.slots):
            ev = ctypes.c_void_p()
            check(self.cu.cuEventCreate(ctypes.byref(ev), 2), "event")
            events.append(ev)
        inflight = []  # (slot, host address, length)
        free = list(range(self.slots))

        def complete():
            slot, host, n = inflight.pop(0)
            check(self.cu.cuEventSynchronize(events[slot]), "event sync")
            self.memcpy_par(host, self.ring_base + slot * self.slot, n, threads)
            free.append(slot)

        while True:
            with lock:
                i = state["back"] - 1
                if i < state["front"]:
                    break
                state["back"] = i
            off, n = self.pieces[i]
            staged.append(i)
            for o in range(0, n, self.slot):
                if not free:
                    complete()
                slot = free.pop(0)
                k = min(self.slot, n - o)
                self.d2h(self.ring_base + slot * self.slot, off + o, k, self.streams[1])
                check(self.cu.cuEventRecord(events[slot], self.streams[1]), "record")
                inflight.append((slot, self.base + off + o, k))
        while inflight:
            complete()
        for ev in events:
            self.cu.cuEventDestroy_v2(ev)
        return staged

    def run(self, pin, stage, inline=False):
        lock = threading.Lock()
        state = {"front": 0, "back": len(self.pieces), "pin_done": False}
        result = {}
        t = time.perf_counter()
        if pin and stage:
            th = threading.Thread(target=lambda: result.update(staged=self.back(state, lock, self.threads)))
            th.start()
            result["pinned"] = self.front(state, lock, inline)
            th.join()
        elif pin:
            result["pinned"] = self.front(state, lock, inline)
        else:
            result["staged"] = self.back(state, lock, self.threads)
        s = time.perf_counter() - t
        pinned = result.get("pinned", [])
        for i in pinned:
            off, _ = self.pieces[i]
            check(self.cu.cuMemHostUnregister(ctypes.c_void_p(self.base + off)), "unpin")
        bad = self.check_bytes()
        self.buf.madvise(8)
        self.memset_threads(3)
        return s, {"pinned pieces": len(pinned), "staged pieces": len(result.get("staged", [])),
                   "bad": bad}

    def check_bytes(self):
        bad = 0
        for off in range(0, self.size, 64 * MiB):
            if ctypes.c_ubyte.from_address(self.base + off).value != 7:
                bad += 1
        return bad

    def memcpy_rates(self):
        n = 1 << 30
        out = []
        for threads in (1, 2, 4, 8, 12, 16):
            t = time.perf_counter()
            self.memcpy_par(self.base, self.base + n, n, threads)
            out.append((threads, n / (time.perf_counter() - t) / 1e9))
        return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=16)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--piece-mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    p = Probe(args.gib, args.threads, args.piece_mib)
    print("memcpy host to host, 1 GiB:", ", ".join(f"{t} threads {g:.1f} GB/s"
                                                for t, g in p.memcpy_rates()), flush=True)
    rows = [("ceiling", lambda: p.ceiling()),
            ("pin", lambda: p.run(True, False)),
            ("inline", lambda: p.run(True, False, inline=True)),
            ("staged", lambda: p.run(False, True)),
            ("hybrid", lambda: p.run(True, True)),
            ("inl+stg", lambda: p.run(True, True, inline=True))]
    for name, fn in rows:
        for rep in range(args.reps):
            s, info = fn()
            print(f"{name:8s} rep {rep}: {s:.3f} s = {p.size / s / 1e9:5.1f} GB/s "
                  f"{info}", flush=True)
    for piece_mib in (64, 128, 512, 1024):
        p.piece = piece_mib * MiB
        p.pieces = [(off, min(p.piece, p.size - off)) for off in range(0, p.size, p.piece)]
        for rep in range(args.reps):
            s, info = p.run(True, False, inline=True)
            print(f"inline   pieces {piece_mib} MiB: {s:.3f} s = {p.size / s / 1e9:5.1f} GB/s "
                  f"{info}", flush=True)


if __name__ == "__main__":
    main()
