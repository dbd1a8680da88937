"""Passes as data: a new kind of pass is one Pass (its named arguments and options) plus
its printer's methods, and the pipeline (skeleton, runtime, packing, allocation) serves
it unchanged.

The pass defined here, in this file only, is a forward that also stores the surrogate's
derivative σ'(H − V_th) of every step: compiled for the C backend and checked against
the derivative computed by torch's autograd from σ written in torch, on H from a LIF
loop written here (the oracle shares no code with the kernels).
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import generator

import symneuron as sn
from symneuron.codegen.forward import ForwardPrinter
from symneuron.codegen.skeleton import register_printer, render
from symneuron.codegen.steps import StepIO, Stream
from symneuron.runtime import cpu
from symneuron.runtime.kernels import program
from symneuron.signature import FORWARD, Arg, Pass, Variant

pytestmark = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")

#: the surrogate's derivative of every step: one more [T, N] output
SG_SEQ = Arg("sg_seq", "storage", shape=("T", "N"))
SG_STREAM = Stream("sg_seq", "sg_v", "sg")


def _with_sg(args: tuple[Arg, ...]) -> tuple[Arg, ...]:
    at = [a.name for a in args].index("spike_seq") + 1
    return (*args[:at], SG_SEQ, *args[at:])


SURROGATE_FORWARD = Pass("forward_sg", "forward_sg", _with_sg(FORWARD.args), FORWARD.options)


class SurrogateForwardPrinter(ForwardPrinter):
    """The forward's printer, which also writes σ' once the spike is decided."""

    def io(self, variant: Variant, mutable: frozenset[str] = frozenset()) -> StepIO:
        io = super().io(variant, mutable)
        return io._replace(writes=(*io.writes, SG_STREAM))

    def after_fire(self, io: StepIO) -> list[str]:
        return [*self.block(self.spec.surrogate), self.write_lane(SG_STREAM)]


register_printer("forward_sg", SurrogateForwardPrinter)


def _lif_h(x: torch.Tensor, tau: float, v_th: float) -> torch.Tensor:
    """H of a hard-reset LIF, H = V + (X − V)/τ, written here in float64."""
    v, out = torch.zeros_like(x[0]), []
    for xt in x:
        h = v + (xt - v) / tau
        out.append(h)
        v = torch.where(h >= v_th, torch.zeros_like(h), h)
    return torch.stack(out)


def _atan_derivative(u: torch.Tensor, alpha: float) -> torch.Tensor:
    """dσ/du of σ(u) = atan(π/2·α·u)/π + 1/2, by torch's autograd."""
    u = u.detach().clone().requires_grad_()
    sigma = torch.atan(math.pi / 2 * alpha * u) / math.pi + 0.5
    (grad,) = torch.autograd.grad(sigma.sum(), u)
    return grad


@pytest.mark.parametrize("v_mode", ["seq", "last"])
def test_a_pass_defined_outside_the_package_compiles_runs_and_stores_the_surrogate(
    v_mode: str,
) -> None:
    alpha, tau = 2.0, 2.0
    neuron = sn.models.LIF(surrogate=sn.surrogate.ATan(alpha=alpha))
    prog = program(neuron, "cpu")
    x = 1.8 * torch.rand(12, 37, generator=generator(31), dtype=torch.float64)
    layout = prog.forward_layout(x, True, v_mode, SURROGATE_FORWARD)
    out = layout.outputs(x)
    params = [torch.tensor(tau, dtype=torch.float64)]
    values = {
        "x_seq": x,
        "v_init": None,
        "w_init": None,
        "params": params,
        "param_strides": prog.check_params(params),
        "T": x.shape[0],
        "N": x.shape[1],
    }
    prog.run(SURROGATE_FORWARD, (True, v_mode), out, values, x.shape[1])
    h = _lif_h(x, tau, 1.0)
    want = _atan_derivative(h - 1.0, alpha)
    torch.testing.assert_close(out.h_seq, h, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(out.sg_seq, want, rtol=1e-13, atol=1e-14)
    # the rest of the pass is the forward's: spikes as the plain forward gives them
    plain = sn.simulate(neuron, x, backend="cpu")[0]
    assert torch.equal(out.spike_seq, plain) and 0 < float(plain.mean()) < 0.9


def test_the_new_pass_is_named_and_printed_from_its_data() -> None:
    spec = sn.models.LIF().spec()
    row = sn.dtypes.lookup("cpu", "float32")
    from symneuron.codegen.dialects import C

    source = render(spec, C, row, passes=(SURROGATE_FORWARD,))
    assert "void LIF_forward_sg_h_seq_k1(" in source
    assert "float* restrict sg_seq" in source and "sg_v.v[j] = sg;" in source
    assert [v.base for v in SURROGATE_FORWARD.variants(1)] == [
        "forward_sg_h_seq",
        "forward_sg_h_last",
        "forward_sg_n_seq",
        "forward_sg_n_last",
    ]


def test_a_pass_of_an_unknown_kind_is_refused() -> None:
    stray = Pass("stray", "no_such_kind", FORWARD.args, FORWARD.options)
    row = sn.dtypes.lookup("cpu", "float32")
    from symneuron.codegen.dialects import C

    with pytest.raises(ValueError, match="No printer for passes of kind 'no_such_kind'"):
        render(sn.models.LIF().spec(), C, row, passes=(stray,))
