"""The compiled readouts (:func:`symneuron.eventprop.max_voltage`, :func:`~symneuron.
eventprop.mean_voltage`): a batch's maxima and weighted means of V and their gradients in
the C and CUDA kernels. Oracles: the float64 per-sample reference
(symneuron/reference/readouts.py, written without the kernels; its own tests check it
against finite differences), central finite differences of the kernels' forward where a
maximum sits on an arrival (the term the two must get alike), and the float64 kernels for
the float32 ones."""

from __future__ import annotations

import math

import pytest
import torch

from symneuron.eventprop import EventLayer, event_network, max_voltage, mean_voltage
from symneuron.reference import readouts as reference
from tests.eventprop_models import qif
from tests.test_eventprop_reference import F64, _adaptive, _lif

T_END = 30.0
N_OUT, N_IN, K = 4, 6, 3


def _inputs(seed: int = 0, batch: int = 3) -> dict[str, torch.Tensor]:
    """Input spike times [batch, 6, 3] (one slot empty), readout weights of both signs
    (inhibitory inputs put some maxima on arrivals), delays, τ_m and τ_s per neuron."""
    g = torch.Generator().manual_seed(seed)
    times = torch.sort(torch.rand(batch, N_IN, K, generator=g, dtype=F64) * 25, dim=-1).values
    times[0, 0, 2] = math.inf
    return {
        "times": times,
        "weight": torch.randn(N_OUT, N_IN, generator=g, dtype=F64) * 2,
        "delay": torch.rand(N_OUT, N_IN, generator=g, dtype=F64) * 3,
        "tau_m": 10 + torch.rand(N_OUT, generator=g, dtype=F64),
        "tau_s": 5 + torch.rand(N_OUT, generator=g, dtype=F64),
    }


def _run(fn, given: dict[str, torch.Tensor], dtype=F64, device="cpu", **kwargs):  # noqa: ANN001, ANN003, ANN202
    """(values, times, {name: gradient}) of Σ_j (j + 1)·y_j over the batch, as float64
    (times: the maxima's, or zeros for a mean)."""
    leaves = {
        k: v.to(device=device, dtype=dtype).clone().requires_grad_() for k, v in given.items()
    }
    params = {"tau_m": leaves["tau_m"], "tau_s": leaves["tau_s"]}
    readout = EventLayer(leaves["weight"], leaves["delay"], params=params)
    out = fn(_lif(), readout, leaves["times"], t_end=T_END, **kwargs)
    values, times = (out, torch.zeros_like(out)) if isinstance(out, torch.Tensor) else out
    scale = torch.arange(1, N_OUT + 1, dtype=dtype, device=device)
    (values * scale).sum().backward()
    grads = {k: v.grad.detach().cpu().double() for k, v in leaves.items()}
    return values.detach().cpu().double(), times.detach().cpu().double(), grads


def _on_arrival(given: dict[str, torch.Tensor], times: torch.Tensor) -> torch.Tensor:
    """Which maxima [batch, n_out] sit on an arrival (a source time plus its delay)."""
    arrivals = given["times"][:, None, :, :] + given["delay"][None, :, :, None]
    gap = (arrivals.flatten(2) - times[..., None]).abs().amin(-1)
    return gap < 1e-12


def _close(ours, theirs, tolerance: float, values_tolerance: float | None = None) -> None:  # noqa: ANN001
    values, times, grads = ours
    bound = values_tolerance if values_tolerance is not None else tolerance
    assert (values - theirs[0]).abs().max() <= bound * theirs[0].abs().max()
    assert torch.allclose(times, theirs[1], rtol=0, atol=1e-9 if tolerance < 1e-6 else 1e-3)
    for name, grad in grads.items():
        scale = max(float(theirs[2][name].abs().max()), 1e-3)
        assert (grad - theirs[2][name]).abs().max() <= tolerance * scale, name


@pytest.mark.parametrize("uniform", [False, True], ids=["own-order", "shared-order"])
def test_float64_kernels_match_the_reference(uniform: bool) -> None:
    """Times and every gradient (weights, delays, input times, τ_m, τ_s) within 1e-10 of
    the reference's, values within 1e-8, on maxima of every kind: on an arrival, inside a
    piece, at t = 0 (a readout that only falls). (The reference's V away from its events
    is off by up to about 2e-9 here: at t_end = 29, sample 0, readout 3, the kernels give
    0.991056284612030 as a 40-digit closed form does, the reference 0.991056282398.)"""
    given = _inputs()
    if uniform:  # every delay of a row equal: the arrivals come in the samples' order
        given["delay"] = given["delay"][:, :1].expand(-1, N_IN).contiguous()
    ours, theirs = _run(max_voltage, given), _run(reference.max_voltage, given)
    _close(ours, theirs, 1e-10, 1e-8)
    times = theirs[1]
    kinds = _on_arrival(given, times), (times > 0) & ~_on_arrival(given, times), times == 0
    assert all(bool(kind.any()) for kind in kinds), "the test must cover every kind"


def test_float32_kernels_match_the_reference() -> None:
    given = _inputs(seed=1)
    _close(_run(max_voltage, given, torch.float32), _run(reference.max_voltage, given), 1e-4)


@pytest.mark.parametrize(
    ("uniform", "tau_weight"),
    [(False, None), (True, 12.0)],
    ids=["own-order-plain", "shared-order-weighted"],
)
def test_the_mean_matches_the_reference(uniform: bool, tau_weight: float | None) -> None:
    """The mean of V (plain and weighted by e^{−t/12}) and every gradient (weights,
    delays, input times, τ_m and τ_s through ∫λ·∂f/∂θ) within 1e-10 of the reference's in
    float64, 1e-4 in float32."""
    given = _inputs(seed=3)
    if uniform:
        given["delay"] = given["delay"][:, :1].expand(-1, N_IN).contiguous()
    theirs = _run(reference.mean_voltage, given, tau_weight=tau_weight)
    _close(_run(mean_voltage, given, tau_weight=tau_weight), theirs, 1e-10)
    _close(_run(mean_voltage, given, torch.float32, tau_weight=tau_weight), theirs, 1e-4)


def test_a_mean_over_all_time_is_the_synapses_integral() -> None:
    """Closed form, no reference: one input spike at 0 with weight w gives ∫V dt = ∫I dt
    = w·τ_s over all time (V and I decay to 0), and ∂y/∂w = τ_s / T."""
    w = torch.full((1, 1), 2.0, dtype=F64, requires_grad=True)
    readout = EventLayer(w, torch.zeros(1, 1, dtype=F64))
    y = mean_voltage(_lif(), readout, torch.zeros(1, 1, dtype=F64), t_end=1000.0)
    y.sum().backward()
    assert abs(float(y.detach()) * 1000.0 - 2.0 * 5.0) <= 1e-9
    assert abs(float(w.grad) - 5.0 / 1000.0) <= 1e-12


def test_a_maximum_on_an_arrival_moves_with_its_delay() -> None:
    """Where V rises into an inhibitory arrival, y moves with the arrival's time: the
    delay's gradient against central differences of the kernels' forward (the arrival's
    own terms see no kick, the reference's order)."""
    given = _inputs()
    values, times, grads = _run(max_voltage, given)
    b, j = (int(i) for i in _on_arrival(given, times).nonzero()[0])
    arrivals = given["times"][b] + given["delay"][j][:, None]
    i = int((arrivals - times[b, j]).abs().amin(-1).argmin())
    h = 1e-6

    def y(shift: float) -> float:
        delay = given["delay"].clone()
        delay[j, i] += shift
        params = {"tau_m": given["tau_m"], "tau_s": given["tau_s"]}
        readout = EventLayer(given["weight"], delay, params=params)
        out = max_voltage(_lif(), readout, given["times"], t_end=T_END)
        return float((out.values * torch.arange(1, N_OUT + 1, dtype=F64)).sum())

    fd = (y(h) - y(-h)) / (2 * h)
    assert grads["delay"][j, i] != 0
    assert abs(grads["delay"][j, i] - fd) <= 1e-6 * max(1.0, abs(fd))


def test_a_hidden_layers_spikes_feed_the_readout() -> None:
    """event_network's spike times [B, n, K] go straight in, and the loss's gradient
    reaches the hidden weights (the readout's −ΣQ per input spike)."""
    g = torch.Generator().manual_seed(2)
    inputs = torch.sort(torch.rand(2, 5, 2, generator=g, dtype=F64) * 10, dim=-1).values
    hidden_w = (torch.rand(8, 5, generator=g, dtype=F64) * 2).requires_grad_()
    (hidden,) = event_network(
        _lif(), [EventLayer(hidden_w, torch.zeros(8, 5, dtype=F64))], inputs, t_end=T_END
    )
    assert torch.isfinite(hidden).any()
    readout = EventLayer(torch.randn(3, 8, generator=g, dtype=F64), torch.ones(3, 8, dtype=F64))
    y = max_voltage(_lif(), readout, hidden, t_end=T_END)
    torch.nn.functional.cross_entropy(y.values, torch.tensor([0, 2])).backward()
    assert hidden_w.grad is not None and bool(hidden_w.grad.abs().sum() > 0)


def test_one_sample_gives_one_row() -> None:
    given = _inputs()
    readout = EventLayer(given["weight"], given["delay"])
    one = max_voltage(_lif(), readout, given["times"][1], t_end=T_END)
    batch = max_voltage(_lif(), readout, given["times"], t_end=T_END)
    assert one.values.shape == (N_OUT,) and torch.equal(one.values, batch.values[1])


def test_what_readouts_cannot_run_is_refused_with_the_way_out() -> None:
    given = _inputs()
    weight = torch.ones(2, N_IN, dtype=F64)
    flat = EventLayer(weight, torch.zeros(2, N_IN, dtype=F64))
    for neuron, kind in ((qif(), "nonlinear"), (_adaptive(), "of 3 states")):
        with pytest.raises(NotImplementedError, match=f"is {kind}.*first_spike_cross_entropy"):
            max_voltage(neuron, flat, given["times"], t_end=T_END)
        with pytest.raises(NotImplementedError):  # (the reference refuses it too)
            reference.max_voltage(neuron, flat, given["times"][0], t_end=T_END)
    looped = EventLayer(
        weight,
        weight * 0,
        recurrent_weight=torch.eye(2, dtype=F64),
        recurrent_delay=torch.ones(2, 2, dtype=F64),
    )
    with pytest.raises(ValueError, match="does not spike"):
        max_voltage(_lif(), looped, given["times"], t_end=T_END)
    late = given["times"].clone()
    late[0, 0, 0] = -1.0
    with pytest.raises(ValueError, match="≥ 0"):
        max_voltage(_lif(), flat, late, t_end=T_END)
    with pytest.raises(ValueError, match="tau_weight must be a positive"):
        mean_voltage(_lif(), flat, given["times"], t_end=T_END, tau_weight=-1.0)


@pytest.mark.cuda
@pytest.mark.parametrize("uniform", [False, True], ids=["own-order", "shared-order"])
def test_cuda_matches_the_c_kernels(uniform: bool) -> None:
    """Both readouts: float64 CUDA within 1e-12 of float64 C; float32 CUDA within 1e-4 of
    the reference."""
    given = _inputs(batch=40)
    if uniform:
        given["delay"] = given["delay"][:, :1].expand(-1, N_IN).contiguous()
    _close(_run(max_voltage, given, device="cuda"), _run(max_voltage, given), 1e-12)
    theirs = _run(reference.max_voltage, given)
    _close(_run(max_voltage, given, torch.float32, "cuda"), theirs, 1e-4)
    for tau in (None, 12.0):
        ours = _run(mean_voltage, given, device="cuda", tau_weight=tau)
        _close(ours, _run(mean_voltage, given, tau_weight=tau), 1e-12)
        theirs = _run(reference.mean_voltage, given, tau_weight=tau)
        _close(_run(mean_voltage, given, torch.float32, "cuda", tau_weight=tau), theirs, 1e-4)
