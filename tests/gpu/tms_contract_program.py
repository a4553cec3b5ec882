# SPDX-License-Identifier: MIT
"""torch_memory_saver's contract on a real GPU (issue 32), as a
torch_memory_saver program: only what is allocated inside a region (with the
interesting region on) is managed; memory outside every region, under
tms_set_interesting_region(False) and inside disable() is ordinary device
memory that works while the regions are paused and is never paused itself.

test_tms_gpu.py starts it as issue 32 tried it: a child started inside
configure_subprocess() by a parent under `python3 -m dormant.run
--torch-memory-saver`, in hook mode preload and in hook mode torch:

    python3 tests/gpu/tms_contract_program.py preload|torch

It prints one line "RESULTS {json}": each check by name, [passed, detail].
A failed check does not stop the others; a range found managed is never
touched while paused (that would be an illegal memory access, which would
fail every later check).
"""
import json
import sys
import traceback

import torch
import torch_memory_saver as tms_package
from torch_memory_saver import torch_memory_saver

import dormant

MiB = 1 << 20
results = {}
ordinary = []   # (what, tensor) of every allocation that must be ordinary memory


def check(name, passed, detail=""):
    results[name] = [bool(passed), str(detail)]


def attempt(name, fn):
    try:
        passed, detail = fn()
    except Exception as e:  # noqa: BLE001 (the check fails; the next ones run)
        passed, detail = False, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"
    check(name, passed, detail)
    return passed


def managed(t):
    """Whether the first or last byte of t lies in a range dormant manages
    (awake or not)."""
    m = dormant.manager()
    for offset in (0, t.numel() * t.element_size() - 1):
        try:
            m.copy_to_host(t.data_ptr() + offset, 1)
            return True
        except dormant.BusyError:
            return True        # managed, its tag not awake
        except dormant.InvalidArgumentError:
            pass
    return False


def tags():
    return {t["tag"]: t for t in dormant.manager().stats()["tags"]}


def random_bytes(n, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = torch.empty(n, dtype=torch.uint8, device="cuda")
    out.random_(0, 256, generator=g)
    return out


def transition(action):
    getattr(torch_memory_saver, action)()
    return True, ""


def main(hook_mode):
    assert getattr(tms_package, "__dormant__", False), "torch_memory_saver is not dormant's"
    torch_memory_saver.hook_mode = hook_mode
    cdll = torch_memory_saver._impl._binary_wrapper.cdll
    check("hook_mode", torch_memory_saver.hook_mode == hook_mode, torch_memory_saver.hook_mode)

    # weights kept, grads (nested, miles's layout) without backup, tag "default"
    with torch_memory_saver.region(enable_cpu_backup=True):
        weights = random_bytes(256 * MiB, 1)
        with torch_memory_saver.region(enable_cpu_backup=False):
            grads = torch.randn(32 * MiB, dtype=torch.float32, device="cuda")
        scratch = torch.ones(MiB, device="cuda")   # freed: a block cached in the region's pool
        del scratch
    weights_host = weights.cpu()
    check("weights_in_a_cpu_backup_region_are_managed", managed(weights))
    check("grads_in_a_no_backup_region_are_managed", managed(grads))

    # DeepEP's buffer: the interesting region off around it, then on again
    # (slime, miles), outside every region
    cdll.tms_set_interesting_region(False)
    try:
        deepep = torch.full((64 * MiB,), 7, dtype=torch.uint8, device="cuda")
    finally:
        cdll.tms_set_interesting_region(True)
    ordinary.append(("DeepEP buffer", deepep))
    check("deepep_buffer_is_ordinary_memory", not managed(deepep))
    outside = torch.full((16 * MiB,), 3, dtype=torch.uint8, device="cuda")
    ordinary.append(("outside, interesting region back on", outside))
    check("outside_regions_after_interesting_region_on_is_ordinary", not managed(outside))
    freed = torch.zeros(MiB, dtype=torch.uint8, device="cuda")   # cached in PyTorch's pool
    del freed
    torch.cuda.synchronize()

    attempt("pause_succeeds", lambda: transition("pause"))
    states = {k: v["state"] for k, v in tags().items()}
    check("every_tag_paused", states and all(s == "asleep" for s in states.values()), states)

    # while paused: small tensor operations outside every region (comparing
    # DeepEP's buffer needs a 2 MiB segment), PyTorch's cached blocks reused
    made = {}

    def allocate_while_paused():
        t = torch.arange(MiB, dtype=torch.int64, device="cuda")
        ordinary.append(("outside while paused", t))
        made["t"] = t
        return True, ""
    attempt("allocation_outside_regions_while_paused_succeeds", allocate_while_paused)

    def usable():
        t = made["t"]
        if managed(t):
            return False, "in a managed range (paused: touching it would fault)"
        got = int(t.sum().item())
        return got == MiB * (MiB - 1) // 2, got
    attempt("allocation_outside_regions_while_paused_is_usable", usable)
    check("allocation_outside_regions_while_paused_is_not_managed",
          "t" in made and not managed(made["t"]))

    def deepep_intact():
        if managed(deepep):
            return False, "in a managed range"
        same = deepep == 7                  # a fresh tensor outside every region
        ordinary.append(("comparison while paused", same))
        return bool(same.all().item()), ""
    attempt("deepep_buffer_intact_while_paused", deepep_intact)

    def weight_sync():
        with torch_memory_saver.disable():
            host = torch_memory_saver.get_cpu_backup(weights, zero_copy=True)
            fresh = host.to("cuda")
            ordinary.append(("inside disable()", fresh))
            if managed(fresh):
                return False, "in a managed range"
            same = torch.equal(fresh.cpu(), weights_host)
            no_backup = torch_memory_saver.get_cpu_backup(grads) is None
            del fresh
            return same and no_backup, f"same {same}, grads without backup None {no_backup}"
    attempt("disable_while_paused_reads_the_host_copy_into_ordinary_memory", weight_sync)
    torch.cuda.synchronize()

    attempt("resume_succeeds", lambda: transition("resume"))
    states = {k: v["state"] for k, v in tags().items()}
    check("every_tag_awake_after_resume", states and all(s == "awake" for s in states.values()),
          states)
    attempt("weights_intact_after_resume", lambda: (torch.equal(weights.cpu(), weights_host), ""))
    attempt("grads_zero_after_resume", lambda: (int(grads.count_nonzero().item()) == 0, ""))
    attempt("deepep_buffer_intact_after_resume", lambda: (bool((deepep == 7).all().item()), ""))
    inside = [what for what, t in ordinary if managed(t)]
    check("ordinary_allocations_never_land_in_a_managed_range", not inside,
          f"{len(ordinary)} ordinary allocations; in a managed range: {inside}")
    print("RESULTS " + json.dumps(results), flush=True)


if __name__ == "__main__":
    torch.cuda.init()
    main(sys.argv[1])
