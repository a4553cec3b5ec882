# SPDX-License-Identifier: MIT
"""torch_memory_saver.hooks.mode_torch, on dormant."""
from torch_memory_saver.hooks.base import HookUtilBase
from torch_memory_saver.utils import get_binary_path_from_package


class HookUtilModeTorch(HookUtilBase, hook_mode="torch"):
    """The library of hook mode "torch" (dormant's, whose tms_torch_malloc
    and tms_torch_free serve torch.cuda.memory.CUDAPluggableAllocator)."""

    def get_path_binary(self):
        return str(get_binary_path_from_package("torch_memory_saver_hook_mode_torch"))

    def get_allocator(self):
        from torch.cuda.memory import CUDAPluggableAllocator
        return CUDAPluggableAllocator(self.get_path_binary(), "tms_torch_malloc",
                                      "tms_torch_free").allocator()
