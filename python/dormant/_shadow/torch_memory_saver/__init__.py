# SPDX-License-Identifier: MIT
"""dormant's stand-in for the torch_memory_saver package.

On the import path only when a program is started with
`python3 -m dormant.run --torch-memory-saver -- CMD ...` (which puts
dormant/_shadow first on PYTHONPATH): `import torch_memory_saver` then gives
dormant.torch_memory_saver, with the submodules programs import. Without that
switch this folder is not on the path and shadows nothing.
"""
from dormant.torch_memory_saver import TorchMemorySaver, configure_subprocess, torch_memory_saver

__dormant__ = True  # how a program (or a test) tells this package from the real one

__all__ = ["TorchMemorySaver", "configure_subprocess", "torch_memory_saver"]
