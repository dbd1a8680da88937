"""The connection stage: a recurrent connection printed around the neuron's own step.

A recurrent layer (docs/architecture.md) feeds each batch row's spikes back through a weight
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

import sympy as sp

from ..derivation.connection import G_POST, ConnectionSpec, W, dense
from ..signature import Variant
from . import noise
from .backward import BackwardPrinter
from .dialects import indent
from .forward import ForwardPrinter
from .gather import Fetch
from .layout import CHUNK, N_WORDS, Region, RowLayout
from .steps import Stage, StepIO, StepPrinter

__all__ = [
    "layout",
    "row_body",
    "Product",
    "add_to",
    "backward_arrays",
    "SLOTS",
    "UNROLL",
    "FORWARD_VOTES",
    "FORWARD_VALUES",
    "BACKWARD",
]

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

    def __init__(self, printer: StepPrinter, spec: ConnectionSpec | None = None) -> None:
        self.printer = printer
        self.spec = dense() if spec is None else spec
        self.dt = printer.dt
        self.dialect = printer.dialect

    def start(self) -> list[str]:
        return [f"{self.dt.compute} rec[K];", *self.dialect.lane_loop(["rec[j] = 0;"])]

    def add(self, term: sp.Expr, values: str = "w_row") -> list[str]:
        """One neuron's term added into each lane's sum, its weights ``values[j]``."""
        ct = self.dt.compute
        weight = f"const {ct} {W} = {self.printer.load(values + '[j]')};"
        return self.dialect.lane_loop([weight, f"rec[j] += {self.printer.expr(term)};"])

    def fetch(self, row: str) -> Fetch:
        """The lines that copy the K weights at ``row`` (m's row, from column c0) into an
        array, for a gather (:meth:`~.dialects.Dialect.each_set`)."""

        def lines(values: str) -> list[str]:
            copy = self.dialect.lane_loop([f"{values}[j] = w_row[j];"])
            return [f"const {self.dt.storage}* w_row = {row};", *copy]

        return lines

    def use_spike(self, values: str) -> list[str]:
        """A gathered spiking neuron's spike term, its weights in ``values``."""
        return self.add(self.spec.spike_term, values)

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
        words = f"sn_words + ({slot}) * n_words"
        fetch = self.fetch("weight_t + m * F + c0")
        gather = self.dialect.each_voted(words, "n_words", self.dt.storage, fetch, self.use_spike)
        return [*self.start(), *gather]


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
SLOTS = {
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


def add_to(printer: StepPrinter, register: str) -> list[str]:
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
    before = [*gather, *add_to(printer, "x_v"), xeff]
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


def backward_arrays(printer: BackwardPrinter, io: StepIO) -> list[tuple[str, str]]:
    """The per-lane arrays of a backward's time loop: the step's, its carries, and one
    accumulator per learnable parameter."""
    ct, at = printer.dt.compute, printer.dt.accum
    arrays = printer.lane_arrays() + [(ct, carry) for carry, _ in io.carries]
    return arrays + [(at, f"acc_{c}") for c in printer.learnable()]


def _backward(printer: BackwardPrinter, variant: Variant) -> list[str]:
    d, ct = printer.dialect, printer.dt.compute
    io = printer.io(variant, mutable=frozenset({"gs_v"}))
    arrays = backward_arrays(printer, io)
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
        *add_to(printer, "gs_v"),
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
    slots, advance = SLOTS["backward" if reverse else "forward"]
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


def row_body(printer: StepPrinter, variant: Variant) -> list[str]:
    """The body of one row block of ``variant``'s kernel: the pass's own printer with the
    connection's stage around its steps."""
    if isinstance(printer, ForwardPrinter):
        return _forward(printer, variant)
    if isinstance(printer, BackwardPrinter):
        return _backward(printer, variant)
    raise TypeError(f"a connection has no stage for the printer {type(printer).__name__}")
