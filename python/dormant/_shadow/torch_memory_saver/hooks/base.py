# SPDX-License-Identifier: MIT
"""torch_memory_saver.hooks.base: the hook mode names and HookUtilBase."""
import importlib

try:
    from typing import Literal
    HookMode = Literal["preload", "torch"]
except ImportError:  # pragma: no cover
    HookMode = str


class HookUtilBase:
    """Which library a hook mode loads (get_path_binary()) and, for "torch",
    its pluggable allocator. Each mode's class says its mode where it is
    defined (class HookUtilModeTorch(HookUtilBase, hook_mode="torch")), so
    that this module imports none of them: create() loads the mode's module
    by name and takes the class it registered."""

    _by_mode = {}

    def __init_subclass__(cls, hook_mode=None, **kwargs):
        super().__init_subclass__(**kwargs)
        if hook_mode is not None:
            HookUtilBase._by_mode[hook_mode] = cls

    @staticmethod
    def create(hook_mode):
        if hook_mode not in ("preload", "torch"):
            raise KeyError(hook_mode)
        importlib.import_module("torch_memory_saver.hooks.mode_" + hook_mode)
        return HookUtilBase._by_mode[hook_mode]()

    def get_path_binary(self):
        raise NotImplementedError

    def get_allocator(self):
        return None
