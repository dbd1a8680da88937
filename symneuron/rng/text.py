"""The C and CUDA forms: the generator and the conversions printed for one target.

:func:`source` is the text a dialect's prelude includes when a kernel draws; its
functions are listed in :mod:`symneuron.rng`. The conversions are printed from the same
functions torch runs (:mod:`symneuron.rng.convert`), one operation per statement.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

from .convert import box_muller, box_muller_fast, rounded, uniform_of
from .philox import PRODUCTS, WORDS

__all__ = ["TARGETS", "Target", "Text", "source"]


@dataclass(frozen=True)
class Target:
    """How :func:`source` prints for one language: the qualifier of every function, the
    integer types, and each operation of a conversion per precision (CUDA's ``__*_rn``
    intrinsics are never fused into a multiply-add)."""

    name: str
    qualifier: str
    header: str
    ops: dict[str, dict[str, str]]
    #: the fast float conversion's operations (CUDA only: 16-bit kernels draw with it)
    fast: dict[str, str] | None = None

    @property
    def templates(self) -> bool:
        """Whether a step's lanes are filled by templates over K (CUDA, where K is a
        template parameter) rather than by functions given K (C)."""
        return self.fast is not None


def _rn(prefix: str) -> dict[str, str]:
    spelled = {op: f"__{prefix}{op}_rn({{}}, {{}})" for op in ("add", "sub", "mul", "div")}
    return {**spelled, "sqrt": f"__{prefix}sqrt_rn({{}})"}


#: the fast conversion's approximate base-2 logarithm, sine, cosine and square root (the
#: GPU's special function unit; inputs are normal numbers or 0, so .ftz changes nothing)
_CUDA_APPROX = "".join(
    f"__device__ __forceinline__ float sn_{op}_approx(float x) {{\n"
    f"    float y;\n"
    f'    asm("{op}.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));\n'
    f"    return y;\n}}\n"
    for op in ("lg2", "sin", "cos", "sqrt")
)

_INFIX = {"add": "{} + {}", "sub": "{} - {}", "mul": "{} * {}", "div": "{} / {}"}

#: the bits of a float or double and back, as C99 unions (vectorisable, unlike frexp)
_C_BITS = """typedef union {
    float f;
    sn_u32 u;
} sn_float_union;
typedef union {
    double f;
    sn_u64 u;
} sn_double_union;
static inline sn_u32 sn_bits_float(float x) { sn_float_union b; b.f = x; return b.u; }
static inline float sn_float_of(sn_u32 u) { sn_float_union b; b.u = u; return b.f; }
static inline sn_u64 sn_bits_double(double x) { sn_double_union b; b.f = x; return b.u; }
static inline double sn_double_of(sn_u64 u) { sn_double_union b; b.u = u; return b.f; }
"""
_CUDA_BITS = """#define sn_bits_float __float_as_uint
#define sn_float_of __uint_as_float
#define sn_bits_double(x) ((sn_u64)__double_as_longlong(x))
#define sn_double_of(u) __longlong_as_double((long long)(u))
"""

#: dialect name (:attr:`symneuron.codegen.dialects.Dialect.name`) -> its target
TARGETS: dict[str, Target] = {
    "c": Target(
        "c",
        # always inlined: a lane loop vectorises only without calls (GCC 12 at -O2 keeps
        # the Box–Muller a call, and the noisy LIF's forward scalar: 25 -> 12 ns a step)
        "static inline __attribute__((always_inline))",
        "#include <math.h>\n#include <stdint.h>\n"
        "typedef uint32_t sn_u32;\ntypedef uint64_t sn_u64;\n" + _C_BITS,
        {
            "float": {**_INFIX, "sqrt": "sqrtf({})"},
            "double": {**_INFIX, "sqrt": "sqrt({})"},
        },
    ),
    "cuda": Target(
        "cuda",
        "__device__ __forceinline__",
        "typedef unsigned int sn_u32;\ntypedef unsigned long long sn_u64;\n"
        + _CUDA_BITS
        + _CUDA_APPROX,
        {"float": _rn("f"), "double": _rn("d")},
        {
            **_rn("f"),
            "lg2": "sn_lg2_approx({})",
            "sin": "sn_sin_approx({})",
            "cos": "sn_cos_approx({})",
            "max": "fmaxf({}, {})",
            "sqrt": "sn_sqrt_approx({})",
        },
    ),
}

#: frexp of a positive normal number from its bits: (unsigned type, mantissa mask,
#: exponent field of [1/2, 1), exponent shift, exponent of [1/2, 1))
_FIELDS = {
    "float": ("sn_u32", "0x807FFFFFu", "0x3F000000u", 23, 126),
    "double": ("sn_u64", "0x800FFFFFFFFFFFFFull", "0x3FE0000000000000ull", 52, 1022),
}


class Text:
    """Prints a conversion as C statements, one operation (one rounding) per statement."""

    def __init__(self, target: Target, precision: str, fast: bool = False) -> None:
        self.spelled = target.fast if fast and target.fast else target.ops[precision]
        self.precision = precision
        self.lines: list[str] = []

    def _let(self, ctype: str, expr: str) -> str:
        name = f"t{len(self.lines)}"
        self.lines.append(f"const {ctype} {name} = {expr};")
        return name

    def _op(self, op: str, *args: str) -> str:
        return self._let(self.precision, self.spelled[op].format(*args))

    def const(self, x: float) -> str:
        value = rounded(x, self.precision)
        literal = re.sub(r"\.?0*p", "p", value.hex()) + ("f" if self.precision == "float" else "")
        return f"({literal})" if value < 0 else literal

    def add(self, a: str, b: str) -> str:
        return self._op("add", a, b)

    def sub(self, a: str, b: str) -> str:
        return self._op("sub", a, b)

    def mul(self, a: str, b: str) -> str:
        return self._op("mul", a, b)

    def div(self, a: str, b: str) -> str:
        return self._op("div", a, b)

    def sqrt(self, a: str) -> str:
        return self._op("sqrt", a)

    def lg2(self, a: str) -> str:
        return self._op("lg2", a)

    def sin(self, a: str) -> str:
        return self._op("sin", a)

    def cos(self, a: str) -> str:
        return self._op("cos", a)

    def max(self, a: str, b: str) -> str:
        return self._op("max", a, b)

    def neg(self, a: str) -> str:
        return self._let(self.precision, f"-{a}")

    def lt(self, a: str, b: str) -> str:
        return self._let("int", f"{a} < {b}")

    def where(self, c: str, a: str, b: str) -> str:
        return self._let(self.precision, f"{c} ? {a} : {b}")

    def frexp(self, a: str) -> tuple[str, str]:
        """``frexp`` of a positive normal number, read off its bits (exact)."""
        unsigned, mask, half, shift, bias = _FIELDS[self.precision]
        bits = self._let(unsigned, f"sn_bits_{self.precision}({a})")
        m = self._let(self.precision, f"sn_{self.precision}_of(({bits} & {mask}) | {half})")
        return m, self._let(
            self.precision, f"({self.precision})((int)({bits} >> {shift}) - {bias})"
        )

    def real(self, n: str) -> str:
        return self._let(self.precision, f"({self.precision}){n}")

    def shr(self, n: str, k: int) -> str:
        return self._let("sn_u32", f"{n} >> {k}")

    def bor(self, n: str, k: int) -> str:
        return self._let("sn_u32", f"{n} | {k}u")

    def iadd(self, n: str, k: int) -> str:
        return self._let("sn_u32", f"{n} + {k}u")

    def bit(self, n: str, k: int) -> str:
        return self._let("int", f"({n} & {k}u) != 0")


def _function(qualifier: str, signature: str, lines: list[str], result: str) -> str:
    body = "".join(f"    {line}\n" for line in lines)
    return f"{qualifier} {signature} {{\n{body}    return {result};\n}}\n"


def _conversions(target: Target, real: str) -> str:
    """``sn_uniform_<real>`` and ``sn_box_muller_<real>``, printed from the torch form."""
    text = Text(target, real)
    u = uniform_of(text, "w")
    uniform = _function(target.qualifier, f"{real} sn_uniform_{real}(sn_u32 w)", text.lines, u)
    text = Text(target, real)
    z0, z1 = box_muller(text, "wu", "wv", real)
    text.lines.append(f"const sn_pair_{real} out = {{{z0}, {z1}}};")
    signature = f"sn_pair_{real} sn_box_muller_{real}(sn_u32 wu, sn_u32 wv)"
    pair = f"typedef struct {{\n    {real} z0, z1;\n}} sn_pair_{real};\n"
    return "\n".join([pair, uniform, _function(target.qualifier, signature, text.lines, "out")])


#: the draws of one key (``{q}``: qualifier, ``{t}``: float or double)
_DRAWS = """{q} {t} sn_rng_uniform_{t}(
    sn_u64 seed, sn_u64 offset, sn_u32 stream, sn_u64 step, sn_u64 neuron) {{
    return sn_uniform_{t}(sn_word(sn_rng_block(seed, offset, stream, step, neuron), neuron));
}}

{q} {t} sn_rng_normal_{t}(
    sn_u64 seed, sn_u64 offset, sn_u32 stream, sn_u64 step, sn_u64 neuron) {{
    return sn_normal_{t}(sn_rng_block(seed, offset, stream, step, neuron), neuron);
}}
"""


def _fast(target: Target) -> str:
    """``sn_box_muller_fast_float`` and ``sn_normal_fast_float`` (CUDA only)."""
    text = Text(target, "float", fast=True)
    z0, z1 = box_muller_fast(text, "wu", "wv")
    text.lines.append(f"const sn_pair_float out = {{{z0}, {z1}}};")
    signature = "sn_pair_float sn_box_muller_fast_float(sn_u32 wu, sn_u32 wv)"
    pair = _function(target.qualifier, signature, text.lines, "out")
    return pair + _NORMAL.format(q=target.qualifier, t="float", fast="_fast")


#: normal neuron % 4 of a block (``{fast}``: "" or "_fast")
_NORMAL = """/* normal neuron % 4 of a block: Box-Muller of words (0, 1) gives normals 0 and 1,
   of words (2, 3) normals 2 and 3 */
{q} {t} sn_normal{fast}_{t}(sn_u32x4 w, sn_u64 neuron) {{
    const sn_u32 j = (sn_u32)neuron & 3u;
    const sn_pair_{t} z = sn_box_muller{fast}_{t}(j & 2u ? w.v[2] : w.v[0],
                                                  j & 2u ? w.v[3] : w.v[1]);
    return j & 1u ? z.z1 : z.z0;
}}
"""

#: CUDA: the draws of a thread's K lanes i0 .. i0 + K − 1 at one step, i0 a multiple of
#: K: one Philox block per four lanes and one Box–Muller per two (K % 4 == 0, or K % 2
#: == 0 for pairs), else one each; the same values as one key at a time
_LANES = """template <int K>
__device__ __forceinline__ void sn_rng_normals{fast}_{t}(
    {t}* z, sn_u64 seed, sn_u64 offset, sn_u32 stream, sn_u64 step, sn_u64 i0) {{
    if constexpr (K % 4 == 0) {{
        #pragma unroll
        for (int g = 0; g < K; g += 4) {{
            const sn_u32x4 w = sn_rng_block(seed, offset, stream, step, i0 + g);
            const sn_pair_{t} a = sn_box_muller{fast}_{t}(w.v[0], w.v[1]);
            const sn_pair_{t} b = sn_box_muller{fast}_{t}(w.v[2], w.v[3]);
            z[g] = a.z0;
            z[g + 1] = a.z1;
            z[g + 2] = b.z0;
            z[g + 3] = b.z1;
        }}
    }} else if constexpr (K % 2 == 0) {{
        #pragma unroll
        for (int g = 0; g < K; g += 2) {{
            const sn_u32x4 w = sn_rng_block(seed, offset, stream, step, i0 + g);
            const bool second = ((i0 + g) & 2u) != 0;
            const sn_pair_{t} a = sn_box_muller{fast}_{t}(second ? w.v[2] : w.v[0],
                                                          second ? w.v[3] : w.v[1]);
            z[g] = a.z0;
            z[g + 1] = a.z1;
        }}
    }} else {{
        #pragma unroll
        for (int j = 0; j < K; ++j) {{
            z[j] = sn_normal{fast}_{t}(sn_rng_block(seed, offset, stream, step, i0 + j), i0 + j);
        }}
    }}
}}
"""


#: C: the draws of lanes i0 .. i0 + k − 1 at one step, as the CUDA templates: one
#: Philox block per four lanes and one Box–Muller per two when k and i0 are multiples
#: of 4 (a wide kernel's lanes), else one each; the same values as one key at a time
_C_LANES = """{q} void sn_rng_normals_{t}(
    {t}* z, int k, sn_u64 seed, sn_u64 offset, sn_u32 stream, sn_u64 step, sn_u64 i0) {{
    if (k % 4 == 0 && (i0 & 3u) == 0) {{
        for (int g = 0; g < k; g += 4) {{
            const sn_u32x4 w = sn_rng_block(seed, offset, stream, step, i0 + g);
            const sn_pair_{t} a = sn_box_muller_{t}(w.v[0], w.v[1]);
            const sn_pair_{t} b = sn_box_muller_{t}(w.v[2], w.v[3]);
            z[g] = a.z0;
            z[g + 1] = a.z1;
            z[g + 2] = b.z0;
            z[g + 3] = b.z1;
        }}
    }} else {{
        for (int j = 0; j < k; ++j) {{
            z[j] = sn_normal_{t}(sn_rng_block(seed, offset, stream, step, i0 + j), i0 + j);
        }}
    }}
}}
"""


#: C: the uniforms of lanes i0 .. i0 + k − 1 at one step, one Philox block per four
#: lanes as :data:`_C_LANES` (word j % 4 of lane j's block, as ``sn_word``)
_C_UNIFORMS = """{q} void sn_rng_uniforms_{t}(
    {t}* u, int k, sn_u64 seed, sn_u64 offset, sn_u32 stream, sn_u64 step, sn_u64 i0) {{
    if (k % 4 == 0 && (i0 & 3u) == 0) {{
        for (int g = 0; g < k; g += 4) {{
            const sn_u32x4 w = sn_rng_block(seed, offset, stream, step, i0 + g);
            for (int i = 0; i < 4; ++i) {{
                u[g + i] = sn_uniform_{t}(w.v[i]);
            }}
        }}
    }} else {{
        for (int j = 0; j < k; ++j) {{
            u[j] = sn_rng_uniform_{t}(seed, offset, stream, step, i0 + j);
        }}
    }}
}}
"""


def _lanes(target: Target) -> list[str]:
    """The functions that fill a step's K lanes: CUDA templates, C functions."""
    if not target.templates:
        lanes = (_C_LANES, _C_UNIFORMS)
        return [
            text.format(q=target.qualifier, t=real)
            for real in ("float", "double")
            for text in lanes
        ]
    parts = [_fast(target)]
    for real, fast in (("float", ""), ("double", ""), ("float", "_fast")):
        parts.append(_LANES.format(t=real, fast=fast))
    return parts


@cache
def source(target: str) -> str:
    """The generator and the draws as C (``"c"``) or CUDA (``"cuda"``) text.

    Every function is ``static inline`` (C) or ``__device__ __forceinline__`` (CUDA);
    the C text includes ``<math.h>`` and ``<stdint.h>``, the CUDA text no header (NVRTC
    provides the ``__*_rn`` intrinsics and ``__float_as_uint``). Names: see :mod:`symneuron.rng`.

    Examples
    --------
    >>> "sn_rng_normal_float" in source("cuda")
    True
    """
    if target not in TARGETS:
        raise ValueError(
            f"No random-number text for target {target!r}; targets: {sorted(TARGETS)}."
        )
    row = TARGETS[target]
    parts = [row.header, WORDS.format(q=row.qualifier, products=PRODUCTS[target])]
    for real in ("float", "double"):
        parts += [_conversions(row, real), _NORMAL.format(q=row.qualifier, t=real, fast="")]
        parts.append(_DRAWS.format(q=row.qualifier, t=real))
    return "\n".join(parts + _lanes(row))
