"""CUDA's gather over the set bits of spike words: the neurons whose bits are set, found
in batches and their weights loaded together (:meth:`~.dialects.Dialect.each_set`)."""

from __future__ import annotations

from collections.abc import Callable

from .lines import indent

__all__ = ["GATHER", "Fetch", "each_bit"]

#: neurons whose weights a CUDA gather over set bits loads before it uses the first
GATHER = 8

#: lines that fetch (or use) one neuron's values in the array named by the argument
Fetch = Callable[[str], list[str]]


def each_bit(
    words: str,
    count: str,
    index: str,
    storage: str,
    fetch: Fetch,
    use: Fetch,
    unroll: list[str],
) -> list[str]:
    """CUDA: :meth:`~.dialects.Dialect.each_set` with the neuron of bit ``b`` of word ``q`` at
    ``index``: batches of the next :data:`GATHER` set bits' neurons, across words (−1
    past the last), their values fetched into ``sn_wg[u]``, then used in the same
    order. The batch's loop is unrolled, so its loads are issued together (one at a
    time, each waited for, they were the step's critical path); ``unroll`` is the
    dialect's hint that does it."""
    each = [*unroll, f"for (int u = 0; u < {GATHER}; ++u) {{"]
    return [
        f"const unsigned int* voted = {words};",
        f"const long long sn_q1 = {count};",
        "long long q = 0;",
        "unsigned int bits = sn_q1 > 0 ? voted[0] : 0u;",
        "while (true) {",
        f"    long long sn_m[{GATHER}];",
        *indent(each),
        "        while (bits == 0u && q + 1 < sn_q1) bits = voted[++q];",
        "        const int b = bits ? __ffs(bits) - 1 : -1;",
        "        bits &= bits - 1u;  // (0 stays 0)",
        f"        sn_m[u] = b < 0 ? -1 : {index};",
        "    }",
        "    if (sn_m[0] < 0) break;",
        f"    {storage} sn_wg[{GATHER}][K];",
        *indent(each),
        "        if (sn_m[u] >= 0) {",
        "            const long long m = sn_m[u];",
        *indent(fetch("sn_wg[u]"), 3),
        "        }",
        "    }",
        *indent(each),
        "        if (sn_m[u] >= 0) {",
        *indent(use("sn_wg[u]"), 3),
        "        }",
        "    }",
        "}",
    ]
