"""The source file: prelude, then each kernel variant wrapped around its step body.

:func:`render` prints one neuron's kernels of some passes for one dialect and dtype:
every variant of each pass (:meth:`symneuron.signature.Pass.variants`), as a function
whose parameter list is printed from the pass's named arguments and whose body comes
from the printer of the pass's kind (:data:`PRINTERS`: :mod:`.forward`,
:mod:`.backward`; :func:`register_printer` adds a kind). A pass whose neurons exchange
values (``Pass.rows``) gets its connection's stage around the same body
(:mod:`.connection`). The dialect makes exported kernels of it (on CUDA a template over
the lane count K).
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy as sp

from ..derivation import KernelSpec
from ..dtypes import DType
from ..signature import BACKWARD, FORWARD, Pass, Variant, lane_counts, variants
from . import connection, grid, noise
from .backward import BackwardPrinter
from .dialects import Dialect
from .forward import ForwardPrinter
from .layout import ROW_THREADS
from .steps import StepPrinter

__all__ = ["render", "kernel_names", "parameters", "PRINTERS", "register_printer"]

#: pass kind -> the printer of its bodies
PRINTERS: dict[str, type[StepPrinter]] = {"forward": ForwardPrinter, "backward": BackwardPrinter}


def register_printer(kind: str, printer: type[StepPrinter]) -> None:
    """Print the bodies of passes of ``kind`` with ``printer`` (a new kind of pass)."""
    PRINTERS[kind] = printer


def parameters(spec: KernelSpec, pass_: Pass, dtype: DType, dialect: Dialect) -> list[str]:
    """The C parameter list of a pass's kernels: ``const float* __restrict__ x_seq``,
    ``long long N``, ... in the order of the pass's named arguments."""
    cnames = tuple(spec.param_cnames[n] for n in spec.params)
    learn = tuple(spec.param_cnames[n] for n in spec.learnable)
    out = []
    for arg in pass_.of(bool(spec.states), noise.draws(spec)):
        for name in arg.c_names(cnames, learn):
            if not arg.pointer:
                out.append(f"{arg.role} {name}")
                continue
            ctype = "long long" if arg.role == "int64" else getattr(dtype, arg.role)
            out.append(f"{'const ' if arg.const else ''}{ctype}* {dialect.restrict} {name}")
    return out


def kernel_names(
    spec: KernelSpec, dtype: DType, passes: Sequence[Pass] = (FORWARD, BACKWARD)
) -> list[str]:
    """Every exported kernel of a source of ``passes``, in source order."""
    return [v.exported(spec.name) for v in variants(dtype.lanes, passes)]


def _printer(spec: KernelSpec, pass_: Pass, dtype: DType, dialect: Dialect) -> StepPrinter:
    found = PRINTERS.get(pass_.kind)
    if found is None:
        raise ValueError(
            f"No printer for passes of kind {pass_.kind!r}; kinds: {sorted(PRINTERS)} "
            "(symneuron.codegen.skeleton.register_printer adds one)"
        )
    return found(spec, dtype, dialect)


def _kernels(spec: KernelSpec, group: list[Variant], dtype: DType, dialect: Dialect) -> str:
    """The exported kernels of one function: the variants of one option set."""
    first = group[0]
    pass_ = first.pass_
    printer = _printer(spec, pass_, dtype, dialect)
    params = parameters(spec, pass_, dtype, dialect)
    lanes = {v.lanes: v.exported(spec.name) for v in group}
    name = first.function(spec.name)
    if pass_.grid:
        return dialect.grid_kernels(name, params, grid.body(printer, first), lanes, grid.THREADS)
    if pass_.rows:
        body = connection.row_body(printer, first)
        return dialect.row_kernels(name, params, body, lanes, ROW_THREADS)
    # the C backward keeps one lane when a step calls the math library
    one_lane = pass_.kind == "backward" and _calls_libm(spec)
    return dialect.kernels(name, params, printer.body(first), lanes, one_lane)


def render(
    spec: KernelSpec,
    dialect: Dialect,
    dtype: DType,
    only: Variant | None = None,
    passes: Sequence[Pass] = (FORWARD, BACKWARD),
) -> str:
    """The source file: prelude, then every variant of ``passes``.

    With ``only`` (one variant), the source holds just that kernel, so a first call
    compiles only what it runs.
    """
    if only is not None:
        passes = (only.pass_,)
    header = (
        f"// symneuron {dialect.name} kernels for {spec.name} ({dtype.name}), key {spec.key}\n"
        f"// H = {spec.charge[-1].expr}\n"
    )
    prelude = dialect.prelude(dtype, lane_counts(dtype.lanes))
    parts = [header, prelude + (dialect.random_source() if noise.draws(spec) else "")]
    groups: dict[str, list[Variant]] = {}
    for variant in variants(dtype.lanes, passes):  # the lane counts of one function together
        if only is None or variant == only:
            groups.setdefault(variant.function(spec.name), []).append(variant)
    if not groups:
        raise ValueError(
            f"No kernel {only.exported(spec.name) if only else ''!r} for {dtype.name}; "
            f"kernels are {kernel_names(spec, dtype, passes)}"
        )
    parts += [_kernels(spec, group, dtype, dialect) for group in groups.values()]
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
