"""Neurons as their papers and simulators write them: mostly differential equations.

Each function returns a :class:`~symneuron.Neuron` built from the model's equations
(most through :meth:`~symneuron.Neuron.from_ode`, so the step map is derived from
the ODE with the chosen ``method`` and ``dt``), with the source's parameter values as
defaults and its units stated. Keyword arguments not named in a model's signature
(``learnable``, ``surrogate``, ``name``, ...) go to :class:`~symneuron.Neuron`.
Every model here is checked against Brian2 where Brian2 can express it
(``tests/test_brian2.py``).
"""

from __future__ import annotations

import math
from typing import Any

import sympy as sp
from sympy.codegen.cfunctions import expm1

from ..definition import S, State, V, X
from ..neuron import Neuron
from ..ode import PHI1_BAND, ODEState

__all__ = [
    "Izhikevich2003",
    "IZHIKEVICH_PRESETS",
    "AdEx2005",
    "HodgkinHuxley",
    "FitzHughNagumo",
    "ResonateAndFire",
    "AdLIF",
    "IafCondExp",
    "IafPscExp",
    "ThetaNeuron",
    "RefractoryLIF",
    "vtrap",
]


def _symbols(names: str, sign: str = "real") -> tuple[sp.Symbol, ...]:
    """Real symbols, or ``sign="positive"`` (a capacitance, a time constant) or
    ``"nonnegative"`` (a conductance): a value that breaks it is refused."""
    return tuple(sp.symbols(names, seq=True, **{sign: True}))


def _ode(
    name: str,
    dv: sp.Expr,
    params: dict[sp.Symbol, float],
    kw: dict[str, Any],
    *,
    dt: float,
    method: str,
    states: dict[sp.Symbol, ODEState] | None = None,
) -> Neuron:
    kw.setdefault("name", name)
    return Neuron.from_ode(dv, dt=dt, method=method, states=states, params=params, **kw)


#: Izhikevich (2003) Fig. 2 cell classes: (a, b, c, d).
IZHIKEVICH_PRESETS: dict[str, tuple[float, float, float, float]] = {
    "RS": (0.02, 0.2, -65.0, 8.0),  # regular spiking
    "IB": (0.02, 0.2, -55.0, 4.0),  # intrinsically bursting
    "CH": (0.02, 0.2, -50.0, 2.0),  # chattering
    "FS": (0.1, 0.2, -65.0, 2.0),  # fast spiking
    "LTS": (0.02, 0.25, -65.0, 2.0),  # low-threshold spiking
}


def Izhikevich2003(
    preset: str = "RS", *, dt: float = 0.5, method: str = "euler", **kw: Any
) -> Neuron:
    r"""Izhikevich's simple model (Izhikevich 2003, IEEE TNN 14(6):1569), ms and mV.

    .. math::
        \frac{dv}{dt} = 0.04 v^2 + 5 v + 140 - u + I, \qquad \frac{du}{dt} = a (b v - u)

    and at v ≥ 30 mV: v ← c, u ← u + d. ``preset`` picks (a, b, c, d) from the
    paper's Fig. 2: ``"RS"`` regular spiking (0.02, 0.2, −65, 8), ``"FS"`` fast
    spiking (0.1, 0.2, −65, 2), ``"CH"`` chattering (0.02, 0.2, −50, 2), ``"IB"``
    intrinsically bursting, ``"LTS"`` low-threshold spiking; ``a=``, ``b=``, ``c=``,
    ``d=`` override one value. v starts at −65 and u at b·(−65), as in the paper's
    code; the input X is the paper's I. The paper steps v with Euler at 0.5 ms, the
    defaults here; v² makes ``exp_euler`` inapplicable.
    """
    if preset not in IZHIKEVICH_PRESETS:
        known = list(IZHIKEVICH_PRESETS)
        raise ValueError(f"Unknown Izhikevich preset {preset!r}; use one of {known}")
    values = dict(zip("abcd", IZHIKEVICH_PRESETS[preset], strict=True))
    values.update({k: float(kw.pop(k)) for k in "abcd" if k in kw})
    a, b, d, u = _symbols("a b d u")
    dv = 0.04 * V**2 + 5 * V + 140 - u + X
    u_state = ODEState(a * (b * V - u), on_spike=u + d * S, init=values["b"] * -65.0)
    kw = {"v_threshold": 30.0, "v_reset": values["c"], "v_init": -65.0, **kw}
    params = {a: values["a"], b: values["b"], d: values["d"]}
    states = {u: u_state}
    return _ode(f"Izhikevich2003_{preset}", dv, params, kw, dt=dt, method=method, states=states)


def AdEx2005(
    C: float = 281.0,
    g_L: float = 30.0,
    E_L: float = -70.6,
    V_T: float = -50.4,
    Delta_T: float = 2.0,
    tau_w: float = 144.0,
    a: float = 4.0,
    b: float = 80.5,
    *,
    dt: float = 0.1,
    method: str = "euler",
    **kw: Any,
) -> Neuron:
    r"""Adaptive exponential integrate-and-fire (Brette & Gerstner 2005, J. Neurophysiol.
    94:3637), in pF, nS, mV, ms and pA, with the paper's values (its Table 1).

    .. math::
        C \frac{dV}{dt} = -g_L (V - E_L) + g_L \Delta_T e^{(V - V_T)/\Delta_T} - w + I,
        \qquad \tau_w \frac{dw}{dt} = a (V - E_L) - w

    A spike when V reaches ``v_threshold`` (default V_T + 5 Δ_T = −40.4 mV, Brian2's
    AdEx example), then V ← ``v_reset`` (default E_L) and w ← w + b. X is I in pA.
    Euler by default (Brian2's choice for this nonlinear system); ``exp_euler`` does
    not apply to the exponential term.
    """
    e_l, v_t, a_, b_, w = _symbols("E_L V_T a b w")
    c_, g, d_t, tw = _symbols("C g_L Delta_T tau_w", "positive")
    dv = (-g * (V - e_l) + g * d_t * sp.exp((V - v_t) / d_t) - w + X) / c_
    state = ODEState((a_ * (V - e_l) - w) / tw, on_spike=w + b_ * S, init=0.0)
    params = {c_: C, g: g_L, e_l: E_L, v_t: V_T, d_t: Delta_T, tw: tau_w, a_: a, b_: b}
    kw = {"v_threshold": V_T + 5 * Delta_T, "v_reset": E_L, "v_init": E_L, **kw}
    return _ode("AdEx2005", dv, params, kw, dt=dt, method=method, states={w: state})


#: r/(e^r − 1) = 1 − r/2 + Σ B_2k r^2k/(2k)!: its r², r⁴, r⁶, r⁸ coefficients (in |r| < 0.1
#: the next term is under 3e−18). Floats, as r's are: the kernels' CSE factors rationals
#: out of a sum, which turned the polynomial into integers whose cube overflowed float32.
_BERNOULLI = tuple(sp.Float(c, 17) for c in (1 / 12, -1 / 720, 1 / 30240, -1 / 1209600))


def vtrap(x: sp.Expr, y: sp.Expr) -> sp.Expr:
    """x / (exp(x/y) − 1), NEURON's ``vtrap``, with r = x/y: its Taylor polynomial for
    |r| < :data:`~symneuron.ode.PHI1_BAND` and y r/expm1(r) outside (Brian2's
    ``y / exprel(r)``), so it is finite through r = 0 (a 16-bit V landing on −40 mV
    included) and accurate to a few ulp, its derivative too. The exact branch reads a
    guarded r (1 inside the band): the torch reference differentiates both branches of
    its ``where``, and neither is ever 0/0. NEURON's x/(exp(r) − 1), Taylor only for
    |r| < 1e−6, loses eps/r² of the derivative to cancellation: 230 % in float32 at
    r = 1e−4, which failed ``sn.check`` for Pospischil2008."""
    r = x / y
    r_float = sp.N(r, 17)  # -(V + 40)/10 as -0.1*V - 4.0 (in expm1, SymPy would split it)
    r2 = r_float**2
    series: sp.Expr = _BERNOULLI[-1]
    for coefficient in reversed(_BERNOULLI[:-1]):
        series = coefficient + r2 * series
    near = sp.Abs(r) < sp.Float(PHI1_BAND)
    guarded = r + sp.Piecewise((1 - r, near), (0, True))
    taylor = 1 - sp.Float(0.5) * r_float + r2 * series
    return y * sp.Piecewise((taylor, near), (guarded / expm1(guarded), True))


def HodgkinHuxley(
    *, dt: float = 0.01, method: str = "exp_euler", v_threshold: float = 0.0, **kw: Any
) -> Neuron:
    r"""Hodgkin & Huxley (1952, J. Physiol. 117:500) squid axon, as NEURON's ``hh.mod``
    writes it (mV, ms, µF/cm², mS/cm², µA/cm²; 6.3 °C, so no temperature factor).

    .. math::
        C \frac{dV}{dt} &= \bar g_{Na} m^3 h (E_{Na} - V) + \bar g_K n^4 (E_K - V)
            + g_L (E_L - V) + I \\
        \frac{dz}{dt} &= \alpha_z(V) (1 - z) - \beta_z(V) z, \quad z \in \{m, h, n\}

    with α_m = 0.1 vtrap(−(V+40), 10), β_m = 4 e^{−(V+65)/18}, α_h = 0.07 e^{−(V+65)/20},
    β_h = 1/(e^{−(V+35)/10} + 1), α_n = 0.01 vtrap(−(V+55), 10), β_n = 0.125 e^{−(V+65)/80}
    (:func:`vtrap`), C = 1, ḡ_Na = 120, ḡ_K = 36, g_L = 0.3, E_Na = 50, E_K = −77,
    E_L = −54.3. Four states (V, m, h, n) and no reset: a spike is an upward crossing
    of ``v_threshold`` (0 mV), ``firing="crossing"``. V starts at −65 mV and the gates
    at their steady states there. Every equation is linear in its own variable, so
    ``exp_euler`` (Brian2's method for HH) applies; dt = 0.01 ms.
    """
    m, h, n = _symbols("m h n")
    ena, ek, el = _symbols("E_Na E_K E_L")
    (c_,) = _symbols("C", "positive")
    gna, gk, gl = _symbols("g_Na g_K g_L", "nonnegative")
    rates = {
        m: (0.1 * vtrap(-(V + 40), 10), 4 * sp.exp(-(V + 65) / 18)),
        h: (0.07 * sp.exp(-(V + 65) / 20), 1 / (sp.exp(-(V + 35) / 10) + 1)),
        n: (0.01 * vtrap(-(V + 55), 10), 0.125 * sp.exp(-(V + 65) / 80)),
    }
    v0 = -65.0
    states = {}
    for z, (alpha, beta) in rates.items():
        al, be = float(alpha.subs(V, v0)), float(beta.subs(V, v0))
        states[z] = ODEState(alpha * (1 - z) - beta * z, init=al / (al + be))
    currents = gna * m**3 * h * (ena - V) + gk * n**4 * (ek - V) + gl * (el - V)
    params = {c_: 1.0, gna: 120.0, gk: 36.0, gl: 0.3, ena: 50.0, ek: -77.0, el: -54.3}
    kw = {"v_threshold": v_threshold, "firing": "crossing", "v_init": v0, **kw}
    dv = (currents + X) / c_
    return _ode("HodgkinHuxley", dv, params, kw, dt=dt, method=method, states=states)


def FitzHughNagumo(
    a: float = 0.7,
    b: float = 0.8,
    tau: float = 12.5,
    *,
    v_threshold: float = 1.0,
    dt: float = 0.1,
    method: str = "rk4",
    **kw: Any,
) -> Neuron:
    r"""FitzHugh–Nagumo (FitzHugh 1961, Biophys. J. 1:445; Nagumo et al. 1962), FitzHugh's
    values, dimensionless.

    .. math::
        \frac{dv}{dt} = v - \frac{v^3}{3} - w + I, \qquad
        \tau \frac{dw}{dt} = v + a - b w

    No reset: a spike is an upward crossing of ``v_threshold`` (1.0),
    ``firing="crossing"``. v and w start at the resting point for I = 0
    (v ≈ −1.199, w ≈ −0.624). RK4 by default (the cubic rules out ``exp_euler``).
    """
    a_, b_, w = _symbols("a b w")
    (tau_,) = _symbols("tau", "positive")
    v_rest = _fhn_rest(a, b)
    state = ODEState((V + a_ - b_ * w) / tau_, init=(v_rest + a) / b)
    kw = {"v_threshold": v_threshold, "firing": "crossing", "v_init": v_rest, **kw}
    dv = V - V**3 / 3 - w + X
    params = {a_: a, b_: b, tau_: tau}
    return _ode("FitzHughNagumo", dv, params, kw, dt=dt, method=method, states={w: state})


def _fhn_rest(a: float, b: float) -> float:
    """The real root of v − v³/3 − (v + a)/b = 0 (Newton from −1)."""
    v = -1.0
    for _ in range(60):
        f = v - v**3 / 3 - (v + a) / b
        v -= f / (1 - v**2 - 1 / b)
    return v


def ResonateAndFire(
    b: float = -0.1,
    omega: float = 1.0,
    *,
    v_threshold: float = 1.0,
    dt: float = 0.1,
    method: str = "exp_euler",
    **kw: Any,
) -> Neuron:
    r"""Resonate-and-fire (Izhikevich 2001, Neural Networks 14:883): a damped oscillator
    z = x + i·y driven by the input, firing when y reaches the threshold.

    .. math::
        \frac{dx}{dt} = b x - \omega y + I, \qquad \frac{dy}{dt} = \omega x + b y

    Here V is y (the variable compared to the threshold) and x is a state, so the
    input reaches V only through x. After a spike z ← 0 (V ← ``v_reset`` = 0 and
    x ← 0). b < 0 is the damping, ω the angular frequency (rad per time unit).
    """
    b_, om, x = _symbols("b omega x")
    state = ODEState(b_ * x - om * V + X, on_spike=x * (1 - S))
    kw = {"v_threshold": v_threshold, **kw}
    params = {b_: b, om: omega}
    states = {x: state}
    return _ode("ResonateAndFire", om * x + b_ * V, params, kw, dt=dt, method=method, states=states)


def AdLIF(
    alpha: float = math.exp(-1 / 15),
    beta: float = math.exp(-1 / 60),
    a: float = 0.5,
    b: float = 1.0,
    **kw: Any,
) -> Neuron:
    r"""Adaptive LIF of Bittar & Garner (2022, Front. Neurosci. 16:865897), as their code
    (SPARCH's ``RadLIFLayer`` without the recurrent term) writes the discrete step:

    .. math::
        w_t = \beta w_{t-1} + a u_{t-1} + b s_{t-1}, \qquad
        u_t = \alpha (u_{t-1} - s_{t-1}) + (1 - \alpha)(I_t - w_t), \qquad
        s_t = \Theta(u_t - 1)

    In symneuron's terms the subtraction u − s is the soft reset (threshold 1), so
    V[t−1] = u_{t−1} − s_{t−1}; the pre-reset u_{t−1} = V + s enters w, and a third
    state P = (a + b)·s carries the previous spike. α, β, a and b are learnable by
    default; the defaults sit inside the paper's ranges (α ∈ [e^{−1/5}, e^{−1/25}],
    β ∈ [e^{−1/30}, e^{−1/120}], a ∈ [−1, 1], b ∈ [0, 2]).
    """
    al, be, a_, b_, w, p = _symbols("alpha beta a b w P")
    w_new = be * w + a_ * V + p
    states = {
        w: State(update=w_new),
        p: State(update=sp.Integer(0), on_spike=p + (a_ + b_) * S),
    }
    kw = {"v_reset": None, "states": states, "learnable": ["alpha", "beta", "a", "b"], **kw}
    kw.setdefault("name", "AdLIF")
    charge = al * V + (1 - al) * (X - w_new)
    return Neuron(charge, params={al: alpha, be: beta, a_: a, b_: b}, **kw)


def IafCondExp(
    C_m: float = 250.0,
    g_L: float = 16.6667,
    E_L: float = -70.0,
    E_ex: float = 0.0,
    tau_syn_ex: float = 0.2,
    *,
    dt: float = 0.1,
    method: str = "exp_euler",
    **kw: Any,
) -> Neuron:
    r"""Conductance-based LIF, NEST's ``iaf_cond_exp`` (Meffin et al. 2004), excitatory
    channel, NEST's defaults (pF, nS, mV, ms).

    .. math::
        C_m \frac{dV}{dt} = -g_L (V - E_L) - g_{ex} (V - E_{ex}), \qquad
        \frac{dg_{ex}}{dt} = -\frac{g_{ex}}{\tau_{syn,ex}} + X

    The input X drives the conductance (nS/ms): a presynaptic spike of weight w is X =
    w/dt for one step. Threshold −55 mV, reset to −60 mV; NEST's 2 ms refractory
    period is not modelled (see :func:`RefractoryLIF`).
    """
    e_l, e_ex, g_ex = _symbols("E_L E_ex g_ex")
    c_, tau_ex = _symbols("C_m tau_syn_ex", "positive")
    (g,) = _symbols("g_L", "nonnegative")
    dv = (-g * (V - e_l) - g_ex * (V - e_ex)) / c_
    state = ODEState(-g_ex / tau_ex + X)
    kw = {"v_threshold": -55.0, "v_reset": -60.0, "v_init": E_L, **kw}
    params = {c_: C_m, g: g_L, e_l: E_L, e_ex: E_ex, tau_ex: tau_syn_ex}
    return _ode("IafCondExp", dv, params, kw, dt=dt, method=method, states={g_ex: state})


def IafPscExp(
    C_m: float = 250.0,
    tau_m: float = 10.0,
    E_L: float = -70.0,
    tau_syn_ex: float = 2.0,
    *,
    dt: float = 0.1,
    method: str = "exp_euler",
    **kw: Any,
) -> Neuron:
    r"""Current-based LIF with exponential synaptic current, NEST's ``iaf_psc_exp``
    (Tsodyks et al. 2000), NEST's defaults (pF, ms, mV, pA).

    .. math::
        \frac{dV}{dt} = -\frac{V - E_L}{\tau_m} + \frac{I_{syn}}{C_m}, \qquad
        \frac{dI_{syn}}{dt} = -\frac{I_{syn}}{\tau_{syn,ex}} + X

    Threshold −55 mV, reset to −70 mV; the 2 ms refractory period is not modelled.
    NEST integrates this linear system exactly; ``exp_euler`` (Brian2's method) holds
    I_syn constant over a step within V's update, so it differs by O(dt²).
    """
    e_l, i_syn = _symbols("E_L I_syn")
    c_, tm, ts = _symbols("C_m tau_m tau_syn_ex", "positive")
    dv = -(V - e_l) / tm + i_syn / c_
    state = ODEState(-i_syn / ts + X)
    kw = {"v_threshold": -55.0, "v_reset": -70.0, "v_init": E_L, **kw}
    params = {c_: C_m, tm: tau_m, e_l: E_L, ts: tau_syn_ex}
    return _ode("IafPscExp", dv, params, kw, dt=dt, method=method, states={i_syn: state})


def ThetaNeuron(*, dt: float = 0.05, method: str = "rk4", **kw: Any) -> Neuron:
    r"""Theta neuron (Ermentrout & Kopell 1986, SIAM J. Appl. Math. 46:233), the phase
    form of the quadratic integrate-and-fire neuron.

    .. math:: \frac{d\theta}{dt} = 1 - \cos\theta + (1 + \cos\theta)\, I

    V is θ; a spike when θ reaches π, then θ ← −π (the same point of the circle). θ
    starts at 0. RK4 by default.
    """
    dv = 1 - sp.cos(V) + (1 + sp.cos(V)) * X
    kw = {"v_threshold": math.pi, "v_reset": -math.pi, **kw}
    return _ode("ThetaNeuron", dv, {}, kw, dt=dt, method=method)


def RefractoryLIF(tau: float = 2.0, t_ref: float = 2.0, **kw: Any) -> Neuron:
    r"""LIF with an absolute refractory period of ``t_ref`` steps: a counter state R
    (the refractoriness of NEST's ``iaf_psc_exp`` and Brian2's ``refractory=``, in steps).

    .. math::
        H[t] = V[t-1] + [R[t-1] \le 0] \, \frac{X[t] - V[t-1]}{\tau}, \qquad
        \tilde R[t] = \max(R[t-1] - 1, 0), \qquad R[t] = \tilde R[t] + t_{ref} S[t]

    After a spike (hard reset to 0) V is held for ``t_ref`` steps, during which the
    input is ignored and no spike can occur.
    """
    (r,) = _symbols("R")
    (tau_,) = _symbols("tau", "positive")
    (t_ref_,) = _symbols("t_ref", "nonnegative")
    free = sp.Piecewise((1, r <= 0.5), (0, True))
    counter = State(update=sp.Piecewise((r - 1, r >= 1), (0, True)), on_spike=r + t_ref_ * S)
    kw = {"states": {r: counter}, **kw}
    kw.setdefault("name", "RefractoryLIF")
    return Neuron(V + free * (X - V) / tau_, params={tau_: tau, t_ref_: t_ref}, **kw)
