"""The cpu backend (generated C) against the float64 torch reference.

Every zoo model x hard/soft reset x detach_reset x surrogate: identical spikes,
v_seq within 1e-10, every gradient (x_seq, v_init, learnable params) within
1e-9 relative in float64, and within 1e-4 in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sympy as sp
import torch
from conftest import (
    BASIC_SURROGATES,
    SURROGATES,
    assert_fires_sometimes,
    assert_matches,
    compare,
    rel_err,
    seed_of,
)

import symneuron as sn

F64 = {"v_atol": 1e-10, "grad_rtol": 1e-9}
F32 = {"v_atol": 1e-4, "grad_rtol": 1e-4}

MODELS: dict[str, Callable[..., sn.Neuron]] = {
    "IF": sn.models.IF,
    "LIF": sn.models.LIF,
    "LIF-no-decay-input": lambda **kw: sn.models.LIF(decay_input=False, **kw),
    "PLIF": sn.models.PLIF,
    "QIF": sn.models.QIF,
    "EIF": sn.models.EIF,
    "ThresholdLIF": sn.models.ThresholdLIF,
}
assert set(sn.models.DISCRETE) <= {name.split("-")[0] for name in MODELS}, "a zoo model is untested"

RESETS = {"hard": {}, "soft": {"v_reset": None}}


def build(
    model: str, reset: str, detach: bool, surrogate: Callable[[], sn.surrogate.Surrogate], **kw: Any
) -> sn.Neuron:
    return MODELS[model](**RESETS[reset], detach_reset=detach, surrogate=surrogate(), **kw)


@pytest.mark.parametrize("surrogate", BASIC_SURROGATES)
@pytest.mark.parametrize("detach", [False, True], ids=["attached", "detached"])
@pytest.mark.parametrize("reset", list(RESETS))
@pytest.mark.parametrize("model", list(MODELS))
def test_float64_matches_reference(model: str, reset: str, detach: bool, surrogate: str) -> None:
    neuron = build(model, reset, detach, SURROGATES[surrogate])
    c = compare(neuron, "cpu", torch.float64, seed=seed_of(model, reset, detach, surrogate))
    assert_matches(c, **F64)


@pytest.mark.parametrize("reset", list(RESETS))
@pytest.mark.parametrize("model", ["LIF", "QIF", "EIF"])
def test_erf_surrogate_matches_reference(model: str, reset: str) -> None:
    neuron = build(model, reset, False, sn.surrogate.Erf)
    c = compare(neuron, "cpu", torch.float64, seed=seed_of("erf", model, reset))
    assert_matches(c, **F64)


@pytest.mark.parametrize("detach", [False, True], ids=["attached", "detached"])
@pytest.mark.parametrize("reset", list(RESETS))
@pytest.mark.parametrize("model", ["LIF", "LIF-no-decay-input"])
def test_lif_learnable_tau(model: str, reset: str, detach: bool) -> None:
    neuron = build(model, reset, detach, sn.surrogate.ATan, learnable=["tau"])
    c = compare(neuron, "cpu", torch.float64, seed=seed_of("tau", model, reset, detach))
    assert "tau" in c.ref.grads
    assert_matches(c, **F64)


@pytest.mark.parametrize("detach", [False, True], ids=["attached", "detached"])
@pytest.mark.parametrize("reset", list(RESETS))
@pytest.mark.parametrize("model", list(MODELS))
def test_float32_matches_float64_reference(model: str, reset: str, detach: bool) -> None:
    neuron = build(model, reset, detach, sn.surrogate.Sigmoid)
    c = compare(neuron, "cpu", torch.float32, seed=seed_of("f32", model, reset, detach))
    assert c.got.spikes.dtype == torch.float32
    assert c.got.v_seq.dtype == torch.float32
    assert all(g.dtype == torch.float32 for g in c.got.grads.values())
    assert_matches(c, **F32)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("reset", list(RESETS))
@pytest.mark.parametrize("model", ["LIF", "PLIF", "EIF"])
def test_store_v_seq_false(model: str, reset: str, dtype: torch.dtype) -> None:
    neuron = build(model, reset, False, sn.surrogate.ATan)
    seed = seed_of("last", model, reset, dtype)
    full = compare(neuron, "cpu", dtype, seed=seed)
    last = compare(neuron, "cpu", dtype, seed=seed, store_v_seq=False)
    assert last.got.v_seq.shape == (1, *full.got.v_seq.shape[1:])
    assert torch.equal(last.got.v_seq, full.got.v_seq[-1:])
    assert torch.equal(last.got.spikes, full.got.spikes)
    assert_matches(last, **(F64 if dtype == torch.float64 else F32))
    # The loss on v_last differs from the loss on all of v_seq, so must its gradient.
    assert rel_err(last.ref.grads["x_seq"], full.ref.grads["x_seq"]) > 1e-3


@pytest.mark.parametrize("store_v_seq", [True, False], ids=["seq", "last"])
@pytest.mark.parametrize("loss", ["spike", "v", "sum"])
@pytest.mark.parametrize("reset", list(RESETS))
@pytest.mark.parametrize("model", ["IF", "PLIF", "QIF"])
def test_loss_on_one_output(model: str, reset: str, loss: str, store_v_seq: bool) -> None:
    neuron = build(model, reset, False, sn.surrogate.Sigmoid)
    c = compare(
        neuron,
        "cpu",
        torch.float64,
        seed=seed_of("one", model, reset, loss),
        loss=loss,
        store_v_seq=store_v_seq,
    )
    assert_matches(c, **F64)


def test_backend_torch_is_the_reference() -> None:
    neuron = sn.models.PLIF(v_reset=None)
    c = compare(neuron, "torch", torch.float64, seed=seed_of("torch"))
    assert_matches(c, v_atol=0.0, grad_rtol=0.0)


def test_auto_backend_on_cpu_is_cpu_kernel() -> None:
    neuron = sn.models.QIF()
    c = compare(neuron, "auto", torch.float64, seed=seed_of("auto"))
    assert_matches(c, **F64)


def test_no_grad_forward_matches_reference() -> None:
    neuron = sn.models.EIF(v_reset=None)
    gen = torch.Generator().manual_seed(7)
    x_seq = 0.9 + torch.randn(9, 3, 5, dtype=torch.float64, generator=gen)
    v_init = torch.full((3, 5), 0.2, dtype=torch.float64)
    with torch.no_grad():
        spikes, v_seq = sn.simulate(neuron, x_seq, v_init, backend="cpu")
    ref_spikes, ref_v = sn.simulate(neuron, x_seq, v_init, backend="torch")
    assert_fires_sometimes(ref_spikes)
    assert torch.equal(spikes, ref_spikes)
    assert float((v_seq - ref_v).abs().max()) <= 1e-10


def test_charge_with_numeric_constants() -> None:
    """Numeric sub-expressions (√2, e², π²) in a charge must work in every backend."""
    neuron = sn.Neuron(
        sn.V + (sn.X * sp.sqrt(2) - sn.V) * sp.exp(-1) + sp.pi**2 / 100, name="ConstLIF"
    )
    c = compare(neuron, "cpu", torch.float64, seed=seed_of("constants"))
    assert_matches(c, **F64)
