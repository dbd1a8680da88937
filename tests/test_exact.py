"""``method="exact"``: the closed-form propagator of a linear ODE system.

Oracles: a classical RK4 written here with 2000 substeps per step (float64); the
one-variable case against exponential Euler, itself exact for one linear equation;
finite differences through ``sn.check``. Brian2's ``exact`` method: tests/test_brian2.py.
"""

from __future__ import annotations

import pytest
import sympy as sp
import torch
from conftest import generator

import symneuron as sn
from symneuron.runtime import cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")

V, X = sn.V, sn.X
tau_m, tau_s = sp.symbols("tau_m tau_s", positive=True)
I_SYN = sp.Symbol("I", real=True)


def _cuba(method: str = "exact", **kw: object) -> sn.Neuron:
    return sn.Neuron.from_ode(
        (-V + I_SYN) / tau_m,
        dt=0.5,
        method=method,
        params={tau_m: 10.0, tau_s: 2.0},
        states={I_SYN: sn.ODEState((-I_SYN + X) / tau_s)},
        v_threshold=1.0,
        v_reset=0.0,
        name="CubaLIF",
        **kw,
    )


def _rk4(f, y: torch.Tensor, x: torch.Tensor, dt: float, substeps: int = 2000) -> torch.Tensor:
    h = dt / substeps
    for _ in range(substeps):
        k1 = f(y, x)
        k2 = f(y + h / 2 * k1, x)
        k3 = f(y + h / 2 * k2, x)
        k4 = f(y + h * k3, x)
        y = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return y


@pytest.mark.slow  # (the RK4 oracle's 40 000 substeps in Python)
def test_a_current_synapse_is_integrated_as_one_system() -> None:
    """V and I together, without spikes (threshold out of reach): the RK4 oracle within
    1e-10, where exp_euler, variable by variable, is off by far more."""
    x = 0.5 * torch.rand(20, 6, generator=generator(51), dtype=torch.float64)

    def f(y: torch.Tensor, xt: torch.Tensor) -> torch.Tensor:
        v, i = y
        return torch.stack([(-v + i) / 10.0, (-i + xt) / 2.0])

    y, want = torch.zeros(2, 6, dtype=torch.float64), []
    for xt in x:
        y = _rk4(f, y, xt, 0.5)
        want.append(y.clone())
    ref = torch.stack(want)
    errors = {}
    for method in ("exact", "exp_euler"):
        neuron = _cuba(method).replace(v_threshold=100.0)
        s, v, states = sn.simulate(neuron, x, backend="cpu")
        assert s.sum() == 0
        errors[method] = float((v - ref[:, 0]).abs().max())
        if method == "exact":
            torch.testing.assert_close(states["I"], ref[:, 1], rtol=1e-10, atol=1e-10)
    assert errors["exact"] < 1e-10 < 1e-4 < errors["exp_euler"], errors


@pytest.mark.slow  # (SymPy's matrix exponential with complex eigenvalues, and RK4)
def test_complex_eigenvalues_take_the_real_form() -> None:
    """The resonate-and-fire neuron's rotation (Brian2's exact method cannot solve it):
    real expressions, the RK4 oracle within 1e-10 below the threshold."""
    neuron = sn.models.ResonateAndFire(method="exact").replace(v_threshold=1e3)
    params = {k: float(v) for k, v in neuron.params.items()}
    b, omega, dt = params["b"], params["omega"], neuron.ode.dt  # type: ignore[union-attr]
    x = torch.rand(30, 4, generator=generator(52), dtype=torch.float64)

    def f(y: torch.Tensor, xt: torch.Tensor) -> torch.Tensor:
        v, w = y
        return torch.stack([b * v + omega * w, -omega * v + b * w + xt])

    y, want = torch.zeros(2, 4, dtype=torch.float64), []
    for xt in x:
        y = _rk4(f, y, xt, dt)
        want.append(y[0].clone())
    _, v = sn.simulate(neuron, x, backend="cpu")[:2]
    torch.testing.assert_close(v, torch.stack(want), rtol=1e-10, atol=1e-10)
    assert all(not e.has(sp.I, sp.re, sp.im) for _, e in neuron.stages)  # real math
    assert "cos(" in neuron.source("cpu", "float64")


def test_one_linear_equation_is_what_exp_euler_gives() -> None:
    lif = {
        m: sn.Neuron.from_ode(
            (-V + X) / tau_m, dt=0.5, method=m, params={tau_m: 3.0}, v_threshold=1.0
        )
        for m in ("exact", "exp_euler")
    }
    x = 1.5 * torch.rand(25, 5, generator=generator(53), dtype=torch.float64)
    outs = {m: sn.simulate(n, x, backend="cpu") for m, n in lif.items()}
    assert torch.equal(outs["exact"][0], outs["exp_euler"][0]) and outs["exact"][0].sum() > 0
    torch.testing.assert_close(outs["exact"][1], outs["exp_euler"][1], rtol=1e-13, atol=1e-14)


def test_learnable_time_constants_pass_check() -> None:
    report = sn.check(_cuba(learnable=[tau_m, tau_s]), backend="cpu", seed=3)
    assert report.passed, str(report)


def test_a_nonlinear_system_is_refused_with_the_term() -> None:
    with pytest.raises(ValueError, match=r"method='exact' integrates linear systems.*not linear"):
        sn.models.Izhikevich2003(method="exact")
    with pytest.raises(ValueError, match="method='euler'"):
        sn.Neuron.from_ode((-V + X) / tau_m + sn.xi, dt=0.5, method="exact", params={tau_m: 3.0})
