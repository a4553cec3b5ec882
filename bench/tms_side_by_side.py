#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The same torch_memory_saver program through the real torch_memory_saver and
through dormant (dormant.torch_memory_saver under the switch), in one run.

    python3 bench/tms_side_by_side.py --tms-src DIR [--weights-gib 16]
        [--grads-gib 16] [--cycles 3] [--json FILE]
    python3 bench/tms_side_by_side.py --tms-src DIR --workload mcore
        [--mcore-layers 16 --mcore-hidden 2048 ...] [--cycles 3] [--json FILE]

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

--workload mcore runs bench/tms_mcore_program.py instead: a real Megatron-core
trainer (tests/gpu/mcore.py's GPTModel, DDP, distributed optimizer; about
0.87 B parameters by default) built in torch_memory_saver's regions the way
miles's Megatron actor builds it, its grad_data in the nested no-backup region;
training steps, then cycles of pause(), resume() and a step. Three runs: the
real torch_memory_saver, dormant under the switch, and a reference that never
pauses and uses no torch_memory_saver (--mcore-retain adds both libraries with
retain_cpu_backup). The table has pause and resume seconds, host memory
while paused (GiB and bytes per parameter) and device memory freed; below it,
whether every loss and the checksum of every kept byte are bit-identical
across the runs (exit status 1 if not), and how many times faster dormant
sleeps and wakes than torch_memory_saver, against issue 20's target
(--target-x, 8). It needs Megatron-core in .thirdparty/megatron
(scripts/gpu-megatron) and says so, exit status 2, when it or the
torch_memory_saver build is missing.
"""
import argparse
import json
import math
import os
import pathlib
import statistics
import sys
import time

from rows import report, rss_bytes, run_rows

REPO = pathlib.Path(__file__).resolve().parents[1]
MEGATRON = REPO / ".thirdparty" / "megatron"          # where tests/gpu/mcore.py looks
MCORE_PROGRAM = REPO / "bench" / "tms_mcore_program.py"
REFERENCE_LABEL = "reference: never paused, no torch_memory_saver"
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


# ---- --workload mcore: the table and the comparison ------------------------

MCORE_COLUMNS = ["run", "pause s", "first pause s", "resume s", "first resume s",
                 "host GiB paused", "host B/param paused", "host GiB awake", "GPU GiB freed",
                 "losses and state"]


def later_median(cycles, key):
    """The median of key over the cycles after the first (all, if one)."""
    return statistics.median(c[key] for c in (cycles[1:] or cycles))


def identical(row, ref):
    """Whether row's losses and checksum of the kept state are ref's, bit
    for bit (floats from JSON compare exactly)."""
    return row["losses"] == ref["losses"] and row["digest"] == ref["digest"]


def loss_gap(row, ref):
    """The largest |loss difference| between two runs (inf when their
    counts differ)."""
    if len(row["losses"]) != len(ref["losses"]):
        return math.inf
    return max((abs(a - b) for a, b in zip(row["losses"], ref["losses"])), default=0.0)


def baseline(results):
    """The row the others must match: the reference if it ran, else the
    first row that ran."""
    ok = [r for r in results if "error" not in r]
    return next((r for r in ok if r.get("reference")), ok[0] if ok else None)


def summarize_mcore(row, ref):
    if "error" in row:
        why = row["error"][:300].replace("|", "\\|")
        return f"| {row['label']} | failed: {why} |" + " |" * (len(MCORE_COLUMNS) - 2)
    if row is ref:
        state = "the baseline"
    elif identical(row, ref):
        state = "bit-identical"
    else:
        state = f"DIFFER (max loss gap {loss_gap(row, ref):.3g})"
    cycles = row["cycles"]
    if row.get("reference"):
        return f"| {row['label']} |" + " — |" * (len(MCORE_COLUMNS) - 2) + f" {state} |"
    paused = max(c["host_paused_bytes"] for c in cycles)
    return (f"| {row['label']} | {later_median(cycles, 'pause_s'):.2f} | "
            f"{cycles[0]['pause_s']:.2f} | {later_median(cycles, 'resume_s'):.2f} | "
            f"{cycles[0]['resume_s']:.2f} | {paused / GiB:.1f} | {paused / row['params']:.1f} | "
            f"{max(c['host_awake_bytes'] for c in cycles) / GiB:.1f} | "
            f"{max(c['gpu_freed_bytes'] for c in cycles) / GiB:.1f} | {state} |")


def find_run(results, library, retain=False):
    return next((r for r in results if "error" not in r and r.get("library") == library
                 and not r.get("reference") and bool(r.get("retain")) == retain), None)


def compare_mcore(results, target_x):
    """What the mcore run is for: are all runs bit-identical, and how many
    times faster dormant pauses and resumes than torch_memory_saver (each
    without retain_cpu_backup). A dict; "lines" says it in words."""
    ref = baseline(results)
    failed = [r["label"] for r in results if "error" in r]
    ran = [r for r in results if "error" not in r]
    differ = [r["label"] for r in ran if ref is not None and not identical(r, ref)]
    out = {"failed": failed, "baseline": ref["label"] if ref else None,
           "compared": len(ran), "differ": differ, "identical": ref is not None and not differ,
           "target_x": target_x, "lines": []}
    lines = out["lines"]
    if failed:
        lines.append("FAILED: " + "; ".join(failed) + " (the table has the reason)")
    if ref is None:
        lines.append("nothing ran: no comparison")
    elif differ:
        lines.append(f"losses or kept state DIFFER from {ref['label']!r} in: " + "; ".join(
            f"{r['label']} (max loss gap {loss_gap(r, ref):.3g}, checksum "
            f"{'same' if r['digest'] == ref['digest'] else 'different'})"
            for r in ran if r["label"] in differ))
        pair = find_run(results, "torch_memory_saver"), find_run(results, "dormant")
        if None not in pair:
            out["libraries_identical"] = identical(*pair)
            lines.append("torch_memory_saver's and dormant's runs are " +
                         ("bit-identical to each other" if identical(*pair) else
                          f"not identical to each other either (max loss gap "
                          f"{loss_gap(*pair):.3g})"))
    else:
        lines.append(f"every loss ({len(ref['losses'])} steps) and the checksum of every kept "
                     f"byte: bit-identical across the {len(ran)} runs that ran")
    tms, ours = find_run(results, "torch_memory_saver"), find_run(results, "dormant")
    if tms is None or ours is None:
        out["pause_x"] = None
        lines.append("speed: not compared (torch_memory_saver's or dormant's run failed)")
        return out
    for key, name in (("pause_s", "pause"), ("resume_s", "resume")):
        theirs, mine = later_median(tms["cycles"], key), later_median(ours["cycles"], key)
        out[name + "_x"] = theirs / mine if mine > 0 else math.inf
        first = tms["cycles"][0][key] / ours["cycles"][0][key] if ours["cycles"][0][key] > 0 \
            else math.inf
        out["first_" + name + "_x"] = first
    out["target_met"] = out["pause_x"] >= target_x
    lines.append(
        f"dormant sleeps {out['pause_x']:.1f}x faster than torch_memory_saver (median pause "
        f"{later_median(ours['cycles'], 'pause_s'):.2f} s against "
        f"{later_median(tms['cycles'], 'pause_s'):.2f} s; first pause {out['first_pause_x']:.1f}x) "
        f"and wakes {out['resume_x']:.1f}x faster (first resume {out['first_resume_x']:.1f}x)")
    lines.append(f"issue 20 item 7, sleep at least {target_x:g}x faster: "
                 f"{'met' if out['target_met'] else 'NOT MET'}")
    return out


def report_mcore(results, args, out=sys.stdout):
    """Print the table and the comparison; write args.json. The exit
    status: 0 when every run ran and all are bit-identical."""
    ref = baseline(results)
    ran = [r for r in results if "error" not in r]
    params = f"{ran[0]['params'] / 1e9:.2f} B" if ran else "?"
    print(f"Workload: Megatron-core GPTModel, {params} parameters ({args.mcore_layers} layers, "
          f"hidden {args.mcore_hidden}, {args.mcore_heads} heads, vocab {args.mcore_vocab}, "
          f"seq {args.mcore_seq}, batch {args.mcore_batch}), bf16 with fp32 grad buffers and "
          f"the distributed optimizer, built in region(\"default\", enable_cpu_backup=True) "
          f"with grad_data in a nested no-backup region (miles's layout); "
          f"{args.mcore_steps} steps, then {args.cycles} cycles of pause() and resume() of "
          f"everything and a step; torch_memory_saver in hook_mode \"{args.tms_hook_mode}\", "
          f"dormant in hook_mode \"torch\". Pause and resume: median of the cycles after the "
          f"first.\n", file=out)
    print("| " + " | ".join(MCORE_COLUMNS) + " |", file=out)
    print("| " + " | ".join("---" for _ in MCORE_COLUMNS) + " |", file=out)
    for row in results:
        print(summarize_mcore(row, ref), file=out)
    comparison = compare_mcore(results, args.target_x)
    print("", file=out)
    for line in comparison["lines"]:
        print(line, file=out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workload": "mcore", "results": results,
                       "comparison": {k: v for k, v in comparison.items() if k != "lines"}},
                      f, indent=1)
    return 0 if not comparison["failed"] and comparison["identical"] else 1


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tms-src", required=True, help="torch_memory_saver built in place")
    ap.add_argument("--workload", choices=("synthetic", "mcore"), default="synthetic",
                    help="synthetic tensors (default) or a Megatron-core trainer")
    ap.add_argument("--weights-gib", type=float, default=16, help="synthetic")
    ap.add_argument("--grads-gib", type=float, default=16, help="synthetic")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--tms-hook-mode", choices=("preload", "torch"), default="preload",
                    help="hook_mode of the real torch_memory_saver (default preload)")
    ap.add_argument("--timeout-s", type=int,
                    help="per program (default 240; 300 with --workload mcore)")
    mc = ap.add_argument_group("--workload mcore (bench/tms_mcore_program.py)")
    mc.add_argument("--mcore-layers", type=int, default=16)
    mc.add_argument("--mcore-hidden", type=int, default=2048)
    mc.add_argument("--mcore-heads", type=int, default=16)
    mc.add_argument("--mcore-vocab", type=int, default=32768)
    mc.add_argument("--mcore-seq", type=int, default=1024)
    mc.add_argument("--mcore-batch", type=int, default=2)
    mc.add_argument("--mcore-steps", type=int, default=2, help="steps before the first pause")
    mc.add_argument("--mcore-retain", action="store_true",
                    help="also run both libraries with retain_cpu_backup")
    mc.add_argument("--target-x", type=float, default=8.0,
                    help="dormant's pause at least this many times faster (issue 20 item 7)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--retain", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.cycles < 1:
        ap.error("--cycles must be at least 1")
    if args.timeout_s is None:
        args.timeout_s = 300 if args.workload == "mcore" else 240
    return args


def megatron_missing(megatron=MEGATRON):
    """None when megatron/core is where tests/gpu/mcore.py looks, else why
    not (the program itself also checks that it imports)."""
    if (pathlib.Path(megatron) / "megatron" / "core" / "__init__.py").is_file():
        return None
    return (f"no Megatron-core at {megatron}/megatron/core: --workload mcore needs it "
            f"(scripts/gpu-megatron fetches it; on the device machine carry .thirdparty)")


def tms_build_missing(tms_src, hook_mode):
    """None when tms_src holds torch_memory_saver built in place for hook_mode,
    else what is missing."""
    src = pathlib.Path(tms_src)
    if not (src / "torch_memory_saver" / "__init__.py").is_file():
        return f"no torch_memory_saver package under {tms_src}: pass its source checkout"
    if hook_mode == "preload" and not preload_hooks(src):
        return (f"no torch_memory_saver_hook_mode_preload*.so under {tms_src}: build it first "
                f"(TMS_CUDA_MAJOR=13 python3 setup.py build_ext --inplace)")
    if hook_mode == "torch" and not sorted(src.rglob("torch_memory_saver_hook_mode_torch*.so")):
        return (f"no torch_memory_saver_hook_mode_torch*.so under {tms_src}: build it first "
                f"(TMS_CUDA_MAJOR=13 python3 setup.py build_ext --inplace)")
    return None


def preload_hooks(src):
    return sorted(pathlib.Path(src).resolve().rglob("torch_memory_saver_hook_mode_preload*.so"))


def environments(args):
    """(base, tms_env, ours_env): the environment without LD_PRELOAD; with
    the real torch_memory_saver first on PYTHONPATH (and its preload hook);
    with dormant's python/ first."""
    base = dict(os.environ)
    base.pop("LD_PRELOAD", None)
    path = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
    tms_env = dict(base, PYTHONPATH=os.pathsep.join(
        [str(pathlib.Path(args.tms_src).resolve())] + path))
    tms_env["BENCH_TMS_HOOK_MODE"] = args.tms_hook_mode
    if args.tms_hook_mode == "preload":
        tms_env["LD_PRELOAD"] = str(preload_hooks(args.tms_src)[0])
    ours_env = dict(base, PYTHONPATH=os.pathsep.join([str(REPO / "python")] + path))
    ours_env.pop("BENCH_TMS_HOOK_MODE", None)
    return base, tms_env, ours_env


SWITCH = [sys.executable, "-m", "dormant.run", "--torch-memory-saver", "--"]


def synthetic_rows(args, tms_env, ours_env):
    me = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker",
          "--tms-src", args.tms_src, "--weights-gib", str(args.weights_gib),
          "--grads-gib", str(args.grads_gib), "--cycles", str(args.cycles)]
    return [
        ("torch_memory_saver", me, tms_env),
        ("torch_memory_saver, retain_cpu_backup", me + ["--retain"], tms_env),
        ("dormant (the switch)", SWITCH + me, ours_env),
        ("dormant (the switch), retain_cpu_backup", SWITCH + me + ["--retain"], ours_env),
    ]


def mcore_rows(args, base, tms_env, ours_env):
    """The runs of bench/tms_mcore_program.py: (label, command, environment)."""
    prog = [sys.executable, str(MCORE_PROGRAM), "--steps", str(args.mcore_steps),
            "--cycles", str(args.cycles), "--layers", str(args.mcore_layers),
            "--hidden", str(args.mcore_hidden), "--heads", str(args.mcore_heads),
            "--vocab", str(args.mcore_vocab), "--seq", str(args.mcore_seq),
            "--batch", str(args.mcore_batch)]
    tms = prog + ["--expect", "torch_memory_saver"]
    ours = SWITCH + prog + ["--expect", "dormant"]
    rows = [("torch_memory_saver", tms, tms_env), ("dormant (the switch)", ours, ours_env)]
    if args.mcore_retain:
        rows += [("torch_memory_saver, retain_cpu_backup", tms + ["--retain"], tms_env),
                 ("dormant (the switch), retain_cpu_backup", ours + ["--retain"], ours_env)]
    rows.append((REFERENCE_LABEL, prog + ["--reference"], base))
    return rows


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        worker(args.weights_gib, args.grads_gib, args.cycles, args.retain)
        return 0
    missing = tms_build_missing(args.tms_src, args.tms_hook_mode)
    if missing is None and args.workload == "mcore":
        missing = megatron_missing()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    base, tms_env, ours_env = environments(args)
    if args.workload == "mcore":
        results = run_rows(mcore_rows(args, base, tms_env, ours_env), args.timeout_s)
        return report_mcore(results, args)

    results = run_rows(synthetic_rows(args, tms_env, ours_env), args.timeout_s)
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
