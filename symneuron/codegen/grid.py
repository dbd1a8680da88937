"""The grid kernels of a connection: blocks that each own a slice of a row's neurons for
many batch rows, waiting for each other once a step.

One block per batch row (:mod:`.connection`) reads all of R each step, and each weight
read serves one row. A grid kernel spreads a layer the other way: block b owns neurons
[cs0, cs0 + S) of every row of its group of batch rows (``S`` a power of two) and keeps
those columns of R (the backward) or of Rᵀ (the forward) in shared memory, so each weight
it reads serves every row of the block. The values a step exchanges go through the
kernel's scratch in global memory, read after the step's grid barrier
(:meth:`~symneuron.codegen.dialects.Dialect.grid_barrier`):

* forward: the spikes of step t as bit words ([D + 2][B][n_words]: step t reads t − D,
  sets bits of t by atomic or and clears t + 1, which step t − 1 read last); each step
  the block's warps stage its rows' words of step t − D into shared memory;
* backward: dL/dX_eff as a ring of D + 1 steps ([D + 1][B][F]), staged each step in
  tiles of ``TK`` neurons of every row of the block; the product over a tile runs in the
  rows' threads and the threads that own no neuron (:func:`_tile_sum`).

The step itself is the pass's own printer, as in the row kernels. The runtime
(:mod:`symneuron.runtime.rows`) spreads a layer and sizes the shared memory from the
same :class:`GridLayout`.
"""

from __future__ import annotations

from typing import NamedTuple

from ..derivation.connection import DENSE, G_POST, W
from ..signature import Variant
from . import noise
from .backward import BackwardPrinter
from .connection import SLOTS, Product, add_to, backward_arrays
from .dialects import indent
from .forward import ForwardPrinter
from .layout import evaluate
from .steps import Stage, StepPrinter

__all__ = ["body", "GridLayout", "GRID_FORWARD", "GRID_BACKWARD", "STAGED", "PAD"]


#: a grid kernel's slots: the forward's D + 2 (step t reads t − D, writes t and clears
#: t + 1, which step t − 1 read last), the backward's D + 1 as a row kernel's
_GRIDSLOTS = {
    "forward": (
        ["int ring_now = 0, ring_next = 1, ring_before = 2 % (D + 2);"],
        [
            "ring_now = ring_next;",
            "ring_next = ring_next == D + 1 ? 0 : ring_next + 1;",
            "ring_before = ring_before == D + 1 ? 0 : ring_before + 1;",
        ],
    ),
    "backward": SLOTS["backward"],
}

#: where a grid kernel's scratch keeps its barrier counter and its exchanged values
_GRID_SCRATCH = [
    "unsigned int* sn_bar = (unsigned int*)scratch;",
    "unsigned int sn_passed = 0;  // the grid barriers this block has passed",
]


def _grid_forward(printer: ForwardPrinter, variant: Variant) -> list[str]:
    """The forward of a grid kernel: each step the block reads its rows' spike words of
    step t − D from global memory into shared memory (all its threads, coalesced),
    then each row's threads sum the spiking neurons' rows of the block's slice of
    ``weight_t``, kept in shared memory (the rest from L2): each weight read serves
    every row of the block. Spikes go to the words by atomic or."""
    d, st = printer.dialect, printer.dt.storage
    io = printer.io(variant, mutable=frozenset({"x_v"}))
    product = Product(printer)
    slot = "sn_words + ((long long){} * B + row) * n_words"
    words = [
        "unsigned int* sn_words = (unsigned int*)scratch + 4;  // [D + 2][B][n_words]",
        "unsigned int* sn_wtile = (unsigned int*)sn_smem;  // [group_rows][n_words]",
        *d.warp_lanes(),
    ]
    cached, uncached = (
        product.fetch("sn_wslice + m * S + (c0 - cs0)"),
        product.fetch("weight_t + m * F + c0"),
    )

    def fetch(values: str) -> list[str]:
        split = ["if (m < cached) {", *indent(cached(values)), "} else {"]
        return [*split, *indent(uncached(values)), "}"]

    words_of_row = "sn_wtile + local_row * n_words"
    gather = [*product.start(), *d.each_set(words_of_row, "n_words", st, fetch, product.use_spike)]
    stage = [
        "{  // this step's words of the block's rows, from L2 into shared memory",
        "    const unsigned int* src = sn_words + ((long long)ring_before * B + r0) * n_words;",
        "    for (long long lr = sn_warp; lr < group_rows && r0 + lr < B; lr += sn_warps) {",
        "        for (long long q = sn_lane; q < n_words; q += 32) {",
        f"            sn_wtile[lr * n_words + q] = {d.shared_load('src[lr * n_words + q]')};",
        "        }",
        "    }",
        "}",
        d.barrier(),
    ]
    xeff = f"if (xeff_seq) *({printer.vec}*)(xeff_seq + k) = x_v;"
    publish = d.lane_loop([f"if (s_v.v[j] != 0) {d.set_bit(slot.format('ring_now'), 'c0 + j')}"])
    step = printer.step(
        variant, io, Stage((*gather, *add_to(printer, "x_v"), xeff), tuple(publish))
    )
    first = f"s_init && {printer.load('s_init[(long long)i * N + i0 + j]')} != 0"
    history = [
        "for (int i = 0; i < D; ++i) {",
        *indent(
            d.lane_loop([f"if ({first}) {d.set_bit(slot.format('(i + 2) % (D + 2)'), 'c0 + j')}"])
        ),
        "}",
    ]
    next_words = slot.format("ring_next").replace("row", "r")
    clear = [
        "{  // the next step's words of this block's rows and slice",
        "    const long long q0 = (cs0 + 31) / 32;",
        "    const long long q1 = (cs0 + S + 31) / 32 < n_words ? (cs0 + S + 31) / 32 : n_words;",
        "    for (long long e = threadIdx.x; e < group_rows * (q1 - q0); e += blockDim.x) {",
        "        const long long r = r0 + e / (q1 - q0);",
        f"        if (r < B) ({next_words})[q0 + e % (q1 - q0)] = 0;",
        "    }",
        "}",
    ]
    return _grid(
        printer,
        variant,
        GRID_FORWARD,
        words,
        history,
        step,
        clear,
        printer.last(variant),
        printer.lane_arrays(),
        d.lane_loop(printer.lane_init()),
        before=stage,
    )


def _grid_backward(printer: BackwardPrinter, variant: Variant) -> list[str]:
    """The backward of a grid kernel: each step the block's threads read dL/dX_eff[t + D]
    of its rows from a ring in global memory, ``TK`` neurons of every row at a time
    (coalesced, several loads in flight per thread, into shared memory); then each
    row's threads sum the connection's transpose over them and the block's slice of
    ``weight`` kept in shared memory (the rest from L2): each weight read serves every
    row of the block. Then the rows' threads run the neurons' step with the sums."""
    d, ct = printer.dialect, printer.dt.compute
    io = printer.io(variant, mutable=frozenset({"gs_v"}))
    ring = [
        f"{ct}* sn_ring = ({ct}*)((unsigned int*)scratch + 4);  // [D + 1][B][F]",
        f"{ct}* sn_gtile = ({ct}*)sn_smem;  // [group_rows][TK + {PAD}], then the slice",
        *d.warp_lanes(),
        "const int tk = (int)TK;",
        "// threads a neuron: at most 4, their sums within the tile's room",
        "const int n_parts_room = 1 + (tk + 4) / (int)S;",
        "const int n_parts_max = (int)(blockDim.x / owners) < 4 ? (int)(blockDim.x / owners) : 4;",
        "const int n_parts = n_parts_max < n_parts_room ? n_parts_max : n_parts_room;",
        "const bool helping = part < n_parts && local_row < group_rows && row < B && c0 < F;",
        f"const int sn_chunk = ((tk + n_parts - 1) / n_parts + {3}) / 4 * 4;",
    ]
    transposed = [
        *Product(printer).start(),
        f"const {ct}* g_all = sn_ring + (long long)ring_before * B * F;",
        "for (int m0 = 0; m0 < F; m0 += tk) {",
        *indent(_stage_tile(printer)),
        "    if (helping) {",
        *indent(_tile_sum(printer), 2),
        "    }",
        "}",
        *_add_parts(printer),
    ]
    declared, loads = printer.row_loads(io)
    step = [
        "const long long k = (long long)t * N + i0;",
        *declared,
        *loads,
        f"{ct}* now = sn_ring + ((long long)ring_now * B + row) * F;",
        *add_to(printer, "gs_v"),
        *printer.lanes_step(variant, io),
        *d.lane_loop([f"now[c0 + j] = {printer.load('gx_v.v[j]')};"]),
    ]
    init = d.lane_loop(printer.lane_init() + printer.setup(io))
    return _grid(
        printer,
        variant,
        GRID_BACKWARD,
        ring,
        [],
        step,
        [],
        d.lane_loop(printer.final()),
        backward_arrays(printer, io),
        init,
        reverse=True,
        before=transposed,
    )


def _stage_tile(printer: BackwardPrinter) -> list[str]:
    """Every thread: the tile of neurons [m0, m0 + tk) of the block's rows' dL/dX_eff into
    shared memory. Each warp stages rows (:data:`STAGED` of them at once), its lanes the
    row's tk <= 32 · 4 neurons: STAGED · 4 loads in flight per thread, coalesced, no
    division."""
    d, ct = printer.dialect, printer.dt.compute
    load = d.shared_load("g_all[(r0 + lr) * F + m0 + mm]")
    pairs = [
        f"for (int a = 0; a < {STAGED}; ++a) {{",
        *indent(d.unroll()),
        "    for (int u = 0; u < 4; ++u) {",
        "        const int lr = lr0 + a * sn_warps, mm = sn_lane + 32 * u;",
        "{}",
        "    }",
        "}",
    ]

    def each_pair(body: str) -> list[str]:
        return [*d.unroll(), *[line.replace("{}", body) for line in pairs]]

    there = "lr < group_rows && mm < tk"
    return [
        d.barrier(),
        f"for (int lr0 = sn_warp; lr0 < group_rows; lr0 += {STAGED} * sn_warps) {{",
        f"    {ct} staged[{STAGED}][4];",
        *indent(
            each_pair(
                f"        staged[a][u] = {there} && r0 + lr < B && m0 + mm < F ? {load} : ({ct})0;"
            )
        ),
        *indent(
            each_pair(f"        if ({there}) sn_gtile[lr * (tk + {PAD}) + mm] = staged[a][u];")
        ),
        "}",
        d.barrier(),
    ]


def _tile_sum(printer: BackwardPrinter) -> list[str]:
    """A helping thread's part of the tile: the connection's transpose summed into its
    lanes' ``rec``. Each of the n_parts threads of a neuron takes its part of the tile
    (the threads that own no neuron help: up to 4 a neuron); the weight's cached rows with
    16-byte loads of the tile and the slice, the rest one by one, those past the cache
    from L2."""
    d, ct = printer.dialect, printer.dt.compute
    product = Product(printer)
    factor = f"sn_gtile[local_row * (tk + {PAD}) + m - m0]"
    width = 16 // (8 if ct == "double" else 4)  # the tile's 16-byte loads
    gvec, wvec = f"sn_vec<{ct}, {width}>", printer.vec
    term = [
        f"const {ct} {W} = {printer.load('w4.v[j]')};",
        f"rec[j] += {printer.expr(DENSE.transpose)};",
    ]
    vectors = [
        f"const {gvec} g4 = *(const {gvec}*)(sn_gtile + local_row * (tk + {PAD}) + m - m0);",
        *d.unroll(),
        f"for (int q = 0; q < {width}; ++q) {{",
        f"    const {wvec} w4 = *(const {wvec}*)(sn_wslice + (m + q) * S + (c0 - cs0));",
        f"    const {ct} {G_POST} = g4.v[q];",
        *indent(d.lane_loop(term)),
        "}",
    ]
    return [
        "const int lo = part * sn_chunk < tk ? part * sn_chunk : tk;",
        "const int hi = lo + sn_chunk < tk ? lo + sn_chunk : tk;",
        "const int ms = m0 + lo;",
        "const int m1 = m0 + hi < F ? m0 + hi : (int)F;",
        "const int mc = m1 < cached ? m1 : (ms > cached ? ms : cached);",
        f"const int mv = ms + (mc > ms ? (mc - ms) / {width} * {width} : 0);",
        f"for (int m = ms; m < mv; m += {width}) {{",
        *indent(vectors),
        "}",
        *product.dense("sn_wslice + m * S + (c0 - cs0)", factor, "m = mv; m < mc"),
        *product.dense("weight + m * F + c0", factor, "m = (mc > ms ? mc : ms); m < m1"),
    ]


def _add_parts(printer: BackwardPrinter) -> list[str]:
    """The helpers' sums, through the freed tile, added by each neuron's own thread in
    order of part (the result does not depend on timing)."""
    d = printer.dialect
    parts = "((part - 1) * owners + own) * K"
    return [
        d.barrier(),
        "if (helping && part > 0) {",
        *indent(d.lane_loop([f"sn_gtile[{parts} + j] = rec[j];"])),
        "}",
        d.barrier(),
        "if (active) {",
        "    for (int p = 1; p < n_parts; ++p) {",
        *indent(d.lane_loop([f"rec[j] += sn_gtile[{parts.replace('part', 'p')} + j];"]), 2),
        "    }",
        "}",
    ]


#: rows of each warp the grid backward stages at once (4 values a lane each, in flight)
STAGED = 2
#: the values a row of the staged tile is padded by: rows stay 16-byte aligned (vector
#: loads) and eight rows of a warp start in different banks
PAD = 4


class GridLayout(NamedTuple):
    """A grid kernel's shared memory: first a tile of ``tile`` values of ``kind`` per row
    of the block, then the slice of ``weight`` (``transposed``: as [S][cached + 1]
    against bank conflicts, else [cached][S]), as many of its rows as fit."""

    weight: str
    tile: str
    kind: str
    transposed: bool

    def tile_bytes(self, values: dict[str, int]) -> int:
        """The tile's bytes, rounded to 16, for a launch's values (its text's formula)."""
        size = {"word": 4, "compute": values["cs"]}[self.kind]
        return -(-values["group_rows"] * evaluate(self.tile, values) * size // 16) * 16


#: the forward's: the rows' spike words of the step, then rows m of Rᵀ's slice
GRID_FORWARD = GridLayout("weight_t", "(F + 31) / 32", "word", transposed=False)
#: the backward's: a tile of the rows' dL/dX_eff (TK neurons, padded by :data:`PAD`),
#: then R's slice
GRID_BACKWARD = GridLayout("weight", "TK + 4", "compute", transposed=False)


def _grid(
    printer: StepPrinter,
    variant: Variant,
    plan: GridLayout,
    exchange: list[str],
    history: list[str],
    step: list[str],
    between: list[str],
    last: list[str],
    arrays: list[tuple[str, str]],
    init: list[str],
    *,
    reverse: bool = False,
    before: list[str] | None = None,
) -> list[str]:
    """A grid kernel: the generator's state, the layout's tile and slice of the weight in
    shared memory, the ``exchange`` buffers in the scratch, the arrays and each
    thread's set-up and ``history``, a grid barrier; then the time loop (what every
    thread of the block runs ``before`` the step, the step in the threads that own
    neurons, the block's work ``between`` steps, a grid barrier), and each thread's
    ``last`` stores."""
    d = printer.dialect
    head = "for (int t = T - 1; t >= 0; --t) {" if reverse else "for (int t = 0; t < T; ++t) {"
    slots, advance = _GRIDSLOTS["backward" if reverse else "forward"]
    barrier = d.grid_barrier("sn_bar")
    loop = [*(before or []), *d.threads(arrays, step), *between, *barrier, *advance]
    tile = (
        "(long long)sizeof(unsigned int)"
        if plan.kind == "word"
        else f"(long long)sizeof({printer.dt.compute})"
    )
    return [
        *noise.state(printer.spec),
        *d.row_shared("0"),
        "const long long n_words = (F + 31) / 32;",
        f"const long long sn_tile_base = (group_rows * ({plan.tile}) * {tile} + 15) / 16 * 16;",
        *d.slice_cache(printer.dt.storage, plan.weight, "sn_tile_base", plan.transposed),
        *_GRID_SCRATCH,
        *exchange,
        *d.lane_arrays(arrays),
        *d.threads(arrays, [*init, *history]),
        *barrier,
        *slots,
        head,
        *indent(loop),
        "}",
        *(d.threads(arrays, last) if last else []),
    ]


def body(printer: StepPrinter, variant: Variant) -> list[str]:
    """The body of one block of a grid pass's kernel: the pass's own printer with the
    grid's exchange around its steps."""
    if isinstance(printer, ForwardPrinter):
        return _grid_forward(printer, variant)
    if isinstance(printer, BackwardPrinter):
        return _grid_backward(printer, variant)
    raise TypeError(f"a grid has no stage for the printer {type(printer).__name__}")
