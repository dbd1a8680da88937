"""Parameters as the kernels read them: one value per neuron, or one for all.

A parameter given as a float becomes a 0-dim tensor (kept in a bounded table, so a
call makes none); a tensor broadcastable to the neuron shape becomes an [N] view.
The kernels take each parameter's address and stride (0 for a single value).

A CUDA graph captured around a launch keeps the addresses it read. A scalar that a
capture used is therefore pinned for the life of the process (:data:`_PINNED`): the
bounded table may forget it, but its memory is never freed and reused under a graph.
"""

from __future__ import annotations

from typing import Any

import torch

from . import dtypes
from .memo import BoundedTable

__all__ = ["compute_dtype", "kernel_param", "launch_param", "grad_shape"]

#: (backend, dtype) -> the dtype the kernels compute in (a dict lookup, not a str())
_COMPUTE: BoundedTable[tuple[str, torch.dtype], torch.dtype] = BoundedTable(64, "params.compute")
#: (value, dtype, device) -> a 0-dim tensor holding the value (read-only)
_SCALARS: BoundedTable[tuple[float, torch.dtype, torch.device], torch.Tensor] = BoundedTable(
    1024, "params.scalars"
)
#: every scalar tensor a CUDA graph capture read: kept alive, never reused
_PINNED: dict[tuple[float, torch.dtype, torch.device], torch.Tensor] = {}


def compute_dtype(backend: str, dtype: torch.dtype) -> torch.dtype:
    """The torch dtype ``backend``'s kernels compute in for inputs of ``dtype`` (cached)."""
    found = _COMPUTE.get((backend, dtype))
    if found is None:
        found = dtypes.lookup(backend, dtype).torch_compute
        if not torch.compiler.is_compiling():
            _COMPUTE.put((backend, dtype), found)
    return found


def _scalar(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 0-dim tensor holding ``value``: cached, pinned under capture (called outside
    compilation: :func:`kernel_param` makes its own)."""
    key = (value, dtype, device)
    tensor = _SCALARS.get(key)
    if tensor is not None and not tensor.is_cuda:  # (no capture to pin for: host time)
        return tensor
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if tensor is None:
        if capturing:  # no allocation of our own inside a capture: the graph's pool
            tensor = _PINNED.get(key)
            if tensor is None:
                tensor = _PINNED[key] = torch.full((), value, dtype=dtype, device=device)
            return tensor
        tensor = _SCALARS.put(key, torch.full((), value, dtype=dtype, device=device))
    if capturing:
        _PINNED.setdefault(key, tensor)
    return tensor


def kernel_param(
    value: float | torch.Tensor,
    dtype: torch.dtype,
    device: torch.device,
    shape: tuple[int, ...],
    n: int,
) -> torch.Tensor:
    """A param (float, or tensor broadcastable to ``shape``) as an [n] tensor in
    ``dtype`` (stride 0 when scalar), ``n`` the number of neurons in ``shape``:
    :func:`launch_param`'s value, a single one expanded to [n]; also under
    ``torch.compile``, where a float becomes a new tensor of the graph."""
    if torch.compiler.is_compiling() and not isinstance(value, torch.Tensor):
        return torch.full((), value, dtype=dtype, device=device).expand(n)
    out = launch_param(value, dtype, device, shape, n)
    return out.expand(n) if out.dim() == 0 else out


def launch_param(
    value: float | torch.Tensor,
    dtype: torch.dtype,
    device: torch.device,
    shape: tuple[int, ...],
    n: int,
) -> torch.Tensor:
    """A param as the kernels read it: a 0-dim tensor for one value (stride 0, no view
    made when it already is one in ``dtype``), else as :func:`kernel_param`. The
    launches take only each param's address and stride. Outside compilation only (a
    float's tensor is a cached one)."""
    if not isinstance(value, torch.Tensor):
        return _scalar(value, dtype, device)
    if value.dtype != dtype:
        value = value.to(dtype)
    if value.dim() == 0:
        return value
    if value.numel() == 1:
        return value.reshape(())
    return value.expand(shape).reshape(n)


def grad_shape(value: Any, shape: tuple[int, ...], n: int) -> tuple[int, ...] | None:
    """The shape the eager binding gives a param's [n] gradient so that autograd's
    reduction to the param's own shape sums it as :func:`kernel_param`'s views would
    (None for a float)."""
    if not isinstance(value, torch.Tensor):
        return None
    if value.numel() == 1:
        return (1,) * (value.dim() - 1) + (n,) if value.dim() else (n,)
    return shape
