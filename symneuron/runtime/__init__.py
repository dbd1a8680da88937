"""Runtimes: generated source -> compiled kernels -> launches on torch tensors.

Each runtime compiles one source per (spec, dtype), caches it in memory and on
disk keyed by the source hash, and launches a named kernel with a flat list of
:class:`Arg` values packed here, the same for every backend.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["Arg", "ptr", "address", "i64", "i32", "cache_dir"]


#: One kernel argument: (struct format character, value). "P" a device pointer,
#: "q" a ``long long``, "i" an ``int``. A plain tuple, since launches build a dozen
#: of them per call and tuple creation is the cheapest Python can do.
Arg = tuple[str, int]


def ptr(tensor: torch.Tensor | None) -> Arg:
    return ("P", 0 if tensor is None else tensor.data_ptr())


def address(value: int) -> Arg:
    """A device pointer given as a raw address (e.g. one row of a tensor)."""
    return ("P", int(value))


def i64(value: int) -> Arg:
    return ("q", int(value))


def i32(value: int) -> Arg:
    return ("i", int(value))


def cache_dir() -> Path:
    """On-disk kernel cache: ``$SYMNEURON_CACHE`` or ``~/.cache/symneuron``."""
    root = os.environ.get("SYMNEURON_CACHE") or Path.home() / ".cache" / "symneuron"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path
