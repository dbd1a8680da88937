"""SymPy assumptions on a neuron's symbols (stage 0: imports nothing of symneuron).

SymPy uses a symbol's assumptions as an expression is built (``Abs(V)`` is ``V`` for a
positive V, ``sqrt(tau**2)`` is ``tau`` for a positive tau, ``sin(pi*k)`` is 0 for an
integer k), and that cannot be undone. So a variable that takes any real value at run
time (V, X, H, S, a state) must carry none (:func:`warn_narrowed`), and a parameter's
value must satisfy its symbol's (:func:`check_assumption`, cheap enough for every run:
plain float arithmetic on the names :func:`param_assumptions` found at construction; a
tensor of values is checked elementwise by torch, once per tensor and version and only
where its values can be read: :func:`check_values`).
"""

from __future__ import annotations

import math
import operator
import warnings
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import sympy as sp
import torch
from torch.utils.weak import WeakIdKeyDictionary

__all__ = [
    "symbol_assumptions",
    "param_assumptions",
    "check_assumption",
    "check_values",
    "tensor_version",
    "narrowed_symbols",
    "warn_narrowed",
]


def _is_integer(value: float) -> bool:
    return float(value).is_integer()


def _is_noninteger(value: float) -> bool:
    return not _is_integer(value)


def _is_even(value: float) -> bool:
    return _is_integer(value) and value % 2 == 0


def _is_odd(value: float) -> bool:
    return _is_integer(value) and value % 2 == 1


def _is_prime(value: float) -> bool:
    return _is_integer(value) and value > 1 and bool(sp.isprime(int(value)))


def _is_composite(value: float) -> bool:
    return _is_integer(value) and value > 1 and not sp.isprime(int(value))


#: What each assumption a parameter's symbol may carry says of a float value. A float is
#: always rational, so ``rational`` asks nothing; SymPy takes ``irrational`` to be nonzero,
#: which is what a float can respect of it.
_HOLDS: dict[str, Callable[[float], bool]] = {
    "positive": partial(operator.lt, 0.0),
    "negative": partial(operator.gt, 0.0),
    "nonnegative": partial(operator.le, 0.0),
    "nonpositive": partial(operator.ge, 0.0),
    "zero": partial(operator.eq, 0.0),
    "nonzero": partial(operator.ne, 0.0),
    "integer": _is_integer,
    "noninteger": _is_noninteger,
    "even": _is_even,
    "odd": _is_odd,
    "prime": _is_prime,
    "composite": _is_composite,
}


def _integer_elements(values: torch.Tensor) -> torch.Tensor:
    return values == values.round()


def _noninteger_elements(values: torch.Tensor) -> torch.Tensor:
    return values != values.round()


def _even_elements(values: torch.Tensor) -> torch.Tensor:
    return _integer_elements(values) & (values % 2 == 0)


def _odd_elements(values: torch.Tensor) -> torch.Tensor:
    return _integer_elements(values) & (values % 2 == 1)


#: :data:`_HOLDS` elementwise on a tensor of values (torch ops, no Python loop); the
#: assumptions missing here (prime, composite) are asked of each value by :data:`_HOLDS`.
_HOLDS_ELEMENTWISE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "positive": partial(torch.gt, other=0.0),
    "negative": partial(torch.lt, other=0.0),
    "nonnegative": partial(torch.ge, other=0.0),
    "nonpositive": partial(torch.le, other=0.0),
    "zero": partial(torch.eq, other=0.0),
    "nonzero": partial(torch.ne, other=0.0),
    "integer": _integer_elements,
    "noninteger": _noninteger_elements,
    "even": _even_elements,
    "odd": _odd_elements,
}
#: The assumption given as False that a real value can be checked against, by its name.
_NEGATED = {
    "positive": "nonpositive",
    "negative": "nonnegative",
    "nonnegative": "negative",
    "nonpositive": "positive",
    "zero": "nonzero",
    "nonzero": "zero",
    "integer": "noninteger",
}
_IMPLIED = {"irrational": "nonzero"}


def symbol_assumptions(symbol: sp.Symbol) -> tuple[str, ...]:
    """The assumptions given to ``symbol`` that narrow a real value (``positive``,
    ``integer``, ...; one given False as its negation, ``positive=False`` as
    ``nonpositive``), in :data:`_HOLDS`' names."""
    given = getattr(symbol, "_assumptions_orig", None) or symbol.assumptions0
    out = []
    for name, value in given.items():
        kind = (name if name in _HOLDS else _IMPLIED.get(name)) if value else _NEGATED.get(name)
        if value is not None and kind is not None and kind not in out:
            out.append(kind)
    return tuple(sorted(out, key=list(_HOLDS).index))


def param_assumptions(names: Iterable[str], sources: Iterable[Any]) -> dict[str, tuple[str, ...]]:
    """Each parameter in ``names`` whose symbols in ``sources`` (symbols, expressions) carry
    narrowing assumptions -> those assumptions (the union over its symbols)."""
    wanted = set(names)
    out: dict[str, tuple[str, ...]] = {}
    for source in sources:
        symbols = [source] if isinstance(source, sp.Symbol) else getattr(source, "free_symbols", ())
        for symbol in symbols:
            if isinstance(symbol, sp.Symbol) and symbol.name in wanted:
                found = (*out.get(symbol.name, ()), *symbol_assumptions(symbol))
                if found:
                    out[symbol.name] = tuple(sorted(set(found), key=list(_HOLDS).index))
    return out


def check_assumption(
    name: str,
    assumptions: Iterable[str],
    value: float | torch.Tensor,
    what: str = "parameter",
) -> None:
    """Refuse a ``value`` of parameter ``name`` that contradicts one of its symbol's
    ``assumptions`` (names from :func:`symbol_assumptions`, as a neuron keeps them in
    ``param_assumptions``). A float: plain float arithmetic, no SymPy, cheap enough for
    every run. A tensor: each of its values (torch ops; one value read back for one
    element), the first that contradicts an assumption named in the error.

    SymPy has already simplified the equations with the assumptions (``sqrt(tau**2)`` is
    ``tau`` for a positive tau, ``sin(pi*k)`` is 0 for an integer k), so such a value
    would silently run a model other than the one written.
    """
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            _check_elements(name, assumptions, value, what)
            return
        value = float(value.detach())
    if math.isnan(value):  # (no assumption's: NaN is the finiteness check's to name)
        return
    for assumption in assumptions:
        if not _HOLDS[assumption](value):
            raise ValueError(
                f"{what.capitalize()} {name!r} is declared {assumption} (an assumption of "
                f"its SymPy symbol), but its value is {value!r}. SymPy has already "
                "simplified the equations with that assumption, so this value would run a "
                f"different model: give a {assumption} value, or declare the symbol without "
                f"the assumption (sympy.Symbol({name!r}, real=True))."
            )


#: each tensor whose values :func:`check_values` found to hold -> its version counter
#: then (weakly keyed by identity: a tensor freed is forgotten)
_CHECKED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def check_values(
    name: str,
    assumptions: Iterable[str],
    value: float | torch.Tensor,
    what: str = "parameter",
) -> bool:
    """:func:`check_assumption` where a value enters (``sn.simulate``, a layer's
    construction and calls), one policy for floats and tensors.

    A float is checked every time (float arithmetic). A tensor is checked once per
    tensor and version: reading its values back is a device synchronisation, so a tensor
    passed again unchanged (a layer's parameter between optimizer steps, the same tensor
    given to ``simulate`` each call) is not read again; one changed in place or replaced
    is. Where values cannot be read, a tensor is not checked: while ``torch.compile``
    traces, under a functorch transform (``vmap``, ``grad``), inside a CUDA graph capture
    (a read would break it) and on the ``meta`` device. A layer checks its own tensors
    at its next call outside those; a tensor handed to a compiled or captured
    ``simulate`` is the caller's to check (an eager call with it checks it once).

    Returns whether the value is known to hold (False: not read, as above).
    """
    if not isinstance(value, torch.Tensor):
        check_assumption(name, assumptions, value, what)
        return True
    if not _readable(value):
        return False
    version = tensor_version(value)
    if version >= 0 and _CHECKED.get(value) == version:
        return True
    check_assumption(name, assumptions, value, what)
    if version >= 0:
        _CHECKED[value] = version
    return True


def _readable(value: torch.Tensor) -> bool:
    """Whether ``value``'s elements can be read on the host now (see :func:`check_values`)."""
    if torch.compiler.is_compiling() or value.is_meta:
        return False
    if torch._C._are_functorch_transforms_active():
        return False
    return not (value.is_cuda and torch.cuda.is_current_stream_capturing())


def tensor_version(tensor: Any) -> int:
    """The tensor's version counter (bumped by every in-place change); -1 for an
    inference tensor, which keeps none (checked each time)."""
    try:
        return tensor._version
    except RuntimeError:
        return -1


def _check_elements(name: str, assumptions: Iterable[str], values: torch.Tensor, what: str) -> None:
    """:func:`check_assumption` of each of ``values``: the error names the first value
    (in the tensor's order) that contradicts an assumption."""
    flat = values.detach().reshape(-1)
    flat = flat[~torch.isnan(flat)] if flat.is_floating_point() else flat
    for assumption in assumptions:
        holds = _HOLDS_ELEMENTWISE.get(assumption)
        if holds is None:  # (prime, composite: no torch op asks it)
            bad = [v for v in flat.tolist() if not _HOLDS[assumption](v)]
            if bad:
                check_assumption(name, (assumption,), bad[0], what)
        else:
            ok = holds(flat)
            if not bool(ok.all()):
                check_assumption(name, (assumption,), float(flat[~ok][0]), what)


#: assumptions a real symbol does not carry by itself, which let SymPy rewrite an
#: expression as it is built (Abs(V) -> V for a positive V)
_NARROWING = (
    "positive",
    "negative",
    "nonnegative",
    "nonpositive",
    "zero",
    "nonzero",
    "integer",
    "rational",
    "irrational",
    "even",
    "odd",
    "prime",
    "composite",
)


def narrowed_symbols(expr: sp.Basic, names: Iterable[str]) -> dict[str, list[str]]:
    """The symbols of ``expr`` named in ``names`` that carry narrowing assumptions
    (``Symbol("V", positive=True)``), each with those assumptions."""
    wanted = set(names)
    out: dict[str, list[str]] = {}
    for symbol in expr.free_symbols:
        if isinstance(symbol, sp.Symbol) and symbol.name in wanted:
            given = getattr(symbol, "_assumptions_orig", None) or symbol.assumptions0
            narrowing = [a for a in _NARROWING if given.get(a) is True]
            if narrowing:
                out[symbol.name] = narrowing
    return out


def warn_narrowed(expr: sp.Expr, what: str, names: Iterable[str]) -> None:
    """Warn when a symbol that takes any real value at run time (V, X, H, S, a state)
    carries assumptions such as ``positive=True``: SymPy has already used them on the
    user's expression (``Abs(V)`` -> ``V``), which cannot be undone."""
    narrowed = narrowed_symbols(expr, names)
    if narrowed:
        warnings.warn(
            f"The {what} uses symbols with SymPy assumptions {narrowed}; SymPy may already "
            "have simplified it with them (Abs(V) -> V, sqrt(V**2) -> V), which is wrong "
            "when the value has another sign at run time. Use sn.V, sn.X, ... or "
            "sympy.Symbol(name, real=True).",
            UserWarning,
            stacklevel=5,
        )
