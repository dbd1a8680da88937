"""Discrete-time models: each only as its charge equation, with SpikingJelly's defaults.

Every function returns a :class:`~symneuron.Neuron`; nothing here is a kernel, a
derivative or an autograd function. Keyword arguments not named in a model's
signature (``v_threshold``, ``v_reset``, ``surrogate``, ``detach_reset``,
``learnable``, ``name``) go to :class:`~symneuron.Neuron`.
"""

from __future__ import annotations

import math
from typing import Any

import sympy as sp

from ..definition import H, S, State, V, X
from ..neuron import Neuron

__all__ = [
    "IF",
    "LIF",
    "PLIF",
    "QIF",
    "EIF",
    "ThresholdLIF",
    "DISCRETE",
    "Izhikevich",
    "ALIF",
    "CuLIF",
    "AdEx",
    "STATEFUL",
]

#: a time constant (in steps) is positive: a default or run-time value <= 0 is refused
_tau = sp.Symbol("tau", positive=True)
_w = sp.Symbol("w", real=True)


def _neuron(
    charge: sp.Expr, params: dict[sp.Symbol, float], name: str, kw: dict[str, Any]
) -> Neuron:
    kw.setdefault("name", name)
    return Neuron(charge, params=params, **kw)


def _leak_target(kw: dict[str, Any]) -> float | sp.Expr:
    """SpikingJelly leaks toward v_reset under hard reset and toward 0 under soft."""
    v_reset = kw.get("v_reset", 0.0)
    if v_reset is None:
        return 0.0
    return v_reset if isinstance(v_reset, sp.Expr) else float(v_reset)


def _lif_charge(decay_input: bool, target: float | sp.Expr) -> sp.Expr:
    if decay_input:
        return V + (X - (V - target)) / _tau
    return V - (V - target) / _tau + X


def IF(**kw: Any) -> Neuron:
    r"""Integrate-and-fire (Lapicque 1907; SpikingJelly ``IFNode``).

    .. math:: H[t] = V[t-1] + X[t]
    """
    return _neuron(V + X, {}, "IF", kw)


def LIF(tau: float = 2.0, decay_input: bool = True, **kw: Any) -> Neuron:
    r"""Leaky integrate-and-fire (SpikingJelly ``LIFNode``).

    .. math::
        H[t] = V[t-1] + \frac{X[t] - (V[t-1] - V_{reset})}{\tau}
        \quad\text{(decay_input)}, \qquad
        H[t] = V[t-1] - \frac{V[t-1] - V_{reset}}{\tau} + X[t]

    with :math:`V_{reset}` replaced by 0 under soft reset. Pass
    ``learnable=["tau"]`` to learn τ.
    """
    return _neuron(_lif_charge(decay_input, _leak_target(kw)), {_tau: tau}, "LIF", kw)


def ThresholdLIF(
    tau: float = 2.0, v_threshold: float = 1.0, decay_input: bool = True, **kw: Any
) -> Neuron:
    r"""LIF whose firing threshold θ is a learnable parameter (initialised to ``v_threshold``),
    SpikingJelly's ``LIFNode`` otherwise.

    .. math::
        H[t] = V[t-1] + \frac{X[t] - (V[t-1] - V_{reset})}{\tau}, \qquad
        S[t] = \Theta(H[t] - \theta)

    (``decay_input=False`` as in :func:`LIF`). dL/dθ collects −σ'(H − θ) from every
    spike and, under soft reset, −S from every reset.
    """
    theta = sp.Symbol("theta", real=True)
    kw.setdefault("learnable", ["theta"])
    charge = _lif_charge(decay_input, _leak_target(kw))
    params = {_tau: tau, theta: v_threshold}
    return _neuron(charge, params, "ThresholdLIF", {**kw, "v_threshold": theta})


def PLIF(init_tau: float = 2.0, decay_input: bool = True, **kw: Any) -> Neuron:
    r"""Parametric LIF (Fang et al. 2021; SpikingJelly ``ParametricLIFNode``): 1/τ =
    sigmoid(w), w learnable.

    .. math::
        H[t] = V[t-1] + \mathrm{sigmoid}(w)\,\bigl(X[t] - (V[t-1] - V_{reset})\bigr)
        \quad\text{(decay_input)}, \qquad
        H[t] = V[t-1] - \mathrm{sigmoid}(w)\,(V[t-1] - V_{reset}) + X[t]

    with w initialised to −log(init_tau − 1).
    """
    if init_tau <= 1:
        raise ValueError(f"PLIF needs init_tau > 1 (w = -log(init_tau - 1)), got {init_tau}")
    target = _leak_target(kw)
    k = 1 / (1 + sp.exp(-_w))
    charge = V + k * (X - (V - target)) if decay_input else V - k * (V - target) + X
    kw.setdefault("learnable", ["w"])
    return _neuron(charge, {_w: -math.log(init_tau - 1.0)}, "PLIF", kw)


def QIF(
    tau: float = 2.0, v_c: float = 0.8, a0: float = 1.0, v_rest: float = 0.0, **kw: Any
) -> Neuron:
    r"""Quadratic integrate-and-fire (SpikingJelly ``QIFNode``; v_reset defaults to −0.1).

    .. math:: H[t] = V[t-1] + \frac{X[t] + a_0 (V[t-1] - V_{rest})(V[t-1] - V_c)}{\tau}
    """
    a0_, v_c_, v_rest_ = sp.symbols("a0 v_c v_rest", real=True)
    kw.setdefault("v_reset", -0.1)
    charge = V + (X + a0_ * (V - v_rest_) * (V - v_c_)) / _tau
    return _neuron(charge, {_tau: tau, v_c_: v_c, a0_: a0, v_rest_: v_rest}, "QIF", kw)


def EIF(
    tau: float = 2.0, delta_T: float = 1.0, theta_rh: float = 0.8, v_rest: float = 0.0, **kw: Any
) -> Neuron:
    r"""Exponential integrate-and-fire (SpikingJelly ``EIFNode``; v_reset defaults to −0.1).

    .. math::
        H[t] = V[t-1] + \frac{X[t] + V_{rest} - V[t-1]
        + \Delta_T \exp\left(\frac{V[t-1] - \theta_{rt}}{\Delta_T}\right)}{\tau}
    """
    theta, v_rest_ = sp.symbols("theta_rh v_rest", real=True)
    d_t = sp.Symbol("delta_T", positive=True)
    kw.setdefault("v_reset", -0.1)
    charge = V + (X + v_rest_ - V + d_t * sp.exp((V - theta) / d_t)) / _tau
    params = {_tau: tau, d_t: delta_T, theta: theta_rh, v_rest_: v_rest}
    return _neuron(charge, params, "EIF", kw)


#: The single-state models SpikingJelly also has: name -> constructor.
DISCRETE = {
    "IF": IF,
    "LIF": LIF,
    "PLIF": PLIF,
    "QIF": QIF,
    "EIF": EIF,
    "ThresholdLIF": ThresholdLIF,
}


# -- neurons with extra state variables ------------------------------------------------

_W, _A, _I = sp.symbols("W A I", real=True)


def Izhikevich(
    tau: float = 2.0,
    v_c: float = 0.8,
    a0: float = 1.0,
    v_rest: float = -0.1,
    w_rest: float = 0.0,
    tau_w: float = 2.0,
    a: float = 0.0,
    b: float = 0.0,
    **kw: Any,
) -> Neuron:
    r"""Izhikevich neuron as SpikingJelly's ``IzhikevichNode`` (its equations and defaults).

    .. math::
        H[t] &= V[t-1] + \frac{X[t] + a_0 (V[t-1] - V_{rest})(V[t-1] - V_c) - W[t-1]}{\tau} \\
        \tilde W[t] &= W[t-1] + \frac{a (H[t] - V_{rest}) - W[t-1]}{\tau_w}, \qquad
        W[t] = \tilde W[t] + b\,S[t]

    W starts at ``w_rest``. With ``a = b = 0`` (the defaults) W stays at ``w_rest``.
    """
    a0_, v_c_, v_rest_, a_, b_ = sp.symbols("a0 v_c v_rest a b", real=True)
    tau_w_ = sp.Symbol("tau_w", positive=True)
    charge = V + (X + a0_ * (V - v_rest_) * (V - v_c_) - _W) / _tau
    state = State(update=_W + (a_ * (H - v_rest_) - _W) / tau_w_, on_spike=_W + b_ * S, init=w_rest)
    params = {_tau: tau, v_c_: v_c, a0_: a0, v_rest_: v_rest, tau_w_: tau_w, a_: a, b_: b}
    return _neuron(charge, params, "Izhikevich", {"states": {_W: state}, **kw})


def ALIF(
    tau: float = 2.0, rho: float = 0.9, beta: float = 0.5, b0: float = 1.0, **kw: Any
) -> Neuron:
    r"""Adaptive-threshold LIF (Bellec et al. 2018): the threshold rises with each spike.

    .. math::
        H[t] &= V[t-1] + \frac{X[t] - V[t-1]}{\tau}, \qquad \tilde A[t] = \rho A[t-1] \\
        S[t] &= \Theta(H[t] - (b_0 + \beta \tilde A[t])), \qquad
        A[t] = \tilde A[t] + (1 - \rho) S[t]

    Soft reset by default (V ← H − V_th S, with the adaptive V_th).
    """
    rho_, beta_, b0_ = sp.symbols("rho beta b0", real=True)
    kw.setdefault("v_reset", None)
    state = State(update=rho_ * _A, on_spike=_A + (1 - rho_) * S)
    params = {_tau: tau, rho_: rho, beta_: beta, b0_: b0}
    kw = {"states": {_A: state}, "v_threshold": b0_ + beta_ * _A, **kw}
    return _neuron(V + (X - V) / _tau, params, "ALIF", kw)


def CuLIF(tau: float = 2.0, tau_syn: float = 4.0, **kw: Any) -> Neuron:
    r"""Current-based LIF (Norse's ``LIFCell``; Gerstner et al. 2014): a synaptic current
    I filters the input.

    .. math::
        \tilde I[t] = I[t-1] \left(1 - \frac{1}{\tau_{syn}}\right) + X[t], \qquad
        H[t] = V[t-1] + \frac{\tilde I[t] - (V[t-1] - V_{reset})}{\tau}

    (H is written with Ĩ expanded, since the charge sees I[t−1].)
    """
    tau_syn_ = sp.Symbol("tau_syn", positive=True)
    current = _I * (1 - 1 / tau_syn_) + X
    charge = V + (current - (V - _leak_target(kw))) / _tau
    state = State(update=current)
    return _neuron(charge, {_tau: tau, tau_syn_: tau_syn}, "CuLIF", {"states": {_I: state}, **kw})


def AdEx(
    tau: float = 2.0,
    delta_T: float = 1.0,
    theta_rh: float = 0.8,
    v_rest: float = 0.0,
    tau_w: float = 4.0,
    a: float = 0.1,
    b: float = 0.05,
    **kw: Any,
) -> Neuron:
    r"""Adaptive exponential integrate-and-fire (Brette & Gerstner 2005), EIF plus adaptation.

    .. math::
        H[t] &= V[t-1] + \frac{X[t] + V_{rest} - V[t-1]
              + \Delta_T e^{(V[t-1] - \theta_{rh})/\Delta_T} - W[t-1]}{\tau} \\
        \tilde W[t] &= W[t-1] + \frac{a (V[t-1] - V_{rest}) - W[t-1]}{\tau_w}, \qquad
        W[t] = \tilde W[t] + b\,S[t]

    v_reset defaults to −0.1 as in :func:`EIF`.
    """
    theta, v_rest_, a_, b_ = sp.symbols("theta_rh v_rest a b", real=True)
    d_t, tau_w_ = sp.symbols("delta_T tau_w", positive=True)
    kw.setdefault("v_reset", -0.1)
    charge = V + (X + v_rest_ - V + d_t * sp.exp((V - theta) / d_t) - _W) / _tau
    state = State(update=_W + (a_ * (V - v_rest_) - _W) / tau_w_, on_spike=_W + b_ * S)
    params = {
        _tau: tau,
        d_t: delta_T,
        theta: theta_rh,
        v_rest_: v_rest,
        tau_w_: tau_w,
        a_: a,
        b_: b,
    }
    return _neuron(charge, params, "AdEx", {"states": {_W: state}, **kw})


#: Zoo models with extra state variables (``simulate`` returns their states too).
STATEFUL = {"Izhikevich": Izhikevich, "ALIF": ALIF, "CuLIF": CuLIF, "AdEx": AdEx}
