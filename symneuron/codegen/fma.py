"""The grid backward's product by multiply-adds (the ``fma`` value of its ``product``
option): a matrix product's micro-kernel. Each thread sums a micro-tile of a few batch
rows × K columns of the block over its part of each staged tile, so that each weight
it reads from shared memory serves several rows and each staged value K columns; the
parts are added in a fixed order afterwards
(:func:`symneuron.codegen.grid._add_parts`). The sums are in the compute type, one
multiply-add a term of the connection's derived transpose, with no operand rounded
(float32 and float64 layers take this product). :mod:`.mma` is the same product on
tensor cores.
"""

from __future__ import annotations

from ..derivation.connection import G_POST, W, dense
from .backward import BackwardPrinter
from .dialects import indent

__all__ = ["MICRO_ROWS", "MICRO_BYTES", "blocking", "start", "tile_sum", "stored", "width"]


#: a micro-tile's rows (at most) and the bytes of its sums (at most): two rows of a
#: thread's 16 bytes. Four rows (64 bytes) were as fast on an H100 (128 × 2048, fp32
#: and fp64) and spill more of the 64 registers a thread of 1024 gets
MICRO_ROWS, MICRO_BYTES = 2, 32


def start(printer: BackwardPrinter) -> list[str]:
    """The micro-tile's sums of the FMA product, zeroed."""
    return [
        f"{printer.dt.compute} acc[SN_RB][K];",
        *printer.dialect.unroll(),
        "for (int r = 0; r < SN_RB; ++r) {",
        *indent(printer.dialect.lane_loop(["acc[r][j] = 0;"])),
        "}",
    ]


_SIZES = {"double": 8, "float": 4, "unsigned short": 2}


def width(ctype: str) -> int:
    """Values of the C type ``ctype`` in 16 bytes (the tile's vector loads and copies)."""
    return 16 // _SIZES[ctype]


def blocking(printer: BackwardPrinter, pad: int) -> list[str]:
    """How a block's threads share the step's product, as a matrix product's
    micro-kernel: thread (part, row group, column group) sums ``SN_RB`` rows × K columns
    of the block (rows rg, rg + groups, ...: a warp's rows are adjacent, so its tile
    loads fall in different banks) over its part of each tile, so that each weight it
    reads serves ``SN_RB`` rows and each value of the tile K columns. The parts (at most
    as many as their sums fit the tile's room) are added in order afterwards."""
    ct = printer.dt.compute
    rb = f"{MICRO_BYTES} / (K * (int)sizeof({ct}))"
    return [
        f"constexpr int SN_RB = {rb} > {MICRO_ROWS} ? {MICRO_ROWS} : ({rb} < 1 ? 1 : {rb});",
        "const int sn_row_groups = (group_rows + SN_RB - 1) / SN_RB;",
        "const int sn_micro = sn_row_groups * slice_threads;",
        f"const int sn_fits = (tk + {pad}) / (int)S;  // the parts' sums fit the tile's room",
        "const int sn_most = (int)blockDim.x / sn_micro;",
        "const int sn_bparts = sn_most < sn_fits ? (sn_most < 1 ? 1 : sn_most) : sn_fits;",
        "const int sn_bpart = threadIdx.x / sn_micro, sn_mi = threadIdx.x % sn_micro;",
        "const int sn_rg = sn_mi / slice_threads;",
        "const int cb0 = cs0 + (sn_mi % slice_threads) * K;  // the micro-tile's first column",
        "const bool blocking = sn_bpart < sn_bparts && cb0 < F;",
        "const int sn_chunk = ((tk + sn_bparts - 1) / sn_bparts + 3) / 4 * 4;",
        "int sn_rows[SN_RB];  // where each of the micro-tile's rows starts in the tile",
        *printer.dialect.unroll(),
        "for (int r = 0; r < SN_RB; ++r) {",
        "    const int lr = sn_rg + r * sn_row_groups;",
        f"    sn_rows[r] = (lr < group_rows ? lr : group_rows - 1) * (tk + {pad});",
        "}",
    ]


def _rows_term(printer: BackwardPrinter, factor: str, weights: str) -> list[str]:
    """The connection's transpose of one neuron m added into the micro-tile's sums: its
    value ``factor`` (of row r) in each row, its weights ``weights[j]`` in each column."""
    ct = printer.dt.compute
    term = [
        f"const {ct} {W} = {printer.load(weights + '[j]')};",
        f"acc[r][j] += {printer.expr(dense().transpose)};",
    ]
    return [
        *printer.dialect.unroll(),
        "for (int r = 0; r < SN_RB; ++r) {",
        f"    const {ct} {G_POST} = {factor};",
        *indent(printer.dialect.lane_loop(term)),
        "}",
    ]


def tile_sum(printer: BackwardPrinter) -> list[str]:
    """A thread's part of the tile, summed into its micro-tile (:func:`blocking`): the
    weight's cached rows with 16-byte loads of the tile and the slice, the rest one by
    one, those past the cache from L2."""
    d, ct, st = printer.dialect, printer.dt.compute, printer.dt.storage
    wide = width(ct)  # the tile's 16-byte loads
    gvec, wvec = f"sn_vec<{ct}, {wide}>", printer.vec
    vectors = [
        f"{gvec} g4[SN_RB];",
        *d.unroll(),
        "for (int r = 0; r < SN_RB; ++r) {",
        f"    g4[r] = *(const {gvec}*)(sn_gtile + sn_rows[r] + m - m0);",
        "}",
        *d.unroll(),
        f"for (int q = 0; q < {wide}; ++q) {{",
        f"    const {wvec} w4 = *(const {wvec}*)(sn_wslice + (m + q) * S + (cb0 - cs0));",
        *indent(_rows_term(printer, "g4[r].v[q]", "w4.v")),
        "}",
    ]
    one = "sn_gtile[sn_rows[r] + m - m0]"
    return [
        "const int lo = sn_bpart * sn_chunk < tk ? sn_bpart * sn_chunk : tk;",
        "const int hi = lo + sn_chunk < tk ? lo + sn_chunk : tk;",
        "const int ms = m0 + lo;",
        "const int m1 = m0 + hi < F ? m0 + hi : (int)F;",
        "const int mc = m1 < cached ? m1 : (ms > cached ? ms : cached);",
        f"const int mv = ms + (mc > ms ? (mc - ms) / {wide} * {wide} : 0);",
        f"for (int m = ms; m < mv; m += {wide}) {{",
        *indent(vectors),
        "}",
        "for (int m = mv; m < mc; ++m) {",
        f"    const {st}* w_row = sn_wslice + m * S + (cb0 - cs0);",
        *indent(_rows_term(printer, one, "w_row")),
        "}",
        *d.unroll("4"),
        "for (int m = (mc > ms ? mc : ms); m < m1; ++m) {",
        f"    const {st}* w_row = weight + (long long)m * F + cb0;",
        *indent(_rows_term(printer, one, "w_row")),
        "}",
    ]


def stored(printer: BackwardPrinter) -> list[str]:
    """Each thread's micro-tile into the freed tile as [part][row][column of the slice]."""
    d = printer.dialect
    stored = "sn_sums[(sn_bpart * group_rows + lr) * S + (cb0 - cs0) + j] = acc[r][j];"
    return [
        *d.unroll(),
        "for (int r = 0; r < SN_RB; ++r) {",
        "    const int lr = sn_rg + r * sn_row_groups;",
        "    if (lr < group_rows) {",
        *indent(d.lane_loop([stored]), 2),
        "    }",
        "}",
    ]
