"""A layer run again (issue 25, items 6, 9 and 11): recomputed by torch.utils.checkpoint,
compiled with CUDA graphs (mode="reduce-overhead"), after torch.inference_mode, and under
torch.autocast."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import symneuron as sn
from symneuron.memo import BoundedTable
from symneuron.runtime import cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")

Call = Callable[[Callable[[torch.Tensor], torch.Tensor], torch.Tensor], torch.Tensor]


def _plain(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    return fn(x)


def _checkpointed(reentrant: bool) -> Call:
    def call(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return checkpoint(fn, x, use_reentrant=reentrant)

    return call


def _train(call: Call, warm: bool, detach: bool, loss_v: bool) -> list[torch.Tensor]:
    """Spikes and gradients of Linear -> LIF (learnable tau) over two chunks of 5 steps,
    each chunk run by ``call``; ``warm``: the layer starts from the state a gradient-free
    call left; ``detach``: the state is detached between chunks (truncated BPTT);
    ``loss_v``: the loss reads the state each chunk leaves."""
    gen = torch.Generator().manual_seed(25)
    lin = nn.Linear(4, 6, dtype=torch.float64)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(6, 4, generator=gen, dtype=torch.float64))
        lin.bias.fill_(0.4)
    layer = sn.NeuronLayer(sn.models.LIF(learnable=["tau"]), backend="cpu").double()
    chunks = [torch.rand(5, 3, 4, generator=gen, dtype=torch.float64) for _ in range(3)]
    weights = [torch.randn(5, 3, 6, generator=gen, dtype=torch.float64) for _ in range(2)]
    if warm:
        with torch.no_grad():
            layer(lin(chunks[2]))
    spikes, loss = [], torch.zeros((), dtype=torch.float64)
    for x, r in zip(chunks[:2], weights, strict=True):
        s = call(lambda z: layer(lin(z)), x.requires_grad_())
        loss = loss + (s * r).sum() + (layer.v.pow(2).sum() if loss_v else 0)
        spikes.append(s.detach())
        if detach:
            layer.v = layer.v.detach()
    loss.backward()
    grads = [lin.weight.grad, lin.bias.grad, layer.tau.grad, *(x.grad for x in chunks[:2])]
    return [*spikes, *grads]  # type: ignore[list-item]


@pytest.mark.parametrize("detach", [False, True], ids=["bptt", "truncated"])
@pytest.mark.parametrize("warm", [False, True], ids=["from-reset", "carried"])
@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_checkpointed_layer_has_the_gradients_of_the_plain_one(
    reentrant: bool, warm: bool, detach: bool
) -> None:
    loss_v = not reentrant  # a reentrant checkpoint's outputs are its function's alone
    if reentrant and not detach:
        with pytest.raises(RuntimeError, match="use_reentrant=False, or cut the gradient"):
            _train(_checkpointed(reentrant), warm, detach, loss_v)
        return
    want = _train(_plain, warm, detach, loss_v)
    assert float(want[0].sum() + want[1].sum()) > 0 and float(want[2].abs().sum()) > 0
    got = _train(_checkpointed(reentrant), warm, detach, loss_v)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_recomputation_leaves_the_memory_as_the_first_run_did() -> None:
    layer = sn.NeuronLayer(sn.models.LIF(), backend="cpu").double()
    x = torch.rand(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    s = checkpoint(layer, (2 * x).requires_grad_(), use_reentrant=False)
    kept = layer.v.clone()
    s.sum().backward()
    assert torch.equal(layer.v, kept)
    assert layer._replays == []  # used by the recomputation, not kept


# -- torch.compile(mode="reduce-overhead"): CUDA graphs overwrite their outputs -----------


def _stream(layer: nn.Module, run: Callable, steps: torch.Tensor, mark: bool) -> list:
    """Spikes of each step (cloned: CUDA graphs own their outputs) and the final V."""
    out = []
    with torch.no_grad():
        for x in steps:
            if mark:
                torch.compiler.cudagraph_mark_step_begin()
            out.append(run(x).clone())
    return [torch.stack(out), layer.v.clone()]  # type: ignore[union-attr]


@pytest.mark.cuda
@pytest.mark.parametrize("mark", [False, True], ids=["plain", "mark_step_begin"])
def test_reduce_overhead_streams_single_steps(mark: bool) -> None:
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(9)
    steps = (1.5 * torch.rand(12, 4, 256, generator=gen, dtype=torch.float64)).cuda()
    layer = sn.NeuronLayer(sn.models.PLIF(), step_mode="s").double().cuda()
    want = _stream(layer, layer, steps, mark=False)
    assert float(want[0].sum()) > 0
    layer.reset()
    got = _stream(layer, torch.compile(layer, mode="reduce-overhead"), steps, mark)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def _chunks(net: nn.Sequential, run: Callable, chunks: torch.Tensor, how: str) -> list:
    """Outputs and gradients of ``net`` over chunks of one sequence, the neuron layer's
    state (if any) carried between them: ``bptt`` one backward over all chunks,
    ``truncated`` a backward per chunk with the gradients taken (as an optimizer step
    would) and the state detached, ``accumulate`` the same but the gradients summed
    in ``.grad`` over the chunks."""
    layer = net[1] if isinstance(net[1], sn.NeuronLayer) else None
    if layer is not None:
        layer.reset()
    net.zero_grad(set_to_none=True)
    loss, outs, grads = 0, [], []
    for x in chunks:
        s = run(x)
        outs.append(s.detach().clone())
        loss = loss + (s * torch.linspace(-1, 1, s.shape[-1], device=s.device)).sum()
        if how == "bptt":
            continue
        loss.backward()
        loss = 0
        if how == "truncated":
            grads += [p.grad.clone() for p in net.parameters()]
            net.zero_grad(set_to_none=True)
        if layer is not None:
            layer.v = layer.v.detach()
    if how == "bptt":
        loss.backward()
    if how != "truncated":
        grads = [p.grad.clone() for p in net.parameters()]
    return [torch.stack(outs), *grads]


def _compiled_chunks(net: nn.Sequential, chunks: torch.Tensor, how: str) -> list | str:
    """:func:`_chunks` of ``net`` under reduce-overhead, or the error it raised."""
    torch._dynamo.reset()
    try:
        return _chunks(net, torch.compile(net, mode="reduce-overhead"), chunks, how)
    except RuntimeError as e:
        return str(e).split(".")[0]


@pytest.mark.cuda
@pytest.mark.parametrize("how", ["bptt", "truncated", "accumulate"])
def test_reduce_overhead_over_chunks_behaves_as_torchs_own_layers(how: str) -> None:
    """A layer carrying its state over chunks under CUDA graphs gives eager's outputs and
    gradients wherever a network of torch's own layers does, and fails the same way
    where that one fails: gradients *summed* in ``.grad`` over several backwards are
    outputs of the backward's graph that its next replay overwrites (torch's limit,
    not symneuron's: take them after each backward, as an optimizer step does)."""
    gen = torch.Generator().manual_seed(10)
    chunks = torch.rand(4, 6, 8, 16, generator=gen, dtype=torch.float64).cuda()
    outcome = {}
    for name, second in [("torch", nn.Tanh()), ("symneuron", sn.NeuronLayer(sn.models.PLIF()))]:
        torch.manual_seed(9)
        net = nn.Sequential(nn.Linear(16, 32), second).double().cuda()
        want = _chunks(net, net, chunks, how)
        assert float(want[0].abs().sum()) > 0
        got = _compiled_chunks(net, chunks, how)
        if not isinstance(got, str):
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
            got = "equal to eager"
        outcome[name] = got
    assert outcome["symneuron"] == outcome["torch"]
    if how != "accumulate":
        assert outcome["symneuron"] == "equal to eager"


# -- a state left by inference_mode; autocast with backend="auto" ----------------------


def test_state_from_inference_mode_then_grad_names_reset() -> None:
    layer = sn.NeuronLayer(sn.models.PLIF(), backend="cpu")
    x = torch.rand(4, 2, 8, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        layer(x)
    with pytest.raises(RuntimeError, match=r"torch.inference_mode\(\).*call layer.reset\(\)"):
        layer(x.requires_grad_())
    layer.reset()
    layer(x).sum().backward()  # the hint's fix works
    assert x.grad is not None


def test_autocast_bfloat16_with_auto_backend_runs_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the one-time warning comes from simulate, which picks the backend for layer and call
    monkeypatch.setattr(importlib.import_module("symneuron.simulate"), "_WARNED", BoundedTable(16))
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(8, 16), sn.NeuronLayer(sn.models.LIF()))
    x = 3 * torch.rand(6, 4, 8, generator=torch.Generator().manual_seed(4))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.warns(RuntimeWarning, match="torch reference on cpu bfloat16"):
            spikes = net(x)
        net[1].reset()
        want = sn.simulate(sn.models.LIF(), net[0](x), backend="torch")[0]
    assert spikes.dtype == torch.bfloat16 and float(spikes.detach().sum()) > 0
    assert torch.equal(spikes, want)
    net[1].reset()
    with pytest.raises(TypeError, match="backend='cpu' supports"):  # chosen: still refused
        sn.NeuronLayer(sn.models.LIF(), backend="cpu")(x.bfloat16())


def test_deepcopy_during_a_checkpointed_step_leaves_its_records() -> None:
    import copy

    layer = sn.NeuronLayer(sn.models.LIF(), backend="cpu").double()
    x = torch.rand(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    layer(x.requires_grad_())  # a state inside an autograd graph
    s = checkpoint(layer, 2 * x, use_reentrant=False)
    twin = copy.deepcopy(layer)
    assert twin._replays == [] and len(layer._replays) == 1
    s.sum().backward()
    assert layer._replays == []
