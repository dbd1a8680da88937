"""The layout of a kernel family whose blocks each own one batch row: stated once.

A row kernel (:mod:`.connection`) runs one block per batch row of ``F`` neurons, ``K``
neurons per thread, ``n_parts`` threads per neuron, and keeps the values its neurons
exchange in shared memory. Every fact of that layout is one formula here, over the
launch's integers (``F``, ``D`` the delay, ``K``, ``n_parts``, ``row_threads``,
``n_words``) and the byte sizes of the kernel's types (``cs`` compute, ``ss``
storage): :class:`RowLayout` prints each formula into the kernel text and evaluates
the same formula for the launch (its threads, its shared bytes), so the two cannot
disagree. In a formula ``/`` is integer division, as in C.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

__all__ = ["Region", "RowLayout", "ROW_THREADS", "N_WORDS", "CHUNK", "ALIGN"]

#: threads of a row's neuron-owning part: one per K neurons, whole warps
ROW_THREADS = "32 * ((F + 32 * K - 1) / (32 * K))"
#: the vote words of a row's spikes (CUDA): one per warp and lane
N_WORDS = "row_threads / 32 * K"
#: the neurons of the weight's rows each part of a neuron's threads sums over
CHUNK = "(F + n_parts - 1) / n_parts"
#: shared-memory regions start at multiples of this many bytes (16-byte vector loads)
ALIGN = 16

#: the byte size of each kind of value a region holds
_SIZES = {"compute": "cs", "storage": "ss", "word": "4"}


@dataclass(frozen=True)
class Region:
    """A named array in a row's shared memory: ``count`` values of ``kind``
    (``"compute"``, ``"storage"`` or ``"word"``, a 32-bit vote word)."""

    name: str
    kind: str
    count: str

    def nbytes(self) -> str:
        return f"({self.count}) * {_SIZES[self.kind]}"


@functools.cache
def _python(formula: str) -> Any:
    """``formula`` compiled for Python's integers (``/`` divides as C's integers do:
    every value is non-negative)."""
    return compile(formula.replace("/", "//"), f"<layout {formula}>", "eval")


@dataclass(frozen=True)
class RowLayout:
    """A row block's shared memory: its regions in order, each starting 16-aligned.

    :meth:`offset_text` prints a region's first byte for the kernel; :meth:`offset` and
    :meth:`total` evaluate the same formulas for a launch.
    """

    regions: tuple[Region, ...]

    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.regions)

    def _start(self, name: str) -> str:
        """The formula of region ``name``'s first byte."""
        offset = "0"
        for region in self.regions:
            if region.name == name:
                return offset
            offset = f"(({offset} + {region.nbytes()} + {ALIGN - 1}) / {ALIGN} * {ALIGN})"
        raise KeyError(f"no region {name!r} in {self.names()}")

    def _end(self) -> str:
        last = self.regions[-1]
        return f"({self._start(last.name)} + {last.nbytes()})"

    def offset_text(self, name: str, sizes: dict[str, str]) -> str:
        """Region ``name``'s first byte as a C expression (``sizes``: ``cs``/``ss`` ->
        ``sizeof(<type>)``)."""
        text = self._start(name)
        for symbol, size in sizes.items():
            text = text.replace(symbol, f"(long long){size}")
        return text

    def total_text(self, sizes: dict[str, str]) -> str:
        """The bytes of all regions as a C expression (``sizes`` as for
        :meth:`offset_text`)."""
        text = self._end()
        for symbol, size in sizes.items():
            text = text.replace(symbol, f"(long long){size}")
        return text

    def _evaluate(self, formula: str, values: dict[str, int]) -> int:
        return evaluate(formula, values)

    def offset(self, name: str, values: dict[str, int]) -> int:
        """Region ``name``'s first byte for a launch's ``values`` (F, D, K, ..., cs, ss)."""
        return self._evaluate(self._start(name), values)

    def total(self, values: dict[str, int]) -> int:
        """The bytes of all regions for a launch's ``values``."""
        return self._evaluate(self._end(), values)


def evaluate(formula: str, values: dict[str, int]) -> int:
    """One of this module's formulas (:data:`ROW_THREADS`, ...) for a launch's values."""
    return int(eval(_python(formula), {}, values))  # noqa: S307 (a formula of this module's)
