# SPDX-License-Identifier: MIT
"""bench/handover.py's driver on the host backend (issue 16): the phases run
over HTTP with the CPU stand-in for the rollout (the trainer's simulated
device made full while it "holds" the memory), the early wake gets its 503
and the retry succeeds, every kept byte is verified after every wake, and
the report has the transition's parts. Small sizes; nothing is timed."""
import argparse
import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "handover.py"
SMALL = ["--backend", "host", "--kept-gb", "0.01", "--layers", "4", "--phases", "2",
         "--host-device-bytes", str(64 << 20)]


def run(tmp_path, *extra):
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, str(BENCH), "--out", str(out), *SMALL, *extra],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ))
    doc = json.loads((out / "handover.json").read_text())
    return p, doc


def failed(doc):
    return [c["check"] for c in doc["checks"] if not c["ok"]]


def test_handover_phases_on_the_host_backend(tmp_path):
    p, doc = run(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert failed(doc) == []
    assert [r["label"] for r in doc["results"]] == ["host-overlap1", "host-overlap0"]
    for r in doc["results"]:
        assert len(r["phases"]) == 2
        first = r["phases"][0]
        assert first["early_wake"]["status"] == 503
        assert first["wake_attempts"] > 1
        assert all(ph["verified"] for ph in r["phases"])
        for ph in r["phases"]:
            assert ph["wake_bytes"] == ph["sleep_bytes"] > 0
            assert ph["rollout"]["bytes"] == 64 << 20
            assert set(ph["wake_parts"]) >= {"map_s", "map_wait_s", "copy_s", "zero_wait_s"}
            assert ph["wake_parts"]["map_s"] > 0       # measured, not timed
            assert ph["sleep_parts"]["release_s"] > 0
    checks = [c["check"] for c in doc["checks"]]
    assert any("early wake answered 503" in c for c in checks)
    assert sum("every kept byte back" in c for c in checks) == 4
    assert "checks: " in (tmp_path / "out" / "handover.txt").read_text()


def test_reclaimable_mode_with_a_pinned_share_kept(tmp_path, monkeypatch):
    """The host mode scripts/gpu-residue pinkeep runs the trainer in: the
    share of host copies that pin_host_bytes pins stays pinned between
    cycles (reclaimable_pinned_bytes), the rest reclaimable; every check
    holds and the report says the mode."""
    monkeypatch.setenv("DORMANT_PIN_HOST", "0")
    monkeypatch.setenv("DORMANT_PIN_HOST_BYTES", "4MiB")
    monkeypatch.setenv("DORMANT_RECLAIMABLE_PINNED_BYTES", "4MiB")
    p, doc = run(tmp_path, "--overlap", "1", "--host-mode", "reclaimable")
    assert p.returncode == 0, p.stdout + p.stderr
    assert failed(doc) == []
    assert all(ph["verified"] for ph in doc["results"][0]["phases"])
    assert "host mode reclaimable" in (tmp_path / "out" / "handover.txt").read_text()


def test_a_changed_byte_fails_the_run(tmp_path):
    p, doc = run(tmp_path, "--overlap", "1", "--test-corrupt-step", "2")
    assert p.returncode == 1
    assert failed(doc) == ["host-overlap1 phase 1: every kept byte back, same addresses"]


def test_a_wake_that_is_not_refused_fails_the_run(tmp_path):
    """The rollout leaves room enough for the trainer: the early wake
    succeeds, which the benchmark must report as a failed check."""
    p, doc = run(tmp_path, "--overlap", "1", "--host-rollout-leave", str(48 << 20))
    assert p.returncode == 1
    assert "host-overlap1 phase 1: early wake answered 503" in failed(doc)


def test_the_report_asleep_has_dormants_numbers(tmp_path):
    """Each phase asks the sleeping trainer what it holds: on the host
    backend only dormant's side (no torch), and the table prints it."""
    p, doc = run(tmp_path, "--overlap", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    for ph in doc["results"][0]["phases"]:
        m = ph["trainer_memory_asleep"]
        assert m["dormant"]["device_bytes"] == 0          # released asleep
        assert m["dormant"]["host_bytes"] >= ph["sleep_bytes"] > 0
        assert "torch" not in m
    assert doc["results"][0]["memory_asleep"]["dormant_device_bytes"] == 0
    assert "host-overlap1        asleep: dormant holds 0 MiB on the device" in p.stdout


# ---- the torch side of the report, on stand-ins for torch -------------------

sys.path.insert(0, str(REPO / "bench"))
import handover  # noqa: E402

MiB = 1 << 20


class FakeCuda:
    """torch.cuda as torch_memory() reads it: two segments in a dormant pool
    (asleep: their blocks still allocated) and two of PyTorch's own."""

    def __init__(self):
        self.pool_segs = [
            {"address": 0x1000_0000, "total_size": 1024 * MiB, "allocated_size": 1000 * MiB,
             "blocks": [{"size": 1000 * MiB, "state": "active_allocated"}]},
            {"address": 0x5000_0000, "total_size": 512 * MiB, "allocated_size": 512 * MiB,
             "blocks": [{"size": 512 * MiB, "state": "active_allocated"}]},
        ]
        self.own = [
            {"address": 0x9000_0000, "total_size": 80 * MiB, "allocated_size": 64 * MiB,
             "blocks": [{"size": 64 * MiB, "state": "active_allocated"},
                        {"size": 16 * MiB, "state": "inactive"}]},
            {"address": 0xA000_0000, "total_size": 32 * MiB, "allocated_size": 32 * MiB,
             "blocks": [{"size": 32 * MiB, "state": "active_allocated"}]},
        ]

    def memory_reserved(self):
        return sum(s["total_size"] for s in self.pool_segs + self.own)

    def memory_allocated(self):
        return sum(s["allocated_size"] for s in self.pool_segs + self.own)

    def memory_snapshot(self):
        return self.pool_segs + self.own


class FakeDist:
    """torch.distributed with a one-rank world and two NCCL groups made."""

    class distributed_c10d:
        class _world:
            pg_map = {"WORLD": ("nccl", None), "dp": ("nccl", None)}

    def is_available(self):
        return True

    def is_initialized(self):
        return True


class FakeTorch:
    def __init__(self):
        self.cuda = FakeCuda()
        self.distributed = FakeDist()


class FakeGlue:
    def __init__(self, pools, policy_pools):
        self.pools, self.policy_pools = pools, policy_pools


class FakeManager:
    def __init__(self, glue):
        self._torch = glue

    def stats(self):
        return {"totals": {"device_bytes": 0, "host_bytes": 1536 * MiB},
                "devices": [{"managed_bytes": 1536 * MiB}]}


def test_memory_report_of_a_torch_trainer():
    torch = FakeTorch()
    segs = {"w": torch.cuda.pool_segs[:1], "o": torch.cuda.pool_segs[1:]}
    dm = FakeManager(FakeGlue({("weights", 0): "w"}, {("optimizer", "keep", 0, "dormant"): "o"}))
    rep = handover.memory_report(dm, torch, lambda pool: segs[pool])
    assert "torch_error" not in rep, rep
    assert rep["dormant"] == {"device_bytes": 0, "host_bytes": 1536 * MiB,
                              "managed_bytes": 1536 * MiB}
    assert rep["torch"]["outside_reserved"] == 112 * MiB   # both kinds of pool counted in
    assert rep["groups"] == {"count": 2, "backends": ["nccl"]}
    # before any region: no glue, every segment is outside
    rep = handover.memory_report(FakeManager(None), torch, lambda pool: segs[pool])
    assert rep["torch"]["outside_reserved"] == (112 + 1536) * MiB
    # a failure is a report, not an exception
    torch.cuda.memory_snapshot = None
    rep = handover.memory_report(FakeManager(None), torch, lambda pool: [])
    assert "torch_error" in rep and "dormant" in rep


def test_torch_memory_splits_pools_from_the_rest():
    torch = FakeTorch()
    pools = ["weights-pool", "optimizer-pool"]
    segs = {"weights-pool": torch.cuda.pool_segs[:1], "optimizer-pool": torch.cuda.pool_segs[1:]}
    m = handover.torch_memory(torch, pools, lambda pool: segs[pool])
    assert m["pools_reserved"] == 1536 * MiB
    assert m["pools_allocated"] == 1512 * MiB
    assert m["outside_reserved"] == 112 * MiB
    assert m["outside_allocated"] == 96 * MiB
    assert m["outside_segments"] == 2
    assert m["largest_outside"] == [64 * MiB, 32 * MiB]   # in use only, biggest first
    assert m["reserved"] == m["pools_reserved"] + m["outside_reserved"]
    # a pool the glue does not report is counted outside
    m = handover.torch_memory(torch, pools[:1], lambda pool: segs[pool])
    assert m["outside_reserved"] == (112 + 512) * MiB


def test_memory_line_splits_nvidia_smis_figure():
    reports = [{"dormant": {"device_bytes": 0, "host_bytes": 10 * MiB, "managed_bytes": 0},
                "torch": {"reserved": 1648 * MiB, "allocated": 1608 * MiB,
                          "pools_reserved": 1536 * MiB, "pools_allocated": 1512 * MiB,
                          "outside_reserved": 112 * MiB, "outside_allocated": 96 * MiB,
                          "outside_segments": 2, "largest_outside": [64 * MiB, 32 * MiB]},
                "groups": {"count": 3, "backends": ["nccl"]},
                "process": {"rss_bytes": 5000 * MiB}}] * 2
    r = {"label": "mcore-overlap1", "trainer_asleep_mib": 2630,
         "memory_asleep": handover.memory_summary(reports)}
    line = handover.memory_line(r)
    assert "outside 112 MiB (96 in use, 2 segments; largest 64, 32 MiB)" in line
    assert "the rest of nvidia-smi's 2630 MiB (context, cuBLAS's handles, NCCL): 2518 MiB" in line
    assert "process groups 3 (nccl)" in line
    r["nccl_comms"] = 2
    assert "process groups 3 (nccl); NCCL communicators made 2; dormant" in handover.memory_line(r)
    assert line.endswith("10 MiB of host copies; process resident on the host 5000 MiB")
    r["one_rank_ctas"] = 1
    assert "NCCL communicators made 2; one-rank NCCL groups capped at 1 CTAs; dormant" \
        in handover.memory_line(r)


def test_memory_line_says_what_the_stack_trim_did():
    """--trim-stack: the last phase's limits before and after the trim, or
    the CUDA error that left it alone; nothing without the option."""
    base = {"dormant": {"device_bytes": 0, "host_bytes": MiB, "managed_bytes": 0}}
    assert "stack" not in handover.memory_line(
        {"label": "x", "memory_asleep": handover.memory_summary([base])})
    reports = [dict(base, stack_limit={"before": 8192, "after": 4096, "result": 0}),
               dict(base, stack_limit={"before": 4096, "after": 1024, "result": 0})]
    line = handover.memory_line({"label": "x", "memory_asleep": handover.memory_summary(reports)})
    assert "stack limit trimmed from 4096 to 1024 B per thread" in line
    failed = [dict(base, stack_limit={"before": 8192, "after": 0, "result": 201})]
    assert "stack limit not trimmed (CUDA error 201)" in handover.memory_line(
        {"label": "x", "memory_asleep": handover.memory_summary(failed)})


def test_process_rss_reads_vmrss(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython3\nVmHWM:\t  900 kB\nVmRSS:\t  2048 kB\nThreads:\t4\n")
    assert handover.process_rss(str(status)) == 2048 * 1024
    status.write_text("Name:\tpython3\n")
    assert handover.process_rss(str(status)) is None
    assert handover.process_rss(str(tmp_path / "none")) is None
    assert handover.process_rss() > 0           # this process, from /proc


def test_nccl_comms_counts_init_complete_lines(tmp_path):
    log = tmp_path / "trainer.log"
    log.write_text("h:1:1 [0] NCCL INFO Bootstrap: Using eth0\n"
                   "h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 0 nranks 1 - Init START\n"
                   "h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0x1 rank 0 nranks 1 - Init COMPLETE\n"
                   "h:1:1 [0] NCCL INFO ncclCommInitRankConfig comm 0x2 rank 0 nranks 1 - Init COMPLETE\n")
    assert handover.nccl_comms(log) == 2
    log.write_text("READY {}\n")
    assert handover.nccl_comms(log) is None          # no NCCL in this trainer
    assert handover.nccl_comms(tmp_path / "missing.log") is None
    failed_report = handover.memory_summary([{"error": "trainer: no MEMORY within 240 s"}])
    assert "report failed: trainer: no MEMORY" in handover.memory_line(
        {"label": "x", "memory_asleep": failed_report})


def test_the_mcore_trainer_logs_nccl_into_a_file(tmp_path):
    """NCCL's log must not go to the trainer's stdout (the line protocol),
    and nccl_comms() reads the file it goes to."""
    args = argparse.Namespace(
        trainer="mcore", backend="cuda", no_empty_cache=False)
    env = handover.trainer_env(args, 1, tmp_path, "mcore-overlap1")
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT"
    assert env["NCCL_DEBUG_FILE"] == str(tmp_path / "nccl-mcore-overlap1.log")
    assert env["DORMANT_WAKE_OVERLAP"] == "1"
    args.trainer = "synthetic"
    assert "NCCL_DEBUG_FILE" not in handover.trainer_env(args, 0, tmp_path, "synthetic-overlap0")


def test_residue_checkpoint_on_the_host_backend_is_refused_up_front(tmp_path):
    """The host stand-in's rollout runs inside the trainer, which a checkpoint
    stops from touching the device: a clear usage error before any phase,
    not a trainer error halfway."""
    env = dict(os.environ, DORMANT_RESIDUE="checkpoint")
    p = subprocess.run([sys.executable, str(BENCH), "--out", str(tmp_path / "out"), *SMALL],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "DORMANT_RESIDUE=checkpoint needs --backend cuda" in p.stderr
    assert not (tmp_path / "out").exists()          # nothing ran


def test_each_part_of_the_handover_is_a_column(tmp_path):
    """Issue 24 item 4: every part of the reports' times is in each phase's
    JSON (the list is openapi.yaml's TransitionTimes), the first phase apart
    from the median, and the table has the sleep's and the wake's parts as
    columns, the rollout's free before the wake's."""
    import re
    spec = (REPO / "openapi.yaml").read_text()
    block = spec[spec.index("    TransitionTimes:"):]
    required = re.search(r"required: \[([^\]]*)\]", block).group(1)
    # and what the transition did with the residue (residue mode checkpoint)
    parts = {k.strip() for k in required.split(",")} | {
        "residue_s", "residue_action", "residue_result"}
    p, doc = run(tmp_path, "--overlap", "1")
    assert p.returncode == 0, p.stdout + p.stderr
    r = doc["results"][0]
    for ph in r["phases"]:
        assert set(ph["sleep_parts"]) == parts
        assert set(ph["wake_parts"]) == parts
    assert set(r["first_sleep_parts"]) == set(r["sleep_parts"]) == parts
    assert r["first_sleep_parts"] == r["phases"][0]["sleep_parts"]
    assert r["first_wake_s"] == r["phases"][0]["wake_s"]
    assert r["first_rollout_free_s"] == r["phases"][0]["rollout_free"].get("free_s", 0.0)
    text = (tmp_path / "out" / "handover.txt").read_text()
    sleep_head = next(l for l in text.splitlines() if l.startswith("sleep parts (s)"))
    wake_head = next(l for l in text.splitlines() if l.startswith("wake parts (s)"))
    for name in ("sync", "setup", "checksum", "host prep", "pin", "copy", "release", "NCCL",
                 "residue", "total"):
        assert name in sleep_head, name
    for name in ("free", "residue", "map", "map wait", "copy", "verify", "NCCL", "rebuild",
                 "total"):
        assert name in wake_head, name
    # in the order they happen: a sleep checkpoints last, a wake restores first
    assert sleep_head.index("copy") < sleep_head.index("residue") < sleep_head.index("total")
    assert wake_head.index("free") < wake_head.index("residue") < wake_head.index("map")
    rows = [l for l in text.splitlines() if l.startswith("host-overlap1")
            and l.split()[1] in ("first", "median")]
    assert len(rows) == 4          # first and median, sleep and wake
    wake_median = rows[3].split()
    assert float(wake_median[-1]) == round(r["wake_s"], 4)
    assert float(wake_median[2]) == round(r["rollout_free_s"], 4)
    assert float(wake_median[3]) == round(r["wake_parts"]["residue_s"], 4)
