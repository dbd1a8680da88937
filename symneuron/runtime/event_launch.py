"""How the EventProp kernels are launched: their values packed in argument order, and a
CUDA launch run in waves whose scratch fits a budget.

A feedforward layer's or a readout's kernel runs one thread per (sample, neuron) row,
:data:`BLOCK` a block (a warp a block where a launch has too few rows to give every
multiprocessor :data:`BLOCK` of them: a thread's events run one after another, so a
small launch is spread over as many multiprocessors as it can), each row with its slab
of one scratch buffer of at most :data:`SCRATCH` bytes: more rows run in waves. A
recurrent layer's kernel runs a block a sample, a thread a neuron up to
:data:`SAMPLE_BLOCK`, each sample's slab holding all its neurons' lists, in waves within
:data:`SAMPLE_SCRATCH` (and a part of the GPU's memory).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import torch

from ..codegen.events import KernelArg
from ..signature import Geometry

__all__ = [
    "Values",
    "SCRATCH",
    "SAMPLE_SCRATCH",
    "SAMPLE_SHARE",
    "BLOCK",
    "SAMPLE_BLOCK",
    "packed",
    "kinds",
    "in_waves",
]

#: a launch's values by argument name
Values = dict[str, torch.Tensor | float | None]
#: the bytes of scratch one CUDA launch may take (its rows' slabs; more rows run in waves)
SCRATCH = 256 << 20
#: the bytes of scratch one launch of a recurrent layer's kernels may take, at most, and
#: at most this part of the GPU's memory (a sample's neurons run together, so each
#: sample's slab holds all their lists: 256 MiB ran an SHD-sized layer's samples in waves
#: of a few blocks, 1 GiB in two to four waves)
SAMPLE_SCRATCH, SAMPLE_SHARE = 4 << 30, 8
#: threads per block of a CUDA launch (one per (sample, neuron) row)
BLOCK = 128
#: threads per block of a recurrent layer's launch (a block a sample, a thread a neuron
#: up to this many, then several neurons a thread)
SAMPLE_BLOCK = 256


@functools.cache
def _plan(args: tuple[KernelArg, ...]) -> tuple[tuple[str, str], ...]:
    """Each argument's name and kind (P: a pointer, d: a double, q: an integer), worked
    out once per kernel (read again from the 50-odd C types at every launch, they took
    about a sixth of a small network's host time a step)."""
    return tuple((a.name, "P" if a.pointer else "d" if a.ctype == "double" else "q") for a in args)


def packed(
    args: tuple[KernelArg, ...], values: Mapping[str, torch.Tensor | float | None]
) -> list[int | float]:
    """The launch's values in the kernel's argument order: tensors as addresses (None as
    a null pointer), doubles as floats, the rest as ints."""
    out: list[int | float] = []
    for name, kind in _plan(args):
        value = values[name]
        if kind == "P":
            assert value is None or (isinstance(value, torch.Tensor) and value.is_contiguous())
            out.append(0 if value is None else value.data_ptr())
        else:
            assert isinstance(value, float if kind == "d" else int), name
            out.append(value)
    return out


@functools.cache
def kinds(args: tuple[KernelArg, ...]) -> str:
    """The arguments' kinds as the runtimes' launchers take them: P, d, q."""
    return "".join(kind for _, kind in _plan(args))


def in_waves(
    launch: Callable[[str, list[int | float], Geometry], object],
    args: tuple[KernelArg, ...],
    values: Values,
    slab: int,
    total: int,
    device: torch.device,
    samples: bool,
) -> None:
    """``launch`` (a CUDA kernel of ``args``) over ``total`` units, rows or (``samples``)
    samples, each with ``slab`` bytes of one scratch buffer, in waves whose slabs fit the
    budget; ``values`` gains the buffer and each wave's first unit and count."""
    budget = _sample_budget(device) if samples else SCRATCH
    wave = max(1, min(total, budget // slab)) if slab else max(1, total)
    # (every kernel writes its scratch before it reads it: no zeroing launch)
    scratch = torch.empty(wave * slab, dtype=torch.uint8, device=device) if slab else None
    values["scratch"] = scratch
    n = values["N"]
    assert isinstance(n, int)
    for row0 in range(0, total, wave):
        rows = min(wave, total - row0)
        values.update({"row0": row0, "rows": rows})
        if samples:
            geometry = Geometry(rows, min(SAMPLE_BLOCK, -(-n // 32) * 32))
        else:
            block = BLOCK if rows >= BLOCK * _multiprocessors(device) else 32
            geometry = Geometry(-(-rows // block), block)
        launch(kinds(args), packed(args, values), geometry)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _sample_budget(device: torch.device) -> int:
    return min(SAMPLE_SCRATCH, _memory(device) // SAMPLE_SHARE)


@functools.cache
def _memory(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).total_memory
