"""The C kernels' wide variant (64 neurons per loop iteration, the tail one at a time)
computes the same bits as one neuron per iteration, outputs and gradients, for any N.

The one-lane kernels are the ones every other CPU test has checked against the float64
reference; the wide ones run the same printed arithmetic on more neurons at once (the
compiler vectorises the lane loops, IEEE operations without contraction), so any
difference is a bug in the lane or tail scaffolding (an index, a stride, a tail
neuron skipped or written twice).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from conftest import run_with_grads

import symneuron as sn
from symneuron import dtypes
from symneuron.runtime import settings

#: (model, its params with a learnable one as a per-neuron tensor): one state and none,
#: two and three states, a crossing neuron, a refractory counter
QUICK = ["LIF", "PLIF", "Izhikevich", "ALIF", "ThetaNeuron", "RefractoryLIF"]
#: neuron counts: fewer than the lanes, exactly them, two wide blocks and a tail of 3
SIZES = (5, 64, 131)


@contextmanager
def lanes(cap: int | None) -> Iterator[None]:
    old = settings.max_lanes
    settings.max_lanes = cap
    try:
        yield
    finally:
        settings.max_lanes = old


def _inputs(
    neuron: sn.Neuron, n: int, dtype: torch.dtype
) -> tuple[torch.Tensor, dict, dict, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(n)
    x = (torch.rand(7, n, generator=gen, dtype=torch.float64) * 3.0).to(dtype)
    params = {
        name: torch.full((n,), float(neuron.params[name]), dtype=dtype)
        * (1 + 0.1 * torch.rand(n, generator=gen, dtype=dtype))
        for name in neuron.learnable
    }
    states = {name: torch.zeros(n, dtype=dtype) for name in neuron.states}
    weights = [torch.randn(7, n, generator=gen, dtype=dtype) for _ in range(2 + len(states))]
    return x, params, states, weights


def _assert_same_bits(model: str, n: int, dtype: torch.dtype, surrogate: str) -> None:
    kw = {} if surrogate == "default" else {"surrogate": getattr(sn.surrogate, surrogate)()}
    neuron = getattr(sn.models, model)(**kw)
    x, params, states, weights = _inputs(neuron, n, dtype)
    v0 = torch.zeros(n, dtype=dtype)
    runs = []
    for cap in (1, None):
        with lanes(cap):
            runs.append(
                run_with_grads(neuron, x, v0, params, weights, backend="cpu", states=states or None)
            )
    one, wide = runs
    assert torch.equal(one.spikes, wide.spikes), (model, n)
    assert torch.equal(one.v_seq, wide.v_seq), (model, n)
    for name in one.states:
        assert torch.equal(one.states[name], wide.states[name]), (model, n, name)
    for name, grad in one.grads.items():
        assert torch.equal(grad, wide.grads[name]), (model, n, name)


#: the default surrogate (a tanh: its backward calls the math library, so its wide
#: backward runs one lane) and ATan (rational: 64 lanes in the backward too)
SURROGATES = ("default", "ATan")


@pytest.mark.parametrize("surrogate", SURROGATES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("model", QUICK)
def test_wide_c_kernels_give_the_same_bits(model: str, dtype: torch.dtype, surrogate: str) -> None:
    for n in SIZES:
        _assert_same_bits(model, n, dtype, surrogate)


@pytest.mark.slow  # every zoo model's C kernels compiled twice (one lane and 64)
@pytest.mark.parametrize("model", sorted(set(sn.models.ZOO) - set(QUICK)))
def test_every_zoo_model_wide_gives_the_same_bits(model: str) -> None:
    for surrogate in SURROGATES:
        _assert_same_bits(model, 131, torch.float32, surrogate)


def test_a_backward_calling_the_math_library_keeps_one_lane() -> None:
    """The wide backward of a sigmoid surrogate (tanhf) runs one lane: scalar calls do
    not vectorise; ATan's (rational) runs 64."""
    from symneuron import derivation
    from symneuron.codegen.dialects import C
    from symneuron.codegen.skeleton import render
    from symneuron.signature import BACKWARD, FORWARD

    row = dtypes.DTYPES["cpu"]["float32"]
    for surrogate, wide in (("default", False), ("ATan", True)):
        kw = {} if surrogate == "default" else {"surrogate": sn.surrogate.ATan()}
        spec = derivation.derive(sn.models.LIF(**kw))
        source = render(spec, C, row, only=BACKWARD.variant(64, grad_v_mode="none"))
        assert ("#define K 64" in source) is wide, surrogate
        forward = render(spec, C, row, only=FORWARD.variant(64, store_h=True, v_mode="last"))
        assert "#define K 64" in forward


def test_the_wide_variant_is_what_runs() -> None:
    """A CPU launch takes the dtype's lanes for any N (the tail inside the kernel)."""
    neuron = sn.models.LIF()
    prog = sn.runtime.kernels.program(neuron, "cpu")
    sn.simulate(neuron, torch.rand(3, 131), backend="cpu")
    lanes_used = {key[4] for key in prog._launchers if key[0] == torch.float32}
    assert dtypes.lookup("cpu", torch.float32).lanes == 64
    assert 64 in lanes_used
