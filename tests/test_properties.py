"""Hypothesis: random model, reset, threshold, surrogate, params, T, shape and v_init;
the cpu backend in float64 against the float64 reference."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import (
    DEFAULT_INPUT_SCALE,
    INPUT_SCALE,
    SURROGATES,
    generator,
    rel_err,
    run_with_grads,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import symneuron as sn

# model -> (learnable candidates, ranges of their values)
LEARNABLE = {
    "IF": {},
    "LIF": {"tau": (1.5, 4.0)},
    "PLIF": {"w": (-1.0, 1.0)},
    "QIF": {"tau": (1.5, 4.0), "a0": (0.5, 1.5), "v_c": (0.5, 1.0)},
    "EIF": {"tau": (1.5, 4.0), "delta_T": (0.7, 1.3), "theta_rh": (0.6, 1.0)},
    "ThresholdLIF": {"tau": (1.5, 4.0), "theta": (0.7, 1.3)},
}


@st.composite
def cases(draw: st.DrawFn) -> dict:
    model = draw(st.sampled_from(sorted(sn.models.DISCRETE)))
    candidates = sorted(LEARNABLE[model])
    learnable = draw(st.lists(st.sampled_from(candidates), unique=True)) if candidates else []
    if model == "PLIF":
        learnable = learnable or ["w"]
    soft = draw(st.booleans())
    kw = {
        "v_threshold": draw(st.floats(0.7, 1.3)),
        "v_reset": None if soft else draw(st.floats(-0.3, 0.2)),
        "detach_reset": draw(st.booleans()),
        "surrogate": SURROGATES[draw(st.sampled_from(sorted(SURROGATES)))](
            draw(st.floats(0.5, 4.0))
        ),
        "learnable": learnable,
    }
    if model == "LIF":
        kw["decay_input"] = draw(st.booleans())
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    per_neuron = draw(st.booleans())
    params = {}
    for name in learnable:
        low, high = LEARNABLE[model][name]
        params[name] = (low, high, shape[-1:] if per_neuron else ())
    return {
        "model": model,
        "kw": kw,
        "T": draw(st.integers(1, 10)),
        "shape": shape,
        "params": params,
        "v_init": draw(st.sampled_from(["none", "float", "row", "full"])),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def make_inputs(case: dict) -> tuple:
    gen = generator(case["seed"])
    shape, T = case["shape"], case["T"]
    offset, scale = INPUT_SCALE.get(case["model"], DEFAULT_INPUT_SCALE)
    x_seq = offset * case["kw"]["v_threshold"] + scale * torch.randn(
        T, *shape, generator=gen, dtype=torch.float64
    )
    v_kind = case["v_init"]
    v_init: None | float | torch.Tensor = {
        "none": None,
        "float": 0.4 * float(torch.rand((), generator=gen, dtype=torch.float64)) - 0.1,
        "row": 0.6 * torch.rand(shape[-1:], generator=gen, dtype=torch.float64) - 0.2,
        "full": 0.6 * torch.rand(shape, generator=gen, dtype=torch.float64) - 0.2,
    }[v_kind]
    params = {
        name: low + (high - low) * torch.rand(pshape, generator=gen, dtype=torch.float64)
        for name, (low, high, pshape) in case["params"].items()
    }
    weights = [torch.randn(T, *shape, generator=gen, dtype=torch.float64) for _ in range(2)]
    return x_seq, v_init, params, weights


@pytest.mark.parametrize("store_v_seq", [True, False], ids=["seq", "last"])
@settings(
    max_examples=15,
    deadline=None,
    derandomize=True,  # the same cases on every run
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(case=cases())
def test_cpu_matches_reference(case: dict, store_v_seq: bool) -> None:
    neuron = sn.models.DISCRETE[case["model"]](**case["kw"])
    x_seq, v_init, params, weights = make_inputs(case)
    options = {"store_v_seq": store_v_seq}
    got = run_with_grads(neuron, x_seq, v_init, params, weights, backend="cpu", **options)
    ref = run_with_grads(neuron, x_seq, v_init, params, weights, **options)
    assume(bool(torch.isfinite(ref.v_seq).all()))  # a runaway EIF/QIF trajectory is no test
    assert torch.equal(got.spikes, ref.spikes)
    v_scale = max(1.0, float(ref.v_seq.abs().max()))
    assert float((got.v_seq - ref.v_seq).abs().max()) <= 1e-10 * v_scale
    assert got.grads.keys() == ref.grads.keys()
    for name, r in ref.grads.items():
        g = got.grads[name]
        assert g.shape == r.shape
        assert rel_err(g, r) <= 1e-9 or float((g - r).abs().max()) <= 1e-12


def test_property_inputs_are_not_vacuous() -> None:
    """The strategy above produces spike trains with both 0s and 1s in most draws
    (derandomized, so this count does not change from run to run)."""
    rates = []

    @settings(max_examples=30, deadline=None, database=None, derandomize=True)
    @given(case=cases())
    def collect(case: dict) -> None:
        neuron = sn.models.DISCRETE[case["model"]](**case["kw"])
        x_seq, v_init, params, _ = make_inputs(case)
        spikes, _ = sn.simulate(neuron, x_seq, v_init, params, backend="cpu")
        rates.append(float(spikes.mean()))

    collect()
    mixed = sum(0.0 < r < 1.0 for r in rates)
    assert mixed >= math.ceil(0.5 * len(rates)), rates
