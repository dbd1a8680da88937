"""Parameters as tensors: per channel and per neuron, learnable and not, vs the reference."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    assert_fires_sometimes,
    assert_matches,
    compare,
    generator,
    rel_err,
    run_with_grads,
    seed_of,
)

import symneuron as sn

F64 = {"v_atol": 1e-10, "grad_rtol": 1e-9}

# (neuron shape, param shape): scalar tensor, one element, per channel, per neuron.
LAYOUTS = {
    "0d": ((3, 5), ()),
    "1elem": ((3, 5), (1,)),
    "channel-C1": ((3, 5), (3, 1)),
    "channel-C11": ((3, 2, 4), (3, 1, 1)),
    "channel-mid": ((2, 3, 4), (3, 1)),
    "neuron": ((3, 5), (3, 5)),
    "neuron-trailing": ((2, 3, 4), (3, 4)),
}


def draw(shape: tuple[int, ...], center: float, spread: float, seed: int) -> torch.Tensor:
    """``center`` + ``spread`` * uniform(−1, 1), float64."""
    gen = generator(seed)
    return center + spread * (2 * torch.rand(shape, generator=gen, dtype=torch.float64) - 1)


CASES = {
    # model, param name, learnable, (center, spread)
    "PLIF-w": (lambda: sn.models.PLIF(), "w", True, (0.0, 1.0)),
    "LIF-tau-learnable": (lambda: sn.models.LIF(learnable=["tau"]), "tau", True, (2.0, 0.8)),
    "LIF-soft-tau-learnable": (
        lambda: sn.models.LIF(v_reset=None, learnable=["tau"]),
        "tau",
        True,
        (2.0, 0.8),
    ),
    "QIF-v_c": (lambda: sn.models.QIF(), "v_c", False, (0.8, 0.4)),
    "EIF-theta_rh": (lambda: sn.models.EIF(v_reset=None), "theta_rh", False, (0.8, 0.3)),
    "LIF-tau-fixed": (lambda: sn.models.LIF(), "tau", False, (2.0, 0.8)),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("case", list(CASES))
def test_tensor_param_matches_reference(case: str, layout: str) -> None:
    make, name, learnable, (center, spread) = CASES[case]
    neuron = make()
    assert (name in neuron.learnable) == learnable
    shape, param_shape = LAYOUTS[layout]
    seed = seed_of(case, layout)
    value = draw(param_shape, center, spread, seed)
    c = compare(neuron, "cpu", torch.float64, shape=shape, seed=seed, params={name: value})
    assert_matches(c, **F64)
    if learnable:
        assert c.got.grads[name].shape == value.shape
    else:
        assert name not in c.got.grads
    # The tensor really enters the computation: the default scalar gives another trajectory.
    default = compare(neuron, "cpu", torch.float64, shape=shape, seed=seed)
    assert rel_err(c.ref.v_seq, default.ref.v_seq) > 1e-6


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_learnable_and_fixed_tensors_together(dtype: torch.dtype) -> None:
    neuron = sn.models.QIF(learnable=["tau", "a0"], v_reset=None)
    seed = seed_of("mixed", dtype)
    params = {
        "tau": draw((3, 1), 2.0, 0.5, seed),
        "a0": draw((3, 5), 1.0, 0.3, seed + 1),
        "v_c": draw((5,), 0.8, 0.3, seed + 2),
        "v_rest": 0.05,
    }
    c = compare(neuron, "cpu", dtype, shape=(3, 5), seed=seed, params=params)
    assert c.got.grads["tau"].shape == (3, 1)
    assert c.got.grads["a0"].shape == (3, 5)
    assert_matches(c, **(F64 if dtype == torch.float64 else {"v_atol": 1e-4, "grad_rtol": 1e-4}))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_layer_with_per_channel_w(dtype: torch.dtype) -> None:
    C, F, T = 3, 6, 8
    seed = seed_of("layer", dtype)
    w0 = torch.randn(C, 1, generator=generator(seed), dtype=torch.float64)
    layer = sn.NeuronLayer(sn.models.PLIF(), params={"w": w0}, backend="cpu").to(dtype)
    assert isinstance(layer.w, torch.nn.Parameter)
    assert layer.w.shape == (C, 1)
    assert layer.w.dtype == dtype
    gen = generator(seed + 1)
    x_seq = (1.0 + torch.randn(T, C, F, generator=gen, dtype=torch.float64)).to(dtype)
    r = torch.randn(T, C, F, generator=gen, dtype=torch.float64)
    (layer(x_seq) * r.to(dtype)).sum().backward()
    assert layer.w.grad is not None and layer.w.grad.shape == (C, 1)

    # the reference from v_init=None starts, like the layer, at v_reset = 0
    ref = run_with_grads(layer.neuron, x_seq.double(), None, {"w": layer.w.double()}, [r])
    assert_fires_sometimes(ref.spikes)
    grad_w = ref.grads["w"]
    assert float(grad_w.abs().max()) > 0
    tol = 1e-9 if dtype == torch.float64 else 1e-4
    assert rel_err(layer.w.grad, grad_w) <= tol


def test_layer_fixed_tensor_param_is_a_buffer() -> None:
    v_c = torch.full((3, 1), 0.7) + 0.1 * torch.randn(3, 1, generator=generator(seed_of("v_c")))
    layer = sn.NeuronLayer(sn.models.QIF(), params={"v_c": v_c})
    buffers = dict(layer.named_buffers())
    assert buffers["v_c"].shape == (3, 1)
    assert torch.equal(buffers["v_c"], v_c)
    assert "v_c" not in dict(layer.named_parameters())
