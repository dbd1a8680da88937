"""The EventProp reference against Eventax (König, Kuhn, Kappel & Subramoney 2026; JAX and
Diffrax): an outside oracle, written without symneuron, that differentiates through an
ODE solver event by event.

The 5 → 8 → 3 LIF network of tests/test_eventprop_reference.py (weights, delays, input
spike times; τ_m = 10, τ_s = 5, ϑ = 1) runs through ``tests/eventax_runner.py`` with
Eventax's root-finding and step tolerances tightened to 1e-10 (its defaults are Euler
steps and Newton to 1e-2). Eventax lives in its own environment: set
``SYMNEURON_EVENTAX_PYTHON`` to its python (``.ci/run`` builds it with ``pip install
eventax``). Without it the test skips locally and fails on CI.

Measured: spike times within 9.4e-9 ms and every gradient within 2.6e-7 of Eventax's
(the largest difference over a tensor's entries, relative to its largest gradient),
about Eventax's own accuracy at these tolerances: at 1e-12 its weight gradients move
to within 5.5e-8 of ours while its delay and input-time gradients move 0.5 away (ours
agree with central differences on this network, tests/test_eventprop_reference.py),
and at 1e-8 its root-finder does not converge.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch

from symneuron.reference.events import EventLayer, event_network
from tests.test_eventprop_reference import F64, T_END, _lif, _network

RUNNER = Path(__file__).with_name("eventax_runner.py")
PYTHON = os.environ.get("SYMNEURON_EVENTAX_PYTHON")
SLOTS = 4


def _eventax(job: dict) -> dict:  # type: ignore[type-arg]
    if not PYTHON:
        if os.environ.get("CI"):
            pytest.fail("CI must compare with Eventax: set SYMNEURON_EVENTAX_PYTHON (.ci/run)")
        pytest.skip("Eventax runs in its own environment: set SYMNEURON_EVENTAX_PYTHON")
    proc = subprocess.run(
        [PYTHON, str(RUNNER)], input=json.dumps(job), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@pytest.mark.slow
def test_gradients_match_eventax() -> None:
    inputs, flat = _network()
    w0, d0, w1, d1 = flat[0], flat[1], flat[5], flat[6]
    coef = torch.randn(11, SLOTS, generator=torch.Generator().manual_seed(0), dtype=F64)
    leaves = [t.clone().requires_grad_() for t in (inputs, w0, d0, w1, d1)]
    layers = [EventLayer(leaves[1], leaves[2]), EventLayer(leaves[3], leaves[4])]
    times = event_network(_lif(), layers, leaves[0], t_end=T_END)
    every = torch.cat(
        [torch.nn.functional.pad(t, (0, SLOTS - t.shape[1]), value=math.inf) for t in times]
    )
    torch.where(torch.isfinite(every), every * coef, 0.0).sum().backward()
    job = {
        "n_in": 5,
        "sizes": [8, 3],
        "W": [w0.tolist(), w1.tolist()],
        "D": [d0.tolist(), d1.tolist()],
        "inputs": torch.where(torch.isfinite(inputs), inputs, 1e30).tolist(),
        "t_end": T_END,
        "coef": coef.tolist(),
        "tau_m": 10.0,
        "tau_s": 5.0,
        "threshold": 1.0,
        "tol": 1e-10,
    }
    theirs = _eventax(job)
    their_times = torch.tensor(theirs["times"], dtype=F64)
    their_times = torch.where(their_times < 0, math.inf, their_times)
    every = every.detach()
    finite = torch.isfinite(every)
    assert torch.equal(finite, torch.isfinite(their_times))
    assert float((every - their_times)[finite].abs().max()) < 1e-7
    grads = [
        torch.where(torch.isfinite(inputs), leaves[0].grad, 0.0),
        *(t.grad for t in leaves[1:]),
    ]
    expected = [theirs["inputs"], theirs["W"][0], theirs["D"][0], theirs["W"][1], theirs["D"][1]]
    for ours, other in zip(grads, expected, strict=True):
        assert ours is not None
        other_t = torch.tensor(other, dtype=F64)
        assert float((ours - other_t).abs().max() / ours.abs().max()) < 1e-6
