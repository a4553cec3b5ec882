# SPDX-License-Identifier: MIT
"""torch_memory_saver.binary_wrapper, on dormant: BinaryWrapper(path).cdll is
the library at path with torch_memory_saver's C signatures set (dormant's
libdormant-preload.so implements them: preload/tms.c)."""
from dormant.torch_memory_saver import _BinaryWrapper as BinaryWrapper

__all__ = ["BinaryWrapper"]
