#!/usr/bin/python3
"""Turn the JSON files of bench/run-h200.sh into docs/benchmarks.md's results.

usage: report.py RESULTS_DIR [--update docs/benchmarks.md] [--docs docs] [--no-plots]

Reads every *.json that dormant-bench or probe-vmm wrote in RESULTS_DIR (and
machine.txt), and writes markdown tables: the issue-5 targets with a verdict,
the comparison with the reference tools, one line per run, scaling by size and
by allocation count, the chunk-size sweep and the VMM probe. Plots go to
DOCS/bench-*.png (matplotlib, Debian's python3-matplotlib).

With --update FILE the markdown replaces what lies between the markers
<!-- bench-results:begin --> and <!-- bench-results:end --> in FILE; without
it, the markdown goes to stdout. Nothing here invents a number: a run that is
missing shows as "not measured".
"""
import argparse
import json
import math
import os
import re
import sys

GIB = 1 << 30
BEGIN = "<!-- bench-results:begin -->"
END = "<!-- bench-results:end -->"
NOT_MEASURED = "not measured"

# The reference tools' figures, measured earlier on the H200 machine (16 GiB kept + 16 GiB
# discarded).
REFERENCES = [
    ("torch_memory_saver, default", "6.8–9.6 s", "2.0–3.0 s", "—", "—"),
    ("torch_memory_saver, retained backup", "0.33 s (first: 8.4 s)", "0.32 s",
     "16.6 GiB", "16.6 GiB"),
    ("NVIDIA checkpoint (cuCheckpointProcess*)", "20–26 s", "7.6–8.8 s", "41 GiB", "—"),
]


# ---- loading ---------------------------------------------------------------

def load(folder):
    benches, probes = {}, {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            sys.exit(f"report.py: cannot read {path}: {e}")
        label = data.get("label") or name[:-5]
        if data.get("tool") == "dormant-bench":
            benches[label] = data
        elif data.get("tool") == "probe-vmm":
            probes[label] = data
    machine = ""
    path = os.path.join(folder, "machine.txt")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            machine = f.read().strip()
    return benches, probes, machine, not_done(folder)


def not_done(folder):
    """Runs that run-h200.sh's log reports skipped or failed, with the reason."""
    path = os.path.join(folder, "run-h200.log")
    if not os.path.exists(path):
        return []
    reasons, problems, label, in_summary = {}, [], None, False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            head = re.match(r"== ([\w.-]+): (.*)", line)
            if head:
                label = head.group(1)
                if head.group(2).startswith("skipped: "):
                    reasons[label] = head.group(2)[len("skipped: "):]
                continue
            if line.startswith("summary ("):
                in_summary = True
                continue
            skip = re.search(r"skipped: (.*)", line)
            if label and skip and not in_summary:
                reasons[label] = skip.group(1)
            if in_summary and line.startswith("  "):
                item = re.match(r"  ([\w.-]+) (.*)", line)
                if item and not item.group(2).startswith("ok"):
                    problems.append((item.group(1), reasons.get(item.group(1), item.group(2))))
    return problems


# ---- formatting ------------------------------------------------------------

def num(value, digits=3):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}"


def ms(value):
    return "—" if value is None else f"{value * 1e3:.1f}"


def gib(value):
    return "—" if value is None else f"{value / GIB:.2f}"


def size(value):
    for unit, factor in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= factor:
            text = f"{value / factor:.2f}".rstrip("0").rstrip(".")
            return f"{text} {unit}"
    return f"{value} B"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(" --- " for _ in header) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def cold(run):
    cycles = run.get("cycles") or []
    return cycles[0] if cycles else None


def med(run, key):
    medians = run.get("medians") or {}
    return medians.get(key)


def verdict(value, goal, at_least, unit=lambda v: f"{v:.3g}"):
    """'met' / 'missed by ...' for a number against a goal."""
    if value is None:
        return NOT_MEASURED
    ok = value >= goal if at_least else value < goal
    if ok:
        return "met"
    return f"missed by {unit(abs(goal - value))}"


def workload(run):
    """'16 GiB kept + 16 GiB discarded' from a run's config."""
    if not run:
        return "16 GiB kept + 16 GiB discarded"
    cfg = run["config"]
    return f"{size(cfg['keep_bytes'])} kept + {size(cfg['discard_bytes'])} discarded"


# ---- sections --------------------------------------------------------------

def section_targets(b):
    retain, release = b.get("target-retain"), b.get("target-release")
    discard = b.get("discard-only")
    rows = []

    def ratio_row(name, run, key, seconds_key, goal):
        value = med(run, key) if run else None
        measured = NOT_MEASURED if value is None else \
            f"{value:.3f} ({num(med(run, seconds_key))} s)"
        rows.append((name, measured, f"≥ {goal}", verdict(value, goal, True)))

    ratio_row("retain: sleep / ceiling", retain, "sleep_ceiling_ratio", "sleep_s", 0.95)
    ratio_row("retain: wake / ceiling", retain, "wake_ceiling_ratio", "wake_s", 0.95)
    ratio_row("release: sleep / ceiling", release, "sleep_ceiling_ratio", "sleep_s", 0.5)
    ratio_row("release: wake / ceiling", release, "wake_ceiling_ratio", "wake_s", 0.9)

    if release:
        # measured: host copies plus whatever staging ring is held (none when
        # the copies are pinned, the default)
        settled = med(release, "host_awake_settled_bytes")
        rows.append(("release: host memory held awake (after background frees)",
                     f"{gib(settled)} GiB", "no host copies",
                     "met" if settled == 0 else f"missed: {gib(settled)} GiB held"))
    else:
        rows.append(("release: host memory held awake", NOT_MEASURED, "no host copies",
                     NOT_MEASURED))

    c = cold(retain) if retain else None
    value = c["sleep"]["seconds"] if c else None
    rows.append(("retain: first (cold) sleep",
                 NOT_MEASURED if value is None else
                 f"{value:.3f} s (its wake: {c['wake']['seconds']:.3f} s)",
                 "< 2 s", verdict(value, 2.0, False, lambda v: f"{v:.3f} s")))

    for name, key, goal in (("discard-only: sleep", "sleep_s", 0.010),
                            ("discard-only: wake with zero-fill", "wake_s", 0.020)):
        value = med(discard, key) if discard else None
        rows.append((name, NOT_MEASURED if value is None else f"{value * 1e3:.2f} ms",
                     f"< {goal * 1e3:.0f} ms",
                     verdict(value, goal, False, lambda v: f"{v * 1e3:.2f} ms")))

    returned = [min(c["gpu"]["returned_pct"] for c in run["cycles"])
                for label, run in b.items() if label.startswith("target-") or
                label == "discard-only"]
    value = min(returned) if returned else None
    rows.append(("GPU memory returned by sleep (worst cycle of the target runs)",
                 NOT_MEASURED if value is None else f"{value:.3f} %", "≥ 99.9 %",
                 verdict(value, 99.9, True, lambda v: f"{v:.3f} points")))

    for label in ("target-retain", "target-release"):
        run = b.get(label)
        if not run or not run.get("medians"):
            rows.append((f"{label[7:]}: CPU time of a transition", NOT_MEASURED,
                         "small: no busy-waiting", NOT_MEASURED))
            continue
        s_cpu, w_cpu = med(run, "sleep_cpu_s"), med(run, "wake_cpu_s")
        s_wall, w_wall = med(run, "sleep_s"), med(run, "wake_s")
        rows.append((f"{label[7:]}: CPU time of a transition (all threads)",
                     f"sleep {s_cpu:.3f} s = {s_cpu / s_wall:.2f}× wall, "
                     f"wake {w_cpu:.3f} s = {w_cpu / w_wall:.2f}× wall",
                     "small: no busy-waiting", "judge: see the note below"))
    return "\n".join([
        "### Targets",
        "",
        f"Target runs: {workload(retain or release)}; discard-only: "
        f"{size(discard['config']['discard_bytes']) if discard else NOT_MEASURED}. "
        "Medians of the warm cycles (all but the first).",
        "",
        table(("target", "measured", "goal", "verdict"), rows),
        "",
        "CPU time counts every thread of the process (getrusage). In retain mode the "
        "copy engine does the work and the CPU should mostly sleep in event waits; in "
        "release mode every sleep faults in and pins fresh host memory for the copies, "
        "real work on the library's threads, so CPU seconds above wall seconds there "
        "are expected and are not busy-waiting (the wake, which only copies, stays "
        "small).",
    ])


def section_comparison(b):
    rows = [(name, s, w, ha, hw) for name, s, w, ha, hw in REFERENCES]
    for label, name in (("target-retain", "dormant, retain"),
                        ("target-release", "dormant, release")):
        run = b.get(label)
        if not run or not run.get("medians"):
            rows.append((f"**{name}**", NOT_MEASURED, NOT_MEASURED, NOT_MEASURED,
                         NOT_MEASURED))
            continue
        c = cold(run)
        rows.append((f"**{name}**",
                     f"{med(run, 'sleep_s'):.3f} s (first: {c['sleep']['seconds']:.2f} s)",
                     f"{med(run, 'wake_s'):.3f} s (first: {c['wake']['seconds']:.2f} s)",
                     f"{gib(med(run, 'host_asleep_bytes'))} GiB",
                     f"{gib(med(run, 'host_awake_settled_bytes'))} GiB"))
    ceiling = (b.get("target-retain") or b.get("target-release") or {}).get("ceiling")
    note = NOT_MEASURED if not ceiling else \
        (f"{ceiling['d2h']['seconds']:.3f} s device→host ({ceiling['d2h']['gbps']:.1f} GB/s), "
         f"{ceiling['h2d']['seconds']:.3f} s host→device ({ceiling['h2d']['gbps']:.1f} GB/s)")
    ours = b.get("target-retain") or b.get("target-release")
    return "\n".join([
        "### Compared with the reference tools",
        "",
        "The reference rows are those tools' figures, measured earlier on the same H200 machine "
        "with 16 GiB of bf16 weights kept and 16 GiB of fp32 gradients discarded; — "
        "means the figure was not reported. Ours: " + workload(ours) + ", medians of "
        "the warm cycles, the first cycle in brackets; host memory includes any pinned "
        "staging ring (none by default).",
        "",
        table(("", "sleep (pause)", "wake (resume)", "host memory asleep",
               "host memory awake"), rows),
        "",
        f"The copy ceiling of the kept bytes (plain pinned copies, same device): {note}.",
    ])


def run_row(label, run):
    cfg = run["config"]
    c = cold(run)
    return (label, size(cfg["keep_bytes"]) if cfg["keep_bytes"] else "0",
            size(cfg["discard_bytes"]) if cfg["discard_bytes"] else "0",
            cfg["tensors_per_policy"], size(cfg["chunk_bytes"]), cfg["host_mode"],
            num(med(run, "sleep_s"), 4), num(med(run, "wake_s"), 4),
            num(med(run, "sleep_gbps"), 1), num(med(run, "wake_gbps"), 1),
            num(med(run, "sleep_ceiling_ratio"), 2), num(med(run, "wake_ceiling_ratio"), 2),
            num(c["sleep"]["seconds"], 3) if c else "—",
            num(c["wake"]["seconds"], 3) if c else "—",
            num(med(run, "gpu_returned_pct"), 2),
            gib(med(run, "host_asleep_bytes")), gib(med(run, "host_awake_settled_bytes")),
            num(med(run, "sleep_cpu_s"), 2), num(med(run, "wake_cpu_s"), 2))


def section_runs(b):
    groups = ["target-retain", "target-release", "discard-only", "chunk-", "count-", "size-"]

    def group(label):
        return next((i for i, g in enumerate(groups) if label.startswith(g)), len(groups))

    order = sorted(b, key=lambda label: (group(label), sort_key(b[label]), label))
    rows = [run_row(label, b[label]) for label in order]
    return "\n".join([
        "### Every run",
        "",
        "Seconds and GB/s are medians of the warm cycles; GB/s counts kept bytes "
        "(1e9 bytes/s); ceil: ratio to the pinned copy ceiling; cold: the first cycle; "
        "GPU back: device bytes freed by sleep / bytes managed; host GiB: copies + "
        "staging, awake after background frees.",
        "",
        table(("run", "kept", "discarded", "tensors/policy", "chunk", "mode", "sleep s",
               "wake s", "sleep GB/s", "wake GB/s", "sleep ceil", "wake ceil",
               "cold sleep s", "cold wake s", "GPU back %", "host GiB asleep",
               "host GiB awake", "CPU s sleep", "CPU s wake"), rows),
    ])


def sort_key(run):
    cfg = run["config"]
    return (cfg["keep_bytes"] + cfg["discard_bytes"], cfg["tensors_per_policy"],
            cfg["chunk_bytes"])


def series(b, prefix):
    runs = [run for label, run in b.items() if label.startswith(prefix)]
    return sorted(runs, key=sort_key)


def section_scaling(b, plots):
    out = ["### Scaling", ""]
    sizes = series(b, "size-")
    rows = []
    for run in sizes:
        cfg, ceiling = run["config"], run.get("ceiling") or {}
        rows.append((size(cfg["keep_bytes"]), size(cfg["discard_bytes"]),
                     num(med(run, "sleep_s"), 4), num(med(run, "wake_s"), 4),
                     num((ceiling.get("d2h") or {}).get("seconds"), 4),
                     num((ceiling.get("h2d") or {}).get("seconds"), 4),
                     num(med(run, "sleep_ceiling_ratio"), 2),
                     num(med(run, "wake_ceiling_ratio"), 2),
                     num(cold(run)["sleep"]["seconds"], 3)))
    out += ["By size (retain mode, one tensor per policy, as many bytes discarded as kept):", ""]
    out.append(table(("kept", "discarded", "sleep s", "wake s", "ceiling d→h s",
                      "ceiling h→d s", "sleep ceil", "wake ceil", "cold sleep s"), rows)
               if rows else NOT_MEASURED + ".")
    if "size" in plots:
        out += ["", f"![sleep and wake time by size]({plots['size']})"]
    counts = series(b, "count-")
    rows = []
    for run in counts:
        cfg = run["config"]
        rows.append((cfg["tensors_per_policy"], size(cfg["keep_tensors"]["median_bytes"] or 0),
                     size(cfg["keep_tensors"]["max_bytes"] or 0),
                     gib(cfg["keep_tensors"]["reserved_bytes"] +
                         cfg["discard_tensors"]["reserved_bytes"]),
                     num(med(run, "sleep_s"), 4), num(med(run, "wake_s"), 4),
                     num(med(run, "sleep_ceiling_ratio"), 2),
                     num(med(run, "wake_ceiling_ratio"), 2),
                     num(cold(run)["sleep"]["seconds"], 3), num(run["setup"]["alloc_s"], 2)))
    out += ["", f"By allocation count (retain mode, {workload(counts[0] if counts else None)}, "
            "each split into N tensors of log-uniform sizes):", ""]
    out.append(table(("tensors/policy", "median kept tensor", "largest", "device GiB mapped",
                      "sleep s", "wake s", "sleep ceil", "wake ceil", "cold sleep s",
                      "allocation s"), rows) if rows else NOT_MEASURED + ".")
    if "count" in plots:
        out += ["", f"![sleep and wake time by allocation count]({plots['count']})"]
    chunks = series(b, "chunk-")
    rows = [(size(run["config"]["chunk_bytes"]), ms(med(run, "sleep_s")),
             ms(med(run, "wake_s")), ms(cold(run)["sleep"]["seconds"]),
             ms(cold(run)["wake"]["seconds"])) for run in chunks]
    discarded = size(chunks[0]["config"]["discard_bytes"]) if chunks else "16 GiB"
    out += ["", f"Discard-only {discarded} by chunk size (ms, medians of the warm cycles):", ""]
    out.append(table(("chunk", "sleep ms", "wake ms", "cold sleep ms", "cold wake ms"), rows)
               if rows else NOT_MEASURED + ".")
    return "\n".join(out)


def section_probe(p, plots):
    if not p:
        return "### The VMM probe\n\n" + NOT_MEASURED + "."
    probe = next(iter(p.values()))
    rows_by_chunk = {}
    threads = sorted({r["threads"] for r in probe["rows"]})
    for r in probe["rows"]:
        rows_by_chunk.setdefault(r["chunk_bytes"], {})[r["threads"]] = r
    header = ["chunk", "chunks", "create+map ms (1 thread)", "zero ms"] + \
        [f"unmap+release ms ({t} thr)" for t in threads]
    rows = []
    for chunk in sorted(rows_by_chunk):
        by = rows_by_chunk[chunk]
        one = by.get(1) or next(iter(by.values()))
        rows.append([size(chunk), one["chunks"], ms(one["create_map_s"]), ms(one["zero_s"])] +
                    [ms(by[t]["unmap_release_s"]) if t in by else "—" for t in threads])
    out = ["### The VMM probe",
           "",
           f"probe-vmm over {size(probe['config']['size_bytes'])}, medians of "
           f"{probe['config']['reps']}; the chunks are shared out over the threads "
           "(fewer threads than listed when there are fewer chunks).",
           "",
           table(header, rows)]
    if "vmm" in plots:
        out += ["", f"![unmap and release time by chunk size]({plots['vmm']})"]
    o = probe.get("overlap")
    if o:
        out += ["",
                f"Overlap: a {size(o['chunk_bytes'])} chunk unmapped and released while "
                f"{size(o['copy_bytes'])} copy device→host (alone {ms(o['d2h_alone_s'])} ms): "
                f"unmap {ms(o['unmap_busy_s'])} ms, release {ms(o['release_busy_s'])} ms "
                f"(idle device: {ms(o['unmap_idle_s'])} ms, {ms(o['release_idle_s'])} ms). "
                f"Created and mapped while a copy runs host→device (alone "
                f"{ms(o['h2d_alone_s'])} ms): create {ms(o['create_busy_s'])} ms, map "
                f"{ms(o['map_busy_s'])} ms (idle: {ms(o['create_idle_s'])} ms, "
                f"{ms(o['map_idle_s'])} ms). An unmap or map that takes about as long as "
                "the copy waits for it."]
    return "\n".join(out)


def section_machine(machine, b, problems):
    any_run = next(iter(b.values()), None)
    lines = ["### Machine and run", ""]
    if machine:
        lines += ["```", machine, "```"]
    elif any_run:
        m = any_run["machine"]
        lines.append(f"{m['cpus']} CPUs, {gib(m['host_memory_bytes'])} GiB host memory, "
                     f"{gib(m['device_memory_bytes'])} GiB device memory, kernel {m['kernel']}.")
    else:
        lines.append(NOT_MEASURED + ".")
    backends = sorted({run["config"]["backend"] for run in b.values()})
    if backends and backends != ["cuda"]:
        lines += ["", f"**Backend: {', '.join(backends)} — these are not GPU numbers.**"]
    problems = [(label, reason) for label, reason in problems if label not in b]
    if problems:
        lines += ["", "Runs of the matrix that did not complete:", ""]
        lines += [f"- `{label}`: {reason}" for label, reason in problems]
    return "\n".join(lines)


# ---- plots -----------------------------------------------------------------

def make_plots(b, p, docs):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("report.py: matplotlib is missing (apt-get install python3-matplotlib), "
                 "or pass --no-plots")
    written = {}
    backends = {run["config"]["backend"] for run in b.values()}
    caveat = "" if backends <= {"cuda"} else "\n(host backend: not GPU numbers)"

    def save(fig, name):
        path = os.path.join(docs, f"bench-{name}.png")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written[name] = os.path.basename(path)

    sizes = series(b, "size-")
    if sizes:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        x = [run["config"]["keep_bytes"] / GIB for run in sizes]
        ax.plot(x, [med(run, "sleep_s") for run in sizes], "o-", label="sleep (median)")
        ax.plot(x, [med(run, "wake_s") for run in sizes], "s-", label="wake (median)")
        ax.plot(x, [cold(run)["sleep"]["seconds"] for run in sizes], "v:",
                label="first (cold) sleep")
        ceil = [(xi, (run.get("ceiling") or {}).get("d2h", {}).get("seconds"))
                for xi, run in zip(x, sizes)]
        ceil = [(xi, s) for xi, s in ceil if s]
        if ceil:
            ax.plot([c[0] for c in ceil], [c[1] for c in ceil], "k--",
                    label="pinned copy ceiling (device→host)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("GiB kept (as many discarded)")
        ax.set_ylabel("seconds")
        ax.set_title("Sleep and wake time by size (retain mode)" + caveat)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        save(fig, "size")

    counts = series(b, "count-")
    if counts:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        x = [run["config"]["tensors_per_policy"] for run in counts]
        ax.plot(x, [med(run, "sleep_s") for run in counts], "o-", label="sleep (median)")
        ax.plot(x, [med(run, "wake_s") for run in counts], "s-", label="wake (median)")
        ax.plot(x, [cold(run)["sleep"]["seconds"] for run in counts], "v:",
                label="first (cold) sleep")
        ceiling = (counts[0].get("ceiling") or {}).get("d2h", {}).get("seconds")
        if ceiling:
            ax.axhline(ceiling, color="k", linestyle="--",
                       label="pinned copy ceiling (device→host)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"tensors per policy ({workload(counts[0])})")
        ax.set_ylabel("seconds")
        ax.set_title("Sleep and wake time by allocation count (retain mode)" + caveat)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        save(fig, "count")

    if p:
        probe = next(iter(p.values()))
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for t in sorted({r["threads"] for r in probe["rows"]}):
            rows = sorted((r for r in probe["rows"] if r["threads"] == t),
                          key=lambda r: r["chunk_bytes"])
            ax.plot([r["chunk_bytes"] / (1 << 20) for r in rows],
                    [r["unmap_release_s"] * 1e3 for r in rows], "o-",
                    label=f"unmap+release, {t} thread{'s' if t > 1 else ''}")
        rows = sorted((r for r in probe["rows"] if r["threads"] == 1),
                      key=lambda r: r["chunk_bytes"])
        ax.plot([r["chunk_bytes"] / (1 << 20) for r in rows],
                [r["create_map_s"] * 1e3 for r in rows], "s--", label="create+map, 1 thread")
        ax.axhline(10, color="r", linestyle=":", label="discard sleep target (10 ms)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(f"chunk size, MiB ({size(probe['config']['size_bytes'])} in all)")
        ax.set_ylabel("milliseconds")
        ax.set_title("VMM costs by chunk size" + (
            "" if probe["config"]["backend"] == "cuda" else "\n(host backend: not GPU numbers)"))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, "vmm")
    return written


# ---- main ------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="folder of bench/run-h200.sh's JSON files")
    parser.add_argument("--update", metavar="FILE",
                        help="replace the results block of FILE (docs/benchmarks.md)")
    parser.add_argument("--docs", default=None,
                        help="where the PNG plots go (default: FILE's folder, else docs)")
    parser.add_argument("--no-plots", action="store_true", help="tables only")
    args = parser.parse_args()

    benches, probes, machine, problems = load(args.results)
    if not benches and not probes:
        sys.exit(f"report.py: no dormant-bench or probe-vmm JSON in {args.results}")
    docs = args.docs or (os.path.dirname(args.update) if args.update else "docs") or "."
    plots = {} if args.no_plots else make_plots(benches, probes, docs)
    text = "\n\n".join([
        "_Generated by bench/report.py from the files of bench/run-h200.sh; do not edit "
        "by hand._",
        section_machine(machine, benches, problems),
        section_targets(benches),
        section_comparison(benches),
        section_scaling(benches, plots),
        section_probe(probes, plots),
        section_runs(benches),
    ])
    if not args.update:
        print(text)
        return
    with open(args.update, encoding="utf-8") as f:
        doc = f.read()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(doc):
        sys.exit(f"report.py: {args.update} lacks the markers {BEGIN} ... {END}")
    doc = pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", doc, count=1)
    with open(args.update, "w", encoding="utf-8") as f:
        f.write(doc)
    print(f"report.py: updated {args.update}" +
          (f" and wrote {', '.join(sorted(plots.values()))} in {docs}" if plots else ""))


if __name__ == "__main__":
    main()
