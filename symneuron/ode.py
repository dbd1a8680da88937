"""Neurons as differential equations: a symbolic integrator builds the step map.

A neuron written as dV/dt = F(V, W, X; θ) and, for each extra state,
dW/dt = G(V, W, X; θ) becomes one step of a chosen integration method with time
step ``dt``, the input X held constant over the step. The whole coupled system is
integrated at once and every variable is updated simultaneously from the previous
values, as Brian2 does. The result is the discrete step map the rest of the
pipeline takes (the charge H = V's new value, each state's pre-spike update
W̃ = W's new value), so derivation, kernels, ``sn.check``, every backend and dtype
work unchanged; parameters inside ``exp(-dt/tau)`` get exact gradients like any
other.

Methods (Brian2's names and definitions, with y the vector of V and the states,
f the right-hand sides, h = dt):

``"euler"``      y' = y + h f(y); with white noise (:data:`symneuron.xi`, Brian2's ``xi``,
                 units 1/√time) in an equation dz/dt = f(y) + σ(y)·ξ, Euler–Maruyama:
                 z' = z + h f(y) + √h σ(y) ζ_z, ζ_z ~ N(0, 1) per neuron and step,
                 independent for each equation (noise stream 0 for V, i + 1 for the
                 i-th state: the symbols ``noise``, ``noise<i>`` of the step map)
``"rk2"``        the midpoint method: y' = y + h f(y + h/2 f(y))
``"rk4"``        classic Runge–Kutta: y' = y + h/6 (k1 + 2 k2 + 2 k3 + k4)
``"exp_euler"``  exponential Euler, for equations linear in their own variable:
                 with dx/dt = A x + B (A, B free of x, the other variables at their
                 previous values), x' = x + h φ₁(A h) (A x + B), φ₁(z) = (e^z − 1)/z
                 (Brian2's x' = −B/A + (x + B/A) e^{A h}, written so that it is finite
                 and does not cancel when A is zero or small at run time). An
                 equation not linear in its own variable raises a ``ValueError``
                 (use ``"euler"``, ``"rk2"`` or ``"rk4"``): no silent linearisation.
``"exact"``      the closed-form propagator of a linear system (Brian2's ``exact``,
                 NEST's ``iaf_psc_exp``): with dy/dt = A y + b (A and b free of the
                 variables; X and the params may enter both),
                 y' = e^{A h} y + ∫₀^h e^{A s} ds · b, both read off SymPy's matrix
                 exponential of [[A, b], [0, 0]]·h; the whole system at once, so that a
                 current synapse feeding V is integrated exactly, not variable by
                 variable as ``exp_euler`` does. A system that is not linear raises a
                 ``ValueError`` naming the term; where its closed form divides by a
                 difference of time constants (``tau_m - tau_s``), equal values at run
                 time are outside it (Brian2 and NEST's generic propagator alike).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import sympy as sp
from sympy.codegen.cfunctions import expm1

from .definition import State, V, inline_stages
from .symbols import NOISE_STREAMS, RESERVED, XI, allowed_in, noise_symbol
from .validate import check_expression, finite_float, named

__all__ = [
    "ODEState",
    "ODESystem",
    "METHODS",
    "TABLEAUS",
    "Discretised",
    "discretise",
    "phi1",
    "PHI1_BAND",
    "linear_system",
    "propagator",
    "exact_step",
    "expanded_size",
    "rk_outline",
]

#: The integration methods, by Brian2's names.
METHODS = ("euler", "exp_euler", "rk2", "rk4", "exact")


@dataclass(frozen=True)
class ODEState:
    """An extra state W of a neuron given as an ODE.

    Parameters
    ----------
    ode : sympy.Expr
        dW/dt = G(V, W..., X; θ), in V, the states (previous values), X and params.
    on_spike : sympy.Expr, optional
        W[t] after a spike, written with the states (their values after this step's
        integration) and :data:`symneuron.S`, e.g. ``W + b*S``; ``None`` keeps them.
    init : float
        W[0] when no initial value is given.
    """

    ode: sp.Expr | None
    on_spike: sp.Expr | None = None
    init: float = 0.0


@dataclass(frozen=True)
class ODESystem:
    """The differential equations a neuron was built from (:attr:`symneuron.Neuron.ode`).

    ``dv`` is dV/dt and ``states`` each extra state's :class:`ODEState`, both in
    the neuron's own symbols; ``dt`` and ``method`` the discretisation. Kept so the
    equations can be shown, exported and handed to other simulators (Brian2).
    """

    dv: sp.Expr
    states: Mapping[str, ODEState]
    dt: float
    method: str


#: The explicit Runge–Kutta methods kept as stages: each stage's fraction c of the step
#: (stage i reads y + c_i·h·k_{i−1}), and the new value y' = y + h·w·Σ b_i k_i as the
#: factor w and the integer weights b (Brian2's definitions; rk2 is the midpoint method).
TABLEAUS: dict[str, tuple[tuple[sp.Expr, ...], sp.Expr, tuple[int, ...]]] = {
    "rk2": ((sp.Rational(1, 2),), sp.Integer(1), (0, 1)),
    "rk4": ((sp.Rational(1, 2), sp.Rational(1, 2), sp.Integer(1)), sp.Rational(1, 6), (1, 2, 2, 1)),
}

Stage = tuple[sp.Symbol, sp.Expr]


def _stage_symbol(prefix: str, z: sp.Symbol, taken: set[str]) -> sp.Symbol:
    """``<prefix>_<z>``, with leading underscores until no param or state has the name."""
    name = f"{prefix}_{z.name}"
    while name in taken:
        name = f"_{name}"
    return sp.Symbol(name, real=True)


def _staged(
    method: str, rhs: dict[sp.Symbol, sp.Expr], h: sp.Expr, taken: set[str]
) -> tuple[list[Stage], dict[sp.Symbol, sp.Expr]]:
    """The stages of an explicit Runge–Kutta step as named assignments, in order, and each
    variable's new value in the increments ``k<i>_<z>``, arranged as Brian2 writes them:
    k_i = h·f(y_i), stage state y_i = y + c_i k_{i−1} (``y<i>_<z>``), y' = y + w Σ b_i k_i.
    Nothing is substituted into anything, so the step grows linearly with the stages and
    equations."""
    fractions, factor, weights = TABLEAUS[method]
    slopes = {z: _stage_symbol("k1", z, taken) for z in rhs}
    stages: list[Stage] = [(slopes[z], h * f) for z, f in rhs.items()]
    all_slopes = [slopes]
    for i, c in enumerate(fractions, start=2):
        state = {z: _stage_symbol(f"y{i}", z, taken) for z in rhs}
        stages += [(state[z], z + c * slopes[z]) for z in rhs]
        slopes = {z: _stage_symbol(f"k{i}", z, taken) for z in rhs}
        stages += [(slopes[z], h * f.xreplace(state)) for z, f in rhs.items()]
        all_slopes.append(slopes)
    new = {
        z: z + factor * sp.Add(*[b * k[z] for b, k in zip(weights, all_slopes, strict=True)])
        for z in rhs
    }
    return stages, new


#: |z| below which :func:`phi1` is its Taylor polynomial of degree
#: ``_PHI1_DEGREE``: there the polynomial's error, |z|^10/11! < 3e-18, is below
#: float64's rounding, and outside it expm1(z)/z and its derivative
#: exp(z)/z − expm1(z)/z² lose at most ~2·eps/|z| (1.2e-6 in float32) to cancellation.
PHI1_BAND = 0.1
_PHI1_DEGREE = 9


def phi1(z: sp.Expr) -> sp.Expr:
    """φ₁(z) = (e^z − 1)/z, 1 at z = 0, stable through z = 0 with its derivative.

    A number for a numeric ``z``; otherwise the Taylor polynomial Σ z^k/(k+1)! (Horner
    form) for |z| < :data:`PHI1_BAND` and ``expm1(z)/z`` outside. The exact branch reads
    a guarded z (about 1 inside the band), so neither it nor its derivative is ever 0/0: the
    torch reference evaluates and differentiates both branches of its ``where``, and
    common-subexpression elimination may hoist either out of the kernels' ``?:``.
    """
    if z.is_number:
        if z == 0:
            return sp.Integer(1)
        return sp.Float((expm1(z) / z).evalf(30), 30)
    series: sp.Expr = 1 + z / (_PHI1_DEGREE + 1)
    for k in range(_PHI1_DEGREE, 1, -1):
        series = 1 + z / k * series
    near = sp.Abs(z) < sp.Float(PHI1_BAND)
    # z + (1 − z) inside the band: an Add, which SymPy does not fold into 1/Piecewise
    guarded = z + sp.Piecewise((1 - z, near), (0, True))
    return sp.Piecewise((series, near), (expm1(guarded) / guarded, True))


#: Operations past which an apparent nonlinearity is not simplified away (SymPy's
#: ``simplify`` of Wang–Buzsáki's dV/dt, nonlinear through m_∞(V), ran for minutes).
_SIMPLIFY_OPS = 60


def _exp_euler(
    z: sp.Symbol, rhs: sp.Expr, h: sp.Expr, taken: set[str]
) -> tuple[list[Stage], sp.Expr]:
    """The exponential Euler step of dz/dt = rhs = a z + b (a, b free of z):
    z + h φ₁(a h) (a z + b), with a, b and φ₁(a h) kept as stages (``a_<z>``, ``b_<z>``,
    ``phi_<z>``) unless they are numbers."""
    a = sp.diff(rhs, z)
    if a.has(z) and sp.count_ops(a) <= _SIMPLIFY_OPS:
        a = sp.simplify(a)  # only when needed: simplify is slow on large systems (HH)
    if a.has(z):
        raise ValueError(
            f"method='exp_euler' needs each equation linear in its own variable, but "
            f"d{z}/dt = {rhs} is not linear in {z}; use method='euler', 'rk2' or 'rk4'."
        )
    b = rhs.xreplace({z: 0})  # rhs = a*z + b with a, b free of z
    stages: list[Stage] = []
    if not b.is_number:
        stages.append((_stage_symbol("b", z, taken), b))
        b = stages[-1][0]
    if a == 0:
        return stages, z + h * b
    if a.is_number:
        return stages, z + h * phi1(a * h) * (a * z + b)
    a_z, phi_z = _stage_symbol("a", z, taken), _stage_symbol("phi", z, taken)
    stages += [(a_z, a), (phi_z, phi1(a_z * h))]
    return stages, z + h * phi_z * (a_z * z + b)


def linear_system(rhs: dict[sp.Symbol, sp.Expr]) -> tuple[sp.Matrix, sp.Matrix]:
    """A and b of dy/dt = A y + b, or a ``ValueError`` naming the first nonlinear term."""
    zs = list(rhs)
    rows = []
    for z, f in rhs.items():
        row = []
        for w in zs:
            a = sp.diff(f, w)
            if a.has(*zs) and sp.count_ops(a) <= _SIMPLIFY_OPS:
                a = sp.simplify(a)
            if a.has(*zs):
                raise ValueError(
                    f"method='exact' integrates linear systems (dy/dt = A y + b, A and b free "
                    f"of the variables), but d{z}/dt = {f} is not linear in {w} (its partial "
                    f"{a} depends on {sorted(map(str, a.free_symbols & set(zs)))}); use "
                    "method='exp_euler', 'rk2' or 'rk4'."
                )
            row.append(a)
        rows.append(row)
    b = sp.Matrix([f.xreplace({z: 0 for z in zs}) for f in rhs.values()])
    return sp.Matrix(rows), b


def _exact(
    rhs: dict[sp.Symbol, sp.Expr], h: sp.Expr, taken: set[str]
) -> tuple[list[Stage], dict[sp.Symbol, sp.Expr]]:
    """The exact step of the linear system dy/dt = A y + b: y' = Φ y + Γ with
    [[Φ, Γ], [0, 1]] = exp([[A, b], [0, 0]]·h); each entry of Φ and Γ that is not a
    number is a stage (``e_<z>_<w>``, ``g_<z>``), so the backward goes through them."""
    zs = list(rhs)
    flow, offset = propagator(*linear_system(rhs), h)
    stages: list[Stage] = []

    def named(entry: sp.Expr, prefix: str, z: sp.Symbol) -> sp.Expr:
        if entry.is_number:
            return entry
        symbol = _stage_symbol(prefix, z, taken)
        stages.append((symbol, entry))
        return symbol

    new = {}
    for i, z in enumerate(zs):
        terms = [named(flow[i, j], f"e_{w.name}", z) * w for j, w in enumerate(zs)]
        new[z] = sp.Add(*terms) + named(offset[i], "g", z)
    return stages, new


def propagator(a: sp.Matrix, b: sp.Matrix, h: sp.Expr) -> tuple[sp.Matrix, sp.Matrix]:
    """Φ = e^{A h} and Γ = ∫₀^h e^{A s} ds · b, the flow of dy/dt = A y + b over a time
    ``h`` (a number or a symbol): y(h) = Φ y(0) + Γ, read off SymPy's matrix exponential
    of [[A, b], [0, 0]]·h, each entry in real form with its exponentials combined."""
    n = a.rows
    block = sp.zeros(n + 1, n + 1)
    block[:n, :n] = a * h
    block[:n, n] = b * h
    power = block.exp()

    def tidy(entry: sp.Expr) -> sp.Expr:
        if entry.has(sp.I, sp.re, sp.im):  # complex eigenvalues: the real form
            entry = sp.simplify(sp.expand_complex(entry))
        if entry.has(sp.exp):  # e^{a}·e^{b} as e^{a+b}: no overflow of a part alone
            entry = sp.powsimp(sp.expand(entry), combine="exp")
        return entry

    flow = sp.Matrix(n, n, lambda i, j: tidy(power[i, j]))
    return flow, sp.Matrix([tidy(power[i, n]) for i in range(n)])


def exact_step(z: sp.Symbol, rhs: sp.Expr, dt: float) -> sp.Expr:
    """z after one step of dz/dt = rhs = a z + b (a, b held over the step), written as
    mathematics: z∞ + (z − z∞) e^{a dt} with z∞ = −b/a (z + dt b for a = 0). It equals
    the exponential Euler step the kernels evaluate through stages (``X + (V -
    X)*exp(-1.0/tau)`` for a LIF neuron with dt = 1)."""
    h = sp.Float(dt)
    a = sp.diff(rhs, z)
    if a.has(z) and sp.count_ops(a) <= _SIMPLIFY_OPS:
        a = sp.simplify(a)
    b = rhs.xreplace({z: 0})
    if a == 0:
        return z + h * b
    z_inf = -b / a
    return z_inf + (z - z_inf) * sp.exp(a * h)


def expanded_size(stages: Sequence[Stage], expr: sp.Expr) -> int:
    """The number of nodes ``expr`` has as a tree once the ``stages`` are substituted,
    counted without substituting them (each stage's count is its tree's, a stage symbol
    in it weighing its own count)."""
    sizes: dict[sp.Basic, int] = {}

    def size(e: sp.Expr) -> int:
        return sum(sizes.get(node, 1) for node in sp.preorder_traversal(e))

    for symbol, stage in stages:
        sizes[symbol] = size(stage)
    return size(expr)


def rk_outline(
    method: str, variables: Sequence[sp.Symbol], dt: float, held: Sequence[sp.Symbol] = ()
) -> dict[sp.Symbol, sp.Expr]:
    """Each variable's new value after one step of the Runge–Kutta ``method`` (``rk2``,
    ``rk4``), the right-hand sides written as functions: dz/dt = ``f_<z>(V, W, ..., *held)``
    (``held``: the symbols constant over the step that are to appear, X and the learnable
    params, so that the partials by them follow the chain rule). The step's mathematics
    without its stages, for a system whose right-hand sides substituted would make the
    step too large to read (Wang–Buzsáki's rk4 step: millions of terms)."""
    rhs = {z: sp.Function(f"f_{z.name}")(*variables, *held) for z in variables}
    stages, new = _staged(method, rhs, sp.Float(dt), {z.name for z in variables})
    return {z: inline_stages(stages, value) for z, value in new.items()}


class Discretised(NamedTuple):
    """The discrete step map of an ODE neuron: V's new value (the charge), each state's
    pre-spike :class:`~symneuron.State`, and the integrator's stages (``symbol = expr``,
    in order) that the charge and the updates read; no stages for ``euler`` and
    ``exp_euler``."""

    charge: sp.Expr
    states: dict[str, State]
    stages: tuple[Stage, ...] = ()


def discretise(
    dv: sp.Expr,
    *,
    dt: float,
    method: str = "exp_euler",
    states: Mapping[Any, ODEState] | None = None,
    params: Mapping[Any, float] | None = None,
) -> Discretised:
    """The :class:`Discretised` step map of an ODE neuron.

    ``dv`` is dV/dt; ``states`` map each extra state (symbol or name) to its
    :class:`ODEState`. Symbols are matched by name, as in :class:`symneuron.Neuron`;
    that class checks the result (unknown symbols, finiteness, learnable params).
    ``rk2`` and ``rk4`` keep their stages as named symbols (``k1_V``, ``y2_V``, ...).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {list(METHODS)}, got {method!r}")
    step = finite_float(dt, "dt")
    if step <= 0:
        raise ValueError(f"dt must be > 0, got {step}; give the time step in the ODE's units.")
    odes = _checked_states(states)
    param_names = set(named(params, "parameter"))
    rhs = _right_hand_sides(dv, odes, param_names)
    stages, new = _integrated(method, rhs, sp.Float(step), {*odes, *param_names})
    out_states = {
        wname: State(update=new[sp.Symbol(wname, real=True)], on_spike=st.on_spike, init=st.init)
        for wname, st in odes.items()
    }
    return Discretised(new[V], out_states, tuple(stages))


def _checked_states(states: Mapping[Any, ODEState] | None) -> dict[str, ODEState]:
    """The extra states by name, each an :class:`ODEState` with an equation."""
    odes = named(states, "state", hint=" (an sn.ODEState)")
    for wname, state in odes.items():
        if not isinstance(state, ODEState):
            raise TypeError(f"states[{wname!r}] must be a symneuron.ODEState, got {state!r}")
        if state.ode is None:
            raise ValueError(
                f"State {wname!r} has no equation; give ODEState(ode=dW/dt, ...) "
                "(0 for a state that changes only on spikes)."
            )
    return odes


def _integrated(
    method: str, rhs: dict[sp.Symbol, sp.Expr], h: sp.Expr, taken: set[str]
) -> tuple[list[Stage], dict[sp.Symbol, sp.Expr]]:
    """The method's stages (none for euler) and each variable's new value."""
    noisy = [str(z) for z, f in rhs.items() if f.has(XI)]
    if noisy and method != "euler":
        raise ValueError(
            f"The equations of {noisy} hold white noise xi, which method={method!r} cannot "
            "integrate; use method='euler' (Euler–Maruyama: z' = z + dt*f + sqrt(dt)*sigma*N(0,1))."
        )
    if method == "euler":
        return [], {z: _euler_maruyama(z, f, h, i) for i, (z, f) in enumerate(rhs.items())}
    if method == "exact":
        return _exact(rhs, h, taken)
    if method != "exp_euler":
        return _staged(method, rhs, h, taken)
    stages: list[Stage] = []
    new = {}
    for z, f in rhs.items():
        more, new[z] = _exp_euler(z, f, h, taken)
        stages += more
    return stages, new


def _euler_maruyama(z: sp.Symbol, f: sp.Expr, h: sp.Expr, stream: int) -> sp.Expr:
    """z + h f + √h σ ζ for dz/dt = f + σ ξ (σ free of ξ), ζ the draw of ``stream``."""
    if not f.has(XI):
        return z + h * f
    sigma = sp.diff(f, XI)
    if sigma.has(XI):
        raise ValueError(
            f"d{z}/dt = {f} is not linear in xi; white noise enters as sigma*xi (sigma may "
            "use V, X, the states and the params)."
        )
    if stream >= NOISE_STREAMS:
        raise ValueError(f"White noise reaches {NOISE_STREAMS} equations at most; {z} is past.")
    drift = f.xreplace({XI: 0})
    return z + h * drift + sp.sqrt(h) * sigma * noise_symbol(stream)


def _right_hand_sides(
    dv: Any, odes: Mapping[str, ODEState], param_names: set[str]
) -> dict[sp.Symbol, sp.Expr]:
    """V's and each state's right-hand side with the canonical symbols, checked."""
    reserved = sorted(allowed_in("ode"))
    names = {n: RESERVED[n].symbol for n in reserved}
    names.update({w: sp.Symbol(w, real=True) for w in odes})

    def canonical(expr: Any, what: str) -> sp.Expr:
        expr = sp.sympify(expr)
        if not isinstance(expr, sp.Expr):
            raise TypeError(f"{what} must be a SymPy expression, got {type(expr).__name__}")
        unknown = sorted({s.name for s in expr.free_symbols} - set(names) - param_names)
        if unknown:
            raise ValueError(
                f"{what} uses unknown symbols {unknown}; it may use {', '.join(reserved)}, "
                f"the states {sorted(odes)} and the params (give each a default in "
                "params={...})."
            )
        # the params keep the user's symbols: the neuron reads their assumptions
        out = expr.xreplace({s: names[s.name] for s in expr.free_symbols if s.name in names})
        check_expression(out, what)
        return out

    rhs = {V: canonical(dv, "dV/dt")}
    for wname, state in odes.items():
        rhs[names[wname]] = canonical(state.ode, f"d{wname}/dt")
    return rhs
