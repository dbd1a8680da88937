"""ODE neurons against Brian2: the same equations, method and dt, integrated by an
outside simulator (``tests/brian2_runner.py``, numpy target, float64).

Brian2 2.9 needs numpy < 2, so it lives in its own environment: set
``SYMNEURON_BRIAN2_PYTHON`` to that environment's python (``.ci/run`` builds it). Without
it these tests skip locally and fail on CI. The equations are written once, in SymPy;
Brian2 reads the same expressions printed as text.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sympy as sp
import torch

import symneuron as sn

RUNNER = Path(__file__).with_name("brian2_runner.py")
PYTHON = os.environ.get("SYMNEURON_BRIAN2_PYTHON")
T, N = 200, 8

pytestmark = pytest.mark.slow

V, X = sn.V, sn.X
w, u, g = sp.symbols("w u g", real=True)
tau, tau_w, tau_g, a, b, d = sp.symbols("tau tau_w tau_g a b d", real=True)
e_l, e_syn, delta_t, v_t = sp.symbols("E_L E_syn Delta_T V_T", real=True)


@dataclass
class Model:
    """One ODE neuron, hard reset, with what each side needs."""

    dv: sp.Expr
    params: dict[sp.Symbol, float]
    threshold: float
    v_reset: float
    v0: tuple[float, float]  # V[0] drawn uniformly from this range
    x: tuple[float, float]  # input: mean, spread
    methods: tuple[str, ...]
    states: dict[sp.Symbol, tuple[sp.Expr, sp.Expr | None, float]] = field(default_factory=dict)


MODELS = {
    # LIF: tau dV/dt = -(V - E_L) + X
    "LIF": Model(
        (-(V - e_l) + X) / tau, {tau: 4.0, e_l: 0.0}, 1.0, 0.0, (0.0, 0.5), (1.2, 0.8),
        ("euler", "exp_euler", "rk2", "rk4"),
    ),
    # AdEx (Brette & Gerstner 2005), dimensionless units
    "AdEx": Model(
        (-(V - e_l) + delta_t * sp.exp((V - v_t) / delta_t) - w + X) / tau,
        {tau: 5.0, e_l: 0.0, delta_t: 0.5, v_t: 1.0, tau_w: 20.0, a: 0.2, b: 0.1},
        2.0, 0.1, (0.0, 0.3), (1.2, 0.8), ("euler", "rk2", "rk4"),
        {w: ((a * (V - e_l) - w) / tau_w, w + b * sn.S, 0.0)},
    ),
    # Izhikevich (2003), regular spiking, ms and mV
    "Izhikevich2003": Model(
        0.04 * V**2 + 5 * V + 140 - u + X, {a: 0.02, b: 0.2, d: 8.0}, 30.0, -65.0,
        (-70.0, -60.0), (10.0, 4.0), ("euler", "rk2", "rk4"),
        {u: (a * (b * V - u), u + d * sn.S, -13.0)},
    ),
    # conductance-based LIF: X drives the conductance g
    "CondLIF": Model(
        (-(V - e_l) + g * (e_syn - V)) / tau, {tau: 4.0, e_l: 0.0, e_syn: 3.0, tau_g: 2.0},
        1.0, 0.0, (0.0, 0.5), (0.3, 0.3), ("euler", "exp_euler", "rk2", "rk4"),
        {g: (-g / tau_g + X, None, 0.0)},
    ),
}  # fmt: skip
DT = {"LIF": 0.5, "AdEx": 0.1, "Izhikevich2003": 0.25, "CondLIF": 0.5}
CASES = [(name, method) for name, m in MODELS.items() for method in m.methods]


def _neuron(name: str, method: str) -> sn.Neuron:
    m = MODELS[name]
    states = {s: sn.ODEState(ode, on_spike=r, init=i) for s, (ode, r, i) in m.states.items()}
    return sn.Neuron.from_ode(
        m.dv, dt=DT[name], method=method, states=states, params=m.params,
        v_threshold=m.threshold, v_reset=m.v_reset, name=name,
    )  # fmt: skip


def _inputs(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    m = MODELS[name]
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    x = m.x[0] + m.x[1] * (2 * torch.rand(T, N, generator=gen, dtype=torch.float64) - 1)
    v0 = m.v0[0] + (m.v0[1] - m.v0[0]) * torch.rand(N, generator=gen, dtype=torch.float64)
    return x, v0


def _job(name: str, method: str) -> dict[str, Any]:
    m = MODELS[name]
    x, v0 = _inputs(name)
    odes = {"V": str(m.dv), **{str(s): str(ode) for s, (ode, _, _) in m.states.items()}}
    resets = [f"V = {m.v_reset!r}"]
    resets += [f"{s} = {r}" for s, (_, r, _) in m.states.items() if r is not None]
    init = {"V": v0.tolist(), **{str(s): [i] * N for s, (_, _, i) in m.states.items()}}
    return {
        "odes": odes,
        "params": {str(p): v for p, v in m.params.items()},
        "method": method,
        "dt": DT[name],
        "threshold": f"V >= {m.threshold!r}",
        "reset": "; ".join(resets).replace(str(sn.S), "1"),
        "init": init,
        "x": x.tolist(),
    }


@pytest.fixture(scope="module")
def brian2_results() -> dict[tuple[str, str], dict[str, Any]]:
    if not PYTHON:
        if os.environ.get("CI"):
            pytest.fail("CI must compare with Brian2: set SYMNEURON_BRIAN2_PYTHON (.ci/run)")
        pytest.skip("Brian2 environment not configured (set SYMNEURON_BRIAN2_PYTHON)")
    job = [_job(name, method) for name, method in CASES]
    proc = subprocess.run(
        [PYTHON, str(RUNNER)], input=json.dumps(job), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(zip(CASES, json.loads(proc.stdout), strict=True))


@pytest.mark.parametrize(("name", "method"), CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_matches_brian2(name: str, method: str, brian2_results: dict) -> None:
    ref = brian2_results[(name, method)]
    neuron = _neuron(name, method)
    x, v0 = _inputs(name)
    out = sn.simulate(neuron, x, v_init=v0, backend="cpu")
    spikes, v_seq = out[0], out[1]
    got = {"V": v_seq, **(out[2] if len(out) > 2 else {})}
    brian_spikes = torch.zeros(T, N, dtype=torch.float64)
    for step, i in ref["spikes"]:
        brian_spikes[step, i] = 1.0
    assert 0 < int(brian_spikes.sum()) < T * N / 2, "vacuous input: no or too many spikes"
    assert torch.equal(spikes, brian_spikes), "spike trains differ from Brian2's"
    for var, values in ref["states"].items():
        expected = torch.tensor(values, dtype=torch.float64)
        err = float(((got[var] - expected).abs() / expected.abs().clamp_min(1.0)).max())
        assert err <= 1e-10, f"{var}: error {err:.2e} against Brian2"
