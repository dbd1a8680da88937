"""Thresholds and reset levels given as expressions in the params (learnable ones included).

The oracle is the float64 torch reference; every gradient includes the threshold's and
reset's parameters.
"""

from __future__ import annotations

import pytest
import sympy as sp
import torch
from conftest import Run, generator, run_with_grads, seed_of

import symneuron as sn

V_R, TAU, THETA = sp.symbols("v_r tau theta")


def _learnable_reset() -> sn.Neuron:
    return sn.Neuron(
        sn.V + (sn.X - (sn.V - V_R)) / TAU,
        params={TAU: 2.0, V_R: -0.2},
        learnable=[V_R, TAU],
        v_reset=V_R,
        name="LearnableReset",
    )


def _run_both(
    neuron: sn.Neuron,
    x: torch.Tensor,
    params: dict[str, torch.Tensor],
    v_init: torch.Tensor | None,
    weights: list[torch.Tensor],
) -> tuple[Run, Run]:
    """The cpu backend and the float64 reference, from v_init or (None) the reset level."""
    ref = run_with_grads(neuron, x, v_init, params, weights)
    got = run_with_grads(neuron, x, v_init, params, weights, backend="cpu")
    assert got.grads.keys() == ref.grads.keys()
    return got, ref


@pytest.mark.parametrize("reset", [0.0, None], ids=["hard", "soft"])
@pytest.mark.parametrize("detach", [False, True])
def test_threshold_lif_matches_reference(reset: float | None, detach: bool) -> None:
    neuron = sn.models.ThresholdLIF(v_reset=reset, detach_reset=detach)
    gen = generator(seed_of("threshold", reset, detach))
    x = 2.4 * torch.rand(10, 3, 7, generator=gen, dtype=torch.float64)
    theta = 0.9 + 0.2 * torch.rand(3, 1, generator=gen, dtype=torch.float64)  # per channel
    weights = [torch.randn(10, 3, 7, generator=gen, dtype=torch.float64) for _ in range(2)]
    got, ref = _run_both(neuron, x, {"theta": theta}, None, weights)
    assert 0.05 < ref.spikes.mean() < 0.95
    assert torch.equal(got.spikes, ref.spikes)
    torch.testing.assert_close(got.v_seq, ref.v_seq, rtol=0, atol=1e-10)
    for name, r in ref.grads.items():
        assert got.grads[name].shape == r.shape
        torch.testing.assert_close(got.grads[name], r, rtol=1e-9, atol=1e-12)
    assert ref.grads["theta"].abs().sum() > 0  # theta really gets a gradient


@pytest.mark.parametrize("given_v_init", [False, True])
def test_learnable_reset_level_matches_reference(given_v_init: bool) -> None:
    neuron = _learnable_reset()
    gen = generator(seed_of("reset-level", given_v_init))
    x = 2.4 * torch.rand(9, 11, generator=gen, dtype=torch.float64)
    v_init = 0.3 * torch.rand(11, generator=gen, dtype=torch.float64) if given_v_init else None
    params = {"v_r": torch.tensor(-0.15, dtype=torch.float64), "tau": torch.tensor(1.8).double()}
    weights = [torch.randn(9, 11, generator=gen, dtype=torch.float64) for _ in range(2)]
    got, ref = _run_both(neuron, x, params, v_init, weights)
    assert 0.05 < ref.spikes.mean() < 0.95
    assert torch.equal(got.spikes, ref.spikes)
    for name, r in ref.grads.items():
        torch.testing.assert_close(got.grads[name], r, rtol=1e-9, atol=1e-12)


def test_check_passes_with_learnable_levels() -> None:
    for neuron in (sn.models.ThresholdLIF(v_reset=None), _learnable_reset()):
        report = sn.check(neuron, backend="cpu", seed=seed_of("levels", neuron.name))
        assert report.passed, str(report)


def test_level_must_use_params_only() -> None:
    with pytest.raises(ValueError, match="v_threshold uses \\['V'\\]"):
        sn.Neuron(sn.V + sn.X, v_threshold=sn.V + 1)
    with pytest.raises(ValueError, match="v_reset uses \\['q'\\]"):
        sn.Neuron(sn.V + sn.X, v_reset=sp.Symbol("q"))
    with pytest.raises(ValueError, match="must be finite"):
        sn.Neuron(sn.V + sn.X, v_threshold=sp.nan)


def test_threshold_only_param_can_be_learnable() -> None:
    neuron = sn.Neuron(sn.V + sn.X, params={THETA: 1.0}, learnable=[THETA], v_threshold=THETA)
    assert neuron.learnable == ("theta",)
    assert neuron.derivatives()["dH/dtheta"] == 0
