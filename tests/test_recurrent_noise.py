"""Noisy neurons in the fused recurrent layer (white noise and escape firing).

Oracle: the same :class:`~symneuron.RecurrentNeuronLayer` on ``backend="torch"`` (its
loop over steps, each a single-step call of the torch reference that draws the same
counter-based numbers), with the same seed and weight, in float64: spikes identical and
every gradient (input, recurrent weight, the learnable parameter) within 1e-10; in
float32 against the float32 loop, spikes identical and the rest to rounding. Reruns
of the kernels check the seed (same seed, same spikes; another, others) and the offset
(chunks of a sequence draw what one call draws).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import sympy as sp
import torch
from conftest import generator

import symneuron as sn
from symneuron import binding_recurrent
from symneuron.codegen.dialects import DIALECTS
from symneuron.codegen.skeleton import render
from symneuron.dtypes import lookup
from symneuron.runtime import cpu
from symneuron.signature import RBACKWARD, RFORWARD

pytestmark = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")

TAU, SIGMA = sp.symbols("tau sigma", positive=True)


def noisy_lif(**kw: object) -> sn.Neuron:
    """A discrete LIF with white noise in its charge (as tests/test_noise.py's)."""
    charge = sn.V + (sn.X - sn.V) / TAU + SIGMA * sn.noise
    return sn.Neuron(charge, params={TAU: 2.0, SIGMA: 0.3}, name="nlif", **kw)  # type: ignore[arg-type]


#: name -> (the neuron with a learnable parameter, an input scale at which it fires on
#: 5-20 % of its steps); NoisyLIF and EscapeLIF at dt = 1 ms so that 20 steps matter
MODELS: dict[str, tuple[Callable[[], sn.Neuron], float]] = {
    "NoisyLIF": (lambda: sn.models.NoisyLIF(dt=1.0, learnable=["sigma"]), 30.0),
    "discrete": (lambda: noisy_lif(learnable=["sigma"]), 2.0),
    "EscapeLIF": (lambda: sn.models.EscapeLIF(dt=1.0, learnable=["theta"]), 40.0),
}
SIZE, SPLIT = 8, 8  # neurons per row; the first call's steps


def _inputs(scale: float, t_len: int = 20, size: int = SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """An input [T, 2, size] and a recurrent weight [size, size] that matters (a spike
    moves its targets' input by up to a third of the drive at 8 neurons)."""
    x = scale * torch.rand(t_len, 2, size, generator=generator(3), dtype=torch.float64)
    weight = 2 * torch.rand(size, size, generator=generator(4), dtype=torch.float64) - 1
    return x, scale * weight / size**0.5


def _run(
    name: str,
    backend: str,
    seed: int = 5,
    splits: tuple[int, ...] = (SPLIT,),
    device: str = "cpu",
    dtype: torch.dtype = torch.float64,
    size: int = SIZE,
) -> dict[str, torch.Tensor]:
    """One layer of model ``name`` over the sequence in consecutive calls (``splits``:
    where each call after the first starts), its spikes, final V and gradients."""
    make, scale = MODELS[name]
    neuron = make()
    x, weight = _inputs(scale, size=size)
    layer = sn.RecurrentNeuronLayer(neuron, size, backend=backend, seed=seed)
    layer = layer.to(device=device, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
    xi = x.to(device=device, dtype=dtype).requires_grad_()
    bounds = [0, *splits, x.shape[0]]
    s = torch.cat([layer(xi[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)])
    readout = torch.linspace(-1, 1, size, dtype=dtype, device=device)
    (s * readout).sum().backward()
    grads = {n: p.grad for n, p in layer.named_parameters() if p.grad is not None}
    assert set(grads) == {"weight", f"cell.{neuron.learnable[0]}"}
    return {"s": s.detach(), "v": layer.cell.v.detach(), "x": xi.grad, **grads}


def _compare(got: dict, want: dict, tol: float = 1e-10) -> None:
    assert 0 < float(want["s"].mean()) < 0.5, "the oracle's layer must spike"
    assert torch.equal(got["s"].cpu(), want["s"].cpu())
    assert set(got) == set(want)
    for key in want:
        torch.testing.assert_close(got[key].cpu(), want[key].cpu(), rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(MODELS))
def test_cpu_kernels_draw_what_the_reference_loop_draws(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two calls (the second continues the offset): the fused kernels (one forward launch
    per call) give the loop's spikes and gradients."""
    calls = []
    real = binding_recurrent.RecurrentBinding.apply
    monkeypatch.setattr(
        binding_recurrent.RecurrentBinding, "apply", lambda *a: calls.append(1) or real(*a)
    )
    got = _run(name, "cpu")
    assert calls == [1, 1]
    _compare(got, _run(name, "torch"))


def _close_in_float32(got: dict, want: dict) -> None:
    """The same spikes; V and the gradients to 1e-4 of their scale (float32 rounding)."""
    assert torch.equal(got["s"].cpu(), want["s"])
    for key in want:
        scale = float(want[key].abs().max().clamp_min(1.0))
        assert float((got[key].cpu() - want[key]).abs().max()) <= 1e-4 * scale, key


@pytest.mark.parametrize("name", list(MODELS))
def test_float32_cpu_kernels_draw_what_the_float32_loop_draws(name: str) -> None:
    """float32 draws: the float64 ones rounded, the same in the kernels and the loop."""
    want = _run(name, "torch", dtype=torch.float32)
    assert 0 < float(want["s"].mean()) < 0.5
    _close_in_float32(_run(name, "cpu", dtype=torch.float32), want)


@pytest.mark.parametrize("name", list(MODELS))
def test_same_seed_same_spikes_other_seed_other_spikes(name: str) -> None:
    first, again, other = (_run(name, "cpu", seed=s)["s"] for s in (5, 5, 6))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@pytest.mark.parametrize("name", ["NoisyLIF", "EscapeLIF"])
def test_chunks_draw_what_one_long_call_draws(name: str) -> None:
    whole = _run(name, "cpu", splits=())
    chunked = _run(name, "cpu", splits=(3, 4, 11))
    assert torch.equal(chunked["s"], whole["s"])
    for key in whole:
        torch.testing.assert_close(chunked[key], whole[key], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["NoisyLIF", "EscapeLIF"])
def test_sn_check_of_a_recurrent_noisy_layer_passes(name: str) -> None:
    """sn.check(recurrent=True) seeds the kernel layer and the reference loop alike."""
    report = sn.check(MODELS[name][0](), backend="cpu", recurrent=True, seed=3)
    recurrent = [r for r in report.results if r.name.startswith("recurrent")]
    assert len(recurrent) >= 4 and all(r.passed for r in recurrent), str(report)


@pytest.mark.parametrize("compile_backend", ["eager", "aot_eager"])
def test_torch_compile_draws_what_eager_draws(compile_backend: str) -> None:
    """Compiled (fullgraph: the custom ops rforward and rbackward take the generator's
    state): the eager layer's spikes and gradients, over two calls."""
    torch._dynamo.reset()
    x, weight = _inputs(2.0)
    outs = []
    for compiled in (False, True):
        layer = sn.RecurrentNeuronLayer(
            noisy_lif(learnable=["sigma"]), SIZE, backend="cpu", seed=7
        ).double()
        with torch.no_grad():
            layer.weight.copy_(weight)
        run = torch.compile(layer, fullgraph=True, backend=compile_backend) if compiled else layer
        xi = x.clone().requires_grad_()
        s = torch.cat([run(xi[:SPLIT]), run(xi[SPLIT:])])
        s.sum().backward()
        outs.append((s.detach(), xi.grad, layer.weight.grad, layer.cell.sigma.grad))
    assert float(outs[0][0].sum()) > 0
    for got, want in zip(outs[1], outs[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_custom_op_with_the_generator_state_passes_opcheck() -> None:
    """torch.library.opcheck of symneuron::rforward given the state (schema, fake
    tensors, autograd registration)."""
    prog = sn.binding.program(noisy_lif(learnable=["sigma"]), "cpu")
    x = torch.rand(5, 12, dtype=torch.float64, generator=generator(16), requires_grad=True)
    w = torch.rand(6, 6, dtype=torch.float64, generator=generator(17), requires_grad=True)
    params = [torch.tensor(2.0, dtype=torch.float64), torch.tensor(0.3, dtype=torch.float64)]
    params[1].requires_grad_()
    rng = torch.tensor([11, 3], dtype=torch.int64)
    args = (x, w, None, None, None, params, 1, True, "seq", rng)
    torch.library.opcheck(binding_recurrent.rforward_op, (prog.key, "cpu", *args))


@pytest.mark.parametrize(
    "dtype",
    [  # NVRTC takes seconds a dtype: float32's in the quick run
        torch.float32,
        pytest.param(torch.bfloat16, marks=pytest.mark.slow),
        pytest.param(torch.float64, marks=pytest.mark.slow),
    ],
    ids=str,
)
def test_noisy_recurrent_cuda_sources_compile_with_nvrtc(dtype: torch.dtype) -> None:
    """The recurrent CUDA kernels of the noisy models draw (the rng state, the lanes'
    normals or the escape uniform) and compile."""
    nvrtc = pytest.importorskip("symneuron.runtime.nvrtc")
    for name, (make, _) in MODELS.items():
        spec = make().spec()
        source = render(spec, DIALECTS["cuda"], lookup("cuda", dtype), passes=(RFORWARD, RBACKWARD))
        # each variant (4 forwards, 3 backwards; K a template parameter) reads the state
        # once and draws in its step
        assert source.count("rng_offset = (sn_u64)rng[1];") == 7, name
        draw = "sn_rng_block(rng_seed" if name == "EscapeLIF" else "_l, rng_seed, rng_offset"
        assert source.count(draw) == 7, name
        if not nvrtc.nvrtc_available():
            pytest.skip("NVRTC not available")
        ptx = nvrtc.compile_to_ptx(source, name=f"{spec.name}_recurrent.cu")
        assert "_rforward_h_seq_k1" in ptx and "_rbackward_seq_k1" in ptx


# -- on a GPU (the lead runs these) -----------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(MODELS))
def test_cuda_kernels_draw_what_the_reference_loop_draws(name: str) -> None:
    """float64: the loop's spikes and gradients to 1e-10. float32 against the float32
    loop (the same float32 draws): the same spikes, V and gradients to 1e-4 of their
    scale (a few float32 ulps)."""
    _compare(_run(name, "cuda", device="cuda"), _run(name, "torch"))
    got = _run(name, "cuda", device="cuda", dtype=torch.float32)
    _close_in_float32(got, _run(name, "torch", dtype=torch.float32))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["NoisyLIF", "EscapeLIF"])
def test_cuda_wide_rows_draw_by_lane_groups_what_the_loop_draws(name: str) -> None:
    """2048 neurons a row in float32: four lanes a thread (one Philox block per group of
    four), the float32 loop's spikes; a wrong key would change about a tenth of them, an
    ulp of p(H) or H near the threshold at most a few (the C kernels in float32 here:
    none of the 81920). float64 (two lanes a thread): the loop's spikes and gradients."""
    _compare(_run(name, "cuda", device="cuda", size=2048), _run(name, "torch", size=2048))
    got = _run(name, "cuda", device="cuda", dtype=torch.float32, size=2048)
    want = _run(name, "torch", dtype=torch.float32, size=2048)
    assert float(want["s"].mean()) > 0.05
    assert float((got["s"].cpu() != want["s"]).double().mean()) <= 1e-3
