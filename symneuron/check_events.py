"""``sn.check(neuron, gradient="eventprop")``: EventProp's gradient of a small seeded
network of the neuron against oracles not written with it.

The network is 3 inputs (two spikes each) → 4 → 2 neurons of ``neuron`` with current
inputs (with ``recurrent``, the 4 hidden neurons also receive each other's and their own
spikes, through recurrent weights and delays of at least one step), run by the float64
EventProp reference
(:func:`~symneuron.reference.events.event_network`) for ``T`` steps of the neuron's
``dt``; the loss is a seeded random weighting of every spike time. Oracles:

- central finite differences of the same forward, per tensor (input times, and per
  layer the weights, delays and each param), every perturbed run keeping every spike
  count. A linear model's forward is exact, so EventProp is its exact gradient
  (relative error ≤ 1e-6). A nonlinear model's forward is RK4 with crossings on the
  Hermite interpolant: EventProp approximates the continuous model's gradient, and the
  discretised forward's own gradient differs from it at O(dt³), so the bar is looser;
- for a nonlinear model also the convergence in dt: the gradient at dt, dt/2 and dt/4
  against one at dt/16, whose fitted order must be about 4.

A neuron EventProp does not apply to is refused with the derivation's reason
(:class:`~symneuron.derivation.events.EventPropError`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import torch

from .neuron import Neuron
from .ode import ODESystem
from .reference.events import EventLayer, event_network

__all__ = ["eventprop_errors", "LINEAR_TOLERANCE", "NONLINEAR_TOLERANCE", "ORDER_BAND"]

F64 = torch.float64
#: inputs, hidden and output neurons of the checked network
SIZES = (3, 4, 2)
#: spikes per input
INPUT_SPIKES = 2
#: weight scales tried in turn until the network fires
SCALES = tuple(2.0**k for k in range(12))
#: EventProp against central differences: a linear model (exact forward) ...
LINEAR_TOLERANCE = 1e-6
#: ... and a nonlinear one (RK4: the discretised forward's gradient is O(dt³) off)
NONLINEAR_TOLERANCE = 1e-3
#: the fitted order of EventProp's convergence in dt must lie in this band
ORDER_BAND = (3.0, 5.0)
#: the finer steps of the convergence check, and the reference's
REFINEMENTS, REFERENCE = (1, 2, 4), 16
#: a gradient this close to the reference's has converged to rounding: no order is fitted
CONVERGED = 1e-10

Row = tuple[str, float, float]
#: a run's spike times and EventProp's gradient of every leaf
Run = tuple[tuple[torch.Tensor, ...], list[torch.Tensor]]


class _Net(NamedTuple):
    """The checked network: input times, per layer W, D (a recurrent layer then its
    recurrent W and D) and each param, their labels; ``recurrent``: whether the hidden
    layer is."""

    leaves: list[torch.Tensor]
    labels: list[str]
    names: list[str]
    t_end: float
    coefficients: list[torch.Tensor]
    recurrent: bool = False

    def layers(self, leaves: list[torch.Tensor]) -> list[EventLayer]:
        """The network's layers made of ``leaves`` (laid out as :attr:`leaves`)."""
        out, at = [], 1
        for index in range(len(SIZES) - 1):
            loop = self.recurrent and index == 0
            tensors = leaves[at : at + (4 if loop else 2)]
            at += len(tensors)
            params = dict(zip(self.names, leaves[at : at + len(self.names)], strict=True))
            at += len(self.names)
            out.append(EventLayer(tensors[0], tensors[1], params, *tensors[2:]))
        return out

    def weights(self) -> list[int]:
        """The indices in :attr:`leaves` of every weight (feedforward and recurrent)."""
        return [i for i, label in enumerate(self.labels) if label.startswith("W")]


def _network(
    neuron: Neuron, steps: int, dt: float, gen: torch.Generator, recurrent: bool = False
) -> _Net:
    """Seeded input times, weights (in threshold units; scaled later), delays (recurrent
    ones at least one step) and each param at its default ±5 %, and the loss's
    coefficients."""
    t_end = steps * dt

    def rand(*size: int) -> torch.Tensor:
        return torch.rand(size, generator=gen, dtype=F64)

    inputs = torch.sort(0.4 * t_end * rand(SIZES[0], INPUT_SPIKES), dim=1).values
    leaves, labels, names = [inputs], ["t_in"], sorted(neuron.params)
    for layer, (n_in, n_out) in enumerate(zip(SIZES[:-1], SIZES[1:], strict=True)):
        leaves += [2.0 * rand(n_out, n_in) - 0.3, 0.1 * t_end * rand(n_out, n_in)]
        labels += [f"W[{layer}]", f"D[{layer}]"]
        if recurrent and layer == 0:
            leaves += [rand(n_out, n_out) - 0.5, dt + 0.1 * t_end * rand(n_out, n_out)]
            labels += [f"Wrec[{layer}]", f"Drec[{layer}]"]
        for name in names:
            default = neuron.params[name]
            jitter = 0.05 * (2 * rand(n_out) - 1)
            leaves.append(default * (1 + jitter) if default != 0 else jitter)
            labels.append(f"{name}[{layer}]")
    coefficients = [torch.randn(n, 64, generator=gen, dtype=F64) for n in SIZES[1:]]
    return _Net(leaves, labels, names, t_end, coefficients, recurrent)


def _run(
    neuron: Neuron, system: ODESystem, net: _Net, leaves: list[torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    layers = net.layers(leaves)
    return event_network(neuron, layers, leaves[0], t_end=net.t_end, system=system)


def _loss(net: _Net, times: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Σ c·t over every finite spike time, c seeded."""
    total = torch.zeros((), dtype=F64)
    for t, c in zip(times, net.coefficients, strict=True):
        total = total + torch.where(torch.isfinite(t), t * c[:, : t.shape[1]], 0.0).sum()
    return total


def _counts(times: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    return [torch.isfinite(t).sum(1) for t in times]


def _same_counts(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_counts(a), _counts(b), strict=True))


def _scaled(net: _Net, scale: float) -> _Net:
    leaves = list(net.leaves)
    for i in net.weights():
        leaves[i] = leaves[i] * scale
    return net._replace(leaves=leaves)


def _firing(neuron: Neuron, system: ODESystem, net: _Net, unit: float) -> tuple[_Net, Row]:
    """The network with its weights scaled by the first of :data:`SCALES` (times
    ``unit``) at which half its hidden neurons and one output neuron spike."""
    for scale in SCALES:
        scaled = _scaled(net, scale * unit)
        with torch.no_grad():
            hidden, output = _counts(_run(neuron, system, scaled, scaled.leaves))
        if 2 * int((hidden > 0).sum()) >= SIZES[1] and int(output.sum()) > 0:
            spikes = f"{int(hidden.sum())} hidden and {int(output.sum())} output spikes"
            name = f"network fires (weights x{scale * unit:g}): {spikes}"
            return scaled, (name, 0.0, 0.0)
    name = f"network never fires, weights scaled up to {scale * unit:g}x: no gradient checked"
    return scaled, (name, 1.0, 0.0)


def _gradient(neuron: Neuron, system: ODESystem, net: _Net) -> Run:
    """The spike times and EventProp's gradient of every leaf (0 at empty input slots)."""
    leaves = [t.detach().clone().requires_grad_() for t in net.leaves]
    times = _run(neuron, system, net, leaves)
    _loss(net, times).backward()
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in leaves]
    return tuple(t.detach() for t in times), [torch.where(torch.isfinite(g), g, 0.0) for g in grads]


def _central(
    neuron: Neuron,
    system: ODESystem,
    net: _Net,
    times: tuple[torch.Tensor, ...],
    at: tuple[int, int],
) -> float | None:
    """The loss's central difference in one entry (h = 1e-5 of its size, at least 1e-5),
    or None where a perturbed run changes a spike count."""
    a, i = at
    value = float(net.leaves[a].view(-1)[i])
    h = 1e-5 * max(abs(value), 1.0)
    losses = []
    for sign in (1, -1):
        moved = [t.detach().clone() for t in net.leaves]
        moved[a].view(-1)[i] += sign * h
        with torch.no_grad():
            out = _run(neuron, system, net, moved)
        if not _same_counts(out, times):
            return None
        losses.append(float(_loss(net, out)))
    return (losses[0] - losses[1]) / (2 * h)


def _fd_rows(
    neuron: Neuron,
    system: ODESystem,
    net: _Net,
    gen: torch.Generator,
    checks: tuple[Run, int, float],
) -> list[Row]:
    """Per tensor: EventProp's gradient (of ``checks``: the run at ``system``'s dt, the
    entries per tensor, the tolerance) against central differences at seeded entries."""
    (times, grads), per_tensor, tolerance = checks
    found: list[tuple[str, list[float], list[float]]] = []
    skipped = 0
    for a, (leaf, label) in enumerate(zip(net.leaves, net.labels, strict=True)):
        entries = torch.randperm(leaf.numel(), generator=gen)[:per_tensor].tolist()
        ours, theirs = [], []
        for i in entries:
            if not math.isfinite(float(leaf.view(-1)[i])):
                continue
            fd = _central(neuron, system, net, times, (a, i))
            if fd is None:
                skipped += 1
                continue
            ours.append(float(grads[a].view(-1)[i]))
            theirs.append(fd)
        found.append((label, ours, theirs))
    scale = max((abs(v) for _, _, fd in found for v in fd), default=0.0)
    rows = []
    for label, ours, theirs in found:
        if not theirs:
            continue
        floor = max(max(abs(v) for v in theirs), 1e-3 * scale, 1e-300)
        error = max(abs(x - y) for x, y in zip(ours, theirs, strict=True)) / floor
        rows.append((f"dL/d{label} vs central diff (dt={system.dt:g})", error, tolerance))
    checked = sum(len(fd) for _, _, fd in found)
    rows.append(
        (f"entries checked: {checked} ({skipped} moved a spike count)", float(checked == 0), 0.0)
    )
    return rows


def _convergence_rows(system: ODESystem, runs: dict[int, Run]) -> list[Row]:
    """EventProp at dt, dt/2, dt/4 against dt/16: each error and the fitted order."""
    ref_times, ref = runs[REFERENCE]
    flat_ref = torch.cat([g.flatten() for g in ref])
    rows, errors = [], []
    for k in REFINEMENTS:
        times, grads = runs[k]
        if not _same_counts(times, ref_times):
            rows.append(
                (f"spike counts at dt/{k} differ from dt/{REFERENCE}'s: dt too coarse", 1.0, 0.0)
            )
            return rows
        flat = torch.cat([g.flatten() for g in grads])
        errors.append(float((flat - flat_ref).norm() / flat_ref.norm().clamp_min(1e-300)))
        rows.append((f"EventProp at dt/{k} vs dt/{REFERENCE} (dt={system.dt:g})", errors[-1], 1e-3))
    if errors[0] < CONVERGED:
        rows.append(
            (f"converged at dt (error < {CONVERGED:g}): no order fitted", errors[0], CONVERGED)
        )
        return rows
    order = _fitted_order([system.dt / k for k in REFINEMENTS], errors)
    low, high = ORDER_BAND
    rows.append(
        (
            f"order of convergence in dt {order:.2f} (band {low:g}-{high:g})",
            abs(order - 4.0),
            4.0 - low,
        )
    )
    return rows


def _fitted_order(dts: list[float], errors: list[float]) -> float:
    """The least-squares slope of log(error) against log(dt)."""
    x = [math.log(d) for d in dts]
    y = [math.log(max(e, 1e-300)) for e in errors]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True)) / sum(
        (a - mx) ** 2 for a in x
    )


def eventprop_errors(
    neuron: Neuron,
    steps: int,
    gen: torch.Generator,
    tolerance: float | None,
    recurrent: bool = False,
) -> list[Row]:
    """The EventProp check's rows: (comparison, error, tolerance); ``recurrent``: the
    hidden layer also receives its own spikes (recurrent weights and delays checked
    too)."""
    spec = neuron.events()  # refuses what EventProp cannot differentiate, with the reason
    system = neuron.ode
    assert system is not None  # events() refuses a neuron without one
    net = _network(neuron, steps, system.dt, gen, recurrent)
    unit = abs(float(neuron.v_threshold) - neuron.v_start) if _numeric(neuron) else 1.0
    net, fired = _firing(neuron, system, net, unit)
    if fired[1] > fired[2]:
        return [fired]
    if spec.linear:
        bar = LINEAR_TOLERANCE if tolerance is None else tolerance
        run = _gradient(neuron, system, net)
        return [fired, *_fd_rows(neuron, system, net, gen, (run, 2, bar))]
    bar = NONLINEAR_TOLERANCE if tolerance is None else tolerance
    runs = {}
    for k in (*REFINEMENTS, REFERENCE):
        runs[k] = _gradient(neuron, _refined(system, k), net)
    finest = REFINEMENTS[-1]
    rows = _fd_rows(neuron, _refined(system, finest), net, gen, (runs[finest], 1, bar))
    return [fired, *rows, *_convergence_rows(system, runs)]


def _refined(system: ODESystem, k: int) -> ODESystem:
    return dataclasses.replace(system, dt=system.dt / k)


def _numeric(neuron: Neuron) -> bool:
    return isinstance(neuron.v_threshold, float) and isinstance(neuron.v_start, float)
