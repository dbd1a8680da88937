"""Input checks shared by every stage that takes user input: names, numbers, expressions.

Each raises ``TypeError`` or ``ValueError`` with a message that names the problem
and the fix.
"""

from __future__ import annotations

import difflib
import math
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import sympy as sp
import torch
from sympy.core.function import AppliedUndef

from .symbols import NOISE_STREAMS, RESERVED, XI, noise_symbol

__all__ = [
    "NonFiniteError",
    "param_name",
    "named",
    "finite_float",
    "flag",
    "not_reserved",
    "identifier",
    "learnable_names",
    "check_expression",
    "constants_beyond",
    "check_depends_on_v",
    "raise_if_not_finite",
    "check_total_piecewise",
    "check_depth",
    "check_draws",
    "MAX_DEPTH",
    "dense",
    "in_range",
]


class NonFiniteError(RuntimeError):
    """A state left the finite range during a run with ``check_finite=True``.

    Attributes
    ----------
    variable : the state's name (``"V"`` or an extra state's).
    step : the first time step (0-based) at which it was NaN or ±inf.
    index : that neuron's index within the neuron shape.
    """

    def __init__(self, message: str, variable: str, step: int, index: tuple[int, ...]) -> None:
        super().__init__(message)
        self.variable, self.step, self.index = variable, step, index


_FORBIDDEN_FUNCTIONS = (sp.Heaviside, sp.DiracDelta, sp.Derivative, sp.Integral, sp.Subs)
_COMPLEX_FUNCTIONS = (sp.re, sp.im, sp.arg, sp.conjugate)


def param_name(key: Any, what: str = "Parameter") -> str:
    """The name of a parameter or state given as a SymPy symbol or a string."""
    if isinstance(key, sp.Symbol):
        return key.name
    if isinstance(key, str):
        return key
    raise TypeError(f"{what} keys must be sympy Symbols or names (str), got {key!r}")


def named(
    mapping: Any, what: str, known: Iterable[str] | None = None, hint: str = ""
) -> dict[str, Any]:
    """``mapping`` (symbol or name -> value) keyed by name: the one place every stage
    normalises user-given params and states.

    ``TypeError`` if it is not a mapping or a key is neither a symbol nor a str;
    ``ValueError`` if a name is given twice or, with ``known``, is not among them.
    """
    if mapping is None:
        return {}
    if not isinstance(mapping, Mapping):
        arg = "params" if what == "parameter" else f"{what}s"
        raise TypeError(
            f"{arg} must be a mapping of symbol or name -> value{hint}, got "
            f"{type(mapping).__name__}"
        )
    allowed = None if known is None else list(known)
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        name = param_name(key, what.capitalize())
        if allowed is not None and name not in allowed:
            raise ValueError(f"Unknown {what} {name!r}; the neuron has {allowed}")
        if name in out:
            raise ValueError(f"{what.capitalize()} {name!r} is given twice.")
        out[name] = value
    return out


_NP_BOOL = ("bool", "bool_")  # NumPy 2's name, NumPy 1's


def _is_bool(value: Any) -> bool:
    """Python's or NumPy's bool."""
    kind = type(value)
    return isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ in _NP_BOOL)


def flag(value: Any, what: str) -> bool:
    """``value`` if it is a bool (Python's or NumPy's), else TypeError: a string such as
    ``"no"`` is truthy and would silently mean True."""
    if _is_bool(value):
        return bool(value)
    raise TypeError(f"{what} must be True or False, got {value!r}")


def finite_float(value: Any, what: str) -> float:
    """``value`` as a float; TypeError if it is not a real number (a bool is not),
    ValueError if not finite."""
    if _is_bool(value) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        raise TypeError(f"{what} must be a real number, not a bool ({value!r}); pass a float.")
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a real number, got {value!r}") from None
    if not math.isfinite(out):
        raise ValueError(f"{what} must be finite, got {out}.")
    return out


def not_reserved(name: str, what: str, params: Iterable[str] = ()) -> None:
    """Reject a parameter or state ``name`` that is a reserved symbol's (V, X, H, S, ...:
    :data:`symneuron.symbols.RESERVED`) or, for a state, a parameter's."""
    if name in RESERVED:
        raise ValueError(
            f"{what} name {name!r} is reserved ({name} is {RESERVED[name].meaning}); "
            f"rename the {what.lower()}."
        )
    if name in params:
        raise ValueError(f"{what} name {name!r} is a parameter's name; rename one of them.")


def identifier(name: Any, default: str) -> str:
    """A neuron's ``name`` (``default`` for None): a str that is an identifier, since it
    names the kernels."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str (used in kernel names), got {name!r}")
    if name is not None and not name.isidentifier():
        raise ValueError(f"name must be an identifier (used in kernel names), got {name!r}")
    return name or default


def learnable_names(learnable: Any, params: Mapping[str, float], used: set[str]) -> tuple[str, ...]:
    """The names of the ``learnable`` parameters (symbols or names), each one of
    ``params`` and among the ``used`` names (else it would never get a gradient)."""
    if isinstance(learnable, (str, sp.Symbol)):
        learnable = [learnable]
    if not isinstance(learnable, Iterable):
        raise TypeError(
            f"learnable must be a list of parameter names or symbols, got {learnable!r}; "
            'e.g. learnable=["tau"]'
        )
    out: list[str] = []
    for key in learnable:
        pname = param_name(key)
        if pname not in params:
            close = difflib.get_close_matches(pname, list(params), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(
                f"Learnable parameter {pname!r} is not in params (this neuron has "
                f"{sorted(params)}).{hint} A new parameter of your own neuron needs "
                "a default in params={...}."
            )
        if pname not in used:
            raise ValueError(
                f"Learnable parameter {pname!r} does not appear in the charge (or the "
                "threshold or reset), so it would never get a gradient; remove it from "
                "learnable."
            )
        if pname not in out:
            out.append(pname)
    return tuple(out)


def _check_real(expr: sp.Expr, what: str) -> None:
    if expr.has(sp.I) or expr.has(*_COMPLEX_FUNCTIONS):
        raise ValueError(f"The {what} is complex or not real ({expr}); symneuron needs real math.")
    for number in expr.atoms(sp.Number):
        if number.is_real is False:
            raise ValueError(f"The {what} contains the non-real number {number}.")


def _numeric_parts(expr: sp.Basic) -> Iterator[sp.Expr]:
    """The largest subexpressions of ``expr`` that are numbers (``2``, ``exp(-1)``, ``1e39``)."""
    if isinstance(expr, sp.Expr) and expr.is_number:
        yield expr
        return
    for arg in expr.args:
        yield from _numeric_parts(arg)


def constants_beyond(expr: sp.Basic, limit: float) -> list[str]:
    """The numeric constants of ``expr`` whose magnitude exceeds ``limit`` (as text)."""
    out = []
    for part in _numeric_parts(expr):
        try:
            value = abs(complex(part.evalf(20)))
        except (TypeError, ValueError, OverflowError):
            continue
        if not value <= limit:  # also inf and NaN
            out.append(str(part.evalf(6)))
    return out


def check_depends_on_v(given: sp.Expr, charge: sp.Expr, v: sp.Symbol) -> None:
    """Reject a ``charge`` (the user's ``given`` one, canonical symbols) without V, or in
    which V cancels."""
    if v.name not in {s.name for s in given.free_symbols}:
        raise ValueError(
            "The charge does not depend on V; H = f(V, X, params) must use the previous state V."
        )
    if not charge.has(v) or sp.diff(charge, v) == 0:
        raise ValueError(
            f"The charge does not depend on V once simplified ({given} is {charge}): V "
            "cancels. H = f(V, X, params) must use the previous state V; write it with "
            "one symbol V (sn.V)."
        )


def check_expression(expr: sp.Expr, what: str) -> None:
    """Reject expressions the kernels cannot evaluate to a finite real number."""
    for kind in _FORBIDDEN_FUNCTIONS:
        if expr.has(kind):
            raise ValueError(
                f"The {what} contains {kind.__name__}; the charge must be a smooth real "
                "function of V, X and the params (spiking is added by symneuron)."
            )
    undefined = sorted(str(f.func) for f in expr.atoms(AppliedUndef))
    if undefined:
        raise ValueError(
            f"The {what} uses undefined functions {undefined}; write them out as SymPy "
            "expressions (exp, log, tanh, ...)."
        )
    if expr.has(sp.zoo, sp.oo, -sp.oo, sp.nan):
        raise ValueError(f"The {what} is not finite ({expr}); check for division by zero.")
    _check_real(expr, what)
    huge = constants_beyond(expr, sys.float_info.max)
    if huge:
        raise ValueError(
            f"The {what} contains the constants {huge}, beyond float64's range "
            f"(±{sys.float_info.max:.3g}); no dtype can hold them. Rescale the equations."
        )


#: the deepest expression tree a definition takes: SymPy recurses once or more per
#: level (simplification, differentiation, printing), and Python's stack ends near
#: 1,000 frames, which a charge nested about 150 deep reaches in SymPy's own code
MAX_DEPTH = 100


def expression_depth(expr: sp.Basic) -> int:
    """The number of levels of ``expr``'s tree (a symbol: 1), found without recursion."""
    depth, level = 0, [expr]
    while level:
        depth += 1
        level = list({id(a): a for e in level for a in e.args}.values())
    return depth


def check_depth(expr: sp.Basic, what: str) -> None:
    """Reject an expression nested deeper than :data:`MAX_DEPTH` levels, before SymPy
    would fail on it with a RecursionError."""
    depth = expression_depth(expr)
    if depth > MAX_DEPTH:
        raise ValueError(
            f"The {what} is nested {depth} levels deep, more than the {MAX_DEPTH} that "
            "SymPy's recursive simplification, derivatives and printing handle; write it "
            "flatter (e.g. a sum or product instead of a chain of nested functions), or "
            "keep a part as an extra state (sn.State) updated each step."
        )


#: the names of the symbols that draw random numbers (noise, noise1, ..., xi)
DRAWS = frozenset({XI.name, *(noise_symbol(i).name for i in range(NOISE_STREAMS))})


def check_draws(unknown: Iterable[str], what: str, part: str) -> None:
    """The errors for draws where ``part`` takes none (``unknown``: the names it may not
    use): ``sn.xi`` in a discrete step, any draw in a threshold or reset level."""
    drawn = sorted(set(unknown) & DRAWS)
    if drawn and part in ("threshold", "v_reset"):
        raise ValueError(
            f"{what} uses {drawn}: a {part} cannot draw noise. Put the noise into the "
            "charge (V >= theta + sigma*noise is H - sigma*noise >= theta), or fire by "
            "escape noise with spike_probability=...; a fixed level is a number or a param."
        )
    if XI.name in drawn:
        raise ValueError(
            f"The {what} uses unknown symbols {drawn}: sn.xi is white noise of a differential "
            "equation, not of a discrete step; use sn.noise there (one standard normal draw "
            "per step), or write the ODE "
            "with sn.xi and build the neuron with Neuron.from_ode(dv, dt=..., "
            "method='euler')."
        )


def check_total_piecewise(expr: sp.Piecewise) -> None:
    """Reject a ``Piecewise`` without a final ``(expr, True)`` branch: it has no value
    where no condition holds (the kernels' printer and the torch reference's refuse it
    alike, with this message)."""
    if expr.args[-1].cond != sp.true:
        raise ValueError(
            f"Piecewise needs a final (expr, True) branch to be total: {expr}; add one, "
            "e.g. Piecewise((a, V < 0), (b, True))."
        )


def in_range(value: float, dtype: torch.dtype, what: str) -> float:
    """``value`` if ``dtype`` holds it, else a ``ValueError`` naming both (torch's own
    error, "value cannot be converted to type float without overflow", names neither)."""
    limit = torch.finfo(dtype).max
    if abs(value) > limit:
        raise ValueError(
            f"{what} = {value:g} is beyond the range of {str(dtype).removeprefix('torch.')} "
            f"(±{limit:.3g}), which this run computes in; use float64 inputs, or rescale."
        )
    return value


def dense(value: torch.Tensor, what: str) -> None:
    """Reject a sparse (or otherwise non-strided) tensor: the kernels and the reference
    read dense memory. Call where a tensor enters (params, v_init, states, weights)."""
    if value.layout != torch.strided:
        raise TypeError(
            f"{what} must be a dense tensor, got layout {value.layout}; convert it with .to_dense()"
        )


def _first_non_finite(name: str, seq: torch.Tensor) -> tuple[int, bool, str, int, float] | None:
    """(step, not V, name, flat neuron index, value) of the first non-finite entry."""
    flat = seq.detach().reshape(seq.shape[0], -1)
    bad = ~torch.isfinite(flat)
    if not bool(bad.any()):
        return None
    step = int(bad.any(dim=1).nonzero()[0, 0])
    neuron = int(bad[step].nonzero()[0, 0])
    return step, name != "V", name, neuron, float(flat[step, neuron])


def _unravel(flat_index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        flat_index, rest = divmod(flat_index, size)
        index.append(rest)
    return tuple(reversed(index))


def raise_if_not_finite(
    named_seqs: Iterable[tuple[str, torch.Tensor]], x_seq: torch.Tensor
) -> None:
    """:class:`NonFiniteError` at the earliest step at which a state sequence ([T, *shape],
    the input ``x_seq``'s layout) holds NaN or ±inf; V first on a tie."""
    found = [hit for name, seq in named_seqs if (hit := _first_non_finite(name, seq))]
    if not found:
        return
    step, _, name, flat_index, value = min(found)
    index = _unravel(flat_index, tuple(x_seq.shape[1:]))
    x = float(x_seq.detach().reshape(x_seq.shape[0], -1)[step, flat_index])
    raise NonFiniteError(
        f"{name} became {value} at step {step} in neuron {index} (check_finite=True); the "
        f"input X there was {x}. An exploding charge (an exponential or a square under a "
        "soft reset, a division by V) overflows the dtype: lower the input or the params, "
        "use a hard reset, a smaller dt or float64.",
        name,
        step,
        index,
    )
