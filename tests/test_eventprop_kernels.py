"""The compiled EventProp kernels (symneuron/eventprop.py) on batches. Oracles: the float64
per-neuron reference (symneuron/reference/events.py, written without the kernels: torch
functions of the same derived spec, a Python loop over samples, neurons and events),
central finite differences of the kernels' own forward (every perturbed run checked to
keep each neuron's spike count), and the float64 kernels for the float32 ones."""

from __future__ import annotations

import math
import warnings

import pytest
import sympy as sp
import torch

import symneuron as sn
from symneuron.codegen.events import render_events
from symneuron.derivation.events import turns_once
from symneuron.eventprop import EventLayer, GrazingSpikeWarning, event_network
from symneuron.reference.events import event_network as reference_network
from symneuron.reference.readouts import first_spike_cross_entropy
from tests.test_eventprop_reference import (
    ADAPTIVE,
    F64,
    I_SYN,
    NAMES,
    T_END,
    _adaptive,
    _adaptive_network,
    _lif,
    _network,
)

LIF_PARAMS, ADAPTIVE_PARAMS = NAMES, ADAPTIVE


def _batch(adaptive: bool = False, size: int = 2) -> list[torch.Tensor]:
    """The reference tests' 5 → 8 → 3 network with delays (with ``adaptive``, its
    adaptive-threshold twin) on a batch: its inputs [5, 3] (some slots empty), then the
    same neurons in reverse order 1 ms later, then 2 ms later...; returns [inputs
    [size, 5, 3], then per layer W, D and its params]."""
    inputs, flat = _adaptive_network() if adaptive else _network()
    rows = [inputs.flip(0) + b if b % 2 else inputs + b for b in range(size)]
    return [torch.stack(rows), *flat]


def _layers(flat: list[torch.Tensor], names: tuple[str, ...]) -> list[EventLayer]:
    k = 2 + len(names)
    return [
        EventLayer(flat[i], flat[i + 1], dict(zip(names, flat[i + 2 : i + k], strict=True)))
        for i in range(1, len(flat), k)
    ]


def _loss(times: tuple[torch.Tensor, ...], labels: torch.Tensor) -> torch.Tensor:
    """The first-spike cross-entropy plus 0.01 Σ every finite spike time (hidden too)."""
    total = sum(torch.where(torch.isfinite(t), t, 0.0).sum() for t in times)
    return first_spike_cross_entropy(times[-1], labels, tau0=2.0, t_end=T_END) + 0.01 * total


def _run_both(
    neuron: sn.Neuron, flat: list[torch.Tensor], names: tuple[str, ...]
) -> dict[str, tuple[tuple[torch.Tensor, ...], list[torch.Tensor]]]:
    """Spike times and every gradient of the kernels and of the reference, same loss."""
    labels = torch.arange(flat[0].shape[0]) % 3
    out = {}
    for name, network in (("kernels", event_network), ("reference", reference_network)):
        leaves = [t.clone().requires_grad_() for t in flat]
        times = network(neuron, _layers(leaves, names), leaves[0], t_end=T_END)
        _loss(times, labels).backward()
        out[name] = (times, [t.grad for t in leaves])
    return out


def _assert_agree(runs: dict[str, tuple[tuple[torch.Tensor, ...], list[torch.Tensor]]]) -> None:
    """Spike times within 1e-12 (ms), each gradient tensor within 1e-12 of its largest
    entry (measured: 3.4e-14 ms and 1.7e-14 for the LIF, 4.6e-14 ms and 9.1e-15 for the
    adaptive threshold)."""
    (ours, our_grads), (ref, ref_grads) = runs["kernels"], runs["reference"]
    for a, b in zip(ours, ref, strict=True):
        assert a.shape == b.shape and torch.equal(torch.isfinite(a), torch.isfinite(b))
        finite = torch.isfinite(b)
        assert (a[finite] - b[finite]).abs().max() < 1e-12
    for a, b in zip(our_grads, ref_grads, strict=True):
        assert a is not None and b is not None
        assert float((a - b).abs().max()) <= 1e-12 * float(b.abs().max()), (a - b).abs().max()


def test_kernels_agree_with_the_reference_on_a_batch() -> None:
    """5 → 8 → 3 LIF with delays, a batch of 2, several spikes per neuron: spike times
    and the gradients of W, D, ϑ, τ_m, τ_s of both layers and of the input times."""
    flat = _batch()
    runs = _run_both(_lif(), flat, LIF_PARAMS)
    counts = torch.isfinite(runs["reference"][0][0]).sum(-1)
    assert int(counts.max()) >= 3 and int((counts >= 2).sum()) >= 4
    _assert_agree(runs)


@pytest.mark.slow  # the reference's forward of the three-state neuron: about 4 s
def test_kernels_agree_with_the_reference_for_an_adaptive_threshold() -> None:
    """Three states (each sub-interval cut into 8 parts for the crossing search)."""
    flat = _batch(adaptive=True)
    runs = _run_both(_adaptive(), flat, ADAPTIVE_PARAMS)
    assert int(torch.isfinite(runs["reference"][0][0]).sum()) >= 20
    _assert_agree(runs)


def _counts(times: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    return [torch.isfinite(t).sum(-1) for t in times]


def test_every_gradient_matches_central_differences() -> None:
    """Every entry of every tensor (input times of both samples, W, D, ϑ, τ_m, τ_s of
    both layers), batch of 2: the kernels' gradients against central differences of their
    forward (h = 1e-5), relative error ≤ 1e-6. The denominator is at least the gradient
    whose 1e-6 is the differences' own rounding, 2ε|L|/h (3.6e-10 at L = 8.1: 3.6e-4):
    some gradients are 0 up to it, and one of 1.07e-4 differs from its difference by
    1.2e-10 (as it does from the difference at h = 1e-4 by 3e-13). Measured 4.8e-7."""
    neuron, flat = _lif(), _batch()
    labels = torch.tensor([1, 2])
    leaves = [t.clone().requires_grad_() for t in flat]
    times = event_network(neuron, _layers(leaves, LIF_PARAMS), leaves[0], t_end=T_END)
    loss = _loss(times, labels)
    loss.backward()
    counts = _counts(times)
    h = 1e-5
    floor = 2 * torch.finfo(F64).eps * abs(float(loss)) / h / 1e-6

    def central(a: int, i: int, h: float) -> float:
        values = []
        for sign in (1, -1):
            moved = [t.clone() for t in flat]
            moved[a].view(-1)[i] += sign * h
            out = event_network(neuron, _layers(moved, LIF_PARAMS), moved[0], t_end=T_END)
            assert all(torch.equal(c, d) for c, d in zip(_counts(out), counts, strict=True))
            values.append(float(_loss(out, labels)))
        return (values[0] - values[1]) / (2 * h)

    errors = []
    for a, tensor in enumerate(flat):
        grad = leaves[a].grad
        assert grad is not None
        for i in range(tensor.numel()):
            if math.isfinite(float(tensor.view(-1)[i])):
                fd = central(a, i, h)
                errors.append(abs(float(grad.view(-1)[i]) - fd) / max(abs(fd), floor))
    assert len(errors) == 185 and max(errors) <= 1e-6, max(errors)


def test_float32_kernels_follow_the_float64_ones() -> None:
    flat = _batch(size=3)
    labels = torch.tensor([1, 2, 0])
    results = []
    for dtype in (torch.float32, F64):
        leaves = [t.clone().to(dtype).requires_grad_() for t in flat]
        times = event_network(_lif(), _layers(leaves, LIF_PARAMS), leaves[0], t_end=T_END)
        assert all(t.dtype == dtype for t in times)
        _loss(times, labels).backward()
        results.append((times, [t.grad for t in leaves]))
    (t32, g32), (t64, g64) = results
    for a, b in zip(t32, t64, strict=True):
        finite = torch.isfinite(b)
        assert torch.equal(torch.isfinite(a), finite)
        assert (a.double()[finite] - b[finite]).abs().max() < 1e-4
    for a, b in zip(g32, g64, strict=True):
        assert a is not None and b is not None
        assert float((a.double() - b).abs().max()) <= 1e-4 * float(b.abs().max())


def test_a_batch_is_its_samples_and_one_sample_has_no_batch_axis() -> None:
    """Each row of a batch equals that sample run alone ([n_in, K] in, [n, K] out), up to
    the padding to the batch's most spikes; a first run with one slot per neuron grows
    them (a neuron spikes several times) to the same result."""
    flat = _batch(size=3)
    layers = _layers(flat, LIF_PARAMS)
    batch = event_network(_lif(), layers, flat[0], t_end=T_END)
    narrow = event_network(_lif(), layers, flat[0], t_end=T_END, capacity=1)
    assert all(torch.equal(a, b) for a, b in zip(batch, narrow, strict=True))
    for b in range(3):
        alone = event_network(_lif(), layers, flat[0][b], t_end=T_END)
        for got, want in zip(batch, alone, strict=True):
            assert want.dim() == 2
            assert torch.equal(got[b, :, : want.shape[1]], want)
            assert torch.isinf(got[b, :, want.shape[1] :]).all()


def test_the_forward_does_not_depend_on_dt() -> None:
    """Exact between breakpoints: steps of 1 and of 7 (several spikes a step) give the
    same spikes, and the reference's steps of 7 too."""
    flat = _batch()
    layers = _layers(flat, LIF_PARAMS)
    fine = event_network(_lif(1.0), layers, flat[0], t_end=T_END)
    coarse = event_network(_lif(7.0), layers, flat[0], t_end=T_END)
    reference = reference_network(_lif(7.0), layers, flat[0][1], t_end=T_END)
    for a, b, c in zip(fine, coarse, reference, strict=True):
        finite = torch.isfinite(a)
        assert torch.equal(finite, torch.isfinite(b))
        assert (a[finite] - b[finite]).abs().max() < 1e-11
        assert torch.equal(torch.isfinite(c), torch.isfinite(b[1, :, : c.shape[1]]))
        assert (c[torch.isfinite(c)] - b[1][torch.isfinite(b[1])]).abs().max() < 1e-11
    steps = torch.floor(coarse[0][torch.isfinite(coarse[0])] / 7.0)
    assert len(steps) > len(torch.unique(steps))


def _resonator() -> sn.Neuron:
    """Two states with complex modes (−1/τ ± iω): g's rate vanishes every half period."""
    tau, omega = sp.symbols("tau omega", positive=True)
    return sn.Neuron.from_ode(
        -sn.V / tau + omega * I_SYN,
        dt=1.0,
        method="exact",
        params={tau: 10.0, omega: 0.5},
        states={I_SYN: sn.ODEState(-omega * sn.V - I_SYN / tau + sn.X)},
    )


def test_only_two_real_modes_move_from_arrival_to_arrival() -> None:
    """The forward's one piece from arrival to arrival (``SN_WHOLE``) where ġ vanishes at
    most once along any stretch of the flow: the LIF with a current synapse (two real
    modes, g affine) yes; a third state (the adaptive threshold) and complex modes no
    (steps of dt bound their pieces). (A threshold not affine in two states is refused
    before: ϑ may use only the params and the other state, which spikes jump.)"""
    assert turns_once(_lif().events())
    for neuron in (_adaptive(), _resonator()):
        assert not turns_once(neuron.events()), neuron
    assert "#define SN_WHOLE 1" in render_events(_lif(), _lif().events(), "float64").text
    text = render_events(_adaptive(), _adaptive().events(), "float64").text
    assert "#define SN_WHOLE 0" in text


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_a_peak_inside_a_piece_is_searched_only_where_it_may_cross(dtype: torch.dtype) -> None:
    """Input 0 at 1 ms; input 1, of weight 0, every 2 ms from 3 to 11 ms cuts the flow
    into pieces, and V peaks at w/4 (ϑ = 1) 6.93 ms after the input, inside the concave
    piece [7, 9], then a quiet stretch runs to 200 ms. Weights just above 4 spike at the
    peak, just below do not: the forward skips a peak's search only where the end
    tangents bound g below 0, so each spikes as the reference does in steps of 0.5 ms."""
    t_end, inf = 200.0, math.inf
    w = torch.tensor([2.0, 3.99, 4.0 * (1 - 1e-4), 4.0 * (1 + 1e-4), 4.4])
    weights = torch.stack([w, torch.zeros(5)], 1).to(dtype)
    layer = EventLayer(weights, torch.zeros(5, 2, dtype=dtype))
    inputs = torch.tensor([[1.0, inf, inf, inf, inf], [3.0, 5.0, 7.0, 9.0, 11.0]], dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GrazingSpikeWarning)
        (ours,) = event_network(_lif(), [layer], inputs, t_end=t_end)
        (theirs,) = reference_network(_lif(0.5), [layer], inputs.double(), t_end=t_end)
    assert torch.isfinite(ours[:, 0]).tolist() == [False, False, False, True, True]
    assert 7.0 < float(ours[3, 0]) < 9.0
    finite = torch.isfinite(theirs)
    assert torch.equal(finite, torch.isfinite(ours[:, : theirs.shape[1]]))
    tolerance = 1e-12 if dtype == torch.float64 else 1e-3
    assert float((ours[finite].double() - theirs[finite]).abs().max()) < tolerance


def test_a_step_that_does_not_divide_t_end_runs_to_t_end() -> None:
    """t_end = 30 in steps of 7: the last step, [28, 30], is cut at t_end, not dropped;
    an input at 28.2 makes a spike in it, found by the kernels and the reference alike."""
    layer = EventLayer(torch.full((1, 1), 20.0, dtype=F64), torch.zeros(1, 1, dtype=F64))
    inputs = torch.tensor([[28.2]], dtype=F64)
    (fine,) = event_network(_lif(1.0), [layer], inputs, t_end=T_END)
    for network in (event_network, reference_network):
        (coarse,) = network(_lif(7.0), [layer], inputs, t_end=T_END)
        assert 28.0 < float(coarse[0, 0]) < T_END
        assert abs(float(coarse[0, 0] - fine[0, 0])) < 1e-12


def test_a_grazing_spike_is_reported_with_its_sample() -> None:
    """One input of weight 4(1 + 1e-8) just reaches ϑ = 1 (V peaks at w/4): ġ⁻ ≈ 1e-5."""
    inputs = torch.tensor([[[1.0], [2.0]], [[1.0], [2.0]]], dtype=F64)
    w = torch.tensor([[4.0 * (1 + 1e-8), 0.0], [0.0, 6.0]], dtype=F64)
    layer = EventLayer(w, torch.zeros(2, 2, dtype=F64))
    with pytest.warns(GrazingSpikeWarning) as caught:
        event_network(_lif(), [layer], inputs, t_end=T_END)
    messages = sorted(str(c.message) for c in caught)
    assert len(messages) == 2
    assert messages[0].startswith("layer 0, sample 0, neuron 0: a spike at t = ")
    assert messages[1].startswith("layer 0, sample 1, neuron 0: ")
    with warnings.catch_warnings():
        warnings.simplefilter("error", GrazingSpikeWarning)
        event_network(_lif(), [layer], inputs, t_end=T_END, grazing=1e-6)


def test_bad_inputs_are_refused_with_the_reason() -> None:
    flat = _batch(size=1)
    layers = _layers(flat, LIF_PARAMS)
    with pytest.raises(ValueError, match="weight of shape"):
        event_network(_lif(), layers[1:], flat[0], t_end=T_END)
    bad = [EventLayer(layers[0].weight, -layers[0].delay), layers[1]]
    with pytest.raises(ValueError, match="delays must be finite and ≥ 0"):
        event_network(_lif(), bad, flat[0], t_end=T_END)
    with pytest.raises(ValueError, match="≥ 0"):
        event_network(_lif(), layers, flat[0] - 20, t_end=T_END)
    with pytest.raises(TypeError, match="float32 or float64"):
        event_network(_lif(), layers, flat[0].half(), t_end=T_END)
    with pytest.raises(ValueError, match="unknown params"):
        event_network(_lif(), [EventLayer(*layers[0][:2], {"tau": flat[3]})], flat[0], t_end=T_END)


def test_delays_changed_in_place_are_read_again() -> None:
    """What is known of a delay tensor (one value a row: the shared arrival order) is
    remembered at its version, and checked again after the forward: uniform delays
    changed in place to differ along a row run as the reference does with the new
    delays (not through the stale shared order), whether the change bumped the version
    or went through ``.data`` (which keeps it); delays changed to NaN are refused either
    way; NaN input times are refused too (checked after the forward, with its
    outcomes)."""
    flat = _batch(size=1)
    inputs, weight, delay = flat[0], flat[1], torch.full_like(flat[2], 0.5)
    layer = [EventLayer(weight, delay, dict(zip(LIF_PARAMS, flat[3:6], strict=True)))]
    first = event_network(_lif(), layer, inputs, t_end=T_END)
    assert torch.equal(first[0], event_network(_lif(), layer, inputs, t_end=T_END)[0])
    delay[:, 1] += 2.0  # in place: the same tensor, a new version
    (ours,) = event_network(_lif(), layer, inputs, t_end=T_END)
    (theirs,) = reference_network(_lif(), layer, inputs[0], t_end=T_END)
    assert not torch.equal(ours, first[0])
    finite = torch.isfinite(theirs)
    assert torch.equal(finite, torch.isfinite(ours[0, :, : theirs.shape[1]]))
    assert float((ours[0][finite] - theirs[finite]).abs().max()) < 1e-12
    uniform = torch.full_like(delay, 0.5)
    layer = [layer[0]._replace(delay=uniform)]
    assert torch.equal(event_network(_lif(), layer, inputs, t_end=T_END)[0], first[0])
    uniform.data[:, 1] += 2.0  # the version stays: found after the forward, run again
    (again,) = event_network(_lif(), layer, inputs, t_end=T_END)
    assert torch.equal(again, ours)
    uniform.data[0, 0] = math.nan
    with pytest.raises(ValueError, match="delays must be finite and ≥ 0"):
        event_network(_lif(), layer, inputs, t_end=T_END)
    delay[0, 0] = math.nan
    layer = [layer[0]._replace(delay=delay)]
    with pytest.raises(ValueError, match="delays must be finite and ≥ 0"):
        event_network(_lif(), layer, inputs, t_end=T_END)
    delay[0, 0] = 0.5
    with pytest.raises(ValueError, match="not NaN"):
        event_network(_lif(), layer, inputs.clone().fill_(math.nan), t_end=T_END)


def test_a_reset_that_does_not_leave_the_threshold_is_an_error_at_run_time() -> None:
    """With the adaptive threshold the reset's margin g(h(x)) = −ϑ0 − A − β depends on
    A, so it is checked per spike: β = −2 makes it ≥ 0 at the first spike (A = 0)."""
    weight, delay = torch.full((1, 1), 6.0, dtype=F64), torch.zeros(1, 1, dtype=F64)
    inputs = torch.tensor([[1.0]], dtype=F64)
    wrong = EventLayer(weight, delay, {"beta": torch.tensor([-2.0], dtype=F64)})
    for network in (event_network, reference_network):
        with pytest.raises(RuntimeError, match="did not leave the threshold"):
            network(_adaptive(), [wrong], inputs, t_end=T_END)
    right = EventLayer(weight, delay, {"beta": torch.tensor([0.3], dtype=F64)})
    assert torch.isfinite(event_network(_adaptive(), [right], inputs, t_end=T_END)[0]).any()


def test_generated_source_prints_the_derived_jump() -> None:
    """Golden lines: the LIF's jump λ_V⁻ = (B τ_m + I λ_V⁺)/(I − ϑ), printed in each
    dtype (params p0 = τ_m, p1 = τ_s, p2 = ϑ; x1 = I), the store's index (I only), and
    the flow's e^{−s/τ_m} as a product with the constant −1/τ_m, computed once a neuron."""
    lif = _lif()
    double = render_events(lif, lif.events(), "float64").text
    assert "    const double r0 = -(B*p0 + l0*x1)/(p2 - x1);" in double
    assert "SN_CONST int sn_store[NSTORE + 1] = {1, 0};" in double
    single = render_events(lif, lif.events(), "float32").text
    assert "typedef float real;" in single and "expf(p3*s)" in single
    assert "const float r0 = -c0;" in single and "const float c0 = (1/(p0));" in single
