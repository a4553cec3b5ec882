# SPDX-License-Identifier: MIT
"""torch_memory_saver's contract, as a torch_memory_saver program (issue 32):
only what is allocated inside a region (with the interesting region on) is
managed; everything else is ordinary device memory that works while the
regions are paused and is never paused itself.

Run by test_tms_contract.py on the host backend, under the capture shim and
the fake CUDA runtime, with tests/preload/fake_torch first on PYTHONPATH (a
model of PyTorch's caching allocator) and dormant's torch_memory_saver shadow
as `torch_memory_saver`:

    python3 tms_contract.py preload|torch|whole_process

It prints one line "RESULTS {json}": each check by name, [passed, detail].
A check that fails does not stop the others; touching a paused range faults
(the host backend unmaps it), which fails them all.
"""
import ctypes
import json
import sys
import traceback

import torch
import torch_memory_saver as tms_package
from torch_memory_saver import torch_memory_saver

import dormant

MiB = 1 << 20
FAKE_MALLOC = 0   # enum fake_op (fake_cudart.h)
results = {}
ordinary = []     # (what, tensor) of every allocation that must be ordinary memory


def check(name, passed, detail=""):
    results[name] = [bool(passed), str(detail)]


def attempt(name, fn):
    """check(name, fn()) where fn returns (passed, detail) or raises."""
    try:
        passed, detail = fn()
    except Exception as e:  # noqa: BLE001 (the check fails; the next ones run)
        passed, detail = False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    check(name, passed, detail)
    return passed


def runtime_mallocs():
    """cudaMalloc calls that reached the (fake) CUDA runtime."""
    fn = torch._cudart.fake_cuda_count
    fn.restype = ctypes.c_uint64
    return fn(FAKE_MALLOC)


def managed(t):
    """Whether any byte of t lies in a range dormant manages (awake or not)."""
    m = dormant.manager()
    for offset in (0, t.nbytes - 1):
        try:
            m.copy_to_host(t.data_ptr() + offset, 1)
            return True
        except dormant.BusyError:
            return True        # managed, its tag not awake
        except dormant.InvalidArgumentError:
            pass
    return False


def fill(t, seed):
    n = t.nbytes
    ctypes.memmove(t.data_ptr(), bytes((i * 7 + seed) & 0xFF for i in range(251)) * (n // 251)
                   + bytes((i * 7 + seed) & 0xFF for i in range(n % 251)), n)


def expected(n, seed):
    return bytes((i * 7 + seed) & 0xFF for i in range(251)) * (n // 251) \
        + bytes((i * 7 + seed) & 0xFF for i in range(n % 251))


def cuda(nbytes):
    return torch.empty((nbytes,), dtype=torch.uint8, device="cuda")


def tags():
    return {t["tag"]: t for t in dormant.manager().stats()["tags"]}


def main(hook_mode):
    assert getattr(tms_package, "__dormant__", False), "torch_memory_saver is not dormant's"
    if hook_mode == "torch":
        # the simulated device stands in for CUDA (as tests/python's stand-in torch)
        dormant.Manager.backend = property(lambda self: "cuda")
    torch_memory_saver.hook_mode = hook_mode
    cdll = torch_memory_saver._impl._binary_wrapper.cdll
    check("hook_mode", torch_memory_saver.hook_mode == hook_mode, torch_memory_saver.hook_mode)

    # weights kept, grads (nested, miles's layout) without backup; a scratch
    # tensor freed inside the region leaves a free block cached in its pool
    with torch_memory_saver.region("default", enable_cpu_backup=True):
        weights = cuda(3 * MiB)
        with torch_memory_saver.region("default", enable_cpu_backup=False):
            grads = cuda(2 * MiB)
        scratch = cuda(256 << 10)
        del scratch
    fill(weights, 1)
    fill(grads, 2)
    addresses = (weights.data_ptr(), grads.data_ptr())
    check("weights_in_a_cpu_backup_region_are_managed", managed(weights))
    check("grads_in_a_no_backup_region_are_managed", managed(grads))

    # DeepEP's buffer: the interesting region off around it (slime, miles),
    # then back on, outside every region
    before = runtime_mallocs()
    cdll.tms_set_interesting_region(False)
    try:
        deepep = cuda(4 * MiB)
    finally:
        cdll.tms_set_interesting_region(True)
    fill(deepep, 3)
    ordinary.append(("DeepEP buffer", deepep))
    check("deepep_buffer_is_ordinary_memory",
          not managed(deepep) and runtime_mallocs() == before + 1,
          f"managed {managed(deepep)}, runtime mallocs {runtime_mallocs() - before}")

    # outside every region, after tms_set_interesting_region(True): ordinary
    before = runtime_mallocs()
    outside = cuda(MiB)
    fill(outside, 4)
    ordinary.append(("outside, interesting region back on", outside))
    check("outside_regions_after_interesting_region_on_is_ordinary",
          not managed(outside) and runtime_mallocs() == before + 1)
    freed_outside = cuda(512 << 10)      # freed before the pause: cached in PyTorch's pool
    freed_address = freed_outside.data_ptr()
    del freed_outside

    def transition(action):
        getattr(torch_memory_saver, action)()
        return True, ""
    attempt("pause_succeeds", lambda: transition("pause"))
    states = {k: v["state"] for k, v in tags().items()}
    check("every_tag_paused", states and all(s == "asleep" for s in states.values()), states)

    # while paused: a small tensor operation outside every region (comparing
    # DeepEP's buffer needs a 2 MiB segment), PyTorch's cached block reused
    def allocate_while_paused():
        t = cuda(MiB)
        ordinary.append(("outside while paused", t))
        return True, ""
    attempt("allocation_outside_regions_while_paused_succeeds", allocate_while_paused)
    made = [t for what, t in ordinary if what == "outside while paused"]

    def usable():
        t = made[0]
        if managed(t):
            return False, "in a managed range (paused: touching it would fault)"
        fill(t, 5)
        return t.tobytes() == expected(t.nbytes, 5), ""
    if made:
        attempt("allocation_outside_regions_while_paused_is_usable", usable)
        check("allocation_outside_regions_while_paused_is_not_managed", not managed(made[0]))
    else:
        check("allocation_outside_regions_while_paused_is_usable", False, "no allocation")
        check("allocation_outside_regions_while_paused_is_not_managed", False, "no allocation")

    def cached_block():
        before = runtime_mallocs()
        t = cuda(512 << 10)
        ordinary.append(("cached block while paused", t))
        from_cache = runtime_mallocs() == before
        if managed(t):
            return False, f"a block in a managed range at {t.data_ptr():#x} (paused: " \
                          f"touching it would fault)"
        fill(t, 6)
        return (from_cache and not managed(t) and t.tobytes() == expected(t.nbytes, 6)), \
            f"from the cache {from_cache} at {t.data_ptr():#x} (freed {freed_address:#x})"
    attempt("cached_block_outside_regions_serves_while_paused", cached_block)

    attempt("deepep_buffer_intact_while_paused",
            lambda: (not managed(deepep) and deepep.tobytes() == expected(deepep.nbytes, 3),
                     "in a managed range" if managed(deepep) else ""))

    # slime's weight sync: inside disable(), host copies and fresh buffers
    def weight_sync():
        with torch_memory_saver.disable():
            fresh = cuda(3 * MiB)
            ordinary.append(("inside disable()", fresh))
            if managed(fresh):
                return False, "in a managed range"
            host = torch_memory_saver.get_cpu_backup(weights, zero_copy=True)
            ctypes.memmove(fresh.data_ptr(), host.data_ptr(), host.nbytes)
            same = fresh.tobytes() == expected(3 * MiB, 1)
            no_backup = torch_memory_saver.get_cpu_backup(grads) is None
            return same and no_backup and not managed(fresh), f"{same} {no_backup}"
    attempt("disable_while_paused_reads_the_host_copy_into_ordinary_memory", weight_sync)

    attempt("resume_succeeds", lambda: transition("resume"))
    states = {k: v["state"] for k, v in tags().items()}
    check("every_tag_awake_after_resume", states and all(s == "awake" for s in states.values()),
          states)
    check("regions_keep_their_addresses",
          (weights.data_ptr(), grads.data_ptr()) == addresses)
    attempt("weights_intact_after_resume",
            lambda: (weights.tobytes() == expected(weights.nbytes, 1), ""))
    attempt("grads_zero_after_resume", lambda: (grads.tobytes() == bytes(grads.nbytes), ""))
    attempt("deepep_buffer_intact_after_resume",
            lambda: (deepep.tobytes() == expected(deepep.nbytes, 3), ""))
    inside = [what for what, t in ordinary if managed(t)]
    check("ordinary_allocations_never_land_in_a_managed_range", not inside,
          f"{len(ordinary)} ordinary allocations; in a managed range: {inside}")
    print("RESULTS " + json.dumps(results), flush=True)


def main_whole_process():
    """Whole-process capture (dormant-run --capture, or TMS_INIT_ENABLE=1 as
    slime's and AReaL's launchers set): memory outside regions is managed too,
    under tag "default". An allocation outside every region while it is
    paused gets ordinary memory (not refused); DeepEP's buffer stays
    ordinary. (Blocks PyTorch cached inside a paused segment of its default
    pool would be handed out unmapped: disable() is the way, see
    docs/capture.md; this program frees none there.)"""
    assert getattr(tms_package, "__dormant__", False), "torch_memory_saver is not dormant's"
    cdll = torch_memory_saver._impl._binary_wrapper.cdll
    check("hook_mode", torch_memory_saver.hook_mode == "preload", torch_memory_saver.hook_mode)
    with torch_memory_saver.region("weights", enable_cpu_backup=True):
        weights = cuda(3 * MiB)
    fill(weights, 1)
    outside = cuda(3 * MiB)
    fill(outside, 2)
    check("outside_regions_is_managed_under_tag_default",
          managed(outside) and "default" in tags(), sorted(tags()))
    cdll.tms_set_interesting_region(False)
    try:
        deepep = cuda(4 * MiB)
    finally:
        cdll.tms_set_interesting_region(True)
    fill(deepep, 3)
    check("deepep_buffer_is_ordinary_memory", not managed(deepep))

    def transition(action):
        getattr(torch_memory_saver, action)()
        return True, ""
    attempt("pause_succeeds", lambda: transition("pause"))
    states = {k: v["state"] for k, v in tags().items()}
    check("every_tag_paused", states and all(s == "asleep" for s in states.values()), states)
    made = []

    def allocate_while_paused():
        before = runtime_mallocs()
        made.append(cuda(MiB))
        return runtime_mallocs() == before + 1, "the runtime's"
    attempt("allocation_outside_regions_while_paused_succeeds", allocate_while_paused)

    def usable():
        t = made[0]
        if managed(t):
            return False, "in a managed range (paused: touching it would fault)"
        fill(t, 5)
        return t.tobytes() == expected(t.nbytes, 5), ""
    attempt("allocation_outside_regions_while_paused_is_usable", usable)
    attempt("deepep_buffer_intact_while_paused",
            lambda: (not managed(deepep) and deepep.tobytes() == expected(deepep.nbytes, 3), ""))
    attempt("resume_succeeds", lambda: transition("resume"))
    attempt("weights_intact_after_resume",
            lambda: (weights.tobytes() == expected(weights.nbytes, 1), ""))
    attempt("outside_regions_intact_after_resume",
            lambda: (outside.tobytes() == expected(outside.nbytes, 2), ""))
    attempt("allocation_made_while_paused_still_ordinary_after_resume",
            lambda: (not managed(made[0]) and made[0].tobytes() == expected(MiB, 5), ""))
    print("RESULTS " + json.dumps(results), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "whole_process":
        main_whole_process()
    else:
        main(sys.argv[1])
