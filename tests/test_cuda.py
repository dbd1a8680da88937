"""The cuda backend against the float64 torch reference, in all four dtypes.

Marked ``cuda``: skipped without a GPU. 16-bit runs are compared with a float64
reference that rounds H to the same 16-bit type each step (value only), so both
follow the same spike train; the bounds there are relative norms.
"""

from __future__ import annotations

import pytest
import torch

import symneuron as sn
from symneuron.reference import simulate_reference

pytestmark = pytest.mark.cuda

DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
SURROGATES = {
    "Sigmoid": sn.surrogate.Sigmoid,
    "ATan": sn.surrogate.ATan,
    "PiecewiseQuadratic": sn.surrogate.PiecewiseQuadratic,
}
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
    return sn.models.ZOO[name](**kw)


def _run(neuron, x, v0, params, weights, backend, round_h_to=None):  # type: ignore[no-untyped-def]
    leaves = {"x": x.clone().requires_grad_(True), "v0": v0.clone().requires_grad_(True)}
    leaves.update({k: v.clone().requires_grad_(True) for k, v in params.items()})
    p = {k: leaves[k] for k in params}
    if backend == "reference":
        values = {**neuron.params, **p}
        s, v = simulate_reference(neuron, leaves["x"], leaves["v0"], values, round_h_to=round_h_to)
    else:
        s, v = sn.simulate(neuron, leaves["x"], leaves["v0"], p, backend=backend)
    loss = (s * weights[0].to(s.dtype)).sum() + (v * weights[1].to(v.dtype)).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return s.detach(), v.detach(), [g.detach() for g in grads]


def _relnorm(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _compare(neuron: sn.Neuron, dtype: torch.dtype, t_len: int = 8, shape=(3, 333)) -> None:  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(torch.seed())
    x = (2.2 * torch.rand(t_len, *shape, generator=gen) - 0.2).to(dtype)
    v0 = (0.5 * torch.rand(*shape, generator=gen) - 0.1).to(dtype)
    params = {n: torch.tensor(neuron.params[n]) + 0.05 for n in neuron.learnable}
    weights = [torch.randn(t_len, *shape, generator=gen).to(dtype) for _ in range(2)]
    half = dtype in (torch.float16, torch.bfloat16)
    ref = _run(
        neuron,
        x.double(),
        v0.double(),
        {k: v.double() for k, v in params.items()},
        [w.double() for w in weights],
        "reference",
        dtype if half else None,
    )
    pdtype = torch.float32 if half else dtype
    got = _run(
        neuron,
        x.cuda(),
        v0.cuda(),
        {k: v.to(pdtype).cuda() for k, v in params.items()},
        [w.cuda() for w in weights],
        "cuda",
    )
    assert got[0].dtype == dtype and got[1].dtype == dtype
    spike_frac = float(ref[0].mean())
    assert 0.02 < spike_frac < 0.98, f"degenerate input: spike fraction {spike_frac}"
    flips, bound = BOUNDS[dtype]
    differing = float((got[0].cpu().double() != ref[0]).double().mean())
    assert differing <= flips, f"{differing:.4f} of spikes differ"
    if flips == 0.0:
        assert torch.equal(got[0].cpu().double(), ref[0])
    errors = {"v_seq": _relnorm(got[1], ref[1])}
    names = ["x_seq", "v_init", *params]
    errors.update(
        {f"grad {n}": _relnorm(g, r) for n, g, r in zip(names, got[2], ref[2], strict=True)}
    )
    if differing > 0:
        bound *= 5  # a flipped spike moves the trajectory by one reset
    bad = {k: e for k, e in errors.items() if not e <= bound}
    assert not bad, f"{neuron!r} {dtype}: errors over {bound}: {bad}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("surrogate", list(SURROGATES))
@pytest.mark.parametrize("detach", [False, True])
@pytest.mark.parametrize("reset", ["hard", "soft"])
@pytest.mark.parametrize("name", list(sn.models.ZOO))
def test_cuda_matches_reference(
    name: str, reset: str, detach: bool, surrogate: str, dtype: torch.dtype
) -> None:
    _compare(_zoo(name, reset, detach, surrogate), dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("n", [1, 7, 1023])
def test_cuda_half_odd_sizes(dtype: torch.dtype, n: int) -> None:
    _compare(sn.models.PLIF(), dtype, t_len=32, shape=(n,))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_store_last_and_spike_only_loss(dtype: torch.dtype) -> None:
    neuron = sn.models.QIF(learnable=["tau", "a0"])
    x = (1.5 * torch.rand(6, 4, 101)).to(dtype).cuda().requires_grad_(True)
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
    w = torch.randn(3, 1, dtype=torch.float64)
    layer = sn.NeuronLayer(neuron, params={"w": w}).cuda().double()
    x = torch.rand(6, 2, 3, 50, dtype=torch.float64)
    r = torch.randn(6, 2, 3, 50, dtype=torch.float64)
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
    x = torch.rand(8, 4096, device="cuda")
    sn.simulate(neuron, x)  # compile and warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        spikes, _ = sn.simulate(neuron, x)
    x.copy_(torch.rand_like(x))
    graph.replay()
    torch.cuda.synchronize()
    expected, _ = sn.simulate(neuron, x)
    assert torch.equal(spikes, expected)


def test_check_on_cuda() -> None:
    for ctor in sn.models.ZOO.values():
        report = sn.check(ctor(), backend="cuda", device="cuda")
        assert report.passed, str(report)


# -- neurons with extra state variables ------------------------------------------------

STATEFUL_ACTIVE = {
    "Izhikevich": {"a": 0.3, "b": 0.2, "w_rest": 0.05, "learnable": ["a", "b"]},
    "ALIF": {"rho": 0.8, "beta": 0.6, "learnable": ["beta"]},
    "CuLIF": {"tau_syn": 3.0, "learnable": ["tau_syn"]},
    "AdEx": {"a": 0.2, "b": 0.1, "learnable": ["a", "tau_w"]},
}


def _run_stateful(neuron, x, v0, w0, weights, backend, round_h_to=None):  # type: ignore[no-untyped-def]
    leaves = {"x": x.clone().requires_grad_(True), "v0": v0.clone().requires_grad_(True)}
    leaves.update({f"w:{k}": v.clone().requires_grad_(True) for k, v in w0.items()})
    states = {k: leaves[f"w:{k}"] for k in w0}
    if backend == "reference":
        s, v, w = simulate_reference(
            neuron,
            leaves["x"],
            leaves["v0"],
            dict(neuron.params),
            w_init=states,
            round_h_to=round_h_to,
        )
    else:
        s, v, w = sn.simulate(neuron, leaves["x"], leaves["v0"], backend=backend, states=states)
    outs = [s, v, *w.values()]
    loss = sum((o * r.to(o.dtype)).sum() for o, r in zip(outs, weights, strict=False))
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return [o.detach() for o in outs], [g.detach() for g in grads]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reset", ["hard", "soft"])
@pytest.mark.parametrize("name", sorted(STATEFUL_ACTIVE))
def test_cuda_stateful_matches_reference(name: str, reset: str, dtype: torch.dtype) -> None:
    kw = dict(STATEFUL_ACTIVE[name])
    kw["v_reset"] = None if reset == "soft" else 0.0
    neuron = sn.models.STATEFUL[name](**kw)
    gen = torch.Generator().manual_seed(torch.seed())
    shape = (3, 333)
    scale = {"ALIF": 2.4, "CuLIF": 1.0}.get(name, 1.5)
    x = (scale * torch.rand(8, *shape, generator=gen)).to(dtype)
    v0 = (0.4 * torch.rand(*shape, generator=gen)).to(dtype)
    w0 = {
        w: (st.init + 0.1 * torch.rand(*shape, generator=gen)).to(dtype)
        for w, st in neuron.states.items()
    }
    weights = [torch.randn(8, *shape, generator=gen).to(dtype) for _ in range(3)]
    half = dtype in (torch.float16, torch.bfloat16)
    ref = _run_stateful(
        neuron,
        x.double(),
        v0.double(),
        {k: v.double() for k, v in w0.items()},
        [w.double() for w in weights],
        "reference",
        dtype if half else None,
    )
    got = _run_stateful(
        neuron,
        x.cuda(),
        v0.cuda(),
        {k: v.cuda() for k, v in w0.items()},
        [w.cuda() for w in weights],
        "cuda",
    )
    assert 0.02 < float(ref[0][0].mean()) < 0.98, "degenerate input"
    flips, bound = BOUNDS[dtype]
    differing = float((got[0][0].cpu().double() != ref[0][0]).double().mean())
    assert differing <= flips
    bound *= 5 if differing > 0 else 1
    errors = {
        f"out{i}": _relnorm(g, r)
        for i, (g, r) in enumerate(zip(got[0][1:], ref[0][1:], strict=True))
    }
    errors.update(
        {f"grad{i}": _relnorm(g, r) for i, (g, r) in enumerate(zip(got[1], ref[1], strict=True))}
    )
    bad = {k: e for k, e in errors.items() if not e <= bound}
    assert not bad, f"{name} {reset} {dtype}: errors over {bound}: {bad}"
