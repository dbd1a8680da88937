"""The recurrent layer's two paths on the kernel backends: the fused kernels (one launch a
sequence each way) and the loop over steps (a matrix product and the neuron's step
kernel a step), chosen by ``fused=`` or, by default, by size inside a CUDA graph capture
(``LOOP_FROM``, measured). Both give the same spikes and gradients."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from conftest import generator

import symneuron as sn
from symneuron import binding_recurrent
from symneuron import recurrent as rec
from symneuron.binding_loop import LoopProducts
from symneuron.runtime import cpu

pytestmark = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")


def _run(
    fused: bool | None,
    backend: str = "cpu",
    device: str = "cpu",
    per_step: bool | None = None,
    mask: torch.Tensor | None = None,
) -> dict:
    """``per_step``: the layer's own choice of path replaced (True: the loop with dL/dR
    summed once, as a large layer in a CUDA graph capture takes it)."""
    torch.manual_seed(61)
    layer = sn.RecurrentNeuronLayer(
        sn.models.ALIF(learnable=["tau"]),
        12,
        backend=backend,
        bias=True,
        delay=2,
        fused=fused,
        mask=mask,
    ).to(device=device, dtype=torch.float64)
    if per_step is not None:
        layer._per_step = lambda x_seq: per_step  # type: ignore[method-assign]
        layer._defers = lambda x_seq: per_step  # type: ignore[method-assign]
    with torch.no_grad():
        layer.weight.mul_(3.0)
    x = 1.3 * torch.rand(14, 3, 12, generator=generator(62), dtype=torch.float64)
    x = x.to(device).requires_grad_()
    s = layer(x)
    s.sum().backward()
    grads = {name: p.grad for name, p in layer.named_parameters()}
    return {"s": s.detach(), "x": x.grad, **grads}


def test_the_loop_over_steps_gives_the_fused_results(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = binding_recurrent.run
    monkeypatch.setattr(binding_recurrent, "run", lambda *a, **k: calls.append(1) or real(*a, **k))
    fused = _run(True)
    assert calls == [1]
    loop = _run(False)
    assert calls == [1], "fused=False must not launch the fused kernels"
    assert 0 < float(fused["s"].mean()) < 0.8
    assert torch.equal(loop["s"], fused["s"])
    for key in fused:
        torch.testing.assert_close(loop[key], fused[key], rtol=1e-12, atol=1e-12, msg=key)


@pytest.mark.parametrize("masked", [False, True])
def test_the_loop_chosen_by_size_sums_the_weight_gradient_once(masked: bool) -> None:
    """Where the layer chose the loop (a large layer in a CUDA graph capture), dL/dR is
    one product over the sequence after every step's backward
    (:class:`~symneuron.binding_loop.LoopProducts`): the same results as the fused
    kernels' (delay 2, a bias, a learnable τ, and a mask)."""
    mask = (torch.rand(12, 12, generator=generator(67)) < 0.7).double() if masked else None
    fused = _run(True, mask=mask)
    chosen = _run(None, per_step=True, mask=mask)
    assert torch.equal(chosen["s"], fused["s"])
    assert set(chosen) == set(fused)
    for key in fused:
        torch.testing.assert_close(chosen[key], fused[key], rtol=1e-12, atol=1e-12, msg=key)


def test_the_deferred_weight_gradient_refuses_a_double_backward() -> None:
    """A gradient through the loop's deferred products taken with create_graph=True
    raises: R's second-order terms would be missing (the neuron here on the torch
    reference, which differentiates twice; the kernels' step raises too)."""
    layer = sn.RecurrentNeuronLayer(sn.models.LIF(), 6, backend="torch").double()
    layer._per_step = layer._defers = lambda x_seq: True  # type: ignore[method-assign]
    x = 1.3 * torch.rand(5, 2, 6, generator=generator(68), dtype=torch.float64)
    x.requires_grad_()
    with pytest.raises(RuntimeError, match="create_graph=True .* backend='torch'"):
        torch.autograd.grad(layer(x).sum(), layer.weight, create_graph=True)
    assert torch.autograd.grad(layer(x).sum(), layer.weight)[0].abs().sum() > 0


def test_the_deferred_products_leave_no_reference_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the garbage collector off (as in a timed loop), a call's products are freed
    with its graph: none is left after three calls (a cycle through the graph would keep
    every call's spikes and gradients)."""
    alive = weakref.WeakSet()
    real = LoopProducts.__init__
    monkeypatch.setattr(LoopProducts, "__init__", lambda self, w: alive.add(self) or real(self, w))
    layer = sn.RecurrentNeuronLayer(sn.models.LIF(), 6, backend="cpu").double()
    layer._per_step = layer._defers = lambda x_seq: True  # type: ignore[method-assign]
    x = 1.3 * torch.rand(5, 2, 6, generator=generator(70), dtype=torch.float64)
    was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(3):
            layer.reset()
            layer(x).sum().backward()
        layer.reset()
        assert len(alive) == 0
    finally:
        if was:
            gc.enable()


def test_a_retained_graph_gives_the_same_weight_gradient_twice() -> None:
    layer = sn.RecurrentNeuronLayer(sn.models.LIF(), 6, backend="cpu").double()
    layer._per_step = layer._defers = lambda x_seq: True  # type: ignore[method-assign]
    x = 1.3 * torch.rand(5, 2, 6, generator=generator(69), dtype=torch.float64)
    out = layer(x).sum()
    first = torch.autograd.grad(out, layer.weight, retain_graph=True)[0]
    second = torch.autograd.grad(out, layer.weight)[0]
    assert first.abs().sum() > 0 and torch.equal(first, second)


def test_by_default_eager_calls_take_the_fused_kernels() -> None:
    layer = sn.RecurrentNeuronLayer(sn.models.LIF(), 8, backend="cpu")
    assert layer.fused is None and not layer._per_step(torch.rand(3, 2, 8))
    with pytest.raises(TypeError):
        sn.RecurrentNeuronLayer(sn.models.LIF(), 8, fused="yes")  # type: ignore[arg-type]


def test_eager_the_loop_runs_for_many_rows_of_a_wide_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager, the loop over steps from EAGER_LOOP_FROM batch rows × size² (measured
    faster there), in 16-bit only where the layer has more rows than the GPU has SMs;
    else the fused kernels."""
    props = type("Props", (), {"multi_processor_count": 132})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    bf16, fp32 = torch.empty(0, dtype=torch.bfloat16), torch.empty(0)
    assert rec._loop_eager(256, 4096, bf16) and rec._loop_eager(512, 2048, bf16)
    assert not rec._loop_eager(128, 4096, bf16)  # rows a wave of blocks holds
    assert rec._loop_eager(128, 4096, fp32)  # the exact multiply-adds' fused backward
    assert not rec._loop_eager(256, 2048, bf16) and not rec._loop_eager(256, 2048, fp32)
    assert not rec._loop_eager(64, 4096, fp32)  # under EAGER_LOOP_FROM
    assert rec.EAGER_LOOP_FROM == 2**31 and rec._loop_eager(133, 4096, bf16)


def test_only_a_captured_loop_sums_the_weight_gradient_once() -> None:
    """The loop sums dL/dR once only where the layer chose it inside a CUDA graph capture:
    eager (and on the CPU) and with ``fused=False`` each step's product gives its own."""
    x = torch.rand(2, 3, 8)
    for fused in (None, False):
        layer = sn.RecurrentNeuronLayer(sn.models.LIF(), 8, backend="cpu", fused=fused)
        assert not layer._defers(x)


@pytest.mark.cuda
def test_eager_a_wide_layer_of_many_rows_runs_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A layer of EAGER_LOOP_FROM rows × size² (float64, where the fused kernels refuse a
    layer this wide) runs the loop eager: its spikes and gradients are those of
    ``fused=False``'s loop."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    size = 4096
    rows = max(sms + 1, -(-rec.EAGER_LOOP_FROM // size**2))
    x = 1.2 * torch.rand(3, rows, size, generator=generator(65), dtype=torch.float64).cuda()
    got, deferred = {}, []
    real = rec._recurrent_input
    monkeypatch.setattr(rec, "_recurrent_input", lambda w, d: deferred.append(d) or real(w, d))
    for fused in (None, False):
        torch.manual_seed(66)
        layer = sn.RecurrentNeuronLayer(sn.models.LIF(), size, backend="cuda", fused=fused)
        layer = layer.cuda().double()
        xg = x.clone().requires_grad_()
        out = layer(xg)
        out.sum().backward()
        got[fused] = (out.detach(), xg.grad, layer.weight.grad)
    assert deferred == [False, False]  # (eager: each step's dL/dR, as a plain loop's)
    assert got[None][0].sum() > 0 and torch.equal(got[None][0], got[False][0])
    for a, b in zip(got[None][1:3], got[False][1:3], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.cuda
def test_a_large_layer_in_a_cuda_graph_runs_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside a capture, a layer of LOOP_FROM batch rows × size² or more runs the loop over
    steps (measured faster there); replayed, its spikes equal the eager fused call's."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    size, rows = 1024, -(-rec.LOOP_FROM // 1024**2)
    x = 1.2 * torch.rand(20, rows, size, generator=generator(63), dtype=torch.float64).cuda()
    outs = []
    for captured in (False, True):
        torch.manual_seed(64)
        layer = sn.RecurrentNeuronLayer(sn.models.LIF(), size, backend="cuda").cuda().double()
        loops: list[int] = []
        real = layer._loop
        monkeypatch.setattr(layer, "_loop", lambda *a, _l=loops, _r=real: _l.append(1) or _r(*a))
        with torch.no_grad():
            if not captured:
                outs.append(layer(x))
                assert loops == []
                continue
            layer(x[:1])  # warm-up (compiles) outside the capture
            layer.reset()
            graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.cuda.graph(graph):
                out = layer(x)
            torch.cuda.current_stream().wait_stream(stream)
            graph.replay()
            outs.append(out.clone())
            assert loops == [1]  # (the warm-up, eager, took the fused kernels)
    assert outs[0].sum() > 0
    assert torch.equal(outs[0], outs[1])


@pytest.mark.cuda
def test_a_captured_training_step_sums_the_weight_gradient_once() -> None:
    """A whole training step (forward, backward) of a large layer captured in a CUDA
    graph runs the loop with dL/dR summed once over the sequence; each replay's
    gradients (a new input copied in) equal the eager fused kernels' (float64)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    size, rows = 1024, -(-rec.LOOP_FROM // 1024**2)
    draws = [
        1.2 * torch.rand(12, rows, size, generator=generator(71 + i), dtype=torch.float64)
        for i in range(2)
    ]
    torch.manual_seed(72)
    layer = sn.RecurrentNeuronLayer(sn.models.LIF(), size, backend="cuda", bias=True).cuda()
    layer = layer.double()
    static = draws[0].cuda().requires_grad_()

    def step() -> torch.Tensor:
        layer.reset()
        for p in layer.parameters():
            p.grad = None
        static.grad = None
        out = layer(static)
        (out * torch.linspace(0, 1, size, device="cuda", dtype=torch.float64)).sum().backward()
        return out

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up (compiles) outside the capture: eager, the fused kernels
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    deferred: list[bool] = []
    real = rec._recurrent_input
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rec, "_recurrent_input", lambda w, d: deferred.append(d) or real(w, d))
        with torch.cuda.graph(graph):
            out = step()
    assert deferred == [True]
    captured = [out, static.grad, layer.weight.grad, layer.bias.grad]  # the graph's memory
    for x in draws:
        with torch.no_grad():
            static.copy_(x.cuda())
        graph.replay()
        got = [t.clone() for t in captured]
        want = step()  # eager: the fused kernels
        wanted = [want.detach(), static.grad, layer.weight.grad, layer.bias.grad]
        assert got[0].sum() > 0 and torch.equal(got[0], wanted[0])
        for a, b in zip(got[1:], wanted[1:], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_the_binding_computes_the_connections_partials() -> None:
    """The recurrent binding computes dL/dR as one product g ⊗ s and passes dL/dX_eff on
    as dL/dx: what the dense connection's derived partials say."""
    from symneuron.derivation.connection import dense

    spec = dense()
    assert spec.weight_gradient_is_product and spec.input_partial == 1
