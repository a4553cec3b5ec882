#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The handover benchmark (issue 16): a trainer sleeps, a rollout engine in
another process takes the freed GPU memory, uses it and gives it back, the
trainer wakes. Driven over HTTP (dormant.client), as an orchestrator would.

Three processes:
  trainer  (--role trainer)  dormant-managed memory in the shape of a
           Megatron rank: "synthetic" has bf16 weights in one buffer (like
           DDP's param_data, kept), fp32 main params and Adam moments in
           many tensors (kept) and fp32 grads in one buffer (discarded), its
           step an Adam update; "mcore" is Megatron-core's own GPTModel with
           DDP and the distributed optimizer (tests/gpu/mcore.py). Serves
           dormant's HTTP API and takes commands on stdin (step, verify).
  rollout  (--role rollout)  a stand-in for vLLM/SGLang: takes all free GPU
           memory but a margin as its "KV cache" (--rollout-alloc torch:
           PyTorch's caching allocator, cudaMalloc, as vLLM without sleep
           mode; cumem: expandable segments, cuMemCreate + cuMemMap, as the
           cuMem allocators of vLLM's sleep mode and SGLang's
           torch_memory_saver), in --rollout-tensors tensors (one per layer,
           as engines do), writes it, computes on it, frees it
           (empty_cache) and stays alive (an engine keeps its context).
           --backend host: a CPU stand-in (no torch) that writes host memory
           while the trainer's simulated device is made full
           (dormant_debug_occupy through the trainer's stdin).
  driver   (default)  runs N phases: trainer step -> sleep -> rollout takes,
           uses -> (early wake: must get 503) -> rollout frees -> wake (a
           retrying client) -> verify every kept byte (a checksum taken
           before the sleep) -> next step.

Per phase it records sleep and wake seconds with their parts (the report's
"times": synchronize, host prep/pin, copies, release, create/map, waits),
their speed as a fraction of the pinned-copy ceiling measured in the same
run, the GPU memory each process holds awake and asleep (nvidia-smi), what
the sleeping trainer says it holds (a line "asleep:" per run: PyTorch's memory
inside and outside dormant's pools, its process groups, the NCCL communicators
it made, dormant's device and host bytes, and the rest of nvidia-smi's figure:
context, cuBLAS, NCCL), and what the rollout got. --overlap 1,0 runs the trainer twice, with and without
the wake's map-ahead thread (DORMANT_WAKE_OVERLAP), so one run shows both; a
value N above 1 maps ahead on N threads (DORMANT_WAKE_MAP_THREADS=N).

  python3 bench/handover.py [--trainer synthetic|mcore] [--kept-gb 15]
      [--phases 4] [--overlap 1,0] [--rollout-alloc torch|cumem] [--out DIR]
  python3 bench/handover.py --backend host --kept-gb 0.05 --phases 2   (CI)
prints a table, writes DIR/handover.json and DIR/handover.txt; exits 1 when
a correctness check failed (never for speed).
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "tests" / "gpu"))

GB = 1e9
MiB = 1 << 20
GiB = 1 << 30
TARGET_WAKE = 0.9
LINE_TIMEOUT_S = 240


# ---- shared ------------------------------------------------------------------

def say(*words):
    print(*words, flush=True)


def gpu_apps():
    """{pid: MiB} from nvidia-smi, or None without it."""
    if shutil.which("nvidia-smi") is None:
        return None
    p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                        "--format=csv,noheader,nounits"], capture_output=True, text=True)
    out = {}
    for line in p.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
            out[int(fields[0])] = int(fields[1])
    return out


def gpu_used_mib():
    if shutil.which("nvidia-smi") is None:
        return None
    p = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total",
                        "--format=csv,noheader,nounits"], capture_output=True, text=True)
    try:
        used, total = (int(x) for x in p.stdout.splitlines()[0].split(","))
        return {"used_mib": used, "total_mib": total}
    except (IndexError, ValueError):
        return None


# ---- what the trainer holds asleep ---------------------------------------------

def torch_memory(torch, pools, segments_of):
    """PyTorch's GPU memory on the current device, split into dormant's pools
    (pools: the glue's torch.cuda.MemPool objects; segments_of(pool): their
    segments as torch.cuda.memory_snapshot() describes them) and the rest: the
    memory PyTorch holds outside every region. Bytes. "outside_*" come from
    the snapshot's segments that belong to no dormant pool; "largest_outside"
    lists the biggest blocks in use there (what to look for: scratch buffers,
    cuBLAS workspaces, caches)."""
    pool_addrs = set()
    pool_reserved = pool_allocated = 0
    for pool in pools:
        for seg in segments_of(pool):
            pool_addrs.add(seg["address"])
            pool_reserved += seg.get("total_size", 0)
            pool_allocated += seg.get("allocated_size", 0)
    out = {"reserved": int(torch.cuda.memory_reserved()),
           "allocated": int(torch.cuda.memory_allocated()),
           "pools_reserved": pool_reserved, "pools_allocated": pool_allocated}
    outside_reserved = outside_allocated = 0
    blocks = []
    segments = 0
    for seg in torch.cuda.memory_snapshot():
        if seg["address"] in pool_addrs:
            continue
        segments += 1
        outside_reserved += seg.get("total_size", 0)
        outside_allocated += seg.get("allocated_size", 0)
        blocks += [b["size"] for b in seg.get("blocks", ()) if b.get("state") == "active_allocated"]
    out.update(outside_reserved=outside_reserved, outside_allocated=outside_allocated,
               outside_segments=segments, largest_outside=sorted(blocks, reverse=True)[:4])
    return out


def process_groups(torch):
    """{"count": process groups this process made, "backends": their names}:
    each NCCL group that a collective has used holds a communicator and its
    buffers, outside PyTorch's allocator."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return {"count": 0, "backends": []}
    pg_map = dist.distributed_c10d._world.pg_map
    names = sorted({str(v[0]) for v in pg_map.values()})
    return {"count": len(pg_map), "backends": names}


def process_rss(status="/proc/self/status"):
    """This process's resident host memory in bytes (VmRSS: pinned copies and
    NCCL's host buffers included once touched), or None where unreadable.
    Read from /proc, so it answers while the process is checkpointed."""
    try:
        with open(status) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_report(dm, torch=None, segments_of=None):
    """What the trainer holds, from its own side (asleep, the driver asks):
    dormant's numbers (device bytes it still holds, host bytes of the copies)
    and, with torch, PyTorch's memory inside and outside dormant's pools."""
    st = dm.stats()
    rep = {"dormant": {"device_bytes": st["totals"]["device_bytes"],
                       "host_bytes": st["totals"]["host_bytes"],
                       "managed_bytes": sum(d["managed_bytes"] for d in st["devices"])}}
    residue = st.get("residue") or {}
    rep["residue"] = {k: residue.get(k) for k in ("mode", "state", "residue_bytes", "last")}
    rss = process_rss()
    if rss is not None:
        rep["process"] = {"rss_bytes": rss}
    if STACK_TRIM:
        rep["stack_limit"] = dict(STACK_TRIM)
    # checkpointed (residue mode): a CUDA call would wait for the wake
    if torch is None or residue.get("state") == "checkpointed":
        return rep
    try:
        glue = dm._torch
        pools = [] if glue is None else list(glue.pools.values()) + list(glue.policy_pools.values())
        if segments_of is None:
            from dormant._torch import pool_segments as segments_of
        rep["torch"] = torch_memory(torch, pools, segments_of)
        rep["groups"] = process_groups(torch)
    except Exception as e:  # a report, never a failure of the trainer
        rep["torch_error"] = f"{type(e).__name__}: {e}"[:300]
    return rep


# ---- the trainer ---------------------------------------------------------------

class SyntheticTrainer:
    """A Megatron rank's memory, without Megatron: n parameters in `layers`
    layers. weights: bf16, one buffer (DDP's param_data); grads: fp32, one
    buffer (DDP's grad_data), discarded; optimizer: per layer fp32 main
    params, exp_avg, exp_avg_sq (Adam's state, many tensors)."""

    def __init__(self, dm, kept_bytes, layers):
        import torch
        self.torch = torch
        self.dm = dm
        n = int(kept_bytes / 14) // layers * layers   # 2 + 3 * 4 bytes kept per param
        self.n, self.layers = n, layers
        per = n // layers
        dm.set_policy("grads", "discard")
        with dm.region("weights"):
            self.weights = torch.empty(n, dtype=torch.bfloat16, device="cuda")
        with dm.region("grads"):
            self.grads = torch.zeros(n, dtype=torch.float32, device="cuda")
        g = torch.Generator(device="cuda").manual_seed(1234)
        with dm.region("optimizer"):
            self.main = [torch.empty(per, device="cuda").normal_(0, 0.02, generator=g)
                         for _ in range(layers)]
            self.m = [torch.zeros(per, device="cuda") for _ in range(layers)]
            self.v = [torch.zeros(per, device="cuda") for _ in range(layers)]
        for i in range(layers):
            self.weights[i * per:(i + 1) * per].copy_(self.main[i])
        self.tags = ["weights", "grads", "optimizer"]
        self.steps = 0
        torch.cuda.synchronize()

    def step(self):
        """A fake backward (grads from the weights) and an Adam update; its
        temporaries come from PyTorch's ordinary memory, as a real step's."""
        torch = self.torch
        per = self.n // self.layers
        self.steps += 1
        with torch.no_grad():
            for i in range(self.layers):
                w = self.weights[i * per:(i + 1) * per]
                g = self.grads[i * per:(i + 1) * per]
                g.copy_(w.float().mul_(1e-2).add_(1e-3 * self.steps))
                self.m[i].mul_(0.9).add_(g, alpha=0.1)
                self.v[i].mul_(0.999).addcmul_(g, g, value=1e-3)
                self.main[i].addcdiv_(self.m[i], self.v[i].sqrt().add_(1e-8), value=-1e-4)
                w.copy_(self.main[i])
        torch.cuda.synchronize()
        return self.steps

    def kept_tensors(self):
        return [self.weights] + self.main + self.m + self.v

    def pointers(self):
        return [t.data_ptr() for t in self.kept_tensors() + [self.grads]]

    def param_count(self):
        return self.n


class McoreTrainer:
    """tests/gpu/mcore.py's Megatron-core trainer, sized by --mcore-*."""

    def __init__(self, dm, args):
        import mcore
        mcore.add_megatron_to_path()
        reason = mcore.why_megatron_is_missing()
        if reason:
            raise RuntimeError(reason)
        import torch
        self.torch = torch
        cfg = mcore.ModelConfig(layers=args.mcore_layers, hidden=args.mcore_hidden,
                                heads=args.mcore_heads, ffn=4 * args.mcore_hidden,
                                vocab=32768, seq=1024, batch=2)
        self.t = mcore.McoreTrainer(dm, cfg, prefix="")
        self.tags = self.t.tags.all()
        self.batches = self.t.batches(10000)
        self.steps = 0
        self.step()   # creates Adam's state

    def step(self):
        x, y = next(self.batches)
        with self.t.dm.step():
            self.t.train_step(x, y)
        self.torch.cuda.synchronize()
        self.steps += 1
        return self.steps

    def kept_tensors(self):
        return ([b.param_data for b in self.t.buffers()] + list(self.t.main_params()) +
                list(self.t.state_tensors()))

    def pointers(self):
        p = self.t.pointers()
        return [x for k in sorted(p) for x in p[k]]

    def param_count(self):
        return self.t.param_count()


def gpu_digest(torch, tensors, slice_elems=16 << 20):
    """A checksum of every byte of tensors, on the GPU: per slice of 32-bit
    words, their sum, and the sums weighted by the slice's position, so a
    slice zero-filled or restored at the wrong offset changes it."""
    total = weighted = 0
    k = 0
    for t in tensors:
        flat = t.detach().reshape(-1)
        nbytes = flat.numel() * flat.element_size()
        words = flat.view(torch.uint8)[: nbytes // 4 * 4].view(torch.int32)
        for i in range(0, words.numel(), slice_elems):
            s = int(words[i:i + slice_elems].to(torch.int64).sum().item())
            k += 1
            total += s
            weighted += s * k
        tail = flat.view(torch.uint8)[nbytes // 4 * 4:]
        if tail.numel():
            total += int(tail.to(torch.int64).sum().item())
    return f"{total & (2**64 - 1):016x}{weighted & (2**64 - 1):016x}"


class HostTrainer:
    """The CPU stand-in's trainer: the same tags on dormant's host backend,
    written and checked through copy_to_device/copy_to_host."""

    def __init__(self, dm, kept_bytes, layers):
        self.dm = dm
        per = max(4096, int(kept_bytes / 14) // layers)
        self.n, self.layers = per * layers, layers
        dm.set_policy("grads", "discard")
        self.weights = dm.alloc("weights", 2 * self.n)
        self.grads = dm.alloc("grads", 4 * self.n)
        self.opt = [dm.alloc("optimizer", 4 * per) for _ in range(3 * layers)]
        self.sizes = {self.weights: 2 * self.n, self.grads: 4 * self.n}
        self.sizes.update({p: 4 * per for p in self.opt})
        self.tags = ["weights", "grads", "optimizer"]
        self.steps = 0
        self.step()

    def step(self):
        self.steps += 1
        for i, ptr in enumerate([self.weights] + self.opt):
            size = self.sizes[ptr]
            pattern = bytes([(self.steps * 31 + i * 7 + j) & 0xFF for j in range(251)])
            self.dm.copy_to_device(ptr, (pattern * (size // 251 + 1))[:size])
        return self.steps

    def digest(self):
        import hashlib
        h = hashlib.sha256()
        for ptr in [self.weights] + self.opt:
            h.update(self.dm.copy_to_host(ptr, self.sizes[ptr]))
        return h.hexdigest()

    def pointers(self):
        return [self.weights, self.grads] + self.opt

    def param_count(self):
        return self.n


def corrupt(t):
    """Change one kept byte (tests of the benchmark's own check)."""
    if isinstance(t, HostTrainer):
        b = t.dm.copy_to_host(t.weights, 1)
        t.dm.copy_to_device(t.weights, bytes([b[0] ^ 1]))
    else:
        t.kept_tensors()[0].view(-1)[7] += 1


# --trim-stack: the stack limit before and after the last trim (the trainer's)
STACK_TRIM = {}


def trim_stack(torch, nbytes):
    """Set the current context's stack limit (CU_LIMIT_STACK_SIZE, bytes per
    thread) to nbytes once the device is idle; the driver then holds local
    memory for that much, no longer for the hungriest kernel launched so far
    (a later launch that needs more grows it again). Into STACK_TRIM."""
    import ctypes
    torch.cuda.synchronize()
    cuda = ctypes.CDLL("libcuda.so.1")
    before, after = ctypes.c_size_t(0), ctypes.c_size_t(0)
    r = cuda.cuCtxGetLimit(ctypes.byref(before), 0)           # CU_LIMIT_STACK_SIZE
    if r == 0:
        r = cuda.cuCtxSetLimit(0, ctypes.c_size_t(nbytes))
    if r == 0:
        r = cuda.cuCtxGetLimit(ctypes.byref(after), 0)
    STACK_TRIM.update(before=before.value, after=after.value, result=r)


def one_rank_cap():
    """The NCCL cap dormant.nccl put on this process's one-rank groups, or
    None (none in force, or no torch.distributed loaded)."""
    dist = sys.modules.get("torch.distributed")
    state = getattr(getattr(dist, "new_group", None), "_dormant_lean", None)
    return None if state is None else state.get("max_ctas")


def trainer_main(args):
    import dormant
    options = {"host_device_bytes": args.host_device_bytes} if args.backend == "host" else {}
    if args.host_mode:  # else the library's: release, reclaimable with residue=checkpoint
        options["host_mode"] = args.host_mode
    dm = dormant.Manager(backend=args.backend, **options)
    t0 = time.perf_counter()
    if args.backend == "host":
        t = HostTrainer(dm, args.kept_gb * GB, args.layers)
        digest = t.digest
    elif args.trainer == "mcore":
        t = McoreTrainer(dm, args)
        digest = lambda: gpu_digest(t.torch, t.kept_tensors())  # noqa: E731
    else:
        t = SyntheticTrainer(dm, args.kept_gb * GB, args.layers)
        t.step()
        digest = lambda: gpu_digest(t.torch, t.kept_tensors())  # noqa: E731
    server = dm.serve("127.0.0.1", 0, quiet=True)
    build_s = time.perf_counter() - t0
    st = dm.stats()
    say("READY " + json.dumps({
        "url": server.url, "pid": os.getpid(), "params": t.param_count(),
        "tags": t.tags, "build_s": build_s, "device_bytes": st["totals"]["device_bytes"],
        "by_tag": {x["tag"]: x["bytes"] for x in st["tags"]},
        "wake_overlap": os.environ.get("DORMANT_WAKE_OVERLAP", "1") != "0",
        "one_rank_ctas": one_rank_cap(), "host_mode": dm.host_mode,
    }))
    expected = pointers = None
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        cmd = words[0]
        try:
            if cmd == "step":
                if args.trainer == "mcore" and args.backend != "host":
                    n = t.step()          # guarded inside
                else:
                    with dm.step():
                        n = t.step()
                expected, pointers = digest(), t.pointers()
                if args.trim_stack and args.backend != "host":
                    trim_stack(t.torch, args.trim_stack)
                say(f"STEPPED {n} {expected}")
            elif cmd == "verify":
                if args.test_corrupt_step == getattr(t, "steps", None):
                    corrupt(t)             # tests: the check must see it
                got = digest()
                same_ptrs = t.pointers() == pointers
                ok = got == expected and same_ptrs
                say(f"VERIFIED {'ok' if ok else 'MISMATCH'} {expected} {got} "
                    f"{'same-addresses' if same_ptrs else 'MOVED'}")
            elif cmd == "memory":          # asleep: what is held, from inside
                say("MEMORY " + json.dumps(memory_report(
                    dm, None if args.backend == "host" else t.torch)))
            elif cmd == "occupy":          # the CPU stand-in's rollout (host backend)
                dm.debug_occupy(int(words[1]))
                say(f"OCCUPIED {words[1]}")
            elif cmd == "empty_cache":
                import torch
                torch.cuda.empty_cache()
                say("EMPTIED")
            elif cmd == "quit":
                break
            else:
                say(f"ERROR unknown command {cmd}")
        except Exception as e:  # the driver reports it; the trainer goes on
            say(f"ERROR {type(e).__name__}: {str(e)[:300]}".replace("\n", " "))
    server.stop()
    sys.stdout.flush()
    os._exit(0)  # no teardown: PyTorch would free into a manager being destroyed


# ---- the rollout ----------------------------------------------------------------

def rollout_main(args):
    """Takes, uses and frees the GPU's free memory on command."""
    if args.rollout_alloc == "cumem":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import torch
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()     # cuBLAS up, as an engine's would be
    say(f"READY {json.dumps({'pid': os.getpid()})}")
    held = []
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "take":
            held, info = rollout_take(args, torch, a)
            say("HELD " + json.dumps(info))
        elif cmd == "free":
            t0 = time.perf_counter()
            held.clear()              # the tensors go: nothing else holds them
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            say("FREED " + json.dumps({"free_s": time.perf_counter() - t0,
                                       "free_after": torch.cuda.mem_get_info()[0]}))
        elif cmd == "quit":
            break
    os._exit(0)


def rollout_take(args, torch, a):
    """Take all free memory but the margin, write it, compute on it; returns
    (the tensors, what it did). Nothing else keeps a reference to them once
    the caller drops the list."""
    t0 = time.perf_counter()
    free, total = torch.cuda.mem_get_info()
    want = max(0, free - args.margin_mib * MiB)
    per = max(2 * MiB, want // args.rollout_tensors // (2 * MiB) * (2 * MiB))
    held = []
    got = 0
    while got + per <= want:
        try:
            held.append(torch.empty(per, dtype=torch.uint8, device="cuda"))
            got += per
        except torch.cuda.OutOfMemoryError:
            break
    torch.cuda.synchronize()
    take_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i, h in enumerate(held):
        h.fill_(i & 0xFF)             # write all of it (the KV cache filling)
    torch.cuda.synchronize()
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    # read all of it (sums that allocate nothing large), and matmuls
    sums = [torch.sum(h.view(torch.float16)) for h in held]
    check = sum(int(x.item() != 0) for x in sums)
    side = 4096
    for h in held[:8]:
        if h.numel() >= 2 * side * side:
            m = h[:2 * side * side].view(torch.bfloat16).view(side, side)
            torch.mm(m, m, out=a)
    torch.cuda.synchronize()
    compute_s = time.perf_counter() - t0
    return held, {"bytes": got, "tensors": len(held), "free_before": free,
                  "nonzero_sums": check, "total": total, "take_s": take_s,
                  "write_s": write_s, "compute_s": compute_s,
                  "free_after": torch.cuda.mem_get_info()[0]}


class HostRollout:
    """The CPU stand-in: writes and reads host memory, while the trainer's
    simulated device is made full (another process holding the memory)."""

    def __init__(self, trainer, device_bytes, margin):
        self.trainer = trainer
        self.device_bytes = device_bytes
        self.margin = margin
        self.buf = None
        self.pid = None

    def take(self):
        t0 = time.perf_counter()
        r = self.trainer.ask(f"occupy {self.device_bytes - self.margin}", "OCCUPIED")
        n = int(r[0])
        self.buf = bytearray(min(n, 64 * MiB))
        take_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.buf[:] = b"\x5a" * len(self.buf)
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ok = self.buf.count(0x5a) == len(self.buf)
        return {"bytes": n, "tensors": 1, "take_s": take_s, "write_s": write_s,
                "compute_s": time.perf_counter() - t0, "check": ok}

    def free(self):
        t0 = time.perf_counter()
        self.buf = None
        self.trainer.ask("occupy 0", "OCCUPIED")
        return {"free_s": time.perf_counter() - t0}

    def close(self):
        pass


# ---- the driver -------------------------------------------------------------------

_children = []   # every Proc started: killed if the driver is stopped


def _stop_children(signum, frame):
    """SIGTERM (timeout(1)) or SIGINT: the children must not outlive the
    driver, holding GPU memory the next run needs."""
    for child in _children:
        if child.p.poll() is None:
            child.p.kill()
    os._exit(128 + signum)


class Proc:
    """A child speaking the line protocol above."""

    def __init__(self, name, cmd, env, log):
        self.name = name
        self.log = open(log, "w")
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.log, text=True, env=env)
        _children.append(self)
        self.pid = self.p.pid
        self.lines = []
        self.cond = threading.Condition()
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        for line in self.p.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.lines.append(None)
            self.cond.notify_all()

    def expect(self, word, timeout=LINE_TIMEOUT_S):
        """The next line starting with word; raise on ERROR, exit, timeout."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                while self.lines:
                    line = self.lines.pop(0)
                    if line is None:
                        self.lines.append(None)
                        raise RuntimeError(f"{self.name} exited ({self.p.wait()}); "
                                           f"see {self.log.name}")
                    if line.startswith(word + " ") or line == word:
                        return line.split(" ", 1)[1] if " " in line else ""
                    if line.startswith("ERROR"):
                        raise RuntimeError(f"{self.name}: {line}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"{self.name}: no {word} within {timeout} s")
                self.cond.wait(left)

    def send(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def ask(self, line, word, timeout=LINE_TIMEOUT_S):
        self.send(line)
        return self.expect(word, timeout).split()

    def close(self):
        try:
            self.send("quit")
            self.p.wait(timeout=30)
        except Exception:
            self.p.kill()
            self.p.wait()
        self.log.close()


class GpuRollout:
    def __init__(self, args, env, log):
        cmd = [sys.executable, __file__, "--role", "rollout", "--margin-mib",
               str(args.margin_mib), "--rollout-alloc", args.rollout_alloc,
               "--rollout-tensors", str(args.rollout_tensors)]
        self.proc = Proc("rollout", cmd, env, log)
        self.pid = self.proc.pid
        self.proc.expect("READY")

    def take(self):
        self.proc.send("take")
        return json.loads(self.proc.expect("HELD"))

    def free(self):
        self.proc.send("free")
        return json.loads(self.proc.expect("FREED"))

    def close(self):
        self.proc.close()


def pinned_ceiling(backend):
    """Best GB/s of one pinned 1 GiB copy each way (as the other benches)."""
    if backend == "host":
        return {"d2h": 0.0, "h2d": 0.0}
    # In a process of its own: this one must hold no GPU memory (nor a
    # context) that the rollout could otherwise have.
    p = subprocess.run([sys.executable, "-c", "import json, sys; sys.path.insert(0, sys.argv[1]); "
                        "import megatron_core; print(json.dumps(megatron_core.pinned_ceiling()))",
                        str(HERE)], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"measuring the pinned-copy ceiling failed: {p.stderr[-500:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def transition(client, action, tags):
    """One sleep or wake over HTTP: (RankResult, report dict)."""
    r = (client.sleep(tags) if action == "sleep" else client.wake(tags))[0]
    report = r.body if r.ok else ((r.problem or {}).get("report") or {})
    return r, report


# Every part of a report's "times" (openapi.yaml's TransitionTimes), in the
# JSON of each phase; the tables show those of each way (a sleep maps nothing).
PARTS = ("sync_s", "setup_s", "checksum_s", "host_prep_s", "host_pin_s", "host_wait_s",
         "copy_s", "release_s", "map_s", "map_wait_s", "zero_wait_s", "comms_s", "rebuild_s",
         "warmup_wait_s")
# (column, part): the handover's two halves as columns. "free" is the
# rollout's own (its free and empty_cache, timed in its process), "verify" the
# wake's wait for the last checksums, "NCCL" the communicators' suspend/resume
# hooks (comms_s), "residue" the process checkpoint at the sleep's end and
# the restore at the wake's start (residue mode checkpoint; 0 otherwise).
SLEEP_COLUMNS = (("sync", "sync_s"), ("setup", "setup_s"), ("checksum", "checksum_s"),
                 ("host prep", "host_prep_s"), ("pin", "host_pin_s"),
                 ("host wait", "host_wait_s"), ("copy", "copy_s"), ("release", "release_s"),
                 ("NCCL", "comms_s"), ("warm-up", "warmup_wait_s"), ("residue", "residue_s"))
WAKE_COLUMNS = (("free", None), ("residue", "residue_s"), ("setup", "setup_s"), ("map", "map_s"),
                ("map wait", "map_wait_s"), ("copy", "copy_s"), ("zero wait", "zero_wait_s"),
                ("verify", "checksum_s"), ("NCCL", "comms_s"), ("rebuild", "rebuild_s"),
                ("warm-up", "warmup_wait_s"))


def part_row(report):
    t = report.get("times") or {}
    row = {k: t.get(k, 0.0) for k in PARTS}
    # residue mode checkpoint: the checkpoint (sleep) or restore (wake)
    residue = report.get("residue") or {}
    row["residue_s"] = residue.get("seconds") or 0.0
    row["residue_action"] = residue.get("action", "none")
    row["residue_result"] = residue.get("result", "ok")
    return row


def trainer_env(args, overlap, out, label):
    """The trainer process's environment for one run."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO / "python") + (":" + env["PYTHONPATH"]
                                                 if env.get("PYTHONPATH") else "")
    env["DORMANT_WAKE_OVERLAP"] = "1" if overlap else "0"
    env.pop("DORMANT_WAKE_MAP_THREADS", None)
    if overlap > 1:
        env["DORMANT_WAKE_MAP_THREADS"] = str(overlap)
    if getattr(args, "wake_copy", None):  # a Namespace of the tests may lack it
        env["DORMANT_WAKE_COPY"] = args.wake_copy
    if args.no_empty_cache:
        env["DORMANT_TORCH_EMPTY_CACHE"] = "0"
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if args.trainer == "mcore" and args.backend != "host":
        # NCCL logs each communicator it makes: how many hold buffers asleep
        # (Megatron makes its process groups even on one rank). Into a file:
        # NCCL's default is stdout, the line protocol's channel.
        env["NCCL_DEBUG"] = "INFO"
        env["NCCL_DEBUG_SUBSYS"] = "INIT"
        env["NCCL_DEBUG_FILE"] = str(out / f"nccl-{label}.log")
    return env


def run_trainer(args, overlap, ceiling, out, checks):
    """overlap: 0 (map every chunk first), 1 (map ahead on a thread) or N
    (map ahead on N threads)."""
    """One trainer process through args.phases handovers; its result dict."""
    from dormant.client import Client
    kind = "host" if args.backend == "host" else args.trainer
    label = f"{kind}-map{overlap}" if overlap > 1 else f"{kind}-overlap{overlap}"
    env = trainer_env(args, overlap, out, label)
    cmd = [sys.executable, __file__, "--role", "trainer", "--backend", args.backend,
           "--trainer", args.trainer, "--kept-gb", str(args.kept_gb), "--layers",
           str(args.layers), "--host-device-bytes",
           str(args.host_device_bytes), "--mcore-layers", str(args.mcore_layers),
           "--mcore-hidden", str(args.mcore_hidden), "--mcore-heads", str(args.mcore_heads)]
    if getattr(args, "host_mode", None):  # a Namespace of the tests may lack it
        cmd += ["--host-mode", args.host_mode]
    if args.test_corrupt_step is not None:
        cmd += ["--test-corrupt-step", str(args.test_corrupt_step)]
    if getattr(args, "trim_stack", 0):  # a Namespace of the tests may lack it
        cmd += ["--trim-stack", str(args.trim_stack)]
    trainer = Proc("trainer", cmd, env, out / f"trainer-{label}.log")
    rollout = None
    result = {"label": label, "trainer": args.trainer, "wake_overlap": overlap > 0,
              "map_threads": max(overlap, 1), "phases": []}
    try:
        ready = json.loads(trainer.expect("READY"))
        result.update(params=ready["params"], build_s=ready["build_s"],
                      device_bytes=ready["device_bytes"], by_tag=ready["by_tag"],
                      one_rank_ctas=ready.get("one_rank_ctas"), host_mode=ready.get("host_mode"))
        url = ready["url"]
        once = Client([url], retries=0, raise_on_error=False, timeout=120)
        retrying = Client([url], retries=60, backoff=0.05, max_delay=0.5,
                          raise_on_error=False, timeout=120)
        if args.backend == "host":
            rollout = HostRollout(trainer, args.host_device_bytes, args.host_rollout_leave)
        else:
            rollout = GpuRollout(args, env, out / f"rollout-{label}.log")
        tags = None  # every tag
        for phase in range(1, args.phases + 1):
            row = {"phase": phase}
            row["step"] = int(trainer.ask("step", "STEPPED")[0])
            apps = gpu_apps()
            row["trainer_awake_mib"] = apps.get(trainer.pid) if apps else None
            r, rep = transition(once, "sleep", tags)
            if not r.ok:
                raise RuntimeError(f"sleep failed: {r.error}")
            row["sleep_s"] = rep["duration_s"]
            row["sleep_bytes"] = rep["bytes_copied"]
            row["sleep_parts"] = part_row(rep)
            apps = gpu_apps()
            # not listed while nvidia-smi lists others (the rollout, at
            # least): it holds nothing (its residue checkpointed)
            row["trainer_asleep_mib"] = apps.get(trainer.pid, 0) if apps else None
            row["rollout_idle_mib"] = apps.get(rollout.pid) if apps and rollout.pid else None
            try:
                trainer.send("memory")
                row["trainer_memory_asleep"] = json.loads(trainer.expect("MEMORY"))
            except (RuntimeError, ValueError) as e:
                row["trainer_memory_asleep"] = {"error": str(e)[:300]}
            held = rollout.take()
            row["rollout"] = held
            apps = gpu_apps()
            row["rollout_holding_mib"] = apps.get(rollout.pid) if apps and rollout.pid else None
            row["gpu"] = gpu_used_mib()
            if phase <= args.early_wake_phases:
                # issue 16 §4: a wake while the rollout still holds memory
                r, rep = transition(once, "wake", tags)
                ok = r.status == 503
                checks.append((f"{label} phase {phase}: early wake answered 503", ok,
                               f"HTTP {r.status}: {r.error}"))
                row["early_wake"] = {"status": r.status, "error": r.error,
                                     "seconds": rep.get("duration_s")}
                # the retrying wake, while the rollout frees a moment later
                freed = {}

                def free_later():
                    time.sleep(0.3)
                    freed.update(rollout.free())
                th = threading.Thread(target=free_later)
                th.start()
                r, rep = transition(retrying, "wake", tags)
                th.join()
                checks.append((f"{label} phase {phase}: the wake retried until the rollout "
                               f"freed, then succeeded", r.ok and r.attempts > 1,
                               f"ok={r.ok} attempts={r.attempts} {r.error or ''}"))
                row["wake_attempts"] = r.attempts
                row["rollout_free"] = freed
            else:
                row["rollout_free"] = rollout.free()
                if args.wake_delay_s > 0:
                    time.sleep(args.wake_delay_s)  # let the driver finish with the freed memory
                r, rep = transition(once, "wake", tags)
                row["wake_attempts"] = 1
            if not r.ok:
                raise RuntimeError(f"wake failed: {r.error}")
            row["wake_s"] = rep["duration_s"]
            row["wake_bytes"] = rep["bytes_copied"]
            row["wake_mapped"] = rep["bytes_mapped"]
            row["wake_zeroed"] = rep["bytes_zeroed"]
            row["wake_parts"] = part_row(rep)
            row["wake_copy"] = rep.get("wake_copy")
            v = trainer.ask("verify", "VERIFIED")
            row["verified"] = v[0] == "ok"
            checks.append((f"{label} phase {phase}: every kept byte back, same addresses",
                           v[0] == "ok", " ".join(v)))
            result["phases"].append(row)
            say(f"  {label} phase {phase}: sleep {row['sleep_s']:.3f} s, wake "
                f"{row['wake_s']:.3f} s (map {row['wake_parts']['map_s']:.3f}, copy "
                f"{row['wake_parts']['copy_s']:.3f}, map wait "
                f"{row['wake_parts']['map_wait_s']:.3f}), rollout got "
                f"{held['bytes'] / GiB:.1f} GiB, verified {v[0]}")
        row = {"step": int(trainer.ask("step", "STEPPED")[0])}   # trains on after the last
        checks.append((f"{label}: a step after the last wake", True, ""))
    except Exception as e:
        why = str(e)
        for name in ("trainer", "rollout"):   # what the children said last
            log = out / f"{name}-{label}.log"
            if log.exists():
                tail = [l for l in log.read_text(errors="replace").splitlines() if l.strip()]
                if tail:
                    why += f" | {name} log: " + " / ".join(tail[-3:])[:400]
        result["error"] = why[:900]
        checks.append((f"{label}: ran all phases", False, why[:600]))
    finally:
        if rollout is not None:
            rollout.close()
        trainer.close()
    result["nccl_comms"] = nccl_comms(out / f"nccl-{label}.log")
    return summarize(result, ceiling)


def nccl_comms(log):
    """Communicators NCCL says it made (NCCL_DEBUG=INFO: one "Init COMPLETE"
    line each) in its log file; None without one (no NCCL in that trainer)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    if "NCCL INFO" not in text:
        return None
    return sum("Init COMPLETE" in line for line in text.splitlines())


def summarize(r, ceiling):
    phases = r["phases"]
    if not phases:
        return r
    steady = phases[1:] or phases
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    r["sleep_s"] = med([p["sleep_s"] for p in steady])
    r["wake_s"] = med([p["wake_s"] for p in steady])
    r["sleep_bytes"] = steady[-1]["sleep_bytes"]
    r["wake_bytes"] = steady[-1]["wake_bytes"]
    for way, key, cap in (("sleep", "sleep_s", "d2h"), ("wake", "wake_s", "h2d")):
        gbps = r[f"{way}_bytes"] / r[key] / GB if r[key] else 0.0
        r[f"{way}_gbps"] = gbps
        r[f"{way}_ratio"] = gbps / ceiling[cap] if ceiling[cap] else None
    for way in ("sleep", "wake"):
        # numbers as medians; words (the residue's action, its result)
        # as the last steady phase said them
        r[f"{way}_parts"] = {k: med([p[f"{way}_parts"][k] for p in steady])
                             if isinstance(v, (int, float)) else steady[-1][f"{way}_parts"][k]
                             for k, v in steady[0][f"{way}_parts"].items()}
        # the first phase apart: a cold sleep's setup and host copies
        r[f"first_{way}_parts"] = dict(phases[0][f"{way}_parts"])
        r[f"first_{way}_s"] = phases[0][f"{way}_s"]
    r["first_rollout_free_s"] = phases[0]["rollout_free"].get("free_s", 0.0)
    for k in ("trainer_awake_mib", "trainer_asleep_mib", "rollout_idle_mib",
              "rollout_holding_mib"):
        vals = [p[k] for p in steady if p.get(k) is not None]
        r[k] = med(vals)
    r["memory_asleep"] = memory_summary([p.get("trainer_memory_asleep") or {} for p in steady])
    r["rollout_bytes"] = med([p["rollout"]["bytes"] for p in steady])
    r["rollout_take_s"] = med([p["rollout"]["take_s"] for p in steady])
    r["rollout_free_s"] = med([p["rollout_free"].get("free_s", 0.0) for p in steady])
    return r


def memory_summary(reports):
    """Medians over phases of memory_report()'s figures (bytes), flattened:
    torch_reserved, torch_outside_reserved, ..., dormant_device_bytes."""
    out = {}
    keys = ("reserved", "allocated", "pools_reserved", "pools_allocated", "outside_reserved",
            "outside_allocated", "outside_segments")
    for k in keys:
        vals = [m["torch"][k] for m in reports if "torch" in m]
        if vals:
            out["torch_" + k] = statistics.median(vals)
    for k in ("device_bytes", "host_bytes", "managed_bytes"):
        vals = [m["dormant"][k] for m in reports if "dormant" in m]
        if vals:
            out["dormant_" + k] = statistics.median(vals)
    vals = [m["process"]["rss_bytes"] for m in reports if "process" in m]
    if vals:
        out["process_rss_bytes"] = statistics.median(vals)
    trims = [m["stack_limit"] for m in reports if "stack_limit" in m]
    if trims:
        out["stack_limit"] = trims[-1]
    last = next((m for m in reversed(reports) if "torch" in m), None)
    if last is not None:
        out["largest_outside"] = last["torch"]["largest_outside"]
        out["groups"] = last.get("groups")
    errors = [m.get("torch_error") or m.get("error") for m in reports
              if m.get("torch_error") or m.get("error")]
    if errors:
        out["error"] = errors[-1]
    return out


def memory_line(r):
    """One line per run: the trainer asleep, nvidia-smi's figure split into
    what PyTorch holds outside dormant's pools and the rest (the CUDA context,
    cuBLAS's handles, NCCL's communicators: outside PyTorch's allocator)."""
    m = r.get("memory_asleep") or {}
    mib = lambda b: f"{b / MiB:.0f}"  # noqa: E731
    parts = []
    if "torch_reserved" in m:
        outside = m["torch_outside_reserved"]
        parts.append(f"torch reserved {mib(m['torch_reserved'])} MiB, in dormant's pools "
                     f"{mib(m['torch_pools_reserved'])}, outside {mib(outside)} MiB "
                     f"({mib(m['torch_outside_allocated'])} in use, "
                     f"{m['torch_outside_segments']:.0f} segments; largest "
                     f"{', '.join(mib(b) for b in m.get('largest_outside') or []) or '-'} MiB)")
        if r.get("trainer_asleep_mib") is not None:
            rest = r["trainer_asleep_mib"] - (outside + m.get("dormant_device_bytes", 0)) / MiB
            parts.append(f"the rest of nvidia-smi's {r['trainer_asleep_mib']:.0f} MiB "
                         f"(context, cuBLAS's handles, NCCL): {rest:.0f} MiB")
        g = m.get("groups") or {}
        if g.get("count"):
            parts.append(f"process groups {g['count']} ({'/'.join(g['backends'])})")
    if r.get("nccl_comms") is not None:
        parts.append(f"NCCL communicators made {r['nccl_comms']}")
    if r.get("one_rank_ctas") is not None:
        parts.append(f"one-rank NCCL groups capped at {r['one_rank_ctas']} CTAs")
    if "dormant_device_bytes" in m:
        parts.append(f"dormant holds {mib(m['dormant_device_bytes'])} MiB on the device, "
                     f"{mib(m['dormant_host_bytes'])} MiB of host copies")
    if "process_rss_bytes" in m:
        parts.append(f"process resident on the host {mib(m['process_rss_bytes'])} MiB")
    if "stack_limit" in m:
        t = m["stack_limit"]
        parts.append(f"stack limit trimmed from {t['before']} to {t['after']} B per thread"
                     if t["result"] == 0 else f"stack limit not trimmed (CUDA error {t['result']})")
    if m.get("error"):
        parts.append(f"report failed: {m['error']}")
    return f"{r['label'][:20]:20s} asleep: " + "; ".join(parts or ["no report"])


def fmt(x, spec, none="-"):
    if x is None:
        return none
    return format(round(x) if spec.endswith("d") else x, spec)


def table(results, ceiling, args):
    lines = []
    if ceiling["h2d"]:
        lines.append(f"pinned ceiling: device->host {ceiling['d2h']:.1f} GB/s, host->device "
                     f"{ceiling['h2d']:.1f} GB/s (1 GiB, best of 5)")
    lines.append(f"{'run':20s} {'kept GB':>7s} {'sleep s':>7s} {'ratio':>5s} {'wake s':>7s} "
                 f"{'ratio':>5s} {'awake MiB':>9s} {'asleep MiB':>10s} {'rollout GiB':>11s} "
                 f"{'idle MiB':>8s} {'take s':>6s} {'free s':>6s}")
    for r in results:
        if "sleep_s" not in r:
            lines.append(f"{r['label']:20s} ERROR {r.get('error', 'no phase ran')}")
            continue
        lines.append(f"{r['label']:20s} {r['wake_bytes'] / GB:7.2f} {r['sleep_s']:7.3f} "
                     f"{fmt(r['sleep_ratio'], '5.2f')} {r['wake_s']:7.3f} "
                     f"{fmt(r['wake_ratio'], '5.2f')} {fmt(r['trainer_awake_mib'], '9d')} "
                     f"{fmt(r['trainer_asleep_mib'], '10d')} "
                     f"{r['rollout_bytes'] / GiB:11.1f} {fmt(r['rollout_idle_mib'], '8d')} "
                     f"{r['rollout_take_s']:6.2f} {r['rollout_free_s']:6.2f}")
    for r in results:
        if "sleep_s" in r:
            lines.append(memory_line(r))
    lines.extend(parts_table(results))
    if results and "params" in results[0]:
        lines.append(f"{results[0]['params'] / 1e6:.0f} M parameters; {args.phases} phases, "
                     f"medians of the phases after the first; rollout: {args.rollout_alloc} in "
                     f"{args.rollout_tensors} tensors, margin {args.margin_mib} MiB; host mode "
                     f"{results[0].get('host_mode') or args.host_mode}; "
                     f"wake target >= {TARGET_WAKE} of the ceiling")
    return "\n".join(lines)


def parts_table(results):
    """The handover by part, seconds: the sleep's parts, then the wake's with
    the rollout's free before it; per run the first phase (cold: the device
    set up, host copies made) and the median of the others."""
    lines = []
    for way, columns in (("sleep", SLEEP_COLUMNS), ("wake", WAKE_COLUMNS)):
        lines.append(f"{way} parts (s)           " +
                     " ".join(f"{name:>9s}" for name, _ in columns) + f" {'total':>9s}")
        for r in results:
            if f"{way}_parts" not in r:
                continue
            for which, parts, total, free in (
                    ("first", r[f"first_{way}_parts"], r[f"first_{way}_s"],
                     r["first_rollout_free_s"]),
                    ("median", r[f"{way}_parts"], r[f"{way}_s"], r["rollout_free_s"])):
                cells = [free if key is None else parts.get(key, 0.0) for _, key in columns]
                lines.append(f"{r['label'][:20]:20s} {which:6s}" +
                             " ".join(f"{c:9.4f}" for c in cells) + f" {total:9.4f}")
    return lines


def driver_main(args):
    import signal
    signal.signal(signal.SIGTERM, _stop_children)
    signal.signal(signal.SIGINT, _stop_children)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ceiling = pinned_ceiling(args.backend)
    checks = []
    results = []
    for overlap in [int(x) for x in args.overlap.split(",") if x.strip()]:
        results.append(run_trainer(args, overlap, ceiling, out, checks))
        # after each trainer: a run cut short keeps what it measured
        (out / "handover.json").write_text(json.dumps(
            {"ceiling_gbps": ceiling, "results": results,
             "checks": [{"check": c, "ok": ok, "detail": d} for c, ok, d in checks],
             "args": vars(args)}, indent=1))
        text = table(results, ceiling, args)
        failed = [c for c in checks if not c[1]]
        text += "\n" + f"checks: {len(checks) - len(failed)} of {len(checks)} passed"
        for c, _, detail in failed:
            text += f"\nFAILED {c}: {detail}"
        (out / "handover.txt").write_text(text + "\n")
    print(text, flush=True)
    return 1 if failed or not checks else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--role", choices=("driver", "trainer", "rollout"), default="driver")
    ap.add_argument("--backend", choices=("cuda", "host"), default="cuda")
    ap.add_argument("--trainer", choices=("synthetic", "mcore"), default="synthetic")
    ap.add_argument("--kept-gb", type=float, default=15.0,
                    help="synthetic: kept bytes (bf16 weights + fp32 optimizer state)")
    ap.add_argument("--layers", type=int, default=32, help="synthetic: tensors per kind")
    ap.add_argument("--mcore-layers", type=int, default=16)
    ap.add_argument("--mcore-hidden", type=int, default=2048)
    ap.add_argument("--mcore-heads", type=int, default=16)
    ap.add_argument("--phases", type=int, default=4)
    ap.add_argument("--early-wake-phases", type=int, default=1,
                    help="phases that first try a wake while the rollout holds the memory")
    ap.add_argument("--overlap", default="1,0",
                    help="wake orders to run the trainer with: 0 map first, 1 map ahead, "
                    "N map ahead on N threads")
    ap.add_argument("--host-mode", choices=("release", "retain", "reclaimable"),
                    default=None,
                    help="the trainer's host mode (default: the library's, release or "
                    "reclaimable under residue=checkpoint; reclaimable: with "
                    "DORMANT_RECLAIMABLE_PINNED_BYTES its pinned copies stay between cycles)")
    ap.add_argument("--margin-mib", type=int, default=1024,
                    help="what the rollout leaves free")
    ap.add_argument("--rollout-alloc", choices=("torch", "cumem"), default="torch")
    ap.add_argument("--rollout-tensors", type=int, default=64)
    ap.add_argument("--wake-delay-s", type=float, default=0.0,
                    help="seconds between the rollout's free and the wake (phases without "
                    "an early wake): shows whether the driver's work on freed memory slows the wake")
    ap.add_argument("--wake-copy", choices=("auto", "engine", "kernel"), default=None,
                    help="what copies the wakes (option wake_copy; default the library's); "
                         "each wake's choice is in its phase row's wake_copy")
    ap.add_argument("--trim-stack", type=int, default=0, metavar="BYTES",
                    help="CUDA trainer: after each step, the context's stack limit set to "
                         "BYTES per thread (cuCtxSetLimit), which gives back the local memory "
                         "reserved for the hungriest kernel so far: how much of what a "
                         "sleeping trainer holds (and a checkpoint copies) that is; 0: untouched")
    ap.add_argument("--no-empty-cache", action="store_true",
                    help="the trainer keeps PyTorch's cache asleep (DORMANT_TORCH_EMPTY_CACHE=0)")
    ap.add_argument("--host-device-bytes", type=int, default=256 * MiB,
                    help="host backend: the simulated device's size")
    ap.add_argument("--host-rollout-leave", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--test-corrupt-step", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=os.environ.get("OUT", tempfile.gettempdir() + "/handover"))
    args = ap.parse_args()
    if args.role == "trainer":
        return trainer_main(args)
    if args.role == "rollout":
        return rollout_main(args)
    if args.backend == "host" and os.environ.get("DORMANT_RESIDUE", "").strip() == "checkpoint":
        # the host stand-in's rollout takes its memory inside the trainer
        # (debug_occupy), a device call that a checkpointed process refuses
        ap.error("DORMANT_RESIDUE=checkpoint needs --backend cuda: on the host backend the "
                 "rollout stand-in runs inside the trainer, which is checkpointed while it "
                 "would run (tests/core/test_residue.c models the mode on the host backend)")
    return driver_main(args)


if __name__ == "__main__":
    sys.exit(main())
