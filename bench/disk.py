#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Sleep and wake of GPU memory to disk: dormant's policy "disk" against
torch_memory_saver's disk backup on the same data, and against the disk's own
rate (dd with O_DIRECT) as the ceiling.

    python3 bench/disk.py --dir DIR [--gib 16] [--cycles 3] [--tms-src SRC]
        [--api-options OPT=VALUE,...]... [--json FILE]

DIR must be on the disk to measure (not tmpfs: that is host memory). Rows,
each program in a process of its own:
  - dd: `dd bs=64M oflag=direct` writing --gib GiB to DIR, then `iflag=direct`
    reading it back (the page cache bypassed, as dormant's O_DIRECT files);
  - ddN: the same with --dd-streams (4) dd processes at once, each its own
    part of the file: the ceiling of a disk that serves several requests at
    once, as dormant's reads and writes keep several in flight;
  - ddbuf: one `dd bs=256M` through the page cache (written with fsync, read
    after the cache is dropped): the access pattern of torch_memory_saver's
    disk backup (buffered 256 MiB preads, the kernel's read-ahead ahead of
    them), to tell on a new disk whether reading through the cache
    (disk_read=cached) or around it (direct) should win;
  - dormant API: a tag with policy "disk" holding --gib GiB of random bytes,
    Manager.sleep() and wake() (the reports' durations), checksums verified;
    each --api-options (dormant options, e.g. disk_read=cached, or
    staging_bytes=1GiB,disk_chunk_bytes=256MiB) adds one more such row;
  - dormant (the switch): torch_memory_saver's program (region(
    enable_disk_backup=True), torch.randn bf16) under dormant.run
    --torch-memory-saver;
  - torch_memory_saver: the same program on torch_memory_saver built in place
    in SRC (TMS_CUDA_MAJOR=13 python3 setup.py build_ext --inplace), hook_mode
    "preload" with its LD_PRELOAD hook (its "torch" mode aborts this program),
    with TMS_DISK_BACKUP_DIR=DIR.
It prints a Markdown table: GB/s and seconds for write/sleep and read/wake
(median of the cycles after the first, and the first), host memory while
asleep (RSS above the start), whether the data came back intact. Nothing is
downloaded; scripts/gpu-disk runs it on the GPU machine.
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

from rows import report, rss_bytes, run_rows

REPO = pathlib.Path(__file__).resolve().parents[1]
GiB = 1 << 30


def drop_caches():
    """Best effort (root only): a read measured from the disk, not memory."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def dd_row(directory, gib, cycles, streams=1, direct=True):
    """dd with O_DIRECT, in 64 MiB blocks: one stream, or `streams` dd
    processes at once, each writing then reading its own part of one file
    (a disk that serves several requests at once is faster so: the ceiling
    the wake's reads, several in flight, are held against)."""
    path = pathlib.Path(directory) / f"dormant-bench-dd-{os.getpid()}.bin"
    block = (64 << 20) if direct else (256 << 20)
    count = int(gib * GiB) // block
    share = [count // streams + (1 if i < count % streams else 0) for i in range(streams)]
    start = [sum(share[:i]) for i in range(streams)]
    if not direct:
        label = "dd through the page cache, 256 MiB blocks"
    else:
        label = ("dd O_DIRECT (the disk's ceiling)" if streams == 1
                 else f"dd O_DIRECT, {streams} streams at once")
    oflag = ["oflag=direct"] if direct else []
    iflag = ["iflag=direct"] if direct else []
    out = {"label": label, "streams": streams, "cycles": []}

    def run_all(commands):
        procs = [subprocess.Popen(c) for c in commands]
        codes = [p.wait() for p in procs]
        if any(codes):
            raise subprocess.CalledProcessError(max(codes), commands[0])

    try:
        for _ in range(cycles):
            path.unlink(missing_ok=True)
            t0 = time.perf_counter()
            run_all([["dd", "if=/dev/zero", f"of={path}", f"bs={block >> 20}M", f"count={n}",
                      f"seek={s}", *oflag, "conv=notrunc,fsync", "status=none"]
                     for n, s in zip(share, start) if n])
            t1 = time.perf_counter()
            drop_caches()
            t2 = time.perf_counter()
            run_all([["dd", f"if={path}", "of=/dev/null", f"bs={block >> 20}M", f"count={n}",
                      f"skip={s}", *iflag, "status=none"]
                     for n, s in zip(share, start) if n])
            t3 = time.perf_counter()
            out["cycles"].append({"sleep_s": t1 - t0, "wake_s": t3 - t2,
                                  "bytes": count * block, "intact": True,
                                  "host_asleep_bytes": 0})
    finally:
        path.unlink(missing_ok=True)
    return out


def parse_options(text):
    """'a=1,b=2' -> {"a": "1", "b": "2"}; ValueError names what is wrong."""
    out = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, eq, value = item.partition("=")
        if not eq or not name.strip() or not value.strip():
            raise ValueError(f"{item!r} is not OPTION=VALUE")
        out[name.strip()] = value.strip()
    return out


def api_worker(directory, gib, cycles, options=""):
    """dormant's own API, no torch: one tag of policy disk, with options
    ('a=1,b=2') on top of the row's own."""
    sys.path.insert(0, str(REPO / "python"))
    import dormant

    size = int(gib * GiB)
    piece = 256 << 20
    m = dormant.Manager(**dict({"backend": os.environ.get("DORMANT_BACKEND", "cuda"),
                                "disk_dir": directory, "chunk_bytes": "1GiB"},
                               **parse_options(options)))
    verifying = m.option("verify") == "true"  # from options or $DORMANT_VERIFY
    m.set_policy("cold", "disk")
    ptr = m.alloc("cold", size)
    block = os.urandom(piece)
    for off in range(0, size, piece):
        m.copy_to_device(ptr + off, block[:min(piece, size - off)])
    last = (size - 1) // piece * piece  # where the last piece written starts
    rss0 = rss_bytes()
    out = {"label": "dormant API, policy disk" + (f" ({options})" if options else ""),
           "options": options, "cycles": []}
    for _ in range(cycles):
        drop_caches()
        s = m.sleep()
        asleep = rss_bytes() - rss0
        disk = m.stats()["totals"]["disk_bytes"]
        drop_caches()
        w = m.wake()
        # with verify off no chunk is checked: the bytes read back still are
        intact = (w.get("chunk_mismatches", 0) == 0 and
                  (w.get("chunks_verified", 0) > 0 or not verifying) and
                  m.copy_to_host(ptr + last, size - last) == block[:size - last])
        out["cycles"].append({"sleep_s": s["duration_s"], "wake_s": w["duration_s"],
                              "bytes": size, "disk_bytes": disk, "intact": intact,
                              "host_asleep_bytes": asleep})
    m.close()
    print("RESULT " + json.dumps(out), flush=True)


def tms_worker(directory, gib, cycles):
    """A torch_memory_saver program with disk backup (whichever library
    answers to the name)."""
    import torch
    import torch_memory_saver as package
    from torch_memory_saver import torch_memory_saver as tms

    # the real torch_memory_saver in "preload" (its torch mode aborts this
    # program: "only support interesting region" in tms_torch_free, seen on
    # the H200); the switch in "torch"
    tms.hook_mode = os.environ.get("BENCH_TMS_HOOK_MODE", "torch")
    tms.set_disk_backup_dir(directory)
    torch.cuda.init()
    g = torch.Generator(device="cuda").manual_seed(0)
    with tms.region("default", enable_disk_backup=True):
        x = torch.randn(int(gib * GiB) // 2, dtype=torch.bfloat16, device="cuda", generator=g)
    def checksum_of(t, piece=1 << 28):
        # in pieces: the int64 sum of all of it at once takes 4x its size
        flat = t.view(torch.int16)
        return sum(int(flat[i:i + piece].sum(dtype=torch.int64))
                   for i in range(0, flat.numel(), piece))

    checksum = checksum_of(x)
    torch.cuda.synchronize()
    rss0 = rss_bytes()
    lib = "dormant" if getattr(package, "__dormant__", False) else "torch_memory_saver"
    out = {"label": lib, "cycles": []}
    for _ in range(cycles):
        drop_caches()
        t0 = time.perf_counter()
        tms.pause()
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        asleep = rss_bytes() - rss0
        drop_caches()
        t2 = time.perf_counter()
        tms.resume()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        out["cycles"].append({"sleep_s": t1 - t0, "wake_s": t3 - t2, "bytes": x.numel() * 2,
                              "intact": checksum_of(x) == checksum,
                              "host_asleep_bytes": asleep})
    print("RESULT " + json.dumps(out), flush=True)


def summarize(row):
    if "error" in row:
        return f"| {row['label']} | failed: {row['error'][:300]} | | | | | | |"
    cycles = row["cycles"]
    later = cycles[1:] or cycles
    med = lambda key: statistics.median(c[key] for c in later)  # noqa: E731
    gbps = lambda key: statistics.median(c["bytes"] / c[key] / 1e9 for c in later)  # noqa: E731
    host = max(c["host_asleep_bytes"] for c in cycles) / GiB
    ok = all(c["intact"] for c in cycles)
    return (f"| {row['label']} | {gbps('sleep_s'):.2f} | {med('sleep_s'):.2f} | "
            f"{cycles[0]['sleep_s']:.2f} | {gbps('wake_s'):.2f} | {med('wake_s'):.2f} | "
            f"{host:.2f} | {'yes' if ok else 'NO'} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="a directory on the disk to measure")
    ap.add_argument("--gib", type=float, default=16)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--tms-src", help="torch_memory_saver built in place (row left out without)")
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--timeout-s", type=int, default=600, help="per program")
    ap.add_argument("--rows", default="dd,ddN,ddbuf,api,switch,tms",
                    help="which rows, comma-separated: dd, ddN (--dd-streams dd at once), "
                         "ddbuf (dd through the page cache), api, switch, tms (default all)")
    ap.add_argument("--dd-streams", type=int, default=4,
                    help="how many dd processes the ddN row runs at once (default 4)")
    ap.add_argument("--api-options", action="append", default=[], metavar="OPT=VALUE,...",
                    help="one more dormant API row with these options (repeatable), "
                         "e.g. disk_read=cached")
    ap.add_argument("--worker", choices=("api", "tms"), help=argparse.SUPPRESS)
    ap.add_argument("--worker-options", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    wanted = {r.strip() for r in args.rows.split(",") if r.strip()}
    unknown = wanted - {"dd", "ddN", "ddbuf", "api", "switch", "tms"}
    if unknown or not wanted:
        ap.error(f"--rows takes dd, ddN, ddbuf, api, switch, tms; not "
                 f"{','.join(sorted(unknown)) or 'nothing'}")
    if args.dd_streams < 1:
        ap.error(f"--dd-streams takes 1 or more, not {args.dd_streams}")
    for text in args.api_options + [args.worker_options]:
        try:
            parse_options(text)
        except ValueError as e:
            ap.error(f"--api-options: {e}")
    if args.api_options and "api" not in wanted:
        ap.error("--api-options adds dormant API rows: --rows must name api")
    if args.worker == "api":
        api_worker(args.dir, args.gib, args.cycles, args.worker_options)
        return 0
    if args.worker == "tms":
        tms_worker(args.dir, args.gib, args.cycles)
        return 0

    me = [sys.executable, str(pathlib.Path(__file__).resolve()), "--dir", args.dir,
          "--gib", str(args.gib), "--cycles", str(args.cycles), "--worker"]
    base = dict(os.environ)
    base.pop("LD_PRELOAD", None)
    path = [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
    ours = dict(base, PYTHONPATH=os.pathsep.join([str(REPO / "python")] + path))
    switch = [sys.executable, "-m", "dormant.run", "--torch-memory-saver", "--"]
    results = []
    for row, streams, direct in (("dd", 1, True), ("ddN", args.dd_streams, True),
                                 ("ddbuf", 1, False)):
        if row in wanted:
            results.append(dd_row(args.dir, args.gib, args.cycles, streams, direct))
            print(f"# {json.dumps(results[-1])[:400]}", file=sys.stderr, flush=True)
    rows = []
    if "api" in wanted:
        rows.append(("dormant API, policy disk", me + ["api"], ours))
        for text in args.api_options:
            rows.append((f"dormant API, policy disk ({text})",
                         me + ["api", "--worker-options", text], ours))
    if "switch" in wanted:
        rows.append(("dormant (the switch), enable_disk_backup", switch + me + ["tms"], ours))
    if args.tms_src and "tms" in wanted:
        src = pathlib.Path(args.tms_src).resolve()
        hooks = sorted(src.rglob("torch_memory_saver_hook_mode_preload*.so"))
        if not hooks:
            print(f"no torch_memory_saver_hook_mode_preload*.so under {src}: build it first",
                  file=sys.stderr)
            return 2
        theirs = dict(base, PYTHONPATH=os.pathsep.join([str(src)] + path),
                      TMS_DISK_BACKUP_DIR=args.dir, BENCH_TMS_HOOK_MODE="preload",
                      LD_PRELOAD=str(hooks[0]))
        rows.append(("torch_memory_saver, enable_disk_backup", me + ["tms"], theirs))
    results += run_rows(rows, args.timeout_s)
    return report(results,
                  f"{args.gib:g} GiB to {args.dir} and back, {args.cycles} cycles (page cache "
                  f"dropped before each direction where root may).\n",
                  ["run", "sleep/write GB/s", "sleep s", "first sleep s", "wake/read GB/s",
                   "wake s", "host GiB asleep", "intact"], summarize, args.json)


if __name__ == "__main__":
    sys.exit(main())
