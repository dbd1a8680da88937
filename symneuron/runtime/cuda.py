"""The cuda runtime: CuPy RawModule (NVRTC), launched on torch's current stream.

CuPy caches compiled modules on disk (keyed by the source); this module keeps
loaded functions in memory, so a launch costs one dictionary look-up.
"""

from __future__ import annotations

import ctypes
import hashlib
import struct
from typing import Any

import torch

from . import Arg

__all__ = ["available", "load", "launch", "BLOCK"]

BLOCK = 256
_MODULES: dict[tuple[str, int], Any] = {}
_FUNCTIONS: dict[tuple[int, str], int] = {}


def _cupy() -> Any:
    try:
        import cupy
    except ImportError:
        raise RuntimeError(
            "The cuda backend needs CuPy: pip install 'symneuron[cuda]' "
            "(cupy-cuda13x or the cupy build matching your CUDA)."
        ) from None
    return cupy


@torch.compiler.assume_constant_result
def available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        _cupy()
    except RuntimeError:
        return False
    return True


def load(source: str, device: int) -> Any:
    """The compiled module for ``source`` on ``device`` (compiled once per process)."""
    key = (hashlib.sha256(source.encode()).hexdigest(), device)
    if key not in _MODULES:
        cupy = _cupy()
        with cupy.cuda.Device(device):
            module = cupy.RawModule(code=source, options=("-std=c++17",))
            module.compile()
        _MODULES[key] = module
    return _MODULES[key]


# cuLaunchKernel "extra" keys: CU_LAUNCH_PARAM_END, _BUFFER_POINTER, _BUFFER_SIZE
_PARAM_END, _PARAM_BUFFER, _PARAM_SIZE = 0, 1, 2
_EXTRA = ctypes.c_void_p * 5


def _function(module: Any, name: str) -> int:
    """The CUfunction handle of kernel ``name`` (looked up once)."""
    fkey = (id(module), name)
    handle = _FUNCTIONS.get(fkey)
    if handle is None:
        handle = _FUNCTIONS[fkey] = int(module.get_function(name).kernel.ptr)
    return handle


def launch(module: Any, name: str, args: list[Arg], threads: int, device: int) -> None:
    """Launch kernel ``name`` with ``threads`` threads on torch's current stream.

    The arguments are packed into one buffer (native C alignment, as the kernel
    expects) and handed to ``cuLaunchKernel`` directly: no per-argument Python
    conversion, no host synchronisation, and safe under CUDA graph capture.
    """
    from cupy.cuda import driver

    fn = _function(module, name)
    kinds, values = zip(*args, strict=True)
    packed = struct.pack("@" + "".join(kinds), *values)
    buffer = ctypes.create_string_buffer(packed, len(packed))
    size = ctypes.c_size_t(len(packed))
    extra = _EXTRA(
        _PARAM_BUFFER, ctypes.addressof(buffer), _PARAM_SIZE, ctypes.addressof(size), _PARAM_END
    )
    grid = (threads + BLOCK - 1) // BLOCK
    stream = torch._C._cuda_getCurrentRawStream(device)
    if device != torch._C._cuda_getDevice():
        with torch.cuda.device(device):
            driver.launchKernel(fn, grid, 1, 1, BLOCK, 1, 1, 0, stream, 0, ctypes.addressof(extra))
        return
    driver.launchKernel(fn, grid, 1, 1, BLOCK, 1, 1, 0, stream, 0, ctypes.addressof(extra))
