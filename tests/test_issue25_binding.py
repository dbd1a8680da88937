"""Issue 25: double backward, compiled outputs, functorch, check_finite under compile,
sparse inputs and backend='auto' with a dtype the kernels lack (simulate's side)."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import generator

import symneuron as sn
from symneuron.runtime import cpu

needs_cc = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")


def _x(seed: int, *shape: int) -> torch.Tensor:
    return 3 * torch.rand(*shape, generator=generator(seed), dtype=torch.float64)


@needs_cc
def test_double_backward_through_a_kernel_raises_naming_the_reference() -> None:
    """create_graph=True through the cpu kernel gave a gradient that does not require grad
    (x.grad 1.48 where the reference gives -111.3): it must raise instead."""
    lif = sn.models.LIF()
    x = _x(1, 6, 5).requires_grad_()
    _, v = sn.simulate(lif, x, backend="cpu")
    with pytest.raises(RuntimeError, match="create_graph=True.*backend='torch'"):
        torch.autograd.grad(v.sum(), x, create_graph=True)
    # the reference does differentiate twice (the oracle the error points to)
    _, v_ref = sn.simulate(lif, x, backend="torch")
    (g,) = torch.autograd.grad(v_ref.sum(), x, create_graph=True)
    assert g.requires_grad


@needs_cc
def test_first_order_backward_is_unchanged() -> None:
    x = _x(2, 6, 5).requires_grad_()
    _, v = sn.simulate(sn.models.LIF(), x, backend="cpu")
    (g,) = torch.autograd.grad(v.sum(), x)
    _, v_ref = sn.simulate(sn.models.LIF(), x, backend="torch")
    (g_ref,) = torch.autograd.grad(v_ref.sum(), x)
    assert torch.allclose(g, g_ref, atol=1e-12)


@needs_cc
@pytest.mark.parametrize("model", ["LIF", "Izhikevich"])
def test_compiled_simulate_returns_what_eager_returns(model: str) -> None:
    """Compiled, a neuron without states returned (spikes, v, {}) where eager gives two."""
    neuron = getattr(sn.models, model)()
    x = _x(3, 5, 4)

    def run(x_seq: torch.Tensor) -> tuple:
        return sn.simulate(neuron, x_seq, backend="cpu")

    eager = run(x)
    compiled = torch.compile(run, fullgraph=True, backend="eager")(x)
    assert len(compiled) == len(eager) == (3 if neuron.states else 2)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
    if neuron.states:
        assert compiled[2].keys() == eager[2].keys()


@needs_cc
@pytest.mark.parametrize("transform", ["vmap", "jacrev"])
def test_functorch_transforms_get_a_clear_error(transform: str) -> None:
    lif = sn.models.LIF()
    x = _x(4, 3, 4, 2)

    def v_last(x_seq: torch.Tensor) -> torch.Tensor:
        return sn.simulate(lif, x_seq, backend="cpu")[1][-1]

    fn = torch.func.vmap(v_last, in_dims=2) if transform == "vmap" else torch.func.jacrev(v_last)
    with pytest.raises(RuntimeError, match="functorch transforms.*backend='torch'"):
        fn(x)


@needs_cc
def test_check_finite_under_fullgraph_compile_says_what_to_do() -> None:
    lif = sn.models.LIF()

    def run(x_seq: torch.Tensor) -> torch.Tensor:
        return sn.simulate(lif, x_seq, backend="cpu", check_finite=True)[1]

    with pytest.raises(Exception, match="check_finite=True"):
        torch.compile(run, fullgraph=True, backend="eager")(_x(5, 4, 3))


def test_sparse_input_is_refused_with_the_fix() -> None:
    x = _x(6, 4, 3).to_sparse()
    with pytest.raises(TypeError, match=r"dense tensor.*to_dense\(\)"):
        sn.simulate(sn.models.LIF(), x, backend="torch")


@needs_cc
def test_auto_backend_with_bfloat16_on_cpu_runs_the_reference() -> None:
    """backend='auto' said backend='cpu' lacks bfloat16, naming a backend the user did
    not choose; it runs the reference (one warning), and an explicit 'cpu' still says so."""
    x = _x(7, 4, 3).to(torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s, v = sn.simulate(sn.models.LIF(), x)
    assert s.dtype == torch.bfloat16 and v.shape == (4, 3)
    assert any("torch reference" in str(w.message) for w in caught)
    ref = sn.simulate(sn.models.LIF(), x, backend="torch")
    assert torch.equal(s, ref[0])
    with pytest.raises(TypeError, match="backend='cpu' supports"):
        sn.simulate(sn.models.LIF(), x, backend="cpu")


@needs_cc
def test_compiling_a_layer_first_in_a_fresh_table_traces() -> None:
    """The bounded tables take a lock to store; Dynamo cannot enter it, so a first call
    that happens inside torch.compile (a table still empty) must store nothing there."""
    from symneuron.inputs import _NAMES  # the table the first call fills

    _NAMES.clear()
    layer = sn.NeuronLayer(sn.models.Izhikevich()).double()

    def step(x: torch.Tensor) -> torch.Tensor:
        layer.reset()
        return layer(x).sum()

    x = _x(8, 5, 3, 4)
    assert torch.equal(torch.compile(step, fullgraph=True, backend="eager")(x), step(x))


def test_nan_tensor_param_is_refused_when_checking() -> None:
    """A NaN tensor param was accepted by simulate (the layer refuses it); with
    check_finite=True, which reads values back anyway, simulate refuses it too."""
    x = _x(9, 4, 3)
    tau = torch.full((3,), float("nan"), dtype=torch.float64)
    with pytest.raises(ValueError, match="param 'tau' holds NaN"):
        sn.simulate(sn.models.LIF(), x, params={"tau": tau}, backend="torch", check_finite=True)
