# SPDX-License-Identifier: MIT
"""torch_memory_saver's C ABI on libdormant-preload.so (preload/tms.c), called
through ctypes on the host backend, as programs written for
torch_memory_saver call it: loaded by path (hook mode "torch", the manager
attached as the Python package attaches it) and preloaded (whole-process
capture, the fake CUDA runtime's cudaMalloc interposed), where
tms_set_interesting_region(False) makes cudaMalloc ordinary device memory
that works while everything else is paused (disable(), DeepEP's buffers)."""
import ctypes
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))

import dormant  # noqa: E402

SHIM = os.environ["DORMANT_TEST_PRELOAD_LIB"]
FAKE_CUDART = os.environ["DORMANT_TEST_FAKE_CUDART"]
MiB = 1 << 20

SIGNATURES = {   # torch_memory_saver's binary_wrapper.py
    "tms_set_current_tag": (None, [ctypes.c_char_p]),
    "tms_get_current_tag": (ctypes.c_char_p, []),
    "tms_set_interesting_region": (None, [ctypes.c_bool]),
    "tms_get_interesting_region": (ctypes.c_bool, []),
    "tms_set_enable_cpu_backup": (None, [ctypes.c_bool]),
    "tms_get_enable_cpu_backup": (ctypes.c_bool, []),
    "tms_set_cpu_backup_backend": (None, [ctypes.c_char_p]),
    "tms_get_cpu_backup_backend": (ctypes.c_char_p, []),
    "tms_set_enable_disk_backup": (None, [ctypes.c_bool]),
    "tms_get_enable_disk_backup": (ctypes.c_bool, []),
    "tms_set_disk_backup_dir": (None, [ctypes.c_char_p]),
    "tms_get_disk_backup_dir": (ctypes.c_char_p, []),
    "tms_pause": (ctypes.c_int, [ctypes.c_char_p]),
    "tms_resume": (ctypes.c_int, [ctypes.c_char_p]),
    "set_memory_margin_bytes": (None, [ctypes.c_uint64]),
    "tms_set_retain_cpu_backup": (None, [ctypes.c_bool]),
    "tms_get_retain_cpu_backup": (ctypes.c_bool, []),
    "tms_get_cpu_backup_pointer": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_uint64]),
    "tms_torch_malloc": (ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
    "tms_torch_free": (None, [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]),
}


def bind(cdll):
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(cdll, name)
        fn.restype, fn.argtypes = restype, argtypes
    return cdll


def pattern(n, seed):
    return bytes((i * 13 + seed) & 0xFF for i in range(n))


def tags(m):
    return {t["tag"]: t for t in m.stats()["tags"]}


@pytest.fixture
def abi(monkeypatch):
    for name in ("TMS_INIT_ENABLE", "TMS_INIT_ENABLE_CPU_BACKUP", "TMS_INIT_CPU_BACKUP_BACKEND",
                 "TMS_INIT_ENABLE_DISK_BACKUP", "TMS_RETAIN_CPU_BACKUP", "DORMANT_PRELOAD"):
        monkeypatch.delenv(name, raising=False)
    m = dormant.Manager(backend="host", host_device_bytes=64 * MiB)
    lib = m._lib
    assert lib.dormant_torch_set_manager(m._handle()) == 0
    cdll = bind(ctypes.CDLL(SHIM))
    yield m, cdll
    cdll.tms_set_current_tag(b"default")
    cdll.set_memory_margin_bytes(0)
    lib.dormant_set_thread_policy(-1)
    lib.dormant_torch_set_manager(None)
    m.close()


def test_thread_configuration_pairs(abi):
    m, cdll = abi
    assert cdll.tms_get_current_tag() == b"default"
    cdll.tms_set_current_tag(b"kv_cache")
    assert cdll.tms_get_current_tag() == b"kv_cache"
    cdll.tms_set_current_tag(b"not a tag")            # refused by dormant: unchanged
    assert cdll.tms_get_current_tag() == b"kv_cache"
    assert cdll.tms_get_interesting_region()          # dormant captures by default
    os.environ["TMS_INIT_ENABLE"] = "0"               # (the fixture removes it again)
    assert not cdll.tms_get_interesting_region()
    del os.environ["TMS_INIT_ENABLE"]
    cdll.tms_set_interesting_region(False)
    assert not cdll.tms_get_interesting_region()
    cdll.tms_set_interesting_region(True)
    cdll.tms_set_enable_cpu_backup(False)
    assert not cdll.tms_get_enable_cpu_backup()
    cdll.tms_set_enable_cpu_backup(True)
    assert cdll.tms_get_enable_cpu_backup()
    assert cdll.tms_get_cpu_backup_backend() == b"pinned"
    cdll.tms_set_cpu_backup_backend(b"mmap")
    assert cdll.tms_get_cpu_backup_backend() == b"mmap"
    cdll.tms_set_cpu_backup_backend(b"bogus")          # unchanged
    assert cdll.tms_get_cpu_backup_backend() == b"mmap"
    assert not cdll.tms_get_enable_disk_backup()
    cdll.tms_set_enable_disk_backup(True)
    assert cdll.tms_get_enable_disk_backup()
    cdll.tms_set_enable_disk_backup(False)
    cdll.tms_set_disk_backup_dir(b"/tmp/tms-dir")
    assert cdll.tms_get_disk_backup_dir() == b"/tmp/tms-dir"


def test_torch_malloc_pause_resume_and_backup_pointer(abi):
    m, cdll = abi
    cdll.tms_set_current_tag(b"weights")
    cdll.tms_set_enable_cpu_backup(True)
    kept = cdll.tms_torch_malloc(MiB, 0, None)
    cdll.tms_set_enable_cpu_backup(False)
    dropped = cdll.tms_torch_malloc(MiB, 0, None)
    assert kept and dropped
    assert tags(m)["weights"]["allocations"] == 2
    m.copy_to_device(kept, pattern(MiB, 1))
    m.copy_to_device(dropped, pattern(MiB, 2))
    assert not cdll.tms_get_cpu_backup_pointer(kept, MiB)      # awake
    assert cdll.tms_pause(b"never_used") == 0
    assert cdll.tms_pause(b"weights") == 0
    assert tags(m)["weights"]["state"] == "asleep"
    host = cdll.tms_get_cpu_backup_pointer(kept + 4096, 8192)
    assert host and ctypes.string_at(host, 8192) == pattern(MiB, 1)[4096:4096 + 8192]
    assert not cdll.tms_get_cpu_backup_pointer(dropped, 16)    # no backup
    assert cdll.tms_resume(None) == 0
    assert m.copy_to_host(kept, MiB) == pattern(MiB, 1)
    assert m.copy_to_host(dropped, MiB) == bytes(MiB)
    cdll.tms_torch_free(kept, MiB, 0, None)
    cdll.tms_torch_free(dropped, MiB, 0, None)
    assert tags(m)["weights"]["allocations"] == 0


def test_disk_backup_writes_the_copy_to_the_directory(abi, tmp_path):
    m, cdll = abi
    cdll.tms_set_disk_backup_dir(str(tmp_path).encode())
    assert m.option("disk_dir") == str(tmp_path)
    cdll.tms_set_current_tag(b"opt")
    cdll.tms_set_enable_disk_backup(True)
    on_disk = cdll.tms_torch_malloc(2 * MiB, 0, None)
    cdll.tms_set_enable_disk_backup(False)
    cdll.tms_set_enable_cpu_backup(True)
    in_ram = cdll.tms_torch_malloc(MiB, 0, None)
    m.copy_to_device(on_disk, pattern(2 * MiB, 3))
    m.copy_to_device(in_ram, pattern(MiB, 4))
    assert cdll.tms_pause(b"opt") == 0
    opt = tags(m)["opt"]
    assert opt["disk_bytes"] >= 2 * MiB and opt["host_bytes"] < 2 * MiB
    assert cdll.tms_resume(b"opt") == 0
    assert m.copy_to_host(on_disk, 2 * MiB) == pattern(2 * MiB, 3)
    assert m.copy_to_host(in_ram, MiB) == pattern(MiB, 4)
    assert tags(m)["opt"]["disk_bytes"] == 0
    cdll.tms_set_disk_backup_dir(b"relative")             # refused by dormant: unchanged
    assert m.option("disk_dir") == str(tmp_path)
    cdll.tms_torch_free(on_disk, 2 * MiB, 0, None)
    cdll.tms_torch_free(in_ram, MiB, 0, None)


def test_margin_refuses_a_resume_and_loses_nothing(abi):
    m, cdll = abi
    cdll.tms_set_current_tag(b"w")
    cdll.tms_set_enable_cpu_backup(True)
    p = cdll.tms_torch_malloc(8 * MiB, 0, None)
    m.copy_to_device(p, pattern(8 * MiB, 3))
    assert cdll.tms_pause(b"w") == 0
    cdll.set_memory_margin_bytes(60 * MiB)   # of a 64 MiB device: waking 8 leaves less
    assert cdll.tms_resume(b"w") == 2        # cudaErrorMemoryAllocation
    assert tags(m)["w"]["state"] == "asleep" and tags(m)["w"]["device_bytes"] == 0
    cdll.set_memory_margin_bytes(MiB)
    assert cdll.tms_resume(b"w") == 0
    assert m.copy_to_host(p, 8 * MiB) == pattern(8 * MiB, 3)


def test_retain_is_the_host_mode(abi):
    m, cdll = abi
    assert not cdll.tms_get_retain_cpu_backup()
    cdll.tms_set_retain_cpu_backup(True)
    assert cdll.tms_get_retain_cpu_backup() and m.host_mode == "retain"
    cdll.tms_set_retain_cpu_backup(False)
    assert m.host_mode == "release"


UNDER_CAPTURE = r"""
import ctypes, sys
ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)   # the (fake) CUDA runtime, as torch loads it
process = ctypes.CDLL(None)                         # the shim's symbols are global
for name in ("tms_pause", "tms_resume"):
    getattr(process, name).argtypes = [ctypes.c_char_p]
process.tms_set_interesting_region.argtypes = [ctypes.c_bool]
process.tms_get_interesting_region.restype = ctypes.c_bool
process.fake_cuda_count.restype = ctypes.c_uint64
MiB = 1 << 20
weights = ctypes.c_void_p()
assert process.cudaMalloc(ctypes.byref(weights), ctypes.c_size_t(4 * MiB)) == 0
ctypes.memset(weights, 0x5A, 4 * MiB)
process.dormant_preload_stats_get  # the shim is there
assert process.fake_cuda_count(0) == 0, "captured, not the runtime's"
ordinary = process.fake_cuda_count(0)               # FAKE_MALLOC
assert process.tms_pause(None) == 0
# paused: what is allocated outside the interesting region is ordinary memory
process.tms_set_interesting_region(False)
assert not process.tms_get_interesting_region()
scratch = ctypes.c_void_p()
assert process.cudaMalloc(ctypes.byref(scratch), ctypes.c_size_t(2 * MiB)) == 0
assert process.fake_cuda_count(0) == ordinary + 1, "went to the runtime"
ctypes.memset(scratch, 0x33, 2 * MiB)               # it works while the rest sleeps
assert ctypes.string_at(scratch.value + 12345, 1) == b"\x33"
assert process.cudaFree(scratch) == 0
process.tms_set_interesting_region(True)
assert process.tms_resume(None) == 0
assert ctypes.string_at(weights.value + 4 * MiB - 1, 1) == b"\x5A"
print("PASS tms-capture")
"""


# The shim by its own name with DORMANT_PRELOAD=1, and by torch_memory_saver's
# (the build's shadow folder) as slime's launcher preloads it: TMS_INIT_ENABLE=1.
TMS_NAMED = str(pathlib.Path(SHIM).parent / "tms-shadow" /
                "torch_memory_saver_hook_mode_preload_cu12.abi3.so")


@pytest.mark.parametrize("library, variables", [(SHIM, {"DORMANT_PRELOAD": "1"}),
                                                (TMS_NAMED, {"TMS_INIT_ENABLE": "1"})],
                         ids=["dormant", "tms-name"])
def test_under_capture_the_interesting_region_chooses_what_is_captured(library, variables):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DORMANT_PRELOAD", "DORMANT_LISTEN", "TMS_", "PYTORCH_"))}
    env.update(DORMANT_BACKEND="host", DORMANT_HOST_DEVICE_BYTES=str(64 * MiB),
               PYTHONPATH=str(REPO / "python"), **variables)
    assert os.path.exists(library)
    env["LD_PRELOAD"] = " ".join(filter(None, [os.environ.get("LD_PRELOAD", ""), library]))
    if "libasan" in env["LD_PRELOAD"]:
        pytest.skip("an uninstrumented Python with an instrumented libdormant preloaded "
                    "hangs at start-up")
    proc = subprocess.run([sys.executable, "-c", UNDER_CAPTURE, FAKE_CUDART], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "PASS tms-capture" in proc.stdout, \
        f"rc {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
