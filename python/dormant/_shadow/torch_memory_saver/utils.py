# SPDX-License-Identifier: MIT
"""torch_memory_saver.utils: the helpers programs import from it."""
import contextlib
import os
import pathlib

_SUPPORTED_CUDA_MAJORS = (13, 12)


def is_xpu():
    """dormant runs on CUDA only: never an Intel XPU."""
    return False


def _detect_cuda_major():
    """The CUDA major the process's torch was built for (12 when unknown)."""
    try:
        import torch
        version = getattr(torch.version, "cuda", None)
        if version:
            return int(str(version).split(".", 1)[0])
    except (ImportError, ValueError, AttributeError):
        pass
    return 12


def get_binary_path_from_package(stem):
    """The library file of stem ("torch_memory_saver_hook_mode_preload" or
    "..._torch"): dormant's libdormant-preload.so, under torch_memory_saver's
    file name (<stem>_cu<major>.abi3.so) where this package sits beside one,
    else the library itself. RuntimeError for another stem, or when the
    library cannot be found."""
    if stem not in ("torch_memory_saver_hook_mode_preload", "torch_memory_saver_hook_mode_torch"):
        raise RuntimeError(f"torch_memory_saver (dormant): no library {stem!r}; dormant ships "
                           f"torch_memory_saver_hook_mode_preload and _torch")
    here = pathlib.Path(__file__).parent
    major = _detect_cuda_major()
    for folder in (here, here.parent):
        for name in (f"{stem}_cu{major}.abi3.so", f"{stem}.abi3.so"):
            if (folder / name).exists():
                return folder / name
    from dormant import preload
    try:
        return pathlib.Path(preload.library_path())
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"torch_memory_saver (dormant): {e}") from e


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
