"""The reserved symbols of a neuron's equations, in one table (stage 0: imports nothing of
symneuron).

:data:`RESERVED` names each symbol, what it stands for and the parts of a definition
whose expressions may use it. Every check of names reads it: a parameter or a state may
not take a reserved name, each expression may use only its part's reserved symbols
(besides the params and the states), and the symbols are matched by name. A new symbol,
such as the noise draw of a stochastic neuron, is one more row.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

__all__ = [
    "V",
    "X",
    "H",
    "S",
    "NOISE",
    "XI",
    "PARTS",
    "Reserved",
    "RESERVED",
    "NOISE_STREAMS",
    "allowed_in",
    "reserved_symbol",
    "noise_symbol",
]

#: State before charging, V[t-1].
V = sp.Symbol("V", real=True)
#: Input of this step, X[t].
X = sp.Symbol("X", real=True)
#: This step's charged potential H[t] (usable in a state's pre-spike update).
H = sp.Symbol("H", real=True)
#: This step's spike S[t] (usable in a state's on-spike reset).
S = sp.Symbol("S", real=True)
#: A standard-normal draw, one per neuron and step (a discrete charge's or update's noise).
NOISE = sp.Symbol("noise", real=True)
#: Gaussian white noise in an ODE (Brian2's ``xi``, units 1/sqrt(time)).
XI = sp.Symbol("xi", real=True)
#: Noise sources a neuron may draw from: stream 0 (``noise``) and ``noise1`` ... (the
#: independent draws :meth:`symneuron.Neuron.from_ode` gives each state's ``xi``).
NOISE_STREAMS = 8

#: The parts of a definition that hold expressions: the charge H = f(V, X), a state's
#: pre-spike ``update`` and ``on_spike`` reset, the ``threshold`` and ``v_reset`` levels,
#: and a right-hand side of :meth:`symneuron.Neuron.from_ode` (``ode``).
#: The spike probability p(H) of ``firing="escape"`` is the ``probability`` part.
PARTS = ("charge", "update", "on_spike", "threshold", "v_reset", "ode", "probability")


@dataclass(frozen=True)
class Reserved:
    """One reserved symbol: the symbol itself, its meaning, the parts that may use it."""

    symbol: sp.Symbol
    meaning: str
    parts: frozenset[str]


RESERVED: dict[str, Reserved] = {
    "V": Reserved(V, "the state before charging, V[t-1]", frozenset({"charge", "update", "ode"})),
    "X": Reserved(X, "this step's input X[t]", frozenset({"charge", "update", "ode"})),
    "H": Reserved(H, "this step's charged potential H[t]", frozenset({"update", "probability"})),
    "S": Reserved(S, "this step's spike S[t] (0 or 1)", frozenset({"on_spike"})),
    "xi": Reserved(XI, "white noise in an ODE (1/sqrt(time))", frozenset({"ode"})),
    **{
        name: Reserved(
            sp.Symbol(name, real=True),
            f"standard-normal draw of stream {i}",
            frozenset({"charge", "update"}),
        )
        for i, name in enumerate(["noise", *(f"noise{i}" for i in range(1, NOISE_STREAMS))])
    },
}


def allowed_in(part: str) -> frozenset[str]:
    """The reserved names an expression of ``part`` (one of :data:`PARTS`) may use."""
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; one of {PARTS}")
    return frozenset(name for name, row in RESERVED.items() if part in row.parts)


def noise_symbol(stream: int) -> sp.Symbol:
    """The draw of noise ``stream`` (0: :data:`NOISE`; ``noise<i>`` for i > 0)."""
    return RESERVED["noise" if stream == 0 else f"noise{stream}"].symbol


def reserved_symbol(name: str) -> sp.Symbol | None:
    """The canonical symbol of a reserved ``name`` (None for any other name)."""
    row = RESERVED.get(name)
    return None if row is None else row.symbol
