# SPDX-License-Identifier: MIT
"""torch_memory_saver.entrypoint, on dormant."""
from dormant.torch_memory_saver import TorchMemorySaver

__all__ = ["TorchMemorySaver"]
