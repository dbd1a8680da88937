"""Readout losses of the float64 EventProp reference (symneuron/reference/readouts.py): the
maximum over time of a non-spiking readout's V and its (weighted) mean. Oracles: the
potential after one input written out here, and central finite differences of the same
forward (tests/test_eventprop_reference.py's helper), every perturbed run checked to keep
each hidden neuron's spike count and each readout's maximum in place."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import symneuron as sn
from symneuron import eventprop as kernels
from symneuron.reference import readouts
from symneuron.reference.events import EventLayer, event_network
from symneuron.reference.readouts import max_voltage, mean_voltage
from tests.test_eventprop_reference import F64, NAMES, T_END, _counts, _fd_errors, _lif

#: An input time, D and ϑ of the hidden layer, D and τ_s of the readout (indices into
#: [inputs, *flat]).
SOME = [(0, 1), (2, 7), (3, 2), (7, 9), (10, 2)]
#: On the 2 → 2 → 2 network: both input times, hidden W and ϑ, the inhibitory arrival's
#: W and D, a readout τ_m.
ON_ARRIVAL = [(0, 0), (0, 1), (1, 0), (1, 3), (3, 1), (6, 1), (7, 1), (9, 0)]

Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _layer(flat: list[torch.Tensor], i: int) -> EventLayer:
    return EventLayer(
        flat[5 * i], flat[5 * i + 1], dict(zip(NAMES, flat[5 * i + 2 : 5 * i + 5], strict=True))
    )


def _reads(
    kind: str, tau_weight: float | None = None, compiled: bool = False
) -> Callable[..., Outputs]:
    """A forward: one spiking layer, then a readout (its max or mean), as
    (hidden spike times, y, the maxima's times); by the reference, or by the compiled
    kernels (``compiled``)."""
    network, peak, mean = (
        (kernels.event_network, kernels.max_voltage, kernels.mean_voltage)
        if compiled
        else (event_network, max_voltage, mean_voltage)
    )

    def run(neuron: sn.Neuron, inputs: torch.Tensor, flat: list[torch.Tensor]) -> Outputs:
        (hidden,) = network(neuron, [_layer(flat, 0)], inputs, t_end=T_END)
        if kind == "max":
            y, at = peak(neuron, _layer(flat, 1), hidden, t_end=T_END)
            return hidden, y, at
        y = mean(neuron, _layer(flat, 1), hidden, t_end=T_END, tau_weight=tau_weight)
        return hidden, y, torch.zeros_like(y)

    return run


def _cross_entropy(out: Outputs) -> torch.Tensor:
    return F.cross_entropy(out[1][None], torch.tensor([1]))


def _same(out: Outputs, ref: Outputs) -> bool:
    """Hidden spike counts unchanged and each maximum still where it was (its time moved
    by less than 1e-3: on the same arrival or the same interior turn)."""
    counts = torch.equal(_counts((out[0],))[0], _counts((ref[0],))[0])
    return counts and bool((out[2] - ref[2]).abs().max() < 1e-3)


def _on_arrival() -> tuple[torch.Tensor, list[torch.Tensor]]:
    """2 → 2 → 2 where readout 0's maximum sits on an arrival: hidden 0 excites it,
    hidden 1 (spiking later) inhibits it while V still rises."""
    inputs = torch.tensor([[1.0], [2.5]], dtype=F64)
    return inputs, [
        torch.tensor([[6.0, 0.5], [0.3, 7.0]], dtype=F64),
        torch.tensor([[0.0, 0.5], [1.0, 0.2]], dtype=F64),
        torch.ones(2, dtype=F64),
        torch.tensor([10.0, 10.5], dtype=F64),
        torch.tensor([5.0, 5.5], dtype=F64),
        torch.tensor([[5.0, -9.0], [2.0, 3.0]], dtype=F64),
        torch.tensor([[0.3, 0.4], [0.0, 1.5]], dtype=F64),
        torch.ones(2, dtype=F64),
        torch.tensor([10.0, 9.0], dtype=F64),
        torch.tensor([5.0, 4.0], dtype=F64),
    ]


def test_max_voltage_of_one_input_is_the_written_out_peak() -> None:
    """V(s) = w τ_s/(τ_m − τ_s)(e^{−s/τ_m} − e^{−s/τ_s}) peaks at s* = 10 ln 2 (τ_m = 10,
    τ_s = 5) with V = w/4; the threshold (1) is not used by a readout."""
    w, t0 = 3.0, 1.5
    readout = EventLayer(torch.full((1, 1), w, dtype=F64), torch.zeros(1, 1, dtype=F64))
    y, at = max_voltage(_lif(), readout, torch.tensor([[t0]], dtype=F64), t_end=T_END)
    assert abs(float(y[0]) - w / 4) < 1e-14
    assert abs(float(at[0]) - t0 - 10 * math.log(2)) < 1e-9


@pytest.mark.parametrize("tau_weight", [None, 7.0])
def test_mean_voltage_of_one_input_is_the_written_out_integral(tau_weight: float | None) -> None:
    """(1/T)∫κV dt with V as above: Σ ±w ∫ e^{−t/τ_w} e^{−(t − t0)/τ} dt in closed form."""
    w, t0 = 3.0, 1.5
    readout = EventLayer(torch.full((1, 1), w, dtype=F64), torch.zeros(1, 1, dtype=F64))
    y = mean_voltage(
        _lif(), readout, torch.tensor([[t0]], dtype=F64), t_end=T_END, tau_weight=tau_weight
    )
    rate_w = 0.0 if tau_weight is None else 1 / tau_weight
    total = 0.0
    for sign, tau in ((1, 10.0), (-1, 5.0)):
        rate = rate_w + 1 / tau  # ∫_{t0}^T e^{−t·rate_w − (t − t0)/τ} dt
        total += sign * w * math.exp(-t0 * rate_w) * (1 - math.exp(-(T_END - t0) * rate)) / rate
    assert abs(float(y[0]) - total / T_END) < 1e-14


@pytest.mark.parametrize(("kind", "tau_weight"), [("max", None), ("mean", None), ("mean", 12.0)])
def test_readout_gradients_match_central_differences(kind: str, tau_weight: float | None) -> None:
    errors = _fd_errors(_cross_entropy, SOME, run=_reads(kind, tau_weight), same=_same)
    assert len(errors) == len(SOME) and max(errors) <= 1e-6, max(errors)


def test_a_maximum_on_an_arrival_moves_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Readout 0's maximum is an inhibitory arrival's time: its gradient needs
    ∂L/∂t_a = ∂L/∂y·V̇⁻(t_a) in the delay's and the source spike's; without the term
    the gradient is wrong (EVENTPROP.md (d): 0.75 vs 4.6e-8 there)."""
    inputs, flat = _on_arrival()
    hidden, _, at = _reads("max")(_lif(), inputs, flat)
    assert torch.isfinite(hidden).all()
    arrival = float(hidden[1, 0] + flat[6][0, 1])
    assert float(at[0]) == arrival
    run = _reads("max")
    errors = _fd_errors(_cross_entropy, ON_ARRIVAL, run=run, same=_same, network=_on_arrival)
    assert len(errors) == 8 and max(errors) <= 1e-6, max(errors)
    monkeypatch.setattr(readouts, "_peak_time_term", lambda read, peak, grad_y: 0.0 * grad_y)
    without = _fd_errors(_cross_entropy, ON_ARRIVAL, run=run, same=_same, network=_on_arrival)
    assert max(without) > 0.1, max(without)


@pytest.mark.slow
def test_every_gradient_with_a_maximum_on_an_arrival() -> None:
    errors = _fd_errors(_cross_entropy, run=_reads("max"), same=_same, network=_on_arrival)
    assert len(errors) == 30 and max(errors) <= 1e-6, max(errors)


@pytest.mark.slow
def test_every_max_readout_gradient_matches_central_differences() -> None:
    """All 173 entries through the maximum of V, by the compiled kernels (C; they follow
    the reference within 1e-12, tests/test_eventprop_readout_kernels.py): by the
    reference this took 27 s of a loaded suite run, and gave at most 1.8e-7 when
    measured. (The mean readouts: the quick test's entries of every tensor.)"""
    errors = _fd_errors(_cross_entropy, run=_reads("max", None, compiled=True), same=_same)
    assert len(errors) == 173 and max(errors) <= 1e-6, max(errors)


def test_a_batch_of_readouts_is_its_samples() -> None:
    neuron = _lif()
    inputs, flat = _on_arrival()
    batch = torch.stack([inputs, inputs + 0.5])
    (hidden,) = event_network(neuron, [_layer(flat, 0)], batch, t_end=T_END)
    peaks = max_voltage(neuron, _layer(flat, 1), hidden, t_end=T_END)
    means = mean_voltage(neuron, _layer(flat, 1), hidden, t_end=T_END, tau_weight=9.0)
    assert peaks.values.shape == peaks.times.shape == means.shape == (2, 2)
    for b in range(2):
        (single,) = event_network(neuron, [_layer(flat, 0)], batch[b], t_end=T_END)
        peak = max_voltage(neuron, _layer(flat, 1), single, t_end=T_END)
        mean = mean_voltage(neuron, _layer(flat, 1), single, t_end=T_END, tau_weight=9.0)
        assert torch.equal(peaks.values[b], peak.values) and torch.equal(peaks.times[b], peak.times)
        assert torch.equal(means[b], mean)
