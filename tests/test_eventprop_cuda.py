"""The EventProp kernels on CUDA, and what both backends share.

CUDA tests (marked ``cuda``): the CUDA kernels against the float64 C kernels (which
tests/test_eventprop_kernels.py checks against the reference) and, once, against the
float64 reference itself: spike times and every gradient within 1e-12 in float64, within
1e-4 (of the largest entry) in float32, as the C float32 test allows. Without a GPU:
the CUDA sources compile with NVRTC, and the shared arrival order (a neuron's delays
equal along its row) gives the C kernels the reference's results."""

from __future__ import annotations

import math

import pytest
import torch

import symneuron as sn
from symneuron.codegen.events import render_events
from symneuron.derivation.events import system_text
from symneuron.eventprop import event_network
from symneuron.reference.events import event_network as reference_network
from symneuron.runtime import event_launch
from symneuron.runtime import events as runtime_events
from tests.conftest import nvrtc_or_skip
from tests.eventprop_models import adex
from tests.test_eventprop_kernels import (
    ADAPTIVE_PARAMS,
    LIF_PARAMS,
    _adaptive,
    _batch,
    _layers,
    _lif,
    _loss,
)
from tests.test_eventprop_reference import F64, T_END

Run = tuple[list[torch.Tensor], list[torch.Tensor]]


def _run(
    neuron: sn.Neuron,
    flat: list[torch.Tensor],
    names: tuple[str, ...],
    device: str,
    dtype: torch.dtype = F64,
    network=event_network,  # noqa: ANN001
    **kwargs: object,
) -> Run:
    """Spike times and the gradient of every tensor of ``flat`` (moved to ``device`` in
    ``dtype``) under the kernels' test loss, as float64 CPU tensors."""
    leaves = [t.to(device=device, dtype=dtype).clone().requires_grad_() for t in flat]
    labels = torch.arange(flat[0].shape[0], device=device) % 3
    times = network(neuron, _layers(leaves, names), leaves[0], t_end=T_END, **kwargs)
    _loss(times, labels).backward()
    grads = []
    for t in leaves:
        assert t.grad is not None
        grads.append(t.grad.detach().cpu().double())
    return [t.detach().cpu().double() for t in times], grads


def _assert_close(ours: Run, theirs: Run, tolerance: float) -> None:
    """The same spike counts, times within ``tolerance`` (ms), each gradient tensor within
    ``tolerance`` of its largest entry."""
    for a, b in zip(ours[0], theirs[0], strict=True):
        assert a.shape == b.shape and torch.equal(torch.isfinite(a), torch.isfinite(b))
        finite = torch.isfinite(b)
        if finite.any():
            assert float((a[finite] - b[finite]).abs().max()) < tolerance
    for a, b in zip(ours[1], theirs[1], strict=True):
        assert float((a - b).abs().max()) <= tolerance * max(float(b.abs().max()), 1e-300)


def _assert_same(ours: Run, theirs: Run) -> None:
    """Every time and gradient equal, bit for bit."""
    for a, b in zip([*ours[0], *ours[1]], [*theirs[0], *theirs[1]], strict=True):
        assert torch.equal(a, b)


def _uniform_delays(flat: list[torch.Tensor], names: tuple[str, ...]) -> list[torch.Tensor]:
    """``flat`` with each neuron's delays set to its first one (the shared arrival order)."""
    out = [t.clone() for t in flat]
    for i in range(2, len(out), 2 + len(names)):
        out[i] = out[i][:, :1].expand_as(out[i]).contiguous()
    return out


# -- without a GPU -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("model", ["lif", "adaptive", "adex"])
def test_cuda_sources_compile_with_nvrtc(model: str, dtype: str) -> None:
    """Both passes, with the time-constant integrals (every part of the skeleton; AdEx:
    its RK4 path), to PTX with no call left (everything inlined, no malloc) and no local
    memory."""
    nvrtc = nvrtc_or_skip()
    neuron = {"lif": _lif, "adaptive": _adaptive, "adex": adex}[model]()
    source = render_events(neuron, neuron.events(), dtype, integrals=True, backend="cuda")
    assert "atomicAdd(&(ref), (value))" in source.text
    ptx = nvrtc.compile_to_ptx(source.text, "events.cu", ("-arch=compute_90", "-std=c++17"))
    assert ".entry sn_events_forward(" in ptx and ".entry sn_events_backward(" in ptx
    assert "call.uni" not in ptx and ".local" not in ptx
    assert ".entry sn_events_peak(" not in ptx  # the readouts are a source of their own


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cuda_readout_sources_compile_with_nvrtc(dtype: str) -> None:
    """The readouts' source (the LIF's, with the time-constant integrals): its four
    kernels to PTX with no call left and no local memory."""
    nvrtc = nvrtc_or_skip()
    neuron = _lif()
    source = render_events(
        neuron, neuron.events(), dtype, integrals=True, backend="cuda", part="readouts"
    )
    ptx = nvrtc.compile_to_ptx(source.text, "readouts.cu", ("-arch=compute_90", "-std=c++17"))
    for kernel in ("peak", "peak_backward", "mean", "mean_backward"):
        assert f".entry sn_events_{kernel}(" in ptx, kernel
    assert "call.uni" not in ptx and ".local" not in ptx


def test_one_skeleton_serves_both_languages() -> None:
    """C and CUDA differ only in the header's words and the entry points."""
    lif = _lif()
    c = render_events(lif, lif.events(), "float64", backend="cpu").text
    cu = render_events(lif, lif.events(), "float64", backend="cuda").text
    assert "#define SN_CUDA 0" in c and "#define SN_CUDA 1" in cu
    assert c[c.index("#define NS") :] == cu[cu.index("#define NS") :]
    with pytest.raises(ValueError, match="run on"):
        render_events(lif, lif.events(), "float64", backend="metal")


def test_shared_arrival_order_agrees_with_the_reference() -> None:
    """Each neuron's delays equal along its row: arrivals read through each sample's sorted
    spikes (no per-neuron sort), every gradient (delays' too) as the reference's."""
    flat = _uniform_delays(_batch(), LIF_PARAMS)
    assert bool((flat[2] == flat[2][:, :1]).all())
    ours = _run(_lif(), flat, LIF_PARAMS, "cpu")
    theirs = _run(_lif(), flat, LIF_PARAMS, "cpu", network=reference_network)
    assert int(torch.isfinite(theirs[0][0]).sum()) >= 8
    _assert_close(ours, theirs, 1e-12)


def _kernels(device: str) -> runtime_events.EventKernels:
    lif = _lif()
    text = system_text(lif.ode)
    return runtime_events.event_kernels(lif, lif.events(), text, None, F64, device)


@pytest.mark.parametrize("uniform", [False, True], ids=["own-sort", "shared-order"])
def test_transposed_weights_give_the_same_results(
    uniform: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The [n_in, N] layout CUDA reads (and adds its gradients into), run by the C kernels:
    the same times and gradients, bit for bit (every sum in the same order)."""
    flat = _uniform_delays(_batch(), LIF_PARAMS) if uniform else _batch()
    rows = _run(_lif(), flat, LIF_PARAMS, "cpu")
    monkeypatch.setattr(_kernels("cpu"), "transpose", True)
    _assert_same(_run(_lif(), flat, LIF_PARAMS, "cpu"), rows)


def test_a_shape_starts_with_the_slots_it_last_needed() -> None:
    """After a forward whose neurons spiked up to n times, the next of that shape gives
    n + n // 4 slots from the start (no second run); the results do not change."""
    flat = _batch(size=3)
    kernels = _kernels("cpu")
    kernels.slots.clear()
    first = _run(_lif(), flat, LIF_PARAMS, "cpu", capacity=1)
    most = int(torch.isfinite(first[0][0]).sum(-1).max())
    assert most >= 3 and kernels.slots[(3, 8, 15)] == most + most // 4
    _assert_same(_run(_lif(), flat, LIF_PARAMS, "cpu", capacity=1), first)


def test_unwanted_sums_are_skipped_and_not_returned() -> None:
    """Input times and delays without requires_grad: no gradient for them, the weights'
    the same as with them."""
    lif, flat = _lif(), _batch()
    full = _run(lif, flat, LIF_PARAMS, "cpu")
    w = flat[1].clone().requires_grad_()
    layer = [t if i != 1 else w for i, t in enumerate(flat)]
    times = event_network(lif, _layers(layer, LIF_PARAMS), flat[0], t_end=T_END)
    _loss(times, torch.arange(2) % 3).backward()
    assert w.grad is not None and torch.allclose(w.grad, full[1][1], rtol=0, atol=1e-13)


def test_other_devices_are_refused_with_the_reason() -> None:
    """Layers on another device than the inputs; a device with no kernels."""
    lif, flat = _lif(), _batch()
    elsewhere = [flat[0], *(t.to("meta") for t in flat[1:])]
    with pytest.raises(ValueError, match="run where the inputs are"):
        event_network(lif, _layers(elsewhere, LIF_PARAMS), flat[0], t_end=T_END)
    spec = lif.events()
    with pytest.raises(ValueError, match="run on \\['cpu', 'cuda'\\] tensors"):
        runtime_events.event_kernels(lif, spec, repr(lif.ode), None, torch.float64, "meta")


# -- on a GPU --------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("uniform", [False, True], ids=["own-sort", "shared-order"])
def test_cuda_float64_matches_the_c_kernels(uniform: bool) -> None:
    """5 → 8 → 3 LIF, batch of 4, random delays (each row sorts its arrivals) or delays
    equal along each row (the shared order): times and every gradient within 1e-12."""
    flat = _batch(size=4)
    flat = _uniform_delays(flat, LIF_PARAMS) if uniform else flat
    ours = _run(_lif(), flat, LIF_PARAMS, "cuda")
    theirs = _run(_lif(), flat, LIF_PARAMS, "cpu")
    assert int(torch.isfinite(theirs[0][0]).sum(-1).max()) >= 3
    _assert_close(ours, theirs, 1e-12)


@pytest.mark.cuda
def test_cuda_float64_matches_the_reference() -> None:
    flat = _batch()
    ours = _run(_lif(), flat, LIF_PARAMS, "cuda")
    theirs = _run(_lif(), flat, LIF_PARAMS, "cpu", network=reference_network)
    _assert_close(ours, theirs, 1e-12)


@pytest.mark.cuda
def test_cuda_adaptive_threshold_matches_the_c_kernels() -> None:
    """Three states (the crossing search in 8 parts, the backward replaying the forward)."""
    flat = _batch(adaptive=True, size=3)
    ours = _run(_adaptive(), flat, ADAPTIVE_PARAMS, "cuda")
    theirs = _run(_adaptive(), flat, ADAPTIVE_PARAMS, "cpu")
    assert int(torch.isfinite(theirs[0][0]).sum()) >= 20
    _assert_close(ours, theirs, 1e-12)


@pytest.mark.cuda
@pytest.mark.parametrize("model", ["lif", "adaptive"])
def test_cuda_float32_follows_float64(model: str) -> None:
    """The C float32 test's tolerance: 1e-4 ms, 1e-4 of each gradient's largest entry."""
    neuron, names = (_lif(), LIF_PARAMS) if model == "lif" else (_adaptive(), ADAPTIVE_PARAMS)
    flat = _batch(adaptive=model == "adaptive", size=3)
    ours = _run(neuron, flat, names, "cuda", torch.float32)
    theirs = _run(neuron, flat, names, "cpu")
    _assert_close(ours, theirs, 1e-4)


@pytest.mark.cuda
def test_cuda_several_spikes_in_one_step() -> None:
    """dt = 10 ms over 30 ms: neurons spike several times inside one step."""
    flat = _batch(size=3)
    coarse = _lif(dt=10.0)
    ours = _run(coarse, flat, LIF_PARAMS, "cuda")
    theirs = _run(coarse, flat, LIF_PARAMS, "cpu")
    hidden = theirs[0][0]
    per_step = [((hidden >= s) & (hidden < s + 10)).sum(-1) for s in (0.0, 10.0, 20.0)]
    assert max(int(c.max()) for c in per_step) >= 2
    _assert_close(ours, theirs, 1e-12)


@pytest.mark.cuda
def test_cuda_empty_inputs() -> None:
    """A sample without input spikes (and a batch of only such): no spikes, zero
    gradients, no error."""
    flat = _batch(size=2)
    flat[0][1] = math.inf
    ours = _run(_lif(), flat, LIF_PARAMS, "cuda")
    theirs = _run(_lif(), flat, LIF_PARAMS, "cpu")
    _assert_close(ours, theirs, 1e-12)
    assert not torch.isfinite(ours[0][0][1]).any()
    flat[0][:] = math.inf
    times, grads = _run(_lif(), flat, LIF_PARAMS, "cuda")
    assert not any(torch.isfinite(t).any() for t in times)
    assert all(float(g.abs().max()) == 0 for g in grads[1:])


@pytest.mark.cuda
def test_cuda_capacity_retry_and_waves(monkeypatch: pytest.MonkeyPatch) -> None:
    """One spike slot at first (the forward runs again with enough), and 6 KiB of scratch
    a launch (a few rows each: the rows run in waves): the same results."""
    flat = _batch(size=4)
    theirs = _run(_lif(), flat, LIF_PARAMS, "cpu")
    assert int(torch.isfinite(theirs[0][0]).sum(-1).max()) >= 3
    _kernels("cuda").slots.clear()  # no start from what an earlier run of this shape needed
    _assert_close(_run(_lif(), flat, LIF_PARAMS, "cuda", capacity=1), theirs, 1e-12)
    monkeypatch.setattr(event_launch, "SCRATCH", 3 * 2048)
    _assert_close(_run(_lif(), flat, LIF_PARAMS, "cuda"), theirs, 1e-12)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [F64, torch.float32], ids=["float64", "float32"])
def test_cuda_nonlinear_matches_the_c_kernels(dtype: torch.dtype) -> None:
    """AdEx (three states, the RK4 path), batch of 3: the CUDA kernels against the float64
    C kernels (which follow the reference's RK4 path to 1e-12,
    tests/test_eventprop_kernels_rk4.py), within 1e-12 in float64 and within the C
    float32 test's 1e-4 in float32."""
    from tests.test_eventprop_kernels_rk4 import nonlinear_batch

    neuron = adex()
    flat, names = nonlinear_batch(neuron, size=3)
    ours = _run(neuron, flat, names, "cuda", dtype)
    theirs = _run(neuron, flat, names, "cpu")
    assert int(torch.isfinite(theirs[0][0]).sum()) >= 30
    _assert_close(ours, theirs, 1e-12 if dtype == F64 else 1e-4)
