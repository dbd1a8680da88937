"""Forward-mode AD (torch.autograd.forward_ad, jvp): the fused kernels have no
forward-mode rule, so a dual input is refused with the fix instead of losing its
tangent (the output had none before, silently)."""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from conftest import generator

import symneuron as sn
from symneuron.runtime import cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")


def _x() -> torch.Tensor:
    return 2 * torch.rand(5, 3, generator=generator(41), dtype=torch.float64)


@pytest.mark.parametrize("where", ["x", "v_init", "param"])
def test_fused_kernels_refuse_a_dual_input(where: str) -> None:
    x, v0, tau = _x(), torch.zeros(3, dtype=torch.float64), torch.tensor(2.0, dtype=torch.float64)
    with fwAD.dual_level():
        dual = {"x": x, "v_init": v0, "param": tau}
        dual[where] = fwAD.make_dual(dual[where], torch.ones_like(dual[where]))
        with pytest.raises(RuntimeError, match="no forward-mode AD rule.*backend='torch'"):
            sn.simulate(
                sn.models.LIF(), dual["x"], dual["v_init"], {"tau": dual["param"]}, backend="cpu"
            )


def test_recurrent_layer_refuses_a_dual_input() -> None:
    layer = sn.RecurrentNeuronLayer(sn.models.LIF(), 3, backend="cpu").double()
    with fwAD.dual_level():
        x = fwAD.make_dual(_x()[:, None], torch.ones(5, 1, 3, dtype=torch.float64))
        with pytest.raises(RuntimeError, match="no forward-mode AD rule"):
            layer(x)


def test_without_tangents_the_kernels_run_inside_a_dual_level() -> None:
    with fwAD.dual_level():
        s, v = sn.simulate(sn.models.LIF(), _x(), backend="cpu")
    assert s.shape == (5, 3)


def test_the_recommended_backend_propagates_the_tangent() -> None:
    """backend='torch', which the refusal names, gives the tangent reverse mode agrees with:
    <J·t, u> = <t, Jᵀ·u> for V's sequence (surrogate gradients alike both ways)."""
    x = _x()
    tangent = torch.rand(x.shape, generator=generator(42), dtype=torch.float64)
    probe = torch.rand(5, 3, generator=generator(43), dtype=torch.float64)
    with fwAD.dual_level():
        _, v = sn.simulate(sn.models.LIF(), fwAD.make_dual(x, tangent), backend="torch")
        jvp = fwAD.unpack_dual(v).tangent
    assert jvp is not None
    xr = x.clone().requires_grad_()
    _, vr = sn.simulate(sn.models.LIF(), xr, backend="torch")
    (vjp,) = torch.autograd.grad((vr * probe).sum(), xr)
    torch.testing.assert_close((jvp * probe).sum(), (tangent * vjp).sum(), rtol=1e-12, atol=1e-12)
