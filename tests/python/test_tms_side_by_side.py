# SPDX-License-Identifier: MIT
"""bench/tms_side_by_side.py --workload mcore on the CPU: its arguments, the
runs it starts (and that bench/tms_mcore_program.py accepts their
arguments), its table and verdict from canned program output, its refusal
when the torch_memory_saver build or Megatron is missing; and of the program
itself, what it can show without a GPU: the nested no-backup region around
grad_data only (with stand-ins for torch, Megatron's buffer and
torch_memory_saver), and a loud exit without torch. Nothing is timed."""
import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import types

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
GiB = 1 << 30


def load(name):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


side = load("tms_side_by_side")
program = load("tms_mcore_program")


def fake_tms_src(tmp_path, hooks=("preload", "torch")):
    src = tmp_path / "tms"
    (src / "torch_memory_saver").mkdir(parents=True)
    (src / "torch_memory_saver" / "__init__.py").write_text("")
    for mode in hooks:
        (src / f"torch_memory_saver_hook_mode_{mode}.cpython-312-x86_64-linux-gnu.so").write_bytes(b"")
    return src


# ---- arguments and runs -------------------------------------------------------

def test_the_default_workload_stays_synthetic():
    args = side.parse_args(["--tms-src", "x"])
    assert args.workload == "synthetic" and args.timeout_s == 240
    args = side.parse_args(["--tms-src", "x", "--workload", "mcore"])
    assert (args.mcore_layers, args.mcore_hidden, args.mcore_heads) == (16, 2048, 16)
    assert args.timeout_s == 300 and args.target_x == 8.0
    assert side.parse_args(["--tms-src", "x", "--workload", "mcore",
                            "--timeout-s", "99"]).timeout_s == 99
    with pytest.raises(SystemExit):
        side.parse_args(["--tms-src", "x", "--workload", "megatron"])
    with pytest.raises(SystemExit):
        side.parse_args(["--tms-src", "x", "--cycles", "0"])


def test_mcore_runs_one_program_three_ways(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/somewhere/else.so")
    args = side.parse_args(["--tms-src", str(fake_tms_src(tmp_path)), "--workload", "mcore",
                            "--mcore-layers", "3", "--mcore-hidden", "96", "--mcore-heads", "4",
                            "--mcore-steps", "5", "--cycles", "2"])
    base, tms_env, ours_env = side.environments(args)
    rows = side.mcore_rows(args, base, tms_env, ours_env)
    assert [r[0] for r in rows] == ["torch_memory_saver", "dormant (the switch)",
                                    side.REFERENCE_LABEL]
    (_, tms, t_env), (_, ours, o_env), (_, ref, r_env) = rows
    assert ours[:len(side.SWITCH)] == side.SWITCH
    assert "LD_PRELOAD" not in r_env and "LD_PRELOAD" not in o_env
    assert t_env["LD_PRELOAD"].endswith(".so") and "hook_mode_preload" in t_env["LD_PRELOAD"]
    assert t_env["PYTHONPATH"].split(":")[0] == str((tmp_path / "tms").resolve())
    assert o_env["PYTHONPATH"].split(":")[0] == str(REPO / "python")
    parsed = []
    for cmd in (tms, ours, ref):
        at = cmd.index(str(side.MCORE_PROGRAM))
        parsed.append(program.parse_args(cmd[at + 1:]))    # the program takes what it is given
    assert [p.expect for p in parsed] == ["torch_memory_saver", "dormant", None]
    assert [p.reference for p in parsed] == [False, False, True]
    for p in parsed:
        assert (p.layers, p.hidden, p.heads, p.steps, p.cycles) == (3, 96, 4, 5, 2)
        assert not p.retain

    args.mcore_retain = True
    rows = side.mcore_rows(args, base, tms_env, ours_env)
    assert len(rows) == 5 and rows[-1][0] == side.REFERENCE_LABEL
    assert [r[1][-1] for r in rows[2:4]] == ["--retain", "--retain"]


def test_the_program_refuses_arguments_that_contradict():
    for bad in (["--reference", "--retain"], ["--reference", "--expect", "dormant"],
                ["--steps", "0"], ["--hidden", "100", "--heads", "16"]):
        with pytest.raises(SystemExit):
            program.parse_args(bad)


def test_a_missing_build_or_megatron_is_said_and_nothing_runs(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    p = subprocess.run([sys.executable, str(BENCH / "tms_side_by_side.py"), "--workload", "mcore",
                        "--tms-src", str(empty)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no torch_memory_saver package" in p.stderr
    assert "RESULT" not in p.stdout and "|" not in p.stdout
    src = fake_tms_src(tmp_path, hooks=("torch",))
    assert "hook_mode_preload" in side.tms_build_missing(src, "preload")
    assert side.tms_build_missing(src, "torch") is None
    assert "build it first" in side.tms_build_missing(fake_tms_src(tmp_path / "b", ()), "torch")

    megatron = tmp_path / "megatron"
    assert "no Megatron-core at" in side.megatron_missing(megatron)
    (megatron / "megatron" / "core").mkdir(parents=True)
    (megatron / "megatron" / "core" / "__init__.py").write_text("")
    assert side.megatron_missing(megatron) is None


# ---- the report, from canned program output -------------------------------------

LOSSES = [10.375, 10.25, 9.875, 9.5, 9.1875]
PARAMS = 870_000_000


def canned(label, library, pauses, resumes, *, retain=False, losses=LOSSES, digest="ab" * 8):
    cycles = [{"pause_s": p, "resume_s": r, "gpu_freed_bytes": 15 * GiB,
               "host_paused_bytes": 14 * PARAMS, "host_awake_bytes": 0, "loss": loss}
              for p, r, loss in zip(pauses, resumes, losses[2:])]
    return {"label": label, "library": library, "reference": False, "retain": retain,
            "params": PARAMS, "losses": list(losses), "digest": digest, "cycles": cycles}


def reference(losses=LOSSES, digest="ab" * 8):
    return {"label": side.REFERENCE_LABEL, "library": "none", "reference": True,
            "retain": False, "params": PARAMS, "losses": list(losses), "digest": digest,
            "cycles": [{"loss": loss} for loss in losses[2:]]}


def report(tmp_path, results, *extra):
    args = side.parse_args(["--tms-src", "x", "--workload", "mcore",
                            "--json", str(tmp_path / "out.json"), *extra])
    # through JSON and back, as run_row() gets it from the program
    results = json.loads(json.dumps(results))
    out = tmp_path / "out.md"
    with open(out, "w") as f:
        status = side.report_mcore(results, args, out=f)
    return status, out.read_text(), json.loads((tmp_path / "out.json").read_text())


def table(text):
    return [line for line in text.splitlines() if line.startswith("| ")][2:]


def test_the_report_compares_speed_and_bits(tmp_path):
    results = [canned("torch_memory_saver", "torch_memory_saver", [7.0, 6.0, 5.0], [2.5, 2.0, 2.0]),
               # with retain: faster still, and not what the ratio is taken from
               canned("dormant (the switch), retain_cpu_backup", "dormant", [0.8, 0.1, 0.1],
                      [0.1, 0.1, 0.1], retain=True),
               canned("dormant (the switch)", "dormant", [0.8, 0.5, 0.5], [0.4, 0.25, 0.25]),
               reference()]
    status, text, doc = report(tmp_path, results)
    assert status == 0, text
    rows = table(text)
    assert len(rows) == 4
    assert rows[0].split(" | ")[1:6] == ["5.50", "7.00", "2.00", "2.50", "11.3"]
    assert rows[0].split(" | ")[6] == "14.0"              # host bytes per parameter
    assert rows[2].endswith("bit-identical |") and rows[3].endswith("the baseline |")
    assert "dormant sleeps 11.0x faster than torch_memory_saver" in text
    assert "first pause 8.8x" in text and "wakes 8.0x faster" in text
    assert "sleep at least 8x faster: met" in text
    assert "bit-identical across the 4 runs" in text
    c = doc["comparison"]
    assert c["pause_x"] == pytest.approx(11.0) and c["resume_x"] == pytest.approx(8.0)
    assert c["target_met"] is True and c["identical"] is True and c["failed"] == []
    assert doc["workload"] == "mcore" and len(doc["results"]) == 4


def test_a_slow_sleep_is_reported_not_met(tmp_path):
    results = [canned("torch_memory_saver", "torch_memory_saver", [5.0, 5.0], [2.0, 2.0]),
               canned("dormant (the switch)", "dormant", [1.0, 1.0], [1.0, 1.0]), reference()]
    status, text, doc = report(tmp_path, results)
    assert "dormant sleeps 5.0x faster" in text and "8x faster: NOT MET" in text
    assert doc["comparison"]["target_met"] is False
    assert status == 0         # a measurement, not a failure
    status, text, _ = report(tmp_path, results, "--target-x", "4")
    assert "4x faster: met" in text


@pytest.mark.parametrize("what", ["loss", "digest"])
def test_a_run_that_trains_differently_fails(tmp_path, what):
    other = list(LOSSES)
    other[3] = LOSSES[3] + 2 ** -20                   # a few ulps off, one step
    bad = (canned("dormant (the switch)", "dormant", [0.5] * 3, [0.2] * 3, losses=other)
           if what == "loss" else
           canned("dormant (the switch)", "dormant", [0.5] * 3, [0.2] * 3, digest="cd" * 8))
    results = [canned("torch_memory_saver", "torch_memory_saver", [5.0] * 3, [2.0] * 3), bad,
               reference()]
    status, text, doc = report(tmp_path, results)
    assert status == 1
    assert "DIFFER" in table(text)[1] and "DIFFER" not in table(text)[0]
    assert doc["comparison"]["differ"] == ["dormant (the switch)"]
    assert ("checksum different" in text) == (what == "digest")
    if what == "loss":
        assert "max loss gap 9.54e-07" in text
    assert "not identical to each other either" in text
    assert doc["comparison"]["libraries_identical"] is False


def test_a_reference_alone_apart_is_told_apart(tmp_path):
    """Both libraries agree and the reference does not: said so, and still a failure."""
    results = [canned("torch_memory_saver", "torch_memory_saver", [5.0] * 3, [2.0] * 3),
               canned("dormant (the switch)", "dormant", [0.5] * 3, [0.2] * 3),
               reference(digest="ef" * 8)]
    status, text, doc = report(tmp_path, results)
    assert status == 1
    assert doc["comparison"]["differ"] == ["torch_memory_saver", "dormant (the switch)"]
    assert "runs are bit-identical to each other" in text
    assert doc["comparison"]["libraries_identical"] is True


def test_a_failed_run_fails_the_report_and_is_said(tmp_path):
    results = [{"label": "torch_memory_saver",
                "error": "exit 1: tms_mcore_program: no Megatron-core | at /x"},
               canned("dormant (the switch)", "dormant", [0.5] * 3, [0.2] * 3), reference()]
    status, text, doc = report(tmp_path, results)
    assert status == 1
    row = table(text)[0]
    assert "failed: exit 1: tms_mcore_program: no Megatron-core \\| at /x" in row
    assert len(re.split(r"(?<!\\)\|", row)) == len(side.MCORE_COLUMNS) + 2   # the cells kept
    assert "FAILED: torch_memory_saver" in text
    assert "speed: not compared" in text
    assert doc["comparison"]["failed"] == ["torch_memory_saver"]
    # with the reference failed too, the first run that ran is the baseline
    results[2] = {"label": side.REFERENCE_LABEL, "error": "no result in 300 s"}
    status, text, doc = report(tmp_path, results)
    assert status == 1 and doc["comparison"]["baseline"] == "dormant (the switch)"


def test_a_run_past_its_timeout_says_where_it_stood():
    rows = load("rows")
    cmd = [sys.executable, "-I", "-S", "-c",
           "import sys, time; print('building the model', file=sys.stderr, flush=True); "
           "time.sleep(600)"]
    row = rows.run_row("slow", cmd, None, 8)
    assert row["error"] == "no result in 8 s; last said: building the model"


# ---- the program, without a GPU -----------------------------------------------------

class StandInSaver:
    """torch_memory_saver's region(), recording which regions are open."""

    def __init__(self):
        self.open = []

    def region(self, tag="default", enable_cpu_backup=False):
        saver = self

        class Region:
            def __enter__(self):
                saver.open.append((tag, enable_cpu_backup))

            def __exit__(self, *exc):
                saver.open.pop()
        return Region()


def stand_ins(saver, same_dtype=False):
    calls = []

    def zeros(n, dtype=None, **kwargs):
        tensor = types.SimpleNamespace(n=n, dtype=dtype, regions=list(saver.open))
        calls.append(tensor)
        return tensor

    torch = types.SimpleNamespace(zeros=zeros)

    class Buffer:
        """Megatron's _ParamAndGradBuffer.__init__, as far as allocation goes."""

        def __init__(self, numel):
            self.param_dtype = "bf16"
            self.grad_dtype = "bf16" if same_dtype else "fp32"
            self.scratch = torch.zeros(4, dtype=self.param_dtype)
            self.param_data = torch.zeros(numel, dtype=self.param_dtype, device=0)
            self.grad_data = torch.zeros(numel, dtype=self.grad_dtype, device=0)

    def elsewhere():
        return torch.zeros(8, dtype="fp32")
    return torch, Buffer, elsewhere, calls


def test_grad_data_and_only_grad_data_goes_to_the_nested_region():
    saver = StandInSaver()
    torch, Buffer, elsewhere, calls = stand_ins(saver)
    real = torch.zeros
    made = []
    outer = ("default", True)
    with saver.region(tag="default", enable_cpu_backup=True):
        with program.grad_data_without_backup(saver, torch, Buffer, made):
            a, b = Buffer(100), Buffer(7)
            other = elsewhere()             # fp32, but not the buffer's grad_data
    assert torch.zeros is real
    assert made == [a.grad_data, b.grad_data]
    for buf in (a, b):
        assert buf.grad_data.regions == [outer, ("default", False)]
        assert buf.param_data.regions == [outer] and buf.scratch.regions == [outer]
    assert other.regions == [outer]
    assert saver.open == []
    assert len(calls) == 7


def test_one_dtype_for_params_and_grads_is_refused():
    saver = StandInSaver()
    torch, Buffer, _, _ = stand_ins(saver, same_dtype=True)
    real = torch.zeros
    with pytest.raises(program.ProgramError, match="grad_reduce_in_fp32"):
        with program.grad_data_without_backup(saver, torch, Buffer, []):
            Buffer(10)
    assert torch.zeros is real and saver.open == []


def test_the_program_without_torch_says_so(tmp_path):
    fake = tmp_path / "notorch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('stand-in: no torch here')\n")
    p = subprocess.run([sys.executable, str(BENCH / "tms_mcore_program.py"), "--steps", "1",
                        "--cycles", "1"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "notorch")})
    assert p.returncode == 1
    assert "needs PyTorch with CUDA" in p.stderr and "stand-in: no torch here" in p.stderr
    assert "RESULT" not in p.stdout
