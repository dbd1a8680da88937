"""The EventProp reference's nonlinear path (symneuron/reference/event_rk4.py): RK4 steps,
crossings on each step's cubic Hermite interpolant, the adjoint integrated back by RK4.

Oracles: the roots of a cubic (numpy); the LIF with a current synapse, whose exact
forward and gradient (the closed-form path, itself checked against finite differences
in tests/test_eventprop_reference.py) the RK4 path must converge to at order 4, with its
potential written out here; fine-dt references of QIF, EIF and AdEx networks (the order
fitted to log error against log dt); central differences of the same forward."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

import symneuron as sn
from symneuron.reference.event_rk4 import hermite_root
from symneuron.reference.events import EventLayer, event_network
from symneuron.reference.readouts import max_voltage
from tests.eventprop_models import adex, eif, qif
from tests.test_eventprop_reference import F64, T_END, _lif, _network

#: The gradient's convergence order must be 4 within this band (fit over ≥ 3 steps).
ORDER_BAND = (3.5, 4.5)


def _run(neuron: sn.Neuron, dt: float, leaves: list[torch.Tensor], integrator: str | None = None):  # type: ignore[no-untyped-def]
    """The 5 → 8 → 3 network of tests/test_eventprop_reference.py (weights and delays;
    params at their defaults), run in steps of ``dt``."""
    assert neuron.ode is not None
    system = dataclasses.replace(neuron.ode, dt=dt)
    layers = [EventLayer(leaves[i], leaves[i + 1]) for i in (1, 6)]
    return event_network(
        neuron, layers, leaves[0], t_end=T_END, system=system, integrator=integrator
    )


def _leaves() -> list[torch.Tensor]:
    inputs, flat = _network()
    return [t.clone() for t in [inputs, *flat]]


def _loss(times: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """A seeded weighting of every finite spike time."""
    g = torch.Generator().manual_seed(0)
    total = torch.zeros((), dtype=F64)
    for t in times:
        c = torch.randn(t.shape[0], 16, generator=g, dtype=F64)[:, : t.shape[1]]
        total = total + torch.where(torch.isfinite(t), t * c, 0.0).sum()
    return total


def _gradient(
    neuron: sn.Neuron, dt: float, integrator: str | None = None
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Spike times and the gradient of every input time, weight and delay, flat."""
    leaves = [t.requires_grad_() for t in _leaves()]
    times = _run(neuron, dt, leaves, integrator)
    _loss(times).backward()
    used = [leaves[i] for i in (0, 1, 2, 6, 7)]
    grads = [torch.where(torch.isfinite(t.grad), t.grad, 0.0) for t in used]  # type: ignore[arg-type]
    return tuple(t.detach() for t in times), torch.cat([g.flatten() for g in grads])


def _counts(times: tuple[torch.Tensor, ...]) -> list[list[int]]:
    return [torch.isfinite(t).sum(1).tolist() for t in times]


def _order(dts: list[float], errors: list[float]) -> float:
    return float(np.polyfit(np.log(dts), np.log(errors), 1)[0])


def _convergence(neuron: sn.Neuron, dts: list[float], reference: float) -> list[float]:
    """Normwise relative error of the gradient at each of ``dts`` against ``reference``'s
    (every run with the reference's spike counts)."""
    ref_times, ref = _gradient(neuron, reference)
    errors = []
    for dt in dts:
        times, grad = _gradient(neuron, dt)
        assert _counts(times) == _counts(ref_times), dt
        errors.append(float((grad - ref).norm() / ref.norm()))
    return errors


def test_hermite_root_finds_a_crossing_that_comes_back_down() -> None:
    """Rows: p(u) = −0.2 + 2.9u − 3u² (below 0 at both ends, above between: its first
    root); a monotone crossing; a bump that stays below 0; a sub-step of length 0."""
    length = torch.tensor([2.0, 1.0, 1.0, 0.0], dtype=F64)
    bump = np.poly1d([-3.0, 2.9, -0.2])
    mono = np.poly1d([1.0, 0.0, 0.5, -0.5])
    low = np.poly1d([-3.0, 2.9, -0.9])
    ends = [(bump(0), bump(1)), (mono(0), mono(1)), (low(0), low(1)), (-1.0, 1.0)]
    derivative = [p.deriv() for p in (bump, mono, low)]
    slopes = [(d(0) / h, d(1) / h) for d, h in zip(derivative, length.tolist()[:3], strict=True)]
    slopes.append((1.0, 1.0))
    g = tuple(torch.tensor([e[k] for e in ends], dtype=F64) for k in (0, 1))
    r = tuple(torch.tensor([s[k] for s in slopes], dtype=F64) for k in (0, 1))
    found, u = hermite_root((g[0], g[1]), (r[0], r[1]), length)
    assert found.tolist() == [True, True, False, False]
    assert bump(0) < 0 and bump(1) < 0
    for row, poly in ((0, bump), (1, mono)):
        roots = [x.real for x in poly.roots if abs(x.imag) < 1e-12 and 0 < x.real <= 1]
        assert abs(float(u[row]) - min(roots)) < 4 * np.finfo(float).eps
    assert u[2:].tolist() == [1.0, 1.0]


def test_a_crossing_inside_a_coarse_step_is_not_missed() -> None:
    """One input of w = 4.2 at t = 0.25 into the LIF (τ_m = 10, τ_s = 5): V peaks at
    w/4 = 1.05 at t = 0.25 + 10 ln 2, inside the step [5, 10] of dt = 5, and is below
    ϑ = 1 at both its ends (written out: V(s) = w(e^{−s/10} − e^{−s/5})). The RK4 path
    still spikes there once, near the exact time, and at dt = 0.5 to 1e-4."""
    w, t0 = 4.2, 0.25

    def potential(t: float) -> float:
        s = t - t0
        return w * (math.exp(-s / 10) - math.exp(-s / 5))

    assert potential(5.0) < 1 and potential(10.0) < 1
    lif = _lif()
    layer = EventLayer(torch.full((1, 1), w, dtype=F64), torch.zeros(1, 1, dtype=F64))
    inputs = torch.tensor([[t0]], dtype=F64)
    (exact,) = event_network(lif, [layer], inputs, t_end=T_END)
    assert lif.ode is not None
    for dt, tolerance in ((5.0, 0.5), (0.5, 1e-4)):
        system = dataclasses.replace(lif.ode, dt=dt)
        (out,) = event_network(lif, [layer], inputs, t_end=T_END, system=system, integrator="rk4")
        assert torch.isfinite(out).sum() == 1
        assert abs(float(out[0, 0] - exact[0, 0])) < tolerance


def test_lif_through_rk4_converges_to_its_exact_gradient_at_order_4() -> None:
    """The RK4 path on a linear model against the closed-form path's exact gradient (the
    true gradient, not a fine-dt estimate): spike times and the gradient (input times,
    weights and delays of the 5 → 8 → 3 network) at dt = 0.4, 0.2, 0.1."""
    lif = _lif()
    exact_times, exact = _gradient(lif, 1.0)
    dts, time_errors, errors = [0.4, 0.2, 0.1], [], []
    for dt in dts:
        times, grad = _gradient(lif, dt, "rk4")
        assert _counts(times) == _counts(exact_times)
        finite = [torch.isfinite(t) for t in times]
        time_errors.append(
            max(
                float((a - b)[f].abs().max())
                for a, b, f in zip(times, exact_times, finite, strict=True)
            )
        )
        errors.append(float((grad - exact).norm() / exact.norm()))
    assert errors[-1] < 1e-7 and time_errors[-1] < 1e-6, (errors, time_errors)
    assert ORDER_BAND[0] <= _order(dts, errors) <= ORDER_BAND[1], errors
    assert ORDER_BAND[0] <= _order(dts, time_errors) <= ORDER_BAND[1], time_errors


@pytest.mark.slow
def test_qif_gradient_converges_at_order_4() -> None:
    """QIF net: EventProp at dt = 0.4, 0.2, 0.1 against dt = 0.025."""
    errors = _convergence(qif(), [0.4, 0.2, 0.1], 0.025)
    assert errors[-1] < 1e-7, errors
    assert ORDER_BAND[0] <= _order([0.4, 0.2, 0.1], errors) <= ORDER_BAND[1], errors


@pytest.mark.slow
@pytest.mark.parametrize("make", [qif, eif, adex], ids=["QIF", "EIF", "AdEx"])
def test_nonlinear_gradients_converge_at_order_4(make) -> None:  # type: ignore[no-untyped-def]
    """The figures of docs/eventprop.md: dt = 0.4 → 0.05 against dt = 0.0125."""
    dts = [0.4, 0.2, 0.1, 0.05]
    errors = _convergence(make(), dts, 0.0125)
    order = _order(dts, errors)
    print(make.__name__, errors, order)
    assert errors[-1] < 1e-7 and ORDER_BAND[0] <= order <= ORDER_BAND[1], (errors, order)


def test_qif_gradient_matches_central_differences_of_its_forward() -> None:
    """At dt = 0.2, four entries (an input time, a weight, delays of both layers):
    EventProp differs from the discretised forward's own gradient at O(dt³) (docs)."""
    neuron = qif()
    times, grad = _gradient(neuron, 0.2)
    entries = [(0, 1), (1, 17), (2, 3), (7, 2)]
    offsets = np.cumsum([0] + [t.numel() for t in (_leaves()[i] for i in (0, 1, 2, 6, 7))])
    index = {leaf: k for k, leaf in enumerate((0, 1, 2, 6, 7))}
    for leaf, i in entries:
        losses = []
        for sign in (1, -1):
            moved = _leaves()
            moved[leaf].view(-1)[i] += sign * 1e-5
            out = _run(neuron, 0.2, moved)
            assert _counts(out) == _counts(times)
            losses.append(float(_loss(out)))
        fd = (losses[0] - losses[1]) / 2e-5
        ours = float(grad[offsets[index[leaf]] + i])
        assert abs(ours - fd) <= 1e-5 * max(abs(fd), 1e-2), (leaf, i, ours, fd)


def test_a_nonlinear_model_has_no_exact_integrator_and_no_readout() -> None:
    neuron = qif()
    layer = EventLayer(torch.ones(1, 1, dtype=F64), torch.zeros(1, 1, dtype=F64))
    inputs = torch.tensor([[1.0]], dtype=F64)
    with pytest.raises(ValueError, match="nonlinear.*integrator='rk4'"):
        event_network(neuron, [layer], inputs, t_end=5.0, integrator="exact")
    with pytest.raises(ValueError, match="integrator is one of"):
        event_network(neuron, [layer], inputs, t_end=5.0, integrator="euler")
    with pytest.raises(NotImplementedError, match="QIFsyn is nonlinear.*readouts"):
        max_voltage(neuron, layer, inputs, t_end=5.0)
