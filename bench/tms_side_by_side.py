#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The same torch_memory_saver program through the real torch_memory_saver and
through dormant (dormant.torch_memory_saver under the switch), in one run.

    python3 bench/tms_side_by_side.py --tms-src DIR [--weights-gib 16]
        [--grads-gib 16] [--cycles 3] [--json FILE]

DIR holds torch_memory_saver's source built in place (TMS_CUDA_MAJOR=13
python3 setup.py build_ext --inplace). The workload is miles's: bf16 weights
in region("default", enable_cpu_backup=True) and fp32 gradients in a nested
no-backup region of the same tag; pause() and resume() of everything, a few
cycles, each program in a process of its own, with and without
retain_cpu_backup. The real torch_memory_saver runs in hook_mode "preload"
(its LD_PRELOAD hook, as configure_subprocess() sets it up; its "torch" mode
aborts on this workload's nested region: "only support interesting region");
--tms-hook-mode torch tries that instead. dormant runs in hook_mode "torch". It prints a Markdown table:
pause and resume seconds (median of the cycles after the first, and the
first), host memory held while paused and while awake (the process's
resident set size above what it was before the first pause), device memory
freed by pause (cuMemGetInfo), and whether the weights came back intact.
"""
import argparse
import json
import os
import pathlib
import statistics
import sys
import time

from rows import report, rss_bytes, run_rows

REPO = pathlib.Path(__file__).resolve().parents[1]
GiB = 1 << 30


def worker(weights_gib, grads_gib, cycles, retain):
    """One program written for torch_memory_saver; prints one JSON line."""
    import torch
    import torch_memory_saver as package
    from torch_memory_saver import torch_memory_saver as tms

    tms.hook_mode = os.environ.get("BENCH_TMS_HOOK_MODE", "torch")
    if retain:
        tms.retain_cpu_backup = True
    torch.cuda.init()
    g = torch.Generator(device="cuda").manual_seed(0)
    with tms.region("default", enable_cpu_backup=True):
        weights = torch.randn(int(weights_gib * GiB) // 2, dtype=torch.bfloat16, device="cuda",
                              generator=g)
        with tms.region("default", enable_cpu_backup=False):
            grads = torch.zeros(int(grads_gib * GiB) // 4, dtype=torch.float32, device="cuda")
    checksum = int(weights.view(torch.int16).sum(dtype=torch.int64))
    torch.cuda.synchronize()
    rss_before = rss_bytes()
    result = {"library": "dormant" if getattr(package, "__dormant__", False)
              else "torch_memory_saver", "retain": retain, "cycles": []}
    for _ in range(cycles):
        grads.add_(1.0)
        torch.cuda.synchronize()
        free_awake = torch.cuda.mem_get_info()[0]
        t0 = time.perf_counter()
        tms.pause()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        free_paused = torch.cuda.mem_get_info()[0]
        rss_paused = rss_bytes()
        tms.resume()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        intact = int(weights.view(torch.int16).sum(dtype=torch.int64)) == checksum
        result["cycles"].append({
            "pause_s": t1 - t0, "resume_s": t2 - t1,
            "gpu_freed_bytes": free_paused - free_awake,
            "host_paused_bytes": rss_paused - rss_before,
            "host_awake_bytes": rss_bytes() - rss_before,
            "weights_intact": intact,
        })
    print("RESULT " + json.dumps(result), flush=True)


def summarize(row):
    if "error" in row:
        return f"| {row['label']} | failed: {row['error'][:300]} | | | | | | |"
    cycles = row["cycles"]
    later = cycles[1:] or cycles
    med = lambda key: statistics.median(c[key] for c in later)  # noqa: E731
    gib = lambda key: max(c[key] for c in cycles) / GiB  # noqa: E731
    ok = all(c["weights_intact"] for c in cycles)
    return (f"| {row['label']} | {med('pause_s'):.2f} | {cycles[0]['pause_s']:.2f} | "
            f"{med('resume_s'):.2f} | {gib('host_paused_bytes'):.1f} | "
            f"{gib('host_awake_bytes'):.1f} | {gib('gpu_freed_bytes'):.1f} | "
            f"{'yes' if ok else 'NO'} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tms-src", required=True, help="torch_memory_saver built in place")
    ap.add_argument("--weights-gib", type=float, default=16)
    ap.add_argument("--grads-gib", type=float, default=16)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--tms-hook-mode", choices=("preload", "torch"), default="preload",
                    help="hook_mode of the real torch_memory_saver (default preload)")
    ap.add_argument("--timeout-s", type=int, default=240, help="per program")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--retain", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.weights_gib, args.grads_gib, args.cycles, args.retain)
        return 0

    me = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker",
          "--tms-src", args.tms_src, "--weights-gib", str(args.weights_gib),
          "--grads-gib", str(args.grads_gib), "--cycles", str(args.cycles)]
    base = dict(os.environ)
    base.pop("LD_PRELOAD", None)
    tms_env = dict(base, PYTHONPATH=os.pathsep.join(
        [str(pathlib.Path(args.tms_src).resolve())] +
        [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]))
    tms_env["BENCH_TMS_HOOK_MODE"] = args.tms_hook_mode
    if args.tms_hook_mode == "preload":
        hooks = sorted(pathlib.Path(args.tms_src).resolve().rglob(
            "torch_memory_saver_hook_mode_preload*.so"))
        if not hooks:
            print(f"no torch_memory_saver_hook_mode_preload*.so under {args.tms_src}: "
                  f"build it first", file=sys.stderr)
            return 2
        tms_env["LD_PRELOAD"] = str(hooks[0])
    ours_env = dict(base, PYTHONPATH=os.pathsep.join(
        [str(REPO / "python")] + [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]))
    switch = [sys.executable, "-m", "dormant.run", "--torch-memory-saver", "--"]
    rows = [
        ("torch_memory_saver", me, tms_env),
        ("torch_memory_saver, retain_cpu_backup", me + ["--retain"], tms_env),
        ("dormant (the switch)", switch + me, ours_env),
        ("dormant (the switch), retain_cpu_backup", switch + me + ["--retain"], ours_env),
    ]
    results = run_rows(rows, args.timeout_s)
    return report(results,
                  f"Workload: {args.weights_gib:g} GiB bf16 weights with backup + "
                  f"{args.grads_gib:g} GiB fp32 grads without (nested region, one tag "
                  f"\"default\"), pause() and resume() of everything, {args.cycles} cycles; "
                  f"torch_memory_saver in hook_mode \"{args.tms_hook_mode}\", dormant in "
                  f"hook_mode \"torch\".\n",
                  ["run", "pause s", "first pause s", "resume s", "host GiB paused",
                   "host GiB awake", "GPU GiB freed", "weights intact"], summarize, args.json)


if __name__ == "__main__":
    sys.exit(main())
