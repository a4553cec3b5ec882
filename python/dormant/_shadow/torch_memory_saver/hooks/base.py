# SPDX-License-Identifier: MIT
"""torch_memory_saver.hooks.base: the hook mode names."""
try:
    from typing import Literal
    HookMode = Literal["preload", "torch"]
except ImportError:  # pragma: no cover
    HookMode = str
