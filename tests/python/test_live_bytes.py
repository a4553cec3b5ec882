# SPDX-License-Identifier: MIT
"""Live bytes on the Python side, on the host backend: Manager.mark_unused(),
the torch glue marking the caching allocator's free blocks before every sleep
(from Python and over HTTP; checked with the stand-in torch of
test_region_glue, whose pools describe their segments the way
torch.cuda.MemPool.snapshot() does), and the "rebuild" policy's Python
callback."""
import errno
import logging

import pytest

from conftest import MiB, http

import dormant
from test_region_glue import glue  # noqa: F401  (the fixture)

# Markers that once skipped these where the library lacked marks and rebuild; it has both.
needs_marks = needs_rebuild = pytest.mark.usefixtures()
MARK_MIN = 64 << 10  # dormant._torch.MARK_MIN_BYTES (checked below)


def pattern(n, seed):
    return bytes((i * 31 + seed) & 0xFF for i in range(256)) * (n // 256)


def by_tag(report):
    return {t["tag"]: t for t in report["tags"]}


# ---- Manager.mark_unused ------------------------------------------------------

@needs_marks
def test_mark_unused_skips_and_zeroes(mgr):
    ptr = mgr.alloc("weights", 8 * MiB)
    data = pattern(8 * MiB, 3)
    mgr.copy_to_device(ptr, data)
    mgr.mark_unused(ptr + 2 * MiB, 3 * MiB)
    report = mgr.sleep()
    assert report["bytes_skipped"] == 3 * MiB
    assert by_tag(report)["weights"]["bytes_skipped"] == 3 * MiB
    assert report["bytes_copied"] == 5 * MiB
    assert mgr.stats()["totals"]["host_bytes"] <= 5 * MiB + MiB  # host copy of live bytes only
    mgr.wake()
    back = mgr.copy_to_host(ptr, 8 * MiB)
    assert back[:2 * MiB] == data[:2 * MiB]
    assert back[2 * MiB:5 * MiB] == bytes(3 * MiB)
    assert back[5 * MiB:] == data[5 * MiB:]
    # The mark lasted until that wake: the next sleep copies everything.
    assert mgr.sleep()["bytes_skipped"] == 0
    mgr.wake()


@needs_marks
def test_mark_unused_bad_range(mgr):
    ptr = mgr.alloc("weights", 4 * MiB)
    for address, size in ((ptr + 3 * MiB, 2 * MiB), (ptr - 4096, 8192), (16, 16)):
        with pytest.raises(dormant.InvalidArgumentError):
            mgr.mark_unused(address, size)
    mgr.copy_to_device(ptr, pattern(4 * MiB, 1))
    assert mgr.sleep()["bytes_skipped"] == 0  # nothing was marked by the refused calls
    mgr.wake()
    assert mgr.copy_to_host(ptr, 4 * MiB) == pattern(4 * MiB, 1)


@needs_marks
def test_stats_show_bytes_skipped(mgr):
    ptr = mgr.alloc("weights", 4 * MiB)
    mgr.mark_unused(ptr, MiB)
    mgr.sleep()
    stats = mgr.stats()
    assert stats["last_sleep"]["bytes_skipped"] == MiB
    mgr.wake()


# ---- the glue: free blocks of the caching allocator -------------------------

class Segments:
    """What a stand-in pool's snapshot() says: segments it allocated (through
    the real dormant_torch_malloc) cut into blocks with states."""

    def __init__(self, fake):
        self.fake = fake
        self.by_pool = {}

    def install(self, pool):
        segments = self.by_pool.setdefault(pool, [])

        def snapshot(include_traces=True):
            assert include_traces is False  # the glue asks for the cheap form
            return [{"address": base, "total_size": sum(s for s, _ in blocks),
                     "blocks": [{"size": s, "state": st} for s, st in blocks]}
                    for base, blocks in segments]
        pool.snapshot = snapshot

    def segment(self, mgr, blocks):
        """One segment in the routed pool, blocks [(size, state)], filled with
        a pattern; returns (base, data)."""
        size = sum(s for s, _ in blocks)
        pool, base = self.fake.alloc(size)
        if pool not in self.by_pool:
            self.install(pool)
        self.by_pool[pool].append((base, blocks))
        data = pattern(size, len(self.by_pool[pool]))
        mgr.copy_to_device(base, data)
        return base, data


def check_blocks(mgr, base, data, blocks):
    """Live blocks came back intact, marked (free, big enough) ones as zeros."""
    offset = 0
    back = mgr.copy_to_host(base, len(data))
    for size, state in blocks:
        marked = state == "inactive" and size >= MARK_MIN
        want = bytes(size) if marked else data[offset:offset + size]
        assert back[offset:offset + size] == want, (offset, size, state)
        offset += size


BLOCKS = [(MiB, "active_allocated"), (3 * MiB, "inactive"), (MiB, "active_pending_free"),
          (2 * MiB + 4096, "inactive"), (4096, "inactive"), (2 * MiB - 8192, "active_allocated")]
FREE = 3 * MiB + 2 * MiB + 4096  # the 4 KiB block is under MARK_MIN_BYTES


@needs_marks
def test_glue_marks_free_blocks_before_a_python_sleep(glue):
    fake, mgr, module = glue
    segs = Segments(fake)
    with mgr.region("optimizer"):
        base, data = segs.segment(mgr, BLOCKS)
    report = mgr.sleep()
    assert report["bytes_skipped"] == FREE
    assert by_tag(report)["optimizer"]["bytes_skipped"] == FREE
    marks = mgr.free_block_marks()
    assert marks["sleeps"] == 1
    assert marks["last"]["blocks"] == 2 and marks["last"]["bytes"] == FREE
    assert marks["last"]["seconds"] >= 0
    assert module.MARK_MIN_BYTES == MARK_MIN
    mgr.wake()
    # Live and pending-free blocks intact, marked ones zero, the 4 KiB free
    # block (too small to mark) copied.
    check_blocks(mgr, base, data, BLOCKS)


@needs_marks
def test_small_free_blocks_are_copied(glue):
    fake, mgr, module = glue
    segs = Segments(fake)
    blocks = [(MiB, "active_allocated"), (module.MARK_MIN_BYTES - 4096, "inactive"),
              (MiB, "active_allocated")]
    with mgr.region("weights"):
        base, data = segs.segment(mgr, blocks)
    assert mgr.sleep()["bytes_skipped"] == 0
    mgr.wake()
    assert mgr.copy_to_host(base, len(data)) == data


@needs_marks
def test_glue_marks_before_an_http_sleep(glue):
    fake, mgr, module = glue
    segs = Segments(fake)
    with mgr.region("optimizer"):
        base, data = segs.segment(mgr, BLOCKS[:2])
    with mgr.serve(quiet=True) as server:
        r = http("POST", server.url + "/sleep")
        assert r.status == 200, r
        assert r.json["bytes_skipped"] == 3 * MiB
        r = http("POST", server.url + "/wake")
        assert r.status == 200, r
    check_blocks(mgr, base, data, BLOCKS[:2])


@needs_marks
def test_glue_marks_only_the_tags_a_python_sleep_names(glue):
    """A pool of a tag that stays awake is left alone: its free block may be
    handed out again before that tag sleeps."""
    fake, mgr, module = glue
    segs = Segments(fake)
    with mgr.region("a"):
        base_a, data_a = segs.segment(mgr, BLOCKS[:2])
    with mgr.region("b"):
        base_b, data_b = segs.segment(mgr, BLOCKS[:2])
    report = mgr.sleep(["a"])
    assert by_tag(report)["a"]["bytes_skipped"] == 3 * MiB
    # "b" stays awake; its free block is reused and filled before b sleeps.
    for (base, blocks) in segs.by_pool[mgr._torch.pools[("b", 0)]]:
        blocks[1] = (blocks[1][0], "active_allocated")
    live = pattern(3 * MiB, 9)
    mgr.copy_to_device(base_b + MiB, live)
    report = mgr.sleep(["b"])
    assert by_tag(report)["b"]["bytes_skipped"] == 0
    mgr.wake()
    assert mgr.copy_to_host(base_b + MiB, 3 * MiB) == live
    check_blocks(mgr, base_a, data_a, BLOCKS[:2])


@needs_marks
def test_opt_out_and_discard_tags(glue):
    """mark_free_blocks=False marks nothing; a discard tag's marks skip
    nothing (it copies nothing anyway)."""
    fake, mgr, module = glue
    segs = Segments(fake)
    with mgr.region("grads", policy="discard"):
        segs.segment(mgr, BLOCKS[:2])
    with mgr.region("weights"):
        base, data = segs.segment(mgr, BLOCKS[:2])
    mgr.mark_free_blocks = False
    report = mgr.sleep()
    assert report["bytes_skipped"] == 0
    assert mgr.free_block_marks()["sleeps"] == 0
    mgr.wake()
    assert mgr.copy_to_host(base, len(data)) == data
    mgr.mark_free_blocks = True
    report = mgr.sleep()
    assert by_tag(report)["weights"]["bytes_skipped"] == 3 * MiB
    assert by_tag(report)["grads"]["bytes_skipped"] == 0
    mgr.wake()


def test_opt_out_keyword():
    with dormant.Manager(backend="host", host_device_bytes=8 * MiB,
                         mark_free_blocks=False) as m:
        assert m.mark_free_blocks is False
        assert m.free_block_marks() is None  # no region used yet


@needs_marks
def test_a_failing_snapshot_never_cancels_the_sleep(glue, caplog):
    fake, mgr, module = glue
    segs = Segments(fake)
    with mgr.region("weights"):
        base, data = segs.segment(mgr, BLOCKS[:2])
    pool = mgr._torch.pools[("weights", 0)]

    def broken(include_traces=True):
        raise RuntimeError("snapshot broke")
    pool.snapshot = broken
    with caplog.at_level(logging.WARNING, logger="dormant"):
        report = mgr.sleep()
    assert report["bytes_skipped"] == 0
    assert "free blocks" in caplog.text
    mgr.wake()
    assert mgr.copy_to_host(base, len(data)) == data


def test_free_blocks_reads_snapshot_addresses():
    """free_blocks() follows the block order of a segment, and uses a
    block's own "address" where the snapshot gives one."""
    import importlib
    import sys
    from test_region_glue import FakeTorch
    saved = sys.modules.get("torch")
    sys.modules["torch"] = FakeTorch()
    sys.modules.pop("dormant._torch", None)
    try:
        module = importlib.import_module("dormant._torch")

        class Pool:
            def snapshot(self, include_traces=True):
                return [{"address": 1000, "blocks": [
                    {"size": 10, "state": "active_allocated"},
                    {"size": 20, "state": "inactive"},
                    {"size": 5, "state": "active_pending_free"},
                    {"size": 7, "state": "inactive"}]},
                    {"address": 5000, "blocks": [
                        {"address": 5000, "size": 8, "state": "inactive"},
                        {"address": 5008, "size": 8, "state": "active_allocated"}]}]
        assert module.free_blocks(Pool()) == [(1010, 20), (1035, 7), (5000, 8)]
    finally:
        sys.modules.pop("dormant._torch", None)
        if saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = saved


# ---- the rebuild policy's callback -------------------------------------------

@needs_rebuild
def test_rebuild_callback_runs_after_keep_tags(mgr):
    src = mgr.alloc("master", 4 * MiB)
    dst = mgr.alloc("weights", 4 * MiB)
    data = pattern(4 * MiB, 5)
    mgr.copy_to_device(src, data)
    calls = []

    def rebuild(tag):
        # The keep tag is back, the rebuild tag mapped and zero-filled.
        calls.append((tag, mgr.copy_to_host(dst, 16) == bytes(16)))
        mgr.copy_to_device(dst, mgr.copy_to_host(src, 4 * MiB))

    mgr.set_policy("weights", "rebuild", rebuild=rebuild)
    assert by_tag_stats(mgr)["weights"]["policy"] == "rebuild"
    report = mgr.sleep()
    assert by_tag(report)["weights"]["bytes_copied"] == 0
    mgr.wake()
    assert calls == [("weights", True)]
    assert mgr.copy_to_host(dst, 4 * MiB) == data


def by_tag_stats(mgr):
    return {t["tag"]: t for t in mgr.stats()["tags"]}


@needs_rebuild
def test_rebuild_exception_fails_the_wake_and_retry_works(mgr):
    src = mgr.alloc("master", 4 * MiB)
    dst = mgr.alloc("weights", 4 * MiB)
    data = pattern(4 * MiB, 6)
    mgr.copy_to_device(src, data)
    fail = [True]

    def rebuild(tag):
        if fail[0]:
            raise ValueError("main params not ready")
        mgr.copy_to_device(dst, mgr.copy_to_host(src, 4 * MiB))

    mgr.set_policy("weights", "rebuild", rebuild=rebuild)
    mgr.sleep()
    with pytest.raises(dormant.DormantError) as e:
        mgr.wake()
    assert "main params not ready" in str(e.value)
    assert isinstance(e.value.__cause__, ValueError)
    assert by_tag_stats(mgr)["weights"]["state"] == "asleep"
    fail[0] = False
    mgr.wake()
    assert mgr.copy_to_host(dst, 4 * MiB) == data
    assert mgr.copy_to_host(src, 4 * MiB) == data


@needs_rebuild
def test_rebuild_over_http(mgr, server):
    src = mgr.alloc("master", MiB)
    dst = mgr.alloc("weights", MiB)
    mgr.copy_to_device(src, pattern(MiB, 7))
    threads = []

    def rebuild(tag):
        import threading
        threads.append(threading.current_thread().name)
        mgr.copy_to_device(dst, mgr.copy_to_host(src, MiB))

    mgr.set_policy("weights", "rebuild", rebuild=rebuild)
    assert http("POST", server.url + "/sleep").status == 200
    r = http("POST", server.url + "/wake")
    assert r.status == 200, r
    assert len(threads) == 1
    assert mgr.copy_to_host(dst, MiB) == pattern(MiB, 7)


@needs_rebuild
def test_rebuild_callback_cannot_start_a_transition(mgr):
    mgr.alloc("weights", MiB)
    seen = []

    def rebuild(tag):
        try:
            mgr.sleep()
        except dormant.BusyError as e:
            seen.append(e.errno)

    mgr.set_policy("weights", "rebuild", rebuild=rebuild)
    mgr.sleep()
    mgr.wake()
    assert seen == [errno.EBUSY]


def test_set_policy_rebuild_argument_errors(mgr):
    with pytest.raises(dormant.InvalidArgumentError):
        mgr.set_policy("weights", "rebuild")            # no callback
    with pytest.raises(dormant.InvalidArgumentError):
        mgr.set_policy("weights", "rebuild", rebuild=42)
    with pytest.raises(dormant.InvalidArgumentError):
        mgr.set_policy("weights", "keep", rebuild=print)
    with pytest.raises(dormant.InvalidArgumentError) as e:
        mgr.set_policy("weights", "sometimes")
    assert "rebuild" in str(e.value) or "keep" in str(e.value)


@needs_rebuild
def test_module_level_set_policy_rebuild(monkeypatch, mgr):
    monkeypatch.setattr(dormant, "_default", mgr)
    called = []
    mgr.alloc("weights", MiB)
    dormant.set_policy("weights", "rebuild", rebuild=called.append)
    dormant.sleep()
    dormant.wake()
    assert called == ["weights"]


@needs_marks
def test_marking_runs_after_the_guard_closed(glue):
    """The hook marks only once the running step has left: no step allocates
    (and so refills a free block) between the marking and the copy."""
    import threading
    fake, mgr, module = glue
    segs = Segments(fake)
    with mgr.region("weights"):
        segs.segment(mgr, BLOCKS[:2])
    seen = []
    real = mgr._torch.mark_free_blocks

    def recording(tags):
        seen.append(mgr.stats()["steps_running"])
        return real(tags)
    mgr._torch.mark_free_blocks = recording
    in_step, leave = threading.Event(), threading.Event()

    def trainer():
        with mgr.step():
            in_step.set()
            leave.wait(30)

    t = threading.Thread(target=trainer)
    t.start()
    in_step.wait(30)
    threading.Timer(0.2, leave.set).start()
    report = mgr.sleep()
    t.join()
    assert report["guard_wait_s"] > 0   # the sleep waited for the step
    assert seen == [0]
    assert report["bytes_skipped"] == 3 * MiB
    mgr.wake()


@needs_marks
def test_marks_of_a_failed_sleep_do_not_outlive_it(glue):
    """A sleep that fails after the glue marked rolls back; training may then
    refill a marked block. The next sleep must copy it: the failed sleep's
    marks must not stand (the library drops them, and the next sleep's hook
    marks what is free then)."""
    fake, mgr, module = glue
    segs = Segments(fake)
    with mgr.region("weights"):
        base, data = segs.segment(mgr, BLOCKS[:2])
    mgr.debug_inject_fault("copy", 1)
    with pytest.raises(dormant.DormantError):
        mgr.sleep()
    assert mgr.stats()["tags"][0]["state"] == "awake"
    # Training goes on and fills the free block.
    blocks = segs.by_pool[mgr._torch.pools[("weights", 0)]][0][1]
    blocks[1] = (blocks[1][0], "active_allocated")
    live = pattern(3 * MiB, 11)
    mgr.copy_to_device(base + MiB, live)
    report = mgr.sleep()
    assert report["bytes_skipped"] == 0
    mgr.wake()
    assert mgr.copy_to_host(base, MiB) == data[:MiB]
    assert mgr.copy_to_host(base + MiB, 3 * MiB) == live
