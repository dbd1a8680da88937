"""EventProp's derivation (symneuron/derivation/events.py): the adjoint's dynamics, the
jump at a spike, the target term and the per-spike store, against Wunderlich & Pehle
2021 (Sci Rep 11:12829, Table 2 and eq. 2) written out here from the paper's formulas,
and the refusals, each with its reason."""

from __future__ import annotations

import pytest
import sympy as sp

import symneuron as sn
from symneuron.derivation.events import EventPropError

V, X = sn.V, sn.X
tau_m, tau_s, theta, v_r = sp.symbols("tau_m tau_s theta v_r", positive=True)
I_SYN = sp.Symbol("I", real=True)


def _lif(**kw: object) -> sn.Neuron:
    """W&P's LIF with a current synapse: τ_m V' = −V + I, τ_s I' = −I (+ input)."""
    return sn.Neuron.from_ode(
        (-V + I_SYN) / tau_m,
        dt=1.0,
        method="exact",
        params={tau_m: 10.0, tau_s: 5.0, theta: 1.0},
        states={I_SYN: sn.ODEState(-I_SYN / tau_s + X)},
        **{"v_threshold": theta, "v_reset": 0.0, **kw},  # type: ignore[arg-type]
    )


def _zero(expr: sp.Expr) -> bool:
    """Whether ``expr`` is 0; symbols are matched by name (the neuron's own are real,
    these positive)."""
    expr = sp.sympify(expr)
    expr = expr.xreplace({s: sp.Symbol(s.name, real=True) for s in expr.free_symbols})
    return sp.simplify(sp.nsimplify(sp.expand(expr))) == 0


def test_lif_jump_is_wunderlich_pehle_table_2() -> None:
    spec = _lif().events()
    lam_v, lam_i = spec.adjoints
    big_v, big_i = sp.symbols("Lambda_V Lambda_I", real=True)  # W&P: Λ_V = −λ_V/τ_m ...
    i_minus, k_term = sp.symbols("I_minus K", real=True)
    # Table 2, transition condition at a spike of neuron n (V⁻ = ϑ, V̇⁻ = (I⁻ − ϑ)/τ_mem):
    #   Λ_V⁻ = Λ_V⁺ + [ϑΛ_V⁺ + (Wᵀ(Λ_V − Λ_I))_n + ∂l_p/∂t_k + l_V⁻ − l_V⁺]/(τ_mem V̇⁻)
    #   Λ_I⁻ = Λ_I⁺
    # K is the bracket's sum after ϑΛ_V⁺; in EVENTPROP.md's convention B = −K.
    v_dot = (i_minus - theta) / tau_m
    table_v = big_v + (theta * big_v + k_term) / (tau_m * v_dot)
    table_i = big_i
    ours = {lam_v: -tau_m * big_v, lam_i: -tau_s * big_i, spec.coupling: -k_term}
    at = {I_SYN: i_minus}
    derived_v = -spec.jump[0].xreplace(at).xreplace(ours) / tau_m
    derived_i = -spec.jump[1].xreplace(at).xreplace(ours) / tau_s
    assert _zero(derived_v - table_v)
    assert _zero(derived_i - table_i)
    # free dynamics (′ = −d/dt): τ_mem Λ_V′ = −Λ_V, τ_syn Λ_I′ = −Λ_I + Λ_V
    rate_v, rate_i = (-r for r in spec.adjoint_rhs)  # −dλ/dt
    prime_v = rate_v.xreplace(ours) * (-1 / tau_m)
    prime_i = rate_i.xreplace(ours) * (-1 / tau_s)
    assert _zero(tau_m * prime_v + big_v)
    assert _zero(tau_s * prime_i + big_i - big_v)
    # eq. 2: dL/dw_ji = −τ_syn Σ_k (Λ_I)_j at the arrivals
    assert _zero(spec.weight_partial.dot(sp.Matrix(spec.adjoints)).xreplace(ours) + tau_s * big_i)


def test_lif_rate_store_and_target_term() -> None:
    spec = _lif().events()
    lam_v, lam_i = spec.adjoints
    w = spec.weight
    assert spec.linear and spec.store == (I_SYN,)
    assert _zero(spec.rate_at_spike - (I_SYN - theta) / tau_m)
    assert _zero(spec.target_term - w * (lam_v / tau_m - lam_i / tau_s))
    assert list(spec.synapse) == [V, I_SYN + w]
    assert _zero(spec.jump[0] - (I_SYN * lam_v + tau_m * spec.coupling) / (I_SYN - theta))
    # dL/dϑ per spike: −(saltation + B)/ġ⁻ = −λ_V⁻ (EVENTPROP.md (c) 6)
    assert _zero(spec.spike_partials["theta"] + spec.jump[0])
    # the closed-form flow: [[e^{−s/τm}, τs(e^{−s/τm} − e^{−s/τs})/(τm − τs)], [0, e^{−s/τs}]]
    s = spec.elapsed
    coupling = tau_s * (sp.exp(-s / tau_m) - sp.exp(-s / tau_s)) / (tau_m - tau_s)
    want = sp.Matrix([[sp.exp(-s / tau_m), coupling], [0, sp.exp(-s / tau_s)]])
    assert spec.flow is not None and all(map(_zero, spec.flow - want))


def test_soft_reset_gives_the_same_jump_at_the_threshold() -> None:
    hard, soft = _lif().events(), _lif(v_reset=None).events()
    assert _zero(hard.jump[0] - soft.jump[0]) and _zero(hard.jump[1] - soft.jump[1])


def test_a_named_target_state() -> None:
    spec = _lif().events(target="I")
    assert list(spec.synapse) == [V, I_SYN + spec.weight]
    with pytest.raises(EventPropError, match="not a state"):
        _lif().events(target="J")


def test_qif_derivation() -> None:
    """A nonlinear neuron: τ_m V' = V² + I with a current synapse, reset to v_r."""
    qif = sn.Neuron.from_ode(
        (V**2 + I_SYN) / tau_m,
        dt=0.1,
        method="rk4",
        params={tau_m: 10.0, tau_s: 5.0, theta: 1.0, v_r: 0.5},
        states={I_SYN: sn.ODEState(-I_SYN / tau_s + X)},
        v_threshold=theta,
        v_reset=-v_r,
    )
    spec = qif.events()
    lam_v, lam_i = spec.adjoints
    assert not spec.linear and spec.flow is None and spec.store == (I_SYN,)
    assert _zero(spec.jacobian[0, 0] - 2 * V / tau_m)
    assert _zero(spec.rate_at_spike - (theta**2 + I_SYN) / tau_m)
    want = (lam_v * (v_r**2 + I_SYN) + tau_m * spec.coupling) / (theta**2 + I_SYN)
    assert _zero(spec.jump[0] - want) and spec.jump[1] == lam_i
    assert _zero(spec.target_term - spec.weight * (lam_v / tau_m - lam_i / tau_s))
    assert _zero(spec.spike_partials["v_r"] + lam_v)  # λ⁺·∂h/∂v_r, h_V = −v_r
    assert _zero(spec.spike_partials["theta"] + spec.jump[0])


def _refused(match: str, dv: sp.Expr, states: dict | None = None, **kw: object) -> None:
    neuron = sn.Neuron.from_ode(
        dv,
        dt=0.5,
        method=kw.pop("method", "exact"),  # type: ignore[arg-type]
        params={tau_m: 10.0, tau_s: 5.0},
        states=states,
        **kw,
    )
    with pytest.raises(EventPropError, match=match):
        neuron.events()


SYNAPSE = {I_SYN: sn.ODEState(-I_SYN / tau_s + X)}


def test_refuses_a_threshold_without_dynamics() -> None:
    _refused("vanishes on the threshold", sp.Integer(0) * V, {I_SYN: sn.ODEState(X)})


@pytest.mark.parametrize("v_reset", [1.0, 1.5])
def test_refuses_a_reset_at_or_above_the_threshold(v_reset: float) -> None:
    _refused("does not leave the threshold", (-V + I_SYN) / tau_m, SYNAPSE, v_reset=v_reset)


def test_refuses_crossing_firing() -> None:
    _refused("crossings without a reset", (-V + I_SYN) / tau_m, SYNAPSE, firing="crossing")


def test_refuses_noise() -> None:
    _refused("random numbers", (-V + I_SYN) / tau_m + 0.1 * sn.xi, SYNAPSE, method="euler")


def test_refuses_a_discrete_time_charge() -> None:
    with pytest.raises(EventPropError, match="not built from differential equations"):
        sn.models.CuLIF().events()


def test_refuses_an_input_through_a_state_dependent_gain() -> None:
    """A conductance input, dV/dt ∋ X·(E − V): ∂f/∂X depends on V."""
    _refused("depends on the state", -V / tau_m + X * (2.0 - V), method="rk4")


def test_refuses_an_input_that_jumps_the_threshold_function() -> None:
    _refused("jumps the threshold function", (-V + X) / tau_m)
