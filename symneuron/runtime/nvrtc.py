"""CUDA C source -> PTX with NVRTC; needs no GPU and no driver.

This uses CuPy's low-level NVRTC bindings (``cupy_backends.cuda.libs.nvrtc``)
and not ``cupy.cuda.compiler.compile_using_nvrtc``: the latter asks the current
device for its architecture and fails without a driver. CuPy finds
``libnvrtc.so.13`` through ``cuda-pathfinder``, which looks in the
``nvidia-cuda-nvrtc`` wheel under site-packages; no path hint or preload is
needed.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = [
    "DEFAULT_OPTIONS",
    "NvrtcCompileError",
    "compile_to_cubin",
    "compile_to_ptx",
    "nvrtc_available",
    "nvrtc_version",
    "supported_archs",
]

DEFAULT_OPTIONS: tuple[str, ...] = ("-arch=compute_90", "-std=c++17")

_INSTALL_HINT = "install `symneuron[cuda]` (pip install cupy-cuda13x nvidia-cuda-nvrtc)"


class NvrtcCompileError(ValueError):
    """NVRTC rejected the source; ``log`` holds NVRTC's program log."""

    def __init__(self, name: str, status: str, log: str) -> None:
        super().__init__(f"NVRTC failed to compile {name} ({status}):\n{log}")
        self.log = log


def _bindings() -> ModuleType:
    """Return CuPy's NVRTC bindings after checking that libnvrtc loads.

    Raises
    ------
    RuntimeError
        If CuPy is not installed or the NVRTC shared library cannot be found.
    """
    try:
        nvrtc = importlib.import_module("cupy_backends.cuda.libs.nvrtc")
    except ImportError as exc:
        raise RuntimeError(f"NVRTC bindings missing (no cupy-cuda13x): {_INSTALL_HINT}") from exc
    try:
        nvrtc.getVersion()
    except RuntimeError as exc:
        raise RuntimeError(
            f"libnvrtc not found (no nvidia-cuda-nvrtc): {_INSTALL_HINT}; {exc}"
        ) from exc
    return nvrtc


def nvrtc_available() -> bool:
    """Tell whether NVRTC can be used here.

    Returns
    -------
    bool
        True if CuPy's bindings import and libnvrtc loads; a GPU is not needed.
    """
    try:
        _bindings()
    except RuntimeError:
        return False
    return True


def nvrtc_version() -> tuple[int, int]:
    """Return NVRTC's ``(major, minor)`` version, for example ``(13, 0)``.

    Part of what a compile cache key should hold next to the source and options.

    Raises
    ------
    RuntimeError
        If NVRTC is unavailable.
    """
    major, minor = _bindings().getVersion()
    return int(major), int(minor)


def supported_archs() -> tuple[int, ...]:
    """The real architectures NVRTC can build cubins for, e.g. ``(75, 80, ..., 90, 100)``.

    Raises
    ------
    RuntimeError
        If NVRTC is unavailable.
    """
    return tuple(int(a) for a in _bindings().getSupportedArchs())


def compile_to_cubin(
    source: str, name: str = "kernel.cu", options: tuple[str, ...] = ("-arch=sm_90",)
) -> bytes:
    """Compile CUDA C source to a cubin (machine code for one real architecture).

    As :func:`compile_to_ptx`, but ``options`` must name a real architecture
    (``-arch=sm_XX``, one of :func:`supported_archs`); no device is needed.

    Raises
    ------
    RuntimeError
        If NVRTC is unavailable.
    NvrtcCompileError
        If compilation fails.
    """
    return bytes(_output(source, name, options, "getCUBIN"))


def compile_to_ptx(
    source: str,
    name: str = "kernel.cu",
    options: tuple[str, ...] = DEFAULT_OPTIONS,
) -> str:
    """Compile CUDA C source to PTX text.

    Parameters
    ----------
    source
        CUDA C++ source. No CUDA headers are on the include path, so kernels use
        plain C types and inline PTX (``asm``) instead of ``cuda_fp16.h``.
    name
        File name NVRTC uses in its messages.
    options
        NVRTC options; a virtual ``-arch=compute_XX`` target needs no device.

    Returns
    -------
    str
        The PTX module, with one ``.entry`` per ``__global__`` function.

    Raises
    ------
    RuntimeError
        If NVRTC is unavailable; the message names the packages to install.
    NvrtcCompileError
        A ``ValueError`` carrying NVRTC's log, if compilation fails.

    Examples
    --------
    >>> ptx = compile_to_ptx('extern "C" __global__ void k(float* y) { y[0] = 1.0f; }')
    >>> ".entry k" in ptx
    True
    """
    return bytes(_output(source, name, options, "getPTX")).decode().rstrip("\0")


def _output(source: str, name: str, options: tuple[str, ...], getter: str) -> bytes:
    """Compile ``source`` and return NVRTC's ``getter`` output (``getPTX``, ``getCUBIN``)."""
    nvrtc = _bindings()
    program = nvrtc.createProgram(source, name, [], [])
    try:
        _compile(nvrtc, program, name, options)
        out: bytes = getattr(nvrtc, getter)(program)
    finally:
        nvrtc.destroyProgram(program)
    return out


def _compile(nvrtc: ModuleType, program: int, name: str, options: tuple[str, ...]) -> None:
    """Run ``nvrtcCompileProgram``; turn a failure into :class:`NvrtcCompileError`."""
    try:
        nvrtc.compileProgram(program, list(options))
    except nvrtc.NVRTCError as exc:
        raise NvrtcCompileError(name, str(exc), nvrtc.getProgramLog(program)) from exc
