"""Recurrent layers in the float64 EventProp reference (symneuron/reference/events.py): a
layer's own spikes arrive back at its neurons through recurrent weights and delays.
Oracles: central finite differences of the same forward, Richardson-extrapolated
((4·D(h/2) − D(h))/3 at h = 1e-4: plain ones at h = 1e-5 carry a rounding noise of about
4e-10, 3e-6 of the smallest gradients here; every perturbed run keeps each neuron's
spike count), the feedforward network (a recurrent layer with zero
recurrent weights), a LIF's membrane potential after one input written out here, and
for the RK4 path the gradient at a sixteenth of the step."""

from __future__ import annotations

import pytest
import torch
from eventprop_models import qif
from test_eventprop_reference import _fd_errors, _lif

import symneuron as sn
from symneuron import eventprop
from symneuron.reference.event_forward import Layer
from symneuron.reference.event_model import model_of
from symneuron.reference.events import EventLayer, event_network
from symneuron.reference.readouts import first_spike_cross_entropy, max_voltage

F64 = torch.float64
T_END = 30.0
#: the tensors of a 3 → 6 → 2 network, recurrent in its hidden layer, in ``_network``'s order
TENSORS = ("inputs", "W", "D", "W_rec", "D_rec", "theta", "tau_m", "tau_s", "W_out", "D_out")


def _network(seed: int = 4) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """3 → 6 → 2: two input spikes each; the hidden layer's W, D, W_rec (self-connections
    too), D_rec (1 to 4 ms, at least the LIF's step of 1 ms), ϑ, τ_m, τ_s; the output's
    W, D. Seed 4: hidden spike counts [1, 1, 0, 2, 1, 0], [1, 1, 0, 1, 0, 0] without the
    recurrence."""
    g = torch.Generator().manual_seed(seed)

    def uniform(*shape: int, low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(*shape, generator=g, dtype=F64)

    inputs = torch.sort(uniform(3, 2, low=0.0, high=10.0), dim=1).values
    return inputs, [
        uniform(6, 3, low=-0.3, high=2.2),
        uniform(6, 3, low=0.0, high=3.0),
        uniform(6, 6, low=-0.6, high=1.4),
        uniform(6, 6, low=1.0, high=4.0),
        torch.ones(6, dtype=F64),
        uniform(6, low=10.0, high=11.0),
        uniform(6, low=5.0, high=6.0),
        uniform(2, 6, low=-0.2, high=1.8),
        uniform(2, 6, low=0.0, high=2.0),
    ]


def _layers(flat: list[torch.Tensor], recurrent: bool = True) -> list[EventLayer]:
    w, d, w_rec, d_rec, theta, tau_m, tau_s, w_out, d_out = flat
    params = {"theta": theta, "tau_m": tau_m, "tau_s": tau_s}
    hidden = (
        EventLayer(w, d, params, recurrent_weight=w_rec, recurrent_delay=d_rec)
        if recurrent
        else EventLayer(w, d, params)
    )
    return [hidden, EventLayer(w_out, d_out)]


def _run(
    neuron: sn.Neuron, inputs: torch.Tensor, flat: list[torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    return event_network(neuron, _layers(flat), inputs, t_end=T_END)


def _compiled(
    neuron: sn.Neuron, inputs: torch.Tensor, flat: list[torch.Tensor]
) -> tuple[torch.Tensor, ...]:
    """:func:`_run` by the compiled kernels (C; they follow the reference within 1e-12,
    tests/test_eventprop_recurrent_kernels.py)."""
    return eventprop.event_network(neuron, _layers(flat), inputs, t_end=T_END)


def _loss(times: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The first-spike cross-entropy plus 0.01 Σ every spike time (hidden ones too)."""
    total = sum(torch.where(torch.isfinite(t), t, 0.0).sum() for t in times)
    return first_spike_cross_entropy(times[-1], label=1, tau0=2.0, t_end=T_END) + 0.01 * total


def _counts(seed: int, recurrent: bool = True) -> list[list[int]]:
    inputs, flat = _network(seed)
    out = event_network(_lif(), _layers(flat, recurrent), inputs, t_end=T_END)
    return [torch.isfinite(t).sum(1).tolist() for t in out]


def test_the_recurrence_changes_the_spikes() -> None:
    """The network of the quick checks: recurrent arrivals add spikes (a second spike of
    neuron 3, a first of neuron 4)."""
    assert _counts(4) == [[1, 1, 0, 2, 1, 0], [1, 1]]
    assert _counts(4, recurrent=False)[0] == [1, 1, 0, 1, 0, 0]


def test_recurrent_gradients_match_central_differences() -> None:
    """The recurrent weights and delays into neurons 3 and 4 (whose extra spikes the
    recurrence causes) from each neuron that spikes, self-connections included, and one
    entry of every other tensor."""
    looped = [i * 6 + j for i in (3, 4) for j in (0, 1, 3, 4)]
    entries = [(a, i) for a in (3, 4) for i in looped]
    entries += [(a, 1) for a in (0, 1, 2, 5, 6, 7, 8, 9)]
    errors = _fd_errors(_loss, entries, run=_run, network=_network, richardson=True, h=1e-4)
    assert len(errors) == 24 and max(errors) <= 1e-6, max(errors)


@pytest.mark.slow
def test_every_recurrent_gradient_matches_central_differences() -> None:
    """All 156 entries (inputs, W, D, W_rec, D_rec, ϑ, τ_m, τ_s, W_out, D_out), by the
    compiled kernels: by the reference, 100 of them took 27 s of a loaded suite run (at
    most 5.6e-7 there; 1.7e-7 with seed 1, the strongly recurrent one: 33 hidden spikes,
    10 without the recurrence). The reference's own: the quick test's 24 entries."""
    errors = _fd_errors(_loss, run=_compiled, network=_network, richardson=True, h=1e-4)
    assert len(errors) == 156 and max(errors) <= 1e-6, max(errors)


def _gradients(
    recurrent: bool, flat: list[torch.Tensor], inputs: torch.Tensor
) -> tuple[tuple[torch.Tensor, ...], list[torch.Tensor]]:
    leaves = [t.clone().requires_grad_() for t in [inputs, *flat]]
    out = event_network(_lif(), _layers(leaves[1:], recurrent), leaves[0], t_end=T_END)
    _loss(out).backward()
    return tuple(t.detach() for t in out), [
        torch.zeros_like(t) if t.grad is None else t.grad for t in leaves
    ]


def test_zero_recurrent_weights_give_the_feedforward_network() -> None:
    """Arrivals of weight 0 change no state: the same spike times and gradients as the
    network without the recurrence, and dL/dD_rec = 0 (Q is proportional to w)."""
    inputs, flat = _network()
    flat[2] = torch.zeros(6, 6, dtype=F64)
    times, grads = _gradients(True, flat, inputs)
    ff_times, ff_grads = _gradients(False, flat, inputs)
    for a, b in zip(times, ff_times, strict=True):
        torch.testing.assert_close(a, b, rtol=0.0, atol=1e-12)  # +inf slots equal too
    for name, a, b in zip(TENSORS, grads, ff_grads, strict=True):
        if name not in ("W_rec", "D_rec"):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
    assert grads[4].abs().max() == 0 and grads[3].abs().max() > 0


def test_a_recurrent_spike_causes_a_later_spike() -> None:
    """Neuron 1 has no input but neuron 0's spike at t_0, through W_rec[1, 0] = 5 after
    D_rec[1, 0] = 2 ms: from rest, it spikes as neuron 0 did after its input (the same
    weight), at t_0 + 2 + (t_0 − 1). Without the recurrence it is silent."""
    layer = EventLayer(
        torch.tensor([[5.0], [0.0]], dtype=F64),
        torch.zeros(2, 1, dtype=F64),
        recurrent_weight=torch.tensor([[0.0, 0.0], [5.0, 0.0]], dtype=F64),
        recurrent_delay=torch.tensor([[1.5, 1.5], [2.0, 1.5]], dtype=F64),
    )
    inputs = torch.tensor([[1.0]], dtype=F64)
    (out,) = event_network(_lif(), [layer], inputs, t_end=T_END)
    t_0, t_1 = float(out[0, 0]), float(out[1, 0])
    assert abs((t_1 - t_0 - 2.0) - (t_0 - 1.0)) < 1e-12
    (feedforward,) = event_network(_lif(), [EventLayer(*layer[:2])], inputs, t_end=T_END)
    assert torch.isinf(feedforward[1]).all() and float(feedforward[0, 0]) == t_0


def test_the_rk4_path_runs_recurrent_layers() -> None:
    """A QIF network (RK4 steps of 0.25 ms): its recurrent gradients within 1e-5 of each
    tensor's largest entry of those at a sixteenth of the step (measured: 2.7e-7), and
    within 1e-4 of central differences of its own forward (measured: 1e-5)."""
    inputs, flat = _network()
    grads = []
    for dt in (0.25, 0.25 / 16):
        leaves = [t.clone().requires_grad_() for t in [inputs, *flat]]
        _loss(event_network(qif(dt), _layers(leaves[1:]), leaves[0], t_end=T_END)).backward()
        grads.append([t.grad for t in leaves])
    for name, coarse, fine in zip(TENSORS, *grads, strict=True):
        assert coarse is not None and fine is not None
        scale = fine.abs().max().clamp_min(1e-12)
        assert (coarse - fine).abs().max() / scale < 1e-5, name
    entries = [(3, 1), (3, 18), (4, 0), (4, 19)]
    errors = _fd_errors(_loss, entries, run=_run, network=_network, make=lambda: qif(0.25))
    assert max(errors) <= 1e-4, errors


def _recurrent(**changes: torch.Tensor | None) -> EventLayer:
    inputs, flat = _network()
    layer = _layers(flat)[0]
    return layer._replace(**changes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"recurrent_delay": None}, "together"),
        ({"recurrent_weight": torch.zeros(6, 5, dtype=F64)}, r"expected \[6, 6\]"),
        ({"recurrent_delay": torch.ones(5, 6, dtype=F64)}, r"expected \[6, 6\]"),
        ({"recurrent_weight": torch.full((6, 6), torch.nan, dtype=F64)}, "finite"),
        ({"recurrent_delay": torch.full((6, 6), torch.inf, dtype=F64)}, "at least one step"),
        ({"recurrent_delay": torch.zeros(6, 6, dtype=F64)}, "at least one step"),
        ({"recurrent_delay": torch.full((6, 6), 0.999, dtype=F64)}, "at least one step"),
    ],
)
def test_recurrent_layers_are_checked(
    changes: dict[str, torch.Tensor | None], message: str
) -> None:
    inputs, _ = _network()
    with pytest.raises(ValueError, match=message):
        event_network(_lif(), [_recurrent(**changes)], inputs, t_end=T_END)


def test_a_delay_of_one_step_is_enough() -> None:
    """D_rec = dt everywhere: each arrival falls at or after the end of its spike's step."""
    inputs, _ = _network()
    layer = _recurrent(recurrent_delay=torch.ones(6, 6, dtype=F64))
    (out,) = event_network(_lif(), [layer], inputs, t_end=T_END)
    assert torch.isfinite(out).sum() > 0


def test_readouts_refuse_recurrent_layers() -> None:
    """A readout does not spike: the reference's and the kernels' refuse recurrent fields
    (the kernels run recurrent spiking layers, the RK4 path's too:
    tests/test_eventprop_recurrent_kernels.py)."""
    inputs, _ = _network()
    layer = _recurrent()
    for peak in (max_voltage, eventprop.max_voltage):
        with pytest.raises(ValueError, match="does not spike"):
            peak(_lif(), layer, inputs, t_end=T_END)


def test_the_forward_refuses_an_arrival_inside_its_spikes_step() -> None:
    """Past event_network's check (a layer run directly): a recurrent delay below the
    step would put an arrival before the time its target has reached; the forward says
    so instead of running the target back."""
    inputs, flat = _network()
    model, _ = model_of(_lif(), None, None)
    short = torch.full((6, 6), 0.25, dtype=F64)
    layer = Layer(model, flat[0], flat[1], {}, (flat[2], short))
    with pytest.raises(RuntimeError, match="at least one step"):
        layer.forward(inputs, T_END, 1.0)


def test_a_batch_is_its_samples() -> None:
    inputs, flat = _network()
    batch = torch.stack([inputs, inputs.flip(0) + 1.0])
    together = event_network(_lif(), _layers(flat), batch, t_end=T_END)
    for b in range(2):
        alone = event_network(_lif(), _layers(flat), batch[b], t_end=T_END)
        for a, c in zip(together, alone, strict=True):
            torch.testing.assert_close(a[b, :, : c.shape[1]], c, rtol=0.0, atol=0.0)
            assert torch.isinf(a[b, :, c.shape[1] :]).all()
