"""torch integration: custom-op checks, gradcheck where it is meaningful, torch.compile,
and NeuronLayer's modes, memory and parameter registration."""

from __future__ import annotations

import pytest
import torch
from conftest import (
    DEFAULT_INPUT_SCALE,
    INPUT_SCALE,
    assert_fires_sometimes,
    generator,
    random_inputs,
    rel_err,
    seed_of,
)
from torch import nn
from torch.autograd.gradcheck import GradcheckError

import symneuron as sn
import symneuron.binding as F
from symneuron.signature import FORWARD


def op_args(
    neuron: sn.Neuron, seed: int, *, store_h: bool, v_mode: str, requires_grad: bool
) -> tuple:
    """Arguments of ``symneuron::forward`` as ``sn.simulate`` builds them ([T, N] layout)."""
    x_seq, v_init = random_inputs(7, (10,), torch.float64, seed)
    params = [torch.full((10,), value, dtype=torch.float64) for value in neuron.params.values()]
    if requires_grad:
        x_seq.requires_grad_(True)
        v_init.requires_grad_(True)
        for name, p in zip(neuron.params, params, strict=True):
            p.requires_grad_(name in neuron.learnable)
    return (F.register(neuron, "cpu"), "cpu", x_seq, v_init, None, params, store_h, v_mode)


@pytest.mark.parametrize("v_mode", ["seq", "last"])
@pytest.mark.parametrize("model", ["PLIF", "QIF"])
def test_opcheck_forward(model: str, v_mode: str) -> None:
    neuron = sn.models.DISCRETE[model](v_reset=None if model == "QIF" else 0.0)
    args = op_args(
        neuron, seed_of("opcheck", model, v_mode), store_h=True, v_mode=v_mode, requires_grad=True
    )
    out = FORWARD.returns(*F.forward_op(*args))  # the op's outputs by name
    assert out.w_out.numel() == 0 and out.wt_seq.numel() == 0  # single-state: no states
    assert_fires_sometimes(out.spike_seq)
    assert out.v_seq.shape == ((7 if v_mode == "seq" else 1), 10)
    assert out.h_seq.shape == (7, 10)
    torch.library.opcheck(F.forward_op, args)


@pytest.mark.parametrize("v_mode", ["seq", "last"])
def test_opcheck_forward_inference(v_mode: str) -> None:
    args = op_args(
        sn.models.LIF(),
        seed_of("opcheck-inf", v_mode),
        store_h=False,
        v_mode=v_mode,
        requires_grad=False,
    )
    assert FORWARD.returns(*F.forward_op(*args)).h_seq.numel() == 0
    torch.library.opcheck(F.forward_op, args)


@pytest.mark.parametrize("grad_v_mode", ["seq", "last", "none"])
def test_opcheck_backward(grad_v_mode: str) -> None:
    neuron = sn.models.PLIF()
    key, backend, x_seq, v_init, _, params, _, _ = op_args(
        neuron, seed_of("opcheck-bw"), store_h=True, v_mode="seq", requires_grad=False
    )
    out = FORWARD.returns(*F.forward_op(key, backend, x_seq, v_init, None, params, True, "seq"))
    gen = generator(seed_of("opcheck-bw-grads"))
    grad_spike = torch.randn(7, 10, generator=gen, dtype=torch.float64)
    rows = {"seq": 7, "last": 1}
    grad_v = (
        None
        if grad_v_mode == "none"
        else torch.randn(rows[grad_v_mode], 10, generator=gen, dtype=torch.float64)
    )
    grad_w = None if grad_v is None else grad_v.new_zeros((0, *grad_v.shape))
    given = dict(
        grad_spike=grad_spike,
        grad_v_seq=grad_v,
        grad_w_seq=grad_w,
        h_seq=out.h_seq,
        wt_seq=None,
        x_seq=x_seq,
        v_init=v_init,
        w_init=None,
        params=params,
        grad_v_mode=grad_v_mode,
        rng=None,
    )
    args = (key, backend, *[given[name] for name in F.OP_ARGS["backward"][2:]])
    torch.library.opcheck(F.backward_op, args)


# gradcheck compares the analytic gradient with finite differences of the forward. The
# spikes are a step function of the inputs, so the surrogate gradient through S is by
# design not the finite difference, and gradcheck on sn.simulate as a whole cannot pass.
# It *is* meaningful for v_seq alone with detach_reset=True: then the backward uses
# dV/dH = 1 − S (hard) or 1 (soft) and no σ', which is exactly the derivative of the
# piecewise-smooth forward away from the threshold (random inputs are not within eps of it).
@pytest.mark.parametrize("v_mode", ["seq", "last"])
@pytest.mark.parametrize("reset", [0.0, None], ids=["hard", "soft"])
@pytest.mark.parametrize("model", ["LIF", "PLIF", "QIF", "EIF"])
def test_gradcheck_v_with_detached_reset(model: str, reset: float | None, v_mode: str) -> None:
    learnable = {"LIF": ["tau"], "PLIF": ["w"], "QIF": ["tau", "a0"], "EIF": ["delta_T"]}[model]
    neuron = sn.models.DISCRETE[model](v_reset=reset, detach_reset=True, learnable=learnable)
    scale = INPUT_SCALE.get(model, DEFAULT_INPUT_SCALE)
    x_seq, v_init = random_inputs(
        5, (2, 3), torch.float64, seed_of("gc", model, reset), x_offset=scale[0], x_scale=scale[1]
    )
    theta = [torch.tensor(neuron.params[n], dtype=torch.float64) + 0.03 for n in learnable]
    spikes, _ = sn.simulate(
        neuron, x_seq, v_init, dict(zip(learnable, theta, strict=True)), backend="cpu"
    )
    assert_fires_sometimes(spikes)

    def v_out(x: torch.Tensor, v0: torch.Tensor, *th: torch.Tensor) -> torch.Tensor:
        return sn.simulate(
            neuron,
            x,
            v0,
            dict(zip(learnable, th, strict=True)),
            backend="cpu",
            store_v_seq=v_mode == "seq",
        )[1]

    inputs = (x_seq.requires_grad_(), v_init.requires_grad_(), *[t.requires_grad_() for t in theta])
    assert torch.autograd.gradcheck(v_out, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_gradcheck_detects_attached_reset() -> None:
    """The control for the test above: with the reset attached, σ' enters dV/dH and the
    gradient is (by design) not the finite difference, so gradcheck must fail."""
    neuron = sn.models.LIF(detach_reset=False)
    x_seq, v_init = random_inputs(5, (2, 3), torch.float64, seed_of("gc-attached"))
    inputs = (x_seq.requires_grad_(), v_init.requires_grad_())
    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(
            lambda x, v: sn.simulate(neuron, x, v, backend="cpu")[1],
            inputs,
            eps=1e-6,
            atol=1e-7,
            rtol=1e-5,
        )


# -- torch.compile ------------------------------------------------------------------


class Net(nn.Module):
    def __init__(self, backend: str) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 8, dtype=torch.float64)
        self.lif = sn.NeuronLayer(
            sn.models.PLIF(v_reset=None),
            backend=backend,
            params={"w": torch.zeros(8, dtype=torch.float64)},
        )

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        return self.lif(self.fc(x_seq))


def _forward_backward(
    net: Net, x_seq: torch.Tensor, r: torch.Tensor, call: object
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    net.lif.reset()
    net.zero_grad()
    spikes = call(x_seq)  # type: ignore[operator]
    (spikes * r).sum().backward()
    return spikes.detach(), [p.grad.clone() for p in net.parameters()]


@pytest.mark.parametrize(
    "compile_backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)]
)
def test_compile_fullgraph_matches_eager(compile_backend: str) -> None:
    torch.manual_seed(seed_of("compile"))
    net = Net("cpu")
    with torch.no_grad():
        net.fc.weight.mul_(2.0)
        net.fc.bias.add_(0.6)
    gen = generator(seed_of("compile-inputs"))
    x_seq = torch.randn(8, 3, 6, generator=gen, dtype=torch.float64)
    r = torch.randn(8, 3, 8, generator=gen, dtype=torch.float64)
    eager_spikes, eager_grads = _forward_backward(net, x_seq, r, net)
    assert_fires_sometimes(eager_spikes)
    torch._dynamo.reset()
    compiled = torch.compile(net, fullgraph=True, backend=compile_backend)
    spikes, grads = _forward_backward(net, x_seq, r, compiled)
    assert torch.equal(spikes, eager_spikes)
    assert len(grads) == 3  # fc.weight, fc.bias, lif.w
    for got, want in zip(grads, eager_grads, strict=True):
        assert float(want.abs().max()) > 0
        assert rel_err(got, want) <= 1e-12
    # ... and eager itself against the reference backend.
    ref_net = Net("torch")
    ref_net.load_state_dict(net.state_dict())
    ref_spikes, ref_grads = _forward_backward(ref_net, x_seq, r, ref_net)
    assert torch.equal(ref_spikes, eager_spikes)
    for got, want in zip(eager_grads, ref_grads, strict=True):
        assert rel_err(got, want) <= 1e-9


# -- NeuronLayer -----------------------------------------------------------------------


@pytest.mark.parametrize("model", ["LIF", "PLIF", "EIF"])
def test_single_step_equals_multi_step(model: str) -> None:
    neuron = sn.models.DISCRETE[model](v_reset=None)
    scale = INPUT_SCALE.get(model, DEFAULT_INPUT_SCALE)
    x_seq, _ = random_inputs(
        8, (3, 5), torch.float64, seed_of("steps", model), x_offset=scale[0], x_scale=scale[1]
    )
    r = torch.randn(8, 3, 5, generator=generator(seed_of("steps-r", model)), dtype=torch.float64)
    multi = sn.NeuronLayer(neuron, step_mode="m", backend="cpu", store_v_seq=True).double()
    single = sn.NeuronLayer(neuron, step_mode="s", backend="cpu").double()
    x_m = x_seq.clone().requires_grad_(True)
    spikes_m = multi(x_m)
    x_s = x_seq.clone().requires_grad_(True)
    spikes_s = torch.stack([single(x_s[t]) for t in range(x_seq.shape[0])])
    assert_fires_sometimes(spikes_m)
    assert torch.equal(spikes_s, spikes_m)
    assert multi.v is not None and single.v is not None and multi.v_seq is not None
    assert single.v.shape == (3, 5) and single.v_seq is None
    assert float((single.v - multi.v).detach().abs().max()) <= 1e-12
    assert torch.equal(multi.v, multi.v_seq[-1])
    # Backpropagation through time across single-step calls equals the multi-step kernel's.
    ((spikes_m * r).sum() + (multi.v * r[-1]).sum()).backward()
    ((spikes_s * r).sum() + (single.v * r[-1]).sum()).backward()
    assert rel_err(x_s.grad, x_m.grad) <= 1e-9
    for name in neuron.learnable:
        assert rel_err(getattr(single, name).grad, getattr(multi, name).grad) <= 1e-9


def test_layer_memory_persists_and_reset_clears() -> None:
    layer = sn.NeuronLayer(sn.models.LIF(v_reset=None), backend="cpu").double()
    x_seq, _ = random_inputs(10, (2, 6), torch.float64, seed_of("memory"))
    whole = layer(x_seq)
    v_whole = layer.v.clone()
    layer.reset()
    assert layer.v is None and layer.v_seq is None
    first, second = layer(x_seq[:4]), layer(x_seq[4:])
    assert torch.equal(torch.cat([first, second]), whole)
    assert float((layer.v - v_whole).abs().max()) <= 1e-12
    # After reset() the state starts from v_reset again: same output as the first call.
    layer.reset()
    assert torch.equal(layer(x_seq[:4]), first)
    # Without reset() the second call starts from the carried state and differs.
    assert not torch.equal(layer(x_seq[:4]), first)
    assert_fires_sometimes(whole)


def test_layer_params_and_buffers() -> None:
    layer = sn.NeuronLayer(sn.models.QIF(learnable=["tau", "a0"]))
    params = dict(layer.named_parameters())
    buffers = dict(layer.named_buffers())
    assert set(params) == {"tau", "a0"}
    assert set(buffers) == {"v_c", "v_rest"}
    assert all(isinstance(p, nn.Parameter) for p in params.values())
    assert float(params["tau"].detach()) == 2.0
    assert float(buffers["v_c"]) == pytest.approx(0.8)
    assert set(layer.state_dict()) == {"tau", "a0", "v_c", "v_rest"}
    x_seq, _ = random_inputs(6, (2, 5), torch.float32, seed_of("params"), x_offset=0.6, x_scale=0.6)
    layer(x_seq).sum().backward()
    assert layer.tau.grad is not None and layer.a0.grad is not None
    assert float(layer.tau.grad.abs()) > 0


def test_layer_single_step_shape() -> None:
    layer = sn.NeuronLayer(sn.models.IF(), step_mode="s", backend="cpu")
    x = 0.9 + torch.randn(4, 7, generator=generator(seed_of("s-shape")))
    out = layer(x)
    assert out.shape == x.shape
    assert layer.v.shape == x.shape
