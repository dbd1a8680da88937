"""The cuda runtime: CuPy RawModule (NVRTC), launched on torch's current stream.

CuPy caches compiled modules on disk (keyed by the source); this module keeps
loaded functions in memory, so a launch costs one dictionary look-up.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from . import Arg

__all__ = ["available", "load", "launch", "BLOCK"]

BLOCK = 256
_MODULES: dict[tuple[str, int], Any] = {}
_FUNCTIONS: dict[tuple[int, str], Any] = {}
_STREAMS: dict[tuple[int, int], Any] = {}


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


def _value(arg: Arg) -> Any:
    import numpy as np

    return np.int32(arg.value) if arg.kind == "i32" else arg.value


def launch(module: Any, name: str, args: list[Arg], n: int) -> None:
    """Launch kernel ``name`` with ``n`` threads on torch's current stream."""
    cupy = _cupy()
    fkey = (id(module), name)
    fn = _FUNCTIONS.get(fkey)
    if fn is None:
        fn = _FUNCTIONS[fkey] = module.get_function(name)
    stream = torch.cuda.current_stream()
    device = stream.device.index
    skey = (stream.cuda_stream, device)
    cstream = _STREAMS.get(skey)
    if cstream is None:
        cstream = _STREAMS[skey] = cupy.cuda.ExternalStream(stream.cuda_stream, device)
    with cupy.cuda.Device(device):
        grid = ((n + BLOCK - 1) // BLOCK,)
        fn(grid, (BLOCK,), tuple(_value(a) for a in args), stream=cstream)
