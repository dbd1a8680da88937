"""Conductance-based models written from their papers: Wang–Buzsáki, Morris–Lecar and
Pospischil et al.'s regular-spiking cell, each as its differential equations
(:meth:`~symneuron.Neuron.from_ode`), in mV, ms, µF/cm², mS/cm² and µA/cm².

Like :func:`~symneuron.models.HodgkinHuxley`, they have no reset: a spike is an upward
crossing of ``v_threshold`` (``firing="crossing"``), V starts where each model's docstring
says and the gates at their steady states there. Each docstring gives the model's
equations and every parameter value with its source. Keyword arguments not named in a
signature go to :class:`~symneuron.Neuron`.
"""

from __future__ import annotations

from typing import Any

import sympy as sp

from ..definition import V, X
from ..neuron import Neuron
from ..ode import ODEState
from .papers import vtrap

__all__ = ["WangBuzsaki", "MorrisLecar", "Pospischil2008"]


def _gates(
    rates: dict[sp.Symbol, tuple[sp.Expr, sp.Expr]],
    v0: float,
    values: dict[sp.Symbol, float],
    phi: float | sp.Expr = 1,
) -> dict[sp.Symbol, ODEState]:
    """dz/dt = φ (α_z (1 − z) − β_z z) for each gate, starting at its steady state at
    V = v0 (the params at their ``values``)."""
    out = {}
    for z, (alpha, beta) in rates.items():
        a, b = float(alpha.subs({V: v0, **values})), float(beta.subs({V: v0, **values}))
        out[z] = ODEState(phi * (alpha * (1 - z) - beta * z), init=a / (a + b))
    return out


def _crossing(name: str, dv: sp.Expr, params: dict, states: dict, kw: dict, **at: Any) -> Neuron:
    kw = {"firing": "crossing", **kw}
    kw.setdefault("name", name)
    return Neuron.from_ode(dv, params=params, states=states, **at, **kw)


def WangBuzsaki(
    *, dt: float = 0.05, method: str = "rk4", v_threshold: float = 0.0, **kw: Any
) -> Neuron:
    r"""The fast-spiking interneuron of Wang & Buzsáki (1996, J. Neurosci. 16(20):6402),
    their eqs. 1–3 and values.

    .. math::
        C \frac{dV}{dt} &= -g_{Na} m_\infty^3 h (V - E_{Na}) - g_K n^4 (V - E_K)
            - g_L (V - E_L) + I \\
        \frac{dz}{dt} &= \phi (\alpha_z (1 - z) - \beta_z z), \quad z \in \{h, n\}

    with m_∞ = α_m/(α_m + β_m), α_m = 0.1 vtrap(−(V+35), 10), β_m = 4 e^{−(V+60)/18},
    α_h = 0.07 e^{−(V+58)/20}, β_h = 1/(e^{−(V+28)/10} + 1), α_n = 0.01 vtrap(−(V+34), 10),
    β_n = 0.125 e^{−(V+44)/80}; C = 1, g_Na = 35, g_K = 9, g_L = 0.1, E_Na = 55,
    E_K = −90, E_L = −65, φ = 5. Three coupled equations (V, h, n); m_∞(V) makes V's
    nonlinear in V, so ``exp_euler`` does not apply: RK4 at 0.05 ms by default. V starts
    at the resting potential, −64.02 mV, where dV/dt = 0 at I = 0 with h and n at their
    steady states (which they start at); it fires repetitively from I ≈ 0.2 µA/cm².
    """
    h, n = sp.symbols("h n", real=True)
    ena, ek, el = sp.symbols("E_Na E_K E_L", real=True)
    c_, phi = sp.symbols("C phi", positive=True)
    gna, gk, gl = sp.symbols("g_Na g_K g_L", nonnegative=True)
    alpha_m, beta_m = 0.1 * vtrap(-(V + 35), 10), 4 * sp.exp(-(V + 60) / 18)
    rates = {
        h: (0.07 * sp.exp(-(V + 58) / 20), 1 / (sp.exp(-(V + 28) / 10) + 1)),
        n: (0.01 * vtrap(-(V + 34), 10), 0.125 * sp.exp(-(V + 44) / 80)),
    }
    m_inf = alpha_m / (alpha_m + beta_m)
    currents = gna * m_inf**3 * h * (ena - V) + gk * n**4 * (ek - V) + gl * (el - V)
    params = {c_: 1.0, gna: 35.0, gk: 9.0, gl: 0.1, ena: 55.0, ek: -90.0, el: -65.0, phi: 5.0}
    odes = {z: a * (1 - z) - b * z for z, (a, b) in rates.items()}
    v0 = _resting_potential((currents + X) / c_, odes, params, -70.0, -60.0)
    kw = {"v_threshold": v_threshold, "v_init": v0, **kw}
    states = _gates(rates, v0, params, phi)
    return _crossing("WangBuzsaki", (currents + X) / c_, params, states, kw, dt=dt, method=method)


def MorrisLecar(
    *, dt: float = 0.1, method: str = "rk4", v_threshold: float = 0.0, **kw: Any
) -> Neuron:
    r"""Morris & Lecar (1981, Biophys. J. 35:193), the reduced two-variable form (their
    eqs. 6–7), with the "Hopf" values of Rinzel & Ermentrout (1989, in Koch & Segev,
    Methods in Neuronal Modeling, ch. 5, Table 1).

    .. math::
        C \frac{dV}{dt} &= -g_L (V - V_L) - g_{Ca} M_\infty (V - V_{Ca}) - g_K w (V - V_K)
            + I \\
        \frac{dw}{dt} &= \phi \cosh\frac{V - V_3}{2 V_4} (w_\infty - w)

    with M_∞ = (1 + tanh((V − V_1)/V_2))/2, w_∞ = (1 + tanh((V − V_3)/V_4))/2 (w is the
    paper's N, named as by Rinzel and Ermentrout: Brian2 reserves N); C = 20, g_L = 2,
    V_L = −60, g_Ca = 4.4, V_Ca = 120, g_K = 8, V_K = −84, V_1 = −1.2, V_2 = 18, V_3 = 2,
    V_4 = 30, φ = 0.04. M_∞(V) makes V's equation nonlinear in V, so ``exp_euler``
    does not apply: RK4 at 0.1 ms by default. V starts at the resting potential,
    −60.85 mV, where dV/dt = 0 at I = 0 with w at its steady state (which it starts at);
    it fires repetitively for I ≳ 100 µA/cm².
    """
    n = sp.Symbol("w", real=True)
    vl, vca, vk, v1, v3 = sp.symbols("V_L V_Ca V_K V_1 V_3", real=True)
    c_, v2, v4, phi = sp.symbols("C V_2 V_4 phi", positive=True)
    gl, gca, gk = sp.symbols("g_L g_Ca g_K", nonnegative=True)
    m_inf = (1 + sp.tanh((V - v1) / v2)) / 2
    n_inf = (1 + sp.tanh((V - v3) / v4)) / 2
    dv = (-gl * (V - vl) - gca * m_inf * (V - vca) - gk * n * (V - vk) + X) / c_
    values = {c_: 20.0, gl: 2.0, vl: -60.0, gca: 4.4, vca: 120.0, gk: 8.0, vk: -84.0}
    values.update({v1: -1.2, v2: 18.0, v3: 2.0, v4: 30.0, phi: 0.04})
    v0 = _resting_potential(dv, {n: n_inf - n}, values, -70.0, -50.0)
    n0 = float(n_inf.subs({V: v0, v3: 2.0, v4: 30.0}))
    state = ODEState(phi * sp.cosh((V - v3) / (2 * v4)) * (n_inf - n), init=n0)
    kw = {"v_threshold": v_threshold, "v_init": v0, **kw}
    return _crossing("MorrisLecar", dv, values, {n: state}, kw, dt=dt, method=method)


def _resting_potential(
    dv: sp.Expr, odes: dict[sp.Symbol, sp.Expr], values: dict, lo: float, hi: float
) -> float:
    """The V in [lo, hi] where dV/dt = 0 at X = 0 with every state z at its steady state
    there (each dz/dt = a z + b, so z = −b/a), by bisection to the last bit."""
    steady = {z: -g.xreplace({z: 0}) / sp.diff(g, z) for z, g in odes.items()}
    current = sp.lambdify(V, dv.xreplace(steady).xreplace({**values, X: 0}), "math")
    rising = current(lo) > 0
    while lo < (mid := (lo + hi) / 2) < hi:
        lo, hi = (mid, hi) if (current(mid) > 0) == rising else (lo, mid)
    return lo


def Pospischil2008(
    *, dt: float = 0.025, method: str = "exp_euler", v_threshold: float = 0.0, **kw: Any
) -> Neuron:
    r"""The regular-spiking (RS) cortical cell of Pospischil et al. (2008, Biol. Cybern.
    99:427), a Traub-type model with a slow M current.

    .. math::
        C \frac{dV}{dt} &= -g_L (V - E_L) - g_{Na} m^3 h (V - E_{Na}) - g_{Kd} n^4 (V - E_K)
            - g_M p (V - E_K) + I \\
        \frac{dz}{dt} &= \alpha_z (1 - z) - \beta_z z, \quad z \in \{m, h, n\}, \qquad
        \frac{dp}{dt} = \frac{p_\infty - p}{\tau_p}

    with (u = V − V_T) α_m = 0.32 vtrap(−(u − 13), 4), β_m = 0.28 vtrap(u − 40, 5),
    α_h = 0.128 e^{−(u−17)/18}, β_h = 4/(1 + e^{−(u−40)/5}), α_n = 0.032 vtrap(−(u − 15), 5),
    β_n = 0.5 e^{−(u−10)/40}, p_∞ = 1/(1 + e^{−(V+35)/10}),
    τ_p = τ_max/(3.3 e^{(V+35)/20} + e^{−(V+35)/20}): the authors' NEURON mechanisms
    (ModelDB 123623, ``HH_traub.mod`` and ``IM_cortex.mod`` at 36 °C, where their
    temperature factors are 1). The values of the paper's RS cell, each as two
    implementations that cite the paper give it, agreeing on every one (the Brain Dynamics
    Toolbox's ``models/Pospischil2008.m``, case ``'RS'``, and PySONIC's ``CorticalRS``, in
    S/m² and s; the paper's own table was not at hand): C = 1 µF/cm², g_L = 0.0205 mS/cm²
    (2.05e−5 S/cm²), E_L = −70.3 mV, g_Na = 56 mS/cm², g_Kd = 6 mS/cm², g_M = 0.075 mS/cm²,
    τ_max = 608 ms, V_T = −56.2 mV, E_Na = 50 mV, E_K = −90 mV. (ModelDB's own demo,
    ``sPY_template``, sets E_K = −100 mV, with generic values rather than the fitted RS
    ones: g_L = 0.1 mS/cm², E_L = −70, V_T = −55, g_Na = 50, g_Kd = 5, g_M = 0.07,
    τ_max = 1000 ms.) Five equations (V, m, h, n, p), each linear in its own variable.
    V starts at the model's resting potential, −71.91 mV (−71.9 in both sources), where
    dV/dt = 0 at I = 0 with every gate at its steady state; the gates start there too.
    """
    m, h, n, p = sp.symbols("m h n p", real=True)
    el, ena, ek, vt = sp.symbols("E_L E_Na E_K V_T", real=True)
    c_, tmax = sp.symbols("C tau_max", positive=True)
    gl, gna, gkd, gm = sp.symbols("g_L g_Na g_Kd g_M", nonnegative=True)
    values = {c_: 1.0, gl: 0.0205, el: -70.3, gna: 56.0, gkd: 6.0, gm: 0.075, tmax: 608.0}
    values.update({vt: -56.2, ena: 50.0, ek: -90.0})
    u = V - vt
    rates = {
        m: (0.32 * vtrap(-(u - 13), 4), 0.28 * vtrap(u - 40, 5)),
        h: (0.128 * sp.exp(-(u - 17) / 18), 4 / (1 + sp.exp(-(u - 40) / 5))),
        n: (0.032 * vtrap(-(u - 15), 5), 0.5 * sp.exp(-(u - 10) / 40)),
    }
    p_inf = 1 / (1 + sp.exp(-(V + 35) / 10))
    tau_p = tmax / (3.3 * sp.exp((V + 35) / 20) + sp.exp(-(V + 35) / 20))
    currents = gl * (el - V) + gna * m**3 * h * (ena - V) + gkd * n**4 * (ek - V)
    dv = (currents + gm * p * (ek - V) + X) / c_
    odes = {z: a * (1 - z) - b * z for z, (a, b) in rates.items()}
    v0 = _resting_potential(dv, {**odes, p: (p_inf - p) / tau_p}, values, -80.0, -60.0)
    states = _gates(rates, v0, values)
    states[p] = ODEState((p_inf - p) / tau_p, init=float(p_inf.subs(V, v0)))
    kw = {"v_threshold": v_threshold, "v_init": v0, **kw}
    return _crossing("Pospischil2008", dv, values, states, kw, dt=dt, method=method)
