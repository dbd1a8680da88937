"""Launch tuning: one :class:`Settings` object, ``symneuron.runtime.settings``.

Its fields are documented knobs, not internals: benchmarks sweep them, for a block of
code with ``with settings.use(cuda_block=128): ...`` (restored afterwards) or for the
process by assignment (``settings.cuda_block = 128``). Launches read them; changing
them affects later launches only. The generated source does not depend on them (a
source exports both lane counts of its dtype).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

__all__ = ["Settings"]


@dataclass
class Settings:
    """How kernels are launched.

    Attributes
    ----------
    cuda_block : threads per block of every one-thread-per-K-neurons CUDA launch.
    min_vector_threads : fewest threads for which a CUDA launch packs several neurons
        per thread (the dtype's ``lanes``): below this, one neuron per thread keeps more
        of the GPU busy.
    max_lanes : at most this many neurons per thread on CUDA, per loop iteration on the
        CPU; None: the dtype's width (:attr:`symneuron.dtypes.DType.lanes`). Kernels
        exist for one neuron and for the dtype's width only, so a cap below the width
        means one.

    Examples
    --------
    >>> from symneuron.runtime import settings
    >>> with settings.use(cuda_block=128):
    ...     settings.cuda_block
    128
    """

    cuda_block: int = 256
    min_vector_threads: int = 64 * 1024
    max_lanes: int | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        known = {f.name for f in fields(self)}
        if name not in known:
            raise AttributeError(f"No setting {name!r}; the settings are {sorted(known)}")
        if value is not None or name != "max_lanes":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"settings.{name} must be a positive int, got {value!r}")
        object.__setattr__(self, name, value)

    @contextmanager
    def use(self, **changes: Any) -> Iterator[Settings]:
        """Apply ``changes`` inside a ``with`` block, then restore the previous values."""
        before = {name: getattr(self, name) for name in changes}
        try:
            for name, value in changes.items():
                setattr(self, name, value)
            yield self
        finally:
            for name, value in before.items():
                object.__setattr__(self, name, value)
