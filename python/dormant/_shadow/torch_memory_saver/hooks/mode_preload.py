# SPDX-License-Identifier: MIT
"""torch_memory_saver.hooks.mode_preload, on dormant."""
from dormant.torch_memory_saver import configure_subprocess
from torch_memory_saver.hooks.base import HookUtilBase
from torch_memory_saver.utils import get_binary_path_from_package

__all__ = ["configure_subprocess", "HookUtilModePreload"]


class HookUtilModePreload(HookUtilBase, hook_mode="preload"):
    """The library of hook mode "preload": dormant's capture shim."""

    def get_path_binary(self):
        return str(get_binary_path_from_package("torch_memory_saver_hook_mode_preload"))
