# SPDX-License-Identifier: MIT
"""A torch.distributed trainer of N ranks (2 on the two-GPU machine), each
rank with dormant and its own HTTP server, slept and woken through
dormantctl after every step; issue 14.

    two_rank_trainer.py [--world 2] [--backend nccl|gloo] [--steps 6]
                        [--dormantctl PATH] [--json FILE]

It runs the same training three times, each rank a process of its own
(rank r on GPU r % device count; gloo: on the CPU, dormant's host backend):

  reference  no sleeping;
  sleep      after every step: dormantctl sleep (every rank at once), the
             GPU memory of each process measured (nvidia-smi), dormantctl wake;
  release    the same, with the process group of the gradients' all_reduce
             given back before each sleep (dormant.nccl.release_on_sleep) and
             restored at the next step.

and checks that the losses and the final weights of every rank are
bit-identical in the three runs. It prints what each process held awake
and asleep in each run, what the release and the restore cost, and the
sleep and wake times that dormantctl saw; one line "RESULT: PASS" or
"RESULT: FAIL ..." at the end (exit status 0 or 1). --json writes the
figures. Needs torch; the model lives in dormant regions ("weights", and
"optim" for Adam's state), so with nccl the cuda backend.
"""
import argparse
import hashlib
import json
import os
import pathlib
import queue
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
RUNS = ("reference", "sleep", "release")


# ---- one rank ---------------------------------------------------------------

def say(*words):
    print("@@", *words, flush=True)


def rank_main(args):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    sys.path.insert(0, str(REPO / "python"))
    import contextlib

    import torch
    import torch.distributed as dist

    import dormant
    import dormant.nccl

    cuda = args.backend == "nccl"
    if cuda:
        index = args.rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
    else:
        device = torch.device("cpu")
    torch.use_deterministic_algorithms(True)
    # no device_id: WORLD's communicator is never made (nothing runs on it)
    dist.init_process_group(args.backend, rank=args.rank, world_size=args.world,
                            init_method=f"tcp://127.0.0.1:{args.master_port}")
    m = dormant.Manager(backend="cuda" if cuda else "host")
    region = m.region if cuda else (lambda tag: contextlib.nullcontext())
    if not cuda:
        m.alloc("weights", 1 << 20)  # something to sleep on the host backend

    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 4096), torch.nn.GELU(),
                                torch.nn.Linear(4096, 1024))
    with region("weights"):
        model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    # every collective runs on this group, never on WORLD
    grads_group = dist.new_group(list(range(args.world)), backend=args.backend)
    released = None
    if args.release != "none":
        released = dormant.nccl.release_on_sleep(grads_group, manager=m, mode=args.release)
    if cuda:
        @m.on_sleep
        def give_back_cache():  # the freed grads and temporaries; on the hook's thread
            torch.cuda.set_device(index)
            torch.cuda.empty_cache()
    server = m.serve(port=0, quiet=True)
    nccl = torch.cuda.nccl.version() if cuda else "-"
    nccl = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    say("ready", server.port, os.getpid(), torch.__version__, nccl,
        released.mode if released else "none")

    losses = []
    for step in range(args.steps):
        if sys.stdin.readline().strip() != "go":
            say("error", "expected go")
            os._exit(1)
        gen = torch.Generator().manual_seed(1000 * step + args.rank)
        x = torch.randn(64, 1024, generator=gen).to(device)
        y = torch.randn(64, 1024, generator=gen).to(device)
        with m.step():
            group = released.group if released else grads_group
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad, group=group)
                p.grad.div_(args.world)
            with region("optim"):
                opt.step()
            opt.zero_grad(set_to_none=True)
            value = loss.item()  # waits for the step's work
        losses.append(value.hex())
        say("step", step, value.hex())
    if sys.stdin.readline().strip() != "end":
        say("error", "expected end")
        os._exit(1)
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    say("final", digest.hexdigest(), ",".join(losses))
    say("nccl", json.dumps(released.stats() if released else None))
    server.stop()
    # The teardown of NCCL, dormant's regions and the interpreter is not under
    # test here, and NCCL's can hang at exit: leave at once.
    os._exit(0)


# ---- the orchestrator ---------------------------------------------------------

class Rank:
    def __init__(self, argv, env):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=None, text=True, env=env)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith("@@ "):
                line = line[3:].rstrip("\n")
                self.lines.put(line.split(" ", 1) if line.startswith("nccl ") else line.split())
        self.lines.put(None)

    def send(self, word):
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def expect(self, word, timeout_s=300):
        try:
            got = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise RuntimeError(f"rank pid {self.proc.pid}: no '{word}' within {timeout_s} s")
        if got is None:
            raise RuntimeError(f"rank pid {self.proc.pid} ended (status {self.proc.wait()}) "
                               f"before '{word}'")
        if got[0] != word:
            raise RuntimeError(f"rank pid {self.proc.pid}: expected '{word}', got {got}")
        return got[1:]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_memory_mib():
    """{pid: MiB} from nvidia-smi's compute apps, and [MiB used] per GPU;
    (None, None) without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return None, None
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True)
    gpus = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True)
    per_pid = {}
    for line in apps.stdout.splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit() and mib.strip().isdigit():
            per_pid[int(pid)] = int(mib)
    per_gpu = [int(v) for v in gpus.stdout.split() if v.strip().isdigit()]
    return per_pid, per_gpu


def ctl(args, command, endpoints):
    start = time.monotonic()
    done = subprocess.run([args.dormantctl, "--no-progress", "--timeout", "120", command,
                           *endpoints], capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        raise RuntimeError(f"dormantctl {command} failed ({done.returncode}): "
                           f"{done.stderr.strip() or done.stdout.strip()}")
    return seconds


def run_once(args, name):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(REPO / "python"), os.environ.get("PYTHONPATH")])))
    port = free_port()
    release = args.nccl_mode if name == "release" else "none"
    ranks = [Rank([sys.executable, __file__, "--rank", str(r), "--world", str(args.world),
                   "--backend", args.backend, "--steps", str(args.steps), "--master-port",
                   str(port), "--release", release], env) for r in range(args.world)]
    out = {"run": name, "ranks": [], "sleep_s": [], "wake_s": [], "awake_mib": [],
           "asleep_mib": []}
    try:
        for rank in ranks:
            server_port, pid, torch_version, nccl, mode = rank.expect("ready", 600)
            out["ranks"].append({"port": int(server_port), "pid": int(pid)})
            out.update(torch=torch_version, nccl=nccl, mode=mode)
        endpoints = [f"127.0.0.1:{r['port']}" for r in out["ranks"]]
        pids = [r["pid"] for r in out["ranks"]]
        for step in range(args.steps):
            for rank in ranks:
                rank.send("go")
            for rank in ranks:
                rank.expect("step")
            if name == "reference":
                continue
            out["awake_mib"].append(memory_of(args, pids))
            out["sleep_s"].append(ctl(args, "sleep", endpoints))
            out["asleep_mib"].append(memory_of(args, pids))
            out["wake_s"].append(ctl(args, "wake", endpoints))
        for rank in ranks:
            rank.send("end")
        for i, rank in enumerate(ranks):
            digest, losses = rank.expect("final")
            stats = json.loads(rank.expect("nccl")[0])
            out["ranks"][i].update(digest=digest, losses=losses, nccl=stats)
        for rank in ranks:
            rank.proc.wait(timeout=120)
    finally:
        for rank in ranks:
            if rank.proc.poll() is None:
                rank.proc.kill()
    return out


def memory_of(args, pids):
    """Per rank: its process's MiB (nvidia-smi), else its GPU's, else None
    (gloo: the ranks use no GPU)."""
    per_pid, per_gpu = gpu_memory_mib() if args.backend == "nccl" else (None, None)
    if per_pid is None:
        return [None] * len(pids)
    if all(p in per_pid for p in pids):
        return [per_pid[p] for p in pids]
    # pids of another namespace (a container): one rank per GPU, its GPU's use
    return [per_gpu[i % len(per_gpu)] if per_gpu else None for i in range(len(pids))]


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(value, unit=""):
    return "-" if value is None else (f"{value:.3f}{unit}" if isinstance(value, float)
                                      else f"{value}{unit}")


def orchestrate(args):
    results, failures = {}, []
    for name in RUNS:
        try:
            results[name] = run_once(args, name)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            failures.append(f"run {name}: {e}")
            print(f"run {name}: FAILED: {e}", flush=True)
    ref = results.get("reference")
    first = next(iter(results.values()), {})
    print(f"two_rank_trainer: world {args.world}, backend {args.backend}, {args.steps} steps, "
          f"torch {first.get('torch')}, NCCL {first.get('nccl')}, release mode "
          f"{results.get('release', {}).get('mode')}")
    for name, out in results.items():
        line = f"run {name}:"
        if ref and name != "reference":
            same = all(a["digest"] == b["digest"] and a["losses"] == b["losses"]
                       for a, b in zip(out["ranks"], ref["ranks"]))
            line += f" bit-identical to reference: {'yes' if same else 'NO'};"
            if not same:
                failures.append(f"run {name} differs from the reference")
            line += (f" dormantctl sleep {fmt(median(out['sleep_s']), ' s')}, wake "
                     f"{fmt(median(out['wake_s']), ' s')} (medians)")
        elif name == "reference":
            agree = len({r["digest"] for r in out["ranks"]}) == 1
            line += f" ranks agree on the weights: {'yes' if agree else 'NO'}"
            if not agree:
                failures.append("the ranks' weights differ")
        print(line)
        for i, r in enumerate(out["ranks"]):
            awake = median([step[i] for step in out["awake_mib"]])
            asleep = median([step[i] for step in out["asleep_mib"]])
            text = f"  rank {i} (pid {r['pid']}): GPU MiB awake {fmt(awake)}, asleep {fmt(asleep)}"
            stats = r.get("nccl")
            if stats:
                text += (f"; {stats['mode']}: {stats['releases']} releases, last "
                         f"{fmt(stats['last_release_s'], ' s')}, {stats['restores']} restores, "
                         f"last {fmt(stats['last_restore_s'], ' s')}, "
                         f"{stats['release_failures']} failed")
            print(text)
    if "sleep" in results and "release" in results:
        for i in range(args.world):
            a = median([s[i] for s in results["sleep"]["asleep_mib"]])
            b = median([s[i] for s in results["release"]["asleep_mib"]])
            if a is not None and b is not None:
                print(f"  rank {i}: the release gave back {a - b} MiB of the {a} MiB held asleep")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"args": vars(args), "runs": results,
                                                       "failures": failures}, indent=1))
    if len(results) < len(RUNS) and not failures:
        failures.append("runs missing")
    print("RESULT: PASS" if not failures else "RESULT: FAIL " + "; ".join(failures))
    return 0 if not failures else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--nccl-mode", choices=("auto", "suspend", "rebuild"), default="auto",
                   help="how the release run gives the communicator back (dormant.nccl)")
    p.add_argument("--dormantctl", default=str(REPO / "build" / "ctl" / "dormantctl"))
    p.add_argument("--json")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--master-port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--release", default="none", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        rank_main(args)
        return 0
    if args.world < 1 or args.steps < 1:
        p.error("--world and --steps must be at least 1")
    if not os.access(args.dormantctl, os.X_OK):
        p.error(f"no dormantctl at {args.dormantctl} (--dormantctl)")
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
