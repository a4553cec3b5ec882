# SPDX-License-Identifier: MIT
"""torch_memory_saver.testing_utils: the helpers its examples import."""


def get_device():
    return "cuda"


def empty_cache():
    import torch
    torch.cuda.empty_cache()


def get_and_print_gpu_memory(message, gpu_id=0):
    """Device memory in use (total minus free, as cuMemGetInfo says), printed."""
    import torch
    free, total = torch.cuda.mem_get_info(gpu_id)
    used = total - free
    print(f"GPU {gpu_id} memory: {used / (1 << 30):.2f} GB ({message})")
    return used
