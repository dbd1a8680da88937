"""The conversions of words to uniforms and normals, written once: torch runs them
(:class:`Torch`), :mod:`symneuron.rng.text` prints them as C or CUDA.

Each conversion is a function of an ops object (:class:`Ops`) and does one IEEE
operation per call, in one order, so every form rounds the same way (see
:mod:`symneuron.rng` for why the normals do not call ln, sin or cos).
"""

from __future__ import annotations

import functools
import math
import struct
from typing import Any, Protocol

import sympy as sp
import torch

from .philox import Int, words

__all__ = [
    "Ops",
    "Torch",
    "box_muller",
    "box_muller_fast",
    "normal",
    "normal_fast",
    "rounded",
    "sqrt",
    "uniform",
    "uniform_of",
]

#: torch dtype -> the C type of the same precision
PRECISIONS = {torch.float32: "float", torch.float64: "double"}


class Ops(Protocol):
    """The operations of a conversion: :class:`Torch` runs them,
    :class:`~symneuron.rng.text.Text` prints them."""

    def const(self, x: float) -> Any: ...
    def add(self, a: Any, b: Any) -> Any: ...
    def sub(self, a: Any, b: Any) -> Any: ...
    def mul(self, a: Any, b: Any) -> Any: ...
    def div(self, a: Any, b: Any) -> Any: ...
    def sqrt(self, a: Any) -> Any: ...
    def lg2(self, a: Any) -> Any: ...
    def sin(self, a: Any) -> Any: ...
    def cos(self, a: Any) -> Any: ...
    def max(self, a: Any, b: Any) -> Any: ...
    def neg(self, a: Any) -> Any: ...
    def lt(self, a: Any, b: Any) -> Any: ...
    def where(self, c: Any, a: Any, b: Any) -> Any: ...
    def frexp(self, a: Any) -> tuple[Any, Any]: ...
    def real(self, n: Any) -> Any: ...
    def shr(self, n: Any, k: int) -> Any: ...
    def bor(self, n: Any, k: int) -> Any: ...
    def iadd(self, n: Any, k: int) -> Any: ...
    def bit(self, n: Any, k: int) -> Any: ...


@functools.cache
def _coefficients(precision: str) -> dict[str, list[float]]:
    """Taylor coefficients (rounded to the dtype when used): of atanh, as
    ln m = 2s(1 + Σ z^k/(2k+1)) with z = s², and of sin(πf/2)/f and cos(πf/2) in g = f²,
    with enough terms that the truncation stays below 1/20 ulp of the dtype on the
    reduced ranges (|s| ≤ 0.172, |f| ≤ ½); ln 2 split so that e·ln2_hi is exact."""
    atanh, sin, cos = {"float": (4, 5, 6), "double": (10, 9, 9)}[precision]
    ln2_hi = {"float": 0.693145751953125, "double": 0.6931471803691238}[precision]
    x = sp.pi / 2
    return {
        "atanh": [1.0 / (2 * k + 1) for k in range(1, atanh + 1)],
        "sin": [_value((-1) ** k * x ** (2 * k + 1) / sp.factorial(2 * k + 1)) for k in range(sin)],
        "cos": [_value((-1) ** k * x ** (2 * k) / sp.factorial(2 * k)) for k in range(cos)],
        "ln2": [ln2_hi, _value(sp.log(2) - sp.Rational(ln2_hi))],
    }


def _value(exact: sp.Expr) -> float:
    """The double nearest to an exact SymPy number (evaluated to 40 digits)."""
    return float(sp.N(exact, 40))


def _horner(o: Ops, x: Any, coefficients: list[float]) -> Any:
    """Σ c_k x^k, highest term first, one rounding per + and ×."""
    acc = o.const(coefficients[-1])
    for c in reversed(coefficients[:-1]):
        acc = o.add(o.mul(acc, x), o.const(c))
    return acc


def _odd24(o: Ops, w: Any) -> Any:
    """2·(w div 2^9) + 1: the top 23 bits of w and a last bit 1 (a cell's midpoint)."""
    return o.bor(o.shr(w, 8), 1)


def uniform_of(o: Ops, w: Any) -> Any:
    """u = (2·(w div 2^9) + 1)·2^-24, exact in float32 and float64."""
    return o.mul(o.real(_odd24(o, w)), o.const(2.0**-24))


def _log(o: Ops, u: Any, k: dict[str, list[float]]) -> Any:
    """ln u for u in (0, 1): u = m·2^e with m in [√½, √2), ln m = 2 atanh((m−1)/(m+1))."""
    m, e = o.frexp(u)
    low = o.lt(m, o.const(0.5**0.5))
    m, e = o.where(low, o.add(m, m), m), o.where(low, o.sub(e, o.const(1.0)), e)
    s = o.div(o.sub(m, o.const(1.0)), o.add(m, o.const(1.0)))
    z = o.mul(s, s)
    s2 = o.add(s, s)
    log_m = o.add(s2, o.mul(o.mul(s2, z), _horner(o, z, k["atanh"])))
    ln2_hi, ln2_lo = k["ln2"]
    return o.add(o.mul(e, o.const(ln2_hi)), o.add(o.mul(e, o.const(ln2_lo)), log_m))


def _turn(o: Ops, w: Any, k: dict[str, list[float]]) -> tuple[Any, Any]:
    """(cos 2πv, sin 2πv) for the uniform v of word w: 4v = n·2^-22 = j + f exactly, with
    j the nearest integer (never a tie: n is odd), then rotated by j quarter turns; the
    polynomials of f are ``k``'s."""
    n = _odd24(o, w)
    j = o.shr(o.iadd(n, 1 << 21), 22)
    f = o.sub(o.mul(o.real(n), o.const(2.0**-22)), o.real(j))
    g = o.mul(f, f)
    sin_f, cos_f = o.mul(f, _horner(o, g, k["sin"])), _horner(o, g, k["cos"])
    odd, half, flip_cos = o.bit(j, 1), o.bit(j, 2), o.bit(o.iadd(j, 1), 2)
    a, b = o.where(odd, sin_f, cos_f), o.where(odd, cos_f, sin_f)
    return o.where(flip_cos, o.neg(a), a), o.where(half, o.neg(b), b)


def box_muller(o: Ops, wu: Any, wv: Any, precision: str) -> tuple[Any, Any]:
    """The two normals of words (wu, wv): √(−2 ln u)·(cos 2πv, sin 2πv)."""
    k = _coefficients(precision)
    r = o.sqrt(o.mul(_log(o, uniform_of(o, wu), k), o.const(-2.0)))
    cos, sin = _turn(o, wv, k)
    return o.mul(r, cos), o.mul(r, sin)


#: −2 ln 2, the fast radius's factor (rounded to float32 by ``const``)
_MINUS_2_LN2 = -2.0 * math.log(2.0)


def box_muller_fast(o: Ops, wu: Any, wv: Any) -> tuple[Any, Any]:
    """The two float normals of words (wu, wv) as :func:`box_muller`, by the GPU's special
    function unit: √(−2 ln 2 · log₂ u) with an approximate base-2 logarithm and square
    root (``lg2``, ``sqrt``; clamped at 0, where u is within an ulp or two of 1), and the
    angle 2πv = π + θ with θ = 2π(v − ½) in (−π, π) (v − ½ is exact), so that
    (cos 2πv, sin 2πv) = −(cos θ, sin θ) by the approximate ``cos`` and ``sin``.
    About 20 instructions a pair, where the exact conversion takes about 100."""
    r2 = o.mul(o.lg2(uniform_of(o, wu)), o.const(_MINUS_2_LN2))
    minus_r = o.neg(o.sqrt(o.max(r2, o.const(0.0))))
    theta = o.mul(o.sub(uniform_of(o, wv), o.const(0.5)), o.const(2.0 * math.pi))
    return o.mul(minus_r, o.cos(theta)), o.mul(minus_r, o.sin(theta))


def rounded(x: float, precision: str) -> float:
    return struct.unpack("f", struct.pack("f", x))[0] if precision == "float" else x


def sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded √x of positive float64 ``x``.

    torch's CPU square root (MKL) is within one ulp but not correctly rounded (1% of
    float64 results, 16% of float32). Its y is moved one ulp up when
    x > (y + u/2)², u the spacing above y, that is when the exact residual
    r = x − y² exceeds y·u (r − y·u is a multiple of u², and x is never a midpoint's
    square); down likewise. r is exact: y is split into two 26-bit halves (Veltkamp), so
    every product is exact, and each difference is representable (Dekker).
    """
    y = torch.sqrt(x)
    split = y * 134217729.0  # 2^27 + 1
    high = split - (split - y)
    low = y - high
    r = ((x - high * high) - 2.0 * high * low) - low * low
    up = torch.nextafter(y, torch.full_like(y, math.inf))
    down = torch.nextafter(y, torch.zeros_like(y))
    return torch.where(r > y * (up - y), up, torch.where(r <= -y * (y - down), down, y))


class Torch:
    """Runs a conversion on tensors of one dtype, one torch operation per step."""

    def __init__(self, precision: str) -> None:
        self.precision = precision
        self.dtype = {"float": torch.float32, "double": torch.float64}[precision]

    def const(self, x: float) -> float:
        return rounded(x, self.precision)

    def add(self, a: torch.Tensor, b: Any) -> torch.Tensor:
        return a + b

    def sub(self, a: torch.Tensor, b: Any) -> torch.Tensor:
        return a - b

    def mul(self, a: torch.Tensor, b: Any) -> torch.Tensor:
        return a * b

    def div(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a / b

    def sqrt(self, a: torch.Tensor) -> torch.Tensor:
        return sqrt(a.double()).to(self.dtype)  # float32: rounding twice is harmless here

    def lg2(self, a: torch.Tensor) -> torch.Tensor:
        return torch.log2(a)

    def sin(self, a: torch.Tensor) -> torch.Tensor:
        return torch.sin(a)

    def cos(self, a: torch.Tensor) -> torch.Tensor:
        return torch.cos(a)

    def max(self, a: torch.Tensor, b: Any) -> torch.Tensor:
        return torch.clamp_min(a, b)

    def neg(self, a: torch.Tensor) -> torch.Tensor:
        return -a

    def lt(self, a: torch.Tensor, b: Any) -> torch.Tensor:
        return a < b

    def where(self, c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.where(c, a, b)

    def frexp(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(m, e) with a = m·2^e, m in [1/2, 1): exact, as the C text's bit fields."""
        m, e = torch.frexp(a)
        return m, e.to(self.dtype)

    def real(self, n: torch.Tensor) -> torch.Tensor:
        return n.to(self.dtype)

    def shr(self, n: torch.Tensor, k: int) -> torch.Tensor:
        return n >> k

    def bor(self, n: torch.Tensor, k: int) -> torch.Tensor:
        return n | k

    def iadd(self, n: torch.Tensor, k: int) -> torch.Tensor:
        return n + k

    def bit(self, n: torch.Tensor, k: int) -> torch.Tensor:
        return (n & k) != 0


def _precision(dtype: torch.dtype) -> str:
    if dtype not in PRECISIONS:
        raise TypeError(
            f"Draws are float32 or float64, not {dtype}; 16-bit kernels draw in float32 "
            "(their compute type): pass dtype=torch.float32 and round the result."
        )
    return PRECISIONS[dtype]


def uniform(
    seed: Int,
    offset: Int,
    stream: int,
    step: Int,
    neuron: Int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The uniform draw in (0, 1) of each (step, neuron): word ``neuron % 4`` of its
    block, as (2·(w div 2^9) + 1)·2^-24 (the same value in both dtypes).

    Arguments as :func:`symneuron.rng.words`; ``dtype`` float32 or float64. The C and
    CUDA forms (``sn_rng_uniform_float``, ``sn_rng_uniform_double``) give the same bits.

    Examples
    --------
    >>> u = uniform(seed=1, offset=0, stream=0, step=0, neuron=torch.arange(4))
    >>> bool(((u > 0) & (u < 1)).all())
    True
    """
    precision = _precision(dtype)
    neuron = torch.as_tensor(neuron, dtype=torch.int64)
    w0, w1, w2, w3 = words(seed, offset, stream, step, neuron)
    j = neuron & 3
    word = torch.where(j == 0, w0, torch.where(j == 1, w1, torch.where(j == 2, w2, w3)))
    return uniform_of(Torch(precision), word)


def normal(
    seed: Int,
    offset: Int,
    stream: int,
    step: Int,
    neuron: Int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The standard normal draw of each (step, neuron): normal ``neuron % 4`` of its
    block, Box–Muller of its words (0, 1) for normals 0 and 1, of (2, 3) for 2 and 3.

    Arguments as :func:`symneuron.rng.words`; ``dtype`` float32 or float64. The C and
    CUDA forms (``sn_rng_normal_float``, ``sn_rng_normal_double``) give the same bits.

    Examples
    --------
    >>> z = normal(seed=1, offset=0, stream=0, step=torch.arange(100)[:, None],
    ...            neuron=torch.arange(1000), dtype=torch.float64)
    >>> z.shape, bool(abs(z.mean()) < 0.02 and abs(z.std() - 1) < 0.02)
    (torch.Size([100, 1000]), True)
    """
    precision = _precision(dtype)
    neuron = torch.as_tensor(neuron, dtype=torch.int64)
    w0, w1, w2, w3 = words(seed, offset, stream, step, neuron)
    second = (neuron & 2) != 0
    ops = Torch(precision)
    z0, z1 = box_muller(ops, torch.where(second, w2, w0), torch.where(second, w3, w1), precision)
    return torch.where((neuron & 1) != 0, z1, z0)


def normal_fast(seed: Int, offset: Int, stream: int, step: Int, neuron: Int) -> torch.Tensor:
    """The float32 normals of :func:`normal` by the fast conversion
    (:func:`box_muller_fast`), as 16-bit CUDA kernels draw them: here with torch's
    float32 ``log2``, ``sin`` and ``cos`` and a correctly rounded square root, where the
    GPU's special function unit approximates them, so this is a model of the GPU's value
    (to about 1e-6, see :mod:`symneuron.rng`), not its bits."""
    neuron = torch.as_tensor(neuron, dtype=torch.int64)
    w0, w1, w2, w3 = words(seed, offset, stream, step, neuron)
    second = (neuron & 2) != 0
    z0, z1 = box_muller_fast(
        Torch("float"), torch.where(second, w2, w0), torch.where(second, w3, w1)
    )
    return torch.where((neuron & 1) != 0, z1, z0)
