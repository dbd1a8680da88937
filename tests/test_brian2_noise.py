"""Noisy neurons against Brian2's ``xi`` (Euler–Maruyama, the same dt): the same
statistics within statistical tolerance, from two independent generators.

Brian2 runs in its own environment (``SYMNEURON_BRIAN2_PYTHON``, as for
``tests/test_brian2.py``); without it these tests skip locally and fail on CI.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import sympy as sp
import torch

import symneuron as sn

RUNNER = Path(__file__).with_name("brian2_runner.py")
PYTHON = os.environ.get("SYMNEURON_BRIAN2_PYTHON")
pytestmark = pytest.mark.slow

TAU, MU, SIGMA = sp.symbols("tau mu sigma", real=True)
DT = 0.5


def _brian2(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not PYTHON:
        if os.environ.get("CI"):
            pytest.fail("SYMNEURON_BRIAN2_PYTHON is not set on CI (.ci/run sets it)")
        pytest.skip("Brian2 runs in its own environment: set SYMNEURON_BRIAN2_PYTHON")
    done = subprocess.run(
        [PYTHON, str(RUNNER)],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _job(neuron: sn.Neuron, n: int, steps: int, threshold: float, seed: int) -> dict[str, Any]:
    """The neuron's ODE as Brian2 text: xi (1/sqrt(time)) as xi*sqrt(ms) inside the
    runner's (rhs)/ms, so that its increment is sigma*sqrt(dt/ms)*N(0, 1)."""
    assert neuron.ode is not None
    rhs = neuron.ode.dv.xreplace({sn.xi: sp.Symbol("XI_MS")})
    text = sp.sstr(rhs).replace("XI_MS", "xi*sqrt(ms)")
    return {
        "odes": {"V": text},
        "params": dict(neuron.params),
        "method": "euler",
        "dt": DT,
        "threshold": f"V >= {threshold!r}",
        "reset": "V = 0.0",
        "refractory": None,
        "seed": seed,
        "init": {"V": [0.0] * n},
        "x": [[0.0] * n] * steps,
    }


def _ou(threshold: float, mu: float, sigma: float) -> sn.Neuron:
    dv = (MU + sn.X - sn.V) / TAU + SIGMA * sn.xi
    return sn.Neuron.from_ode(
        dv,
        dt=DT,
        method="euler",
        params={TAU: 5.0, MU: mu, SIGMA: sigma},
        v_threshold=threshold,
        v_reset=0.0,
    )


def _moments(v: torch.Tensor) -> torch.Tensor:
    """Mean and variance of V at the last step, lag-1 covariance; their standard errors."""
    a, b = v[-2], v[-1]
    n, var = b.numel(), float(b.var())
    cov = float(((a - a.mean()) * (b - b.mean())).mean())
    se = [math.sqrt(var / n), var * math.sqrt(2 / (n - 1)), math.sqrt((var**2 + cov**2) / n)]
    return torch.tensor([[float(b.mean()), var, cov], se], dtype=torch.float64)


def test_ou_membrane_moments_equal_brian2s() -> None:
    """Mean, variance and lag-1 covariance after 60 steps from V = 0, over 8192 neurons:
    symneuron and Brian2 agree within 5 standard errors of their difference."""
    neuron, n, steps = _ou(1e9, 1.5, 0.4), 8192, 60
    (theirs,) = _brian2([_job(neuron, n, steps, 1e9, seed=21)])
    v_b2 = torch.tensor(theirs["states"]["V"], dtype=torch.float64)
    _, v_sn = sn.simulate(
        neuron, torch.zeros(steps, n, dtype=torch.float64), v_init=0.0, backend="cpu", seed=21
    )
    ours, other = _moments(v_sn), _moments(v_b2)
    se = (ours[1] ** 2 + other[1] ** 2).sqrt()
    assert bool(((ours[0] - other[0]).abs() < 5 * se).all()), (ours, other)
    a, q = 1 - DT / 5.0, DT * 0.4**2  # both near the closed form (and not trivially equal)
    assert abs(float(ours[0, 1]) - q * (1 - a ** (2 * steps)) / (1 - a**2)) < 5 * float(ours[1, 1])


def _isi_stats(spikes: list[tuple[int, int]], n: int, groups: int = 16) -> torch.Tensor:
    """Rate (spikes per neuron-step), mean ISI and its CV, each with a standard error from
    the spread over ``groups`` groups of neurons (batch means: independent neurons)."""
    by_neuron: list[list[int]] = [[] for _ in range(n)]
    for step, i in sorted(spikes):
        by_neuron[i].append(step)
    rows = []
    for g in range(groups):
        members = by_neuron[g::groups]
        isis = [b - a for s in members for a, b in zip(s[:-1], s[1:], strict=True)]
        isis = torch.tensor(isis, dtype=torch.float64)
        count = sum(len(s) for s in members)
        rows.append([count / len(members), float(isis.mean()), float(isis.std() / isis.mean())])
    table = torch.tensor(rows)
    return torch.stack([table.mean(0), table.std(0) / math.sqrt(groups)])


def test_noisy_lif_interspike_intervals_equal_brian2s() -> None:
    """A noise-driven LIF (mean drive below threshold): spike count per neuron, mean ISI
    and the ISIs' CV agree with Brian2's within 5 standard errors of their difference."""
    neuron, n, steps = _ou(1.0, 0.8, 0.3), 4096, 400
    (theirs,) = _brian2([_job(neuron, n, steps, 1.0, seed=5)])
    s, _ = sn.simulate(
        neuron,
        torch.zeros(steps, n, dtype=torch.float64),
        v_init=0.0,
        backend="cpu",
        seed=5,
        store_v_seq=False,
    )
    ours = _isi_stats([(int(t), int(i)) for t, i in s.nonzero()], n)
    other = _isi_stats([(t, i) for t, i in theirs["spikes"]], n)
    assert float(ours[0, 0]) * steps > 3  # several intervals per neuron
    se = (ours[1] ** 2 + other[1] ** 2).sqrt()
    assert bool(((ours[0] - other[0]).abs() < 5 * se).all()), (ours, other)
