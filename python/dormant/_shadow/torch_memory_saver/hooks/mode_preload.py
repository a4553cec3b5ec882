# SPDX-License-Identifier: MIT
"""torch_memory_saver.hooks.mode_preload, on dormant."""
from dormant.torch_memory_saver import configure_subprocess

__all__ = ["configure_subprocess"]
