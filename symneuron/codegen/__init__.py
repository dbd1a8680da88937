"""The code-generation stage: KernelSpec -> kernel source text.

* :mod:`~symneuron.codegen.signature`: kernel names, variants and arguments (the
  calling convention, once);
* :mod:`~symneuron.codegen.steps`: the forward and backward time loops, printed
  from the spec's expressions with :mod:`~symneuron.codegen.printer`;
* :mod:`~symneuron.codegen.skeleton`: the source file around them;
* :mod:`~symneuron.codegen.dialects`: CUDA and C as data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import dtypes
from ..derivation import KernelSpec
from .dialects import DIALECTS
from .skeleton import render

if TYPE_CHECKING:
    import torch

__all__ = ["render_source"]


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
    return render(spec, DIALECTS[backend], dtypes.lookup(backend, dtype), only=kernel)
