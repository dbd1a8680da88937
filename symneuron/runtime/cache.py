"""Where symneuron stores what it generates and compiles, and how each entry is keyed.

Everything lives under one root, :func:`cache_dir`: ``$SYMNEURON_CACHE`` if set,
else ``~/.cache/symneuron``.

========================  ==========================================================
``generated/<h>.c|.cu``   generated kernel source of one kernel; ``<h>`` hashes the
                          neuron's key (:meth:`~symneuron.definition.Definition.key`),
                          the backend, the dtype, the kernel name and
                          :func:`generator_version`. A process that finds it never
                          runs SymPy (no derivation, no printing).
``generated/<h>.txt``     small derived facts (whether the backward reads X), keyed
                          the same way.
``cpu-<h>.so``            a compiled C library; ``<h>`` hashes the source and the
                          compiler flags.
CuPy's own cache          compiled CUDA binaries, kept by CuPy under
                          ``$CUPY_CACHE_DIR`` (default ``~/.cupy/kernel_cache``),
                          keyed by CuPy from the source, options and architecture.
========================  ==========================================================

Every file is written to a temporary name and renamed into place, so concurrent
processes never see half a file. The cache is an optimisation only: when the
root cannot be created or written, generated text is made afresh each time.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import sympy as sp

__all__ = ["cache_dir", "generator_version", "generated", "write_atomic"]


def cache_dir() -> Path:
    """The cache root, created if missing: ``$SYMNEURON_CACHE`` or ``~/.cache/symneuron``."""
    root = os.environ.get("SYMNEURON_CACHE") or Path.home() / ".cache" / "symneuron"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.lru_cache(maxsize=1)
def generator_version() -> str:
    """Hash of symneuron's own sources and SymPy's version.

    Either can change the generated code of an unchanged neuron definition, so the
    generated text is keyed by it as well.
    """
    digest = hashlib.sha256(sp.__version__.encode())
    root = Path(__file__).parents[1]
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    if isinstance(data, bytes):
        partial.write_bytes(data)
    else:
        partial.write_text(data)
    os.replace(partial, path)


def generated(parts: tuple[str, ...], suffix: str, make: Callable[[], str]) -> str:
    """Text generated from a neuron, cached under ``cache_dir()/generated``.

    ``parts`` identify it (with :func:`generator_version`); ``make`` produces it on a
    miss. When the directory cannot be read or written, it is bypassed.
    """
    name = hashlib.sha256("\0".join((generator_version(), *parts)).encode()).hexdigest()[:32]
    try:
        path = cache_dir() / "generated" / f"{name}{suffix}"
    except OSError:
        return make()
    try:
        return path.read_text()
    except OSError:
        pass
    text = make()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, text)
    except OSError:
        pass
    return text
