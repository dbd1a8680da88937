"""Nonlinear ODE neurons with a current synapse (a second state that the spike input
jumps), for the EventProp tests: QIF, EIF and AdEx, in units where V rests at 0 and the
threshold is 1 to 1.5 (ms, τ_m = 10, τ_s = 5, as the LIF of
tests/test_eventprop_reference.py), each integrated by RK4 in the EventProp reference."""

from __future__ import annotations

import sympy as sp

import symneuron as sn

V, X = sn.V, sn.X
tau_m, tau_s, theta, v_c = sp.symbols("tau_m tau_s theta v_c", positive=True)
delta_t, theta_rh, tau_w, a, b = sp.symbols("delta_T theta_rh tau_w a b", positive=True)
I_SYN, W_ADAPT = sp.Symbol("I", real=True), sp.Symbol("W", real=True)
SYNAPSE = {I_SYN: sn.ODEState(-I_SYN / tau_s + X)}


def qif(dt: float = 0.5) -> sn.Neuron:
    """τ_m dV/dt = V(V − v_c) + I, τ_s dI/dt = −I (+ spikes): spike at ϑ = 1, reset to 0."""
    return sn.Neuron.from_ode(
        (V * (V - v_c) + I_SYN) / tau_m,
        dt=dt,
        method="rk4",
        params={tau_m: 10.0, tau_s: 5.0, theta: 1.0, v_c: 0.5},
        states=SYNAPSE,
        v_threshold=theta,
        v_reset=0.0,
        name="QIFsyn",
    )


def eif(dt: float = 0.5) -> sn.Neuron:
    """τ_m dV/dt = −V + Δ_T e^{(V − ϑ_rh)/Δ_T} + I: spike at ϑ = 1.5, reset to 0."""
    return sn.Neuron.from_ode(
        (-V + delta_t * sp.exp((V - theta_rh) / delta_t) + I_SYN) / tau_m,
        dt=dt,
        method="rk4",
        params={tau_m: 10.0, tau_s: 5.0, theta: 1.5, delta_t: 0.5, theta_rh: 0.8},
        states=SYNAPSE,
        v_threshold=theta,
        v_reset=0.0,
        name="EIFsyn",
    )


def adex(dt: float = 0.5) -> sn.Neuron:
    """The EIF with adaptation: − W in dV/dt, τ_w dW/dt = aV − W, W ← W + b at a spike."""
    return sn.Neuron.from_ode(
        (-V + delta_t * sp.exp((V - theta_rh) / delta_t) - W_ADAPT + I_SYN) / tau_m,
        dt=dt,
        method="rk4",
        params={
            tau_m: 10.0,
            tau_s: 5.0,
            theta: 1.5,
            delta_t: 0.5,
            theta_rh: 0.8,
            tau_w: 30.0,
            a: 0.1,
            b: 0.05,
        },
        states={
            **SYNAPSE,
            W_ADAPT: sn.ODEState((a * V - W_ADAPT) / tau_w, on_spike=W_ADAPT + b * sn.S),
        },
        v_threshold=theta,
        v_reset=0.0,
        name="AdExsyn",
    )
