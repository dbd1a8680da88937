"""EventProp's derivation: the adjoint of an ODE neuron with jumps at its spikes.

A neuron built by :meth:`symneuron.Neuron.from_ode` is a hybrid system (docs/eventprop.md,
docs/eventprop.md): states x = (V, W...), dynamics dx/dt = f(x; θ) between events, a
spike when g(x) = V − ϑ(x; θ) reaches 0 from below, the reset x⁺ = h(x⁻) (``v_reset``
or the soft reset for V, each state's ``on_spike`` with S = 1), and a spike input of
weight w that jumps its target, x ← m(x, w). With λ = ∂L/∂x (λ(T) = 0, run backward)
this module derives, with SymPy, every expression the exact gradient needs:

    dλ/dt = −Jᵀλ,  J = ∂f/∂x                                     between events
    ġ = (∂g/∂x)·f,  saltation = λ·(f(h(x)) − (∂h/∂x) f(x))
    λ⁻ = (∂h/∂x)ᵀλ⁺ + (∂g/∂x)ᵀ (saltation + B)/ġ⁻                   at a spike, on g = 0
    Q = λ·(f(m(x, w)) − (∂m/∂x) f(x))                             at an arrival
    dL/dw += λ·∂m/∂w,  dL/dd −= Q,  B_source += Q
    dL/dθ = ∫ λ·∂f/∂θ dt + Σ_spikes [λ⁺·∂h/∂θ + (∂g/∂θ)(saltation + B)/ġ⁻]

B is the spike's coupling, Σ Q over its arrivals − ∂ℓ_p/∂t_k (a symbol here). The
states left in the jump once g = 0 is substituted (V = ϑ) are what a forward must
store per spike. What has no event-time derivative is refused here, at build time,
with the reason (:class:`EventPropError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sympy as sp

from ..definition import Definition, S, V, X
from ..memo import BoundedTable
from ..ode import ODESystem, linear_system, propagator
from ..symbols import XI

__all__ = ["EventSpec", "EventPropError", "derive_events", "system_text", "turns_once"]


class EventPropError(ValueError):
    """A neuron (or its synapse) for which EventProp's gradient is not defined."""


@dataclass(frozen=True)
class EventSpec:
    """The derived expressions of one ODE neuron's EventProp adjoint.

    Vectors are column matrices over :attr:`states` (V first, then the extra states in
    their order); :attr:`adjoints` are λ = ∂L/∂x (λ⁺ in the jump, the value just after
    the spike in forward time), :attr:`weight` the synapse's w, :attr:`coupling` the
    spike's B, :attr:`elapsed` the time s of the closed-form flow.

    Attributes
    ----------
    rhs : f(x; θ) with X = 0 (the input arrives only as spikes).
    jacobian : J = ∂f/∂x; :attr:`linear` whether it is free of x.
    adjoint_rhs : dλ/dt = −Jᵀλ.
    flow, flow_offset : for a linear system, Φ(s) = e^{J s} and Γ(s) with
        x(s) = Φ(s) x(0) + Γ(s) (closed form in :attr:`elapsed`); λ(t − s) = Φ(s)ᵀ λ(t).
        None for a nonlinear one.
    threshold : g = V − ϑ(x); threshold_gradient ∂g/∂x; threshold_rate ġ = (∂g/∂x)·f.
    on_threshold : the substitution V → ϑ(x) that solves g = 0.
    rate_at_spike : ġ⁻ on g = 0.
    reset : h(x); reset_jacobian ∂h/∂x; reset_margin g(h(x)) on g = 0 (< 0 needed).
    saltation : λ·(f(h(x)) − (∂h/∂x) f(x)), on g = 0.
    jump : λ⁻ in λ⁺, the stored states and B, on g = 0.
    store : the states the jump still contains: what a forward keeps per spike.
    synapse : m(x, w); synapse_jacobian ∂m/∂x; weight_partial ∂m/∂w.
    target_term : Q = λ·(f(m(x, w)) − (∂m/∂x) f(x)).
    rhs_partials : ∂f/∂θ per param name (the integrand of dL/dθ is λ·∂f/∂θ).
    threshold_partials, reset_partials : ∂g/∂θ and ∂h/∂θ per param name.
    spike_partials : per param name, a spike's share of dL/dθ on g = 0,
        λ⁺·∂h/∂θ + (∂g/∂θ)(saltation + B)/ġ⁻.
    """

    states: tuple[sp.Symbol, ...]
    adjoints: tuple[sp.Symbol, ...]
    params: Mapping[str, sp.Symbol]
    weight: sp.Symbol
    coupling: sp.Symbol
    elapsed: sp.Symbol
    rhs: sp.Matrix
    jacobian: sp.Matrix
    linear: bool
    adjoint_rhs: sp.Matrix
    flow: sp.Matrix | None
    flow_offset: sp.Matrix | None
    threshold: sp.Expr
    threshold_gradient: sp.Matrix
    threshold_rate: sp.Expr
    on_threshold: Mapping[sp.Symbol, sp.Expr]
    rate_at_spike: sp.Expr
    reset: sp.Matrix
    reset_jacobian: sp.Matrix
    reset_margin: sp.Expr
    saltation: sp.Expr
    jump: sp.Matrix
    store: tuple[sp.Symbol, ...]
    synapse: sp.Matrix
    synapse_jacobian: sp.Matrix
    weight_partial: sp.Matrix
    target_term: sp.Expr
    rhs_partials: Mapping[str, sp.Matrix]
    threshold_partials: Mapping[str, sp.Expr]
    reset_partials: Mapping[str, sp.Matrix]
    spike_partials: Mapping[str, sp.Expr]


#: Derived specs by (definition, its ODEs' text, target): a definition's key names its
#: step map, the ODEs it was built from are named beside it.
_SPECS: BoundedTable[tuple[Definition, str, str | None], EventSpec] = BoundedTable(
    64, "derivation.events"
)


#: each system's text by its id, with the system kept (so its id is not reused)
_TEXTS: BoundedTable[int, tuple[ODESystem | None, str]] = BoundedTable(
    64, "derivation.events.texts"
)


def system_text(system: ODESystem | None) -> str:
    """``repr(system)``, the text that keys what is derived or compiled from it, printed
    once per system object (SymPy's printing took a few ms, on every training step)."""
    found = _TEXTS.get(id(system))
    if found is not None and found[0] is system:
        return found[1]
    return _TEXTS.put(id(system), (system, repr(system)))[1]


def derive_events(
    definition: Definition, system: ODESystem | None, *, target: str | None = None
) -> EventSpec:
    """The :class:`EventSpec` of a neuron built from ``system`` (its :attr:`ode`).

    ``target`` names the state a spike input of weight w jumps (``I ← I + w``); without
    one, the input enters through X: X = w·δ(t − t_a), the jump m = x + w·∂f/∂X.
    Raises :class:`EventPropError` for what EventProp cannot differentiate.

    >>> import sympy as sp, symneuron as sn
    >>> tau_m, tau_s, I = sp.symbols("tau_m tau_s I")
    >>> lif = sn.Neuron.from_ode((-sn.V + I) / tau_m, dt=1.0, method="exact",
    ...     params={tau_m: 10.0, tau_s: 5.0}, states={I: sn.ODEState(-I / tau_s + sn.X)})
    >>> lif.events().store
    (I,)
    """
    key = (definition, system_text(system), target)
    found = _SPECS.get(key)
    return found if found is not None else _SPECS.put(key, _derived(definition, system, target))


def _derived(definition: Definition, system: ODESystem | None, target: str | None) -> EventSpec:
    system = _checked_system(definition, system)
    states = (V, *definition.state_symbols.values())
    taken = {s.name for s in states} | set(definition.params)
    adjoints = tuple(_fresh(f"lambda_{z.name}", taken) for z in states)
    weight, coupling, elapsed = (_fresh(n, taken) for n in ("w", "B", "s"))
    f = _rhs(definition, system, states)
    jacobian = f.jacobian(states)
    linear = not jacobian.has(*states)
    lam = sp.Matrix(adjoints)
    synapse, g = _synapse(definition, system, states, weight, target), _threshold(definition)
    grad_g = sp.Matrix([g]).jacobian(states)
    on_threshold = {V: V - g}
    rate_at_spike = _rate_at_spike(grad_g.dot(f), on_threshold)
    h = _reset(definition, states)
    dh = h.jacobian(states)
    margin = sp.simplify(g.xreplace(dict(zip(states, h, strict=True))).xreplace(on_threshold))
    _check_leaves_threshold(margin, definition, states)
    _check_input_not_on_threshold(grad_g, synapse, states, weight)
    after = f.xreplace(dict(zip(states, h, strict=True)))
    saltation = _on(lam.dot(after - dh * f), on_threshold)
    jump = (dh.T * lam + grad_g.T * (saltation + coupling) / rate_at_spike).applyfunc(
        lambda e: sp.factor(sp.cancel(_on(e, on_threshold)))
    )
    dm = synapse.jacobian(states)
    q = lam.dot(f.xreplace(dict(zip(states, synapse, strict=True))) - dm * f)
    params = dict(definition.symbols)
    spike_partials = {
        n: sp.cancel(
            _on(
                lam.dot(h.diff(p)) + g.diff(p) * (saltation + coupling) / rate_at_spike,
                on_threshold,
            )
        )
        for n, p in params.items()
    }
    flow, offset = _flow(states, f, elapsed) if linear else (None, None)
    return EventSpec(
        states=states,
        adjoints=adjoints,
        params=params,
        weight=weight,
        coupling=coupling,
        elapsed=elapsed,
        rhs=f,
        jacobian=jacobian,
        linear=linear,
        adjoint_rhs=-jacobian.T * lam,
        flow=flow,
        flow_offset=offset,
        threshold=g,
        threshold_gradient=grad_g,
        threshold_rate=grad_g.dot(f),
        on_threshold=on_threshold,
        rate_at_spike=rate_at_spike,
        reset=h,
        reset_jacobian=dh,
        reset_margin=margin,
        saltation=saltation,
        jump=jump,
        store=_stored(states, [*jump, *spike_partials.values()]),
        synapse=synapse,
        synapse_jacobian=dm,
        weight_partial=synapse.diff(weight),
        target_term=sp.factor(sp.expand(q)),
        rhs_partials={n: f.diff(p) for n, p in params.items()},
        threshold_partials={n: g.diff(p) for n, p in params.items()},
        reset_partials={n: h.diff(p) for n, p in params.items()},
        spike_partials=spike_partials,
    )


def turns_once(spec: EventSpec) -> bool:
    """Whether ġ vanishes at most once along any stretch of the flow, however long: a
    linear system of two states whose eigenvalues are real (for real params), with g
    affine in the states. ġ = ∇g·e^{Js}ẋ(0) is then a combination of two real modes
    (e^{λ₁s} and e^{λ₂s}, or e^{λs} and s·e^{λs}), which vanishes at most once unless
    everywhere: one zero of ġ, one peak, on a piece of any length. Where this holds the
    forward moves from arrival to arrival in one piece; else steps of dt bound each piece.

    >>> import sympy as sp, symneuron as sn
    >>> tau_m, tau_s, I = sp.symbols("tau_m tau_s I")
    >>> lif = sn.Neuron.from_ode((-sn.V + I) / tau_m, dt=1.0, method="exact",
    ...     params={tau_m: 10.0, tau_s: 5.0}, states={I: sn.ODEState(-I / tau_s + sn.X)})
    >>> turns_once(lif.events())
    True
    """
    states = set(spec.states)
    if spec.flow is None or len(spec.states) != 2:
        return False
    if any(entry.free_symbols & states for entry in spec.threshold_gradient):
        return False
    real = {}  # each param real and finite, nonzero (a zero time constant is no system)
    for p in spec.params.values():
        if p.is_real is False:
            return False
        sign = {"positive": True} if p.is_positive else {"nonzero": True}
        real[p] = sp.Dummy(p.name, real=True, **sign)
    eigenvalues = spec.jacobian.xreplace(real).eigenvals()
    return all(sp.sympify(value).is_real is True for value in eigenvalues)


def _flow(
    states: tuple[sp.Symbol, ...], f: sp.Matrix, elapsed: sp.Symbol
) -> tuple[sp.Matrix, sp.Matrix]:
    """Φ(s), Γ(s) of the linear system in the ``exact`` integrator's closed form, each
    entry simplified so that it is finite at s = 0 (free of s/s)."""
    flow, offset = propagator(*linear_system(dict(zip(states, f, strict=True))), elapsed)
    return flow.applyfunc(sp.simplify), offset.applyfunc(sp.simplify)


def _fresh(name: str, taken: set[str]) -> sp.Symbol:
    """A real symbol ``name``, with leading underscores until no param or state has it."""
    while name in taken:
        name = f"_{name}"
    taken.add(name)
    return sp.Symbol(name, real=True)


def _on(expr: sp.Expr, on_threshold: Mapping[sp.Symbol, sp.Expr]) -> sp.Expr:
    return sp.sympify(expr).xreplace(dict(on_threshold))


def _checked_system(definition: Definition, system: ODESystem | None) -> ODESystem:
    """``system``, or the reason EventProp refuses the neuron's dynamics or firing."""
    if system is None:
        raise EventPropError(
            f"{definition.name} is not built from differential equations (a discrete-time "
            "charge): spike times within a step and their derivatives are not defined. "
            "Build it with sn.Neuron.from_ode(dV/dt, ...)."
        )
    if (
        definition.draws
        or system.dv.has(XI)
        or any(st.ode.has(XI) for st in system.states.values() if st.ode is not None)
    ):
        raise EventPropError(
            f"{definition.name} draws random numbers (white noise xi or escape firing): "
            "a stochastic spike time has no event-time derivative; EventProp needs a "
            "deterministic model (use surrogate gradients for it)."
        )
    if definition.firing != "level":
        raise EventPropError(
            f"{definition.name} fires on crossings without a reset (firing="
            f"{definition.firing!r}): the reset must leave the threshold, or the neuron "
            "would spike again at once; give a v_reset below the threshold."
        )
    return system


def _odes(definition: Definition, system: ODESystem, states: tuple[sp.Symbol, ...]) -> sp.Matrix:
    """f(x, X) in the definition's canonical symbols (V and X matched by name)."""
    own = {s.name: s for s in [*definition.symbols.values(), *states, X]}

    def mine(expr: Any) -> sp.Expr:
        expr = sp.sympify(expr)
        return expr.xreplace({s: own[s.name] for s in expr.free_symbols if s.name in own})

    return sp.Matrix(
        [mine(e) for e in [system.dv, *(system.states[z.name].ode for z in states[1:])]]
    )


def _rhs(definition: Definition, system: ODESystem, states: tuple[sp.Symbol, ...]) -> sp.Matrix:
    """f(x) with X = 0: between events the input is off (it arrives as spikes)."""
    return _odes(definition, system, states).xreplace({X: 0})


def _synapse(
    definition: Definition,
    system: ODESystem,
    states: tuple[sp.Symbol, ...],
    weight: sp.Symbol,
    target: str | None,
) -> sp.Matrix:
    """m(x, w): ``target`` ← ``target`` + w, or x + w·∂f/∂X for an input through X."""
    x = sp.Matrix(states)
    if target is not None:
        names = [z.name for z in states]
        if target not in names:
            raise EventPropError(f"target {target!r} is not a state; one of {names}.")
        return x + weight * sp.Matrix([int(z.name == target) for z in states])
    f_x = _odes(definition, system, states)
    dfdx = f_x.diff(X)
    if dfdx.has(*states) or dfdx.has(X):
        raise EventPropError(
            f"The spike input enters through X with ∂f/∂X = {list(dfdx)}, which depends on "
            "the state: a δ-input X = w·δ(t − t_a) is ill-defined there (its jump depends on "
            "where along it the state is taken). Feed spikes into a state that X enters "
            "additively (dI/dt = ... + X), or name it with target=."
        )
    if dfdx.is_zero_matrix:
        raise EventPropError(f"{definition.name}'s equations do not use X: no spike input.")
    return x + weight * dfdx


def _threshold(definition: Definition) -> sp.Expr:
    return V - sp.sympify(definition.v_threshold)


def _rate_at_spike(rate: sp.Expr, on_threshold: Mapping[sp.Symbol, sp.Expr]) -> sp.Expr:
    """ġ⁻ on g = 0, or the refusal when it vanishes identically there."""
    out = sp.factor(sp.simplify(_on(rate, on_threshold)))
    if out == 0:
        raise EventPropError(
            f"ġ = {rate} vanishes on the threshold (g = 0): the threshold is on states "
            "without dynamics there, so the spike time does not depend smoothly on them "
            "('grazing everywhere'); EventProp cannot differentiate it."
        )
    return out


def _reset(definition: Definition, states: tuple[sp.Symbol, ...]) -> sp.Matrix:
    """h(x): V to ``v_reset`` (or V − ϑ, the soft reset), each state's on_spike at S = 1."""
    theta = sp.sympify(definition.v_threshold)
    v_new = V - theta if definition.v_reset is None else sp.sympify(definition.v_reset)
    rules = [sp.sympify(definition.states[z.name].on_spike).xreplace({S: 1}) for z in states[1:]]
    return sp.Matrix([v_new, *rules])


def _check_leaves_threshold(
    margin: sp.Expr, definition: Definition, states: tuple[sp.Symbol, ...]
) -> None:
    """g(h(x)) on g = 0 must be < 0; a margin that depends on the state is checked per
    spike at run time."""
    if margin.has(*states):
        return
    value = margin.xreplace({definition.symbols[n]: v for n, v in definition.params.items()})
    if value.is_number and float(value) >= 0:
        raise EventPropError(
            f"The reset does not leave the threshold: g(h(x)) = {margin} = {float(value)} ≥ 0 "
            f"at the default params (v_reset = {definition.v_reset}, v_threshold = "
            f"{definition.v_threshold}); the neuron would spike again at once. Give a "
            "v_reset below the threshold."
        )


def _check_input_not_on_threshold(
    grad_g: sp.Matrix, synapse: sp.Matrix, states: tuple[sp.Symbol, ...], weight: sp.Symbol
) -> None:
    """A spike input must not jump g itself: an arrival that crossed the threshold would
    spike at the arrival, where the spike time is not differentiable."""
    moved = sp.simplify(grad_g.dot(synapse.diff(weight)))
    if moved != 0:
        raise EventPropError(
            f"A spike input jumps the threshold function g by w·{moved}: an arrival could "
            "cross the threshold at the arrival itself, where the spike time has no "
            "derivative. Feed spikes through a synaptic state (dI/dt = -I/tau_s + X, "
            "dV/dt = (-V + I)/tau_m)."
        )


def _stored(states: tuple[sp.Symbol, ...], exprs: list[sp.Expr]) -> tuple[sp.Symbol, ...]:
    used = set().union(*(sp.sympify(e).free_symbols for e in exprs))
    return tuple(z for z in states if z in used)
