"""Noisy neurons from the literature: membrane noise and escape noise (docs/noise.md).

Their draws come from the kernels' counter-based generator, keyed by the run's seed
(``sn.simulate(..., seed=...)``, ``NeuronLayer(..., seed=...)``): a fixed seed gives one
path on every backend, and the backward sees the forward's draws. They are kept out of
:data:`symneuron.models.ZOO`, whose tests compare backends run without a common seed.
"""

from __future__ import annotations

from typing import Any

import sympy as sp

from ..definition import H, V, X
from ..neuron import Neuron
from ..symbols import XI

__all__ = ["NoisyLIF", "EscapeLIF", "NOISY"]


def NoisyLIF(
    tau: float = 20.0,
    mu: float = 24.0,
    sigma: float = 5.0,
    v_threshold: float = 20.0,
    v_reset: float = 10.0,
    *,
    dt: float = 0.1,
    **kw: Any,
) -> Neuron:
    r"""LIF with Gaussian white membrane noise, as in Brunel (2000), J Comput Neurosci
    8:183–208 (eq. 1 with the external input's mean and fluctuations, section 3), in ms
    and mV.

    .. math::
        \tau \frac{dV}{dt} = -V + \mu + X + \sigma \sqrt{\tau}\, \xi(t)

    with ξ Gaussian white noise (⟨ξ(t)ξ(t')⟩ = δ(t − t'), units 1/√ms); a spike at
    V ≥ θ = 20 mV, then V ← V_r = 10 mV (Brunel's values; his 2 ms refractory period is
    left out). Integrated by Euler–Maruyama with step ``dt``:
    V' = V + dt(μ + X − V)/τ + σ √(dt/τ) ζ, ζ ~ N(0, 1). Without threshold, V is an
    Ornstein–Uhlenbeck process of mean μ + X and variance σ²/2. The defaults μ = 24 mV,
    σ = 5 mV put the neuron above threshold on average, firing irregularly; X adds to μ.
    """
    tau_ = sp.Symbol("tau", positive=True)
    mu_, sigma_ = sp.symbols("mu sigma", real=True)
    dv = (-V + mu_ + X) / tau_ + sigma_ * XI / sp.sqrt(tau_)
    kw.setdefault("name", "NoisyLIF")
    params = {tau_: tau, mu_: mu, sigma_: sigma}
    return Neuron.from_ode(
        dv, dt=dt, method="euler", params=params, v_threshold=v_threshold, v_reset=v_reset, **kw
    )


def EscapeLIF(
    tau: float = 10.0,
    e_l: float = -65.0,
    theta: float = -50.0,
    delta: float = 2.0,
    tau_esc: float = 1.0,
    v_reset: float = -65.0,
    *,
    dt: float = 0.1,
    **kw: Any,
) -> Neuron:
    r"""LIF with escape noise: an exponential escape rate (Gerstner, Kistler, Naud and
    Paninski 2014, *Neuronal Dynamics*, §9.1, eq. 9.6; fitted to cortical neurons by
    Jolivet, Rauch, Lüscher and Gerstner 2006, J Comput Neurosci 21:35–49), in ms and mV.

    .. math::
        \tau \frac{dV}{dt} = E_L - V + X, \qquad
        \rho(V) = \frac{1}{\tau_{esc}} e^{(V - \vartheta)/\Delta}, \qquad
        p = 1 - e^{-\,dt\,\rho(H)}

    V is integrated by Euler's method with step ``dt`` to H; the neuron fires with the
    probability p of at least one escape event in the step (Neuronal Dynamics eq. 9.17:
    the hazard integrated over dt), S = [u < p], then V ← ``v_reset``. The exponent is
    capped at 20 (p = 1 to float precision well before), so that p and dp/dH stay finite
    for any H. The backward takes dp/dH for dS/dH (straight through p). Defaults: a
    10 ms membrane at rest at −65 mV, ϑ = −50 mV, Δ = 2 mV, τ_esc = 1 ms.
    """
    tau_, tau_esc_, delta_ = sp.symbols("tau tau_esc delta", positive=True)
    e_l_, theta_ = sp.symbols("e_l theta", real=True)
    rate = sp.exp(sp.Min((H - theta_) / delta_, 20)) / tau_esc_
    kw.setdefault("name", "EscapeLIF")
    params = {tau_: tau, e_l_: e_l, theta_: theta, delta_: delta, tau_esc_: tau_esc}
    return Neuron.from_ode(
        (e_l_ - V + X) / tau_,
        dt=dt,
        method="euler",
        params=params,
        firing="escape",
        spike_probability=1 - sp.exp(-dt * rate),
        v_threshold=theta,
        v_reset=v_reset,
        v_init=e_l,
        **kw,
    )


#: The noisy models: name -> constructor.
NOISY = {"NoisyLIF": NoisyLIF, "EscapeLIF": EscapeLIF}
