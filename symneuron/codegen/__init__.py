"""Code generation: KernelSpec -> kernel source text."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..derive import KernelSpec
from .c import C_DTYPES, C
from .cuda import CUDA, CUDA_DTYPES
from .kernels import Dialect, DTypeInfo, render

if TYPE_CHECKING:
    import torch

__all__ = ["render_source", "dtype_name", "DIALECTS"]

#: backend -> (dialect, supported dtypes)
DIALECTS: dict[str, tuple[Dialect, dict[str, DTypeInfo]]] = {
    "cuda": (CUDA, CUDA_DTYPES),
    "cpu": (C, C_DTYPES),
}


def dtype_name(dtype: torch.dtype | str | Any) -> str:
    """``torch.float32`` or ``"float32"`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


def render_source(
    spec: KernelSpec, backend: str, dtype: torch.dtype | str, kernel: str | None = None
) -> str:
    """The generated source for ``backend`` (``"cuda"`` or ``"cpu"``) and ``dtype``.

    ``kernel`` restricts it to one exported kernel (what the runtimes compile).
    """
    if backend not in DIALECTS:
        raise ValueError(
            f"No generated source for backend {backend!r}; use one of {sorted(DIALECTS)}"
        )
    dialect, dtypes = DIALECTS[backend]
    name = dtype_name(dtype)
    if name not in dtypes:
        raise TypeError(
            f"The {backend} backend supports dtypes {sorted(dtypes)}, not {name}; "
            "convert the input or pick another backend."
        )
    return render(spec, dialect, dtypes[name], only=kernel)
