"""The definition stage: a neuron as validated, immutable SymPy expressions.

:class:`Definition` holds what a user wrote (charge, params, learnable params,
threshold, reset, surrogate, extra states) after checking it, and nothing
derived from it: this module imports no later stage. All validation happens at
construction, so derivation, code generation and compilation can trust their
input; a definition cannot be changed afterwards (build a new one with
:meth:`Definition.replace`), so its :meth:`~Definition.key`, which names its
kernels and cache entries, cannot go stale. :class:`symneuron.Neuron` is this
class plus its derived views (partials, kernel spec, generated source).
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import sympy as sp

from . import assumptions as _assumptions
from . import stochastic as _stochastic
from . import surrogate as _surrogate
from . import validate as _validate
from .state import State, check_crossing_states, check_on_spike, check_uses_x, firing_mode
from .symbols import RESERVED, H, S, V, X, allowed_in, reserved_symbol
from .validate import check_expression, finite_float, named

__all__ = ["V", "X", "H", "S", "State", "Definition", "find", "inline_stages"]


def _user_expressions(given: Mapping[str, Any]) -> list[Any]:
    """The parameters' keys and the expressions as the user wrote them: their symbols
    carry the assumptions SymPy simplified with."""
    states = given["states"] or {}
    parts = [e for st in states.values() for e in (st.update, st.on_spike)]
    keys = list(given["params"] or {})
    stages = [e for _, e in given["stages"]] + [given["spike_probability"]]
    return [*keys, given["charge"], given["v_threshold"], given["v_reset"], *parts, *stages]


def _level_key(level: float | sp.Expr | None) -> str:
    return sp.srepr(level) if isinstance(level, sp.Expr) else repr(level)


class Definition:
    """A spiking neuron defined by its charge function H = f(V, X; θ).

    Users build :class:`symneuron.Neuron`, which is this class plus its derived
    views; the parameters are documented there. Instances are immutable.
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
        firing: str = "level",
        v_init: float | None = None,
        stages: Iterable[tuple[Any, sp.Expr]] = (),
        spike_probability: sp.Expr | None = None,
    ) -> None:
        stages = tuple(stages)
        given = dict(
            charge=charge,
            params=params,
            learnable=learnable,
            v_threshold=v_threshold,
            v_reset=v_reset,
            surrogate=surrogate,
            detach_reset=detach_reset,
            name=name,
            states=states,
            firing=firing,
            v_init=v_init,
            stages=stages,
            spike_probability=spike_probability,
        )
        params_ = self._validate_params(params)
        set_ = object.__setattr__
        set_(self, "params", MappingProxyType(params_))
        set_(self, "symbols", MappingProxyType({n: sp.Symbol(n, real=True) for n in params_}))
        set_(self, "state_symbols", MappingProxyType(self._validate_state_names(states)))
        set_(self, "stages", ())
        set_(self, "stages", self._validate_stages(stages))
        set_(self, "step_charge", self._validate_expr(charge, "charge", "charge"))
        set_(self, "v_threshold", self._validate_level(v_threshold, "v_threshold", "threshold"))
        set_(self, "firing", firing_mode(firing, v_reset, spike_probability))
        set_(self, "spike_probability", self._validate_probability(spike_probability))
        if self.firing == "crossing":
            v_reset = None
        level = None if v_reset is None else self._validate_level(v_reset, "v_reset", "v_reset")
        set_(self, "v_reset", level)
        set_(self, "v_init", None if v_init is None else finite_float(v_init, "v_init"))
        set_(self, "states", MappingProxyType(self._validate_states(states)))
        assumptions = _assumptions.param_assumptions(self.params, _user_expressions(given))
        for pname, kinds in assumptions.items():
            _assumptions.check_assumption(pname, kinds, self.params[pname])
        set_(self, "param_assumptions", MappingProxyType(assumptions))
        check_crossing_states(self.firing, self.states, self.state_symbols)
        updates = [st.update for st in self.states.values() if st.update is not None]
        check_uses_x([self.step_charge, *updates, *(e for _, e in self.stages)])
        for what, e in [("charge", self.step_charge), *(("state update", u) for u in updates)]:
            _stochastic.check_linear_noise(e, what)
        set_(self, "noise_streams", _stochastic.noise_streams([self.step_charge, *updates]))
        set_(self, "learnable", _validate.learnable_names(learnable, self.params, self._used()))
        set_(self, "surrogate", _surrogate.or_default(surrogate))
        if not isinstance(detach_reset, bool):
            raise TypeError(f"detach_reset must be a bool, got {detach_reset!r}")
        set_(self, "detach_reset", detach_reset)
        set_(self, "name", _validate.identifier(name, "Neuron"))
        set_(self, "_given", given)
        set_(self, "_key", self._hash())
        _LIVE.setdefault(self._key, self)

    params: Mapping[str, float]
    """Each parameter's name -> default value."""
    symbols: Mapping[str, sp.Symbol]
    """Each parameter's name -> its symbol in the expressions."""
    state_symbols: Mapping[str, sp.Symbol]
    """Each extra state's name -> its symbol."""
    step_charge: sp.Expr
    """H as the kernels evaluate it: it may read the :attr:`stages`."""
    v_threshold: float | sp.Expr
    v_reset: float | sp.Expr | None
    firing: str
    """``"level"`` (S = Θ(H − θ), then the reset), ``"crossing"`` (S = 1 when H
    crosses θ from below, no reset) or ``"escape"`` (S = [u < p(H)], u uniform)."""
    spike_probability: sp.Expr | None
    """p(H) of ``firing="escape"`` (None otherwise)."""
    noise_streams: tuple[int, ...]
    """The noise streams the charge and the updates draw from (``noise``: 0)."""
    param_assumptions: Mapping[str, tuple[str, ...]]
    """Each parameter whose symbol carries SymPy assumptions that narrow its value ->
    those assumptions (``{"tau": ("positive",)}``); a value given at run time must
    satisfy them (:func:`symneuron.assumptions.check_assumption`)."""
    v_init: float | None
    """V[0] when ``simulate`` gets no ``v_init`` (None: v_reset, or 0)."""
    states: Mapping[str, State]
    """Each extra state's name -> its validated :class:`State`."""
    stages: tuple[tuple[sp.Symbol, sp.Expr], ...]
    """Named intermediate values of the step, ``(symbol, expr)`` in evaluation order (an
    integrator's stages, :meth:`symneuron.Neuron.from_ode` with ``rk2``/``rk4``): each
    expression reads V, X, the states, the params and earlier stages; the charge and the
    state updates may read them."""
    learnable: tuple[str, ...]
    surrogate: _surrogate.Surrogate
    detach_reset: bool
    name: str
    _given: dict[str, Any]
    _key: str

    # -- immutability -----------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"A neuron is immutable (its key names its compiled kernels); build a changed "
            f"copy with neuron.replace({name}=...)."
        )

    def __delattr__(self, name: str) -> None:
        raise AttributeError("A neuron is immutable; build a changed copy with neuron.replace().")

    def replace(self, **changes: Any) -> Definition:
        """A new neuron of the same class with some constructor arguments changed.

        >>> import symneuron as sn
        >>> soft = sn.models.LIF().replace(v_reset=None)
        """
        unknown = sorted(set(changes) - set(self._given))
        if unknown:
            raise TypeError(f"replace() got unknown arguments {unknown}; use {sorted(self._given)}")
        return type(self)(**{**self._given, **changes})

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self._given))

    def __copy__(self) -> Definition:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Definition:
        return self

    # -- validation -------------------------------------------------------
    @staticmethod
    def _validate_params(params: Mapping[Any, float] | None) -> dict[str, float]:
        out = named(params, "parameter", hint=" (the default)")
        for pname, value in out.items():
            _validate.not_reserved(pname, "Parameter")
            out[pname] = finite_float(value, f"Default of parameter {pname!r}")
        return out

    def _validate_state_names(self, states: Mapping[Any, State] | None) -> dict[str, sp.Symbol]:
        out: dict[str, sp.Symbol] = {}
        for wname, state in named(states, "state", hint=" (an sn.State)").items():
            _validate.not_reserved(wname, "State", self.params)
            if not isinstance(state, State):
                raise TypeError(f"states[{wname!r}] must be a symneuron.State, got {state!r}")
            out[wname] = sp.Symbol(wname, real=True)
        return out

    def _validate_states(self, states: Mapping[Any, State] | None) -> dict[str, State]:
        out: dict[str, State] = {}
        for wname, state in named(states, "state").items():
            symbol = self.state_symbols[wname]
            update = symbol if state.update is None else state.update
            on_spike = symbol if state.on_spike is None else state.on_spike
            rule = self._validate_expr(on_spike, f"on_spike of state {wname!r}", "on_spike")
            check_on_spike(wname, symbol, rule)
            out[wname] = State(
                update=self._validate_expr(update, f"update of state {wname!r}", "update"),
                on_spike=rule,
                init=finite_float(state.init, f"init of state {wname!r}"),
            )
        return out

    def _validate_stages(self, stages: tuple[Any, ...]) -> tuple[tuple[sp.Symbol, sp.Expr], ...]:
        """Each stage as (its symbol, its checked expression), the names unique and not a
        param's, a state's or a reserved symbol's."""
        out: list[tuple[sp.Symbol, sp.Expr]] = []
        for entry in stages:
            if not (isinstance(entry, tuple) and len(entry) == 2):
                raise TypeError(f"each stage must be a (name, expression) pair, got {entry!r}")
            name = str(getattr(entry[0], "name", entry[0]))
            if not name.isidentifier() or name in {s.name for s, _ in out}:
                raise ValueError(f"stage name {name!r} must be a new identifier; rename it.")
            _validate.not_reserved(name, "Stage", [*self.params, *self.state_symbols])
            expr = self._validate_expr(entry[1], f"stage {name}", "ode")
            out.append((sp.Symbol(name, real=True), expr))
            object.__setattr__(self, "stages", tuple(out))  # later stages may read it
        return tuple(out)

    def _validate_expr(self, expr: Any, what: str, part: str) -> sp.Expr:
        """``expr`` in the params, the states and ``part``'s reserved symbols, with the
        canonical symbols, checked."""
        if isinstance(expr, (int, float)) and part != "charge":
            expr = sp.Float(expr)
        if isinstance(expr, str) or not isinstance(expr, sp.Expr):
            raise TypeError(f"The {what} must be a SymPy expression, got {type(expr).__name__}")
        names = {s.name for s in expr.free_symbols}
        allowed = allowed_in(part) | set(self.state_symbols)
        if part in ("charge", "update", "ode"):
            allowed |= {s.name for s, _ in self.stages}
        unknown = sorted(names - set(self.params) - allowed)
        _validate.check_draws(unknown, what, part)
        if unknown and part == "charge":
            raise ValueError(
                f"The charge uses unknown symbols {unknown}; give each a default in "
                "params={...} or replace it by a number."
            )
        if unknown:
            raise ValueError(
                f"The {what} uses unknown symbols {unknown}; it may use the params and "
                f"{sorted(allowed)}."
            )
        _validate.check_depth(expr, what)
        _assumptions.warn_narrowed(expr, what, {*RESERVED, *self.state_symbols})
        out = expr.xreplace({s: self._canonical(s.name) for s in expr.free_symbols})
        check_expression(out, what)
        if part == "charge":
            _validate.check_depends_on_v(expr, out, V)
        return out

    def _validate_level(self, value: Any, what: str, part: str) -> float | sp.Expr:
        """A threshold or reset level: a finite number, or an expression in the params
        (and, for the threshold, the states' updated values)."""
        if not isinstance(value, sp.Basic) or value.is_number:
            return finite_float(value, what)
        if not isinstance(value, sp.Expr):
            raise TypeError(f"{what} must be a number or a SymPy expression, got {value!r}")
        states = set(self.state_symbols) if part == "threshold" else set()
        names = {s.name for s in value.free_symbols}
        unknown = sorted(names - set(self.params) - states - allowed_in(part))
        _validate.check_draws(unknown, what, part)
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

    def _validate_probability(self, p: Any) -> sp.Expr | None:
        """The escape-noise probability p(H), checked (in [0, 1] at the defaults)."""
        out = None if p is None else self._validate_expr(p, "spike_probability", "probability")
        return out if out is None else _stochastic.check_probability(out, self.params, self.symbols)

    @property
    def draws(self) -> bool:
        """Whether the neuron draws random numbers (noise or escape firing)."""
        return bool(self.noise_streams) or self.firing == "escape"

    def _canonical(self, name: str) -> sp.Symbol:
        fixed = reserved_symbol(name) or self.state_symbols.get(name)
        return fixed or self.symbols.get(name) or next(s for s, _ in self.stages if s.name == name)

    def _used(self) -> set[str]:
        """The names of the symbols the charge, the levels and the states use."""
        exprs = [self.step_charge, self.v_threshold, self.v_reset, self.spike_probability]
        exprs += [e for st in self.states.values() for e in (st.update, st.on_spike)]
        exprs += [e for _, e in self.stages]
        return {s.name for e in exprs if isinstance(e, sp.Expr) for s in e.free_symbols}

    @property
    def charge(self) -> sp.Expr:
        """H as a user reads it: :attr:`step_charge` through :meth:`view`."""
        return self.view(self.step_charge)

    def view(self, expr: sp.Expr) -> sp.Expr:
        """``expr`` as a user reads it (:class:`~symneuron.Neuron` substitutes stages)."""
        return expr

    def inline_stages(self, expr: sp.Expr) -> sp.Expr:
        """``expr`` with the stages substituted (:func:`inline_stages`)."""
        return inline_stages(self.stages, expr)

    # -- identity -----------------------------------------------------------
    @property
    def soft_reset(self) -> bool:
        """V ← H − θ·S after a spike (``v_reset=None`` with level or escape firing)."""
        return self.v_reset is None and self.firing != "crossing"

    @property
    def v_start(self) -> float | sp.Expr:
        """V[0] when no ``v_init`` is given: ``v_init``, else v_reset (0 without one)."""
        if self.v_init is not None:
            return self.v_init
        return 0.0 if self.v_reset is None else self.v_reset

    def key(self) -> str:
        """A stable hash of the definition (used to name and cache kernels)."""
        return self._key

    def _hash(self) -> str:
        states = [
            (n, sp.srepr(s.update), sp.srepr(s.on_spike), s.init) for n, s in self.states.items()
        ]
        stages = self.stages
        text = repr(
            (
                sp.srepr(self.step_charge),
                sorted(self.params.items()),
                self.learnable,
                _level_key(self.v_threshold),
                _level_key(self.v_reset),
                sp.srepr(self.surrogate.derivative()),
                self.detach_reset,
                self.name,
                *([states] if states else []),
                *([("firing", self.firing)] if self.firing != "level" else []),
                *([("p", sp.srepr(self.spike_probability))] if self.spike_probability else []),
                *([("v_init", self.v_init)] if self.v_init is not None else []),
                *([("stages", [(s.name, sp.srepr(e)) for s, e in stages])] if stages else []),
            )
        )
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Definition) and other.key() == self.key()

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        reset = "soft" if self.soft_reset else f"hard(v_reset={self.v_reset})"
        reset = "crossing, no reset" if self.firing == "crossing" else reset
        if self.firing == "escape":
            reset = f"escape p(H) = {self.spike_probability}, {reset}"
        return (
            f"{type(self).__name__}({self.name}: H = {self.charge}, params={self.params}, "
            f"learnable={list(self.learnable)}, v_threshold={self.v_threshold}, {reset}, "
            f"surrogate={self.surrogate.name}, detach_reset={self.detach_reset}"
            + "".join(
                f", {n}: ~{self.view(s.update)}, on spike {s.on_spike}, init {s.init}"
                for n, s in self.states.items()
            )
            + ")"
        )


def inline_stages(stages: Iterable[tuple[sp.Symbol, sp.Expr]], expr: sp.Expr) -> sp.Expr:
    """``expr`` with the ``stages`` (``(symbol, expr)`` in evaluation order) substituted:
    each stage's expansion is built once from the earlier ones and shared wherever it is
    read, so the work follows the expressions' graph, not their printed size."""
    expanded: dict[sp.Basic, sp.Basic] = {}
    for symbol, stage in stages:
        expanded[symbol] = stage.xreplace(expanded)
    return expr.xreplace(expanded) if expanded else expr


#: Every live definition by key (weakly): custom ops, whose arguments must be plain
#: types, name a neuron by its key and find it here.
_LIVE: weakref.WeakValueDictionary[str, Definition] = weakref.WeakValueDictionary()


def find(key: str) -> Definition | None:
    """The live definition whose :meth:`Definition.key` is ``key``, if any."""
    return _LIVE.get(key)


def _rebuild(cls: type[Definition], given: dict[str, Any]) -> Definition:
    """Unpickle: construct again from the arguments (validation included)."""
    return cls(**given)
