"""Runtimes: generated source -> compiled kernels -> launches on torch tensors.

Each runtime compiles one source per (spec, dtype), caches it in memory and on
disk keyed by the source hash, and launches a named kernel with a flat list of
:class:`Arg` values packed here, the same for every backend.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["Arg", "ptr", "i64", "i32", "cache_dir"]


@dataclass(frozen=True)
class Arg:
    """One kernel argument: a device pointer (``ptr``), ``long long`` or ``int``."""

    kind: str
    value: int


def ptr(tensor: torch.Tensor | None) -> Arg:
    return Arg("ptr", 0 if tensor is None else tensor.data_ptr())


def i64(value: int) -> Arg:
    return Arg("i64", int(value))


def i32(value: int) -> Arg:
    return Arg("i32", int(value))


def cache_dir() -> Path:
    """On-disk kernel cache: ``$SYMNEURON_CACHE`` or ``~/.cache/symneuron``."""
    root = os.environ.get("SYMNEURON_CACHE") or Path.home() / ".cache" / "symneuron"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path
