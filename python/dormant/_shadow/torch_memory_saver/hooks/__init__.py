# SPDX-License-Identifier: MIT
"""torch_memory_saver.hooks, on dormant."""
