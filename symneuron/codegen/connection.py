"""The connection stage: a recurrent connection printed around the neuron's own step.

A recurrent layer (DESIGN §3b) feeds each batch row's spikes back through a weight
``R`` [F, F] after a delay of ``D`` steps: ``X_eff[t] = x[t] + R·s[t−D]``. Its kernels
are the neuron's forward and backward (:mod:`.forward`, :mod:`.backward`: the same
step printers) with this stage's lines around the lanes' step, in a kernel family
where one block owns one batch row, so that the cross-neuron parts of a step need
only the block's barrier:

* forward, step t: each thread adds to its lanes' X register the recurrent input, the
  connection's spike term (:attr:`ConnectionSpec.spike_term`, derived) summed over the
  neurons that spiked at step t−D; after the step, the lanes' spikes go to the ring;
* backward, step t (descending): the transposed product, the connection's derived
  :attr:`~ConnectionSpec.transpose` summed over dL/dX_eff[t+D] of the row, spread over
  ``n_parts`` threads per neuron, adds to the register dL/dS[t] is read from; after
  the step, dL/dX_eff[t] goes to the ring.

The exchanged values live in a ring of D + 1 slots of shared memory: step t writes
slot t mod (D + 1) and reads the slot of step t − D (forward) or t + D (backward),
written at least one barrier earlier. The strategy that computes the product is a
part of this stage (:class:`Product`): the forward gathers over the spiking neurons
(CUDA: from warp-vote words, :attr:`Dialect.votes`), the backward runs a dense sum
whose first rows come from shared memory. The row's shared memory and threads are one
:class:`~.layout.RowLayout` per pass, which the runtime evaluates for the launch.
"""

from __future__ import annotations

from typing import NamedTuple

import sympy as sp

from ..derivation.connection import DENSE, G_POST, ConnectionSpec, W
from ..signature import Variant
from . import noise
from .backward import BackwardPrinter
from .dialects import indent
from .forward import ForwardPrinter
from .layout import CHUNK, N_WORDS, Region, RowLayout, evaluate
from .steps import Stage, StepIO, StepPrinter

__all__ = ["layout", "row_body", "UNROLL", "FORWARD_VOTES", "FORWARD_VALUES", "BACKWARD"]

#: unroll factor of the sums over a row's neurons (their loads come from L2)
UNROLL = 8

#: the forward's shared memory where spikes are exchanged as vote words (CUDA)
FORWARD_VOTES = RowLayout((Region("words", "word", "(D + 1) * n_words"),))
#: the forward's where they are exchanged as values (one C thread runs a row)
FORWARD_VALUES = RowLayout((Region("ring", "compute", "(D + 1) * F"),))
#: the backward's: the ring of dL/dX_eff, each part's sums, then the weight rows cached
BACKWARD = RowLayout(
    (
        Region("ring", "compute", "(D + 1) * F"),
        Region("parts", "compute", "n_parts * F"),
        Region("cache", "storage", "0"),
    )
)


def layout(variant: Variant, votes: bool) -> RowLayout:
    """The shared-memory layout of a row kernel of ``variant`` (``votes``: the dialect
    exchanges spikes as vote words)."""
    if variant.pass_.kind == "forward":
        return FORWARD_VOTES if votes else FORWARD_VALUES
    return BACKWARD


class Product:
    """How the stage prints its sums over a row's neurons: ``rec[j] += term`` for each
    neuron m, ``term`` one of the connection's derived expressions, printed in the
    weight ``w_m`` (loaded from ``w_row``) and the neuron's factor ``g_m``."""

    def __init__(self, printer: StepPrinter, spec: ConnectionSpec = DENSE) -> None:
        self.printer = printer
        self.spec = spec
        self.dt = printer.dt
        self.dialect = printer.dialect

    def start(self) -> list[str]:
        return [f"{self.dt.compute} rec[K];", *self.dialect.lane_loop(["rec[j] = 0;"])]

    def add_spike(self) -> list[str]:
        """One spiking neuron's spike term added into each lane's sum."""
        return self.add(self.spec.spike_term)

    def add(self, term: sp.Expr) -> list[str]:
        """One neuron's term added into each lane's sum."""
        ct = self.dt.compute
        weight = f"const {ct} {W} = {self.printer.load('w_row[j]')};"
        return self.dialect.lane_loop([weight, f"rec[j] += {self.printer.expr(term)};"])

    def dense(self, row: str, factor: str | None, span: str) -> list[str]:
        """``rec[j] += term`` for m in ``span``, ``row`` the address of row m's value of
        column c0; with ``factor`` (the value of ``g_m``) the transposed term, else the
        spike term where the ring's value of m is not 0 (C: the spiking neurons)."""
        inner = [f"const {self.dt.storage}* w_row = {row};"]
        if factor is None:
            body = ["if (before[m] != 0) {", *indent(inner + self.add(self.spec.spike_term)), "}"]
        else:
            inner.append(f"const {self.dt.compute} {G_POST} = {factor};")
            body = inner + self.add(self.spec.transpose)
        # unrolled: a thread keeps several rows' loads in flight (they come from L2)
        loop = [*self.dialect.unroll(str(UNROLL)), f"for (long long {span}; ++m) {{"]
        return [*loop, *indent(body), "}"]

    def spiking(self, slot: str) -> list[str]:
        """CUDA: the spike term summed over the neurons whose vote bit is set in ``slot``'s
        words, in a fixed order (the result does not depend on timing)."""
        body = [f"const {self.dt.storage}* w_row = weight_t + m * F + c0;"]
        body += self.add(self.spec.spike_term)
        words = f"sn_words + ({slot}) * n_words"
        return [*self.start(), *self.dialect.each_voted(words, "n_words", body)]


def _ring(compute: str) -> list[str]:
    """This step's slots of the ring: the one read and the one written."""
    return [
        f"const {compute}* before = sn_ring + ring_before * F;",
        f"{compute}* now = sn_ring + ring_now * F;",
    ]


#: the ring's slots at the first step and their advance to the next step, kept in
#: registers (a division by D + 1 each step sat on the step's critical path: 2 % slower
#: at 64 x 256): step t writes slot t mod (D + 1) and reads the slot of step t − D
#: (forward: t + 1 mod (D + 1)) or t + D (backward: t − 1 mod (D + 1))
_SLOTS = {
    "forward": (
        ["int ring_now = 0, ring_before = 1;"],
        ["ring_now = ring_before;", "ring_before = ring_before == D ? 0 : ring_before + 1;"],
    ),
    "backward": (
        [
            "int ring_now = (T - 1) % (D + 1);",
            "int ring_before = ring_now == 0 ? D : ring_now - 1;",
        ],
        ["ring_now = ring_before;", "ring_before = ring_before == 0 ? D : ring_before - 1;"],
    ),
}


def _add_to(printer: StepPrinter, register: str) -> list[str]:
    """The vector register's lanes plus ``rec``, rounded to storage (as the torch loop's
    ``x + s @ R.T`` is)."""
    value = f"{printer.load(f'{register}.v[j]')} + rec[j]"
    return printer.dialect.lane_loop([f"{register}.v[j] = {printer.store(value)};"])


def _regions(printer: StepPrinter, plan: RowLayout) -> list[str]:
    """Pointers to the layout's regions in the row's shared memory ``sn_smem``."""
    sizes = {"cs": f"sizeof({printer.dt.compute})", "ss": f"sizeof({printer.dt.storage})"}
    types = {"compute": printer.dt.compute, "storage": printer.dt.storage, "word": "unsigned int"}
    out = []
    for region in plan.regions:
        if region.name == "cache":  # (the dialect's row cache takes its start)
            continue
        offset = plan.offset_text(region.name, sizes)
        ctype = types[region.kind]
        out.append(f"{ctype}* sn_{region.name} = ({ctype}*)(sn_smem + {offset});")
    return out


def _forward(printer: ForwardPrinter, variant: Variant) -> list[str]:
    d, ct = printer.dialect, printer.dt.compute
    io = printer.io(variant, mutable=frozenset({"x_v"}))  # X: its register gets the sum
    first = f"(s_init ? {printer.load('s_init[(long long)i * N + i0 + j]')} : 0)"
    product = Product(printer)
    if d.votes:  # the spikes as warp-vote words: a sum over the spiking neurons
        gather = product.spiking("ring_before")
        publish = d.lane_loop([f"flag[j] = s_v.v[j] != {printer.store('0')};"])
        votes = [*d.vote("flag", "sn_words", "ring_now", "n_words")]
        history = [
            "for (int i = 0; i < D; ++i) {",
            *indent(d.threads([], d.lane_loop([f"flag[j] = {first} != 0;"]))),
            *indent(d.vote("flag", "sn_words", "i + 1", "n_words")),
            "}",
        ]
        declared = [
            f"const int n_words = (int)({N_WORDS});",
            "unsigned int flag[K];",
            *d.lane_loop(["flag[j] = 0;"]),
        ]
        ring: list[str] = []
    else:
        gather = [*product.start(), *product.dense("weight_t + m * F + c0", None, "m = 0; m < F")]
        publish = d.lane_loop([f"now[c0 + j] = {printer.load('s_v.v[j]')};"])
        votes, declared = [], []
        fill = d.lane_loop([f"sn_ring[(long long)(i + 1) * F + c0 + j] = {first};"])
        history = d.threads([], ["for (int i = 0; i < D; ++i) {", *indent(fill), "}"])
        ring = _ring(ct)
    xeff = f"if (xeff_seq) *({printer.vec}*)(xeff_seq + k) = x_v;"
    before = [*gather, *_add_to(printer, "x_v"), xeff]
    step = printer.step(variant, io, Stage(tuple(before), tuple(publish)))
    arrays = printer.lane_arrays()
    return _row(
        printer,
        layout(variant, d.votes),
        arrays,
        d.lane_loop(printer.lane_init()),
        step,
        printer.last(variant),
        declared=declared,
        history=history,
        ring=ring,
        votes=votes,
    )


def _backward_arrays(printer: BackwardPrinter, io: StepIO) -> list[tuple[str, str]]:
    """The per-lane arrays of a backward's time loop: the step's, its carries, and one
    accumulator per learnable parameter."""
    ct, at = printer.dt.compute, printer.dt.accum
    arrays = printer.lane_arrays() + [(ct, carry) for carry, _ in io.carries]
    return arrays + [(at, f"acc_{c}") for c in printer.learnable()]


def _backward(printer: BackwardPrinter, variant: Variant) -> list[str]:
    d, ct = printer.dialect, printer.dt.compute
    io = printer.io(variant, mutable=frozenset({"gs_v"}))
    arrays = _backward_arrays(printer, io)
    product = Product(printer)
    # each of the n_parts threads of a neuron sums its part of the m range (CUDA: up to 4
    # threads a neuron keep more loads in flight); the neuron's own thread adds the parts
    # in order (CUDA: the first ``cached`` rows of each part's range from shared memory,
    # the rest from L2, in the same order)
    partial = [
        "const long long m0 = part * chunk;",
        "const long long m1 = (part + 1) * chunk < F ? (part + 1) * chunk : F;",
        "const long long mc = m0 + cached < m1 ? m0 + cached : m1;",
        *product.start(),
        *product.dense("wcache + (part * cached + m - m0) * F + c0", "before[m]", "m = m0; m < mc"),
        *product.dense("weight + m * F + c0", "before[m]", "m = mc; m < m1"),
        *d.lane_loop(["sn_parts[part * F + c0 + j] = rec[j];"]),
    ]
    total = [*product.start(), "for (int p = 0; p < n_parts; ++p) {"]
    total += [*indent(d.lane_loop(["rec[j] += sn_parts[p * F + c0 + j];"])), "}"]
    # CUDA: the step's loads are issued before the transposed product, whose time hides
    # their latency; C loads them in the step
    declared, loads = printer.row_loads(io)
    index = "const long long k = (long long)t * N + i0;"
    prefetch = d.prefetch([index, *declared], loads)
    step = [
        *([] if prefetch else [index, *declared, *loads]),
        *total,
        *_add_to(printer, "gs_v"),
        *printer.lanes_step(variant, io),
        *d.lane_loop([f"now[c0 + j] = {printer.load('gx_v.v[j]')};"]),
    ]
    # what the steps after the last pass back: 0
    zero = ["for (int i = 0; i <= D; ++i) sn_ring[(long long)i * F + c0 + j] = 0;"]
    init = d.lane_loop(printer.lane_init() + printer.setup(io) + zero)
    return _row(
        printer,
        BACKWARD,
        arrays,
        init,
        step,
        d.lane_loop(printer.final()),
        reverse=True,
        helpers=partial,
        prefetch=prefetch,
        ring=_ring(ct),
    )


def _row(
    printer: StepPrinter,
    plan: RowLayout,
    arrays: list[tuple[str, str]],
    init: list[str],
    step: list[str],
    last: list[str],
    *,
    reverse: bool = False,
    helpers: list[str] | None = None,
    prefetch: list[str] | None = None,
    declared: list[str] | None = None,
    history: list[str] | None = None,
    ring: list[str] | None = None,
    votes: list[str] | None = None,
) -> list[str]:
    """A row's kernel: the generator's state (a neuron that draws), the shared regions,
    the arrays, each thread's set-up and the ring's first slots (``history``), the time
    loop (``helpers``, a phase every thread of a neuron runs, after the step's
    ``prefetch``ed loads, and a barrier; then a step of the neurons' own threads, their
    ``votes``, and the barrier), each thread's final stores, and the release. With
    ``helpers`` the rows of ``weight`` that fit on chip are loaded first
    (:meth:`~symneuron.codegen.dialects.Dialect.row_cache`)."""
    d = printer.dialect
    sizes = {"cs": f"sizeof({printer.dt.compute})", "ss": f"sizeof({printer.dt.storage})"}
    cache = []
    if helpers:
        base = plan.offset_text("cache", sizes)
        cache = d.row_cache(printer.dt.storage, "weight", base, CHUNK)
    head = "for (int t = T - 1; t >= 0; --t) {" if reverse else "for (int t = 0; t < T; ++t) {"
    slots, advance = _SLOTS["backward" if reverse else "forward"]
    barrier = [d.barrier()] if d.barrier() else []
    loop = [*(ring or []), *(prefetch or [])]
    if helpers:
        loop += [*d.threads(arrays, helpers, helpers=True), *barrier]
    loop += [*d.threads(arrays, step), *(votes or []), *barrier, *advance]
    return [
        *noise.state(printer.spec),  # (the row's: C threads are scopes of a loop)
        *d.row_shared(plan.total_text(sizes)),
        *_regions(printer, plan),
        *(declared or []),
        *d.lane_arrays(arrays),
        *cache,
        *d.threads(arrays, init),
        *(history or []),
        *barrier,
        *slots,
        head,
        *indent(loop),
        "}",
        *(d.threads(arrays, last) if last else []),
        *d.release(["sn_smem", *[f"{name}_row" for _, name in arrays]]),
    ]


#: a grid kernel's slots: the forward's D + 2 (step t reads t − D, writes t and clears
#: t + 1, which step t − 1 read last), the backward's D + 1 as a row kernel's
_GRID_SLOTS = {
    "forward": (
        ["int ring_now = 0, ring_next = 1, ring_before = 2 % (D + 2);"],
        [
            "ring_now = ring_next;",
            "ring_next = ring_next == D + 1 ? 0 : ring_next + 1;",
            "ring_before = ring_before == D + 1 ? 0 : ring_before + 1;",
        ],
    ),
    "backward": _SLOTS["backward"],
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
    cached = [f"const {st}* w_row = sn_wslice + m * S + (c0 - cs0);", *product.add_spike()]
    uncached = [f"const {st}* w_row = weight_t + m * F + c0;", *product.add_spike()]
    gather = [
        *product.start(),
        *d.each_set(
            "sn_wtile + local_row * n_words",
            "n_words",
            ["if (m < cached) {", *indent(cached), "} else {", *indent(uncached), "}"],
        ),
    ]
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
        variant, io, Stage((*gather, *_add_to(printer, "x_v"), xeff), tuple(publish))
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
    arrays = _backward_arrays(printer, io)
    product = Product(printer)
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
    # each warp stages rows (STAGED of them at once), its lanes the row's TK <= 32 · 4
    # neurons: STAGED · 4 loads in flight per thread, coalesced, no division
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
    stage = [
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
    # each of the n_parts threads of a neuron sums its part of the tile (the threads that
    # own no neuron help: up to 4 a neuron, their sums' room in the freed tile)
    tile_sum = [
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
    parts = "((part - 1) * owners + own) * K"
    gather = [
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
    transposed = [
        *product.start(),
        f"const {ct}* g_all = sn_ring + (long long)ring_before * B * F;",
        "for (int m0 = 0; m0 < F; m0 += tk) {",
        *indent(stage),
        "    if (helping) {",
        *indent(tile_sum, 2),
        "    }",
        "}",
        *gather,
    ]
    declared, loads = printer.row_loads(io)
    step = [
        "const long long k = (long long)t * N + i0;",
        *declared,
        *loads,
        f"{ct}* now = sn_ring + ((long long)ring_now * B + row) * F;",
        *_add_to(printer, "gs_v"),
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
        arrays,
        init,
        reverse=True,
        before=transposed,
    )


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
    slots, advance = _GRID_SLOTS["backward" if reverse else "forward"]
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


def row_body(printer: StepPrinter, variant: Variant) -> list[str]:
    """The body of one row block of ``variant``'s kernel (or, for a grid pass, of one
    block of the grid): the pass's own printer with the connection's stage around its
    steps."""
    grid = variant.pass_.grid
    if isinstance(printer, ForwardPrinter):
        return (_grid_forward if grid else _forward)(printer, variant)
    if isinstance(printer, BackwardPrinter):
        return (_grid_backward if grid else _backward)(printer, variant)
    raise TypeError(f"a connection has no stage for the printer {type(printer).__name__}")
