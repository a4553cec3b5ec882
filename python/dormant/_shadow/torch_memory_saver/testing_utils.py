# SPDX-License-Identifier: MIT
"""torch_memory_saver.testing_utils: the helpers its tests and examples import."""
from torch_memory_saver.utils import is_xpu

__all__ = ["is_xpu", "get_device", "empty_cache", "get_and_print_gpu_memory"]


def get_device():
    """The device string for tests: dormant runs on CUDA."""
    return "xpu" if is_xpu() else "cuda"


def empty_cache():
    import torch
    torch.cuda.empty_cache()


def get_and_print_gpu_memory(message, gpu_id=0):
    """Device memory in use on gpu_id, printed: what the driver reports used
    (torch.cuda.device_memory_used(), as torch_memory_saver reads it), else
    total minus free."""
    import torch
    used_fn = getattr(torch.cuda, "device_memory_used", None)
    used = None
    if used_fn is not None:
        try:
            used = used_fn(gpu_id)
        except Exception:  # noqa: BLE001 (no NVML: fall back)
            used = None
    if used is None:
        free, total = torch.cuda.mem_get_info(gpu_id)
        used = total - free
    print(f"GPU {gpu_id} memory: {used / (1 << 30):.2f} GB ({message})")
    return used
