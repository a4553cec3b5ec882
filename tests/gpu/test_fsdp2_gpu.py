# SPDX-License-Identifier: MIT
"""PyTorch FSDP2 under dormant on a GPU, as docs/orchestrators.md tells verl
users: `fully_shard` per block and on the root with
MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), AdamW, the model
built inside `dormant.region("weights")` and the optimizer's state made inside
`dormant.region("optimizer")`, on a one-rank NCCL process group (issue 34).

Three runs of the same seeded model: one that never sleeps, one that sleeps
and wakes after every step (residue kept), one that does so with residue mode
checkpoint. Each sleeping run must give bit-identical losses and weights,
keep every parameter and optimizer state tensor at its address, and verify
every kept chunk on wake; the checkpointed one must leave the process holding
at most 16 MiB of device memory while asleep (nvidia-smi), and a CUDA graph
captured before its first sleep replays after each wake.

Run on the GPU machine (scripts/gpu-residue fsdp2, or directly; the
checkpointed run only with DORMANT_TEST_RESIDUE=1):
    DORMANT_LIB=$PWD/build-gpu/libdormant.so DORMANT_BACKEND=cuda \\
    DORMANT_RESIDUE_HELPER=$PWD/build-gpu/core/dormant-residue-helper \\
    PYTHONPATH=$PWD/python python3 -m pytest -v -p no:cacheprovider tests/gpu/test_fsdp2_gpu.py
"""
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")

import dormant  # noqa: E402

STEPS = 4
WIDTH = 1024
BLOCKS = 4
BATCH = 32
MiB = 1 << 20


def fsdp2():
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch 2.4-2.5 kept it under _composable
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def process_memory_mib():
    """This process's device memory as nvidia-smi shows it (None if it cannot say)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.stdout.splitlines():
        pid, _, used = line.partition(",")
        if pid.strip() == str(os.getpid()):
            return int(used.strip())
    return 0  # not listed: it holds nothing


@pytest.fixture(scope="module")
def group():
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    torch.cuda.set_device(0)
    dormant.configure(backend="cuda")
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl", rank=0, world_size=1,
                                             device_id=torch.device("cuda", 0))
    yield torch.distributed.group.WORLD
    torch.distributed.destroy_process_group()


class Trainer:
    def __init__(self, prefix):
        fully_shard, MixedPrecisionPolicy = fsdp2()
        self.tags = {"weights": prefix + "weights", "optimizer": prefix + "optimizer"}
        torch.manual_seed(1234)
        with dormant.region(self.tags["weights"]):
            blocks = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU())
                      for _ in range(BLOCKS)]
            self.model = torch.nn.Sequential(*blocks, torch.nn.Linear(WIDTH, 1)).cuda()
            policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                          reduce_dtype=torch.float32)
            for block in blocks:
                fully_shard(block, mp_policy=policy)
            fully_shard(self.model, mp_policy=policy)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        gen = torch.Generator(device="cuda").manual_seed(99)
        self.batches = [(torch.randn(BATCH, WIDTH, device="cuda", generator=gen),
                         torch.randn(BATCH, 1, device="cuda", generator=gen))
                        for _ in range(STEPS)]

    def step(self, i):
        x, y = self.batches[i]
        loss = torch.nn.functional.mse_loss(self.model(x).float(), y)
        loss.backward()
        # AdamW makes its state at the first step: inside the optimizer's region
        with dormant.region(self.tags["optimizer"]):
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.item()

    def pointers(self):
        params = [p.to_local().data_ptr() if hasattr(p, "to_local") else p.data_ptr()
                  for p in self.model.parameters()]
        state = [v.to_local().data_ptr() if hasattr(v, "to_local") else v.data_ptr()
                 for s in self.opt.state.values() for v in s.values()
                 if torch.is_tensor(v) and v.is_cuda]
        return params, state

    def weights(self):
        return [(p.to_local() if hasattr(p, "to_local") else p).detach().clone().cpu()
                for p in self.model.parameters()]


def run(group, prefix, residue):
    t = Trainer(prefix)
    rec = {"losses": [], "ptrs": [], "asleep_mib": [], "sleeps": [], "wakes": [],
           "graph": []}
    # a CUDA graph captured before the first sleep, replayed after each wake
    static = torch.zeros(WIDTH, device="cuda")
    with dormant.region(t.tags["weights"]):
        graph_out = torch.zeros(WIDTH, device="cuda")
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        graph_out.copy_(static * 2 + 1)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        graph_out.copy_(static * 2 + 1)
    for i in range(STEPS):
        rec["losses"].append(t.step(i))
        rec["ptrs"].append(t.pointers())
        if residue is None:
            continue
        torch.cuda.synchronize()
        # every tag (the earlier runs' too): the checkpoint needs them all asleep
        rec["sleeps"].append(dormant.sleep(None, residue=residue))
        rec["asleep_mib"].append(process_memory_mib())
        rec["wakes"].append(dormant.wake(None))
        static.fill_(float(i))
        graph.replay()
        torch.cuda.synchronize()
        rec["graph"].append(bool(torch.all(graph_out == 2 * i + 1).item()))
    rec["weights"] = t.weights()
    rec["trainer"] = t
    return rec


@pytest.fixture(scope="module")
def baseline(group):
    return run(group, "f0.", None)


@pytest.fixture(scope="module")
def kept(group, baseline):
    return run(group, "f1.", "keep")


# The checkpoint through the helper has not returned on the H200 so far
# (docs/design.md, "Residue"): the meson gpu suite leaves it to
# scripts/gpu-residue fsdp2, which sets DORMANT_TEST_RESIDUE=1 and a time limit.
RESIDUE = os.environ.get("DORMANT_TEST_RESIDUE") == "1"


@pytest.fixture(scope="module")
def checkpointed(group, baseline, kept):
    if not RESIDUE:
        pytest.skip("residue checkpoint runs under scripts/gpu-residue fsdp2 "
                    "(DORMANT_TEST_RESIDUE=1)")
    return run(group, "f2.", "checkpoint")


@pytest.mark.parametrize("which", ["kept", "checkpointed"])
def test_losses_bit_identical(request, baseline, which, note):
    r = request.getfixturevalue(which)
    note(f"{which}: losses {r['losses'][0]:.5f} -> {r['losses'][-1]:.5f}")
    assert r["losses"] == baseline["losses"]
    assert len(set(r["losses"])) == len(r["losses"]), "the steps changed nothing"


@pytest.mark.parametrize("which", ["kept", "checkpointed"])
def test_weights_bit_identical(request, baseline, which):
    r = request.getfixturevalue(which)
    assert all(torch.equal(a, b) for a, b in zip(r["weights"], baseline["weights"]))


@pytest.mark.parametrize("which", ["kept", "checkpointed"])
def test_pointers_stay(request, which):
    r = request.getfixturevalue(which)
    params, state = r["ptrs"][0]
    assert params and state, "no parameter or optimizer state seen"
    assert all(p == r["ptrs"][0] for p in r["ptrs"][1:])


@pytest.mark.parametrize("which", ["kept", "checkpointed"])
def test_every_kept_chunk_verified(request, which):
    r = request.getfixturevalue(which)
    assert all(w["chunks_verified"] > 0 and w["chunk_mismatches"] == 0 for w in r["wakes"])


@pytest.mark.parametrize("which", ["kept", "checkpointed"])
def test_graph_captured_before_the_sleep_replays(request, which):
    r = request.getfixturevalue(which)
    assert r["graph"] and all(r["graph"])


def test_checkpoint_made_and_restored(checkpointed, note):
    actions = [s["residue"]["action"] + ":" + s["residue"]["result"] for s in checkpointed["sleeps"]]
    note(f"sleeps: {actions}; residue seconds "
         f"{[s['residue']['seconds'] for s in checkpointed['sleeps']]} out, "
         f"{[w['residue']['seconds'] for w in checkpointed['wakes']]} back")
    assert all(a == "checkpoint:ok" for a in actions)
    assert all(w["residue"]["action"] == "restore" and w["residue"]["result"] == "ok"
               for w in checkpointed["wakes"])


def test_checkpointed_process_holds_at_most_16_mib(checkpointed, kept, note):
    note(f"asleep, per nvidia-smi: kept {kept['asleep_mib']} MiB, "
         f"checkpointed {checkpointed['asleep_mib']} MiB")
    assert all(m is not None and m <= 16 for m in checkpointed["asleep_mib"])


def test_no_device_call_while_checkpointed(checkpointed):
    assert dormant.stats()["residue"]["calls_while_checkpointed"] == 0
