"""The cuda backend against the float64 torch reference, in all four dtypes.

Marked ``cuda``: skipped without a GPU. 16-bit runs are compared with a float64
reference that rounds H to the same 16-bit type each step (value only), so both
follow the same spike train; the bounds there are relative norms.
"""

from __future__ import annotations

import pytest
import torch
from conftest import BASIC_SURROGATES, SURROGATES, generator, run_with_grads, seed_of

import symneuron as sn

pytestmark = pytest.mark.cuda

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
# (max fraction of differing spikes, relative-norm bound for v and gradients)
BOUNDS = {
    torch.float64: (0.0, 1e-12),
    torch.float32: (0.0, 1e-5),
    torch.float16: (0.01, 2e-2),
    torch.bfloat16: (0.02, 8e-2),
}


def _zoo(name: str, reset: str, detach: bool, surrogate: str) -> sn.Neuron:
    kw: dict[str, object] = {"detach_reset": detach, "surrogate": SURROGATES[surrogate]()}
    if reset == "soft":
        kw["v_reset"] = None
    if name == "LIF":
        kw["learnable"] = ["tau"]
    return sn.models.DISCRETE[name](**kw)


def _relnorm(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _check(
    neuron: sn.Neuron,
    dtype: torch.dtype,
    x: torch.Tensor,
    v0: torch.Tensor,
    weights: list[torch.Tensor],
    params: dict[str, torch.Tensor] | None = None,
    states: dict[str, torch.Tensor] | None = None,
) -> None:
    """``neuron`` on the cuda backend in ``dtype`` against the float64 reference on the same
    (``dtype``-rounded) inputs; 16-bit params run in float32, as a layer keeps them."""
    params, states = params or {}, states or {}
    half = dtype in (torch.float16, torch.bfloat16)
    ref = run_with_grads(
        neuron,
        x.double(),
        v0.double(),
        {k: v.double() for k, v in params.items()},
        [w.double() for w in weights],
        states={k: v.double() for k, v in states.items()},
        round_h_to=dtype if half else None,
    )
    pdtype = torch.float32 if half else dtype
    got = run_with_grads(
        neuron,
        x.cuda(),
        v0.cuda(),
        {k: v.to(pdtype).cuda() for k, v in params.items()},
        weights,
        backend="cuda",
        states={k: v.cuda() for k, v in states.items()},
    )
    assert got.spikes.dtype == dtype and got.v_seq.dtype == dtype
    spike_frac = float(ref.spikes.mean())
    assert 0.02 < spike_frac < 0.98, f"degenerate input: spike fraction {spike_frac}"
    flips, bound = BOUNDS[dtype]
    differing = float((got.spikes.cpu().double() != ref.spikes).double().mean())
    assert differing <= flips, f"{differing:.4f} of spikes differ"
    if flips == 0.0:
        assert torch.equal(got.spikes.cpu().double(), ref.spikes)
    errors = {"v_seq": _relnorm(got.v_seq, ref.v_seq)}
    errors.update({f"{n}_seq": _relnorm(got.states[n], r) for n, r in ref.states.items()})
    assert got.grads.keys() == ref.grads.keys()
    errors.update({f"grad {n}": _relnorm(got.grads[n], r) for n, r in ref.grads.items()})
    if differing > 0:
        bound *= 5  # a flipped spike moves the trajectory by one reset
    bad = {k: e for k, e in errors.items() if not e <= bound}
    assert not bad, f"{neuron!r} {dtype}: errors over {bound}: {bad}"


def _compare(
    neuron: sn.Neuron,
    dtype: torch.dtype,
    seed: int,
    t_len: int = 8,
    shape: tuple[int, ...] = (3, 333),
) -> None:
    gen = generator(seed)
    x = (2.2 * torch.rand(t_len, *shape, generator=gen) - 0.2).to(dtype)
    v0 = (0.5 * torch.rand(*shape, generator=gen) - 0.1).to(dtype)
    params = {n: torch.tensor(neuron.params[n]) + 0.05 for n in neuron.learnable}
    weights = [torch.randn(t_len, *shape, generator=gen).to(dtype) for _ in range(2)]
    _check(neuron, dtype, x, v0, weights, params=params)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("surrogate", BASIC_SURROGATES)
@pytest.mark.parametrize("detach", [False, True])
@pytest.mark.parametrize("reset", ["hard", "soft"])
@pytest.mark.parametrize("name", list(sn.models.DISCRETE))
def test_cuda_matches_reference(
    name: str, reset: str, detach: bool, surrogate: str, dtype: torch.dtype
) -> None:
    seed = seed_of("zoo", name, reset, detach, surrogate, dtype)
    _compare(_zoo(name, reset, detach, surrogate), dtype, seed)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [1, 7, 1023])
def test_cuda_half_odd_sizes(dtype: torch.dtype, n: int) -> None:
    _compare(sn.models.PLIF(), dtype, seed_of("odd", n, dtype), t_len=32, shape=(n,))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_store_last_and_spike_only_loss(dtype: torch.dtype) -> None:
    neuron = sn.models.QIF(learnable=["tau", "a0"])
    x = 1.5 * torch.rand(6, 4, 101, generator=generator(seed_of("store-last", dtype)))
    x = x.to(dtype).cuda().requires_grad_(True)
    s_full, v_full = sn.simulate(neuron, x, store_v_seq=True)
    s_last, v_last = sn.simulate(neuron, x, store_v_seq=False)
    assert v_last.shape == (1, 4, 101)
    assert torch.equal(s_full, s_last) and torch.equal(v_full[-1:], v_last)
    (g_full,) = torch.autograd.grad((s_full.float().sum() + v_full[-1].float().sum()), x)
    (g_last,) = torch.autograd.grad((s_last.float().sum() + v_last.float().sum()), x)
    assert torch.equal(g_full, g_last)
    (g_spike,) = torch.autograd.grad(sn.simulate(neuron, x)[0].float().sum(), x)
    x64 = x.detach().double().cpu().requires_grad_(True)
    (g_ref,) = torch.autograd.grad(sn.simulate(neuron, x64, backend="torch")[0].sum(), x64)
    assert _relnorm(g_spike, g_ref) < BOUNDS[dtype][1] * 50


def test_cuda_per_channel_params_and_layer() -> None:
    neuron = sn.models.PLIF()
    gen = generator(seed_of("per-channel"))
    w = torch.randn(3, 1, generator=gen, dtype=torch.float64)
    layer = sn.NeuronLayer(neuron, params={"w": w}).cuda().double()
    x = torch.rand(6, 2, 3, 50, generator=gen, dtype=torch.float64)
    r = torch.randn(6, 2, 3, 50, generator=gen, dtype=torch.float64)
    spikes = layer(x.cuda())
    (spikes * r.cuda()).sum().backward()
    w_ref = layer.w.detach().cpu().clone().requires_grad_(True)
    ref, _ = sn.simulate(neuron, x, params={"w": w_ref}, backend="torch")
    (ref * r).sum().backward()
    assert torch.equal(spikes.cpu(), ref)
    assert layer.w.grad is not None and layer.w.grad.shape == (3, 1)
    assert _relnorm(layer.w.grad, w_ref.grad) < 1e-12


def test_cuda_graph_capture() -> None:
    neuron = sn.models.LIF()
    gen = generator(seed_of("graph"))
    x = torch.rand(8, 4096, generator=gen).cuda()
    sn.simulate(neuron, x)  # compile and warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        spikes, _ = sn.simulate(neuron, x)
    x.copy_(torch.rand(x.shape, generator=gen))
    graph.replay()
    torch.cuda.synchronize()
    expected, _ = sn.simulate(neuron, x)
    assert torch.equal(spikes, expected)


def test_check_on_cuda() -> None:
    for name, ctor in sn.models.DISCRETE.items():
        report = sn.check(ctor(), backend="cuda", device="cuda", seed=seed_of("check", name))
        assert report.passed, str(report)


# -- neurons with extra state variables ------------------------------------------------

STATEFUL_ACTIVE = {
    "Izhikevich": {"a": 0.3, "b": 0.2, "w_rest": 0.05, "learnable": ["a", "b"]},
    "ALIF": {"rho": 0.8, "beta": 0.6, "learnable": ["beta"]},
    "CuLIF": {"tau_syn": 3.0, "learnable": ["tau_syn"]},
    "AdEx": {"a": 0.2, "b": 0.1, "learnable": ["a", "tau_w"]},
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reset", ["hard", "soft"])
@pytest.mark.parametrize("name", sorted(STATEFUL_ACTIVE))
def test_cuda_stateful_matches_reference(name: str, reset: str, dtype: torch.dtype) -> None:
    kw = dict(STATEFUL_ACTIVE[name])
    kw["v_reset"] = None if reset == "soft" else 0.0
    neuron = sn.models.STATEFUL[name](**kw)
    gen = generator(seed_of("stateful", name, reset, dtype))
    shape = (3, 333)
    scale = {"ALIF": 2.4, "CuLIF": 1.0}.get(name, 1.5)
    x = (scale * torch.rand(8, *shape, generator=gen)).to(dtype)
    v0 = (0.4 * torch.rand(*shape, generator=gen)).to(dtype)
    w0 = {
        w: (st.init + 0.1 * torch.rand(*shape, generator=gen)).to(dtype)
        for w, st in neuron.states.items()
    }
    weights = [torch.randn(8, *shape, generator=gen).to(dtype) for _ in range(3)]
    _check(neuron, dtype, x, v0, weights, states=w0)
