"""A recurrent connection's delay: X_eff[t] = x[t] + R·s[t−d] + b for any d >= 1.

The oracle is written here, independent of the layer: one step at a time through
``sn.simulate(backend="torch")`` in float64, each step's drive made from the spikes of
d steps before. Every backend must give the same spikes and gradients within 1e-12,
carry the last d steps of spikes from call to call, and checkpoint alike.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils.checkpoint
from conftest import generator

import symneuron as sn
from symneuron.runtime import cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")

DELAYS = [1, 2, 3, 7]
MODELS = {"LIF": sn.models.LIF, "ALIF": sn.models.ALIF}


def _neuron(name: str) -> sn.Neuron:
    return MODELS[name](learnable=["tau"])


def _oracle(
    neuron: sn.Neuron,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    delay: int,
    params: dict,
) -> torch.Tensor:
    """Spikes [T, B, F] of the delayed recurrence, one simulate call per step."""
    v, states, out = None, None, []
    for t in range(x.shape[0]):
        fed = out[t - delay] @ weight.t() if t >= delay else 0.0
        drive = (x[t] + fed + bias)[None]
        s, v_seq, *rest = sn.simulate(neuron, drive, v, params, backend="torch", states=states)
        v = v_seq[-1]
        if rest:
            states = {name: seq[-1] for name, seq in rest[0].items()}
        out.append(s[0])
    return torch.stack(out)


def _layer(name: str, backend: str, delay: int, size: int = 6) -> sn.RecurrentNeuronLayer:
    torch.manual_seed(21)
    layer = sn.RecurrentNeuronLayer(_neuron(name), size, backend=backend, bias=True, delay=delay)
    layer = layer.double()
    with torch.no_grad():
        layer.weight.mul_(3.0)
        layer.cell.tau.fill_(2.0)
    return layer


def _input(t_len: int = 16, size: int = 6) -> torch.Tensor:
    return 1.2 * torch.rand(t_len, 3, size, generator=generator(22), dtype=torch.float64)


def _grads(layer: sn.RecurrentNeuronLayer, s: torch.Tensor, x: torch.Tensor) -> dict:
    readout = torch.linspace(-1, 1, s.shape[-1], dtype=s.dtype, device=s.device)
    (s * readout).sum().backward()
    found = {name: p.grad for name, p in layer.named_parameters()}
    return {"s": s.detach(), "x": x.grad, **found}


@pytest.mark.parametrize("delay", DELAYS)
@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_spikes_and_gradients_match_the_oracle(backend: str, name: str, delay: int) -> None:
    layer = _layer(name, backend, delay)
    x = _input().requires_grad_()
    got = _grads(layer, layer(x), x)
    weight = layer.weight.detach().clone().requires_grad_()
    bias = layer.bias.detach().clone().requires_grad_()
    tau = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    xo = x.detach().clone().requires_grad_()
    params = {k: p.detach() for k, p in layer.cell.param_values().items()}  # (the layer's)
    s = _oracle(_neuron(name), xo, weight, bias, delay, {**params, "tau": tau})
    want = _grads(layer, s, xo)  # (the oracle's gradients: weight, bias, tau below)
    want.update({"weight": weight.grad, "bias": bias.grad, "cell.tau": tau.grad})
    assert 0.05 < float(want["s"].mean()) < 0.8, "the layer must spike, not saturate"
    assert torch.equal(got["s"], want["s"])
    for key in ("x", "weight", "bias", "cell.tau"):
        torch.testing.assert_close(got[key], want[key], rtol=1e-12, atol=1e-12, msg=key)


def test_a_delay_changes_the_spikes() -> None:
    """The delay is honoured (delays 1 and 3 give different spikes on the same layer)."""
    x = _input()
    one, three = _layer("LIF", "cpu", 1)(x), _layer("LIF", "cpu", 3)(x)
    assert not torch.equal(one, three)


@pytest.mark.parametrize("steps", [1, 2, 5])
@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_state_carries_the_last_delay_steps_across_calls(backend: str, steps: int) -> None:
    """Calls of ``steps`` steps (fewer, and more, than the delay 3) give what one call
    gives, and the layer keeps the spikes of the last 3 steps, oldest first."""
    x = _input(10)
    whole_layer = _layer("ALIF", backend, 3)
    whole = whole_layer(x)
    layer = _layer("ALIF", backend, 3)
    parts = torch.cat([layer(chunk) for chunk in x.split(steps)])
    assert torch.equal(parts, whole)
    assert layer.s is not None and tuple(layer.s.shape) == (3, 3, 6)
    assert torch.equal(layer.s, whole[-3:])
    layer.reset()
    assert layer.s is None


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_gives_the_unchecked_gradients(reentrant: bool) -> None:
    x = _input(12)
    plain = _layer("ALIF", "cpu", 2)
    xa = x.clone().requires_grad_()
    want = _grads(plain, torch.cat([plain(c) for c in xa.split(4)]), xa)
    layer = _layer("ALIF", "cpu", 2)
    xb = x.clone().requires_grad_()
    outs = []
    for chunk in xb.split(4):
        outs.append(torch.utils.checkpoint.checkpoint(layer, chunk, use_reentrant=reentrant))
        if reentrant:  # (a reentrant checkpoint passes no gradient through the state)
            layer.s = layer.s.detach()  # type: ignore[union-attr]
            layer.cell.v = layer.cell.v.detach()  # type: ignore[union-attr]
            layer.cell.states = {k: v.detach() for k, v in layer.cell.states.items()}
    got = _grads(layer, torch.cat(outs), xb)
    assert torch.equal(got["s"], want["s"])
    if not reentrant:
        for key in ("x", "weight", "bias", "cell.tau"):
            torch.testing.assert_close(got[key], want[key], rtol=1e-12, atol=1e-12, msg=key)


def test_compiled_layer_with_a_delay_matches_eager() -> None:
    torch._dynamo.reset()
    x = _input(9)
    eager = _layer("LIF", "cpu", 3)
    xa = x.clone().requires_grad_()
    want = _grads(eager, eager(xa), xa)
    layer = _layer("LIF", "cpu", 3)
    xb = x.clone().requires_grad_()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    got = _grads(layer, compiled(xb), xb)
    assert torch.equal(got["s"], want["s"])
    for key in ("x", "weight", "bias", "cell.tau"):
        torch.testing.assert_close(got[key], want[key], rtol=1e-12, atol=1e-12, msg=key)


@pytest.mark.parametrize("delay", [0, -1, 1.5, True, "2"])
def test_a_bad_delay_is_refused(delay: object) -> None:
    with pytest.raises(ValueError, match="delay must be an int >= 1"):
        sn.RecurrentNeuronLayer(sn.models.LIF(), 4, delay=delay)  # type: ignore[arg-type]


def test_kept_spikes_of_another_shape_are_refused() -> None:
    layer = sn.RecurrentNeuronLayer(sn.models.LIF(), 4, delay=2)
    layer(torch.rand(3, 2, 4))
    with pytest.raises(ValueError, match=r"\[delay, \*batch, size\] = \[2, 5, 4\].*reset"):
        layer(torch.rand(3, 5, 4))


@pytest.mark.parametrize("first", [torch.float32, torch.float64])
@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_kept_spikes_follow_the_call_dtype(backend: str, first: torch.dtype) -> None:
    """A call in one dtype after a call in the other reads the kept spikes in its own
    dtype: the same spikes as a twin layer given the kept state already converted (the C
    kernel read float32 spikes as float64 before: spikes of other neurons, or a crash;
    the torch loop raised torch's dtype error)."""
    second = torch.float64 if first == torch.float32 else torch.float32
    x = 1.5 * torch.rand(6, 3, 64, generator=generator(24), dtype=torch.float64)

    def made() -> sn.RecurrentNeuronLayer:
        torch.manual_seed(23)
        layer = sn.RecurrentNeuronLayer(sn.models.ALIF(), 64, backend=backend, delay=2)
        with torch.no_grad():
            layer.weight.mul_(4.0)
        return layer.to(first)

    layer = made()
    layer(x.to(first))
    assert layer.s is not None and layer.s.dtype == first and layer.s.sum() > 0
    twin = made().to(second)
    twin.s = layer.s.to(second)
    twin.cell.v = layer.cell.v.to(second)  # type: ignore[union-attr]
    twin.cell.states = {k: v.to(second) for k, v in layer.cell.states.items()}
    got = layer.to(second)(x.to(second))
    want = twin(x.to(second))
    assert want.sum() > 0
    assert torch.equal(got, want)


@pytest.mark.cuda
@pytest.mark.parametrize("delay", [1, 2, 5])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_cuda_matches_the_oracle(name: str, delay: int) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    layer = _layer(name, "cuda", delay).cuda()
    x = _input().cuda().requires_grad_()
    got = _grads(layer, layer(x), x)
    ref = _layer(name, "torch", delay)
    xr = _input().requires_grad_()
    want = _grads(ref, ref(xr), xr)
    assert torch.equal(got["s"].cpu(), want["s"])
    for key in ("x", "weight", "bias", "cell.tau"):
        torch.testing.assert_close(got[key].cpu(), want[key], rtol=1e-12, atol=1e-12, msg=key)


@pytest.mark.cuda
@pytest.mark.parametrize("delay", [1, 3])
def test_cuda_wide_layer_float32_matches_the_loop(delay: int) -> None:
    """2048 neurons (4 lanes a thread, the backward's cached rows) in float32: spikes of
    the fused kernel equal the torch loop's on the GPU."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    torch.manual_seed(25)
    x = 1.1 * torch.rand(12, 4, 2048, generator=generator(26)).cuda()
    outs = []
    for backend in ("cuda", "torch"):
        torch.manual_seed(27)
        layer = sn.RecurrentNeuronLayer(sn.models.LIF(), 2048, backend=backend, delay=delay)
        layer = layer.cuda()
        outs.append(layer(x))
    assert outs[1].sum() > 0
    assert torch.equal(outs[0], outs[1])


def test_nir_export_refuses_a_delay_it_cannot_carry() -> None:
    pytest.importorskip("nir")
    layer = sn.RecurrentNeuronLayer(sn.models.LIF(), 4, delay=2)
    with pytest.raises(ValueError, match="delay=2 has no NIR form"):
        sn.nir.export(torch.nn.Sequential(layer), torch.rand(3, 1, 4), dt=1.0)


@pytest.mark.parametrize("delay", [1, 3])
def test_backends_agree_on_a_weight_no_step_read(delay: int) -> None:
    """With T <= delay after a reset, no step reads R: its gradient is None on every
    backend, as torch gives an unused parameter (the fused path gave zeros); one step
    more and every backend gives the same tensor."""
    grads = {}
    for backend in ("cpu", "torch"):
        for t_len in (delay, delay + 1):
            layer = _layer("LIF", backend, delay)
            x = _input(t_len).requires_grad_()
            layer(x).sum().backward()
            grads[backend, t_len] = layer.weight.grad
    assert grads["cpu", delay] is None and grads["torch", delay] is None
    torch.testing.assert_close(grads["cpu", delay + 1], grads["torch", delay + 1])


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_an_empty_call_stays_in_the_graph(backend: str) -> None:
    """T = 0: the empty output is attached to the input's graph, as simulate's and a
    NeuronLayer's are, and the state stays as it was."""
    layer = _layer("ALIF", backend, 2)
    layer(_input(3))
    kept = layer.s
    x = _input(0).requires_grad_()
    out = layer(x)
    assert out.shape == x.shape and out.requires_grad
    assert layer.s is kept


def test_a_nan_weight_of_a_silent_neuron_is_never_read_on_any_backend() -> None:
    """R·s sums the weights of the neurons that spiked: a NaN weight from a neuron that
    never fires leaves V finite on every backend (the torch loop's 0·NaN gave NaN)."""
    outs = {}
    for backend in ("cpu", "torch"):
        layer = _layer("LIF", backend, 2)
        x = _input(10)
        x[..., 0] = 0.0  # neuron 0 never fires
        with torch.no_grad():
            layer.weight[:, 0] = float("nan")
        outs[backend] = (layer(x), layer.cell.v)
    assert outs["torch"][0].sum() > 0
    assert torch.isfinite(outs["torch"][1]).all()
    assert torch.equal(outs["cpu"][0], outs["torch"][0])
    torch.testing.assert_close(outs["cpu"][1], outs["torch"][1], rtol=1e-12, atol=1e-12)
