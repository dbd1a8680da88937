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
  the block's warps stage its rows' words of step t − D into shared memory, then sum
  the spiking neurons' weights by a gather, or the whole product on tensor cores
  (:func:`symneuron.codegen.mma.words_sum`);
* backward: dL/dX_eff as a ring of D + 1 steps ([D + 1][B][F]), staged each step in
  tiles of ``TK`` neurons of every row of the block; the product over a tile runs as a
  matrix product's micro-kernel by multiply-adds (:mod:`.fma`) or on tensor cores
  (:mod:`.mma`), so that each weight read from shared memory serves several rows.

The step itself is the pass's own printer, as in the row kernels. The runtime
(:mod:`symneuron.runtime.rows`) spreads a layer and sizes the shared memory from the
same :class:`GridLayout`.
"""

from __future__ import annotations

from typing import NamedTuple

from ..signature import Variant
from . import fma, mma, noise
from .backward import BackwardPrinter
from .connection import SLOTS, Product, add_to, backward_arrays
from .dialects import indent
from .forward import ForwardPrinter
from .layout import evaluate
from .steps import Stage, StepPrinter

__all__ = [
    "body",
    "GridLayout",
    "GRID_FORWARD",
    "GRID_BACKWARD",
    "FORWARD_PARTS",
    "forward_layout",
    "backward_layout",
    "PAD",
    "THREADS",
]


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
    ``weight_t``, kept in shared memory (the rest from L2), or (the ``product`` option
    ``mma``) the block's warps sum the dense product on tensor cores, its A fragments
    made from the staged words, each weight read serving 16 rows. Spikes go to the
    words by atomic or."""
    d = printer.dialect
    io = printer.io(variant, mutable=frozenset({"x_v"}))
    slot = "sn_words + ((long long){} * B + row) * n_words"
    words = [
        "unsigned int* sn_words = (unsigned int*)scratch + 4;  // [D + 2][B][n_words]",
        "unsigned int* sn_wtile = (unsigned int*)sn_smem;  // [group_rows][n_words]",
        *d.warp_lanes(),
    ]
    if variant.option("product") == "mma":
        stride = WORD_STRIDE  # rows in different banks: the mma's 8 rows a load
        words += _mma_words(printer)
        summed, gather = _mma_sums(printer), []
    else:
        stride = "n_words"
        summed, gather = [], _gather(printer)
    stage = [
        "{  // this step's words of the block's rows, from L2 into shared memory",
        "    const unsigned int* src = sn_words + ((long long)ring_before * B + r0) * n_words;",
        "    for (long long lr = sn_warp; lr < group_rows && r0 + lr < B; lr += sn_warps) {",
        "        for (long long q = sn_lane; q < n_words; q += 32) {",
        f"            sn_wtile[lr * {stride} + q] = {d.shared_load('src[lr * n_words + q]')};",
        "        }",
        "    }",
        "}",
        d.barrier(),
        *summed,
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
        forward_layout(printer.dt.name, variant.option("product")),
        words,
        history,
        step,
        clear,
        printer.last(variant),
        printer.lane_arrays(),
        d.lane_loop(printer.lane_init()),
        before=stage,
    )


def _gather(printer: ForwardPrinter) -> list[str]:
    """The forward's sums by a gather: each row's threads add the rows of the block's
    slice of ``weight_t`` of the neurons whose bits are set in the row's staged words
    (the cached ones from shared memory, the rest from L2)."""
    d, product = printer.dialect, Product(printer)
    cached, uncached = (
        product.fetch("sn_wslice + m * S + (c0 - cs0)"),
        product.fetch("weight_t + m * F + c0"),
    )

    def fetch(values: str) -> list[str]:
        split = ["if (m < cached) {", *indent(cached(values)), "} else {"]
        return [*split, *indent(uncached(values)), "}"]

    words_of_row = "sn_wtile + local_row * n_words"
    st = printer.dt.storage
    return [*product.start(), *d.each_set(words_of_row, "n_words", st, fetch, product.use_spike)]


def _mma_words(printer: ForwardPrinter) -> list[str]:
    """The forward's set-up on tensor cores: its parts' sums after the staged words, a
    row's neurons as whole words, how the warps share the product."""
    ct = printer.dt.compute
    return [
        f"{ct}* sn_sums = ({ct}*)(sn_wtile + group_rows * {WORD_STRIDE});  // [parts][rows][S]",
        "const int tk = (int)(n_words * 32);  // a row's neurons, whole words",
        *mma.blocking(str(FORWARD_PARTS)),
    ]


def _mma_sums(printer: ForwardPrinter) -> list[str]:
    """Every thread, after the words are staged: the step's product s · Rᵀ of the
    block's rows and slice on tensor cores (:func:`symneuron.codegen.mma.words_sum`),
    its parts added in order into each neuron's ``rec``."""
    name = printer.dt.name
    return [
        *Product(printer).start(),
        *mma.start(),
        "if (blocking) {",
        *indent([mma.word_chunk(), *mma.words_sum(name, WORD_STRIDE)]),
        "}",
        *_add_parts(printer, mma.stored()),
    ]


def _grid_backward(printer: BackwardPrinter, variant: Variant) -> list[str]:
    """The backward of a grid kernel: each step the block's threads read dL/dX_eff[t + D]
    of its rows from a ring in global memory, ``TK`` neurons of every row at a time
    (coalesced, several loads in flight per thread, into shared memory); then each
    row's threads sum the connection's transpose over them and the block's slice of
    ``weight`` kept in shared memory (the rest from L2): each weight read serves every
    row of the block. Then the rows' threads run the neurons' step with the sums. The
    sums run by multiply-adds or on tensor cores (the ``product`` option)."""
    d, ct = printer.dialect, printer.dt.compute
    io = printer.io(variant, mutable=frozenset({"gs_v"}))
    tensor_cores = variant.option("product") == "mma"
    plan = backward_layout(printer.dt.name, variant.option("product"))
    tt = printer.dt.storage if plan.kind == "storage" else ct  # the ring's and tile's
    ring = [
        f"{tt}* sn_ring = ({tt}*)((unsigned int*)scratch + 4);  // [D + 1][B][F]",
        f"{tt}* sn_gtile = ({tt}*)sn_smem;  // [group_rows][TK + {plan.pad}], then the slice",
        f"{ct}* sn_sums = ({ct}*)sn_smem;  // after the product: its parts' sums",
        *d.warp_lanes(),
        "const int tk = (int)TK;",
        f"const bool sn_aligned = F % {fma.width(tt)} == 0;  // rows of whole 16-byte chunks",
        *(_mma_blocking(plan, tt) if tensor_cores else fma.blocking(printer, PAD)),
    ]
    if tensor_cores:
        name = printer.dt.name
        sums, tile_sum = mma.start(), [mma.chunk(name), *mma.tile_sum(name, plan.pad, tt)]
        stored = mma.stored()
    else:
        sums, tile_sum, stored = fma.start(printer), fma.tile_sum(printer), fma.stored(printer)
    transposed = [
        *Product(printer).start(),
        f"const {tt}* g_all = sn_ring + (long long)ring_before * B * F;",
        *sums,
        "for (int m0 = 0; m0 < F; m0 += tk) {",
        *indent(_stage_tile(printer, tt, plan.pad)),
        "    if (blocking) {",
        *indent(tile_sum, 2),
        "    }",
        "}",
        *_add_parts(printer, stored),
    ]
    declared, loads = printer.row_loads(io)
    step = [
        "const long long k = (long long)t * N + i0;",
        *declared,
        *loads,
        f"{tt}* now = sn_ring + ((long long)ring_now * B + row) * F;",
        *add_to(printer, "gs_v"),
        *printer.lanes_step(variant, io),
        *d.lane_loop([f"now[c0 + j] = {_ring_value(printer, tt)};"]),
    ]
    init = d.lane_loop(printer.lane_init() + printer.setup(io))
    return _grid(
        printer,
        variant,
        plan,
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


def _mma_blocking(plan: GridLayout, tile: str) -> list[str]:
    """The backward's warps on tensor cores: as many parts as the warps hold and their
    sums fit the freed tile's room (``tile`` values, rows padded by the plan's pad)."""
    fits = f"(tk + {plan.pad}) * (int)sizeof({tile}) / (4 * (int)S)"
    return mma.blocking(fits)


def _ring_value(printer: BackwardPrinter, ring: str) -> str:
    """A lane's dL/dX as the ring keeps it: stored (a value of the storage type, as the
    step rounds it), or in the compute type."""
    if ring == printer.dt.storage:
        return "gx_v.v[j]"
    return printer.load("gx_v.v[j]")


def _stage_tile(printer: BackwardPrinter, tt: str, pad: int) -> list[str]:
    """Every thread: the tile of neurons [m0, m0 + tk) of the block's rows' dL/dX_eff (of
    the C type ``tt``, rows ``tk + pad``) into shared memory, 16 bytes at a time by
    asynchronous copies from L2 (sm_80 on: all of a thread's copies in flight at once,
    no registers), or loads where a row's end or its alignment leaves less than 16
    bytes; zeros past the batch and the row."""
    d, ct = printer.dialect, tt
    width = fma.width(ct)
    copy = [
        *_ASYNC_COPY,
        "} else {",
        f"    for (int q = 0; q < {width}; ++q) {{",
        "        const bool there = r0 + lr < B && m0 + mm + q < F;",
        f"        dst[q] = there ? {d.shared_load('src[q]')} : ({ct})0;",
        "    }",
        "}",
    ]
    return [
        d.barrier(),
        f"const int sn_chunks = tk / {width};  // 16-byte chunks a row of the tile",
        "for (int e = threadIdx.x; e < group_rows * sn_chunks; e += blockDim.x) {",
        "    const int lr = e / sn_chunks, mm = (e - lr * sn_chunks) * " + f"{width};",
        f"    {ct}* dst = sn_gtile + lr * (tk + {pad}) + mm;",
        f"    const {ct}* src = g_all + (long long)(r0 + lr) * F + m0 + mm;",
        f"    const bool whole = sn_aligned && r0 + lr < B && m0 + mm + {width} <= F;",
        *indent(copy),
        "}",
        *_ASYNC_WAIT,
        d.barrier(),
    ]


#: a 16-byte asynchronous copy from L2 (``.cg``: past L1, which may hold an older copy of
#: what other blocks wrote) of ``src`` to ``dst`` in shared memory, where ``whole``
_ASYNC_COPY = [
    "#if __CUDA_ARCH__ >= 800",
    "if (whole) {",
    "    unsigned int sn_to;",
    '    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }"',
    '        : "=r"(sn_to) : "l"(dst));',
    '    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(sn_to), "l"(src));',
    "#else",
    "if (false) {  // before sm_80: loads",
    "#endif",
]
#: wait for this thread's asynchronous copies (the barrier after it: for everyone's)
_ASYNC_WAIT = [
    "#if __CUDA_ARCH__ >= 800",
    'asm volatile("cp.async.wait_all;" ::: "memory");',
    "#endif",
]


def _add_parts(printer: StepPrinter, stored: list[str]) -> list[str]:
    """The parts' sums, ``stored`` through the freed tile ([part][row][column of the
    slice]), added by each neuron's own thread in order of part (the result does not
    depend on timing)."""
    d = printer.dialect
    summed = "rec[j] += sn_sums[(p * group_rows + local_row) * S + (c0 - cs0) + j];"
    return [
        d.barrier(),
        "if (blocking) {",
        *indent(stored),
        "}",
        d.barrier(),
        "if (active) {",
        "    for (int p = 0; p < sn_bparts; ++p) {",
        *indent(d.lane_loop([summed]), 2),
        "    }",
        "}",
    ]


#: threads of a grid kernel's block (its ``__launch_bounds__``). 512 would give a thread
#: 128 registers (no spills) but halve the layers a grid holds, and was no faster
THREADS = 1024
#: the values a row of the staged tile is padded by: rows stay 16-byte aligned (vector
#: loads) and eight rows of a warp start in different banks
PAD = 4


class GridLayout(NamedTuple):
    """A grid kernel's shared memory: first a tile of ``tile`` values of ``kind`` (spike
    words, or values of the compute or storage type; rows padded by ``pad`` values) per
    row of the block, then the slice of ``weight``, as many of its rows as fit: as
    [cached][S], or with ``columns`` (C text of a column's stride in ``cached``, at most
    ``cached + reserve``) as [S][stride], a column's neurons together."""

    weight: str
    tile: str
    kind: str
    columns: str | None = None
    reserve: int = 0
    pad: int = PAD

    def tile_bytes(self, values: dict[str, int]) -> int:
        """The tile's bytes, rounded to 16, for a launch's values (its text's formula)."""
        size = {"word": 4, "compute": values["cs"], "storage": values["ss"]}[self.kind]
        return -(-values["group_rows"] * evaluate(self.tile, values) * size // 16) * 16


#: the forward's: the rows' spike words of the step, then rows m of Rᵀ's slice
GRID_FORWARD = GridLayout("weight_t", "(F + 31) / 32", "word")
#: the forward's parts of a row's neurons on tensor cores (at most): each warp of a
#: block sums its unit over one part, so that the block's 32 warps have work where its
#: units are fewer
FORWARD_PARTS = 4
#: the forward's staged words of a row on tensor cores, a word more than the row's: the
#: 8 rows an A fragment's load reads then fall in 8 banks (n_words is even: the same)
WORD_STRIDE = "(n_words + 1)"
#: the backward's: a tile of the rows' dL/dX_eff (TK neurons, padded by :data:`PAD`),
#: then R's slice
GRID_BACKWARD = GridLayout("weight", "TK + 4", "compute")


def forward_layout(dtype: str, product: str) -> GridLayout:
    """The forward's layout for its ``product`` in ``dtype``: on tensor cores, the words
    (:data:`WORD_STRIDE` a row) then the parts' sums (floats) of each row, and the
    slice by columns
    (:data:`symneuron.codegen.mma.COLUMNS`)."""
    if product != "mma":
        return GRID_FORWARD
    columns, reserve = mma.COLUMNS[dtype]
    tile = f"(F + 31) / 32 + 1 + {FORWARD_PARTS} * S"
    return GRID_FORWARD._replace(tile=tile, columns=columns, reserve=reserve)


def backward_layout(dtype: str, product: str) -> GridLayout:
    """The backward's layout for its ``product`` in ``dtype``: on tensor cores, the slice
    by columns (:data:`symneuron.codegen.mma.COLUMNS`), and in 16-bit the ring and the
    tile of the storage type (the values the step rounded: half the bytes to stage),
    rows padded by 8 (16-byte rows, 16 bytes past a multiple of 128)."""
    if product != "mma":
        return GRID_BACKWARD
    columns, reserve = mma.COLUMNS[dtype]
    layout = GRID_BACKWARD._replace(columns=columns, reserve=reserve)
    if mma.SHAPES[dtype].k == 16:
        return layout._replace(tile="TK + 8", kind="storage", pad=8)
    return layout


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
    ctype = {"word": "unsigned int", "compute": printer.dt.compute}.get(plan.kind)
    tile = f"(long long)sizeof({ctype or printer.dt.storage})"
    return [
        *noise.state(printer.spec),
        *d.row_shared("0"),
        "const long long n_words = (F + 31) / 32;",
        f"const long long sn_tile_base = (group_rows * ({plan.tile}) * {tile} + 15) / 16 * 16;",
        *d.slice_cache(printer.dt.storage, plan.weight, "sn_tile_base", plan.columns, plan.reserve),
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
