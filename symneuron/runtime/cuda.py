"""The cuda runtime: NVRTC -> a sealed, cached CUDA binary -> a module launched on
torch's current stream.

Each source is compiled by NVRTC (:mod:`~symneuron.runtime.nvrtc`) to a cubin for the
device's architecture (PTX for the newest architecture NVRTC knows, when it does not
know the device's), cached sealed on disk (:mod:`~symneuron.runtime.cache`) and loaded
with CuPy's driver bindings from the checked bytes: a damaged cached binary is rebuilt,
never loaded. Loaded modules are kept in a bounded table; each kernel gets one launcher
closure (see :func:`launcher`) that the binding caches and that keeps its module alive.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..memo import BoundedTable, constant_result
from ..signature import Geometry
from . import cache, nvrtc

__all__ = ["available", "load", "launcher"]

#: (source hash, device) -> loaded module
_MODULES: BoundedTable[tuple[str, int], Any] = BoundedTable(256, "runtime.cuda.modules")
_OPTIONS = ("-std=c++17",)


def _cupy() -> Any:
    try:
        import cupy
    except ImportError:
        raise RuntimeError(
            "The cuda backend needs CuPy: pip install 'symneuron[cuda]' "
            "(cupy-cuda13x or the cupy build matching your CUDA)."
        ) from None
    return cupy


@constant_result
def available() -> bool:
    """Whether torch sees a CUDA device and CuPy imports."""
    if not torch.cuda.is_available():
        return False
    try:
        _cupy()
    except RuntimeError:
        return False
    return True


def _target(device: int) -> tuple[str, bool]:
    """NVRTC's ``-arch`` option for ``device`` and whether it yields a cubin (else PTX)."""
    major, minor = torch.cuda.get_device_capability(device)
    arch = 10 * major + minor
    known = nvrtc.supported_archs()
    if arch in known:
        return f"-arch=sm_{arch}", True
    below = [a for a in known if a <= arch] or [min(known)]
    return f"-arch=compute_{max(below)}", False


def _compile(source: str, arch: str, cubin: bool) -> bytes:
    options = (arch, *_OPTIONS)
    if cubin:
        return nvrtc.compile_to_cubin(source, "symneuron.cu", options)
    return nvrtc.compile_to_ptx(source, "symneuron.cu", options).encode() + b"\0"


def _module(image: bytes, device: int) -> Any:
    """A CuPy module holding ``image`` (cubin or PTX), loaded on ``device``."""
    cupy = _cupy()
    module = cupy.cuda.function.Module()
    with cupy.cuda.Device(device):
        module.load(image)
    return module


def _load(source: str, device: int) -> Any:
    """The module of ``source``: from the cached binary if its seal checks and it loads,
    else compiled (once), stored and loaded."""
    arch, cubin = _target(device)
    version = ".".join(map(str, nvrtc.nvrtc_version()))
    digest = hashlib.sha256("\0".join((source, arch, *_OPTIONS, version)).encode())
    target = cache.cache_dir() / f"cuda-{digest.hexdigest()[:32]}.cubin"
    image = cache.fetch(target)
    if image is not None:
        try:
            return _module(image, device)
        except Exception as exc:  # CuPy's CUDADriverError: an image the driver rejects
            cache.damaged(target, f"the driver does not load it: {exc}")
    image = _compile(source, arch, cubin)
    cache.store(target, image)
    return _module(image, device)


def load(source: str, device: int) -> Any:
    """The compiled module for ``source`` on ``device`` (compiled once per process)."""
    key = (hashlib.sha256(source.encode()).hexdigest(), device)
    module = _MODULES.get(key)
    if module is None:
        module = _MODULES.put(key, _load(source, device))
    return module


#: CUfunction_attribute: the static shared bytes, the dynamic bytes a launch may ask for
_SHARED_SIZE_BYTES, _MAX_DYNAMIC_SHARED = 1, 8


@functools.cache
def shared_limits(device: int) -> tuple[int, int, int, int]:
    """Device ``device``'s shared-memory bytes a block may opt in to, bytes per SM, SMs,
    and threads per SM."""
    props = _cupy().cuda.runtime.getDeviceProperties(device)
    return (
        props["sharedMemPerBlockOptin"],
        props["sharedMemPerMultiprocessor"],
        props["multiProcessorCount"],
        props["maxThreadsPerMultiProcessor"],
    )


# cuLaunchKernel "extra" keys: CU_LAUNCH_PARAM_END, _BUFFER_POINTER, _BUFFER_SIZE
_PARAM_END, _PARAM_BUFFER, _PARAM_SIZE = 0, 1, 2
_EXTRA = ctypes.c_void_p * 5


def launcher(
    module: Any, name: str, device: int
) -> Callable[[str, Sequence[float], Geometry], None]:
    """``launch(kinds, values, geometry)`` for kernel ``name`` of ``module`` on ``device``.

    Each launch packs the arguments into one buffer (native C alignment, as the
    kernel expects) and hands it to ``cuLaunchKernel`` on torch's current stream:
    no per-argument Python conversion, no host synchronisation, and safe under
    CUDA graph capture.
    """
    from cupy.cuda import driver

    fn = int(module.get_function(name).ptr)
    # dynamic shared memory beyond the default 48 KB, up to what the device allows (the
    # recurrent backward keeps weight rows there); the launch's bytes still decide
    static = driver.funcGetAttribute(_SHARED_SIZE_BYTES, fn)
    driver.funcSetAttribute(fn, _MAX_DYNAMIC_SHARED, shared_limits(device)[0] - static)
    launch_kernel = driver.launchKernel
    raw_stream = torch._C._cuda_getCurrentRawStream
    current_device = torch._C._cuda_getDevice
    pack = struct.pack
    address = ctypes.addressof

    def launch(
        kinds: str, values: Sequence[float], geometry: Geometry, _module: Any = module
    ) -> None:
        if geometry.cooperative and not capturing():
            cooperative(kinds, values, geometry)
            return
        packed = pack("@" + kinds, *values)
        buffer = ctypes.create_string_buffer(packed, len(packed))
        size = ctypes.c_size_t(len(packed))
        extra = _EXTRA(_PARAM_BUFFER, address(buffer), _PARAM_SIZE, address(size), _PARAM_END)
        grid, block, shared = geometry.grid, geometry.block, geometry.shared
        stream = raw_stream(device)
        if device != current_device():
            with torch.cuda.device(device):
                launch_kernel(fn, grid, 1, 1, block, 1, 1, shared, stream, 0, address(extra))
            return
        launch_kernel(fn, grid, 1, 1, block, 1, 1, shared, stream, 0, address(extra))

    capturing = torch.cuda.is_current_stream_capturing

    def cooperative(kinds: str, values: Sequence[float], geometry: Geometry) -> None:
        """``cuLaunchCooperativeKernel``: the driver starts the grid only with every block
        resident (a grid barrier's blocks wait for each other), and it takes the
        arguments as an array of pointers to each value, not one buffer. A stream being
        captured into a CUDA graph takes a plain launch instead (a cooperative launch
        is not captured); its grid is at most one block per SM, which every SM holds
        (``__launch_bounds__(1024)``, shared memory within the SM's), so all its blocks
        are resident unless other kernels run beside the graph's."""
        packed = pack("@" + kinds, *values)
        buffer = ctypes.create_string_buffer(packed, len(packed))
        base = address(buffer)
        params = (ctypes.c_void_p * len(kinds))(*(base + o for o in _offsets(kinds)))
        with torch.cuda.device(device):
            driver.launchCooperativeKernel(
                fn,
                geometry.grid,
                1,
                1,
                geometry.block,
                1,
                1,
                geometry.shared,
                raw_stream(device),
                address(params),
            )

    return launch


@functools.lru_cache(maxsize=64)
def _offsets(kinds: str) -> tuple[int, ...]:
    """The byte offset of each value in a buffer packed as ``struct.pack("@" + kinds)``."""
    return tuple(
        struct.calcsize("@" + kinds[: i + 1]) - struct.calcsize("@" + kinds[i])
        for i in range(len(kinds))
    )
