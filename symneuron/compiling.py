"""What symneuron tells torch's compiler, said without importing it.

``torch.compiler.assume_constant_result`` imports ``torch._dynamo`` the moment it
decorates a function, and with it AOTAutograd, FX passes and inductor's config: a
second or more, the most of what ``import symneuron`` cost beyond ``import torch,
sympy``. :func:`constant_result` leaves the same mark on the function without the
import, so that the compiler stack loads when something first compiles.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["constant_result", "MARK"]

F = TypeVar("F", bound=Callable[..., object])

#: the attribute ``torch._dynamo.assume_constant_result`` sets (tests/test_import_time.py
#: checks that torch still marks a function with it and nothing else)
MARK = "_dynamo_marked_constant"


def constant_result(fn: F) -> F:
    """Mark ``fn`` as ``torch.compiler.assume_constant_result`` does, without importing
    ``torch._dynamo``: compilation calls it once while tracing and keeps its result as a
    constant (for host-side probes such as "is a C compiler installed").

    Examples
    --------
    >>> from symneuron.compiling import constant_result
    >>> @constant_result
    ... def probe() -> bool:
    ...     return True
    >>> probe._dynamo_marked_constant
    True
    """
    setattr(fn, MARK, True)
    return fn
