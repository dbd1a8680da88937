"""The grid kernels' products on tensor cores (the ``mma`` value of their ``product``
option): the warps of a block compute the step's sums [group rows, S] as warp-wide
matrix products (PTX ``mma.sync``, sm_80 on), each warp a unit of 16 rows × up to
:data:`COLUMN_TILES` tiles of 8 columns over its part of each staged tile, so that each
A fragment it loads serves every column tile of its unit; the parts are added in a
fixed order afterwards, as the FMA product's (:func:`symneuron.codegen.grid._add_parts`).
The weight's slice is kept by columns (:data:`COLUMNS`), so that a thread's B fragment
is one 32-bit load a register from banks no other thread of its warp reads.

* The backward (:func:`tile_sum`) sums dL/dX_eff · R over each staged tile; in 16-bit
  the ring and the staged tile hold the stored values, so that an A register is one
  32-bit load of a pair (:func:`symneuron.codegen.grid.backward_layout`).
* The forward (:func:`words_sum`) sums s · Rᵀ over all of a row's neurons, its A
  fragments made from the step's spike words in registers (a spike is 1 exactly in
  every operand type): the dense product, each weight read serving 16 rows, where the
  gather of one block per row reads the spiking neurons' weights once a row.

Which product, by dtype (:data:`SHAPES`):

* 16-bit storage: ``m16n8k16`` in the storage type. Its products are exact: the ring
  holds dL/dX_eff as values of the storage type (each step rounds them to it) and the
  weights are stored in it; only the sums' order differs from the FMA product's (both
  add in float32).
* float32, where the user allows TF32 as for matrix products
  (``torch.backends.cuda.matmul.allow_tf32``): ``m16n8k8`` with both operands rounded
  to TF32 (10 bits of mantissa), as cuBLAS rounds them then (the forward's spikes are
  exact in TF32; its weights are rounded).

Rows past the block's and columns past its slice read clamped rows and columns (finite
values whose sums are not stored); neurons past the part's end read as zeros in A, so
that the clamped weights add nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ..derivation.connection import W, dense
from .dialects import indent

__all__ = [
    "SHAPES",
    "COLUMNS",
    "COLUMN_TILES",
    "ONES",
    "blocking",
    "chunk",
    "start",
    "tile_sum",
    "words_sum",
    "word_chunk",
    "stored",
]


class Shape(NamedTuple):
    """One tensor-core product: its ``mma.sync`` shape and types and the neurons it sums
    at once (``k``: 16 for 16-bit operands, two neurons a register, the lower one in the
    low half; 8 for TF32, one a register)."""

    instruction: str
    k: int


#: C text rounding the float ``v`` to TF32 in the register ``sn_p``
_TF32 = 'asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(sn_p) : "f"(v));'

#: storage dtype name -> its product on tensor cores
SHAPES = {
    "bfloat16": Shape("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 16),
    "float16": Shape("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 16),
    "float32": Shape("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", 8),
}
#: storage dtype name -> (C text of the slice's column stride in ``cached``, the most it
#: adds to ``cached``): 16 bytes past a multiple of 128, so that the 8 columns of a
#: fragment start 4 banks apart and its 4 neuron pairs (16-bit) or neurons (TF32) fill
#: the 4 banks between
COLUMNS = {
    "bfloat16": ("(cached + 55) / 64 * 64 + 8", 64),
    "float16": ("(cached + 55) / 64 * 64 + 8", 64),
    "float32": ("(cached + 27) / 32 * 32 + 4", 32),
}
#: storage dtype name -> the bits of 1 in its operand type (a spike in A)
ONES = {"bfloat16": 0x3F80, "float16": 0x3C00, "float32": 0x3F800000}
#: the tiles of 8 columns one warp's unit spans (at most), each an A fragment's mma. On
#: an H200 (bf16 backward, ms, tiles 1 / 2 / 4): 256 × 1024 2.83 / 2.70 / 3.18, 128 ×
#: 2048 5.91 / 5.38 / 5.37 (4 spills more)
COLUMN_TILES = 2


def blocking(fits: str) -> list[str]:
    """How a block's warps share the step's product: warp w computes unit
    ``w % sn_units`` (row tile ``unit / sn_cg``, column group ``unit % sn_cg``) over
    part ``w / sn_units`` of each staged tile, as many parts as the warps hold and
    ``fits`` (C text: how many parts' sums the room for them holds). The runtime
    launches it only where the units fit the warps."""
    return [
        "const int sn_ct = ((int)S + 7) / 8;  // the sums' tiles of 8 columns",
        f"const int sn_cg = (sn_ct + {COLUMN_TILES - 1}) / {COLUMN_TILES};  // a unit's",
        "const int sn_units = (group_rows + 15) / 16 * sn_cg;",
        f"const int sn_fits = {fits};  // parts' sums",
        "const int sn_most = sn_warps / sn_units;",
        "const int sn_bparts = sn_most < sn_fits ? sn_most : sn_fits;",
        "const int sn_bpart = sn_warp / sn_units, sn_unit = sn_warp % sn_units;",
        "const bool blocking = sn_bpart < sn_bparts;",
        "const int sn_g = sn_lane >> 2, sn_q = sn_lane & 3;  // the mma's fragment indices",
        "const int sn_r = (sn_unit / sn_cg) * 16 + sn_g;  // the A fragment's first row",
        "const int sn_ra = sn_r < group_rows ? sn_r : group_rows - 1;",
        "const int sn_rb = sn_r + 8 < group_rows ? sn_r + 8 : group_rows - 1;",
        f"const int sn_n0 = (sn_unit % sn_cg) * {8 * COLUMN_TILES};  // the unit's first column",
    ]


def start() -> list[str]:
    """The warp's sums: four values of each of its unit's tiles (the C fragments)."""
    return [
        f"float sn_c[{COLUMN_TILES}][4];",
        "#pragma unroll",
        f"for (int nt = 0; nt < {COLUMN_TILES}; ++nt) {{",
        "    sn_c[nt][0] = sn_c[nt][1] = sn_c[nt][2] = sn_c[nt][3] = 0.0f;",
        "}",
    ]


def chunk(dtype: str) -> str:
    """C text of a part's neurons of the tile: a whole number of the mma's k."""
    k = SHAPES[dtype].k
    return f"const int sn_chunk = ((tk + sn_bparts - 1) / sn_bparts + {k - 1}) / {k} * {k};"


def tile_sum(dtype: str, pad: int, tile: str) -> list[str]:
    """The backward: the warp's part of the staged tile (``sn_gtile`` of ``tile``
    values, rows of ``tk + pad``) summed into its unit's C fragments: for each k neurons
    of the part, the A fragment from the tile once, then for each column tile the B
    fragment from the weight's slice (rows past ``cached`` from L2) and the mma."""
    if not dense().transpose_is_product:  # the grid's connection
        raise NotImplementedError("tensor cores run a connection whose transpose is g · w")
    shape = SHAPES[dtype]

    def loop(cached: bool) -> list[str]:
        return [
            f"for (int k0 = lo; k0 < hi; k0 += {shape.k}) {{",
            *indent(_a_fragment(shape)),
            *indent(_columns(shape, "weight", "m0 + k0", cached)),
            "}",
        ]

    whole = f"m0 + (hi + {shape.k - 1}) / {shape.k} * {shape.k} <= cached"
    return [
        *_part(),
        f"const {tile}* sa = sn_gtile + sn_ra * (tk + {pad});",
        f"const {tile}* sb = sn_gtile + sn_rb * (tk + {pad});",
        *_cached_or_not(shape, whole, loop),
    ]


def _cached_or_not(shape: Shape, whole: str, loop: Callable[[bool], list[str]]) -> list[str]:
    """The part's ``loop`` with its B fragments from the cached slice alone where
    ``whole`` (C text: the part's neurons are cached, their k-steps' whole extent), else
    with each load's check (rows past ``cached`` from L2): a warp's part is one or the
    other, and the first saves a check, a clamp and an index a load."""
    return [
        *_offsets(shape),
        f"if ({whole}) {{",
        *indent(loop(True)),
        "} else {",
        *indent(loop(False)),
        "}",
    ]


def _offsets(shape: Shape) -> list[str]:
    """``sn_bo``: where the thread's column of each of the unit's column tiles starts in
    the slice, at its first neuron of a k-step (a clamped column past the slice)."""
    neuron = "2 * sn_q" if shape.k == 16 else "sn_q"
    return [
        f"int sn_bo[{COLUMN_TILES}];",
        "#pragma unroll",
        f"for (int nt = 0; nt < {COLUMN_TILES}; ++nt) {{",
        "    const int sn_n = sn_n0 + nt * 8 + sn_g;",
        f"    sn_bo[nt] = (sn_n < (int)S ? sn_n : (int)S - 1) * sn_stride + {neuron};",
        "}",
    ]


def words_sum(dtype: str, stride: str) -> list[str]:
    """The forward: the warp's part of a row's ``tk`` neurons (whole words; parts of
    whole words, :func:`word_chunk`) summed into its unit's C fragments, the A fragments
    made from the rows' spike words staged in ``sn_wtile`` (rows ``stride`` words apart;
    a spike is :data:`ONES`, bits past F are 0), each word loaded once for its 32
    neurons, the B fragments from the slice of ``weight_t``."""
    if dense().spike_term != W:  # the grid's connection
        raise NotImplementedError("tensor cores run a connection whose spike adds its weight")
    shape = SHAPES[dtype]

    def loop(cached: bool) -> list[str]:
        step = [
            "const int k0 = w0 + kk;",
            *_a_words(dtype),
            *_columns(shape, "weight_t", "k0", cached),
        ]
        return [
            "for (int w0 = lo; w0 < hi; w0 += 32) {",
            "    const unsigned int wa32 = wa[w0 >> 5], wb32 = wb[w0 >> 5];",
            "    #pragma unroll",
            f"    for (int kk = 0; kk < 32; kk += {shape.k}) {{",
            *indent(step, 2),
            "    }",
            "}",
        ]

    return [
        *_part(),
        f"const unsigned int* wa = sn_wtile + sn_ra * {stride};",
        f"const unsigned int* wb = sn_wtile + sn_rb * {stride};",
        *_cached_or_not(shape, "hi <= cached", loop),
    ]


def word_chunk() -> str:
    """C text of a part's neurons of a row in the forward: whole words."""
    return "const int sn_chunk = ((tk + sn_bparts - 1) / sn_bparts + 31) / 32 * 32;"


def _part() -> list[str]:
    """The warp's part [lo, hi) of the tile's ``tk`` neurons."""
    return [
        "const int lo = sn_bpart * sn_chunk < tk ? sn_bpart * sn_chunk : tk;",
        "const int hi = lo + sn_chunk < tk ? lo + sn_chunk : tk;",
    ]


def _columns(shape: Shape, source: str, first: str, cached: bool) -> list[str]:
    """For each of the unit's column tiles: the B fragment of the slice of ``source``
    at neurons ``first`` + ... (``cached``: all in the slice), and the mma into its C
    fragment."""
    mma = [
        "asm volatile(",
        f'    "{shape.instruction} "',
        '    "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"',
        '    : "+f"(sn_c[nt][0]), "+f"(sn_c[nt][1]), "+f"(sn_c[nt][2]), "+f"(sn_c[nt][3])',
        '    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));',
    ]
    if cached:
        column = [*_b_cached(shape, first), *mma]
    else:
        column = [
            "const int sn_n = sn_n0 + nt * 8 + sn_g;",
            "const int nn = sn_n < (int)S ? sn_n : (int)S - 1;",
            *_b_fragment(shape, source, first),
            *mma,
        ]
    return [
        "#pragma unroll",
        f"for (int nt = 0; nt < {COLUMN_TILES}; ++nt) {{",
        "    if (sn_n0 + nt * 8 < (int)S) {  // the same in the whole warp",
        *indent(column, 2),
        "    }",
        "}",
    ]


def _a_words(dtype: str) -> list[str]:
    """a0..a3 from rows a and b's spike words (``wa32``, ``wb32``) at their neurons
    ``kk`` + ...: a spike's bit as :data:`ONES`, 0 else; in 16-bit two neurons a
    register, the lower one in the low half."""
    one, k = ONES[dtype], SHAPES[dtype].k
    lines = ["const unsigned int ua = wa32 >> kk, ub = wb32 >> kk;"]
    half = k // 2
    rows = {"a0": ("ua", 0), "a1": ("ub", 0), "a2": ("ua", half), "a3": ("ub", half)}
    for name, (word, at) in rows.items():
        if k == 16:
            bits = f"({word} >> (2 * sn_q + {at}))"
            value = f"((({bits} & 1u) * {one:#x}u) | ((({bits} >> 1) & 1u) * {one << 16:#x}u))"
        else:
            value = f"((({word} >> (sn_q + {at})) & 1u) * {one:#x}u)"
        lines.append(f"const unsigned int {name} = {value};")
    return lines if k == 16 else [*lines, "unsigned int sn_p;  // a weight rounded to TF32"]


def _a_fragment(shape: Shape) -> list[str]:
    """a0..a3: rows sa, sb of the tile at neurons k0 + ... (zeros from ``hi`` on): in
    16-bit a pair of stored values a register as the tile holds it, in TF32 a float
    rounded."""
    wide = shape.k == 16
    step = "2 * sn_q" if wide else "sn_q"
    lines = ["unsigned int a0 = 0u, a1 = 0u, a2 = 0u, a3 = 0u, sn_p;"]
    rows = {"a0": "sa", "a1": "sb", "a2": "sa", "a3": "sb"}
    for i, (name, row) in enumerate(rows.items()):
        at = step if i < 2 else f"{step} + {shape.k // 2}"
        if wide:
            pair = f"*(const unsigned int*)({row} + k0 + {at})"
            lines.append(f"if (k0 + {at} < hi) {name} = {pair};")
            continue
        lines += [
            f"if (k0 + {at} < hi) {{",
            f"    const float v = {row}[k0 + {at}];",
            f"    {_TF32}",
            f"    {name} = sn_p;",
            "}",
        ]
    return lines


def _b_fragment(shape: Shape, source: str, first: str) -> list[str]:
    """b0, b1: column ``nn`` of the slice of ``source`` at neurons ``first`` + ...: from
    the slice by columns (16-bit: a pair of neurons in one load) while they are cached,
    else from L2 (a row past F: its last, which A's zeros cancel)."""
    clamped = "(long long)(sn_m < F ? sn_m : F - 1) * F + (cs0 + nn < F ? cs0 + nn : F - 1)"
    l2 = f"{source}[{clamped}]"
    wide = shape.k == 16
    step = "2 * sn_q" if wide else "sn_q"
    lines = ["unsigned int b0, b1;"]
    for name, at in {"b0": step, "b1": f"{step} + {shape.k // 2}"}.items():
        lines += ["{", f"    int sn_m = {first} + {at};"]
        if wide:
            lines += [
                "    if (sn_m + 1 < cached) {",
                f"        {name} = *(const unsigned int*)(sn_wslice + nn * sn_stride + sn_m);",
                "    } else {",
                f"        const unsigned int lo = {l2};",
                "        ++sn_m;",
                f"        {name} = lo | ((unsigned int){l2} << 16);",
                "    }",
            ]
        else:
            lines += [
                f"    const float v = sn_m < cached ? sn_wslice[nn * sn_stride + sn_m] : {l2};",
                f"    {_TF32}",
                f"    {name} = sn_p;",
            ]
        lines.append("}")
    return lines


def _b_cached(shape: Shape, first: str) -> list[str]:
    """b0, b1 from the cached slice at the thread's column (``sn_bo``) and neurons
    ``first`` + ...: in 16-bit a pair of neurons a load, in TF32 a float rounded."""
    if shape.k == 16:
        pair = "*(const unsigned int*)(sn_wslice + sn_bo[nt] + {} + {})"
        return [
            f"const unsigned int b0 = {pair.format(first, 0)};",
            f"const unsigned int b1 = {pair.format(first, 8)};",
        ]
    lines = ["unsigned int b0, b1;"]
    for name, at in (("b0", 0), ("b1", 4)):
        lines += [
            "{",
            f"    const float v = sn_wslice[sn_bo[nt] + {first} + {at}];",
            f"    {_TF32}",
            f"    {name} = sn_p;",
            "}",
        ]
    return lines


def stored() -> list[str]:
    """Each warp's sums into the freed tile as [part][row][column of the slice] (the FMA
    product's layout), the rows and columns of the block only."""
    put = (
        "if (sn_r{row} < group_rows && sn_n + {col} < (int)S) "
        "sn_sums[(sn_bpart * group_rows + sn_r{row}) * S + sn_n + {col}] = sn_c[nt][{i}];"
    )
    cells = [("0", 0), ("0", 1), ("8", 0), ("8", 1)]
    return [
        "const int sn_r0 = sn_r, sn_r8 = sn_r + 8;",
        "#pragma unroll",
        f"for (int nt = 0; nt < {COLUMN_TILES}; ++nt) {{",
        "    const int sn_n = sn_n0 + nt * 8 + 2 * sn_q;",
        *("    " + put.format(row=r, col=c, i=i) for i, (r, c) in enumerate(cells)),
        "}",
    ]
