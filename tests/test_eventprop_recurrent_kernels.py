"""Recurrent layers in the compiled EventProp kernels (symneuron/codegen/event_recurrent.c:
a sample's neurons in step, a step at a time). Oracles: the float64 reference
(symneuron/reference/events.py, itself checked against Richardson-extrapolated central
differences in test_eventprop_recurrent.py) on the same batch; on a GPU, the C kernels."""

from __future__ import annotations

import pytest
import torch
from eventprop_models import adex, eif, qif
from test_eventprop_recurrent import T_END, TENSORS, _layers, _network
from test_eventprop_reference import _lif

import symneuron as sn
from symneuron import eventprop
from symneuron.codegen.events import render_events
from symneuron.derivation.events import system_text
from symneuron.reference import events as reference
from symneuron.reference.readouts import first_spike_cross_entropy
from symneuron.runtime import event_launch
from symneuron.runtime import events as runtime_events

F64 = torch.float64


def _batch(seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Three samples of ``_network(seed)``'s 3 → 6 (recurrent) → 2 network."""
    inputs, flat = _network(seed)
    return torch.stack([inputs, inputs.flip(0) + 1.0, inputs * 0.7]), flat


def _loss(times: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Each sample's first-spike cross-entropy plus 0.01 Σ every spike time."""
    total = sum(torch.where(torch.isfinite(t), t, 0.0).sum() for t in times)
    labels = torch.ones(times[-1].shape[0], dtype=torch.long, device=times[-1].device)
    return first_spike_cross_entropy(times[-1], labels, tau0=2.0, t_end=T_END) + 0.01 * total


def _run(
    network,  # type: ignore[no-untyped-def]
    inputs: torch.Tensor,
    flat: list[torch.Tensor],
    dtype: torch.dtype = F64,
    device: str = "cpu",
    params: bool = True,
    neuron: sn.Neuron | None = None,
    **kwargs: object,
) -> tuple[tuple[torch.Tensor, ...], list[torch.Tensor]]:
    """Every layer's spike times and the gradient of every tensor (``TENSORS``' order;
    with ``params`` False, ϑ, τ_m and τ_s get none: zeros, and the backward runs without
    the time constants' integrals, its SN_DIRECT sweep), of ``neuron`` (the LIF by
    default)."""
    leaves = [t.to(device, dtype).clone() for t in (inputs, *flat)]
    for name, leaf in zip(TENSORS, leaves, strict=True):
        leaf.requires_grad_(params or name not in ("theta", "tau_m", "tau_s"))
    neuron = _lif() if neuron is None else neuron
    out = network(neuron, _layers(leaves[1:]), leaves[0], t_end=T_END, **kwargs)
    _loss(tuple(t.double() for t in out)).backward()
    grads = [torch.zeros_like(t) if t.grad is None else t.grad for t in leaves]
    return tuple(t.detach().cpu() for t in out), [g.cpu() for g in grads]


def _assert_close(ours, theirs, times_tol: float, grad_tol: float) -> None:  # type: ignore[no-untyped-def]
    """Spike times within ``times_tol`` (same counts), gradients within ``grad_tol`` of
    each tensor's largest entry."""
    for a, b in zip(ours[0], theirs[0], strict=True):
        assert a.shape == b.shape
        assert torch.equal(torch.isfinite(a), torch.isfinite(b))
        finite = torch.isfinite(b)
        assert (a[finite].double() - b[finite].double()).abs().max() <= times_tol
    for name, a, b in zip(TENSORS, ours[1], theirs[1], strict=True):
        scale = b.abs().max().clamp_min(1e-12)
        assert (a.double() - b.double()).abs().max() / scale <= grad_tol, name


@pytest.mark.parametrize(("seed", "params"), [(4, True), (7, True), (7, False)])
def test_recurrent_kernels_agree_with_the_reference(seed: int, params: bool) -> None:
    """float64 C kernels: spike times within 1e-12 and every gradient (weights, delays,
    recurrent ones, ϑ, τ_m, τ_s, input times) within 1e-10 of the reference's (measured:
    2e-13 and 1e-14), with the time constants' integrals (the sweep through one sorted
    list) and without (feedforward and recurrent arrivals in lists of their own). Seed 7
    spikes 12 times in a neuron: its forward runs again with more slots."""
    inputs, flat = _batch(seed)
    ours = _run(eventprop.event_network, inputs, flat, params=params)
    theirs = _run(reference.event_network, inputs, flat, params=params)
    assert sum(int(torch.isfinite(t).sum()) for t in theirs[0]) >= 10
    _assert_close(ours, theirs, 1e-12, 1e-10)


def test_recurrent_kernels_in_float32() -> None:
    """float32: the same spikes, times within 1e-4 and gradients within 1e-3 (measured)."""
    inputs, flat = _batch(4)
    ours = _run(eventprop.event_network, inputs, flat, torch.float32)
    theirs = _run(reference.event_network, inputs, flat)
    _assert_close(ours, theirs, 1e-4, 1e-3)


def test_uniform_feedforward_delays_and_one_slot() -> None:
    """Delays equal along each row (the forward reads its feedforward arrivals through
    the samples' shared order; the backward sorts them with the recurrent ones) and a
    first run with one slot a neuron: the reference's results."""
    inputs, flat = _batch(5)
    flat[1] = flat[1][:, :1].expand(-1, 3).contiguous()
    for params in (True, False):
        ours = _run(eventprop.event_network, inputs, flat, params=params, capacity=1)
        theirs = _run(reference.event_network, inputs, flat, params=params)
        _assert_close(ours, theirs, 1e-12, 1e-10)


def test_recurrent_delays_of_one_step() -> None:
    """D_rec = dt everywhere (each arrival in the step after its spike's, the least the
    kernels take): the reference's results."""
    inputs, flat = _batch(7)
    flat[3] = torch.ones(6, 6, dtype=F64)
    for params in (True, False):
        ours = _run(eventprop.event_network, inputs, flat, params=params)
        theirs = _run(reference.event_network, inputs, flat, params=params)
        _assert_close(ours, theirs, 1e-12, 1e-10)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_full_queue_runs_again_with_more_room(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Room for one waiting recurrent arrival a neuron at first: the forward finds its
    queues full, runs again with four times the room until they fit, and gives the
    reference's results."""
    inputs, flat = _batch(7)
    lif = _lif()
    kernels = runtime_events.event_kernels(
        lif, lif.events(), system_text(lif.ode), None, F64, device
    )
    kernels.queues.clear()
    monkeypatch.setattr(runtime_events, "QUEUE_SLOTS", 1)
    ours = _run(eventprop.event_network, inputs, flat, device=device, params=False)
    assert list(kernels.queues.values()) and min(kernels.queues.values()) >= 4
    theirs = _run(reference.event_network, inputs, flat, params=False)
    _assert_close(ours, theirs, 1e-12, 1e-10)


@pytest.mark.parametrize("params", [True, False])
def test_the_rk4_path_agrees_with_the_reference(params: bool) -> None:
    """A QIF network (no closed-form flow: RK4 steps of 0.25 ms, crossings on each step's
    Hermite interpolant; the backward replays each neuron's forward and sweeps its trace
    back a step at a time), with the time constants' integrals and without: float64
    within 1e-12 and 1e-10 of the reference (measured: 1.1e-14 and 1.0e-15, 66 hidden
    spikes), float32 within 1e-4 and 1e-5 (measured: 9.2e-6 and 5.9e-7)."""
    inputs, flat = _batch(4)
    theirs = _run(reference.event_network, inputs, flat, params=params, neuron=qif(0.25))
    assert sum(int(torch.isfinite(t).sum()) for t in theirs[0]) >= 10
    ours = _run(eventprop.event_network, inputs, flat, params=params, neuron=qif(0.25))
    _assert_close(ours, theirs, 1e-12, 1e-10)
    single = _run(
        eventprop.event_network, inputs, flat, torch.float32, params=params, neuron=qif(0.25)
    )
    _assert_close(single, theirs, 1e-4, 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("model", [eif, adex], ids=["EIF", "AdEx"])
def test_the_rk4_path_agrees_with_the_reference_for_eif_and_adex(model) -> None:  # type: ignore[no-untyped-def]
    """The EIF and the AdEx (three states) at their default dt: float64 within 1e-12 and
    1e-10 of the reference (measured: 7.1e-15 and 9.8e-16; 46 and 44 hidden spikes)."""
    inputs, flat = _batch(4)
    theirs = _run(reference.event_network, inputs, flat, neuron=model())
    assert sum(int(torch.isfinite(t).sum()) for t in theirs[0]) >= 10
    ours = _run(eventprop.event_network, inputs, flat, neuron=model())
    _assert_close(ours, theirs, 1e-12, 1e-10)


def test_a_recurrent_delay_under_one_step_is_refused() -> None:
    inputs, flat = _batch(4)
    flat[3] = torch.full((6, 6), 0.5, dtype=F64)
    with pytest.raises(ValueError, match="at least one step"):
        eventprop.event_network(_lif(), _layers(flat), inputs, t_end=T_END)


@pytest.mark.parametrize("rk4", [False, True], ids=["flow", "rk4"])
def test_recurrent_source_compiles_with_nvrtc(rk4: bool) -> None:
    """The recurrent layers' CUDA source (with the time-constant integrals), the LIF's
    closed-form flow and the QIF's RK4 path: its two kernels to PTX, no call left, no
    other kernel."""
    from tests.conftest import nvrtc_or_skip

    nvrtc = nvrtc_or_skip()
    neuron = qif(0.25) if rk4 else _lif()
    source = render_events(
        neuron, neuron.events(), "float32", True, "cuda", rk4=rk4, part="recurrent"
    )
    ptx = nvrtc.compile_to_ptx(source.text, "loop.cu", ("-arch=compute_90", "-std=c++17"))
    entries = [line for line in ptx.splitlines() if ".entry" in line]
    assert len(entries) == 2 and "sn_events_loop_forward" in entries[0]
    assert "call.uni" not in ptx


def _wide(seed: int, n: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A 3 → n (recurrent) → 2 network with ``_network``'s ranges (more neurons than a
    CUDA block's threads: several a thread)."""
    g = torch.Generator().manual_seed(seed)

    def uniform(*shape: int, low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(*shape, generator=g, dtype=F64)

    inputs = torch.sort(uniform(4, 3, 2, low=0.0, high=10.0), dim=2).values
    return inputs, [
        uniform(n, 3, low=-0.3, high=2.2),
        uniform(n, 3, low=0.0, high=3.0),
        uniform(n, n, low=-0.06, high=0.04),
        uniform(n, n, low=1.0, high=4.0),
        torch.ones(n, dtype=F64),
        uniform(n, low=10.0, high=11.0),
        uniform(n, low=5.0, high=6.0),
        uniform(2, n, low=-0.2, high=1.8),
        uniform(2, n, low=0.0, high=2.0),
    ]


@pytest.mark.cuda
def test_cuda_recurrent_samples_in_waves(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scratch budget of one sample: the recurrent kernels run the batch a sample a
    launch, with the same results as C."""
    inputs, flat = _batch(4)
    c = _run(eventprop.event_network, inputs, flat, params=False)
    monkeypatch.setattr(event_launch, "SAMPLE_SCRATCH", 1)
    _assert_close(
        _run(eventprop.event_network, inputs, flat, device="cuda", params=False), c, 1e-12, 1e-10
    )


@pytest.mark.cuda
@pytest.mark.parametrize("n", [6, 300])
def test_cuda_recurrent_kernels_agree_with_c(n: int) -> None:
    """CUDA (a block a sample; 300 neurons: several a thread) against C in float64:
    spike times within 1e-12, gradients within 1e-10 (atomic adds reorder sums); float32
    within 1e-3 and 1e-3 of the float64 C kernels (C's float32 measured 1.8e-4 and 7.8e-5
    on the 300 neurons' chains of recurrent spikes)."""
    inputs, flat = _batch(4) if n == 6 else _wide(0, n)
    for params in (True, False):
        c = _run(eventprop.event_network, inputs, flat, params=params)
        assert sum(int(torch.isfinite(t).sum()) for t in c[0]) >= 10
        cuda = _run(eventprop.event_network, inputs, flat, device="cuda", params=params)
        _assert_close(cuda, c, 1e-12, 1e-10)
        single = _run(eventprop.event_network, inputs, flat, torch.float32, "cuda", params)
        _assert_close(single, c, 1e-3, 1e-3)


@pytest.mark.cuda
def test_cuda_rk4_recurrent_kernels_agree_with_c() -> None:
    """The QIF network's RK4 path in CUDA (each thread's replay of its neuron's forward
    in the backward) against C in float64: within 1e-12 and 1e-10."""
    inputs, flat = _batch(4)
    for params in (True, False):
        c = _run(eventprop.event_network, inputs, flat, params=params, neuron=qif(0.25))
        cuda = _run(
            eventprop.event_network, inputs, flat, device="cuda", params=params, neuron=qif(0.25)
        )
        _assert_close(cuda, c, 1e-12, 1e-10)
