"""The source file: prelude, then each kernel variant wrapped around its step body.

:func:`render` prints one neuron's kernels for one dialect and dtype: every
forward and backward variant (:mod:`~symneuron.codegen.signature`), each as a
function whose parameter list is printed from the signature and whose body comes
from :class:`~symneuron.codegen.steps.StepPrinter`. On CUDA a variant is a
template over the lane count K with one exported ``extern "C"`` kernel per K.
"""

from __future__ import annotations

import sympy as sp

from ..derivation import KernelSpec
from ..dtypes import DType
from .dialects import C_VECTOR, Dialect
from .signature import (
    GRAD_V_MODES,
    V_MODES,
    Arg,
    backward_args,
    backward_base,
    backward_name,
    exported,
    forward_args,
    forward_base,
    forward_name,
    lane_counts,
)
from .steps import INDENT, StepPrinter, indent

__all__ = ["render", "kernel_names"]


def _declaration(arg: Arg, dtype: DType, dialect: Dialect) -> str:
    """``const float* __restrict__ x_seq``, ``long long N``, ..."""
    if not arg.pointer:
        return f"{arg.role} {arg.name}"
    ctype = {"storage": dtype.storage, "compute": dtype.compute, "accum": dtype.accum}[arg.role]
    return f"{'const ' if arg.const else ''}{ctype}* {dialect.restrict} {arg.name}"


def _function(
    dialect: Dialect,
    name: str,
    args: list[str],
    lines: list[str],
    lanes: tuple[int, ...],
    one_lane: bool = False,
) -> str:
    """The body as exported kernels, one per lane count (a template on CUDA); on C with
    ``one_lane`` the wide kernel runs one neuron per iteration too."""
    joined = f",\n{INDENT}".join(args)
    if not dialect.template:
        return "\n".join(
            _c_function(dialect, joined, lines, 1 if one_lane else k, exported(name, k))
            for k in lanes
        )
    text = "\n".join(indent(_loop(dialect, lines)))
    call = ", ".join(a.split()[-1] for a in args)
    out = [
        "template <int K>\n"
        f"__device__ __forceinline__ void {name}(\n{INDENT}{joined}) {{\n{text}\n}}\n"
    ]
    for k in lanes:
        out.append(
            f'extern "C" __global__ void {exported(name, k)}(\n{INDENT}{joined}) {{\n'
            f"{INDENT}{name}<{k}>({call});\n}}\n"
        )
    return "\n".join(out)


def _loop(dialect: Dialect, lines: list[str], **bounds: str) -> list[str]:
    """The step body inside the dialect's loop over neurons (C: from ``begin`` to ``end``)."""
    return [
        *dialect.loop_open.format(**bounds).splitlines(),
        *indent(lines, 1 if dialect.loop_close else 0),
        *dialect.loop_close.splitlines(),
    ]


def _c_function(dialect: Dialect, joined: str, lines: list[str], k: int, exported_as: str) -> str:
    """C kernel ``exported_as`` with ``k`` lanes: K and the vector type are macros around
    the loops; the last N mod K neurons take the same body with one lane (vector loads
    and stores of K values never run past the end) and no parallel region."""

    def lanes(count: int, begin: str, end: str, tail: bool = False) -> list[str]:
        loop = _loop(dialect, lines, begin=begin, end=end)
        if tail:
            loop = [line for line in loop if not line.startswith("#pragma omp")]
        return [
            f"#define K {count}",
            f"#define sn_vec sn_vec{count}",
            *indent(loop),
            "#undef sn_vec",
            "#undef K",
        ]

    if k == 1:
        body = lanes(1, "0", "N")
    else:
        wide = f"{INDENT}const long long n_wide = N - N % {k};"
        body = [wide, *lanes(k, "0", "n_wide"), *lanes(1, "n_wide", "N", tail=True)]
    text = "\n".join(body)
    return f"void {exported_as}(\n{INDENT}{joined}) {{\n{text}\n}}\n"


def kernel_names(spec: KernelSpec, dtype: DType) -> list[str]:
    """Every exported kernel of a source, in source order."""
    lanes = lane_counts(dtype.lanes)
    name = spec.name
    names = [forward_name(name, h, m, k) for h in (True, False) for m in V_MODES for k in lanes]
    return names + [backward_name(name, m, k) for m in GRAD_V_MODES for k in lanes]


def render(spec: KernelSpec, dialect: Dialect, dtype: DType, only: str | None = None) -> str:
    """The source file: prelude, then every forward and backward variant.

    With ``only`` (an exported kernel name), the source holds just that kernel,
    so a first call compiles only what it runs.
    """
    body = StepPrinter(spec, dtype, dialect)
    all_lanes = lane_counts(dtype.lanes)
    cnames = tuple(spec.param_cnames[n] for n in spec.params)
    learn = tuple(spec.param_cnames[n] for n in spec.learnable)
    k = len(spec.states)

    def declare(args: tuple[Arg, ...]) -> list[str]:
        return [_declaration(a, dtype, dialect) for a in args]

    header = (
        f"// symneuron {dialect.name} kernels for {spec.name} ({dtype.name}), key {spec.key}\n"
        f"// H = {spec.charge[-1].expr}\n"
    )
    prelude = dialect.prelude
    if not dialect.template:
        prelude += "".join(C_VECTOR.format(k=k) for k in all_lanes)
    parts = [header, prelude.replace("{st}", dtype.storage)]
    for store_h in (True, False):
        for v_mode in V_MODES:
            name = forward_base(spec.name, store_h, v_mode)
            lanes = _selected(name, all_lanes, only)
            if lanes:
                args = declare(forward_args(cnames, k))
                parts.append(_function(dialect, name, args, body.forward(store_h, v_mode), lanes))
    one_lane = not dialect.template and _calls_libm(spec)  # the C backward only
    for mode in GRAD_V_MODES:
        name = backward_base(spec.name, mode)
        lanes = _selected(name, all_lanes, only)
        if lanes:
            args = declare(backward_args(cnames, learn, k))
            parts.append(_function(dialect, name, args, body.backward(mode), lanes, one_lane))
    if len(parts) == 2:
        raise ValueError(f"No kernel named {only!r}; kernels are {kernel_names(spec, dtype)}")
    return "\n".join(parts)


#: functions the C printer writes inline or as builtins GCC vectorises
_INLINE = (sp.Abs, sp.Piecewise, sp.sign, sp.Min, sp.Max, sp.Heaviside)


def _calls_libm(spec: KernelSpec) -> bool:
    """Whether a backward step calls the math library (expf, tanhf, erfcf, powf, ...):
    GCC does not vectorise those calls without fast-math, and 64 lanes kept in memory
    around scalar calls were 10-20 % slower than one lane (EIF, Izhikevich with the
    default sigmoid), while a backward without calls ran 4-5x faster with 64."""
    lines = (*spec.surrogate, *spec.backward, *spec.reset, *spec.updates, *spec.state_resets)
    for line in lines:
        if any(not isinstance(f, _INLINE) for f in line.expr.atoms(sp.Function)):
            return True
        if any(not p.exp.is_Integer for p in line.expr.atoms(sp.Pow)):
            return True
    return False


def _selected(base: str, lanes: tuple[int, ...], only: str | None) -> tuple[int, ...]:
    if only is None:
        return lanes
    return tuple(k for k in lanes if exported(base, k) == only)
