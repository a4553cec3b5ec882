#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Host memory and switch speed of a real Megatron-core trainer under dormant,
on the GPU machine.

The trainer is tests/gpu/mcore.py's: Megatron-LM's GPTModel (local layer
spec) in bf16, DDP with fp32 grad buffers and the distributed optimizer,
about 186 M parameters. Three configurations, each in both host modes:

  whole    whole segments: marking of free blocks off (what dormant did before)
  live     live bytes only: the caching allocator's free blocks skipped
  rebuild  live bytes, and the bf16 weights rebuilt from the fp32 main params

For each: host bytes per parameter while asleep, sleep and wake seconds (the
median of the cycles after the first), and their speed as a fraction of the
pinned-copy ceiling measured in the same run (1 GiB, pinned host memory,
each way), for the bytes each one moved. Every configuration runs in a
process of its own (one dormant manager per process serves PyTorch).

  python3 bench/megatron_core.py [--out DIR] [--cycles N] [--small]
prints a table and writes DIR/megatron_core.json. Needs libdormant built
with dormant_mark_unused() and dormant_set_rebuild() ($DORMANT_LIB) and Megatron-core in .thirdparty/megatron
(scripts/gpu-megatron does both).
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests" / "gpu"))
sys.path.insert(0, str(REPO / "python"))

CONFIGS = ("whole", "live", "rebuild")
HOST_MODES = ("retain", "release")
# The targets: host bytes per parameter asleep, wake speed against the ceiling.
TARGET_BYTES_PER_PARAM = {"live": 14.2, "rebuild": 12.2}
TARGET_WAKE = 0.9
TARGET_SLEEP = {"retain": 0.8, "release": 0.6}
GB = 1e9


def pinned_ceiling(nbytes=1 << 30, reps=5):
    """Best GB/s of one pinned host<->device copy of nbytes, each way."""
    import torch
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    best = {"d2h": 0.0, "h2d": 0.0}
    for _ in range(reps):
        for way, (dst, src) in (("d2h", (host, dev)), ("h2d", (dev, host))):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            best[way] = max(best[way], nbytes / (start.elapsed_time(end) / 1e3) / GB)
    return best


def run_one(config, host_mode, cycles, small):
    """In this process: build the trainer, sleep and wake it cycles times
    (a training step between), return the measurements."""
    import mcore
    mcore.add_megatron_to_path()
    import torch
    import dormant

    model = mcore.ModelConfig() if small else mcore.BENCH_MODEL
    dm = dormant.Manager(backend="cuda", host_mode=host_mode,
                         mark_free_blocks=config != "whole")
    t0 = time.perf_counter()
    t = mcore.McoreTrainer(dm, model, prefix="", rebuild=config == "rebuild")
    batches = list(t.batches(cycles + 1))
    t.train_step(*batches[0])      # creates Adam's state (and the freed temporaries)
    torch.cuda.synchronize()
    build_s = time.perf_counter() - t0
    n = t.param_count()
    tags = t.tags.all()
    rows = []
    for x, y in batches[1:]:
        with dm.step():
            t.train_step(x, y)
        torch.cuda.synchronize()
        sleep = dm.sleep(tags)
        stats = dm.stats()
        marks = dm.free_block_marks()["last"] if config != "whole" else None
        by_tag = {x["tag"]: x for x in stats["tags"] if x["tag"] in tags}
        host = sum(x["host_bytes"] for x in by_tag.values())
        wake = dm.wake(tags)
        rows.append({
            "sleep_s": sleep["duration_s"], "sleep_bytes": sleep["bytes_copied"],
            "skipped": sleep.get("bytes_skipped", 0), "host_bytes": host,
            "host_by_tag": {k: v["host_bytes"] for k, v in by_tag.items()},
            "staging_bytes": stats["totals"].get("staging_bytes", 0),
            "wake_s": wake["duration_s"], "wake_bytes": wake["bytes_copied"],
            "mark_s": marks["seconds"] if marks else 0.0,
            "mark_blocks": marks["blocks"] if marks else 0,
        })
    steady = rows[1:] or rows
    med = lambda key: statistics.median(r[key] for r in steady)  # noqa: E731
    out = {
        "config": config, "host_mode": host_mode, "params": n, "build_s": build_s,
        "cycles": len(rows), "rebuilds": t.rebuilds,
        "host_bytes": steady[-1]["host_bytes"],
        "bytes_per_param": steady[-1]["host_bytes"] / n,
        "host_by_tag_per_param": {k: v / n for k, v in steady[-1]["host_by_tag"].items()},
        "sleep_s": med("sleep_s"), "sleep_bytes": steady[-1]["sleep_bytes"],
        "skipped_bytes": steady[-1]["skipped"],
        "wake_s": med("wake_s"), "wake_bytes": steady[-1]["wake_bytes"],
        "first_sleep_s": rows[0]["sleep_s"], "first_wake_s": rows[0]["wake_s"],
        "mark_s": med("mark_s"), "mark_blocks": steady[-1]["mark_blocks"],
        "staging_bytes": steady[-1]["staging_bytes"],
        "rows": rows,
    }
    return out


def verdicts(r, ceiling):
    sleep_gbps = r["sleep_bytes"] / r["sleep_s"] / GB if r["sleep_s"] > 0 else 0.0
    wake_gbps = r["wake_bytes"] / r["wake_s"] / GB if r["wake_s"] > 0 else 0.0
    r["sleep_gbps"], r["wake_gbps"] = sleep_gbps, wake_gbps
    r["sleep_ratio"] = sleep_gbps / ceiling["d2h"]
    r["wake_ratio"] = wake_gbps / ceiling["h2d"]
    checks = {
        "sleep": r["sleep_ratio"] >= TARGET_SLEEP[r["host_mode"]],
        "wake": r["wake_ratio"] >= TARGET_WAKE,
    }
    if r["config"] in TARGET_BYTES_PER_PARAM:
        checks["B/param"] = r["bytes_per_param"] <= TARGET_BYTES_PER_PARAM[r["config"]]
    r["checks"] = checks
    return r


def table(results, ceiling):
    lines = [f"pinned ceiling: device->host {ceiling['d2h']:.1f} GB/s, host->device "
             f"{ceiling['h2d']:.1f} GB/s (1 GiB, best of 5)",
             f"{'config':8s} {'mode':7s} {'B/param':>8s} {'sleep s':>8s} {'GB/s':>6s} "
             f"{'ratio':>6s} {'wake s':>8s} {'GB/s':>6s} {'ratio':>6s} {'mark ms':>8s}  targets"]
    for r in results:
        if "error" in r:
            lines.append(f"{r['config']:8s} {r['host_mode']:7s} ERROR {r['error']}")
            continue
        target = TARGET_BYTES_PER_PARAM.get(r["config"])
        checks = " ".join(f"{k}:{'ok' if v else 'MISSED'}" for k, v in r["checks"].items())
        lines.append(
            f"{r['config']:8s} {r['host_mode']:7s} {r['bytes_per_param']:8.2f} "
            f"{r['sleep_s']:8.3f} {r['sleep_gbps']:6.1f} {r['sleep_ratio']:6.2f} "
            f"{r['wake_s']:8.3f} {r['wake_gbps']:6.1f} {r['wake_ratio']:6.2f} "
            f"{r['mark_s'] * 1e3:8.2f}  {checks}"
            + (f" (<= {target})" if target else ""))
    if results and "params" in results[0]:
        lines.append(f"{results[0]['params'] / 1e6:.1f} M parameters; sleep and wake: median of "
                     f"{max(results[0]['cycles'] - 1, 1)} cycles after the first; targets: "
                     f"wake >= {TARGET_WAKE}, sleep >= {TARGET_SLEEP['retain']} retain / "
                     f">= {TARGET_SLEEP['release']} release of the ceiling")
    return "\n".join(lines)


def write(out, results, ceiling):
    text = table(results, ceiling)
    (out / "megatron_core.json").write_text(json.dumps(
        {"ceiling_gbps": ceiling, "results": results}, indent=1))
    (out / "megatron_core.txt").write_text(text + "\n")
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/megatron-core-bench"))
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--host-modes", default=",".join(HOST_MODES))
    ap.add_argument("--small", action="store_true", help="the test's small model")
    ap.add_argument("--one", nargs=2, metavar=("CONFIG", "HOST_MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--timeout-s", type=int, default=110, help="per configuration")
    args = ap.parse_args()

    if args.one:
        result = run_one(args.one[0], args.one[1], args.cycles, args.small)
        print("RESULT " + json.dumps(result), flush=True)
        sys.stderr.flush()
        # No interpreter teardown: PyTorch would free its cached segments
        # into a manager that is being destroyed.
        os._exit(0)

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import mcore
    reason = mcore.why_megatron_is_missing()
    if reason:
        print(f"megatron_core bench: {reason}", file=sys.stderr)
        return 2
    ceiling = pinned_ceiling()
    results = []
    for config in args.configs.split(","):
        for mode in args.host_modes.split(","):
            cmd = [sys.executable, __file__, "--one", config, mode, "--cycles", str(args.cycles)]
            if args.small:
                cmd.append("--small")
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
                line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
                if p.returncode != 0 or line is None:
                    tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
                    r = {"config": config, "host_mode": mode,
                         "error": f"exit {p.returncode}: {tail[0][:200]}"}
                    (out / f"megatron_core-{config}-{mode}.log").write_text(p.stdout + p.stderr)
                else:
                    r = verdicts(json.loads(line[len("RESULT "):]), ceiling)
            except subprocess.TimeoutExpired:
                r = {"config": config, "host_mode": mode, "error": f"over {args.timeout_s} s"}
            results.append(r)
            write(out, results, ceiling)  # so far: a run cut short keeps what it measured
            print(f"  {config}/{mode}: " + ("ERROR " + r["error"] if "error" in r else
                  f"{r['bytes_per_param']:.2f} B/param, sleep {r['sleep_s']:.3f} s, "
                  f"wake {r['wake_s']:.3f} s"), flush=True)
    print(write(out, results, ceiling))
    failed = any("error" in r or not all(r["checks"].values()) for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
