"""The one dtype table: how each torch dtype is stored, computed and accumulated.

Every stage reads its dtype facts from here: code generation (C types and the
16-bit conversions), the runtime (lanes per thread, gradient accumulators) and
``simulate`` (which dtypes a backend takes). A row is keyed by backend and
dtype name (``"float32"``, ``"bfloat16"``, ...).

16-bit types are stored as ``unsigned short`` on CUDA and converted with PTX
``cvt`` instructions (``sn_h2f``/``sn_f2h``, ``sn_b2f``/``sn_f2b``, defined in
the CUDA prelude), so NVRTC needs no ``cuda_fp16.h``. Arithmetic on them is in
float; parameters are float tensors; learnable-parameter gradients accumulate in
float (double for float64).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .memo import BoundedTable

__all__ = ["DType", "DTYPES", "dtype_name", "lookup", "supported"]


@dataclass(frozen=True)
class DType:
    """One storage dtype on one backend.

    Attributes
    ----------
    name : torch's name without the ``torch.`` prefix.
    storage, compute, accum : C types of stored tensors, of arithmetic, of
        learnable-parameter gradient accumulators.
    load, store : C format strings converting storage -> compute and back.
    lanes : neurons per thread (CUDA) or per loop iteration (C) in the wide kernel
        variant (1: no wide variant).
    fast_draws : whether the kernels draw normals by the fast conversion
        (:func:`symneuron.rng.convert.box_muller_fast`: within 4e-6 of the exact normals
        where they are at least 0.01 in size, not bit for bit); the 16-bit CUDA rows,
        whose stored values round far coarser.
    torch_dtype, torch_compute, torch_accum : the torch dtypes of the same three roles.
    """

    name: str
    storage: str
    compute: str
    accum: str
    torch_dtype: torch.dtype
    torch_compute: torch.dtype
    torch_accum: torch.dtype
    load: str = "{}"
    store: str = "{}"
    lanes: int = 1
    fast_draws: bool = False

    def rounded(self, value: str) -> str:
        """C text of ``value`` rounded to the storage type and back (identity for float/double)."""
        if self.load == "{}" and self.store == "{}":
            return value
        return self.load.format(self.store.format(value))


_F32 = DType("float32", "float", "float", "float", torch.float32, torch.float32, torch.float32)
_F64 = DType("float64", "double", "double", "double", torch.float64, torch.float64, torch.float64)


def _half(name: str, dtype: torch.dtype, load: str, store: str) -> DType:
    return DType(
        name,
        "unsigned short",
        "float",
        "float",
        dtype,
        torch.float32,
        torch.float32,
        f"{load}({{}})",
        f"{store}({{}})",
        lanes=4,
        fast_draws=True,
    )


#: backend -> dtype name -> :class:`DType`
DTYPES: dict[str, dict[str, DType]] = {
    # CPU lanes: 64 neurons per loop iteration, a lane loop GCC vectorises (at 16 or
    # fewer it unrolls the loop first and then vectorises none of it)
    "cpu": {
        "float32": DType(**{**_F32.__dict__, "lanes": 64}),
        "float64": DType(**{**_F64.__dict__, "lanes": 64}),
    },
    "cuda": {
        "float32": DType(**{**_F32.__dict__, "lanes": 4}),
        "float64": DType(**{**_F64.__dict__, "lanes": 2}),
        "float16": _half("float16", torch.float16, "sn_h2f", "sn_f2h"),
        "bfloat16": _half("bfloat16", torch.bfloat16, "sn_b2f", "sn_f2b"),
    },
}


def dtype_name(dtype: torch.dtype | str | Any) -> str:
    """``torch.float32`` or ``"float32"`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def supported(backend: str) -> list[str]:
    """Dtype names the ``backend`` kernels take, in table order."""
    return list(DTYPES[backend])


#: (backend, dtype as given) -> its row, filled by :func:`lookup` (host time: the
#: kernels look their dtype up several times per call)
_ROWS: BoundedTable[tuple[str, Any], DType] = BoundedTable(64, "dtypes.rows")


def lookup(backend: str, dtype: torch.dtype | str) -> DType:
    """The row of ``dtype`` on ``backend``; ``TypeError`` naming the supported ones if absent."""
    row = _ROWS.get((backend, dtype))
    if row is not None:
        return row
    row = DTYPES[backend].get(dtype_name(dtype))
    if row is not None:
        if not torch.compiler.is_compiling():
            _ROWS.put((backend, dtype), row)
        return row
    raise TypeError(
        f"The {backend} backend supports dtypes {sorted(DTYPES[backend])}, not "
        f"{dtype_name(dtype)}; convert the input or pick another backend."
    )
