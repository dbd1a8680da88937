"""The recurrent layer (issue 23, first step): X_eff[t] = x[t] + (R ⊙ M) s[t−1] + b.

Oracles: a float64 loop written here from the equations (LIF), the torch reference
backend for gradients (every backend against it), and snnTorch's RLeaky."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import generator

import symneuron as sn
from symneuron.runtime import cpu

needs_cc = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")
BACKENDS = ["torch", pytest.param("cpu", marks=needs_cc)]


def _layer(neuron: sn.Neuron, size: int, seed: int, backend: str, **kw) -> sn.RecurrentNeuronLayer:
    torch.manual_seed(seed)
    return sn.RecurrentNeuronLayer(neuron, size, backend=backend, **kw).double()


def _lif_loop(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, tau: float) -> tuple:
    """LIF (decay_input, hard reset to 0, threshold 1) with recurrence, written out."""
    v = torch.zeros_like(x[0])
    s = torch.zeros_like(x[0])
    spikes, vs = [], []
    for xt in x:
        drive = xt + s @ w.T + b
        h = v + (drive - v) / tau
        s = (h >= 1.0).to(x.dtype)
        v = h * (1 - s)
        spikes.append(s)
        vs.append(v)
    return torch.stack(spikes), torch.stack(vs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_lif_matches_the_equations_written_out(backend: str) -> None:
    layer = _layer(sn.models.LIF(), 12, 1, backend, bias=True)
    with torch.no_grad():
        layer.weight.mul_(3.0)
    x = 1.2 * torch.rand(20, 3, 12, generator=generator(2), dtype=torch.float64)
    spikes = layer(x)
    want, v_want = _lif_loop(x, layer.weight.detach(), layer.bias.detach(), 2.0)
    assert 0 < float(want.mean()) < 0.9
    assert torch.equal(spikes, want)
    torch.testing.assert_close(layer.cell.v, v_want[-1], rtol=0, atol=1e-12)


@needs_cc
@pytest.mark.parametrize("model", ["LIF", "Izhikevich", "ALIF"])
def test_gradients_match_the_reference(model: str) -> None:
    """Every gradient (x, weight, bias, a learnable neuron parameter) of the kernels'
    run against the torch reference, in float64."""
    neuron = getattr(sn.models, model)()
    learn = {"LIF": ["tau"], "Izhikevich": ["a"], "ALIF": ["tau"]}[model]
    neuron = neuron.replace(learnable=learn)
    x = 1.5 * torch.rand(15, 2, 10, generator=generator(3), dtype=torch.float64)
    grads, spikes = [], []
    for backend in ("torch", "cpu"):
        layer = _layer(neuron, 10, 4, backend, bias=True)
        with torch.no_grad():
            layer.weight.mul_(2.0)
        xi = x.clone().requires_grad_()
        s = layer(xi)
        (s * torch.linspace(-1, 1, 10, dtype=torch.float64)).sum().backward()
        spikes.append(s.detach())
        named = dict(layer.named_parameters())
        grads.append(
            [xi.grad, named["weight"].grad, named["bias"].grad, named[f"cell.{learn[0]}"].grad]
        )
    assert torch.equal(spikes[0], spikes[1]) and float(spikes[0].sum()) > 0
    for got, want in zip(grads[1], grads[0], strict=True):
        assert float(want.abs().max()) > 0
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_mask_and_frozen_weight() -> None:
    mask = 1 - torch.eye(6)
    layer = _layer(sn.models.LIF(), 6, 5, "torch", mask=mask, learn_weight=False)
    assert not layer.weight.requires_grad
    x = 2 * torch.rand(8, 2, 6, generator=generator(6), dtype=torch.float64)
    s = layer(x)
    layer.reset()
    want, _ = _lif_loop(x, (layer.weight * mask.double()).detach(), torch.zeros(6).double(), 2.0)
    assert torch.equal(s, want)
    learn = _layer(sn.models.LIF(), 6, 5, "torch", mask=mask)
    (learn(x) * torch.rand(8, 2, 6, dtype=torch.float64, generator=generator(7))).sum().backward()
    assert torch.all(learn.weight.grad.diagonal() == 0)  # masked weights get no gradient


def test_state_carries_over_between_calls_until_reset() -> None:
    layer = _layer(sn.models.LIF(), 5, 8, "torch")
    with torch.no_grad():
        layer.weight.mul_(3.0)
    x = 1.5 * torch.rand(10, 1, 5, generator=generator(9), dtype=torch.float64)
    whole = layer(x)
    layer.reset()
    halves = torch.cat([layer(x[:4]), layer(x[4:])])
    assert torch.equal(whole, halves)


def test_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="last dim must be the layer's size 4"):
        sn.RecurrentNeuronLayer(sn.models.LIF(), 4)(torch.rand(3, 2, 5))
    with pytest.raises(ValueError, match=r"mask must be \[size, size\]"):
        sn.RecurrentNeuronLayer(sn.models.LIF(), 4, mask=torch.ones(4, 3))
    layer = sn.RecurrentNeuronLayer(sn.models.LIF(), 4)
    layer.weight = torch.nn.Parameter(torch.rand(4, 3))
    with pytest.raises(ValueError, match="weight must be square"):
        layer(torch.rand(3, 2, 4))
    with pytest.raises(ValueError, match="size must be a positive int"):
        sn.RecurrentNeuronLayer(sn.models.LIF(), 0)


def test_deepcopy_and_state_dict_round_trip() -> None:
    layer = _layer(sn.models.PLIF(), 6, 10, "torch", bias=True, mask=1 - torch.eye(6))
    x = torch.rand(5, 2, 6, generator=generator(11), dtype=torch.float64)
    layer(x).sum().backward()
    twin = copy.deepcopy(layer)
    assert twin.s is not None and not twin.s.requires_grad
    fresh = _layer(sn.models.PLIF(), 6, 99, "torch", bias=True, mask=torch.ones(6, 6))
    fresh.load_state_dict(layer.state_dict())
    layer.reset()
    assert torch.equal(fresh(x), layer(x))


def test_matches_snntorch_rleaky() -> None:
    """snnTorch's RLeaky (subtract reset, all-to-all linear recurrence) against the
    symneuron form written for it: H = beta*V + X_eff, soft reset, reset applied in
    the same step (snnTorch's reset_delay=False). The two are the same map while the
    membrane after a reset stays below the threshold: above it, snnTorch decides the
    next spike on mem − θ (its guard against a double reset); the test checks that
    its inputs stay in that domain."""
    snn = pytest.importorskip("snntorch")
    beta, size = 0.9, 7
    torch.manual_seed(12)
    rleaky = snn.RLeaky(
        beta=beta, linear_features=size, reset_mechanism="subtract", reset_delay=False
    ).double()
    import sympy as sp

    b = sp.Symbol("beta", positive=True)
    neuron = sn.Neuron(b * sn.V + sn.X, params={b: beta}, v_reset=None, name="RLeakyLike")
    layer = sn.RecurrentNeuronLayer(neuron, size, bias=True, backend="torch").double()
    with torch.no_grad():
        rleaky.recurrent.weight.mul_(0.5)
        layer.weight.copy_(rleaky.recurrent.weight)
        layer.bias.copy_(rleaky.recurrent.bias)
    x = 0.6 * torch.rand(25, 3, size, generator=generator(13), dtype=torch.float64)
    spk = torch.zeros(3, size, dtype=torch.float64)  # s[-1] = 0, V[0] = 0
    mem = torch.zeros(3, size, dtype=torch.float64)
    want = []
    for xt in x:  # snnTorch's spikes come back in float32 (0/1, exact): fed back as float64
        spk, mem = rleaky(xt, spk.double(), mem)
        want.append(spk.double())
        assert float(mem.detach().max()) < 1.0  # the domain where the two maps agree
    got = layer(x)
    assert 0 < float(got.mean()) < 0.9
    assert torch.equal(got, torch.stack(want))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_the_reference(dtype: torch.dtype) -> None:
    neuron = sn.models.ALIF(learnable=["tau"])
    x = 1.5 * torch.rand(12, 4, 32, generator=generator(14), dtype=torch.float64)
    results = []
    for backend, device in (("torch", "cpu"), ("cuda", "cuda")):
        layer = _layer(neuron, 32, 15, backend, bias=True).to(device=device, dtype=dtype)
        xi = x.to(device=device, dtype=dtype).detach().clone().requires_grad_()
        s = layer(xi)
        s.sum().backward()
        results.append([s.detach().cpu(), xi.grad.cpu(), layer.weight.grad.cpu()])
    assert float(results[0][0].sum()) > 0
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    assert torch.equal(results[0][0], results[1][0])
    for got, want in zip(results[1][1:], results[0][1:], strict=True):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
