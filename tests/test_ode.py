"""Neurons as ODEs (``sn.Neuron.from_ode``) and inputs that reach V only through a state.

Oracles: closed-form solutions of linear ODEs and the methods' textbook formulas,
written out here independently of ``symneuron.ode``; ``sn.check`` (finite differences
and the float64 torch reference) for gradients and kernels.
"""

from __future__ import annotations

import math

import pytest
import sympy as sp
import torch

import symneuron as sn

tau, a, b, k, e_syn, tau_g = sp.symbols("tau a b k E tau_g", real=True)
V, X = sn.V, sn.X
W = sp.Symbol("W", real=True)


def _same(x: sp.Expr, y: sp.Expr) -> bool:
    """Equal as functions: at seeded random points, to 1e-12 (floats in ``dt`` round)."""
    rng = torch.Generator().manual_seed(0)
    symbols = sorted(x.free_symbols | y.free_symbols, key=str)
    for _ in range(5):
        point = {z: float(torch.rand((), generator=rng, dtype=torch.float64)) for z in symbols}
        if abs(float(x.evalf(subs=point)) - float(y.evalf(subs=point))) > 1e-12:
            return False
    return True


def test_exp_euler_of_a_linear_ode_is_its_exact_step() -> None:
    """dV/dt = (X − V)/τ with X constant: V(t + h) = X + (V − X) e^{−h/τ}."""
    h = 0.7
    neuron = sn.Neuron.from_ode((X - V) / tau, dt=h, params={tau: 2.0})
    assert _same(neuron.inline_stages(neuron.charge), X + (V - X) * sp.exp(-sp.Float(h) / tau))
    # and numerically, over many steps, against the closed form
    t_len = 30
    x = torch.full((t_len, 1), 0.4, dtype=torch.float64)
    _, v = sn.simulate(neuron, x, v_init=0.1, backend="cpu")
    times = torch.arange(1, t_len + 1, dtype=torch.float64) * h
    exact = 0.4 + (0.1 - 0.4) * torch.exp(-times / 2.0)
    torch.testing.assert_close(v[:, 0], exact, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("method", "order"), [("euler", 1), ("rk2", 2), ("rk4", 4)], ids=["euler", "rk2", "rk4"]
)
def test_explicit_methods_are_their_taylor_polynomials_on_linear_odes(
    method: str, order: int
) -> None:
    """On dV/dt = aV + b each method is the Taylor polynomial of exp(ah) of its order:
    V' = V + (aV + b) Σ_{j=1..order} a^{j−1} h^j / j!."""
    h = sp.Rational(1, 4)
    neuron = sn.Neuron.from_ode(a * V + b * X, dt=0.25, method=method, params={a: -0.5, b: 1.0})
    series = sum(a ** (j - 1) * h**j / math.factorial(j) for j in range(1, order + 1))
    assert _same(neuron.inline_stages(neuron.charge), V + (a * V + b * X) * series)


def test_coupled_states_update_simultaneously_from_previous_values() -> None:
    neuron = sn.Neuron.from_ode(
        -V + W + X,
        dt=0.1,
        method="euler",
        states={W: sn.ODEState(V - W, on_spike=W + 0.5 * sn.S)},
        params={},
    )
    h = sp.Float(0.1)
    assert _same(neuron.charge, V + h * (-V + W + X))
    assert _same(neuron.states["W"].update, W + h * (V - W))  # V[t−1], not H
    assert neuron.states["W"].on_spike == W + 0.5 * sn.S


def test_rk4_coupled_system_matches_textbook_stages() -> None:
    """The stages of classic RK4 on a 2-variable system, written out by hand."""
    h = sp.Rational(1, 10)

    def f(v: sp.Expr, w: sp.Expr) -> tuple[sp.Expr, sp.Expr]:
        return -v + w * v / 4 + X, v - w

    k1 = f(V, W)
    k2 = f(V + h / 2 * k1[0], W + h / 2 * k1[1])
    k3 = f(V + h / 2 * k2[0], W + h / 2 * k2[1])
    k4 = f(V + h * k3[0], W + h * k3[1])
    v_new = V + h / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0])
    w_new = W + h / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1])
    neuron = sn.Neuron.from_ode(
        -V + W * V / 4 + X, dt=0.1, method="rk4", states={W: sn.ODEState(V - W)}
    )
    assert _same(neuron.inline_stages(neuron.charge), v_new)
    assert _same(neuron.inline_stages(neuron.states["W"].update), w_new)


def test_learnable_tau_inside_exp_gets_exact_gradients() -> None:
    neuron = sn.Neuron.from_ode((X - V) / tau, dt=1.0, params={tau: 2.0}, learnable=[tau])
    report = sn.check(neuron, backend="cpu", seed=3)
    assert report.passed, str(report)
    assert "grad tau vs reference" in str(report)


def test_adex_like_system_with_exp_euler_for_linear_parts() -> None:
    """exp_euler refuses the exponential term; euler takes it; the kernels pass check."""
    ode_v = (-V + sp.exp(V - 1) - W + X) / tau
    with pytest.raises(ValueError, match="not linear in V; use method='euler'"):
        sn.Neuron.from_ode(
            ode_v, dt=0.5, states={W: sn.ODEState((a * V - W) / 4)}, params={tau: 2.0, a: 0.1}
        )
    neuron = sn.Neuron.from_ode(
        ode_v,
        dt=0.5,
        method="euler",
        states={W: sn.ODEState((a * V - W) / 4, on_spike=W + 0.05 * sn.S)},
        params={tau: 2.0, a: 0.1},
        learnable=[a],
        v_reset=-0.1,
    )
    assert sn.check(neuron, backend="cpu", seed=5).passed


def test_input_through_a_synaptic_current_norse_cuba() -> None:
    """Norse's current-based LIF: V reads the previous current I; I ← 0.7·I + k·X."""
    current = sp.Symbol("I", real=True)
    neuron = sn.Neuron(
        V + 0.1 * (current - V),
        params={k: 0.8},
        learnable=[k],
        states={current: sn.State(update=0.7 * current + k * X)},
    )
    assert not neuron.charge.has(X)
    report = sn.check(neuron, backend="cpu", seed=7)
    assert report.passed, str(report)
    # X reaches the spikes one step late: the first step cannot fire from rest
    x = torch.full((4, 3), 5.0, dtype=torch.float64)
    spikes, v, states = sn.simulate(neuron, x, backend="cpu")
    assert float(v[0].abs().max()) == 0.0 and float(spikes[1:].sum()) > 0


def test_conductance_based_input() -> None:
    """X drives a conductance g; the charge uses g·(E − V)."""
    g = sp.Symbol("g", real=True)
    neuron = sn.Neuron.from_ode(
        (-V + g * (e_syn - V)) / tau,
        dt=0.5,
        method="rk2",
        states={g: sn.ODEState(-g / tau_g + X)},
        params={tau: 2.0, e_syn: 3.0, tau_g: 1.5},
        learnable=[tau_g],
    )
    report = sn.check(neuron, backend="cpu", seed=11)
    assert report.passed, str(report)


def test_a_neuron_without_input_anywhere_is_rejected() -> None:
    with pytest.raises(ValueError, match="does not depend on the input X"):
        sn.Neuron(V * 0.5, states={W: sn.State(update=W * 0.5)})


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dt": 0.0}, ValueError, "dt must be > 0"),
        ({"dt": -1.0}, ValueError, "dt must be > 0"),
        ({"dt": float("inf")}, ValueError, "dt must be finite"),
        ({"dt": 1.0, "method": "rk45"}, ValueError, "method must be one of"),
        ({"dt": 1.0, "states": {W: sn.ODEState(None)}}, ValueError, "State 'W' has no equation"),
        ({"dt": 1.0, "states": {W: sn.State()}}, TypeError, "must be a symneuron.ODEState"),
    ],
)
def test_ode_errors_name_the_fix(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        sn.Neuron.from_ode((X - V) / tau, params={tau: 2.0}, **kwargs)


def test_unknown_symbol_in_an_ode() -> None:
    with pytest.raises(ValueError, match=r"dV/dt uses unknown symbols \['q'\]"):
        sn.Neuron.from_ode((X - V) / sp.Symbol("q"), dt=1.0)
    with pytest.raises(ValueError, match=r"dW/dt uses unknown symbols \['H'\]"):
        sn.Neuron.from_ode(X - V, dt=1.0, states={W: sn.ODEState(sn.H - W)})


@pytest.mark.slow
def test_ode_models_cuda_sources_compile_with_nvrtc() -> None:
    """Every CUDA variant of the ODE LIF compiles with each method (no GPU needed)."""
    import os

    from test_brian2 import CASES, _neuron

    nvrtc = pytest.importorskip("symneuron.runtime.nvrtc")
    if not nvrtc.nvrtc_available():
        if os.environ.get("CI"):
            pytest.fail("CI must compile every CUDA variant: install 'symneuron[cuda]' (NVRTC)")
        pytest.skip("NVRTC not installed (pip install 'symneuron[cuda]')")
    for name, method in CASES:
        if name != "LIF":  # the zoo's ODE models: test_zoo.py compiles each at its defaults
            continue
        for dtype in ("float32", "float16"):
            ptx = nvrtc.compile_to_ptx(_neuron(name, method).source("cuda", dtype))
            assert ptx.count(".entry") == 14, f"{name} {method} {dtype}"
