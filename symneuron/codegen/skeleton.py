"""The source file: prelude, then each kernel variant wrapped around its step body.

:func:`render` prints one neuron's kernels for one dialect and dtype: every
forward and backward variant (:func:`symneuron.signature.variants`), each as a
function whose parameter list is printed from the pass's named arguments
(:data:`symneuron.signature.FORWARD`, :data:`~symneuron.signature.BACKWARD`) and
whose body comes from :class:`~symneuron.codegen.steps.StepPrinter`. The dialect
makes exported kernels of it (on CUDA a template over the lane count K).
"""

from __future__ import annotations

import sympy as sp

from .. import rng
from ..derivation import KernelSpec
from ..dtypes import DType
from ..signature import PASSES, Variant, lane_counts, variants
from . import noise
from .dialects import Dialect
from .recurrent import RecurrentPrinter
from .steps import StepPrinter

__all__ = ["render", "kernel_names", "parameters"]

_CTYPES = ("storage", "compute", "accum")


def parameters(spec: KernelSpec, pass_name: str, dtype: DType, dialect: Dialect) -> list[str]:
    """The C parameter list of a pass's kernels: ``const float* __restrict__ x_seq``,
    ``long long N``, ... in the order of the pass's named arguments."""
    cnames = tuple(spec.param_cnames[n] for n in spec.params)
    learn = tuple(spec.param_cnames[n] for n in spec.learnable)
    out = []
    for arg in PASSES[pass_name].of(bool(spec.states), noise.draws(spec)):
        for name in arg.c_names(cnames, learn):
            if not arg.pointer:
                out.append(f"{arg.role} {name}")
                continue
            ctype = "long long" if arg.role == "int64" else getattr(dtype, arg.role)
            out.append(f"{'const ' if arg.const else ''}{ctype}* {dialect.restrict} {name}")
    return out


def kernel_names(spec: KernelSpec, dtype: DType, recurrent: bool = False) -> list[str]:
    """Every exported kernel of a source, in source order (``recurrent``: of a recurrent
    source)."""
    return [v.exported(spec.name) for v in variants(dtype.lanes, recurrent)]


def _body(printer: StepPrinter, variant: Variant) -> list[str]:
    if variant.pass_name in ("forward", "rforward"):
        return printer.forward(*variant.options)
    return printer.backward(*variant.options)


def render(
    spec: KernelSpec, dialect: Dialect, dtype: DType, only: str | None = None,
    recurrent: bool = False,
) -> str:  # fmt: skip
    """The source file: prelude, then every forward and backward variant (``recurrent``:
    of the recurrent passes).

    With ``only`` (an exported kernel name), the source holds just that kernel,
    so a first call compiles only what it runs.
    """
    # an exported name is <neuron>_<base>_k<K>, the recurrent bases start with "r"
    recurrent = recurrent or (only is not None and only[len(spec.name) + 1 :].startswith("r"))
    printer = (RecurrentPrinter if recurrent else StepPrinter)(spec, dtype, dialect)
    header = (
        f"// symneuron {dialect.name} kernels for {spec.name} ({dtype.name}), key {spec.key}\n"
        f"// H = {spec.charge[-1].expr}\n"
    )
    prelude = dialect.prelude(dtype, lane_counts(dtype.lanes))
    parts = [header, prelude + (rng.source(dialect.name) if noise.draws(spec) else "")]
    groups: dict[str, list[Variant]] = {}
    for variant in variants(dtype.lanes, recurrent):  # the lane counts of one function together
        if only is None or variant.exported(spec.name) == only:
            groups.setdefault(variant.function(spec.name), []).append(variant)
    for name, group in groups.items():
        first = group[0]
        params = parameters(spec, first.pass_name, dtype, dialect)
        lanes = {v.lanes: v.exported(spec.name) for v in group}
        # the C backward keeps one lane when a step calls the math library
        one_lane = first.pass_name == "backward" and _calls_libm(spec)
        if first.recurrent:
            parts.append(dialect.row_kernels(name, params, _body(printer, first), lanes))
        else:
            parts.append(dialect.kernels(name, params, _body(printer, first), lanes, one_lane))
    if len(parts) == 2:
        raise ValueError(
            f"No kernel named {only!r}; kernels are {kernel_names(spec, dtype, recurrent)}"
        )
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
