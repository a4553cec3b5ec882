"""Smoke check of the benchmarks' JSON output (CI, host backend).

usage: check_json.py DORMANT_BENCH PROBE_VMM
       check_json.py --corruption DORMANT_BENCH

Runs both programs with small sizes and --json, and checks the shape of the
output and the invariants that hold on any backend: every cycle copies the
kept bytes each way, sleep returns all the managed device memory, the check
after the last wake passed. No timing is asserted.

With --corruption: a run with one kept byte changed (--debug-corrupt) must
fail with exit status 1 and the check's own message (failing for any other
reason does not count).
"""
import json
import subprocess
import sys

KEEP = 48 << 20
DISCARD = 32 << 20
TENSORS = 30
CYCLES = 3


def run_json(argv):
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=300)
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} exited with {done.returncode}:\n{done.stderr}")
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError as e:
        sys.exit(f"{' '.join(argv)} printed invalid JSON ({e}):\n{done.stdout[:2000]}")


def expect(condition, what):
    if not condition:
        sys.exit(f"check failed: {what}")


def check_bench(bench, mode, keep, discard):
    out = run_json([bench, "--backend", "host", "--host-mode", mode,
                    "--keep", str(keep), "--discard", str(discard),
                    "--tensors", str(TENSORS), "--cycles", str(CYCLES),
                    "--ceiling-reps", "2", "--label", f"smoke-{mode}", "--json"])
    where = f"dormant-bench {mode} keep={keep}"
    expect(out["tool"] == "dormant-bench", f"{where}: tool")
    expect(out["label"] == f"smoke-{mode}", f"{where}: label")
    cfg = out["config"]
    expect(cfg["backend"] == "host", f"{where}: backend")
    expect(cfg["host_mode"] == mode, f"{where}: host_mode")
    expect(cfg["keep_bytes"] == keep and cfg["discard_bytes"] == discard, f"{where}: sizes")
    expect(cfg["keep_tensors"]["count"] == (TENSORS if keep else 0), f"{where}: keep count")
    expect(cfg["discard_tensors"]["count"] == TENSORS, f"{where}: discard count")
    expect(cfg["keep_tensors"]["bytes"] == keep, f"{where}: keep tensor bytes")
    if keep:
        ceiling = out["ceiling"]
        expect(ceiling["bytes"] == keep and ceiling["reps"] == 2, f"{where}: ceiling")
        for way in ("d2h", "h2d"):
            expect(ceiling[way]["seconds"] > 0 and ceiling[way]["gbps"] > 0,
                   f"{where}: ceiling {way}")
            expect(len(ceiling[way]["reps_s"]) == 2, f"{where}: ceiling {way} reps")
    else:
        expect(out["ceiling"] is None, f"{where}: no ceiling without kept bytes")

    cycles = out["cycles"]
    expect(len(cycles) == CYCLES, f"{where}: {len(cycles)} cycles")
    lazyfree = []  # per cycle, awake once settled
    for i, c in enumerate(cycles):
        w = f"{where} cycle {i}"
        expect(c["index"] == i and c["cold"] == (i == 0), f"{w}: index/cold")
        # Small tensors share slabs, 512-byte aligned: a copy ends at the
        # slab's last live byte, so at most 512 bytes per tensor more.
        slack = 512 * (TENSORS if keep else 0)
        for kind in ("sleep", "wake"):
            copied = c[kind]["bytes_copied"]
            expect(keep <= copied <= keep + slack, f"{w}: {kind} copied {copied} of {keep}")
        expect(c["wake"]["bytes_zeroed"] >= discard, f"{w}: wake zeroed")
        expect(c["sleep"]["bytes_released"] == c["gpu"]["managed_bytes"], f"{w}: released")
        expect(c["gpu"]["managed_asleep_bytes"] == 0, f"{w}: device bytes left asleep")
        # The host backend's free memory is exact: all of it comes back.
        expect(c["gpu"]["returned_bytes"] == c["gpu"]["managed_bytes"], f"{w}: returned")
        expect(c["host"]["asleep_bytes"] >= keep, f"{w}: host copies asleep")
        for kind in ("sleep", "wake"):
            expect(c[kind]["seconds"] > 0 and c[kind]["cpu_s"] >= 0, f"{w}: {kind} times")
            if keep:
                expect(c[kind]["gbps"] > 0 and c[kind]["ceiling_ratio"] > 0, f"{w}: {kind} rate")
            else:
                expect(c[kind]["gbps"] is None, f"{w}: {kind} rate without kept bytes")
        # what the process holds awake, as its users see it: reclaimable
        # mode's copies are in RSS, as LazyFree (MADV_FREE, not taken yet);
        # compared across the modes in main(), since the simulated device's
        # spare memory is LazyFree too
        proc = c["host"]["process_awake_settled"]
        if "lazyfree_bytes" in proc and keep:
            expect(proc["rss_bytes"] >= proc["lazyfree_bytes"], f"{w}: RSS holds LazyFree")
            lazyfree.append(proc["lazyfree_bytes"])
            # MADV_FREE pages sit on the inactive file list, which the
            # kubelet's working set leaves out
            if mode == "reclaimable" and "cgroup_working_set_bytes" in proc:
                inactive = proc["cgroup_memory_current_bytes"] - proc["cgroup_working_set_bytes"]
                expect(inactive >= keep * 0.9,
                       f"{w}: reclaimable copies are outside the working set")
        if keep:
            wc = c["wake"]["wake_copy"]
            expect(wc["method"] in ("engine", "kernel", "mixed"), f"{w}: wake copy method")
            expect(wc["bytes_engine"] + wc["bytes_kernel"] == c["wake"]["bytes_copied"],
                   f"{w}: wake copy bytes by method")
        if mode == "retain":
            expect(c["host"]["awake_settled_bytes"] >= keep, f"{w}: retained copies")
        else:
            # Release mode drops the copies; at most the staging ring stays.
            expect(c["host"]["awake_settled_bytes"] <= cfg["staging_bytes"],
                   f"{w}: host bytes held awake in release mode")
    med = out["medians"]
    expect(med["warm_cycles"] == CYCLES - 1, f"{where}: warm cycles")
    expect(med["sleep_s"] > 0 and med["wake_s"] > 0, f"{where}: medians")
    expect(med["gpu_returned_pct"] == 100, f"{where}: returned pct")
    ver = out["verify"]
    expect(ver["ok"] and ver["keep_bytes"] == keep and ver["zero_bytes"] == discard,
           f"{where}: verify")
    return min(lazyfree) if lazyfree else None


def check_corruption(bench):
    """A changed kept byte must fail the run, with the check's message."""
    argv = [bench, "--backend", "host", "--keep", "8MiB", "--discard", "8MiB",
            "--tensors", "4", "--cycles", "1", "--ceiling-reps", "0", "--debug-corrupt"]
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=300)
    expect(done.returncode == 1, f"--debug-corrupt exited with {done.returncode}, not 1")
    expect("check failed: kept tensor" in done.stderr,
           f"--debug-corrupt did not report the changed byte:\n{done.stderr}")


def check_probe(probe):
    out = run_json([probe, "--backend", "host", "--size", "32MiB", "--chunks", "2MiB,8MiB",
                    "--threads", "1,3", "--reps", "2", "--overlap", "8MiB", "--json"])
    expect(out["tool"] == "probe-vmm", "probe: tool")
    rows = out["rows"]
    expect(len(rows) == 4, f"probe: {len(rows)} rows")
    for r in rows:
        expect(r["chunks"] * r["chunk_bytes"] == 32 << 20, "probe: chunk count")
        for key in ("create_s", "map_s", "zero_s", "unmap_s", "release_s",
                    "create_map_s", "unmap_release_s"):
            expect(r[key] >= 0, f"probe: {key}")
    expect(out["overlap"] is not None and out["overlap"]["copy_bytes"] == 8 << 20,
           "probe: overlap")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    if sys.argv[1] == "--corruption":
        check_corruption(sys.argv[2])
        print("ok: dormant-bench fails on a changed byte, with the check's message")
        return
    bench, probe = sys.argv[1], sys.argv[2]
    lazyfree = {mode: check_bench(bench, mode, KEEP, DISCARD)
                for mode in ("retain", "release", "reclaimable")}
    if None not in lazyfree.values():
        # (a few pages short: the kernel may split or take some)
        expect(lazyfree["reclaimable"] - lazyfree["release"] >= KEEP * 0.9,
               f"reclaimable copies are LazyFree awake: {lazyfree}")
        for mode in ("retain", "release"):
            expect(lazyfree[mode] < lazyfree["reclaimable"] - KEEP / 2,
                   f"no LazyFree copies awake in {mode} mode: {lazyfree}")
    check_bench(bench, "release", 0, DISCARD)
    check_probe(probe)
    print("ok: dormant-bench and probe-vmm JSON")


if __name__ == "__main__":
    main()
