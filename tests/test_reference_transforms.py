"""The torch reference (``backend="torch"``) under torch's transforms and compiler, and
its refusals matching the fused backends' (issue 34 items 4, 5 and 11).

Oracles: ``torch.autograd.functional.jacobian`` (one backward per output) for the
functorch transforms, the eager layer for the compiled one, and the cpu backend's error
for each refusal.
"""

from __future__ import annotations

import pytest
import sympy as sp
import torch
from conftest import generator
from torch.func import jacfwd, jacrev, vmap

import symneuron as sn

tau = sp.Symbol("tau", positive=True)
v_r = sp.Symbol("v_r", real=True)


def _x(seed: int, *shape: int) -> torch.Tensor:
    return 2 * torch.rand(*shape, dtype=torch.float64, generator=generator(seed))


def _v_of(neuron: sn.Neuron):  # type: ignore[no-untyped-def]
    def f(x: torch.Tensor) -> torch.Tensor:
        return sn.simulate(neuron, x, backend="torch")[1]

    return f


@pytest.mark.parametrize("model", ["LIF", "ALIF", "Izhikevich"])
@pytest.mark.parametrize("transform", [jacrev, jacfwd], ids=["jacrev", "jacfwd"])
def test_jacobians_match_autograd(model: str, transform) -> None:  # type: ignore[no-untyped-def]
    neuron = getattr(sn.models, model)()
    x = _x(1, 5, 3)
    f = _v_of(neuron)
    want = torch.autograd.functional.jacobian(f, x)
    torch.testing.assert_close(transform(f)(x), want, rtol=1e-12, atol=1e-12)


def test_vmap_matches_a_loop() -> None:
    neuron = sn.models.LIF()
    xs = _x(2, 4, 6, 3)
    got = vmap(_v_of(neuron))(xs)
    want = torch.stack([_v_of(neuron)(x) for x in xs])
    torch.testing.assert_close(got, want, rtol=0, atol=0)


NEURONS = {
    "LIF-learnable": lambda: sn.models.LIF(learnable=["tau"]),
    "ALIF": sn.models.ALIF,
    "param-reset": lambda: sn.Neuron(
        sn.V + (sn.X - sn.V) / tau, params={tau: 2.0, v_r: 0.25}, v_reset=v_r, learnable=[tau]
    ),
}


@pytest.mark.parametrize("name", sorted(NEURONS))
def test_torch_backend_layer_compiles_with_fullgraph(name: str) -> None:
    torch._dynamo.reset()
    eager = sn.NeuronLayer(NEURONS[name](), backend="torch")
    compiled_layer = sn.NeuronLayer(NEURONS[name](), backend="torch")
    compiled = torch.compile(compiled_layer, fullgraph=True, backend="eager")
    x = _x(3, 6, 2, 4).float()
    x_eager, x_compiled = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = eager(x_eager), compiled(x_compiled)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    weight = _x(4, 6, 2, 4).float()
    (want * weight).sum().backward()
    (got * weight).sum().backward()
    torch.testing.assert_close(x_compiled.grad, x_eager.grad, rtol=0, atol=0)
    for (p_name, p), q in zip(eager.named_parameters(), compiled_layer.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=p_name)


def _error(fn) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError) as info:
        fn()
    return str(info.value)


def test_piecewise_without_a_true_branch_is_refused_alike() -> None:
    neuron = sn.Neuron(sp.Piecewise((sn.V + sn.X, sn.V < 0.5)))
    x = _x(5, 3, 2)
    messages = {
        backend: _error(lambda b=backend: sn.simulate(neuron, x, backend=b))
        for backend in ("cpu", "torch")
    }
    assert messages["cpu"] == messages["torch"]
    assert "Piecewise needs a final (expr, True) branch" in messages["torch"]


@pytest.mark.parametrize("state", [[-5, 0], [5, -1]], ids=["seed", "offset"])
def test_negative_generator_state_is_refused_alike(state: list[int]) -> None:
    neuron = sn.models.NoisyLIF()
    x = _x(6, 4, 3)
    messages = {
        backend: _error(
            lambda b=backend: sn.simulate(neuron, x, seed=torch.tensor(state), backend=b)
        )
        for backend in ("cpu", "torch")
    }
    assert messages["cpu"] == messages["torch"]
    assert "must hold values in [0, 2**63)" in messages["torch"]


def test_a_valid_generator_state_runs_alike() -> None:
    neuron = sn.models.NoisyLIF()
    x = _x(7, 6, 3)
    state = torch.tensor([2**62 + 5, 3])
    s_cpu, v_cpu = sn.simulate(neuron, x, seed=state, backend="cpu")
    s_ref, v_ref = sn.simulate(neuron, x, seed=state, backend="torch")
    assert torch.equal(s_cpu, s_ref)
    torch.testing.assert_close(v_cpu, v_ref, rtol=1e-12, atol=1e-12)
