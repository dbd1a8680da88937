"""The passes of a connection: one launch per sequence each way, one block per batch row
(:mod:`symneuron.codegen.connection` prints the kernels).

A row of ``F`` neurons runs on one block of ``ceil(F / K)`` threads (K lanes each: 1,
or the dtype's vector width when F exceeds :data:`MAX_THREADS`), with the values its
neurons exchange each step (spikes forward, gradients backward) in a ring of D + 1
slots of shared memory, D the connection's delay: the pass's
:class:`~symneuron.codegen.layout.RowLayout`, evaluated here for the launch as the
kernel evaluates it. On the CPU one thread runs a row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

import torch

from .. import dtypes
from ..codegen import connection, grid, mma
from ..codegen.layout import CHUNK, N_WORDS, ROW_THREADS, evaluate
from ..memo import BoundedTable
from ..signature import GBACKWARD, GFORWARD, RBACKWARD, RFORWARD, Geometry, Variant
from .kernels import Program

__all__ = ["MAX_THREADS", "max_features", "forward", "backward", "geometry"]

#: threads of one block (CUDA's limit)
MAX_THREADS = 1024
#: threads a neuron's transposed product is spread over in the backward (at most)
BACKWARD_PARTS = 4
#: rows of at least this many neurons (a multiple of the dtype's width) take the
#: dtype's width per thread: 16-byte loads of the weights
WIDE_FROM = MAX_THREADS + 1
#: neurons of one row the single-kernel path takes
MAX_FEATURES = 4096


def max_features(backend: str, dtype: torch.dtype) -> int:
    """The largest layer the fused kernels run on ``backend`` in ``dtype`` (the C kernels
    keep a row's state on the heap: any size)."""
    if backend != "cuda":
        return 2**62
    return min(MAX_FEATURES, MAX_THREADS * dtypes.lookup(backend, dtype).lanes)


def _lanes(prog: Program, features: int, dtype: torch.dtype) -> int:
    """Neurons per thread: 1, or the dtype's width for a row wider than a block."""
    limit = max_features(prog.backend, dtype)
    if features > limit:
        raise ValueError(
            f"symneuron: the fused recurrent kernels run layers of up to {limit} neurons "
            f"on backend={prog.backend!r} in {dtypes.dtype_name(dtype)} with one block per "
            f"batch row, and wider ones as a grid of blocks only while the batch rows × "
            "neurons fit the GPU's threads at once; this layer has "
            f"{features} neurons. Use backend='torch' (a loop over steps) for it, a smaller "
            "batch per call, or a smaller layer."
        )
    if not prog.impl.simt:
        return 1
    width = dtypes.lookup(prog.backend, dtype).lanes
    if features >= WIDE_FROM and features % width == 0:
        return width
    if features <= MAX_THREADS:
        return 1
    if features % width:
        raise ValueError(
            f"symneuron: a recurrent layer of more than {MAX_THREADS} neurons on CUDA takes "
            f"{width} per thread in {dtypes.dtype_name(dtype)}: its size must be a multiple "
            f"of {width}, got {features}"
        )
    return width


def _values(
    prog: Program, variant: Variant, first: torch.Tensor, features: int, delay: int
) -> dict[str, int]:
    """The integers a row kernel's layout formulas read, for one launch."""
    row = dtypes.lookup(prog.backend, first.dtype)
    values = {"F": features, "D": delay, "K": variant.lanes}
    values["row_threads"] = evaluate(ROW_THREADS, values)
    values["n_words"] = evaluate(N_WORDS, values)
    parts = 1
    if variant.pass_.kind == "backward":
        parts = max(1, min(BACKWARD_PARTS, MAX_THREADS // values["row_threads"]))
    values["n_parts"] = parts
    values["cs"] = row.torch_compute.itemsize
    values["ss"] = first.element_size()
    return values


#: (variant, dtype, device, rows, F, D) -> its launch geometry (host time: computed once)
_GEOMETRIES: BoundedTable[tuple[Any, ...], Geometry] = BoundedTable(1024, "runtime.rows.geometries")


def geometry(
    prog: Program, variant: Variant, first: torch.Tensor, features: int, delay: int
) -> Geometry:
    """:func:`launch_geometry`, kept per variant, dtype, device and sizes."""
    key = (variant, first.dtype, first.device, first.shape[1], features, delay)
    found = _GEOMETRIES.get(key)
    if found is None:
        found = _GEOMETRIES.put(key, launch_geometry(prog, variant, first, features, delay))
    return found


def launch_geometry(
    prog: Program, variant: Variant, first: torch.Tensor, features: int, delay: int
) -> Geometry:
    """One block per row: a thread per K neurons (rounded up to whole warps); the
    backward gives each neuron up to 4 threads for its transposed product, while they
    fit a block. Shared memory: the pass's layout, and in the backward then as many rows
    of the weight as fit (the kernel reads the rest from L2)."""
    values = _values(prog, variant, first, features, delay)
    threads = values["row_threads"] * values["n_parts"]
    rows = first.shape[1] // features
    plan = connection.layout(variant, votes=True)
    if variant.pass_.kind == "forward":
        return Geometry(rows, threads, plan.total(values))
    base = plan.offset("cache", values)
    whole = base + values["n_parts"] * evaluate(CHUNK, values) * features * values["ss"]
    room = _shared_room(first.device.index, rows, threads)
    if base > room:
        raise ValueError(
            f"symneuron: a recurrent layer of {features} neurons with delay {delay} needs "
            f"{base} bytes of shared memory per batch row in the backward (a ring of "
            f"delay + 1 steps of gradients), more than the {room} this GPU gives a block; "
            "use a shorter delay, a smaller layer, or backend='torch'."
        )
    return Geometry(rows, threads, max(base, min(whole, room)))


#: per pass, layers of at least this many neurons run as grid kernels on CUDA; every
#: layer wider than one block per row holds (:func:`max_features`) does. Measured on an
#: H200 (docs/performance_recurrent.md): the grid backward is faster from 1024 neurons
#: (1.1x at 256 x 1024, 1.8x at 128 x 2048) and slower below; the grid forward's gather
#: is slower than one block per row's wherever both run (on tensor cores it is not:
#: :data:`MMA_FORWARD_FROM`).
GRID_FROM = {"forward": 2**62, "backward": 1024}
#: layers of at least this many neurons run the forward as a grid kernel where its
#: product runs on tensor cores (:func:`_tensor_cores`) and the block's slice of the
#: weight fits its shared memory whole. Measured on an H200 (bf16 forward, T = 100, ms,
#: one block per row / grid on tensor cores): 64 × 512 0.45 / 0.57; 256 × 512 0.79 /
#: 1.20; 64 × 1024 1.35 / 0.70; 256 × 1024 2.67 / 1.65; 128 × 2048 2.49 / 2.15;
#: 64 × 4096, where the slice does not fit, 7.94 / 7.92
MMA_FORWARD_FROM = 1024
#: layers of at least this many neurons run the backward as a grid kernel where its
#: product runs on tensor cores (below :data:`GRID_FROM`'s, where the multiply-adds'
#: grid backward is slower than one block per row's). Measured on an H200 (bf16
#: backward, T = 100, ms, one block per row / grid on tensor cores): 64 × 256 0.33 /
#: 0.48; 16 × 512 1.23 / 0.47; 64 × 512 1.28 / 0.57; 256 × 512 2.66 / 0.70
MMA_BACKWARD_FROM = 512
#: the most neurons of a row the grid backward stages at a time, and the most where the
#: weight's slice does not fit whole beside them (:func:`_tile`). Measured on an H200
#: (bf16 backward, T = 100, ms, tiles of 128 / 256 / 512 neurons): 256 × 1024 2.71 /
#: 2.22 / 2.02; 128 × 2048 5.40 / 4.64 / (392 neurons: 5.44)
MAX_TILE, MIN_TILE = 512, 128


class Span(NamedTuple):
    """How a grid kernel spreads a layer: ``S`` neurons of a row per block (``n_slices``
    blocks a row), ``groups`` groups of ``rows_per_block`` batch rows, ``threads`` per
    block."""

    S: int  # noqa: N815 (the kernel argument's name)
    groups: int
    rows_per_block: int
    threads: int
    n_slices: int
    TK: int = 0  # noqa: N815 (the kernel argument's name)

    @property
    def blocks(self) -> int:
        return self.groups * self.n_slices


def grid_span(features: int, rows: int, lanes: int, sms: int) -> Span | None:
    """The grid kernel's spread of ``rows`` batch rows of ``features`` neurons over at most
    ``sms`` blocks (one per SM, so that every block is resident), ``lanes`` neurons per
    thread: the fewest groups of rows (each weight read then serves the most rows) whose
    neurons' threads fit a block (:func:`span_of`). None: no spread fits."""
    for groups in range(1, rows + 1):
        if sms // groups == 0:
            return None
        span = span_of(groups, features, rows, lanes, sms)
        if span is not None:
            return span
    return None


def span_of(groups: int, features: int, rows: int, lanes: int, sms: int) -> Span | None:
    """``groups`` groups of rows, each over ``sms // groups`` blocks: a power of two
    neurons of a row per block (the backward's warps split them evenly),
    :data:`~symneuron.codegen.grid.THREADS` threads a block (those that own no neuron help
    with the product). None: a group's neurons need more threads than a block has."""
    slices = sms // groups
    if slices == 0:
        return None
    size = max(lanes, 1 << (-(-features // slices) - 1).bit_length())
    per_block = -(-rows // groups)
    if per_block * (size // lanes) > grid.THREADS:
        return None
    return Span(size, groups, per_block, grid.THREADS, -(-features // size))


def backward_span(
    features: int, rows: int, lanes: int, sms: int, room: int, sizes: tuple[int, int]
) -> Span | None:
    """The grid backward's spread: the most groups of rows whose block's slice of the
    weight (``sizes``: the compute and storage dtypes' bytes) still fits its shared memory
    whole beside the tile, else :func:`grid_span`'s. Each block stages the gradients of
    all its rows and neurons every step, so fewer rows a block means less of that
    traffic, while a slice read from L2 costs more than that saves (measured on an H100,
    fp32 backward, ms for T = 100: 256 × 1024: 7.40 with 1 group, 4.86 with 2, 4.04 with
    4 (its slice fits); 128 × 2048: 9.17, 8.34 (half its slice from L2), 10.9; 64 × 4096:
    24.0, 42.4, 80.7)."""
    compute, storage = sizes
    best = grid_span(features, rows, lanes, sms)
    for groups in range(2, rows + 1):
        if sms // groups == 0:
            break
        span = span_of(groups, features, rows, lanes, sms)
        tk = None if span is None else _tile(span, features, room, sizes)
        if span is None or tk is None:
            continue
        if _tile_bytes(span, features, tk, sizes) + span.S * features * storage > room:
            break
        best = span
    return best


def forward_span(
    features: int, rows: int, lanes: int, sms: int, fits: Callable[[Span], bool]
) -> Span | None:
    """The grid forward's spread on tensor cores: the most groups of rows (the widest
    slice a block) whose slice ``fits`` whole, whose units fit a block's warps and whose
    blocks hold 16 rows (an mma's) where the batch has them. Each block makes the A
    fragments of its rows over all F neurons from their spike words, so a slice twice as
    wide halves that work, and each A fragment serves twice the column tiles. None: no
    such spread."""
    best = None
    for groups in range(1, rows + 1):
        if sms // groups == 0:
            break
        span = span_of(groups, features, rows, lanes, sms)
        if span is None or not _units_fit(span):
            continue
        if span.rows_per_block < min(16, rows):
            break
        if not fits(span):
            if best is not None:
                break
            continue
        best = span
    return best


class Spread(NamedTuple):
    """A grid kernel's launch: its spread, geometry, lanes and (the backward) product
    and bytes of a value its ring of gradients keeps."""

    span: Span
    geometry: Geometry
    lanes: int
    product: str = "fma"
    ring: int = 0


#: (device, F, rows, lanes, dtype, backward, tensor cores allowed) -> (the launch or
#: None,) (host time)
_SPANS: BoundedTable[tuple[Any, ...], tuple[Spread | None]] = BoundedTable(
    1024, "runtime.rows.spans"
)


def _grid_launch(
    prog: Program, first: torch.Tensor, features: int, backward: bool = False
) -> Spread | None:
    """The grid kernel's launch for a call whose first tensor is ``first`` [T, rows·F]
    (of the ``backward`` or the forward), or None where one block per row runs it (the C
    backend, a layer under :data:`GRID_FROM` neurons that one block per row holds, or no
    spread that fits the GPU)."""
    if not prog.impl.simt:
        return None
    cores = _tensor_cores(first)
    grid_from = GRID_FROM["backward" if backward else "forward"]
    least = min(grid_from, MMA_BACKWARD_FROM if backward else MMA_FORWARD_FROM)
    least = least if cores else grid_from
    held = features <= max_features(prog.backend, first.dtype)
    if features < least and held:
        return None
    rows = first.shape[1] // features
    width = dtypes.lookup(prog.backend, first.dtype).lanes
    lanes = width if features % width == 0 and first.data_ptr() % 16 == 0 else 1
    key = (first.device, features, rows, lanes, first.dtype, backward, cores)
    found = _SPANS.get(key)
    if found is None:
        found = _SPANS.put(key, (_spread(prog, first, features, rows, lanes, backward, cores),))
    spread = found[0]
    if spread is not None and held and features < grid_from and spread.product != "mma":
        return None  # one block a row: faster than the grid's gather or multiply-adds
    return spread


def _spread(
    prog: Program,
    first: torch.Tensor,
    features: int,
    rows: int,
    lanes: int,
    backward: bool,
    cores: bool,
) -> Spread | None:
    """The spread and launch: shared memory for the pass's tile, then as much of the
    weight's slice as fits (:class:`~symneuron.codegen.grid.GridLayout`); the product
    on tensor cores where ``cores`` and its units fit a block's warps, and in the
    forward where its slice fits whole (:data:`MMA_FORWARD_FROM`; else the gather)."""
    from .cuda import shared_limits

    optin, per_sm, sms, _ = shared_limits(first.device.index or 0)
    room = min(optin, per_sm - 1024)
    compute = dtypes.lookup(prog.backend, first.dtype).torch_compute.itemsize
    sizes = (compute, first.element_size())
    if backward:
        span = backward_span(features, rows, lanes, sms, room, sizes)
    else:
        span = grid_span(features, rows, lanes, sms)
    if span is None:
        return None
    product = "mma" if cores and _units_fit(span) else "fma"
    name = dtypes.dtype_name(first.dtype)
    plan = grid.backward_layout(name, product) if backward else grid.forward_layout(name, product)
    if not backward and product == "mma":

        def fits(wide: Span) -> bool:
            whole = wide.S * (features + plan.reserve) * sizes[1]
            return _tile_bytes(wide, features, 0, sizes, plan) + whole <= room

        found = forward_span(features, rows, lanes, sms, fits)
        if found is None:  # the gather
            return _spread(prog, first, features, rows, lanes, backward, cores=False)
        span = found
    tk = _tile(span, features, room, sizes, plan) if backward else 0
    if tk is None:
        return None
    tile = _tile_bytes(span, features, tk, sizes, plan)
    if tile >= room:
        return None
    whole = span.S * (features + plan.reserve) * first.element_size()
    shared = tile + min(whole, room - tile)
    launch = Geometry(span.blocks, span.threads, shared, cooperative=True)
    ring = sizes[plan.kind == "storage"]  # the ring holds the tile's values
    return Spread(span._replace(TK=tk), launch, lanes, product, ring)


def _units_fit(span: Span) -> bool:
    """Whether the tensor-core product's units (16 rows × up to
    :data:`~symneuron.codegen.mma.COLUMN_TILES` tiles of 8 columns) fit a block's warps."""
    groups = -(-span.S // (8 * mma.COLUMN_TILES))
    return -(-span.rows_per_block // 16) * groups <= span.threads // 32


#: whether the grid backward may run its product on tensor cores (:func:`_tensor_cores`)
TENSOR_CORES = True


def _tensor_cores(first: torch.Tensor) -> bool:
    """Whether the grid kernels sum a step's product on tensor cores for
    ``first``'s dtype and GPU (:mod:`symneuron.codegen.mma`): in 16-bit (exact
    products), in float32 where torch allows TF32 for matrix products
    (``torch.backends.cuda.matmul.allow_tf32``), on sm_80 or newer."""
    name = dtypes.dtype_name(first.dtype)
    if name not in mma.SHAPES or not TENSOR_CORES:
        return False
    if name == "float32" and not torch.backends.cuda.matmul.allow_tf32:
        return False
    return _capability(first.device.index or 0) >= 8


@functools.cache
def _capability(device: int) -> int:
    """The major compute capability of GPU ``device``."""
    return torch.cuda.get_device_capability(device)[0]


def _tile(
    span: Span,
    features: int,
    room: int,
    sizes: tuple[int, int],
    plan: grid.GridLayout = grid.GRID_BACKWARD,
) -> int | None:
    """The neurons of a row in the grid backward's tile (``sizes``: the compute and
    storage dtypes' bytes; ``plan`` the layout): where the weight's slice fits whole
    beside a tile of :data:`MIN_TILE`, as many as fit beside it, at most
    :data:`MAX_TILE` (fewer tiles a step: fewer barriers; a power of two); else at most
    half the room and :data:`MIN_TILE`. Whole 16-byte loads of a row (a narrower row:
    masked). None: too few to run, or the product's sums of a part (a slice of each row,
    in the compute type) would not fit the tile."""
    compute, storage = sizes
    size = {"compute": compute, "storage": storage}[plan.kind]
    per_neuron = span.rows_per_block * size
    beside = (room - span.S * (features + plan.reserve) * storage) // per_neuron - plan.pad
    if beside >= MIN_TILE:  # a power of two: tiles that divide a row of one
        tk = min(features, 1 << (min(MAX_TILE, beside).bit_length() - 1))
    else:
        tk = min(MIN_TILE, features, room // 2 // per_neuron - plan.pad)
    if tk < min(8, features):
        return None
    width = 16 // size
    tk = max(width, tk // width * width)
    return None if span.S * compute > (tk + plan.pad) * size else tk


def _tile_bytes(
    span: Span,
    features: int,
    tk: int,
    sizes: tuple[int, int],
    plan: grid.GridLayout = grid.GRID_BACKWARD,
) -> int:
    """The bytes of the pass's tile in a block of ``span`` (its layout's own formula)."""
    values = {"group_rows": span.rows_per_block, "F": features, "S": span.S}
    values["cs"], values["ss"] = sizes
    values["TK"] = tk
    return plan.tile_bytes(values)


def _scratch(like: torch.Tensor, nbytes: int) -> torch.Tensor:
    """A grid kernel's zeroed scratch: 16 bytes of barrier, then ``nbytes``."""
    return torch.zeros(16 + nbytes, dtype=torch.uint8, device=like.device)


def _shared_room(device: int | None, rows: int, threads: int) -> int:
    """Shared bytes a block of the backward may take without running its ``rows`` blocks
    in more waves than they would run in with none: all of a block's opt-in limit when
    each SM runs one block, else the SM's bytes over the blocks it must hold."""
    from .cuda import shared_limits

    optin, per_sm, sms, sm_threads = shared_limits(device or 0)
    blocks = max(1, min(sm_threads // threads, -(-rows // sms)))
    return min(optin, per_sm // blocks - 1024)  # the driver keeps 1 KB per block


_Maybe = TypeVar("_Maybe", torch.Tensor, None)


def _aligned(tensor: _Maybe) -> _Maybe:
    """``tensor``, copied when its start is not 16-byte aligned (a view with an offset):
    the kernels of several lanes per thread load 16 bytes at once."""
    return tensor if tensor is None or tensor.data_ptr() % 16 == 0 else tensor.clone()


def forward(
    prog: Program,
    x_seq: torch.Tensor,
    weight_t: torch.Tensor,
    s_init: torch.Tensor | None,
    v_init: torch.Tensor | None,
    w_init: torch.Tensor | None,
    params: Sequence[torch.Tensor],
    store_h: bool,
    v_mode: str,
    D: int = 1,  # noqa: N803 (the kernel argument's name)
    rng: torch.Tensor | None = None,
) -> Any:
    """The recurrent forward over ``x_seq`` [T, rows·F]: :data:`RFORWARD`'s outputs
    (those of :meth:`Program.forward` and X_eff [T, N] when stored for the backward).
    ``weight_t`` [F, F] is the effective weight transposed (contiguous); ``s_init``
    [D, N] the spikes of the D steps before the first (oldest first), D the delay; ``rng`` the
    generator's state of a neuron that draws (int64 [seed, offset])."""
    t_len, n = x_seq.shape
    features, delay = weight_t.shape[0], D
    x_seq = _aligned(x_seq)
    out = prog.forward_layout(x_seq, store_h, v_mode, RFORWARD).outputs(x_seq)
    if n == 0 or t_len == 0:
        return out
    values = {
        "x_seq": x_seq,
        "weight_t": weight_t,
        "s_init": s_init,
        "v_init": v_init,
        "w_init": w_init,
        "params": params,
        "param_strides": prog.check_params(params),
        "T": t_len,
        "N": n,
        "D": delay,
        "F": features,
        "rng": rng,
    }
    spread = _grid_launch(prog, x_seq, features)
    if spread is not None:
        span, launch, lanes = spread.span, spread.geometry, spread.lanes
        words = (delay + 2) * (n // features) * -(-features // 32)
        values["scratch"], values["S"], values["TK"] = _scratch(x_seq, 4 * words), span.S, span.TK
        options = (store_h, v_mode, spread.product)
        prog.run(GFORWARD, options, out, values, n, lambda *_: launch, lanes)
        return out
    lanes = _lanes(prog, features, x_seq.dtype)

    def blocks(variant: Variant, first: torch.Tensor) -> Geometry:
        return geometry(prog, variant, first, features, delay)

    prog.run(RFORWARD, (store_h, v_mode), out, values, n, blocks, lanes)
    return out


def backward(
    prog: Program, weight: torch.Tensor, delay: int = 1, rng: torch.Tensor | None = None
) -> Any:
    """The recurrent backward, as a function of :meth:`Program.backward`'s arguments
    (``weight`` [F, F] the effective weight, contiguous; ``rng`` the forward's generator
    state, so that it draws the forward's numbers); ``grad_spike`` must be a full [T, N]
    tensor."""
    features = weight.shape[0]

    def blocks(variant: Variant, first: torch.Tensor) -> Geometry:
        return geometry(prog, variant, first, features, delay)

    def run(
        grad_spike: torch.Tensor,
        grad_v_seq: Any,
        grad_w_seq: Any,
        h_seq: torch.Tensor,
        wt_seq: Any,
        x_seq: Any,
        v_init: Any,
        w_init: Any,
        params: Sequence[torch.Tensor],
        grad_v_mode: str,
    ) -> Any:
        t_len, n = h_seq.shape
        out = prog.backward_layout(h_seq, v_init, w_init, RBACKWARD).outputs(h_seq)
        if n == 0:
            return out
        values = {
            "grad_spike": _aligned(grad_spike.contiguous()),
            "grad_v_seq": _aligned(grad_v_seq),
            "grad_w_seq": _aligned(grad_w_seq),
            "h_seq": h_seq,
            "wt_seq": wt_seq,
            "x_seq": x_seq,
            "v_init": v_init,
            "w_init": w_init,
            "params": params,
            "weight": weight,
            "param_strides": prog.check_params(params),
            "grad_spike_scalar": 0,
            "T": t_len,
            "N": n,
            "D": delay,
            "F": features,
            "rng": rng,
        }
        spread = _grid_launch(prog, h_seq, features, backward=True)
        if spread is not None:
            span, launch, lanes, product, size = spread
            values["scratch"] = _scratch(h_seq, (delay + 1) * n * size)
            values["S"], values["TK"] = span.S, span.TK
            options = (grad_v_mode, product)
            prog.run(GBACKWARD, options, out, values, n, lambda *_: launch, lanes)
            return out
        lanes = _lanes(prog, features, h_seq.dtype)
        prog.run(RBACKWARD, (grad_v_mode,), out, values, n, blocks, lanes)
        return out

    return run
