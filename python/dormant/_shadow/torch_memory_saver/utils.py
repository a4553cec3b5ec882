# SPDX-License-Identifier: MIT
"""torch_memory_saver.utils: the helpers programs import from it."""
import contextlib
import os


def is_xpu():
    """dormant runs on CUDA only."""
    return False


@contextlib.contextmanager
def change_env(key, value):
    """Set os.environ[key] for the duration; restore (or remove) it after."""
    had = key in os.environ
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if had:
            os.environ[key] = old
        else:
            os.environ.pop(key, None)
