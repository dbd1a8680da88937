"""torch.utils.checkpoint of a RecurrentNeuronLayer: the recomputation starts from the
state the first run started from (the last spikes, V, the extra states and, for a noisy
neuron, the generator state), so it redraws the first run's noise.

Oracle: the same layer, built alike and called alike without checkpointing (float64):
spikes identical, every gradient (input, recurrent weight, bias, the learnable neuron
parameter) within 1e-12, and the state each call leaves identical.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest
import torch
from conftest import generator
from torch.utils.checkpoint import checkpoint

import symneuron as sn
from symneuron.runtime import cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")

#: name -> (the neuron with a learnable parameter, an input scale at which it fires)
MODELS: dict[str, tuple[Callable[[], sn.Neuron], float]] = {
    "LIF": (lambda: sn.models.LIF(learnable=["tau"]), 2.0),
    "ALIF": (lambda: sn.models.ALIF(learnable=["beta"]), 2.0),
    "NoisyLIF": (lambda: sn.models.NoisyLIF(dt=1.0, learnable=["sigma"]), 30.0),
}
SIZE, SPLIT, STEPS = 8, 7, 16  # neurons; the first call's steps; all steps
Call = Callable[[sn.RecurrentNeuronLayer, torch.Tensor], torch.Tensor]


def _plain(layer: sn.RecurrentNeuronLayer, x: torch.Tensor) -> torch.Tensor:
    return layer(x)


def _checkpointed(reentrant: bool) -> Call:
    def call(layer: sn.RecurrentNeuronLayer, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(layer, x, use_reentrant=reentrant)

    return call


def _layer(name: str, backend: str, device: str = "cpu") -> sn.RecurrentNeuronLayer:
    make, scale = MODELS[name]
    layer = sn.RecurrentNeuronLayer(make(), SIZE, bias=True, backend=backend, seed=5)
    layer = layer.to(device=device, dtype=torch.float64)
    with torch.no_grad():
        weight = 2 * torch.rand(SIZE, SIZE, generator=generator(4), dtype=torch.float64) - 1
        layer.weight.copy_(scale * weight / SIZE**0.5)
        bias = cast(torch.Tensor, layer.bias)
        bias.copy_(torch.linspace(-0.1, 0.1, SIZE, dtype=torch.float64))
    return layer


def _state(layer: sn.RecurrentNeuronLayer) -> list[torch.Tensor]:
    """What a call leaves: last spikes, V, the extra states, the generator state."""
    cell = layer.cell
    kept = [layer.s, cell.v, *cell.states.values()]
    if cell.neuron.draws:
        kept.append(cell.rng_state)
    return [t.detach().clone() for t in kept]  # type: ignore[union-attr]


def _train(
    name: str, backend: str, call: Call, reentrant: bool, device: str = "cpu"
) -> dict[str, list]:
    """Two calls of ``call`` (the first from no stored state, the second from the state
    the first left) and one backward over both; with ``reentrant`` the state is detached
    between them (its checkpoint passes gradients to its inputs only), else the loss also
    reads V after each call."""
    layer = _layer(name, backend, device)
    x = MODELS[name][1] * torch.rand(STEPS, 2, SIZE, generator=generator(3), dtype=torch.float64)
    x = x.to(device).requires_grad_()
    readout = torch.linspace(-1, 1, SIZE, dtype=torch.float64, device=device)
    spikes, states, loss = [], [], torch.zeros((), dtype=torch.float64)
    for chunk in (x[:SPLIT], x[SPLIT:]):
        s = call(layer, chunk)
        loss = loss + (s * readout).sum()
        if not reentrant:
            loss = loss + layer.cell.v.pow(2).sum()  # type: ignore[union-attr]
        spikes.append(s.detach())
        states.append(_state(layer))
        if reentrant:
            layer.s = layer.s.detach()  # type: ignore[union-attr]
            layer.cell.v = layer.cell.v.detach()  # type: ignore[union-attr]
            layer.cell.states = {k: v.detach() for k, v in layer.cell.states.items()}
    loss.backward()
    grads = [x.grad, *(p.grad for p in layer.parameters())]
    assert all(g is not None for g in grads) and len(grads) == 4  # x, weight, bias, param
    return {"spikes": spikes, "states": states, "grads": grads}


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize(
    ("backend", "device"),
    [("cpu", "cpu"), ("torch", "cpu"), pytest.param("cuda", "cuda", marks=pytest.mark.cuda)],
    ids=["fused", "loop", "fused-cuda"],
)
@pytest.mark.parametrize("name", list(MODELS))
def test_checkpointed_layer_gives_the_plain_layers_spikes_gradients_and_state(
    name: str, backend: str, device: str, reentrant: bool
) -> None:
    want = _train(name, backend, _plain, reentrant, device)
    assert 0 < float(torch.cat(want["spikes"]).mean()) < 0.5, "the oracle's layer must spike"
    got = _train(name, backend, _checkpointed(reentrant), reentrant, device)
    for a, b in zip(got["spikes"], want["spikes"], strict=True):
        assert torch.equal(a, b)
    for kept, wanted in zip(got["states"], want["states"], strict=True):
        assert len(kept) == len(wanted) and all(map(torch.equal, kept, wanted))
    for a, b in zip(got["grads"], want["grads"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["cpu", "torch"], ids=["fused", "loop"])
def test_recomputation_uses_its_records_and_leaves_the_memory(backend: str) -> None:
    layer = _layer("NoisyLIF", backend)
    x = 30 * torch.rand(5, 2, SIZE, generator=generator(1), dtype=torch.float64)
    s = checkpoint(layer, x.requires_grad_(), use_reentrant=False)
    kept = _state(layer)
    assert kept[-1].tolist() == [5, 5]
    s.sum().backward()
    assert all(map(torch.equal, _state(layer), kept))
    assert layer._replays == [] and layer.cell._replays == []


@pytest.mark.parametrize("backend", ["cpu", "torch"], ids=["fused", "loop"])
def test_reentrant_checkpoint_refuses_a_state_without_its_gradient_and_names_the_fix(
    backend: str,
) -> None:
    """use_reentrant=True: a state that carries a gradient is refused (its checkpoint
    would drop it), and so is the state such a call leaves, in the next call that takes
    gradients; the fix names the recurrent layer's state (layer.s, layer.cell.v)."""
    layer = _layer("LIF", backend)
    x = 2 * torch.rand(5, 2, SIZE, generator=generator(1), dtype=torch.float64)
    layer(x.requires_grad_())  # the state now carries a gradient
    with pytest.raises(RuntimeError, match=r"layer\.s = layer\.s\.detach\(\)"):
        checkpoint(layer, x, use_reentrant=True)
    layer.reset()
    checkpoint(layer, x, use_reentrant=True)
    with pytest.raises(RuntimeError, match=r"carries no gradient.*layer\.cell\.v = layer\.cell"):
        layer(x)
    layer.s = layer.s.detach()  # type: ignore[union-attr]
    layer.cell.v = layer.cell.v.detach()  # type: ignore[union-attr]
    assert torch.equal(layer(x), _layer("LIF", backend)(torch.cat([x, x]))[5:])
