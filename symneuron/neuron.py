"""Neuron: a validated symbolic definition of a spiking neuron.

All validation happens at construction, so every later stage (derivation,
code generation, compilation) can trust its input.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sympy as sp
from sympy.core.function import AppliedUndef

from . import surrogate as _surrogate

if TYPE_CHECKING:
    import torch

__all__ = ["V", "X", "H", "S", "State", "Neuron"]

#: State before charging, V[t-1].
V = sp.Symbol("V", real=True)
#: Input of this step, X[t].
X = sp.Symbol("X", real=True)
#: This step's charged potential H[t] (usable in a state's pre-spike update).
H = sp.Symbol("H", real=True)
#: This step's spike S[t] (usable in a state's on-spike reset).
S = sp.Symbol("S", real=True)


@dataclass(frozen=True)
class State:
    """An extra state variable W of a neuron (DESIGN.md §3).

    Parameters
    ----------
    update : sympy.Expr, optional
        The pre-spike update W̃ = g(V, W..., X, H; θ), written with the state
        symbols (their values before this step), :data:`V`, :data:`X`, :data:`H`
        and params. ``None`` keeps W̃ = W.
    on_spike : sympy.Expr, optional
        The reset W[t] = r(W̃..., S; θ), written with the state symbols (here
        meaning their updated values W̃), :data:`S` and params, e.g. ``W + b*S``.
        ``None`` keeps W[t] = W̃.
    init : float
        W[0] when no initial value is given.

    Examples
    --------
    >>> import sympy as sp, symneuron as sn
    >>> a = sp.Symbol("a")
    >>> adaptation = sn.State(update=0.9 * a, on_spike=a + 0.1 * sn.S)
    """

    update: sp.Expr | None = None
    on_spike: sp.Expr | None = None
    init: float = 0.0


_RESERVED = {"V", "X", "H", "S", "u"}
_FORBIDDEN_FUNCTIONS = (sp.Heaviside, sp.DiracDelta, sp.Derivative, sp.Integral, sp.Subs)
_COMPLEX_FUNCTIONS = (sp.re, sp.im, sp.arg, sp.conjugate)


def _param_name(key: Any) -> str:
    if isinstance(key, sp.Symbol):
        return key.name
    if isinstance(key, str):
        return key
    raise TypeError(f"Parameter keys must be sympy Symbols or names (str), got {key!r}")


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


def _level_key(level: float | sp.Expr | None) -> str:
    return sp.srepr(level) if isinstance(level, sp.Expr) else repr(level)


class Neuron:
    """A spiking neuron defined by its charge function H = f(V, X; θ).

    Parameters
    ----------
    charge : sympy.Expr
        f(V, X, params): the membrane potential after charging, from the state
        before charging ``V`` (:data:`symneuron.V`) and this step's input ``X``
        (:data:`symneuron.X`). Plain ``sympy.Symbol("V")``/``("X")`` work too.
    params : mapping, optional
        Each parameter symbol (or its name) to its default value.
    learnable : iterable, optional
        Parameters (symbols or names) that receive gradients.
    v_threshold : float or sympy.Expr
        Firing threshold: S = Θ(H − v_threshold), with Θ(0) = 1. An expression in the
        params (e.g. a param symbol listed in ``learnable``) makes it learnable.
    v_reset : float, sympy.Expr or None
        Hard reset value (a number or an expression in the params); ``None``
        selects the soft reset V = H − v_threshold·S.
    surrogate : Surrogate
        Surrogate whose derivative stands in for dΘ/du in the backward pass.
    detach_reset : bool
        Treat S as a constant inside the reset (no gradient through it).
    name : str, optional
        Used in reprs and kernel names.

    Examples
    --------
    >>> import sympy as sp, symneuron as sn
    >>> tau = sp.Symbol("tau", positive=True)
    >>> lif = sn.Neuron(sn.V + (sn.X - sn.V) / tau, params={tau: 2.0}, learnable=[tau])
    >>> sorted(lif.derivatives())
    ['dH/dV', 'dH/dX', 'dH/dtau']
    """

    def __init__(
        self,
        charge: sp.Expr,
        *,
        params: Mapping[Any, float] | None = None,
        learnable: Iterable[Any] = (),
        v_threshold: float | sp.Expr = 1.0,
        v_reset: float | sp.Expr | None = 0.0,
        surrogate: _surrogate.Surrogate | None = None,
        detach_reset: bool = False,
        name: str | None = None,
        states: Mapping[Any, State] | None = None,
    ) -> None:
        self.params: dict[str, float] = self._validate_params(params or {})
        self.symbols: dict[str, sp.Symbol] = {n: sp.Symbol(n, real=True) for n in self.params}
        self.state_symbols: dict[str, sp.Symbol] = self._validate_state_names(states or {})
        self.charge: sp.Expr = self._validate_charge(charge)
        self.v_threshold: float | sp.Expr = self._validate_level(
            v_threshold, "v_threshold", set(self.state_symbols)
        )
        self.v_reset: float | sp.Expr | None = (
            None if v_reset is None else self._validate_level(v_reset, "v_reset")
        )
        self.states: dict[str, State] = self._validate_states(states or {})
        self.learnable: tuple[str, ...] = self._validate_learnable(learnable)
        if surrogate is None:
            surrogate = _surrogate.Sigmoid(alpha=4.0)
        if not isinstance(surrogate, _surrogate.Surrogate):
            raise TypeError(
                f"surrogate must be a symneuron.surrogate.Surrogate, got {type(surrogate).__name__}"
            )
        self.surrogate = surrogate
        if not isinstance(detach_reset, bool):
            raise TypeError(f"detach_reset must be a bool, got {detach_reset!r}")
        self.detach_reset = detach_reset
        self.name = name or "Neuron"
        if not self.name.isidentifier():
            raise ValueError(
                f"name must be an identifier (used in kernel names), got {self.name!r}"
            )
        self._spec: Any = None
        self._key = self._hash()
        from .derive import partials

        self._partials: dict[str, sp.Expr] = partials(self)

    # -- validation -------------------------------------------------------
    @staticmethod
    def _validate_params(params: Mapping[Any, float]) -> dict[str, float]:
        if not isinstance(params, Mapping):
            raise TypeError(f"params must be a mapping of symbol -> default, got {type(params)}")
        out: dict[str, float] = {}
        for key, value in params.items():
            pname = _param_name(key)
            if pname in _RESERVED:
                raise ValueError(f"Parameter name {pname!r} is reserved; rename the parameter.")
            if pname in out:
                raise ValueError(f"Parameter {pname!r} is given twice.")
            out[pname] = finite_float(value, f"Default of parameter {pname!r}")
        return out

    def _validate_state_names(self, states: Mapping[Any, State]) -> dict[str, sp.Symbol]:
        if not isinstance(states, Mapping):
            raise TypeError(f"states must be a mapping of symbol -> sn.State, got {type(states)}")
        out: dict[str, sp.Symbol] = {}
        for key, state in states.items():
            wname = _param_name(key)
            if wname in _RESERVED or wname in self.params or wname in out:
                raise ValueError(
                    f"State name {wname!r} is reserved, a parameter's or given twice; rename it."
                )
            if not isinstance(state, State):
                raise TypeError(f"states[{wname!r}] must be a symneuron.State, got {state!r}")
            out[wname] = sp.Symbol(wname, real=True)
        return out

    def _validate_states(self, states: Mapping[Any, State]) -> dict[str, State]:
        out: dict[str, State] = {}
        names = set(self.state_symbols)
        for key, state in states.items():
            wname = _param_name(key)
            symbol = self.state_symbols[wname]
            update = symbol if state.update is None else state.update
            on_spike = symbol if state.on_spike is None else state.on_spike
            out[wname] = State(
                update=self._validate_expr(
                    update, f"update of state {wname!r}", names | {"V", "X", "H"}
                ),
                on_spike=self._validate_expr(
                    on_spike, f"on_spike of state {wname!r}", names | {"S"}
                ),
                init=finite_float(state.init, f"init of state {wname!r}"),
            )
        return out

    def _validate_expr(self, expr: Any, what: str, allowed: set[str]) -> sp.Expr:
        """``expr`` in the params and the ``allowed`` names, canonical symbols, checked."""
        if isinstance(expr, (int, float)):
            expr = sp.Float(expr)
        if isinstance(expr, str) or not isinstance(expr, sp.Expr):
            raise TypeError(f"The {what} must be a SymPy expression, got {type(expr).__name__}")
        names = {s.name for s in expr.free_symbols}
        unknown = sorted(names - set(self.params) - allowed)
        if unknown:
            raise ValueError(
                f"The {what} uses unknown symbols {unknown}; it may use the params and "
                f"{sorted(allowed)}."
            )
        out = expr.xreplace({s: self._canonical(s.name) for s in expr.free_symbols})
        check_expression(out, what)
        return out

    def _validate_charge(self, charge: Any) -> sp.Expr:
        if isinstance(charge, str) or not isinstance(charge, sp.Expr):
            raise TypeError(f"charge must be a SymPy expression, got {type(charge).__name__}")
        names = {s.name for s in charge.free_symbols}
        unknown = sorted(names - set(self.params) - {"V", "X"} - set(self.state_symbols))
        if unknown:
            raise ValueError(
                f"The charge uses unknown symbols {unknown}; give each a default in "
                f"params={{...}} or replace it by a number."
            )
        for needed in ("V", "X"):
            if needed not in names:
                raise ValueError(
                    f"The charge does not depend on {needed}; H = f(V, X, params) must use "
                    "both the previous state V and the input X."
                )
        canon = {s: self._canonical(s.name) for s in charge.free_symbols}
        expr = charge.xreplace(canon)
        check_expression(expr, "charge")
        return expr

    def _validate_level(
        self, value: Any, what: str, states: set[str] | None = None
    ) -> float | sp.Expr:
        """A threshold or reset level: a finite number, or an expression in the params
        (and, for the threshold, the states' updated values)."""
        if not isinstance(value, sp.Basic) or value.is_number:
            return finite_float(value, what)
        if not isinstance(value, sp.Expr):
            raise TypeError(f"{what} must be a number or a SymPy expression, got {value!r}")
        names = {s.name for s in value.free_symbols}
        unknown = sorted(names - set(self.params) - (states or set()))
        if unknown:
            raise ValueError(
                f"{what} uses {unknown}, which are not params; a threshold or reset level may "
                "use only parameters (give each a default in params={...})"
                + (" and the states" if states else "")
                + "."
            )
        expr = value.xreplace({s: self._canonical(s.name) for s in value.free_symbols})
        check_expression(expr, what)
        return expr

    def _canonical(self, name: str) -> sp.Symbol:
        fixed = {"V": V, "X": X, "H": H, "S": S}
        return fixed.get(name) or self.state_symbols.get(name) or self.symbols[name]

    def _validate_learnable(self, learnable: Iterable[Any]) -> tuple[str, ...]:
        if isinstance(learnable, (str, sp.Symbol)):
            learnable = [learnable]
        out: list[str] = []
        used = {s.name for s in self.charge.free_symbols}
        for level in (self.v_threshold, self.v_reset):
            if isinstance(level, sp.Expr):
                used |= {s.name for s in level.free_symbols}
        for state in self.states.values():
            for expr in (state.update, state.on_spike):
                used |= {s.name for s in expr.free_symbols}  # type: ignore[union-attr]
        for key in learnable:
            pname = _param_name(key)
            if pname not in self.params:
                raise ValueError(
                    f"Learnable parameter {pname!r} is not in params; add it with a default."
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

    # -- derived views ---------------------------------------------------
    @property
    def soft_reset(self) -> bool:
        return self.v_reset is None

    def spec(self) -> Any:
        """The :class:`symneuron.derive.KernelSpec` (derived once, then cached)."""
        if self._spec is None:
            from .derive import derive

            self._spec = derive(self)
        return self._spec

    def derivatives(self) -> dict[str, sp.Expr]:
        """The derived partials of the charge, keyed ``'dH/dV'``, ``'dH/dX'``, ``'dH/d<θ>'``."""
        return dict(self._partials)

    def source(self, backend: str = "cuda", dtype: torch.dtype | str = "float32") -> str:
        """Generated kernel source (forward and backward) for ``backend`` and ``dtype``."""
        from .codegen import render_source

        return render_source(self.spec(), backend, dtype)

    def key(self) -> str:
        """A stable hash of the definition (used to name and cache kernels)."""
        return self._key

    def _hash(self) -> str:
        states = [
            (n, sp.srepr(s.update), sp.srepr(s.on_spike), s.init) for n, s in self.states.items()
        ]
        text = repr(
            (
                sp.srepr(self.charge),
                sorted(self.params.items()),
                self.learnable,
                _level_key(self.v_threshold),
                _level_key(self.v_reset),
                sp.srepr(self.surrogate.derivative()),
                self.detach_reset,
                self.name,
                *([states] if states else []),
            )
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        reset = "soft" if self.soft_reset else f"hard(v_reset={self.v_reset})"
        return (
            f"Neuron({self.name}: H = {self.charge}, params={self.params}, "
            f"learnable={list(self.learnable)}, v_threshold={self.v_threshold}, {reset}, "
            f"surrogate={self.surrogate.name}, detach_reset={self.detach_reset}"
            + "".join(
                f", {n}: ~{s.update}, on spike {s.on_spike}, init {s.init}"
                for n, s in self.states.items()
            )
            + ")"
        )
