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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sympy as sp
import torch
from sympy.printing.str import StrPrinter

import symneuron as sn

RUNNER = Path(__file__).with_name("brian2_runner.py")
PYTHON = os.environ.get("SYMNEURON_BRIAN2_PYTHON")
T, N = 200, 8

pytestmark = pytest.mark.slow

V, X = sn.V, sn.X
tau, e_l = sp.symbols("tau E_L", real=True)
ALL = ("euler", "exp_euler", "rk2", "rk4")
LINEAR = (*ALL, "exact")  # the linear systems: Brian2's exact (closed-form) method too
NONLINEAR = ("euler", "rk2", "rk4")


@dataclass(frozen=True)
class Case:
    """One ODE neuron: how to build it for a method, its V[0] spread and its input."""

    build: Callable[[str], sn.Neuron]
    methods: tuple[str, ...]
    v0: float  # V[0] drawn uniformly from v_start ± v0
    x: tuple[float, float]  # input: mean, spread


def _lif(method: str) -> sn.Neuron:
    """LIF written here, not taken from the zoo: tau dV/dt = -(V - E_L) + X."""
    return sn.Neuron.from_ode(
        (-(V - e_l) + X) / tau,
        dt=0.5,
        method=method,
        params={tau: 4.0, e_l: 0.0},
        v_threshold=1.0,
        v_reset=0.0,
        v_init=0.25,
        name="LIF",
    )


def _cuba_lif(method: str) -> sn.Neuron:
    """LIF with a current synapse, written here: tau_m dV/dt = -(V - E_L) + I,
    tau_s dI/dt = -I + X (a two-variable linear system: method='exact' integrates it
    as a whole)."""
    tau_s, i_syn = sp.Symbol("tau_s", positive=True), sp.Symbol("I", real=True)
    return sn.Neuron.from_ode(
        (-(V - e_l) + i_syn) / tau,
        dt=0.5,
        method=method,
        params={tau: 4.0, e_l: 0.0, tau_s: 2.0},
        states={i_syn: sn.ODEState((-i_syn + X) / tau_s)},
        v_threshold=1.0,
        v_reset=0.0,
        v_init=0.25,
        name="CubaLIF",
    )


Z = sn.models


def _izhikevich(preset: str) -> Callable[[str], sn.Neuron]:
    return lambda method: Z.Izhikevich2003(preset, method=method, dt=0.25)


CASES_BY_NAME = {
    "LIF": Case(_lif, LINEAR, 0.25, (1.2, 0.8)),
    "CubaLIF": Case(_cuba_lif, LINEAR, 0.25, (1.2, 0.8)),
    "Izhikevich2003_RS": Case(_izhikevich("RS"), NONLINEAR, 5.0, (10.0, 4.0)),
    "Izhikevich2003_FS": Case(_izhikevich("FS"), NONLINEAR, 5.0, (10.0, 4.0)),
    "Izhikevich2003_CH": Case(_izhikevich("CH"), NONLINEAR, 5.0, (10.0, 4.0)),
    "AdEx2005": Case(lambda m: Z.AdEx2005(method=m), NONLINEAR, 2.0, (900.0, 400.0)),
    "HodgkinHuxley": Case(lambda m: Z.HodgkinHuxley(method=m, dt=0.025), ALL, 1.0, (30.0, 20.0)),
    "FitzHughNagumo": Case(
        lambda m: Z.FitzHughNagumo(method=m, dt=0.25), NONLINEAR, 0.1, (0.6, 0.5)
    ),
    "ResonateAndFire": Case(lambda m: Z.ResonateAndFire(method=m), ALL, 0.2, (0.8, 1.0)),
    "IafCondExp": Case(lambda m: Z.IafCondExp(method=m), ALL, 2.0, (40.0, 30.0)),
    "IafPscExp": Case(lambda m: Z.IafPscExp(method=m), LINEAR, 2.0, (300.0, 200.0)),
    "ThetaNeuron": Case(lambda m: Z.ThetaNeuron(method=m), NONLINEAR, 0.5, (0.3, 0.6)),
    "WangBuzsaki": Case(lambda m: Z.WangBuzsaki(method=m), NONLINEAR, 1.0, (2.0, 1.0)),
    "MorrisLecar": Case(lambda m: Z.MorrisLecar(method=m), NONLINEAR, 1.0, (150.0, 50.0)),
    "Pospischil2008": Case(lambda m: Z.Pospischil2008(method=m), ALL, 1.0, (6.0, 3.0)),
}
CASES = [(name, method) for name, c in CASES_BY_NAME.items() for method in c.methods]


def test_every_ode_model_of_the_zoo_is_compared() -> None:
    ode_models = {n for n, ctor in sn.models.ZOO.items() if ctor().ode is not None}
    covered = {n.split("_")[0] for n in CASES_BY_NAME}  # (CubaLIF: written here)
    assert ode_models <= covered, ode_models - covered


class _Brian2Printer(StrPrinter):
    """SymPy expressions as Brian2 text: floats in full, vtrap's Piecewise as exprel."""

    def _print_Float(self, expr: sp.Float) -> str:
        return repr(float(expr))

    def _print_Piecewise(self, expr: sp.Piecewise) -> str:
        exact = expr.args[-1].expr  # y*r / (exp(r) - 1), i.e. y / exprel(r)
        if not exact.atoms(sp.exp):  # vtrap's guarded r: Brian2's exprel needs no guard
            return self._print(exact)
        (r,) = exact.as_numer_denom()[1].atoms(sp.exp).pop().args
        scale = sp.simplify(exact * (sp.exp(r) - 1) / r)
        return f"(({self._print(scale)}) / exprel({self._print(r)}))"


def _brian(expr: sp.Expr) -> str:
    return _Brian2Printer().doprint(expr)


def _neuron(name: str, method: str) -> sn.Neuron:
    return CASES_BY_NAME[name].build(method)


def _inputs(name: str, neuron: sn.Neuron) -> tuple[torch.Tensor, torch.Tensor]:
    c = CASES_BY_NAME[name]
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    x = c.x[0] + c.x[1] * (2 * torch.rand(T, N, generator=gen, dtype=torch.float64) - 1)
    start = float(neuron.v_start)
    v0 = start + c.v0 * (2 * torch.rand(N, generator=gen, dtype=torch.float64) - 1)
    return x, v0


def _job(name: str, method: str) -> dict[str, Any]:
    neuron = _neuron(name, method)
    system = neuron.ode
    assert system is not None
    x, v0 = _inputs(name, neuron)
    odes = {"V": _brian(system.dv), **{w: _brian(st.ode) for w, st in system.states.items()}}
    threshold = f"V >= {float(neuron.v_threshold)!r}"
    if neuron.firing == "crossing":
        reset, refractory = "", threshold
    else:
        resets = [f"V = {float(neuron.v_reset)!r}"]
        resets += [
            f"{w} = {_brian(st.on_spike.subs(sn.S, 1))}"
            for w, st in system.states.items()
            if st.on_spike is not None
        ]
        reset, refractory = "; ".join(resets), None
    init = {"V": v0.tolist(), **{w: [st.init] * N for w, st in system.states.items()}}
    return {
        "odes": odes,
        "params": dict(neuron.params),
        "method": method,
        "dt": system.dt,
        "threshold": threshold,
        "reset": reset,
        "refractory": refractory,
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
    x, v0 = _inputs(name, neuron)
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
        # relative to the variable's scale over the run (mV models cross 0 mV)
        err = float((got[var] - expected).abs().max() / expected.abs().max().clamp_min(1.0))
        assert err <= 1e-10, f"{var}: error {err:.2e} against Brian2"
