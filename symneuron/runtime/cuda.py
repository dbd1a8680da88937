"""The cuda runtime: CuPy RawModule (NVRTC), launched on torch's current stream.

CuPy caches compiled modules on disk (keyed by the source); this module keeps
loaded modules in memory, and each kernel gets one launcher closure (see
:func:`launcher`) that the binding caches.
"""

from __future__ import annotations

import ctypes
import hashlib
import struct
from collections.abc import Callable
from typing import Any

import torch

from . import Packed, settings

__all__ = ["available", "load", "launcher"]

_MODULES: dict[tuple[str, int], Any] = {}


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


def launcher(module: Any, name: str, device: int) -> Callable[[list[Packed], int], None]:
    """``launch(args, threads)`` for kernel ``name`` of ``module`` on ``device``.

    Each launch packs the arguments into one buffer (native C alignment, as the
    kernel expects) and hands it to ``cuLaunchKernel`` on torch's current stream:
    no per-argument Python conversion, no host synchronisation, and safe under
    CUDA graph capture.
    """
    from cupy.cuda import driver

    fn = int(module.get_function(name).kernel.ptr)
    launch_kernel = driver.launchKernel
    raw_stream = torch._C._cuda_getCurrentRawStream
    current_device = torch._C._cuda_getDevice
    pack = struct.pack
    address = ctypes.addressof
    formats: dict[tuple[str, ...], str] = {}

    def launch(args: list[Packed], threads: int) -> None:
        kinds, values = zip(*args, strict=True)
        fmt = formats.get(kinds)
        if fmt is None:
            fmt = formats[kinds] = "@" + "".join(kinds)
        packed = pack(fmt, *values)
        buffer = ctypes.create_string_buffer(packed, len(packed))
        size = ctypes.c_size_t(len(packed))
        extra = _EXTRA(_PARAM_BUFFER, address(buffer), _PARAM_SIZE, address(size), _PARAM_END)
        block = settings.cuda_block
        grid = (threads + block - 1) // block
        stream = raw_stream(device)
        if device != current_device():
            with torch.cuda.device(device):
                launch_kernel(fn, grid, 1, 1, block, 1, 1, 0, stream, 0, address(extra))
            return
        launch_kernel(fn, grid, 1, 1, block, 1, 1, 0, stream, 0, address(extra))

    return launch
