"""The random draws of a step body: the lines a noisy neuron's kernels add.

A kernel that draws (:func:`draws`) reads the generator's state once per thread
(:func:`state`: ``rng[0]`` the seed, ``rng[1]`` the offset, an int64 [2] tensor) and
computes each draw where it is used, keyed by (seed, offset, stream, step, neuron) with
the functions of :func:`symneuron.rng.source`: a noise stream's standard normal where X
is read (:func:`normals`), escape firing's uniform where the spike is decided
(:func:`escape`). The backward makes the same calls, so it sees the forward's draws
without storing them. Nothing here is printed for a neuron that draws nothing, so its
kernels stay as they were.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import sympy as sp

from ..derivation import K, KernelSpec
from ..rng import ESCAPE_STREAM
from ..stochastic import NOISES

__all__ = ["draws", "state", "normals", "escape", "read_by"]


class _Printer(Protocol):
    spec: KernelSpec

    def expr(self, e: sp.Expr) -> str: ...


def draws(spec: KernelSpec) -> bool:
    """Whether the kernels draw random numbers (noise streams or escape firing)."""
    return bool(spec.noise_streams) or spec.probability is not None


def state(spec: KernelSpec) -> list[str]:
    """The generator's seed and offset, read once per thread (nothing if none drawn)."""
    if not draws(spec):
        return []
    return ["const sn_u64 rng_seed = (sn_u64)rng[0];", "const sn_u64 rng_offset = (sn_u64)rng[1];"]


def _key(stream: int, step: str) -> str:
    return f"rng_seed, rng_offset, {stream}u, (sn_u64)({step}), (sn_u64)(i0 + j)"


def normals(streams: Iterable[int], compute: str, step: str = "t") -> list[str]:
    """This lane's standard-normal draw of each stream at ``step``, named as its symbol."""
    return [
        f"const {compute} {NOISES[i]} = sn_rng_normal_{compute}({_key(i, step)});" for i in streams
    ]


def read_by(spec: KernelSpec, reads: Iterable[sp.Symbol]) -> list[int]:
    """The streams among the symbols a block reads (the backward's, for a learnable noise
    amplitude, whose gradient is Σ g·noise)."""
    read = set(reads)
    return [i for i in spec.noise_streams if NOISES[i] in read]


def escape(printer: _Printer, compute: str, h: str, step: str) -> list[str]:
    """Escape firing from ``h`` at ``step``: S = [u < p(h)], u the escape stream's uniform
    (``u`` stays h − v_th for a soft reset's use; the backward's sg is dp/dh)."""
    p = printer.spec.probability
    assert p is not None
    prob = printer.expr(p.xreplace({K.h: sp.Symbol(h, real=True)}))
    uniform = f"sn_rng_uniform_{compute}({_key(ESCAPE_STREAM, step)})"
    return [
        f"const {compute} u = {h} - v_th;",
        f"const {compute} s = {uniform} < {prob} ? 1 : 0;",
    ]
