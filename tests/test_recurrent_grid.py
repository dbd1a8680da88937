"""The recurrent layer's grid kernels: blocks that each own a slice of a row's neurons
for many batch rows, with a barrier of the whole grid each step
(:mod:`symneuron.runtime.rows`, :mod:`symneuron.codegen.connection`).

The oracle is the torch loop (``backend="torch"``) in float64: spikes identical and
every gradient within 1e-10, at the sizes the grid kernels take by default and, with
:data:`~symneuron.runtime.rows.GRID_FROM` lowered, at small sizes where the spread has
several groups of rows, slices that split a vote word and sizes that are no multiple
of the lanes.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from conftest import generator
from test_recurrent_kernels import _compare, _drive, _run
from torch.utils.checkpoint import checkpoint

import symneuron as sn
from symneuron import dtypes
from symneuron.codegen import grid, mma, render_source
from symneuron.derivation import derive
from symneuron.runtime import cpu, nvrtc
from symneuron.runtime import rows as rkernels
from symneuron.signature import GBACKWARD, GFORWARD

pytestmark = pytest.mark.skipif(not cpu.available(), reason="needs a C compiler")

#: both passes on the grid at every size
EVERYWHERE = {"forward": 1, "backward": 1}


SPREADS = [(1, 5, 1), (3, 40, 1), (3, 40, 4), (64, 256, 2), (128, 2048, 4), (2000, 16, 4)]


@pytest.mark.parametrize("sms", [1, 7, 132])
@pytest.mark.parametrize(("rows", "features", "lanes"), SPREADS)
def test_a_spread_covers_every_neuron_once(sms: int, rows: int, features: int, lanes: int) -> None:
    """Each (row, neuron) belongs to exactly one thread of one block, blocks <= SMs."""
    span = rkernels.grid_span(features, rows, lanes, sms)
    if span is None:  # only when the layer needs more threads than the SMs hold
        assert rows * features // lanes > sms * grid.THREADS // 2
        return
    assert span.blocks <= sms and span.threads == grid.THREADS
    assert span.threads % 32 == 0 and span.S % lanes == 0 and span.S & (span.S - 1) == 0
    _covers(span, rows, features, lanes)


#: an H100's shared memory a block may take (bytes)
ROOM = 232448


@pytest.mark.parametrize("sizes", [(4, 4), (8, 8), (4, 2)])
@pytest.mark.parametrize("sms", [7, 132])
@pytest.mark.parametrize(("rows", "features", "lanes"), SPREADS)
def test_the_backward_spread_covers_every_neuron_and_fits(
    sms: int, rows: int, features: int, lanes: int, sizes: tuple[int, int]
) -> None:
    """The backward's spread (more groups of rows while the weight's slice fits) still
    gives each (row, neuron) one thread of one resident block; with more than the fewest
    groups, the slice fits the shared memory whole."""
    span = rkernels.backward_span(features, rows, lanes, sms, ROOM, sizes)
    fewest = rkernels.grid_span(features, rows, lanes, sms)
    if fewest is None:
        assert span is None
        return
    assert span is not None and span.blocks <= sms and span.S % lanes == 0
    _covers(span, rows, features, lanes)
    if span.groups > fewest.groups:
        tile = span.rows_per_block * (min(128, features) + grid.PAD) * sizes[0]
        assert span.S * features * sizes[1] + tile <= ROOM


def test_the_backward_spreads_measured() -> None:
    """The spreads behind the measured choice (H100, fp32): 256 x 1024 in 4 groups of 64
    rows, 128 x 2048 and 64 x 4096 in one group (a wider slice would not fit)."""
    spans = {
        (b, f): rkernels.backward_span(f, b, 4, 132, ROOM, (4, 4))
        for b, f in [(256, 1024), (128, 2048), (64, 4096)]
    }
    assert {k: (s.groups, s.S) for k, s in spans.items() if s is not None} == {
        (256, 1024): (4, 32),
        (128, 2048): (1, 16),
        (64, 4096): (1, 32),
    }


def _covers(span: rkernels.Span, rows: int, features: int, lanes: int) -> None:
    """Each (row, neuron) belongs to exactly one thread of one block (the kernel's own
    formulas, CUDADialect.grid_kernels, from the launch's numbers)."""
    seen = torch.zeros(rows, features, dtype=torch.int64)
    slice_threads = span.S // lanes
    n_slices = -(-features // span.S)
    n_groups = span.blocks // n_slices
    group_rows = -(-rows // n_groups)
    for block in range(span.blocks):
        cs0 = (block % n_slices) * span.S
        for thread in range(0, span.threads):
            local_row = thread // slice_threads
            row = (block // n_slices) * group_rows + local_row
            c0 = cs0 + (thread % slice_threads) * lanes
            if local_row < group_rows and row < rows and c0 < features:
                seen[row, c0 : c0 + lanes] += 1
    assert torch.equal(seen, torch.ones_like(seen))


@pytest.mark.skipif(not nvrtc.nvrtc_available(), reason="needs NVRTC")
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("name", ["ALIF", "NoisyLIF"])
def test_grid_kernels_compile_in_every_dtype(name: str, dtype: str) -> None:
    neuron = sn.models.ALIF() if name == "ALIF" else sn.models.noisy.NoisyLIF()
    spec = derive(neuron)
    lanes = dtypes.lookup("cuda", dtype).lanes
    products = ["fma", "mma"] if dtype in mma.SHAPES else ["fma"]
    forward = [GFORWARD.variant(lanes, store_h=True, v_mode="seq", product=p) for p in products]
    backward = [GBACKWARD.variant(lanes, grad_v_mode="seq", product=p) for p in products]
    for variant in (*forward, *backward):
        source = render_source(spec, "cuda", dtype, variant)
        assert "sn_bar" in source and variant.exported(spec.name) in source
        nvrtc.compile_to_ptx(source)


# -- on the GPU ---------------------------------------------------------------------


def _spy(monkeypatch: pytest.MonkeyPatch, record: Any = None) -> list[str]:
    """What ``record(pass, options)`` says of each launch of the recurrent runtime (None:
    nothing); by default the pass's name."""
    seen: list[str] = []
    real = rkernels.Program.run

    def run(self, pass_, options, *args, **kw):  # type: ignore[no-untyped-def]
        said = record(pass_, options) if record else pass_.name
        if said is not None:
            seen.append(said)
        return real(self, pass_, options, *args, **kw)

    monkeypatch.setattr(rkernels.Program, "run", run)
    return seen


def _cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")


@pytest.mark.cuda
@pytest.mark.parametrize("delay", [1, 3])
@pytest.mark.parametrize("name", ["LIF", "ALIF"])
@pytest.mark.parametrize(("batch", "size"), [(3, 1024), (2, 2048), (5, 1030), (2, 2050)])
def test_grid_matches_the_loop_at_default_sizes(
    monkeypatch: pytest.MonkeyPatch, batch: int, size: int, name: str, delay: int
) -> None:
    """float64 layers wider than 2048 neurons (one block per row's limit) take the grid
    by default; the others are forced onto it."""
    _cuda()
    if size <= 2048:
        monkeypatch.setattr(rkernels, "GRID_FROM", EVERYWHERE)
    seen = _spy(monkeypatch)
    neuron = getattr(sn.models, name)(learnable=["tau"])
    x = 1.2 * torch.rand(12, batch, size, generator=generator(31), dtype=torch.float64)
    want = _run(neuron, "torch", x, size, scale=0.3, delay=delay)
    got = _run(neuron, "cuda", x, size, device="cuda", scale=0.3, delay=delay)
    _compare(got, want)
    assert "gforward" in seen and "gbackward" in seen


@pytest.mark.cuda
@pytest.mark.parametrize(("batch", "size"), [(3, 40), (1100, 8), (7, 37), (1, 5)])
def test_grid_matches_the_loop_at_any_spread(
    monkeypatch: pytest.MonkeyPatch, batch: int, size: int
) -> None:
    """Small layers forced onto the grid: several groups of rows (1100 x 8), slices
    that share a vote word, a row no multiple of the lanes (37), fewer neurons than
    blocks (5)."""
    _cuda()
    monkeypatch.setattr(rkernels, "GRID_FROM", EVERYWHERE)
    seen = _spy(monkeypatch)
    neuron = sn.models.ALIF(learnable=["tau"])
    x = 1.5 * torch.rand(10, batch, size, generator=generator(32), dtype=torch.float64)
    want = _run(neuron, "torch", x, size, delay=2)
    _compare(_run(neuron, "cuda", x, size, device="cuda", delay=2), want)
    assert "gforward" in seen and "gbackward" in seen


@pytest.mark.cuda
def test_grid_draws_the_loops_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda()
    monkeypatch.setattr(rkernels, "GRID_FROM", EVERYWHERE)
    neuron = sn.models.noisy.NoisyLIF(sigma=0.3)
    x = 1.2 * torch.rand(10, 3, 64, generator=generator(33), dtype=torch.float64)
    x = _drive(neuron, x) * x
    want = _run(neuron, "torch", x, 64, scale=0.3, seed=5)
    _compare(_run(neuron, "cuda", x, 64, device="cuda", scale=0.3, seed=5), want)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_grid_in_lower_precision_follows_the_float64_loop(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """float32: spikes as the float64 loop's (all but 1e-3 of them, an FMA order apart);
    16-bit: a flipped spike feeds back, so only their share is bounded (as for the row
    kernels, tests/test_recurrent_kernels.py)."""
    _cuda()
    monkeypatch.setattr(rkernels, "GRID_FROM", EVERYWHERE)
    x = 1.2 * torch.rand(8, 4, 1024, generator=generator(34), dtype=torch.float64)
    want = _run(sn.models.LIF(), "torch", x, 1024, scale=0.3)
    got = _run(sn.models.LIF(), "cuda", x, 1024, device="cuda", dtype=dtype, scale=0.3)
    flips = float((got["s"].double().cpu() != want["s"]).double().mean())
    assert flips <= {torch.float32: 1e-3, torch.float16: 0.05, torch.bfloat16: 0.1}[dtype]
    assert bool(torch.isfinite(got["weight"]).all())


@pytest.mark.cuda
def test_grid_in_a_cuda_graph_replays_the_eager_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A training step captured whole (a plain launch of the grid kernels inside the
    capture) replays the eager step's spikes and weight gradient."""
    _cuda()
    monkeypatch.setattr(rkernels, "GRID_FROM", EVERYWHERE)
    x = 1.2 * torch.rand(20, 8, 1024, generator=generator(35)).cuda()

    def build() -> sn.RecurrentNeuronLayer:
        torch.manual_seed(6)
        return sn.RecurrentNeuronLayer(sn.models.LIF(), 1024, backend="cuda").cuda()

    eager_layer = build()
    s = eager_layer(x)
    s.sum().backward()
    eager, eager_grad = s.detach(), eager_layer.weight.grad
    layer = build()

    def step() -> torch.Tensor:
        layer.reset()
        layer.weight.grad = None
        spikes = layer(x)
        spikes.sum().backward()
        return spikes.detach()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up (compiles) on a side stream, as torch's capture recipe does
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    torch.cuda.synchronize()
    assert eager.sum() > 0 and torch.equal(out, eager)
    torch.testing.assert_close(layer.weight.grad, eager_grad)


@pytest.mark.cuda
def test_grid_compiled_matches_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda()
    monkeypatch.setattr(rkernels, "GRID_FROM", EVERYWHERE)
    torch.manual_seed(7)
    layer = sn.RecurrentNeuronLayer(sn.models.LIF(), 1024, backend="cuda").cuda()
    x = 1.2 * torch.rand(10, 4, 1024, generator=generator(36)).cuda()
    eager = layer(x)
    layer.reset()
    compiled = torch.compile(layer, fullgraph=True)(x)
    assert torch.equal(compiled, eager)


#: layers whose grid backward takes each path of the tensor-core product: tiles of 16
#: rows and 8 columns cut by the block's rows or slice (3 x 1024, 7 x 37), a unit for
#: every warp of a block (500 x 8), part of the weight's slice read from L2 (2 x 4096),
#: a row no multiple of the lanes (2 x 1022, 7 x 37)
TENSOR_CORE_SIZES = [(3, 1024), (2, 1022), (2, 4096), (500, 8), (7, 37)]


def _fewest_groups(
    features: int, rows: int, lanes: int, sms: int, room: int, sizes: tuple[int, int]
) -> rkernels.Span | None:
    return rkernels.grid_span(features, rows, lanes, sms)


def _grid_products(pass_: Any, options: tuple[Any, ...]) -> str:
    """A launch's pass, and a grid pass's product."""
    return f"{pass_.name} {options[-1]}" if pass_.grid else pass_.name


def _products(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The products of the grid backwards the recurrent runtime launches."""
    return _spy(monkeypatch, lambda pass_, options: options[-1] if pass_ is GBACKWARD else None)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("batch", "size"), TENSOR_CORE_SIZES)
def test_the_tensor_core_product_follows_the_multiply_adds(
    monkeypatch: pytest.MonkeyPatch, batch: int, size: int, dtype: torch.dtype
) -> None:
    """The grid backward with its product on tensor cores (16-bit: exact products;
    float32: TF32, allowed for this test) against the same kernel by multiply-adds, on
    the same forward (one block per row: the same spikes): every gradient within the
    storage's rounding of a few sums in another order (16-bit: 2e-2 of the gradient's
    largest value; TF32's 10-bit operands: 5e-3). A wrong fragment, row or column gives
    errors of the gradients' own size."""
    if batch == 500:  # the fewest groups of rows: 500 rows a block, 32 units
        monkeypatch.setattr(rkernels, "backward_span", _fewest_groups)
    _follows(monkeypatch, sn.models.ALIF(learnable=["tau"]), batch, size, dtype)


@pytest.mark.cuda
def test_the_tensor_core_product_of_a_noisy_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A noisy layer's backward redraws the forward's noise beside the tensor cores'
    product (a learnable sigma: the draws enter its gradient)."""
    neuron, gain = _noisy()
    _follows(monkeypatch, neuron, 3, 1024, torch.bfloat16, gain=gain, seed=5)


def _noisy() -> tuple[sn.Neuron, float]:
    """A noisy neuron with a learnable sigma (its draws enter the gradient), and the
    input gain at which a 3 x 1024 layer of it fires."""
    neuron = sn.models.noisy.NoisyLIF(sigma=0.3, learnable=["sigma"])
    x = torch.rand(12, 3, 1024, generator=generator(37), dtype=torch.float64)
    return neuron, _drive(neuron, x)


def _follows(
    monkeypatch: pytest.MonkeyPatch,
    neuron: sn.Neuron,
    batch: int,
    size: int,
    dtype: torch.dtype,
    gain: float = 1.2,
    **kw: int,
) -> None:
    """The layer's gradients with the grid backward's product on tensor cores against
    those by multiply-adds, on the same forward (input ``gain`` · U(0, 1))."""
    _cuda()
    monkeypatch.setattr(rkernels, "GRID_FROM", {"forward": 2**62, "backward": 1})
    monkeypatch.setattr(rkernels, "MMA_FORWARD_FROM", 2**62)  # the same forward
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    products = _products(monkeypatch)
    x = gain * torch.rand(12, batch, size, generator=generator(37), dtype=torch.float64)
    got = _run(neuron, "cuda", x, size, device="cuda", dtype=dtype, scale=0.3, delay=2, **kw)
    assert products == ["mma"]
    monkeypatch.setattr(rkernels, "TENSOR_CORES", False)
    want = _run(neuron, "cuda", x, size, device="cuda", dtype=dtype, scale=0.3, delay=2, **kw)
    assert products == ["mma", "fma"]
    assert torch.equal(got["s"], want["s"]) and want["s"].sum() > 0
    bar = 5e-3 if dtype == torch.float32 else 2e-2
    for name in set(want) - {"s", "v"}:
        scale = float(want[name].abs().max())
        err = float((got[name].double() - want[name].double()).abs().max())
        assert 0 < scale and err <= bar * scale, (name, err, scale)


#: layers whose grid forward takes each path of the tensor-core product: as above, with
#: a row of 2048 neurons where one of 4096 would not fit its slice (the forward then
#: gathers); a row no multiple of 32 reads its last words' weights past F from L2
FORWARD_SIZES = [(3, 1024), (2, 1022), (2, 2048), (500, 8), (7, 37)]


def test_the_forward_takes_tensor_cores_where_its_slice_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bf16 on an H100's shared memory: 64 x 1024 on tensor cores, in 4 groups of 16
    rows (the widest slice, 32 neurons, whose blocks still hold an mma's 16 rows);
    64 x 4096 (a slice of 32 neurons: 266 KB) by the gather."""
    from symneuron.runtime import cuda

    monkeypatch.setattr(cuda, "shared_limits", lambda device: (ROOM, 233472, 132, 2048))
    prog: Any = type("Prog", (), {"backend": "cuda"})()
    found = {}
    for size in (1024, 4096):
        first = torch.empty(1, 64 * size, dtype=torch.bfloat16)
        spread = rkernels._spread(prog, first, size, 64, 4, backward=False, cores=True)
        assert spread is not None
        found[size] = (spread.span.S, spread.product)
    assert found == {1024: (32, "mma"), 4096: (32, "fma")}


@pytest.mark.parametrize(
    ("size", "dtype", "want"),
    [
        (256, torch.bfloat16, (None, None)),
        (512, torch.bfloat16, (None, "mma")),
        (1024, torch.bfloat16, ("mma", "mma")),
        (512, torch.float32, (None, None)),
        (1024, torch.float32, (None, "fma")),
        (8192, torch.bfloat16, ("fma", "mma")),
    ],
)
def test_the_grid_passes_by_size(
    monkeypatch: pytest.MonkeyPatch, size: int, dtype: torch.dtype, want: tuple[Any, Any]
) -> None:
    """Which pass runs on the grid, and with which product, by size (an sm_90 GPU with an
    H100's shared memory; float32 without TF32): one block per row (None) below
    MMA_FORWARD_FROM / MMA_BACKWARD_FROM in 16-bit and below GRID_FROM in float32; a
    layer wider than one block per row holds (8192 in bf16) on the grid in any case,
    its forward's slice too wide for tensor cores (the gather)."""
    from symneuron.runtime import cuda

    monkeypatch.setattr(cuda, "shared_limits", lambda device: (ROOM, 233472, 132, 2048))
    monkeypatch.setattr(rkernels, "_capability", lambda device: 9)
    assert not torch.backends.cuda.matmul.allow_tf32  # torch's default
    prog: Any = type("Prog", (), {"backend": "cuda", "impl": type("I", (), {"simt": True})})()
    first = torch.empty(1, 64 * size, dtype=dtype)
    spreads = [rkernels._grid_launch(prog, first, size, backward=b) for b in (False, True)]
    assert tuple(s and s.product for s in spreads) == want


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("batch", "size"), FORWARD_SIZES)
def test_the_tensor_core_forward_sums_as_the_gather(
    monkeypatch: pytest.MonkeyPatch, batch: int, size: int, dtype: torch.dtype
) -> None:
    """The grid forward with its product s · Rᵀ on tensor cores (float32: TF32, allowed
    for this test) against one block per row's gather over the spiking neurons, on
    weights whose every sum is exact (multiples of 2^-9 · 2^-e below 2^-e: exact in
    bf16, fp16 and TF32, and in float32 in any order), so that spikes, V and every
    gradient (the same backward, one block per row) are equal. A wrong bit, fragment,
    row or column gives other spikes."""
    _sums_as_the_gather(monkeypatch, sn.models.ALIF(learnable=["tau"]), batch, size, dtype)


@pytest.mark.cuda
def test_the_tensor_core_forward_of_a_noisy_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A noisy layer's grid forward on tensor cores draws one block per row's numbers."""
    neuron, gain = _noisy()
    _sums_as_the_gather(monkeypatch, neuron, 3, 1024, torch.bfloat16, gain=gain, seed=5)


def _sums_as_the_gather(
    monkeypatch: pytest.MonkeyPatch,
    neuron: sn.Neuron,
    batch: int,
    size: int,
    dtype: torch.dtype,
    gain: float = 1.2,
    **kw: int,
) -> None:
    """The layer on exact weights with its forward on tensor cores, then by one block per
    row's gather: every output and gradient equal."""
    _cuda()
    monkeypatch.setattr(rkernels, "GRID_FROM", {"forward": 2**62, "backward": 2**62})
    monkeypatch.setattr(rkernels, "MMA_BACKWARD_FROM", 2**62)  # the same backward
    monkeypatch.setattr(rkernels, "MMA_FORWARD_FROM", 1)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", True)
    passes = _spy(monkeypatch, lambda pass_, options: options[-1] if pass_ is GFORWARD else None)
    x = gain * torch.rand(12, batch, size, generator=generator(39), dtype=torch.float64)
    got = _exact_run(neuron, x, size, dtype, **kw)
    monkeypatch.setattr(rkernels, "TENSOR_CORES", False)
    want = _exact_run(neuron, x, size, dtype, **kw)
    assert passes == ["mma"]  # then one block per row
    assert want["s"].sum() > 0 and want["s"].mean() < 0.9
    for name in want:
        assert torch.equal(got[name], want[name]), name


def _exact_run(
    neuron: sn.Neuron, x: torch.Tensor, size: int, dtype: torch.dtype, **kw: int
) -> dict[str, torch.Tensor]:
    """A CUDA layer whose weights are multiples of 2^-9 · 2^-e below 2^-e (2^e about
    √size): its spikes, final V and gradients."""
    torch.manual_seed(4)
    layer = sn.RecurrentNeuronLayer(neuron, size, backend="cuda", bias=True, delay=2, **kw)
    layer = layer.to(device="cuda", dtype=dtype)
    scale = 2.0 ** -(9 + round(math.log2(math.sqrt(size))))
    steps = torch.randint(-255, 256, layer.weight.shape, generator=generator(40))
    with torch.no_grad():
        layer.weight.copy_(steps.to(dtype) * scale)
    xi = x.to(device="cuda", dtype=dtype).requires_grad_()
    s = layer(xi)
    (s * torch.linspace(-1, 1, size, dtype=dtype, device="cuda")).sum().backward()
    grads = {name: p.grad for name, p in layer.named_parameters() if p.grad is not None}
    return {"s": s.detach(), "v": layer.cell.v.detach(), "x": xi.grad, **grads}


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_the_grid_backward_checkpointed_graphed_and_compiled(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """A layer on the grid kernels, their products on tensor cores (bfloat16) or the
    gather and multiply-adds (float64), gives the eager call's spikes and gradients when
    checkpointed, captured in a CUDA graph and compiled."""
    _cuda()
    monkeypatch.setattr(rkernels, "GRID_FROM", {"forward": 2**62, "backward": 1})
    products = _spy(monkeypatch, _grid_products)
    x = (1.2 * torch.rand(10, 4, 1024, generator=generator(38))).cuda().to(dtype)
    torch.manual_seed(8)
    layer = sn.RecurrentNeuronLayer(sn.models.LIF(), 1024, backend="cuda").cuda().to(dtype)

    def step(call) -> tuple[torch.Tensor, ...]:  # type: ignore[no-untyped-def]
        layer.reset()
        layer.weight.grad = None
        xi = x.clone().requires_grad_()
        s = call(xi)
        (s.double() * torch.linspace(-1, 1, 1024, device="cuda").double()).sum().backward()
        return s.detach(), xi.grad, layer.weight.grad

    eager = step(layer)
    ways = {
        "checkpoint": step(lambda xi: checkpoint(layer, xi, use_reentrant=False)),
        "compile": step(torch.compile(layer, fullgraph=True)),
    }
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(layer)  # warm-up on a side stream, as torch's capture recipe does
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(layer)
    graph.replay()
    torch.cuda.synchronize()
    ways["graph"] = tuple(t.clone() for t in captured)
    if dtype == torch.bfloat16:
        assert set(products) == {"gforward mma", "gbackward mma"}
    else:  # one block per row's forward
        assert set(products) == {"rforward", "gbackward fma"}
    assert eager[0].sum() > 0
    for way, got in ways.items():
        assert torch.equal(got[0], eager[0]), way
        for a, b in zip(got[1:], eager[1:], strict=True):
            if way == "compile":  # the weight's gradient: inductor's own matrix product
                torch.testing.assert_close(a, b)
            else:
                assert torch.equal(a, b), way
