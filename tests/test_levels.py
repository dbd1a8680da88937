"""Thresholds and reset levels given as expressions in the params (learnable ones included).

The oracle is the float64 torch reference; every gradient includes the threshold's and
reset's parameters.
"""

from __future__ import annotations

import pytest
import sympy as sp
import torch

import symneuron as sn
from symneuron.reference import simulate_reference

V_R, TAU, THETA = sp.symbols("v_r tau theta")


def _learnable_reset() -> sn.Neuron:
    return sn.Neuron(
        sn.V + (sn.X - (sn.V - V_R)) / TAU,
        params={TAU: 2.0, V_R: -0.2},
        learnable=[V_R, TAU],
        v_reset=V_R,
        name="LearnableReset",
    )


def _grads(neuron, backend, x, params, v_init, weights):  # type: ignore[no-untyped-def]
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    xl = x.clone().requires_grad_(True)
    if backend == "reference":
        values = {**neuron.params, **leaves}
        v0 = v_init if v_init is not None else None
        if v0 is None:
            level = values[neuron.v_reset.name] if isinstance(neuron.v_reset, sp.Symbol) else 0.0
            v0 = torch.as_tensor(level, dtype=x.dtype).expand(x.shape[1:])
        s, v = simulate_reference(neuron, xl, v0, values)
    else:
        s, v = sn.simulate(neuron, xl, v_init, leaves, backend=backend)
    loss = (s * weights[0]).sum() + (v * weights[1]).sum()
    grads = torch.autograd.grad(loss, [xl, *leaves.values()])
    return s.detach(), v.detach(), grads


@pytest.mark.parametrize("reset", [0.0, None], ids=["hard", "soft"])
@pytest.mark.parametrize("detach", [False, True])
def test_threshold_lif_matches_reference(reset: float | None, detach: bool) -> None:
    neuron = sn.models.ThresholdLIF(v_reset=reset, detach_reset=detach)
    gen = torch.Generator().manual_seed(torch.randint(0, 2**31, ()).item())
    x = 2.4 * torch.rand(10, 3, 7, generator=gen, dtype=torch.float64)
    theta = 0.9 + 0.2 * torch.rand(3, 1, generator=gen, dtype=torch.float64)  # per channel
    weights = [torch.randn(10, 3, 7, generator=gen, dtype=torch.float64) for _ in range(2)]
    ref = _grads(neuron, "reference", x, {"theta": theta}, None, weights)
    got = _grads(neuron, "cpu", x, {"theta": theta}, None, weights)
    assert 0.05 < ref[0].mean() < 0.95
    assert torch.equal(got[0], ref[0])
    torch.testing.assert_close(got[1], ref[1], rtol=0, atol=1e-10)
    for g, r in zip(got[2], ref[2], strict=True):
        assert g.shape == r.shape
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-12)
    assert ref[2][1].abs().sum() > 0  # theta really gets a gradient


@pytest.mark.parametrize("given_v_init", [False, True])
def test_learnable_reset_level_matches_reference(given_v_init: bool) -> None:
    neuron = _learnable_reset()
    gen = torch.Generator().manual_seed(torch.randint(0, 2**31, ()).item())
    x = 2.4 * torch.rand(9, 11, generator=gen, dtype=torch.float64)
    v_init = 0.3 * torch.rand(11, generator=gen, dtype=torch.float64) if given_v_init else None
    params = {"v_r": torch.tensor(-0.15, dtype=torch.float64), "tau": torch.tensor(1.8).double()}
    weights = [torch.randn(9, 11, generator=gen, dtype=torch.float64) for _ in range(2)]
    ref = _grads(neuron, "reference", x, params, v_init, weights)
    got = _grads(neuron, "cpu", x, params, v_init, weights)
    assert 0.05 < ref[0].mean() < 0.95
    assert torch.equal(got[0], ref[0])
    for g, r in zip(got[2], ref[2], strict=True):
        torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-12)


def test_check_passes_with_learnable_levels() -> None:
    for neuron in (sn.models.ThresholdLIF(v_reset=None), _learnable_reset()):
        report = sn.check(neuron, backend="cpu")
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
