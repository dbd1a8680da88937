"""The cpu runtime: the system C compiler -> shared library -> ctypes."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

import torch

from . import Packed
from .cache import cache_dir

__all__ = ["compiler", "available", "load", "launcher"]

_BASE_FLAGS = ("-O3", "-std=c99", "-shared", "-fPIC", "-fno-fast-math")
_CTYPES = {"P": ctypes.c_void_p, "q": ctypes.c_longlong, "i": ctypes.c_int}
_LIBRARIES: dict[str, ctypes.CDLL] = {}


@lru_cache(maxsize=1)
def compiler() -> str | None:
    """Path of the C compiler (``$CC``, else cc, gcc or clang), or None."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@torch.compiler.assume_constant_result
def available() -> bool:
    return compiler() is not None


@lru_cache(maxsize=1)
def _flags() -> tuple[str, ...]:
    """Base flags plus OpenMP when the compiler supports it."""
    probe = "int main(void) { return 0; }\n"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text(probe)
        cmd = [str(compiler()), "-fopenmp", str(src), "-o", str(Path(tmp) / "probe")]
        ok = subprocess.run(cmd, capture_output=True).returncode == 0
    return _BASE_FLAGS + (("-fopenmp",) if ok else ())


def _build(source: str, target: Path) -> None:
    cc = compiler()
    if cc is None:
        raise RuntimeError(
            "The cpu backend needs a C compiler (cc, gcc or clang; or set $CC). "
            "Install one, or use backend='torch'."
        )
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / "kernel.c"
        src.write_text(source)
        out = Path(tmp) / target.name
        proc = subprocess.run(
            [cc, *_flags(), str(src), "-o", str(out), "-lm"], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise RuntimeError(f"C compilation of generated kernels failed:\n{proc.stderr}")
        os.replace(out, target)


def load(source: str, device: int = -1) -> ctypes.CDLL:
    """Compile ``source`` (cached in memory and on disk by its hash) and load it.
    ``device`` is unused (the signature is shared with the cuda runtime)."""
    key = hashlib.sha256((source + repr(_flags())).encode()).hexdigest()[:24]
    if key not in _LIBRARIES:
        target = cache_dir() / f"cpu-{key}.so"
        if not target.exists():
            _build(source, target)
        _LIBRARIES[key] = ctypes.CDLL(str(target))
    return _LIBRARIES[key]


Launch = Callable[[list[Packed], int], None]


def launcher(library: ctypes.CDLL, name: str, device: int = -1) -> Launch:
    """``launch(args, n)`` for kernel ``name`` (the neuron count ``n`` is among the args)."""
    fn = getattr(library, name)
    fn.restype = None

    def launch(args: list[Packed], n: int) -> None:
        argtypes = tuple(_CTYPES[kind] for kind, _ in args)
        if fn.argtypes != argtypes:
            fn.argtypes = argtypes
        fn(*[value for _, value in args])

    return launch
