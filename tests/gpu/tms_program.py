# SPDX-License-Identifier: MIT
"""The patterns torch_memory_saver users have, written as a torch_memory_saver
program: `import torch_memory_saver` and nothing of dormant's API except
where a check needs dormant's stats. test_tms_gpu.py runs each scenario in a
process of its own, started with the switch:

    python3 -m dormant.run --torch-memory-saver [--capture] -- \\
        python3 tests/gpu/tms_program.py SCENARIO

It prints "NOTE ..." lines (numbers measured) and "OK SCENARIO" at the end;
any failed check raises (exit status 1).
"""
import pathlib
import subprocess
import sys
import time

import torch
import torch_memory_saver as tms_package
from torch_memory_saver import torch_memory_saver

MiB = 1 << 20
GiB = 1 << 30
HOG = pathlib.Path(__file__).resolve().parent / "hog.py"


def note(text):
    print(f"NOTE {text}", flush=True)


def free_bytes():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def bits(t):
    t = t.contiguous()
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32,
                   8: torch.int64}[t.element_size()])


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def random_bits(n, dtype, seed):
    """n elements of dtype with random bit patterns (NaNs and infinities too)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    size = torch.empty(0, dtype=dtype).element_size()
    raw = torch.empty(n * size, dtype=torch.uint8, device="cuda")
    raw.random_(0, 256, generator=g)     # in place: no temporary in the region's pool
    return raw.view(dtype)


def tag_state(tag):
    import dormant
    return {t["tag"]: t["state"] for t in dormant.stats()["tags"]}.get(tag)


def check_is_dormant():
    assert getattr(tms_package, "__dormant__", False), \
        f"torch_memory_saver is not dormant's ({tms_package.__file__}): start with the switch"


# ---- scenarios --------------------------------------------------------------

def one_tag():
    """README's basic example: one tag, no backup; memory given back, same
    address, zeros after resume."""
    with torch_memory_saver.region():
        x = torch.full((GiB,), 100, dtype=torch.uint8, device="cuda")
    ptr = x.data_ptr()
    before = free_bytes()
    torch_memory_saver.pause()
    freed = free_bytes() - before
    note(f"pause freed {freed / MiB:.0f} MiB of a 1024 MiB tensor")
    assert freed >= GiB * 0.99, freed
    torch_memory_saver.resume()
    assert x.data_ptr() == ptr
    assert int(x.count_nonzero()) == 0, "no-backup memory comes back zero-filled"
    x.fill_(3)
    assert int(x[-1]) == 3


def several_tags():
    """Tags paused and resumed selectively (README's "Multiple Tags")."""
    with torch_memory_saver.region(tag="type1", enable_cpu_backup=True):
        t1 = random_bits(256 * MiB, torch.uint8, 1)
    with torch_memory_saver.region(tag="type2", enable_cpu_backup=True):
        t2 = random_bits(512 * MiB, torch.uint8, 2)
    c1, c2 = t1.clone(), t2.clone()
    base = free_bytes()
    torch_memory_saver.pause("type1")
    only1 = free_bytes() - base
    torch_memory_saver.pause("type2")
    both = free_bytes() - base
    torch_memory_saver.resume("type2")
    back2 = free_bytes() - base  # before same_bits(), whose temporaries PyTorch caches
    assert tag_state("type1") == "asleep" and tag_state("type2") == "awake"
    assert same_bits(t2, c2)
    torch_memory_saver.resume("type1")
    torch_memory_saver.pause("type1")
    torch_memory_saver.resume("type1")
    assert same_bits(t1, c1) and same_bits(t2, c2)
    note(f"freed: type1 alone {only1 / MiB:.0f} MiB, both {both / MiB:.0f} MiB, "
         f"type1 still paused {back2 / MiB:.0f} MiB")
    assert 256 * MiB * 0.99 <= only1 < 512 * MiB
    assert both >= 768 * MiB * 0.99
    assert abs(back2 - only1) < 64 * MiB


def cpu_backup():
    """enable_cpu_backup: every bit back (bf16, fp32, fp64; NaNs included)."""
    tensors = []
    with torch_memory_saver.region(enable_cpu_backup=True):
        for i, (n, dtype) in enumerate([(300 * MiB, torch.bfloat16), (100 * MiB, torch.float32),
                                        (7 * MiB + 3, torch.float64), (1, torch.uint8)]):
            tensors.append(random_bits(n, dtype, 10 + i))
    copies = [t.clone() for t in tensors]
    ptrs = [t.data_ptr() for t in tensors]
    for _ in range(3):
        torch_memory_saver.pause()
        torch_memory_saver.resume()
    assert [t.data_ptr() for t in tensors] == ptrs
    assert all(same_bits(a, b) for a, b in zip(tensors, copies))
    note(f"{sum(t.nbytes for t in tensors) / MiB:.0f} MiB bit-exact after 3 pause/resume cycles")


def nested_no_backup():
    """miles's layout: grad_data in a no-backup region nested in the backed-up
    "default" tag. pause("default") releases both; grads come back as zeros."""
    with torch_memory_saver.region("default", enable_cpu_backup=True):
        weights = random_bits(256 * MiB, torch.bfloat16, 20)
        with torch_memory_saver.region("default", enable_cpu_backup=False):
            grads = torch.randn(128 * MiB, dtype=torch.float32, device="cuda")
        optimizer_state = random_bits(64 * MiB, torch.float32, 21)
    w, o = weights.clone(), optimizer_state.clone()
    base = free_bytes()
    torch_memory_saver.pause("default")
    freed = free_bytes() - base
    torch_memory_saver.resume("default")
    assert same_bits(weights, w) and same_bits(optimizer_state, o)
    assert int(grads.count_nonzero()) == 0
    total = weights.nbytes + grads.nbytes + optimizer_state.nbytes
    note(f"pause('default') freed {freed / MiB:.0f} MiB of {total / MiB:.0f} MiB "
         f"(grads {grads.nbytes / MiB:.0f} MiB zero after resume)")
    assert freed >= total * 0.99
    import dormant
    default = {t["tag"]: t for t in dormant.stats()["tags"]}["default"]
    note(f"stats for tag 'default': {default}")


def cuda_graph():
    """A graph captured with cuda_graph(): its private pool is given back on
    pause and the graph replays correctly after resume."""
    with torch_memory_saver.region(tag="kv_cache", enable_cpu_backup=True):
        kv = torch.full((4, 64 * MiB), 1.0, dtype=torch.float32, device="cuda")
    static_in = torch.arange(4, dtype=torch.float32, device="cuda")
    out = {}

    def fn():
        big = torch.ones(256 * MiB, device="cuda") * (static_in + kv.mean(dim=1)).mean()
        out["y"] = big.sum() / big.numel()

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch_memory_saver.cuda_graph(g, tag="graph"):
        fn()
    g.replay()
    first = float(out["y"])
    assert abs(first - 2.5) < 1e-4, first
    base = free_bytes()
    torch_memory_saver.pause("graph")
    graph_freed = free_bytes() - base
    torch_memory_saver.pause("kv_cache")
    torch_memory_saver.resume("kv_cache")
    torch_memory_saver.resume("graph")
    static_in.fill_(1.0)
    g.replay()
    second = float(out["y"])
    note(f"graph pool freed {graph_freed / MiB:.0f} MiB on pause; replay before {first}, "
         f"after resume (new input) {second}")
    assert graph_freed >= 256 * 4 * MiB * 0.99, graph_freed
    assert abs(second - 2.0) < 1e-4, second


def _train(tag, steps, pause_between):
    torch.manual_seed(0)
    with torch_memory_saver.region(tag, enable_cpu_backup=True):
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                    torch.nn.Linear(4096, 1024)).cuda()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.randn(64, 1024, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    losses = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = model(data).pow(2).mean()
        loss.backward()
        if step == 0:
            with torch_memory_saver.region(tag, enable_cpu_backup=True):
                optimizer.step()      # Adam's moments are made lazily, in the first step
        else:
            optimizer.step()
        losses.append(float(loss))
        if pause_between:
            torch_memory_saver.pause(tag)
            assert tag_state(tag) == "asleep"
            torch_memory_saver.resume(tag)
    return losses, [p.detach().clone() for p in model.parameters()]


def training():
    """A training loop with an optimizer, paused and resumed after every step:
    losses and weights bit-identical to the same loop without pauses."""
    ref_losses, ref_params = _train("reference", 6, False)
    losses, params = _train("trainer", 6, True)
    note(f"losses {losses}")
    assert losses == ref_losses, (losses, ref_losses)
    assert all(same_bits(a, b) for a, b in zip(params, ref_params))


def whole_process():
    """Whole-process capture: an allocation made outside every region is
    released by pause() too, and comes back."""
    import dormant
    outside = random_bits(512 * MiB, torch.uint8, 30)   # no region
    with torch_memory_saver.region("weights", enable_cpu_backup=True):
        inside = random_bits(256 * MiB, torch.uint8, 31)
    c_out, c_in = outside.clone(), inside.clone()
    tags = {t["tag"]: t for t in dormant.stats()["tags"]}
    note(f"hook_mode {torch_memory_saver.hook_mode}; tags: "
         + ", ".join(f"{k} {v['bytes'] / MiB:.0f} MiB {v['policy']}" for k, v in tags.items()))
    assert torch_memory_saver.hook_mode == "preload"
    base = free_bytes()
    torch_memory_saver.pause()
    freed = free_bytes() - base
    torch_memory_saver.resume()
    note(f"pause() freed {freed / MiB:.0f} MiB (outside a region 512 MiB, inside 256 MiB, "
         f"clones 768 MiB)")
    assert freed >= (512 + 256 + 768) * MiB * 0.99, freed
    assert same_bits(inside, c_in)
    assert same_bits(outside, c_out), "memory outside regions is kept (tag 'default')"


def disable_while_paused():
    """torch_memory_saver's training_engine pattern under whole-process
    capture: everything paused, then a tensor allocated inside disable() and
    used by kernels; its memory goes back when disable() ends."""
    weights = random_bits(256 * MiB, torch.uint8, 40)     # captured, outside regions
    expected = weights.clone()
    # the kernels used below, loaded now: CUDA loads modules lazily, into
    # device memory that stays (90 MiB on the H200), and is no leak of disable()
    assert torch.full((1024,), 53, dtype=torch.uint8, device="cuda").float().mean().item() == 53
    torch.cuda.synchronize()
    torch_memory_saver.pause()
    paused = free_bytes()
    with torch_memory_saver.disable():
        scratch = torch.full((GiB,), 53, dtype=torch.uint8, device="cuda")
        out = scratch.float().mean().item()
        assert out == 53, out
        assert free_bytes() <= paused - GiB
        del scratch
    after = free_bytes()
    note(f"disable() while paused: 1 GiB used and given back ({(paused - after) / MiB:.0f} MiB "
         f"still held after it)")
    assert after >= paused - 16 * MiB, (paused, after)
    torch_memory_saver.resume()
    assert same_bits(weights, expected)


def weight_sync():
    """slime's weight update while the trainer is paused: inside disable(),
    each parameter's host copy by get_cpu_backup(zero_copy=True) is sent
    through a fresh GPU buffer; the DeepEP pattern (interesting region off
    around a buffer that must stay ordinary memory) beside it."""
    torch_memory_saver._ensure_initialized()
    cdll = torch_memory_saver._impl._binary_wrapper.cdll
    cdll.tms_set_interesting_region(False)
    try:
        ipc_buffer = torch.full((64 * MiB,), 7, dtype=torch.uint8, device="cuda")
    finally:
        cdll.tms_set_interesting_region(True)
    with torch_memory_saver.region("default", enable_cpu_backup=True):
        params = [random_bits(n, dtype, 50 + i) for i, (n, dtype) in
                  enumerate([(64 * MiB, torch.bfloat16), (3 * MiB + 5, torch.float32),
                             (1000, torch.bfloat16)])]
    # on the host: under whole-process capture a clone on the device would be
    # paused too, and reading it inside disable() a fault
    expected = [p.cpu() for p in params]
    torch_memory_saver.pause()
    views = 0
    with torch_memory_saver.disable():
        for p, want in zip(params, expected):
            host = torch_memory_saver.get_cpu_backup(p, zero_copy=True)
            assert host is not None and host.device.type == "cpu"
            assert host.shape == p.shape and host.dtype == p.dtype
            fresh = host.to("cuda")                  # a fresh GPU buffer while paused
            assert same_bits(fresh.cpu(), want)
            views += 1
            del fresh
        assert int(ipc_buffer[12345].item()) == 7    # ordinary memory works while paused
    torch_memory_saver.resume()
    for p, want in zip(params, expected):
        assert same_bits(p.cpu(), want)
    assert torch_memory_saver.get_cpu_backup(params[0]) is None
    note(f"weight sync: {views} parameters read from their host copies while paused")


def blocked_resume():
    """A resume while another process holds the GPU memory: OutOfMemoryError
    (where torch_memory_saver exits), the tag stays paused, and the same
    resume works once the memory is free, data intact."""
    import dormant
    with torch_memory_saver.region("weights", enable_cpu_backup=True):
        w = random_bits(2 * GiB, torch.uint8, 40)
    w_host = w.cpu()
    torch_memory_saver.pause("weights")
    hog = subprocess.Popen([sys.executable, str(HOG), str(64 * MiB)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        line = hog.stdout.readline().split()
        assert line[:1] == ["HOLDING"], f"the memory hog did not start: {line}"
        try:
            torch_memory_saver.resume("weights")
        except dormant.OutOfMemoryError as e:
            note(f"resume while hogged: {type(e).__name__}: {e}")
        else:
            raise AssertionError("resume succeeded while another process held the memory")
        assert tag_state("weights") == "asleep"
    finally:
        hog.stdin.write("\n")
        hog.stdin.flush()
        hog.wait(timeout=60)
    for _ in range(50):                      # the hog's memory shows as free shortly after
        try:
            torch_memory_saver.resume("weights")
            break
        except dormant.OutOfMemoryError:
            time.sleep(0.1)
    assert tag_state("weights") == "awake"
    assert torch.equal(w.cpu(), w_host)
    note("retried resume: ok, 2 GiB bit-exact")


def http():
    """dormant.serve() beside the module: POST /sleep and /wake by the tags
    the program named, and pause()/resume() agree with them."""
    import json
    import urllib.request
    import dormant
    with torch_memory_saver.region("kv_cache"):
        kv = torch.ones(256 * MiB, dtype=torch.uint8, device="cuda")
    with torch_memory_saver.region("weights", enable_cpu_backup=True):
        w = random_bits(128 * MiB, torch.uint8, 50)
    c = w.clone()
    server = dormant.serve(quiet=True)

    def post(path, body):
        req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())

    r = post("/sleep", {"tags": ["kv_cache", "weights"]})
    assert r["state"] == "asleep", r
    assert not torch_memory_saver.pause("weights")["changed"]
    torch_memory_saver.resume("weights")
    assert same_bits(w, c)
    post("/wake", {"tags": ["kv_cache"]})
    assert int(kv.count_nonzero()) == 0
    with urllib.request.urlopen(server.url + "/metrics", timeout=60) as m:
        metrics = m.read().decode()
    assert 'tag="kv_cache"' in metrics and 'tag="weights"' in metrics
    note("HTTP /sleep, /wake and /metrics by the program's tag names: ok")
    server.stop()


SCENARIOS = {f.__name__: f for f in (one_tag, several_tags, cpu_backup, nested_no_backup,
                                     cuda_graph, training, whole_process, blocked_resume, http,
                                     disable_while_paused, weight_sync)}

if __name__ == "__main__":
    name = sys.argv[1]
    check_is_dormant()
    torch.cuda.init()
    SCENARIOS[name]()
    print(f"OK {name}", flush=True)
