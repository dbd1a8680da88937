"""Input checks shared by every stage that takes user input: names, numbers, expressions.

Each raises ``TypeError`` or ``ValueError`` with a message that names the problem
and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import sympy as sp
from sympy.core.function import AppliedUndef

__all__ = ["param_name", "named", "finite_float", "check_expression"]

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


def finite_float(value: Any, what: str) -> float:
    """``value`` as a float; TypeError if it is not a real number, ValueError if not finite."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a real number, got {value!r}") from None
    if not math.isfinite(out):
        raise ValueError(f"{what} must be finite, got {out}.")
    return out


def _check_real(expr: sp.Expr, what: str) -> None:
    if expr.has(sp.I) or expr.has(*_COMPLEX_FUNCTIONS):
        raise ValueError(f"The {what} is complex or not real ({expr}); symneuron needs real math.")
    for number in expr.atoms(sp.Number):
        if number.is_real is False:
            raise ValueError(f"The {what} contains the non-real number {number}.")


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
