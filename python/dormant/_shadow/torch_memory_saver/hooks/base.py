# SPDX-License-Identifier: MIT
"""torch_memory_saver.hooks.base: the hook mode names and HookUtilBase."""
try:
    from typing import Literal
    HookMode = Literal["preload", "torch"]
except ImportError:  # pragma: no cover
    HookMode = str


class HookUtilBase:
    """Which library a hook mode loads (get_path_binary()) and, for "torch",
    its pluggable allocator."""

    @staticmethod
    def create(hook_mode):
        if hook_mode == "preload":
            from torch_memory_saver.hooks.mode_preload import HookUtilModePreload
            return HookUtilModePreload()
        if hook_mode == "torch":
            from torch_memory_saver.hooks.mode_torch import HookUtilModeTorch
            return HookUtilModeTorch()
        raise KeyError(hook_mode)

    def get_path_binary(self):
        raise NotImplementedError

    def get_allocator(self):
        return None
