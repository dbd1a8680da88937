"""Behaviour of the host-time fast paths (their speed is measured by a benchmark, not here).

* The eager binding takes the params as given and records no autograd node per param:
  each param's gradient reaches it through autograd's own reduction to the param's
  shape and dtype; checked against the float64 torch reference for every param shape.
* ``NeuronLayer.param_values`` returns the registered tensors themselves (also after one
  is replaced), and the layer's memory stays plain attributes.
* A dict of param names and one of symbols give the same run; unknown names still fail.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import symneuron as sn
from symneuron.binding import EagerBinding, program
from tests.conftest import assert_fires_sometimes, generator, rel_err, seed_of

SHAPE = (3, 4)


def _grads(backend: str, w: torch.Tensor, x: torch.Tensor, r: torch.Tensor) -> tuple:
    w = w.detach().clone().requires_grad_()
    x = x.detach().clone().requires_grad_()
    spikes, v = sn.simulate(sn.models.PLIF(v_reset=None), x, params={"w": w}, backend=backend)
    ((spikes + v) * r).sum().backward()
    return spikes.detach(), w.grad, x.grad


@pytest.mark.parametrize(
    "w_shape", [(), (1,), (1, 1), (3, 1), (4,), SHAPE], ids=lambda s: str(list(s))
)
@pytest.mark.parametrize("w_dtype", [torch.float32, torch.float64])
def test_param_gradients_of_every_shape_match_reference(w_shape, w_dtype) -> None:
    gen = generator(seed_of("host-param-shapes", w_shape))
    x = torch.randn(6, *SHAPE, generator=gen, dtype=torch.float64) * 1.5
    r = torch.randn(6, *SHAPE, generator=gen, dtype=torch.float64)
    w = torch.randn(w_shape, generator=gen, dtype=torch.float64).to(w_dtype)
    spikes, w_grad, x_grad = _grads("cpu", w, x, r)
    want_spikes, want_w, want_x = _grads("torch", w.double(), x, r)
    assert_fires_sometimes(spikes)
    assert torch.equal(spikes, want_spikes)
    assert w_grad.shape == w.shape and w_grad.dtype == w_dtype
    assert float(want_w.abs().max()) > 0
    assert rel_err(w_grad.double(), want_w) <= (1e-5 if w_dtype == torch.float32 else 1e-9)
    assert rel_err(x_grad, want_x) <= 1e-9


def test_no_autograd_node_per_param() -> None:
    w = torch.zeros(12, requires_grad=True)
    x = torch.rand(2, 12, requires_grad=True)  # [T, N]: no view of the outputs either
    spikes, _ = sn.simulate(sn.models.PLIF(), x, params={"w": w}, backend="cpu")
    node = spikes.grad_fn
    assert type(node).__name__ == "EagerBindingBackward"
    nexts = [fn for fn, _ in node.next_functions if fn is not None]
    # straight to the leaves' AccumulateGrad
    assert {id(fn.variable) for fn in nexts} == {id(x), id(w)}


def test_float_param_of_learnable_gets_no_gradient() -> None:
    x = torch.rand(3, 5, requires_grad=True)
    spikes, v = sn.simulate(sn.models.PLIF(), x, params={"w": 0.3}, backend="cpu")
    (spikes + v).sum().backward()
    assert x.grad is not None and float(x.grad.abs().max()) > 0


def test_layer_param_values_are_the_registered_tensors() -> None:
    layer = sn.NeuronLayer(sn.models.PLIF(), backend="cpu")
    assert layer.param_values()["w"] is layer.w
    layer.w = nn.Parameter(torch.full((5,), 0.5))
    assert layer.param_values()["w"] is layer.w
    lif = sn.NeuronLayer(sn.models.LIF(), backend="cpu")
    assert lif.param_values()["tau"] is lif.tau  # a buffer


def test_layer_memory_stays_plain_attributes() -> None:
    layer = sn.NeuronLayer(sn.models.Izhikevich(a=0.1, b=0.2), backend="cpu")
    keys = set(layer.state_dict())
    layer(torch.rand(3, 2, 5))
    assert layer.v is not None and layer.v.shape == (2, 5)
    assert set(layer.states) == {"W"} and layer.states["W"].shape == (2, 5)
    assert set(layer.state_dict()) == keys
    assert "v" not in layer._buffers and "v" not in layer._parameters
    layer.reset()
    assert layer.v is None and layer.v_seq is None and layer.states == {}


def test_names_and_symbols_give_the_same_run() -> None:
    neuron = sn.models.ThresholdLIF(learnable=["tau", "theta"])
    gen = generator(seed_of("host-names"))
    x = torch.randn(4, 6, generator=gen) * 2
    by_name = sn.simulate(neuron, x, params={"tau": 3.0, "theta": 0.7}, backend="cpu")
    symbols = {str(s): s for s in neuron.charge.free_symbols} | {"theta": neuron.v_threshold}
    by_symbol = sn.simulate(
        neuron, x, params={symbols["tau"]: 3.0, symbols["theta"]: 0.7}, backend="cpu"
    )
    assert_fires_sometimes(by_name[0])
    for a, b in zip(by_name, by_symbol, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="Unknown parameter 'tauu'"):
        sn.simulate(neuron, x, params={"tauu": 3.0}, backend="cpu")


def test_wrong_number_of_kernel_params_is_an_error() -> None:
    neuron = sn.models.PLIF()
    x = torch.rand(2, 4, requires_grad=True)
    with pytest.raises(ValueError, match="takes 1 params, got 0"):
        EagerBinding.apply(program(neuron, "cpu"), x, None, None, "last", (4,), None)
