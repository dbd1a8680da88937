"""The random draws of a step body: the lines a noisy neuron's kernels add.

A kernel that draws (:func:`draws`) reads the generator's state once per thread
(:func:`state`: ``rng[0]`` the seed, ``rng[1]`` the offset, an int64 [2] tensor) and
computes each draw where it is used, keyed by (seed, offset, stream, step, neuron) with
the functions of :func:`symneuron.rng.source`: a noise stream's standard normal where X
is read (:func:`normals`), escape firing's uniform where the spike is decided
(:func:`escape`). On CUDA a step first fills the normals of the thread's K lanes
(:func:`step_draws`: one Philox block per four lanes, one Box–Muller per two, by
construction rather than by the compiler's common-subexpression elimination), and each
lane reads its own; 16-bit kernels use the fast conversion
(:attr:`symneuron.dtypes.DType.fast_draws`). The backward makes the same calls, so it
sees the forward's draws without storing them. Nothing here is printed for a neuron that
draws nothing, so its kernels stay as they were.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import sympy as sp

from ..derivation import K, KernelSpec
from ..dtypes import DType
from ..rng import ESCAPE_STREAM
from ..stochastic import NOISES
from .dialects import Dialect

__all__ = [
    "draws",
    "state",
    "step_draws",
    "backward_draws",
    "normals",
    "escape",
    "read_by",
]


class _Printer(Protocol):
    spec: KernelSpec
    dialect: Dialect
    dt: DType

    def expr(self, e: sp.Expr) -> str: ...


def draws(spec: KernelSpec) -> bool:
    """Whether the kernels draw random numbers (noise streams or escape firing)."""
    return bool(spec.noise_streams) or spec.probability is not None


def state(spec: KernelSpec) -> list[str]:
    """The generator's seed and offset, read once per thread (nothing if none drawn)."""
    if not draws(spec):
        return []
    return ["const sn_u64 rng_seed = (sn_u64)rng[0];", "const sn_u64 rng_offset = (sn_u64)rng[1];"]


def _key(stream: int, step: str, neuron: str = "(sn_u64)(i0 + j)") -> str:
    return f"rng_seed, rng_offset, {stream}u, (sn_u64)({step}), {neuron}"


#: CUDA: the block of lane j's uniform and the lane's place in it. A thread's first
#: neuron i0 is a multiple of K, so with K % 4 == 0 the four lanes of a group name one
#: block by one expression, and the compiler computes one Philox call for them.
_CUDA_LANE = ("(sn_u64)(i0 + (K % 4 == 0 ? (j & ~3) : j))", "(sn_u64)(K % 4 == 0 ? j : i0 + j)")


def _uniform(printer: _Printer, compute: str, stream: int, step: str) -> str:
    """One lane's uniform of ``stream`` at ``step`` (C: from :func:`step_draws`'s array)."""
    if not printer.dialect.lane_templates:
        return f"{_ESCAPE_ARRAYS[step]}[j]"
    block = f"sn_rng_block({_key(stream, step, _CUDA_LANE[0])})"
    return f"sn_uniform_{compute}(sn_word({block}, {_CUDA_LANE[1]}))"


#: C: the arrays of a step's escape uniforms, by the step they are drawn at
_ESCAPE_ARRAYS = {"t": "esc_l", "t - 1": "escp_l"}
#: the steps whose escape uniforms a backward step reads: its own spike's, and step
#: t − 1's where it recomputes V[t − 1] (an array nothing reads costs nothing)
_BACKWARD_STEPS = ("t", "t - 1")


def step_draws(
    printer: _Printer, streams: Iterable[int], escape_steps: Iterable[str] = ("t",)
) -> list[str]:
    """A step's draws for the thread's K lanes, before the lane loop: each noise
    stream's normals at step t in an array ``<symbol>_l[K]`` that :func:`normals` reads,
    one Philox block per four lanes and one Box–Muller per two (CUDA: a template of K;
    C: a function the lane count is given); C also fills escape firing's uniforms at
    each of ``escape_steps`` (``esc_l``, ``escp_l``) that :func:`escape` reads (CUDA's
    lanes name one block by one expression, which the compiler computes once)."""
    ct, fast = printer.dt.compute, "_fast" if printer.dt.fast_draws else ""
    templates, out = printer.dialect.lane_templates, []
    for i in streams:
        fill = f"sn_rng_normals{fast}_{ct}<K>(" if templates else f"sn_rng_normals_{ct}("
        size = "" if templates else "K, "
        out += [
            f"{ct} {NOISES[i]}_l[K];",
            f"{fill}{NOISES[i]}_l, {size}{_key(i, 't', '(sn_u64)i0')});",
        ]
    if printer.spec.probability is not None and not templates:
        for step in escape_steps:
            name, key = _ESCAPE_ARRAYS[step], _key(ESCAPE_STREAM, step, "(sn_u64)i0")
            out += [f"{ct} {name}[K];", f"sn_rng_uniforms_{ct}({name}, K, {key});"]
    return out


def backward_draws(printer: _Printer) -> list[str]:
    """:func:`step_draws` of a backward step: the noise streams its block reads (a
    learnable amplitude's gradient) and escape firing's uniforms of steps t and t − 1."""
    spec = printer.spec
    return step_draws(printer, read_by(spec, spec.backward.reads), _BACKWARD_STEPS)


def normals(streams: Iterable[int], compute: str) -> list[str]:
    """This lane's standard-normal draw of each stream at the step, named as its symbol
    (read from the arrays of :func:`step_draws`)."""
    return [f"const {compute} {NOISES[i]} = {NOISES[i]}_l[j];" for i in streams]


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
    uniform = _uniform(printer, compute, ESCAPE_STREAM, step)
    return [
        f"const {compute} u = {h} - v_th;",
        f"const {compute} s = {uniform} < {prob} ? 1 : 0;",
    ]
