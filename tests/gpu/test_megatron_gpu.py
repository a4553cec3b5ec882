# SPDX-License-Identifier: MIT
"""A Megatron-style trainer (bf16 weights and fp32 master weights + Adam state
under keep tags, the flat fp32 grad buffer with main_grad views under a
discard tag) on a real GPU, put to sleep and woken over HTTP between steps.

(a) losses and final weights bit-identical to the same run without sleep;
(b) after /sleep, torch.cuda.mem_get_info() shows >= 99% of the managed bytes
    returned;
(c) host memory held while asleep is the keep bytes only (grads cost none);
(d) every parameter's and main_grad view's data_ptr() unchanged;
(e) a CUDA graph captured before the sleep replays correctly after the wake;
(f) a wake while another process holds the GPU memory fails clearly (503 /
    OutOfMemoryError) and succeeds when retried once it is free, weights
    intact;
(g) with the bf16 weights under a rebuild tag, training stays bit-identical
    and the weights cost no host copy.
"""
import json
import pathlib
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

torch = pytest.importorskip("torch")

import dormant  # noqa: E402
from megatron_style import Config, Trainer, deterministic  # noqa: E402

MiB = 1 << 20
HOG = pathlib.Path(__file__).resolve().parent / "hog.py"

# Big enough that the memory numbers mean something (about 51 M parameters:
# 100 MiB of bf16 weights, 200 MiB of fp32 grads, 600 MiB of optimizer state).
LARGE = dict(d_model=1024, n_layers=4, n_heads=8, d_ff=4096)
SMALL = dict(d_model=512, n_layers=2, n_heads=8, d_ff=2048, seq=128)


# ---- helpers ------------------------------------------------------------

def post(url, body=None):
    """POST JSON; returns (status, parsed body, headers) for any status."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST",
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), e.headers


def tag_stats(names):
    return {t["tag"]: t for t in dormant.stats()["tags"] if t["tag"] in names}


def bits(t):
    """A view whose equality is bit equality (NaNs included)."""
    t = t.contiguous()
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}.get(t.element_size(),
                                                                         torch.uint8))


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def snapshots_equal(s1, s2):
    pairs = [(s1["param_data"], s2["param_data"]), (s1["main_param"], s2["main_param"])]
    pairs += list(zip(s1["state"], s2["state"]))
    return len(s1["state"]) == len(s2["state"]) and all(same_bits(a, b) for a, b in pairs)


def wait_for(predicate, what, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


# ---- fixtures -------------------------------------------------------------

@pytest.fixture(scope="module")
def dm():
    deterministic()
    dormant.configure(backend="cuda")
    m = dormant.manager()
    assert m.backend == "cuda", "libdormant did not pick the CUDA backend"
    return m


@pytest.fixture(scope="module")
def server(dm):
    s = dormant.serve(quiet=True)
    yield s
    s.stop()


# ---- (a) ------------------------------------------------------------------

def test_a_bit_identical_with_http_sleep_wake_between_steps(dm, server, note):
    """(a) losses and final weights bit-identical to the same run without sleep"""
    steps = 8
    base = Trainer(Config(**SMALL, tag_prefix="a0."))
    base_losses = [base.train_step(x, y).item() for x, y in base.batches(steps)]
    base_final = base.snapshot()

    run = Trainer(Config(**SMALL, tag_prefix="a1."))
    tags = run.tags.all()
    main_thread = threading.get_ident()
    hook_calls = {"before_sleep": [], "after_wake": []}
    ids = [dm.add_hook("before_sleep", lambda: hook_calls["before_sleep"].append(
               threading.get_ident())),
           dm.add_hook("after_wake", lambda: hook_calls["after_wake"].append(
               threading.get_ident()))]
    in_step = threading.Event()
    reports, problems, held = [], [], []

    def orchestrator():
        # As an RL orchestrator would: ask for a sleep while a step runs (it
        # must wait for the step), then wake.
        try:
            for _ in range(steps - 1):
                if not in_step.wait(600):
                    problems.append("the trainer never entered a step")
                    return
                in_step.clear()
                status, rep, _ = post(server.url + "/sleep", {"tags": tags})
                if status != 200:
                    problems.append(f"/sleep answered {status}: {rep}")
                    return
                reports.append(rep)
                status, rep, _ = post(server.url + "/wake", {"tags": tags})
                if status != 200:
                    problems.append(f"/wake answered {status}: {rep}")
                    return
        except Exception as e:  # reported below
            problems.append(repr(e))

    o = threading.Thread(target=orchestrator, daemon=True)
    o.start()
    losses = []
    try:
        for i, (x, y) in enumerate(run.batches(steps)):
            with dormant.step():
                in_step.set()
                if i < steps - 1:  # a sleep is asked for during this step
                    wait_for(lambda: dormant.stats()["transition_running"] or problems,
                             "the orchestrator's /sleep")
                    start = time.monotonic()
                losses.append(run.train_step(x, y).item())
                if i < steps - 1:  # how long the step went on after the sleep began
                    held.append(time.monotonic() - start)
        o.join(600)
    finally:
        for hook_id in ids:
            dm.remove_hook(hook_id)
    assert not problems, problems
    final = run.snapshot()

    note(f"losses without sleep: {base_losses}")
    note(f"losses with sleep:    {losses}")
    assert len(reports) == steps - 1
    note(f"{len(reports)} sleep/wake cycles over HTTP; each sleep waited for the running step "
         f"({min(r['guard_wait_s'] for r in reports) * 1e3:.1f} ms at least)")
    assert losses == base_losses, "losses differ"
    assert snapshots_equal(final, base_final), "final weights or optimizer state differ"
    # any sleep reports some guard wait; each of these waited for its step (at
    # least half of what the step ran after the sleep began: it reaches the
    # guard a little after it starts)
    assert all(r["guard_wait_s"] >= h / 2 for r, h in zip(reports, held)), \
        f"a sleep did not wait for the step: {[r['guard_wait_s'] for r in reports]}, {held}"
    for rep in reports:
        by_tag = {t["tag"]: t for t in rep["tags"]}
        assert by_tag[run.tags.grads]["bytes_copied"] == 0
        assert by_tag[run.tags.weights]["bytes_copied"] > 0
        assert by_tag[run.tags.optimizer]["bytes_copied"] > 0
    # Hooks ran for each cycle, on the HTTP server's threads.
    assert len(hook_calls["before_sleep"]) == steps - 1
    assert len(hook_calls["after_wake"]) == steps - 1
    assert main_thread not in hook_calls["before_sleep"] + hook_calls["after_wake"]


# ---- (b), (c), (d): one measured cycle ------------------------------------

@pytest.fixture(scope="module")
def cycle(dm, server):
    t = Trainer(Config(**LARGE, tag_prefix="b."))
    for x, y in t.batches(2):
        t.train_step(x, y)
    torch.cuda.synchronize()
    tags = t.tags.all()
    rec = {"trainer": t, "tags": tags}
    rec["ptrs_before"] = t.pointers()
    rec["snap_before"] = t.snapshot()
    rec["grad_nonzero_before"] = t.buffer.grad_data.count_nonzero().item()
    rec["stats_before"] = tag_stats(tags)
    torch.cuda.synchronize()
    rec["free_before"] = torch.cuda.mem_get_info()[0]
    rec["sleep"] = post(server.url + "/sleep", {"tags": tags})
    rec["free_asleep"] = torch.cuda.mem_get_info()[0]
    stats = dormant.stats()
    rec["stats_asleep"] = {x["tag"]: x for x in stats["tags"] if x["tag"] in tags}
    rec["totals_asleep"] = stats["totals"]
    rec["wake"] = post(server.url + "/wake", {"tags": tags})
    rec["free_awake"] = torch.cuda.mem_get_info()[0]
    rec["ptrs_after"] = t.pointers()
    rec["snap_after"] = t.snapshot()
    rec["grad_nonzero_after"] = t.buffer.grad_data.count_nonzero().item()
    x, y = next(iter(t.batches(1, seed=99)))
    rec["loss_after"] = t.train_step(x, y).item()
    return rec


def test_b_sleep_returns_the_managed_gpu_memory(cycle, note):
    """(b) after /sleep, mem_get_info shows >= 99% of the managed bytes returned"""
    assert cycle["sleep"][0] == 200, cycle["sleep"]
    managed = sum(t["device_bytes"] for t in cycle["stats_before"].values())
    returned = cycle["free_asleep"] - cycle["free_before"]
    note(f"managed {managed / MiB:.1f} MiB; free before {cycle['free_before'] / MiB:.1f} MiB, "
         f"asleep {cycle['free_asleep'] / MiB:.1f} MiB: {returned / MiB:.1f} MiB returned "
         f"({100 * returned / managed:.2f}%)")
    note(f"sleep took {cycle['sleep'][1]['duration_s']:.3f} s, "
         f"wake {cycle['wake'][1]['duration_s']:.3f} s")
    assert managed > 500 * MiB
    assert returned >= 0.99 * managed
    assert all(t["device_bytes"] == 0 for t in cycle["stats_asleep"].values())


def test_c_host_memory_while_asleep_is_the_keep_bytes_only(cycle, note):
    """(c) host memory held while asleep is the keep bytes only (grads cost none)"""
    t = cycle["trainer"]
    before, asleep = cycle["stats_before"], cycle["stats_asleep"]
    grads = asleep[t.tags.grads]
    keep = [asleep[t.tags.weights], asleep[t.tags.optimizer]]
    held = sum(x["host_bytes"] for x in asleep.values())
    keep_bytes = sum(x["bytes"] for x in keep)
    note(f"host bytes held: {held / MiB:.1f} MiB for {keep_bytes / MiB:.1f} MiB kept "
         f"(weights {keep[0]['host_bytes'] / MiB:.1f}, optimizer "
         f"{keep[1]['host_bytes'] / MiB:.1f}); grads {grads['host_bytes']} bytes for "
         f"{before[t.tags.grads]['bytes'] / MiB:.1f} MiB on the GPU; "
         f"staging {cycle['totals_asleep']['staging_bytes'] / MiB:.1f} MiB")
    assert before[t.tags.grads]["device_bytes"] > 0
    assert grads["host_bytes"] == 0
    # Blocks PyTorch's caching allocator held free were marked unused before
    # the sleep (dormant's torch glue): neither copied nor held.
    skipped = {x["tag"]: x.get("bytes_skipped", 0) for x in cycle["sleep"][1]["tags"]}
    note(f"free blocks skipped: {sum(skipped.values()) / MiB:.1f} MiB")
    for k in keep:
        assert k["bytes"] - skipped[k["tag"]] <= k["host_bytes"] <= k["reserved_bytes"]
    assert held == sum(k["host_bytes"] for k in keep)
    bytes_copied = cycle["sleep"][1]["bytes_copied"]
    live = keep_bytes - sum(skipped[k["tag"]] for k in keep)
    assert live <= bytes_copied <= sum(k["reserved_bytes"] for k in keep)


def test_d_pointers_and_bytes_unchanged(cycle, note):
    """(d) every parameter's and main_grad view's data_ptr() unchanged"""
    before, after = cycle["ptrs_before"], cycle["ptrs_after"]
    note(f"{len(before['params'])} parameters, {len(before['main_grads'])} main_grad views, "
         f"{len(before['state'])} optimizer state tensors compared; grads nonzero before "
         f"{cycle['grad_nonzero_before']}, after wake {cycle['grad_nonzero_after']}; "
         f"next loss {cycle['loss_after']:.6f}")
    assert before == after
    assert snapshots_equal(cycle["snap_before"], cycle["snap_after"])
    assert cycle["grad_nonzero_before"] > 0
    assert cycle["grad_nonzero_after"] == 0  # discard: zero-filled on wake
    assert cycle["loss_after"] == cycle["loss_after"]  # not NaN


# ---- (e) --------------------------------------------------------------------

def test_e_cuda_graph_replays_after_wake(dm, server, note):
    """(e) a CUDA graph captured before the sleep replays correctly after the wake"""
    t = Trainer(Config(**SMALL, tag_prefix="e."))
    x, y = next(iter(t.batches(1)))
    t.train_step(x, y)
    cfg = t.cfg
    with dormant.region("e.io", policy="keep"):
        static_x = torch.randn(cfg.batch, cfg.seq, cfg.d_in, device="cuda").to(torch.bfloat16)
    tags = t.tags.all() + ["e.io"]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            t.model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_out = t.model(static_x)          # reads keep memory
        t.buffer.grad_data.add_(1.0)            # writes discard memory

    t.buffer.zero_grad()
    graph.replay()
    torch.cuda.synchronize()
    reference = static_out.clone()
    assert bool((t.buffer.grad_data == 1).all())

    status, rep, _ = post(server.url + "/sleep", {"tags": tags})
    assert status == 200, rep
    status, rep, _ = post(server.url + "/wake", {"tags": tags})
    assert status == 200, rep
    zero_after_wake = t.buffer.grad_data.count_nonzero().item()

    graph.replay()
    torch.cuda.synchronize()
    ones = bool((t.buffer.grad_data == 1).all())
    note(f"graph output {tuple(static_out.shape)} compared bit for bit; grad buffer after "
         f"wake: {zero_after_wake} nonzero, after replay all ones: {ones}")
    assert zero_after_wake == 0
    assert same_bits(static_out, reference)
    assert ones


# ---- (f) --------------------------------------------------------------------

def test_f_wake_while_memory_is_taken_fails_then_retries(dm, server, note):
    """(f) a wake while another process holds the GPU memory fails (503, OutOfMemoryError), then succeeds once it is freed, weights intact"""
    t = Trainer(Config(**LARGE, tag_prefix="f."))
    for x, y in t.batches(2):
        t.train_step(x, y)
    tags = t.tags.all()
    snap, ptrs = t.snapshot(), t.pointers()
    managed = sum(x["device_bytes"] for x in tag_stats(tags).values())
    status, rep, _ = post(server.url + "/sleep", {"tags": tags})
    assert status == 200, rep
    torch.cuda.synchronize()

    leave = 64 * MiB
    hog = subprocess.Popen([sys.executable, str(HOG), str(leave)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        line = hog.stdout.readline().split()
        assert line[:1] == ["HOLDING"], f"the memory hog did not start: {line}"
        held, free_left = int(line[1]), int(line[3])
        assert managed > 4 * free_left, "the hog left too much memory for a wake to fail"

        status, problem, headers = post(server.url + "/wake", {"tags": tags})
        note(f"hog holds {held / MiB:.0f} MiB, {free_left / MiB:.0f} MiB left, "
             f"{managed / MiB:.0f} MiB to wake; HTTP /wake: {status} {problem.get('type')}: "
             f"{problem.get('detail')} (Retry-After: {headers.get('Retry-After')})")
        assert status == 503, problem
        assert problem["type"].endswith("out-of-memory")
        assert headers.get("Retry-After")
        assert all(x["state"] == "asleep" for x in tag_stats(tags).values())

        with pytest.raises(dormant.OutOfMemoryError) as err:
            dormant.wake(tags)
        note(f"Python wake: {type(err.value).__name__}: {err.value}")
        assert err.value.report["result"] == "ENOMEM"
        assert all(x["after"] == "asleep" for x in err.value.report["tags"])
        assert all(x["state"] == "asleep" for x in tag_stats(tags).values())
    finally:
        if hog.poll() is None:
            hog.stdin.write("\n")
            hog.stdin.flush()
        try:
            hog.wait(120)
        except subprocess.TimeoutExpired:
            hog.kill()
            hog.wait()

    wait_for(lambda: torch.cuda.mem_get_info()[0] > managed + 256 * MiB,
             "the hog's memory to come back", timeout_s=120)
    status, rep, _ = post(server.url + "/wake", {"tags": tags})
    assert status == 200, rep
    assert t.pointers() == ptrs
    assert snapshots_equal(t.snapshot(), snap), "weights or optimizer state changed"
    x, y = next(iter(t.batches(1, seed=7)))
    loss = t.train_step(x, y).item()
    note(f"retried wake: 200 in {rep['duration_s']:.3f} s; weights intact; next loss {loss:.6f}")
    assert loss == loss


# ---- (g) --------------------------------------------------------------------

def test_g_rebuilt_weights_bit_identical(dm, server, note):
    """(g) bf16 weights under a rebuild tag (examples/megatron_style.py's default): no host copy, bit-identical training"""
    steps = 4
    base = Trainer(Config(**SMALL, tag_prefix="g0."))
    base_losses = [base.train_step(x, y).item() for x, y in base.batches(steps)]
    run = Trainer(Config(**SMALL, tag_prefix="g1."), rebuild_weights=True)
    tags = run.tags.all()
    losses, reports, held = [], [], []
    for x, y in run.batches(steps):
        with dormant.step():
            losses.append(run.train_step(x, y).item())
        status, rep, _ = post(server.url + "/sleep", {"tags": tags})
        assert status == 200, rep
        reports.append(rep)
        held.append(tag_stats(tags)[run.tags.weights]["host_bytes"])
        status, rep, _ = post(server.url + "/wake", {"tags": tags})
        assert status == 200, rep
    weights = {t["tag"]: t for t in reports[-1]["tags"]}[run.tags.weights]
    note(f"weights: policy {weights['policy']}, {weights['bytes_copied']} bytes copied, "
         f"{held[-1]} host bytes while asleep")
    assert weights["policy"] == "rebuild"
    assert all({t["tag"]: t for t in r["tags"]}[run.tags.weights]["bytes_copied"] == 0
               for r in reports)
    assert held == [0] * steps
    assert losses == base_losses, "losses differ"
    assert snapshots_equal(run.snapshot(), base.snapshot()), "weights or optimizer state differ"
