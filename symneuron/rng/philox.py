"""Philox4x32-7 and the key layout: the words of a draw, as torch code and as C text.

Seven rounds, the fewest of which Salmon et al. (2011) report that the generator passes
every test of TestU01's BigCrush (Random123 defaults to ten, for a margin; the ten-round
form is :func:`philox4x32` with ``rounds=10``, checked against Random123's known answers
as the seven-round one is). The three rounds fewer take about a quarter off a draw's
cost on a GPU, where a noisy neuron's backward is bound by its draws' instructions.

The torch form works on int64 tensors (or ints), each word in [0, 2^32): the 32×32-bit
products are split so that no intermediate leaves int64. The C text (:data:`WORDS`) is
the same generator for C and CUDA, with the qualifier of the target's functions filled
in by :func:`symneuron.rng.source`.
"""

from __future__ import annotations

import torch

__all__ = [
    "ESCAPE_STREAM",
    "GROUP",
    "PHILOX_M",
    "PHILOX_W",
    "PRODUCTS",
    "ROUNDS",
    "WORDS",
    "Int",
    "philox4x32",
    "words",
]

#: Philox4x32 round multipliers and Weyl key increments (Random123)
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
#: the rounds of every draw (Philox4x32-7)
ROUNDS = 7
#: adjacent neurons that share one Philox block
GROUP = 4
#: the stream of escape-noise uniforms (noise sources take 0, 1, ...)
ESCAPE_STREAM = 0xFFFF
_M32 = 0xFFFFFFFF
_LIMIT = 1 << 63

Int = int | torch.Tensor


def _mulhilo(a: Int, m: int) -> tuple[Int, Int]:
    """(high, low) 32-bit halves of a·m, for a < 2^32, without leaving int64: a is split
    into 16-bit halves, whose products with m stay below 2^48."""
    low = (a & 0xFFFF) * m
    high = (a >> 16) * m
    mid = low + ((high & 0xFFFF) << 16)
    return (high >> 16) + (mid >> 32), mid & _M32


def philox4x32(
    counter: tuple[Int, Int, Int, Int], key: tuple[Int, Int], rounds: int = ROUNDS
) -> tuple[Int, Int, Int, Int]:
    """Philox4x32 with ``rounds`` rounds (the draws' :data:`ROUNDS` by default) of 32-bit
    ``counter`` and ``key`` words (ints or int64 tensors, broadcast): the four output
    words, each in [0, 2^32).

    Examples
    --------
    >>> [hex(w) for w in philox4x32((0, 0, 0, 0), (0, 0))]
    ['0x5f6fb709', '0xd893f64', '0x4f121f81', '0x4f730a48']
    >>> [hex(w) for w in philox4x32((0, 0, 0, 0), (0, 0), rounds=10)]
    ['0x6627e8d5', '0xe169c58d', '0xbc57ac4c', '0x9b00dbd8']
    """
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + PHILOX_W[0]) & _M32, (k1 + PHILOX_W[1]) & _M32
        hi0, lo0 = _mulhilo(c0, PHILOX_M[0])
        hi1, lo1 = _mulhilo(c2, PHILOX_M[1])
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def _checked(name: str, value: Int) -> Int:
    """A seed or offset: an int in [0, 2^63), or an int64 tensor of one value (a device
    scalar, not read here)."""
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.int64 or value.numel() != 1:
            raise TypeError(
                f"{name} as a tensor must hold one int64 value, not {value.dtype} of shape "
                f"{tuple(value.shape)}; pass e.g. torch.tensor({name}, dtype=torch.int64)."
            )
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer in [0, 2**63), not {value!r}.")
    if not 0 <= value < _LIMIT:
        raise ValueError(f"{name} must be in [0, 2**63), not {value}; pass e.g. {name} % 2**63.")
    return value


def words(seed: Int, offset: Int, stream: int, step: Int, neuron: Int) -> tuple[Int, Int, Int, Int]:
    """The Philox block of each (step, neuron): four int64 tensors of 32-bit words.

    ``step`` and ``neuron`` (non-negative; ints or int64 tensors) broadcast; ``seed``
    and ``offset`` are ints in [0, 2^63) or one-value int64 tensors (device scalars);
    ``stream`` is an int in [0, 2^16). The neurons of one group (``neuron // 4``) share
    the block; see the module docstring for the layout.
    """
    seed, offset = _checked("seed", seed), _checked("offset", offset)
    if not 0 <= stream <= ESCAPE_STREAM:
        raise ValueError(f"stream must be in [0, {ESCAPE_STREAM}], not {stream}.")
    group = neuron >> 2
    time = offset + step
    counter = (group & _M32, group >> 32, time & _M32, ((time >> 32) & 0xFFFF) | (stream << 16))
    return philox4x32(counter, (seed & _M32, (seed >> 32) & _M32))


def _rounds() -> str:
    """The rounds of the C text, each with its bumped key (k + r·W mod 2^32)."""
    lines = []
    for r in range(ROUNDS):
        k0, k1 = ((r * w) & _M32 for w in PHILOX_W)
        bumped = f"k0 + 0x{k0:08X}u, k1 + 0x{k1:08X}u" if r else "k0, k1"
        lines.append(f"    c = sn_philox_round(c, {bumped});")
    return "\n".join(lines)


#: The products of a round per target: C as 64-bit products; CUDA with ``__umulhi`` for
#: the high halves (the same bits; ptxas turns a 64-bit product's high half into one
#: multiply and an add, ``__umulhi`` into one multiply: 20 instructions fewer per call)
PRODUCTS = {
    "c": """    const sn_u64 p0 = (sn_u64)0xD2511F53u * c.v[0];
    const sn_u64 p1 = (sn_u64)0xCD9E8D57u * c.v[2];
    const sn_u32x4 out = {{(sn_u32)(p1 >> 32) ^ c.v[1] ^ k0, (sn_u32)p1,
                           (sn_u32)(p0 >> 32) ^ c.v[3] ^ k1, (sn_u32)p0}};""",
    "cuda": """    const sn_u32 h0 = __umulhi(0xD2511F53u, c.v[0]);
    const sn_u32 h1 = __umulhi(0xCD9E8D57u, c.v[2]);
    const sn_u32x4 out = {{h1 ^ c.v[1] ^ k0, 0xCD9E8D57u * c.v[2],
                           h0 ^ c.v[3] ^ k1, 0xD2511F53u * c.v[0]}};""",
}

#: Philox and the key layout in C and CUDA (``{q}``: the functions' qualifier,
#: ``{products}``: the target's :data:`PRODUCTS`)
WORDS = (
    """typedef struct {{
    sn_u32 v[4];
}} sn_u32x4;

/* one Philox4x32 round: two 32x32 -> 64-bit products, the halves crossed and keyed */
{q} sn_u32x4 sn_philox_round(sn_u32x4 c, sn_u32 k0, sn_u32 k1) {{
{products}
    return out;
}}

/* Philox4x32-"""
    + str(ROUNDS)
    + """ (Salmon et al. 2011, Random123) */
{q} sn_u32x4 sn_philox4x32(sn_u32x4 c, sn_u32 k0, sn_u32 k1) {{
"""
    + _rounds()
    + """
    return c;
}}

/* the block of a draw: key = seed; counter = (neuron / 4 in 64 bits, offset + step in
   48 bits, stream in the top 16 bits); neuron n takes word (or normal) n % 4 of it */
{q} sn_u32x4 sn_rng_block(
    sn_u64 seed, sn_u64 offset, sn_u32 stream, sn_u64 step, sn_u64 neuron) {{
    const sn_u64 group = neuron >> 2;
    const sn_u64 time = offset + step;
    const sn_u32x4 c = {{{{(sn_u32)group, (sn_u32)(group >> 32), (sn_u32)time,
                         ((sn_u32)(time >> 32) & 0xFFFFu) | (stream << 16)}}}};
    return sn_philox4x32(c, (sn_u32)seed, (sn_u32)(seed >> 32));
}}

/* word neuron % 4 of a block */
{q} sn_u32 sn_word(sn_u32x4 w, sn_u64 neuron) {{
    const sn_u32 j = (sn_u32)neuron & 3u;
    return j == 0u ? w.v[0] : j == 1u ? w.v[1] : j == 2u ? w.v[2] : w.v[3];
}}
"""
)
