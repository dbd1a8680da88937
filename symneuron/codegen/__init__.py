"""The code-generation stage: KernelSpec -> kernel source text.

* :mod:`~symneuron.codegen.steps`: what every pass's printer shares (streams, lanes,
  expressions printed with :mod:`~symneuron.codegen.printer`);
* :mod:`~symneuron.codegen.forward`, :mod:`~symneuron.codegen.backward`: the two
  passes' time loops; :mod:`~symneuron.codegen.noise`: their random draws;
* :mod:`~symneuron.codegen.connection`: a connection's stage around them (the
  recurrent kernels), its shared memory and threads one
  :mod:`~symneuron.codegen.layout`;
* :mod:`~symneuron.codegen.skeleton`: the source file around them;
* :mod:`~symneuron.codegen.dialects`: CUDA and C as classes.

The calling convention (arguments, passes, variants) is :mod:`symneuron.signature`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import dtypes
from ..derivation import KernelSpec
from ..signature import BACKWARD, FORWARD, RBACKWARD, RFORWARD, Variant
from .dialects import DIALECTS
from .skeleton import render

if TYPE_CHECKING:
    import torch

__all__ = ["render_source"]


def render_source(
    spec: KernelSpec,
    backend: str,
    dtype: torch.dtype | str,
    kernel: Variant | None = None,
    recurrent: bool = False,
) -> str:
    """The generated source for ``backend`` (``"cuda"`` or ``"cpu"``) and ``dtype``: the
    feedforward passes' kernels, or with ``recurrent`` the recurrent connection's
    (:data:`~symneuron.signature.RFORWARD`, :data:`~symneuron.signature.RBACKWARD`).

    ``kernel`` restricts it to one variant (what the runtimes compile), of any pass.
    """
    if backend not in DIALECTS:
        raise ValueError(
            f"No generated source for backend {backend!r}; use one of {sorted(DIALECTS)}"
        )
    passes = (RFORWARD, RBACKWARD) if recurrent else (FORWARD, BACKWARD)
    return render(spec, DIALECTS[backend], dtypes.lookup(backend, dtype), kernel, passes)
