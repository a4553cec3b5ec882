# SPDX-License-Identifier: MIT
"""Sleep, wake, stats, policies and errors through the Python API, on the host
backend (the simulated device keeps the manager's semantics)."""
import errno
import os

import pytest

from conftest import MiB

import dormant


def pattern(n, seed):
    return bytes((i * 31 + seed) & 0xFF for i in range(256)) * (n // 256)


def test_manager_basics(mgr):
    assert mgr.backend == "host"
    assert mgr.host_mode in ("retain", "release", "reclaimable")
    assert mgr.device_count >= 1
    assert "host" in repr(mgr)


def test_host_mode_option():
    with dormant.Manager(backend="host", host_mode="retain") as m:
        assert m.host_mode == "retain"
    with pytest.raises(dormant.InvalidArgumentError):
        dormant.Manager(backend="host", host_mode="sometimes")


def test_bad_backend():
    with pytest.raises(dormant.DormantError) as e:
        dormant.Manager(backend="quantum")
    assert e.value.errno != 0
    assert e.value.message


def test_keep_restored_discard_zeroed_same_address(mgr):
    mgr.set_policy("grads", "discard")
    w = mgr.alloc("weights", 4 * MiB)
    g = mgr.alloc("grads", 4 * MiB)
    data_w, data_g = pattern(4 * MiB, 1), pattern(4 * MiB, 2)
    mgr.copy_to_device(w, data_w)
    mgr.copy_to_device(g, data_g)

    report = mgr.sleep()
    assert report["action"] == "sleep"
    assert report["result"] == "ok"
    assert report["changed"] is True
    assert report["state"] == "asleep"
    by_tag = {t["tag"]: t for t in report["tags"]}
    assert by_tag["weights"]["policy"] == "keep"
    assert by_tag["weights"]["after"] == "asleep"
    assert by_tag["weights"]["bytes_copied"] >= 4 * MiB
    assert by_tag["grads"]["bytes_copied"] == 0
    assert by_tag["grads"]["bytes_released"] >= 4 * MiB

    with pytest.raises(dormant.BusyError):
        mgr.copy_to_host(w, 16)

    report = mgr.wake()
    assert report["action"] == "wake"
    assert report["state"] == "awake"
    assert {t["tag"]: t for t in report["tags"]}["grads"]["bytes_zeroed"] >= 4 * MiB
    assert mgr.copy_to_host(w, 4 * MiB) == data_w      # same address, same bytes
    assert mgr.copy_to_host(g, 4 * MiB) == bytes(4 * MiB)  # fresh zeros


def test_stats_shape_and_host_bytes(mgr):
    mgr.set_policy("grads", "discard")
    mgr.alloc("weights", 8 * MiB)
    mgr.alloc("grads", 8 * MiB)
    s = mgr.stats()
    for key in ("backend", "host_mode", "healthy", "state", "transition_running",
                "steps_running", "tags", "totals", "devices", "counters", "last_sleep",
                "last_wake"):
        assert key in s, key
    assert s["backend"] == "host"
    assert s["state"] == "awake"
    assert s["last_sleep"] is None
    for key in ("allocations", "bytes", "device_bytes", "host_bytes", "staging_bytes"):
        assert key in s["totals"], key
    tags = {t["tag"]: t for t in s["tags"]}
    assert tags["weights"]["bytes"] == 8 * MiB
    assert tags["grads"]["policy"] == "discard"
    assert s["devices"][0]["managed_bytes"] >= 16 * MiB

    mgr.sleep()
    s = mgr.stats()
    tags = {t["tag"]: t for t in s["tags"]}
    assert s["state"] == "asleep"
    assert tags["weights"]["state"] == "asleep"
    assert tags["weights"]["device_bytes"] == 0
    assert tags["weights"]["host_bytes"] >= 8 * MiB     # the kept copy
    assert tags["grads"]["host_bytes"] == 0             # grads cost no host memory
    assert s["totals"]["host_bytes"] == tags["weights"]["host_bytes"]
    assert s["counters"]["sleeps_ok"] == 1
    assert s["last_sleep"]["result"] == "ok"


def test_sleep_some_tags(mgr):
    a = mgr.alloc("a", MiB)
    mgr.alloc("b", MiB)
    mgr.copy_to_device(a, pattern(MiB, 3))
    report = mgr.sleep(["b"])
    assert [t["tag"] for t in report["tags"]] == ["b"]
    assert report["state"] == "mixed"
    assert mgr.copy_to_host(a, MiB) == pattern(MiB, 3)  # "a" stays awake
    report = mgr.sleep("a")  # one name is fine too
    assert report["state"] == "asleep"
    mgr.wake()


def test_one_tag_as_a_string_is_one_name(mgr):
    """sleep("weights") is the tag "weights", not the tags "w", "e", ..."""
    w = mgr.alloc("weights", MiB)
    mgr.alloc("grads", MiB)
    mgr.copy_to_device(w, pattern(MiB, 5))
    report = mgr.sleep("weights")
    assert [t["tag"] for t in report["tags"]] == ["weights"]
    states = {t["tag"]: t["state"] for t in mgr.stats()["tags"]}
    assert states == {"weights": "asleep", "grads": "awake"}
    report = mgr.wake("weights")
    assert [t["tag"] for t in report["tags"]] == ["weights"]
    assert mgr.copy_to_host(w, MiB) == pattern(MiB, 5)


def test_noop_transitions(mgr):
    mgr.alloc("weights", MiB)
    report = mgr.wake()
    assert report["changed"] is False
    mgr.sleep()
    report = mgr.sleep()
    assert report["changed"] is False
    assert report["tags"][0]["before"] == report["tags"][0]["after"] == "asleep"
    mgr.wake()


def test_unknown_tag(mgr):
    mgr.alloc("weights", MiB)
    with pytest.raises(dormant.UnknownTagError) as e:
        mgr.sleep(["weights", "nope"])
    assert e.value.errno == errno.ENOENT
    assert "nope" in str(e.value)
    assert isinstance(e.value, LookupError)
    assert mgr.stats()["state"] == "awake"  # nothing moved


def test_bad_tag_names(mgr):
    with pytest.raises(dormant.InvalidArgumentError):
        mgr.set_policy("has space", "keep")
    with pytest.raises(dormant.InvalidArgumentError):
        mgr.set_policy("x" * 64, "keep")
    with pytest.raises(dormant.InvalidArgumentError):
        mgr.sleep(["bad/name"])


def test_policies(mgr):
    with pytest.raises(dormant.InvalidArgumentError):
        mgr.set_policy("t", "forget")
    mgr.set_policy("t", "discard")
    mgr.alloc("t", MiB)
    mgr.sleep()
    mgr.set_policy("t", "discard")          # unchanged: fine while asleep
    with pytest.raises(dormant.BusyError):  # a change only while awake
        mgr.set_policy("t", "keep")
    mgr.wake()
    mgr.set_policy("t", "keep")
    s = {t["tag"]: t for t in mgr.stats()["tags"]}
    assert s["t"]["policy"] == "keep"


def test_alloc_while_asleep_is_busy(mgr):
    mgr.alloc("w", MiB)
    mgr.sleep()
    with pytest.raises(dormant.BusyError) as e:
        mgr.alloc("w", MiB)
    assert "w" in e.value.message
    mgr.wake()


def test_alloc_that_cannot_fit_fails_at_once_naming_the_size(mgr):
    """More than the device holds, or has free: OutOfMemoryError before any
    chunk is created, the size asked for in the message."""
    creates = mgr.debug_op_count("create")
    with pytest.raises(dormant.OutOfMemoryError) as e:
        mgr.alloc("weights", 1 << 40)
    assert "1 TiB is more than device 0 holds (256 MiB)" in str(e.value), str(e.value)
    assert mgr.debug_op_count("create") == creates
    mgr.alloc("weights", 128 * MiB)
    creates = mgr.debug_op_count("create")
    with pytest.raises(dormant.OutOfMemoryError) as e:
        mgr.alloc("weights", 192 * MiB)
    assert "192 MiB is more than device 0 has free (128 MiB of 256 MiB)" in str(e.value), str(e.value)
    assert mgr.debug_op_count("create") == creates
    assert mgr.stats()["totals"]["device_bytes"] == 128 * MiB


def test_free_and_bad_pointer(mgr):
    p = mgr.alloc("w", MiB)
    mgr.free(p)
    with pytest.raises(dormant.InvalidArgumentError):
        mgr.free(p)


def test_wake_enomem_then_retry(mgr):
    """A wake that cannot get device memory (another process holds it) fails
    with OutOfMemoryError, keeps the tags asleep with their host copy, and
    the same call succeeds once the memory is free."""
    w = mgr.alloc("weights", 32 * MiB)
    data = pattern(32 * MiB, 7)
    mgr.copy_to_device(w, data)
    mgr.sleep()
    free = mgr.stats()["devices"][0]["free_bytes"]
    mgr.debug_occupy(free - 8 * MiB)
    with pytest.raises(dormant.OutOfMemoryError) as e:
        mgr.wake()
    err = e.value
    assert err.errno == errno.ENOMEM
    assert err.report is not None
    assert err.report["result"] == "ENOMEM"
    assert err.report["error"] == err.message
    assert err.report["state"] == "asleep"
    assert mgr.stats()["state"] == "asleep"
    assert mgr.stats()["counters"]["wakes_failed"] == 1
    mgr.debug_occupy(0)
    mgr.wake()
    assert mgr.copy_to_host(w, 32 * MiB) == data


def test_fault_injection_sleep_rolls_back(mgr):
    w = mgr.alloc("weights", 4 * MiB)
    data = pattern(4 * MiB, 9)
    mgr.copy_to_device(w, data)
    mgr.debug_inject_fault("copy", 1, -errno.EIO)
    with pytest.raises(dormant.DeviceError) as e:
        mgr.sleep()
    assert e.value.report["state"] == "awake"
    assert mgr.copy_to_host(w, 4 * MiB) == data


def test_closed_manager():
    m = dormant.Manager(backend="host")
    m.close()
    m.close()  # idempotent
    assert m.closed
    with pytest.raises(dormant.DormantError):
        m.sleep()


def test_error_classes():
    e = dormant.errors.error_from(-errno.EBUSY, "another sleep or wake is running")
    assert isinstance(e, dormant.BusyError)
    assert str(e) == "another sleep or wake is running (EBUSY)"
    assert isinstance(dormant.errors.error_from(-errno.ENOMEM, "x"), dormant.OutOfMemoryError)
    assert type(dormant.errors.error_from(-errno.EPERM, "x")) is dormant.DormantError


def test_default_manager_module_functions():
    # The module-level functions share one manager made on first use;
    # DORMANT_BACKEND=host (set by the meson test) picks the simulated device.
    if os.environ.get("DORMANT_BACKEND") != "host":
        pytest.skip("needs DORMANT_BACKEND=host")
    m = dormant.manager()
    assert m is dormant.manager()
    assert m.backend == "host"
    dormant.set_policy("module.grads", "discard")
    m.alloc("module.grads", MiB)
    report = dormant.sleep(["module.grads"])
    assert report["tags"][0]["policy"] == "discard"
    assert {t["tag"] for t in dormant.stats()["tags"]} >= {"module.grads"}
    dormant.wake()
    with pytest.raises(dormant.BusyError):
        dormant.configure(backend="cuda")


def test_region_needs_torch_and_cuda(mgr):
    # No torch here: ImportError. With torch but on the host backend (a
    # simulated device torch cannot use): NoDeviceError.
    with pytest.raises((ImportError, dormant.NoDeviceError)):
        with mgr.region("weights"):
            pass


def test_verification_finds_a_corrupted_host_copy(mgr):
    w = mgr.alloc("weights", 4 * MiB)
    data = pattern(4 * MiB, 3)
    mgr.copy_to_device(w, data)
    mgr.sleep()
    mgr.debug_corrupt_host(w + 1000, 0x04)
    with pytest.raises(dormant.DeviceError) as e:
        mgr.wake()
    assert "checksum mismatch" in e.value.message and "'weights'" in e.value.message
    stats = mgr.stats()
    assert stats["counters"]["chunk_mismatches_total"] == 1
    assert stats["last_wake"]["chunk_mismatches"] == 1
    mgr.debug_corrupt_host(w + 1000, 0x04)  # fixed
    report = mgr.wake()
    assert report["chunks_verified"] >= 1 and report["chunk_mismatches"] == 0
    assert mgr.copy_to_host(w, 4 * MiB) == data
    mgr.set_verify(False)
    assert mgr.stats()["verify"] is False


def test_disk_policy_files_stats_faults_and_corruption(tmp_path):
    """A "disk" tag's copy goes to files of disk_dir (named here, to count
    them), shows as disk_bytes in the stats, comes back bit-identical; a
    failed disk write rolls the sleep back with nothing lost, and a file
    corrupted while asleep fails the wake until it is whole again."""
    with dormant.Manager(backend="host", chunk_bytes="4MiB", staging_bytes="8MiB",
                         disk_dir=tmp_path, disk_names=True) as m:
        assert m.option("disk_dir") == str(tmp_path)
        m.set_policy("cold", "disk")
        p = m.alloc("cold", 6 * MiB)
        data = pattern(6 * MiB, 9)
        m.copy_to_device(p, data)

        m.debug_inject_fault("disk", 2, -errno.ENOSPC)
        with pytest.raises(dormant.DormantError) as e:
            m.sleep()
        assert e.value.errno == errno.ENOSPC and "disk" in e.value.message
        assert m.stats()["tags"][0]["state"] == "awake" and os.listdir(tmp_path) == []
        assert m.copy_to_host(p, 6 * MiB) == data

        m.sleep()
        stats = m.stats()
        (cold,) = [t for t in stats["tags"] if t["tag"] == "cold"]
        assert cold["policy"] == "disk" and cold["host_bytes"] == 0
        assert cold["disk_bytes"] >= 6 * MiB and stats["totals"]["disk_bytes"] == cold["disk_bytes"]
        assert sum(os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path)) == cold["disk_bytes"]
        m.debug_corrupt_host(p + 5 * MiB, 0x10)
        with pytest.raises(dormant.DeviceError) as e:
            m.wake()
        assert "disk copy changed" in e.value.message
        m.debug_corrupt_host(p + 5 * MiB, 0x10)
        m.wake()
        assert m.copy_to_host(p, 6 * MiB) == data
        assert os.listdir(tmp_path) == [] and m.stats()["totals"]["disk_bytes"] == 0
        m.set_disk_dir(tmp_path / "missing")
        with pytest.raises(dormant.DormantError) as e:
            m.sleep()
        assert e.value.errno == errno.ENOENT and "missing" in e.value.message
        assert m.copy_to_host(p, 6 * MiB) == data


def test_warm_up_prepares_the_first_sleep():
    """Issue 24: Manager.warm_up() sets up what the first sleep would (retain
    mode: the kept memory's host copies too); /stats shows it, and the sleep
    then has no setup and no host copies of its own to make."""
    with dormant.Manager(backend="host", host_mode="retain", warmup="off") as m:
        w = m.alloc("weights", 4 * MiB)
        data = pattern(4 * MiB, 5)
        m.copy_to_device(w, data)
        assert m.stats()["warmup"]["state"] == "off"
        assert m.stats()["warmup"]["runs"] == 0
        m.warm_up()
        st = m.stats()["warmup"]
        assert st["runs"] == 1 and st["failures"] == 0 and st["last_error"] == ""
        assert st["device_setups"] == 1
        assert st["host_bytes_total"] == 4 * MiB
        assert m.stats()["totals"]["host_bytes"] == 4 * MiB   # held awake, as retain holds it
        report = m.sleep()
        assert report["times"]["setup_s"] == 0
        assert report["times"]["host_prep_s"] == 0 and report["times"]["host_pin_s"] == 0
        m.wake()
        assert m.copy_to_host(w, 4 * MiB) == data
        assert m.stats()["warmup"]["device_setups"] == 1


def test_sleep_with_residue_checkpoint_and_the_wake_that_restores_it():
    """Issue 34: Manager.sleep(residue="checkpoint") checkpoints the process's
    residue once every tag is asleep (the host backend models it, 8 MiB per
    used device here), stats say so, and the next wake restores it first;
    residue="keep" or the option's default makes none."""
    with dormant.Manager(backend="host", host_residue_bytes="8MiB", warmup="off") as m:
        w = m.alloc("weights", 4 * MiB)
        m.alloc("grads", 4 * MiB)
        m.set_policy("grads", "discard")
        data = pattern(4 * MiB, 9)
        m.copy_to_device(w, data)
        assert m.stats()["residue"]["mode"] == "keep"
        report = m.sleep()
        assert report["residue"]["action"] == "none"
        m.wake()
        report = m.sleep(residue="checkpoint")
        assert report["residue"]["action"] == "checkpoint"
        assert report["residue"]["result"] == "ok"
        st = m.stats()["residue"]
        assert st["state"] == "checkpointed" and st["checkpoints"] == 1
        assert st["residue_bytes"] == 8 * MiB and st["helper_pid"] > 0
        # nothing may touch the device while checkpointed
        with pytest.raises(dormant.BusyError):
            m.alloc("weights", 1 * MiB)
        report = m.wake()
        assert report["residue"]["action"] == "restore" and report["residue"]["result"] == "ok"
        assert m.stats()["residue"]["state"] == "resident"
        assert m.copy_to_host(w, 4 * MiB) == data
        assert m.stats()["residue"]["calls_while_checkpointed"] == 0
        # this sleep keeps it, whatever the option
        assert m.sleep(residue="keep")["residue"]["action"] == "none"
        m.wake()
        with pytest.raises(ValueError):
            m.sleep(residue="later")
        assert m.stats()["state"] == "awake"


def test_residue_option_checkpoints_every_sleep_that_leaves_every_tag_asleep():
    with dormant.Manager(backend="host", residue="checkpoint", host_residue_bytes="4MiB",
                         warmup="off") as m:
        m.alloc("weights", 4 * MiB)
        m.alloc("grads", 4 * MiB)
        assert m.stats()["residue"]["mode"] == "checkpoint"
        # a tag still awake: the residue stays
        assert m.sleep("grads")["residue"]["action"] == "none"
        assert m.sleep("weights")["residue"]["action"] == "checkpoint"
        assert m.stats()["residue"]["state"] == "checkpointed"
        assert m.wake("grads")["residue"]["action"] == "restore"
        m.wake()
